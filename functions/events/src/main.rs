//! The `events` function: what the bus and the clock send — answers (`cta.response`), expiries
//! (`cta.expired`) and plan timers (`timer.fired`) from the `cta-inbox` queue, and the sweep's
//! tick from the `sweep` queue. An answer is validated and accepted with one conditional write,
//! then its resolution queued on the run's FIFO group; an invalid or late one is rejected
//! (`cta.rejected`), never blocking the queue. It never calls a model nor runs a tool.

fn main() -> Result<(), baton_lambda::Error> {
    baton_lambda::main(baton_lambda::Role::Events, Default::default())
}
