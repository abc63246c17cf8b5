//! The label sets of `GET /metrics`' counters and histograms, and their buckets.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::Histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Kind {
    pub(super) kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Agent {
    pub(super) agent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AgentModel {
    pub(super) agent: String,
    pub(super) model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AgentKind {
    pub(super) agent: String,
    pub(super) kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PlanReview {
    pub(super) agent: String,
    pub(super) by: String,
    pub(super) outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PlanPhase {
    pub(super) agent: String,
    pub(super) from: String,
    pub(super) to: String,
}

pub(super) fn latency_buckets() -> Histogram {
    Histogram::new([
        0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

pub(super) fn wait_buckets() -> Histogram {
    // From a minute to the 30 days a question may wait.
    Histogram::new([
        60.0,
        600.0,
        3600.0,
        6.0 * 3600.0,
        86400.0,
        7.0 * 86400.0,
        30.0 * 86400.0,
    ])
}
