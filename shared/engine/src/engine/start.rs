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

/// `Continue`: think again, if this is the continue the run waits for: the one sent by the
/// commit of `version` (`Run::continue_at`). Commits in between that did not take it (a
/// follow-up queued while the turn goes on, a subagent's notice) leave it valid; a
/// redelivery, or a continue of a turn that has ended since, is stale. (A run stored before
/// `continue_at` existed still matches on its version.)
pub(super) fn resume(w: &mut Work, version: u64) -> Next {
    let awaited = match w.run.waits.continue_at {
        Some(at) => at == version,
        None => w.run.version == version,
    };
    if !awaited || w.run.status != RunStatus::Running {
        return Next::Now(Step::Ignore(format!(
            "stale continue for version {version}"
        )));
    }
    w.run.waits.continue_at = None;
    // The calls a reply left to this think have run (`calls.rs`): the rest of its batch (a
    // question, a subagent) may still wait.
    w.after_resolution()
}
