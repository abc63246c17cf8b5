//! The `subagent` function: the SQS FIFO `subagent-steps` queue (and its dead-letter queue) →
//! the same engine for subagent runs, one step per message, in order per run.

use std::sync::Arc;

use baton_lambda::{Runtime, init_tracing, run_steps};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_tracing();
    let runtime = Runtime::from_env()
        .await?
        .with_extensions(baton_deployment::extensions());
    let models = runtime.models().await?;
    run_steps(runtime, Arc::new(models)).await
}
