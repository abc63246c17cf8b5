//! The `orchestrator` function: the SQS FIFO `steps` queue (and its dead-letter queue) → one
//! step per message, in order per run, with partial batch failures.

fn main() -> Result<(), baton_lambda::Error> {
    baton_lambda::main(baton_lambda::Role::Steps, Default::default())
}
