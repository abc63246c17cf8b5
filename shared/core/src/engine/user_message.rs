//! A follow-up user turn on a finished run: from the API, or from a parent continuing its
//! subagent (`spawn_subagent` with a `subagentId`).

use super::{Next, Step, Work};
use crate::message::{ChildOutcome, Input};
use crate::run::{ParentLink, RunStatus};
use crate::timeline::EntryBody;

pub(super) fn apply(
    w: &mut Work,
    text: &str,
    message_id: &str,
    reply_to: Option<&ParentLink>,
) -> Next {
    let seen =
        w.timeline.iter().rev().any(
            |e| matches!(&e.body, EntryBody::User { message_id: Some(m), .. } if m == message_id),
        );
    if seen {
        return Next::Now(Step::Ignore("message already applied".into()));
    }
    if let Some(link) = reply_to
        && w.run.parent.as_ref().map(|p| &p.run_id) != Some(&link.run_id)
    {
        // Only a run's own parent may continue it: answer, change nothing else.
        refuse(w, link, "refused", "this run has no such subagent");
        return Next::Commit;
    }
    if !w.run.status.is_terminal() {
        let Some(link) = reply_to else {
            return Next::Now(Step::Ignore("run is still active".into()));
        };
        // A parent tried to continue a busy subagent: tell it, change nothing else.
        refuse(
            w,
            link,
            "busy",
            "the subagent is still working on an earlier request",
        );
        return Next::Commit;
    }
    if let Some(link) = reply_to {
        w.run.parent = Some(link.clone());
    }
    w.push(EntryBody::User {
        text: text.to_owned(),
        message_id: Some(message_id.to_owned()),
    });
    w.run.status = RunStatus::Running;
    w.run.turn_thinks = 0;
    w.run.result = None;
    w.run.result_seq = None;
    w.run.result_truncated = false;
    w.run.error = None;
    Next::Think
}

/// Tells the run that tried to continue this one why it cannot.
fn refuse(w: &mut Work, link: &ParentLink, tag: &str, error: &str) {
    let input = Input::ChildFinished {
        child_run_id: w.run.run_id.clone(),
        tool_call_id: link.tool_call_id.clone(),
        outcome: ChildOutcome::Ended {
            status: w.run.status,
            error: error.into(),
        },
    };
    w.send(&link.run_id, tag, input);
}
