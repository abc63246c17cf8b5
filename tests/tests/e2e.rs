//! The end-to-end suites, one module per file, in one test binary: each binary links the AWS
//! SDK (~80 MB in a debug build), and sixteen of them filled a CI machine's disk. Run one
//! suite with a filter: `cargo test -p baton-tests --test e2e -- flow::`.
//!
//! The crash suites arm process-wide failpoints, so they have their own binary
//! (`crash_suites.rs`).

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod common;

mod agents_act;
mod assignees;
mod aws_batches;
mod aws_flow;
mod aws_outages;
mod aws_questions;
mod bad_input;
mod both_hosts;
mod browser;
mod budgets;
mod console;
mod contract;
mod cta_inbox;
mod edges;
mod files;
mod flow;
mod fork;
mod live_aws;
mod mcp_tools;
mod openai_flow;
mod plans;
mod question_defaults;
mod quotas;
mod races;
mod releases;
mod requests;
mod runs_view;
mod secret_rotation;
mod service;
mod step_errors;
mod telemetry;
mod turns;
mod visible_failures;
