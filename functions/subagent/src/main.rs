//! The `subagent` function: the SQS FIFO `subagent-steps` queue (and its dead-letter queue) → one
//! step per message, in order per run, with partial batch failures.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use baton::lambda::{handle_steps, init_tracing, service_from_env};
use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    init_tracing();
    let service = service_from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let service = service.clone();
        async move { Ok::<SqsBatchResponse, Error>(handle_steps(&service, event.payload).await) }
    }))
    .await
}
