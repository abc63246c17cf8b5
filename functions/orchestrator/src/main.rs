//! The `orchestrator` function: the SQS FIFO `steps` queue (and its dead-letter queue) → one
//! step per message, in order per run, with partial batch failures.

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
