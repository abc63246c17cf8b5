//! The `cta` function: the `cta-inbox` queue, fed by the bus rule on `cta.response` and
//! `cta.expired` → validate, accept with one conditional write, queue the resolution on the
//! run's FIFO group. Invalid or late responses are rejected, never block the queue.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use baton::lambda::{handle_cta_inbox, init_tracing, service_from_env};
use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    init_tracing();
    let service = service_from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let service = service.clone();
        async move { Ok::<SqsBatchResponse, Error>(handle_cta_inbox(&service, event.payload).await) }
    }))
    .await
}
