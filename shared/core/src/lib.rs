//! Baton's core: durable AI-agent orchestration, with no I/O stack of its own (tokio only for timeouts).
//!
//! - [`engine`] decides, purely: one iteration of one run, from its state and one input.
//! - [`message`] holds what crosses the engine's boundary: step messages, events, effects,
//!   transitions. Ports and adapters import it, never the engine.
//! - [`run`], [`cta`], [`timeline`], [`agent`], [`tools`] and [`plan`] are the data the engine
//!   reasons on.
//! - [`llm`] is the model port and the projection of a timeline into chat messages.
//! - [`ports`] are the traits every adapter implements (store, queue, bus, scheduler, clock).
//! - [`service`] is the only place that loads, steps, commits and performs effects.
//! - [`config`] reads the environment, once, for every host.
//!
//! Adapters (AWS, SQLite), model and tool clients and hosts (Lambda functions, `baton dev`)
//! are crates beside this one; this crate knows none of them. Of tokio it uses only the
//! timer, to bound a tool call (the hosts run the runtime).

pub mod agent;
pub mod agents_file;
pub mod config;
pub mod cost;
pub mod cta;
pub mod engine;
pub mod error;
pub mod failpoint;
pub mod fork;
pub mod links;
pub mod live;
pub mod llm;
pub mod message;
pub mod observe;
pub mod plan;
pub mod ports;
pub mod run;
pub mod scope;
pub mod service;
pub mod timeline;
pub mod tools;
