//! Baton's core: durable AI-agent orchestration.
//!
//! The pure [`engine`] decides; the [`ports`] abstract storage, queues, events, timers and
//! models; [`adapters`] implement them (embedded SQLite here, AWS later); [`service`] is the
//! only place that loads, steps, commits and performs effects; [`api`] is the HTTP router.

pub mod adapters;
pub mod agent;
pub mod api;
pub mod cta;
pub mod engine;
pub mod error;
pub mod lambda;
pub mod llm;
pub mod local;
pub mod ports;
pub mod pump;
pub mod run;
pub mod service;
pub mod timeline;
pub mod tools;
pub mod worker;
