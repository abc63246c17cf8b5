//! The Lambda host: what the five functions run. Each function's `main` is one call to
//! [`main`] with its [`Role`] and the deployment's extensions; every role starts from a
//! [`Startup`] (the configuration, the SDK, the model secret, the service over AWS, built once
//! per container) and hands Lambda's events to the core service.
//!
//! | module | what |
//! |---|---|
//! | [`entry`] | the one entry point: [`main`], a function's [`Role`] |
//! | `api` | the `api` function's router behind API Gateway (feature `api`) |
//! | [`startup`] | start-up: configuration, secrets, model clients, the service |
//! | [`steps`] | the step functions' SQS batches: order per run, deadline, deferral |
//! | [`events`] | the `events` function's batches: the inbox queue and the sweep's ticks |
//! | [`live`] | the `live` function: the live channel's authorizer |
//! | [`outbox_metrics`] | effects that failed after their commit, as EMF lines (every function) |
//!
//! The adapters are `baton-aws`'s; the policy for each message is the service's
//! (`Steps::consume`, `Steps::inbox_event`). `baton dev --aws` runs these same handlers
//! in-process (`baton-dev`).

#[cfg(feature = "api")]
mod api;
pub mod entry;
pub mod events;
pub mod live;
pub mod notifier;
pub mod outbox_metrics;
pub mod startup;
pub mod steps;

use aws_lambda_events::event::sqs::BatchItemFailure;

pub use entry::{Role, main, serve};
pub use events::{SWEEP_AFTER, handle_events, run_events};
pub use live::run_live_authorizer;
pub use startup::{InitError, SecretKey, Startup, secret_fields};
#[cfg(feature = "steps")]
pub use steps::run_steps;
pub use steps::{
    HOLD, MAX_BATCH, MAX_RETRY_DELAY, Pace, StepsOutcome, handle_steps, hold_for, holding,
    invocation_deadline, release, retry_delay, steps_at_once,
};

/// What a function's start-up or handler failed with (Lambda's own error type).
pub type Error = lambda_runtime::Error;

/// JSON logs, as `LoggingConfig: {LogFormat: JSON}` expects.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .without_time()
        .try_init();
}

/// A record reported failed in a batch response, to be delivered again.
fn failure(id: String) -> BatchItemFailure {
    let mut f = BatchItemFailure::default();
    f.item_identifier = id;
    f
}
