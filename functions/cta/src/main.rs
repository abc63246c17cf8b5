//! The `cta` function: the `cta-inbox` queue, fed by the bus rule on `cta.response` and
//! `cta.expired` → validate, accept with one conditional write, queue the resolution on the
//! run's FIFO group. Invalid or late responses are rejected, never block the queue. It never
//! calls a model.

use baton_lambda::{Runtime, init_tracing, run_cta_inbox};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_tracing();
    run_cta_inbox(Runtime::from_env().await?).await
}
