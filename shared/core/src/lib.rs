//! Baton's core: durable AI-agent orchestration, with no I/O stack of its own (tokio only for timeouts).
//!
//! - The engine and the data it reasons on are `baton-engine`'s, re-exported here under the
//!   same names: [`engine`] decides, purely, one iteration of one run; [`message`] holds what
//!   crosses its boundary (ports and adapters import it, never the engine); [`run`], [`cta`],
//!   [`timeline`], [`cost`], [`plan`], [`fork`] and [`scope`] are a run's data.
//! - [`agent`] holds the catalog (agents, tools, plugins) a step's `Book` is taken from;
//!   [`tools`] the tools' trait and their context.
//! - [`llm`] is the model port (the projection of a timeline into chat is the engine's).
//! - [`ports`] are the traits every adapter implements (store, queue, bus, scheduler, clock).
//! - [`service`] is the only place that loads, steps, commits and performs effects.
//! - [`config`] reads the environment, once, for every host.
//!
//! Adapters (AWS, SQLite), model and tool clients and hosts (Lambda functions, `baton dev`)
//! are crates beside this one; this crate knows none of them. Of tokio it uses only the
//! timer, to bound a tool call (the hosts run the runtime).

pub use baton_engine::{
    budget, cost, cta, engine, error, fork, message, plan, run, scope, timeline,
};

pub mod agent;
pub mod agents_file;
pub mod config;
pub mod failpoint;
pub mod links;
pub mod live;
pub mod llm;
pub mod observe;
pub mod ports;
pub mod service;
pub mod tools;
