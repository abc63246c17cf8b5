//! The crash suites, in a binary of their own: they arm failpoints (`baton_core::failpoint`),
//! which are process-wide, so no other test may run beside them, and they take turns
//! (`FAILPOINTS`). Run one with a filter: `cargo test -p baton-tests --test crashes -- aws_crashes::`.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod common;

mod aws_crashes;
mod calls_once;
mod crashes;
mod follow_up_crashes;

/// Held by each test that arms a failpoint, for its whole length.
static FAILPOINTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
