//! The `subagent` function: the SQS FIFO `subagent-steps` queue (and its dead-letter queue) →
//! the same engine for subagent runs, one step per message, in order per run.

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
