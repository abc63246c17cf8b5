//! A follow-up user turn on a finished run: from the API, or from a parent continuing its
//! subagent (`spawn_subagent` with a `subagentId`).

use super::{Next, Step, Work};
use crate::message::{ChildOutcome, Input};
use crate::run::{ParentLink, RunStatus};
use crate::timeline::{EntryBody, TurnOptions};

pub(super) fn apply(
    w: &mut Work,
    text: &str,
    message_id: &str,
    reply_to: Option<&ParentLink>,
    options: &TurnOptions,
    slot: Slot,
) -> Next {
    let seen = w.timeline.iter().rev().any(|e| match &e.body {
        EntryBody::User {
            message_id: Some(m),
            ..
        }
        | EntryBody::Queued { message_id: m, .. } => m == message_id,
        _ => false,
    });
    if seen {
        return Next::Now(Step::Ignore("message already applied".into()));
    }
    if reply_to.is_none() && w.run.status.is_final() {
        // Ended for good: the follow-up is refused, and the timeline says so (the API
        // refuses it first; this is the write that holds when a cancel won the race).
        w.push(EntryBody::Notice {
            code: "follow_up_refused".into(),
            message: format!(
                "a follow-up came after the run ended ({}): fork the run or start a new one",
                w.run.status.as_str()
            ),
        });
        w.release_follow_ups(vec![message_id.to_owned()]);
        return Next::Commit;
    }
    if let Some(link) = reply_to
        && w.run.origin.parent.as_ref().map(|p| &p.run_id) != Some(&link.run_id)
    {
        // Only a run's own parent may continue it: answer, change nothing else.
        refuse(w, link, "refused", "this run has no such subagent");
        return Next::Commit;
    }
    if !w.run.status.is_terminal()
        && reply_to.is_none()
        && let Some(settled) = w.settled
        && w.hand_back_drafts(settled)
    {
        // The drafts it waited on are the model's again (`plan/held.rs`): the follow-up
        // is the person's answer, and the model's next turn.
        w.release_follow_ups(vec![message_id.to_owned()]);
        w.begin_turn(text, message_id, options.clone());
        return Next::Think;
    }
    if !w.run.status.is_terminal() {
        let Some(link) = reply_to else {
            // A follow-up while a turn is under way waits for it to end.
            let seq = w.push(EntryBody::Queued {
                text: text.to_owned(),
                message_id: message_id.to_owned(),
                options: options.clone(),
            });
            w.run.waits.queued.push(seq);
            // Its place holds while it waits here, however long the turn takes.
            w.effects.push(crate::message::Effect::HoldFollowUps {
                run_id: w.run.run_id.clone(),
                message_ids: vec![message_id.to_owned()],
            });
            return Next::Commit;
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
    if let (None, Some(why)) = (reply_to, slot.refused) {
        // Its turn would have made the run active again, and the commit that started it
        // found no active-run slot for its owner: the run stays as it ended.
        w.push(EntryBody::Notice {
            code: "follow_up_refused".into(),
            message: format!("a follow-up was refused: {why}"),
        });
        w.release_follow_ups(vec![message_id.to_owned()]);
        return Next::Commit;
    }
    match reply_to {
        Some(link) => w.run.origin.parent = Some(link.clone()),
        None => w.release_follow_ups(vec![message_id.to_owned()]),
    }
    w.begin_turn(text, message_id, options.clone());
    if slot.limited && reply_to.is_none() && w.run.origin.parent.is_none() {
        // The commit that starts the turn takes the run's active-run slot, or is refused
        // (and this decided again, `slot.refused`): before the model is paid for.
        w.send_continue();
        return Next::Commit;
    }
    Next::Think
}

/// What the host says of the active-run slot a follow-up's turn takes.
pub(super) struct Slot<'a> {
    /// Owners' active runs are limited: the turn's slot is taken in a commit of its own.
    pub(super) limited: bool,
    /// The commit that would have taken it was refused, and why.
    pub(super) refused: Option<&'a str>,
}

impl Work<'_> {
    /// Starts a new turn of a finished run with a user message (or a trigger's).
    pub(super) fn begin_turn(&mut self, text: &str, message_id: &str, options: TurnOptions) {
        self.run.origin.tier = options.tier;
        let seq = self.push(EntryBody::User {
            text: text.to_owned(),
            message_id: Some(message_id.to_owned()),
            options,
        });
        // What this turn spends is counted from here (`usage` entry, when it ends).
        self.run.spend.turn_seq = seq;
        self.run.spend.turn_start = self.run.total();
        self.run.set_prompt(text);
        self.run.status = RunStatus::Running;
        self.run.counters.turn_thinks = 0;
        self.run.counters.turn_tool_calls = 0;
        self.run.counters.tools_spent = false;
        self.run.outcome.result = None;
        self.run.outcome.result_seq = None;
        self.run.outcome.result_truncated = false;
        self.run.outcome.structured = false;
        self.run.outcome.error = None;
    }

    /// When a turn has ended: the oldest waiting follow-up starts the next one (thinking in
    /// a step of its own). A run that ended for good (cancelled, failed, expired) drops
    /// them instead, and says so.
    pub(super) fn next_queued_turn(&mut self) {
        if self.run.waits.queued.is_empty() {
            return;
        }
        if self.run.status.is_final() {
            let dropped = std::mem::take(&mut self.run.waits.queued);
            let ids = dropped
                .iter()
                .filter_map(|s| match &self.entry(*s).body {
                    EntryBody::Queued { message_id, .. } => Some(message_id.clone()),
                    _ => None,
                })
                .collect();
            self.release_follow_ups(ids);
            let n = dropped.len();
            self.push(EntryBody::Notice {
                code: "queued_dropped".into(),
                message: format!(
                    "{n} waiting follow-up message(s) dropped: the run ended ({})",
                    self.run.status.as_str()
                ),
            });
            return;
        }
        let seq = self.run.waits.queued.remove(0);
        let EntryBody::Queued {
            text,
            message_id,
            options,
        } = self.entry(seq).body.clone()
        else {
            return;
        };
        self.release_follow_ups(vec![message_id.clone()]);
        self.begin_turn(&text, &message_id, options);
        self.send_continue();
    }

    /// Frees the places of follow-ups that no longer wait (see `Store::admit_follow_up`),
    /// once this step commits.
    pub(super) fn release_follow_ups(&mut self, message_ids: Vec<String>) {
        if !message_ids.is_empty() {
            self.effects.push(crate::message::Effect::ReleaseFollowUps {
                run_id: self.run.run_id.clone(),
                message_ids,
            });
        }
    }
}

/// Tells the run that tried to continue this one why it cannot.
fn refuse(w: &mut Work, link: &ParentLink, tag: &str, error: &str) {
    let input = Input::ChildFinished {
        child_run_id: w.run.run_id.clone(),
        tool_call_id: link.tool_call_id.clone(),
        outcome: ChildOutcome::Ended {
            status: w.run.status,
            error: error.into(),
            code: None,
        },
        spent: Default::default(),
        breakdown: vec![],
    };
    w.send(&link.run_id, tag, input);
}
