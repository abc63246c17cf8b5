//! A run's first step, and each step after a batch of tool calls settled on its own.

use super::{Next, Step, Work};
use crate::run::RunStatus;

/// `Start`: a queued run begins thinking. Any other state means a redelivery.
pub(super) fn start(w: &mut Work) -> Next {
    if w.run.status != RunStatus::Queued {
        return Next::Now(Step::Ignore("run already started".into()));
    }
    w.run.status = RunStatus::Running;
    Next::Think
}

/// `Continue`: think again, if the run is still at the version that asked for it.
pub(super) fn resume(w: &mut Work, version: u64) -> Next {
    if w.run.version != version || w.run.status != RunStatus::Running {
        return Next::Now(Step::Ignore(format!(
            "stale continue for version {version}"
        )));
    }
    Next::Think
}
