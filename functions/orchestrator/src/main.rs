//! The `orchestrator` function: the SQS FIFO `steps` queue (and its dead-letter queue) → one
//! step per message, in order per run, with partial batch failures.

use std::sync::Arc;

use baton_aws::{Runtime, init_tracing, run_steps};
use baton_llm::openai::{OpenAiConfig, OpenAiLlm};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_tracing();
    let runtime = Runtime::from_env().await?;
    let model = OpenAiLlm::new(OpenAiConfig::from_model(&runtime.model().await?))?
        .with_key_source(runtime.key_source().map(|k| k as _));
    run_steps(runtime, Arc::new(model)).await
}
