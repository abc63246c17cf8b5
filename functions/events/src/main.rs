//! The `events` function: what the bus and the clock send — answers (`cta.response`), expiries
//! (`cta.expired`) and plan timers (`timer.fired`) from the `cta-inbox` queue, and the sweep's
//! tick from the `sweep` queue. An answer is validated and accepted with one conditional write,
//! then its resolution queued on the run's FIFO group; an invalid or late one is rejected
//! (`cta.rejected`), never blocking the queue. It never calls a model nor runs a tool.

use baton_lambda::{Runtime, init_tracing, run_events};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_tracing();
    run_events(
        Runtime::from_env()
            .await?
            .with_extensions(baton_deployment::extensions()),
    )
    .await
}
