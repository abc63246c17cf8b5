//! The one entry point of every function: [`main`] takes the function's [`Role`] and the
//! deployment's extensions, and runs that role until Lambda stops the process. Each
//! `functions/*/src/main.rs` is a call to it.

use baton_core::agent::Extensions;

use crate::{Startup, init_tracing};

/// What a function does with Lambda's events. A role the crate is built without (its
/// feature: `api`, `steps`, `events`) is not there to name, so a function that names it does
/// not compile rather than fail at its cold start; and a function links only its own role's
/// code (`sam build` builds each function alone, with its features), not every role's behind
/// a `match` the linker cannot see through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// The HTTP API behind API Gateway (the `api` function): the same router as `baton dev`,
    /// its caller the subject of the JWT API Gateway's authorizer verified. It never calls a
    /// model nor runs a tool.
    #[cfg(feature = "api")]
    Api,
    /// Steps from an SQS FIFO queue and its dead-letter queue, one step per message, in order
    /// per run (the `orchestrator` and `subagent` functions).
    #[cfg(feature = "steps")]
    Steps,
    /// What the bus and the clock send — answers, expiries, plan timers — and the sweep's
    /// tick (the `events` function). It never calls a model nor runs a tool.
    #[cfg(feature = "events")]
    Events,
    /// The live channel's authorizer (the `live` function): it checks watch tokens and reads
    /// nothing but its key, so it takes no extensions.
    LiveAuthorizer,
}

/// Runs `role` with the deployment's `extensions` (its own tools, plugins and agents) until
/// Lambda stops the process: JSON logs, the start-up ([`Startup::from_env`]), then the role's
/// handler on a multi-threaded Tokio runtime.
///
/// ```no_run
/// fn main() -> Result<(), baton_lambda::Error> {
///     baton_lambda::main(baton_lambda::Role::LiveAuthorizer, Default::default())
/// }
/// ```
pub fn main(role: Role, extensions: Extensions) -> Result<(), crate::Error> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(role, extensions))
}

/// [`main`]'s work, on a Tokio runtime the caller already runs.
pub async fn serve(role: Role, extensions: Extensions) -> Result<(), crate::Error> {
    init_tracing();
    let startup = Startup::from_env().await?;
    match role {
        #[cfg(feature = "api")]
        Role::Api => crate::api::run_api(startup.with_extensions(extensions)).await,
        #[cfg(feature = "steps")]
        Role::Steps => {
            let startup = startup.with_extensions(extensions);
            let models = startup.models().await?;
            crate::run_steps(startup, std::sync::Arc::new(models)).await
        }
        #[cfg(feature = "events")]
        Role::Events => crate::run_events(startup.with_extensions(extensions)).await,
        Role::LiveAuthorizer => {
            // It builds no catalog: the extensions are not its.
            drop(extensions);
            crate::run_live_authorizer(startup).await
        }
    }
}
