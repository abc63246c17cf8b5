//! Build on Baton in Rust: give your agents your own tools — Rust functions that talk to your
//! database, your API, your repositories — and plugins that shape each of their iterations,
//! then deploy them with the rest of Baton.
//!
//! This crate is what such code depends on; it holds nothing of its own, only the types of
//! Baton's core a tool or plugin author needs, under one name. Where they go is the
//! workspace's `baton-deployment` crate (`shared/deployment`): its `extensions()` returns
//! the deployment's [`Extensions`], which every host adds to its catalog — the five Lambda
//! functions, `baton dev` and `baton dev --aws` alike — so a tool added there is in every
//! host and in what `sam build` packages, with no edit anywhere else.
//!
//! # A tool
//!
//! A [`Tool`] has a name, a description and a JSON schema for its input (what the model is
//! shown), may ask for a human's approval depending on its input, says how a call may touch
//! the world ([`Effects`]: `None` for a read, `Idempotent` for a change safe to repeat under
//! its key, `Once`, the default, for one that must not run twice — what a crash around it
//! then does), and runs with a
//! [`ToolContext`]: the run, the call's idempotency key, the run's sandbox and repository
//! ([`Scope`]), its agent's plugins' states ([`ToolContext::plugin_state`]: a tool reads the
//! state its plugin keeps), and where it puts widgets and files beside its result. An `Err` is an error
//! result the model sees; the run goes on.
//!
//! ```
//! use baton_sdk::{Effects, Tool, ToolContext, Value, async_trait, json};
//!
//! /// Looks an order up (here from a table; yours would ask your API).
//! struct Orders;
//!
//! #[async_trait]
//! impl Tool for Orders {
//!     fn name(&self) -> &str {
//!         "order_status"
//!     }
//!     fn description(&self) -> &str {
//!         "The status of an order, by its number."
//!     }
//!     fn schema(&self) -> Value {
//!         json!({"type": "object", "properties": {"order": {"type": "integer"}},
//!                "required": ["order"], "additionalProperties": false})
//!     }
//!     /// Orders past 1000 are someone else's: a human says yes first.
//!     fn needs_approval(&self, input: &Value) -> bool {
//!         input["order"].as_u64().is_some_and(|n| n > 1000)
//!     }
//!     /// It only reads: after a crash it runs again, and its output rides in the next commit.
//!     fn effects(&self) -> Effects {
//!         Effects::None
//!     }
//!     async fn execute(&self, ctx: &ToolContext, input: Value) -> Result<Value, String> {
//!         let order = input["order"].as_u64().ok_or("`order` is a number")?;
//!         // A card in the console beside the result, and a file the run keeps.
//!         ctx.widget("card", json!({"order": order, "status": "shipped"}))?;
//!         ctx.file("receipt.txt", "text/plain", b"paid".to_vec(), "the receipt")?;
//!         Ok(json!({"order": order, "status": "shipped"}))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let ctx = ToolContext::builder("run_1").owner("owner").agent("support").call_id("call_1").build();
//! let out = Orders.execute(&ctx, json!({"order": 42})).await;
//! assert_eq!(out, Ok(json!({"order": 42, "status": "shipped"})));
//! assert!(Orders.needs_approval(&json!({"order": 4242})));
//! assert_eq!(Orders.effects(), Effects::None);
//! # }
//! ```
//!
//! # A typed tool
//!
//! A [`TypedTool`] takes its input as a Rust type and answers with one: the schema the model
//! is shown is derived from the input's type (`#[derive(JsonSchema)]`, with `schemars` and
//! `serde` in your `Cargo.toml`), and the call is handed the input parsed. [`Typed`] offers
//! it as a [`Tool`]; the `Value` form above stays for tools whose input is only known at
//! run time. See [`TypedTool`] for one, end to end; [`prelude`] names what both forms use.
//!
//! # A plugin
//!
//! A [`Plugin`] is asked before each think of the agents it is given to. It keeps typed
//! state per run (committed with the step that thought), and answers with [`Prepared`]:
//! tools the agent may also call in this iteration and text added to its system prompt. Its
//! errors are its own ([`PluginError`]): retried, or failing the run, as it says.
//!
//! ```
//! use baton_sdk::{Entry, Plugin, PluginError, Prepared, Run, async_trait};
//! use serde::{Deserialize, Serialize};
//!
//! /// Reminds the agent of the house style once it has thought three times.
//! struct Style;
//!
//! #[derive(Default, Serialize, Deserialize)]
//! struct Seen {
//!     iterations: u32,
//! }
//!
//! #[async_trait]
//! impl Plugin for Style {
//!     type State = Seen;
//!     fn name(&self) -> &str {
//!         "style"
//!     }
//!     async fn prepare(
//!         &self,
//!         _run: &Run,
//!         _timeline: &[Entry],
//!         seen: &mut Seen,
//!     ) -> Result<Prepared, PluginError> {
//!         seen.iterations += 1;
//!         Ok(Prepared {
//!             context: (seen.iterations > 3).then(|| "Answer in one paragraph.".to_owned()),
//!             ..Prepared::default()
//!         })
//!     }
//! }
//! # let _ = Style;
//! ```
//!
//! # The deployment's extensions, and the catalog they reach
//!
//! [`Extensions`] gathers the tools, the plugins (each for one agent) and the agents the
//! code ships; the agents file adds to them (its agent of the same name wins). Every host
//! builds its [`Catalog`] with them: an agent reaches a Rust tool by listing its name.
//!
//! ```
//! use baton_sdk::{AgentsFile, Catalog, Extensions, Limits, Tool, ToolContext, Value};
//! use baton_sdk::{async_trait, json, serde_json};
//!
//! struct Ping;
//!
//! #[async_trait]
//! impl Tool for Ping {
//!     fn name(&self) -> &str { "ping" }
//!     fn description(&self) -> &str { "Answers pong." }
//!     fn schema(&self) -> Value { json!({"type": "object"}) }
//!     async fn execute(&self, _: &ToolContext, _: Value) -> Result<Value, String> {
//!         Ok(json!("pong"))
//!     }
//! }
//!
//! let agent = serde_json::from_value(json!({"system": "You check things.", "tools": ["ping"]}))
//!     .expect("an agent");
//! let ext = Extensions::new().tool(Ping).agent("checker", agent);
//! // What the hosts do with it (the Lambda functions, `baton dev`): the agents file, if
//! // any, with the extensions' agents, and their tools beside the file's.
//! let file: Option<AgentsFile> = None;
//! let catalog = Catalog::new(Limits::default(), ext.tools(), ext.agents_into(file))
//!     .expect("a catalog");
//! let checker = catalog.agent("checker").expect("the agent");
//! assert_eq!(checker.tools, ["ping"]);
//! // A tool no agent lists is not offered; one an agent lists but no one provides is a
//! // start-up error that names it.
//! let missing = serde_json::from_value(json!({"system": "s", "tools": ["pong"]})).unwrap();
//! let bad = Extensions::new().agent("other", missing);
//! let err = Catalog::new(Limits::default(), bad.tools(), bad.agents_into(None)).unwrap_err();
//! assert!(err.to_string().contains("pong"), "{err}");
//! ```

