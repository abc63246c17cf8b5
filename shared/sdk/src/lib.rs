//! Build on Baton in Rust: give your agents your own tools — Rust functions that talk to your
//! database, your API, your repositories — and plugins that shape each of their iterations,
//! in a project of your own that depends on Baton by this one crate.
//!
//! `baton new DIR` writes such a project: a crate of your tools (its `extensions()` returns
//! your [`Extensions`]), the five Lambda functions and a `dev` binary over this crate's
//! features (`lambda` with `api`, `steps`, `events`: `lambda::main`; `dev`: `dev::main`,
//! Baton's command line with your tools), Baton's template, a README and a CI script.
//! Everything a tool or plugin author uses is here, under one name; [`prelude`] names what
//! most code needs. Each section below is a doc-test that runs.
//!
//! # A tool
//!
//! A [`Tool`] has a name, a description and a JSON schema for its input (what the model is
//! shown), may ask for a human's approval depending on its input, says how a call may touch
//! the world ([`Effects`]: `None` for a read, `Idempotent` for a change safe to repeat under
//! its key, `Once`, the default, for one that must not run twice — what a crash around it
//! then does), and runs with a [`ToolContext`]: a read-only view of the call (its run,
//! agent, idempotency key, the run's sandbox and repository, [`Scope`]; its agent's plugins'
//! states, [`ToolContext::plugin_state`]) and where it puts widgets and files beside its
//! result.
//!
//! ```
//! use baton_sdk::{Effects, Tool, ToolContext, ToolError, Value, async_trait, json};
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
//!     async fn execute(&self, ctx: &ToolContext, input: Value) -> Result<Value, ToolError> {
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
//! let ctx = ToolContext::builder("run_1").agent("support").call_id("call_1").build();
//! let out = Orders.execute(&ctx, json!({"order": 42})).await;
//! assert_eq!(out, Ok(json!({"order": 42, "status": "shipped"})));
//! assert_eq!(ctx.take_widgets()[0].kind, "card");
//! assert_eq!(ctx.take_files()[0].name, "receipt.txt");
//! assert!(Orders.needs_approval(&json!({"order": 4242})));
//! # }
//! ```
//!
//! # Its errors: the model's, or the step's to try again
//!
//! An `Err` says who deals with it ([`ToolError`]). [`ToolError::Model`] — what a `String`
//! or a `&str` converts to — is the call's error result: the model reads it and decides
//! what next (a bad argument, a record not found). [`ToolError::Retry`] is a failure that may
//! pass and says nothing of the world (a 503, a timeout before the request went out): the
//! step is tried again with the host's backoff, the model's reply kept, the call run again —
//! unless the tool is `Once`, which never runs twice: the model is then told.
//!
//! ```
//! use baton_sdk::{Tool, ToolContext, ToolError, Value, async_trait, json};
//!
//! /// Asks a service that is sometimes busy.
//! struct Quote {
//!     busy: bool,
//! }
//!
//! #[async_trait]
//! impl Tool for Quote {
//!     fn name(&self) -> &str { "quote" }
//!     fn description(&self) -> &str { "A price for a product." }
//!     fn schema(&self) -> Value { json!({"type": "object"}) }
//!     fn effects(&self) -> baton_sdk::Effects { baton_sdk::Effects::None }
//!     async fn execute(&self, _: &ToolContext, input: Value) -> Result<Value, ToolError> {
//!         if self.busy {
//!             // The service answered 503: try the step again later.
//!             return Err(ToolError::retry("the pricing service is busy"));
//!         }
//!         match input["sku"].as_str() {
//!             Some("A-1") => Ok(json!(9.5)),
//!             // The model asked for what is not there: it hears so.
//!             _ => Err("no such product".into()),
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let ctx = ToolContext::builder("run_1").build();
//! let busy = Quote { busy: true }.execute(&ctx, json!({"sku": "A-1"})).await;
//! assert_eq!(busy, Err(ToolError::Retry("the pricing service is busy".into())));
//! let missing = Quote { busy: false }.execute(&ctx, json!({"sku": "Z"})).await;
//! assert_eq!(missing, Err(ToolError::model("no such product")));
//! assert_eq!(missing.unwrap_err().message(), "no such product");
//! # }
//! ```
//!
//! # A change made once: its idempotency key
//!
//! A tool that changes the world and may run twice (a crash after the request went out, an
//! invocation's timeout) declares [`Effects::Idempotent`] and sends
//! [`ToolContext::idempotency_key`] where the receiver deduplicates: the key is the same on
//! every run of one committed call, and different for every other call.
//!
//! ```
//! use baton_sdk::{Effects, Tool, ToolContext, ToolError, Value, async_trait, json};
//! use std::sync::Mutex;
//!
//! /// Refunds an order, at a payment service that keeps one refund per key.
//! #[derive(Default)]
//! struct Refund {
//!     sent: Mutex<Vec<String>>,
//! }
//!
//! #[async_trait]
//! impl Tool for Refund {
//!     fn name(&self) -> &str { "refund" }
//!     fn description(&self) -> &str { "Refunds an order." }
//!     fn schema(&self) -> Value { json!({"type": "object"}) }
//!     fn effects(&self) -> Effects { Effects::Idempotent }
//!     async fn execute(&self, ctx: &ToolContext, _: Value) -> Result<Value, ToolError> {
//!         // Here, the `Idempotency-Key` header of the payment service's request.
//!         self.sent.lock().unwrap().push(ctx.idempotency_key().to_owned());
//!         Ok(json!("refunded"))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let refund = Refund::default();
//! let call = || ToolContext::builder("run_1").call_id("call_1").build();
//! refund.execute(&call(), json!({})).await.unwrap();
//! refund.execute(&call(), json!({})).await.unwrap(); // the same call, run again
//! let other = ToolContext::builder("run_1").call_id("call_2").build();
//! refund.execute(&other, json!({})).await.unwrap();
//! let sent = refund.sent.lock().unwrap();
//! assert_eq!(sent[0], sent[1]);
//! assert_ne!(sent[0], sent[2]);
//! # }
//! ```
//!
//! # A typed tool
//!
//! A [`TypedTool`] takes its input as a Rust type and answers with one: the schema the model
//! is shown is derived from the input's type (`#[derive(JsonSchema)]`; `schemars` and `serde`
//! in your `Cargo.toml`), and the call is handed the input parsed. [`Typed`] offers it as a
//! [`Tool`]; the `Value` form above stays for tools whose input is only known at run time.
//!
//! ```
//! use baton_sdk::prelude::*;
//!
//! /// Says the words louder.
//! struct Shout;
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Words {
//!     /// What to shout.
//!     text: String,
//! }
//!
//! impl TypedTool for Shout {
//!     type Input = Words;
//!     type Output = String;
//!     fn name(&self) -> &str { "shout" }
//!     fn description(&self) -> &str { "Says the words louder." }
//!     fn effects(&self) -> Effects { Effects::None }
//!     async fn call(&self, _: &ToolContext, input: Words) -> Result<String, ToolError> {
//!         Ok(input.text.to_uppercase())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let tool = Typed(Shout);
//! assert_eq!(tool.schema()["properties"]["text"]["description"], "What to shout.");
//! let ctx = ToolContext::builder("run_1").build();
//! assert_eq!(tool.execute(&ctx, json!({"text": "hi"})).await, Ok(json!("HI")));
//! // Arguments that do not parse are the model's to hear, in the input's words.
//! let bad = tool.execute(&ctx, json!({"words": "hi"})).await.unwrap_err();
//! assert!(bad.message().contains("missing field `text`"), "{bad}");
//! # }
//! ```
//!
//! # A plugin
//!
//! A [`Plugin`] is asked before each think of the agents it is given to, with a read-only
//! view of the run ([`RunView`]) and its timeline. It keeps typed state per run (committed
//! with the step that thought), and answers with [`Prepared`]: tools the agent may also call
//! in this iteration and text added to its system prompt. Its errors are its own
//! ([`PluginError`]): retried, or failing the run, as it says. [`testing::TestRun`] makes a
//! run for its tests to view.
//!
//! ```
//! use baton_sdk::prelude::*;
//! use baton_sdk::testing::TestRun;
//!
//! /// Reminds the agent of the house style once it has thought three times, and of the
//! /// repository it works on.
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
//!         run: RunView<'_>,
//!         _timeline: &[Entry],
//!         seen: &mut Seen,
//!     ) -> Result<Prepared, PluginError> {
//!         seen.iterations += 1;
//!         let mut prepared = Prepared::new();
//!         if let Some(github) = run.github() {
//!             prepared = prepared.context(format!("You work on {}.", github.repo));
//!         }
//!         if seen.iterations > 3 {
//!             prepared = prepared.context("Answer in one paragraph.");
//!         }
//!         Ok(prepared)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let run = TestRun::new("run_1", "writer").github("acme/shop", Some("main"));
//! let mut seen = Seen { iterations: 3 };
//! let prepared = Style.prepare(run.view(), &[], &mut seen).await.unwrap();
//! assert_eq!(prepared.context.as_deref(), Some("You work on acme/shop.\nAnswer in one paragraph."));
//! assert_eq!(seen.iterations, 4);
//! # }
//! ```
//!
//! # A plugin's state, read by a tool
//!
//! A tool reads the state its plugin keeps through its context, typed as the plugin keeps
//! it ([`ToolContext::plugin_state`]; read-only: state changes where the plugin prepares).
//! A test hands the state in with [`ToolContextBuilder::plugin_state`].
//!
//! ```
//! use baton_sdk::prelude::*;
//!
//! #[derive(Default, Serialize, Deserialize)]
//! struct Active {
//!     skills: Vec<String>,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let ctx = ToolContext::builder("run_1")
//!     .plugin_state("skills", json!({"skills": ["github"]}))
//!     .build();
//! let active: Active = ctx.plugin_state("skills").unwrap();
//! assert_eq!(active.skills, ["github"]);
//! // A plugin that kept nothing yet: its state's default.
//! let none: Active = ToolContext::builder("run_2").build().plugin_state("skills").unwrap();
//! assert!(none.skills.is_empty());
//! # }
//! ```
//!
//! # Agents in code
//!
//! [`Extensions::agent`] adds an agent ([`AgentSpec`], built with [`AgentSpec::new`] and its
//! methods, or read from the agents file's JSON); the agents file's agent of the same name
//! wins. [`Extensions::plugin`] gives a plugin to one agent.
//!
//! ```
//! use baton_sdk::prelude::*;
//! use baton_sdk::{AgentSpec, Catalog, Limits};
//!
//! struct Quiet;
//!
//! #[async_trait]
//! impl Plugin for Quiet {
//!     type State = ();
//!     fn name(&self) -> &str { "quiet" }
//!     async fn prepare(&self, _: RunView<'_>, _: &[Entry], _: &mut ())
//!         -> Result<Prepared, PluginError> {
//!         Ok(Prepared::new().context("Be brief."))
//!     }
//! }
//!
//! let ext = Extensions::new()
//!     .agent("triage", AgentSpec::new("You sort tickets.").description("Sorts tickets."))
//!     .plugin("triage", Quiet);
//! let catalog = Catalog::new(Limits::default(), ext.tools(), ext.agents_into(None))
//!     .expect("a catalog");
//! let catalog = ext.plugins_onto(catalog);
//! assert_eq!(catalog.agent("triage").expect("the agent").system, "You sort tickets.");
//! ```
//!
//! # The extensions, and the catalog they reach
//!
//! [`Extensions`] gathers the tools, the plugins (each for one agent) and the agents the
//! code ships; the agents file adds to them (its agent of the same name wins). Every host
//! builds its [`Catalog`] with them: an agent reaches a Rust tool by listing its name.
//!
//! ```
//! use baton_sdk::{AgentsFile, Catalog, Extensions, Limits, Tool, ToolContext, ToolError, Value};
//! use baton_sdk::{async_trait, json, serde_json};
//!
//! struct Ping;
//!
//! #[async_trait]
//! impl Tool for Ping {
//!     fn name(&self) -> &str { "ping" }
//!     fn description(&self) -> &str { "Answers pong." }
//!     fn schema(&self) -> Value { json!({"type": "object"}) }
//!     async fn execute(&self, _: &ToolContext, _: Value) -> Result<Value, ToolError> {
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
//! let missing = baton_sdk::AgentSpec::new("s").tools(["pong"]);
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

pub mod testing;
pub use baton_core::scope::{GithubRepo, Scope};
pub use baton_core::timeline::{Entry, EntryBody, ToolEntry, ToolResult};
pub use baton_core::tools::{
    Effects, FileOutput, Tool, ToolContext, ToolContextBuilder, ToolError,
};
