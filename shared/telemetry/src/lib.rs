//! Baton's traces and metrics, from the reports of committed steps
//! ([`baton_core::observe::StepReport`]): hosts register them as observers of their service.

pub mod metrics;
pub mod traces;

pub use metrics::Metrics;
pub use traces::Traces;