pub use async_trait::async_trait;
pub use serde_json::{self, Value, json};

mod typed;

/// Baton's Lambda host, for a project's functions (features `lambda`, and `api`, `steps`,
/// `events` for the roles): each function's `main` is one call.
///
/// ```no_run
/// # #[cfg(feature = "steps")]
/// fn main() -> Result<(), baton_sdk::lambda::Error> {
///     let extensions = baton_sdk::Extensions::new(); // your tools crate's `extensions()`
///     baton_sdk::lambda::main(baton_sdk::lambda::Role::Steps, extensions)
/// }
/// # #[cfg(not(feature = "steps"))]
/// # fn main() {}
/// ```
#[cfg(feature = "lambda")]
pub mod lambda {
    pub use baton_lambda::{Error, Role, main, serve};
}

/// Baton's command line for a project's `dev` binary (feature `dev`): `baton dev`, the client,
/// the benchmarks and `template`, the catalog given the project's extensions.
///
/// ```no_run
/// # #[cfg(feature = "dev")]
/// fn main() -> std::process::ExitCode {
///     baton_sdk::dev::main(baton_sdk::Extensions::new()) // your tools crate's `extensions()`
/// }
/// # #[cfg(not(feature = "dev"))]
/// # fn main() {}
/// ```
#[cfg(feature = "dev")]
pub mod dev {
    pub use baton_cli::{TEMPLATE, main};
}

pub use typed::{Typed, TypedTool};

/// What a tool or plugin is written with, in one `use baton_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::{
        Effects, Entry, Extensions, Plugin, PluginError, Prepared, RunView, Tool, ToolContext,
        ToolError, Typed, TypedTool, Value, async_trait, json,
    };
    pub use schemars::JsonSchema;
    pub use serde::{Deserialize, Serialize};
}

pub use baton_core::agent::{
    AgentSpec, AgentsFile, Catalog, CatalogError, Extensions, Limits, Plugin, PluginError, Prepared,
};
/// The most of a tool's output (as JSON) a run keeps: a larger one is cut, with a marker, so
/// a tool that returns text may cut it here itself, where it knows what to keep.
pub use baton_core::engine::MAX_OUTPUT_BYTES;
pub use baton_core::run::{RunStatus, RunView, Usage};
pub use baton_core::scope::{GithubRepo, Scope};
pub use baton_core::timeline::{Entry, EntryBody, ToolEntry, ToolResult};
pub use baton_core::tools::{
    Effects, FileOutput, Tool, ToolContext, ToolContextBuilder, ToolError,
};
