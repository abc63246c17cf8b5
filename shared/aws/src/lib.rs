//! Baton on AWS: adapters for the core's ports, provisioning, and the handlers the Lambda
//! functions run.
//!
//! | module | what |
//! |---|---|
//! | [`dynamo`] | `DynamoStore`: runs, timelines and CTAs in one table |
//! | [`sqs`] | `SqsQueue`: step messages on the FIFO queues, one group per run |
//! | [`eventbridge`] | `EventBridgeBus`: events on the bus |
//! | [`scheduler`] | `SchedulerTimers`: one-time CTA expiry schedules |
//! | [`sdk`] | one SDK config, error mapping, the request meter |
//! | [`provision`] | creates what `template.yaml` declares, on an emulator |
//! | [`handlers`] | the functions' start-up and their SQS batch handlers |
//! | [`event_source`] | polls SQS into the handlers, as Lambda's event source mappings do |
//!
//! No HTTP server and no SQLite here: the step functions link only this and the core.

pub mod dynamo;
pub mod event_source;
pub mod eventbridge;
pub mod handlers;
pub mod provision;
pub mod s3;
pub mod scheduler;
pub mod sdk;
pub mod sqs;

#[cfg(feature = "steps")]
pub use handlers::run_steps;
pub use handlers::{
    Deadline, InitError, Runtime, SecretKey, StepsOutcome, aws_service, handle_cta_inbox,
    handle_steps, handle_steps_until, init_tracing, release, run_cta_inbox,
};
