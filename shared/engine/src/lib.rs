//! Baton's engine and the data it reasons on. Nothing here does I/O, keeps a clock or draws
//! a random number: time, ids' seeds and every I/O result come in as inputs, so that a step
//! is a function of them and a retried step decides alike.
//!
//! - [`engine`] decides: one iteration of one run, from its state and one input
//!   ([`engine::step`]), and the one loop that feeds it the I/O it asks for
//!   ([`engine::decide`], through the caller's [`engine::StepIo`]).
//! - [`message`] holds what crosses the engine's boundary: step messages, events, effects,
//!   transitions.
//! - [`run`], [`timeline`], [`cta`], [`cost`], [`plan`] and [`fork`] are the data a run is.
//! - [`agent`] and [`tools`] are what a step knows of agents and tools ([`agent::Book`]),
//!   handed to it by its host; [`llm`] is what a model is told and answers.
//!
//! `baton-core` builds on this: the catalog, the tools' code, the ports and the service that
//! loads, steps, commits and performs effects. The compiler keeps this crate pure: it has no
//! async runtime, no HTTP, no schema compiler and no hashing keys among its dependencies.

pub mod agent;
pub mod budget;
pub mod builtin;
pub mod cost;
pub mod cta;
pub mod engine;
pub mod error;
pub mod fork;
pub mod llm;
pub mod message;
pub mod plan;
pub mod project;
pub mod run;
pub mod scope;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod timeline;
pub mod tools;
