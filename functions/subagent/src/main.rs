//! The `subagent` function: the SQS FIFO `subagent-steps` queue (and its dead-letter queue) →
//! the same engine for subagent runs, one step per message, in order per run.

fn main() -> Result<(), baton_lambda::Error> {
    baton_lambda::main(baton_lambda::Role::Steps, Default::default())
}
