//! What crosses the engine's boundary: the messages a run receives, the events it publishes,
//! the effects it asks for, and the transition it commits.
//!
//! Plain data with no behaviour beyond applying a transition to a timeline. The ports, the
//! adapters and the hosts import these types; none of them imports the engine.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cta::{Cta, CtaResponse};
use crate::run::{ParentLink, Run, RunStatus, Usage};
use crate::timeline::Entry;

/// A message on a run's ordered queue group: the only way a run changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepMessage {
    pub run_id: String,
    /// Deduplication id: the same effect always sends the same id.
    pub id: String,
    pub input: Input,
    /// Sent from an outbox that a failed effect left owing ([`outbox_owes`]): its step
    /// performs that outbox's other effects again before it thinks, and carries what still
    /// fails into its own commit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owed: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Input {
    /// The run was created: take its first step.
    Start,
    /// Think again; stale unless the run is still at `version`.
    Continue {
        version: u64,
    },
    /// A follow-up user turn on a finished run (from the API, or a parent continuing it).
    UserMessage {
        text: String,
        message_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to: Option<ParentLink>,
        #[serde(flatten)]
        options: crate::timeline::TurnOptions,
    },
    /// A human answered; the CTA item already records the answer.
    CtaAnswered {
        cta_id: String,
        response: CtaResponse,
        /// Who answered, when known (the API's caller, or a bus event's `responder`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        responder: Option<String>,
    },
    /// A CTA's expiry fired; the CTA item already records it.
    CtaExpired {
        cta_id: String,
    },
    /// A child run ended.
    ChildFinished {
        child_run_id: String,
        tool_call_id: String,
        outcome: ChildOutcome,
        /// What the child (and its own subagents) spent since it last reported.
        #[serde(default)]
        spent: crate::cost::Spent,
        /// The same, by kind of call (what the parent adds to its `costBreakdown`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        breakdown: Vec<crate::cost::CostLine>,
    },
    /// A CTA now waits in a subagent's tree: `asker_run_id` asked, under this run's child
    /// `child_run_id`. The parent records it and tells its own parent.
    ChildWaiting {
        child_run_id: String,
        asker_run_id: String,
        cta_id: String,
        question: String,
    },
    /// That CTA was answered or expired.
    ChildResumed {
        child_run_id: String,
        cta_id: String,
    },
    /// To a budgeted top-level run: `run_id`, of its tree, found the tree's budget spent
    /// and waits; the top-level run asks its owner (once for the tree), or tells it the
    /// budget was raised meanwhile.
    BudgetSpent {
        run_id: String,
    },
    /// To a run that waits for its tree's budget: it was raised; think on (the budget is
    /// read again first).
    BudgetRaised,
    Cancel {
        reason: String,
    },
    /// A timer the run set (a plan step's timeout) fired.
    Timer {
        timer_id: String,
    },
    /// The run cannot go on (a poison message, a fatal model error, a terminal step error).
    Fail {
        code: String,
        message: String,
    },
}

/// How a child run ended, as its parent learns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ChildOutcome {
    Completed {
        text: String,
        step_count: u32,
        total_usage: Usage,
    },
    Ended {
        status: RunStatus,
        error: String,
        /// Its error's code (absent from messages sent before it was kept).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
}

/// An event for the bus (EventBridge detail-types of DESIGN.md §7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Unique and stable: consumers deduplicate on it.
    pub id: String,
    pub detail_type: String,
    pub detail: Value,
    pub time: DateTime<Utc>,
}

/// Something to do after the commit. Every effect is idempotent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Effect {
    Send(StepMessage),
    Publish(Event),
    /// Mark the CTA item cancelled if it is still pending.
    CancelCta {
        cta_id: String,
    },
    /// A one-time timer for run `run_id` at `at`, named `timer_id`: a question's expiry
    /// (named by its CTA's id: it fires as `cta.expired`) or the run's own (its id starts
    /// with [`TIMER_PREFIX`]: a plan step's timeout, a run's deadline; it fires as
    /// `Input::Timer`). Both are one call of the scheduler, set again under the same name
    /// idempotently. (Outboxes a release before 2026-12-07 committed name a question's
    /// `schedule`, with `cta_id`: read as this.)
    #[serde(alias = "schedule")]
    Timer {
        #[serde(alias = "cta_id")]
        timer_id: String,
        run_id: String,
        at: DateTime<Utc>,
    },
    /// The timer `timer_id` is no longer wanted (gone already is fine). (Formerly a
    /// question's `unschedule`, with `cta_id`.)
    #[serde(alias = "unschedule")]
    CancelTimer {
        #[serde(alias = "cta_id")]
        timer_id: String,
    },
    /// Follow-ups of run `run_id` that no longer wait (their turn started, or they were
    /// refused or dropped): their places under the cap are free again.
    ReleaseFollowUps {
        run_id: String,
        message_ids: Vec<String>,
    },
    /// Follow-ups of run `run_id` that wait in its queue (a turn was under way when they
    /// came): their places hold, however long they wait, until released.
    HoldFollowUps {
        run_id: String,
        message_ids: Vec<String>,
    },
}

/// How the id of a run's own timer starts (a CTA's expiry timer is named by the CTA id).
pub const TIMER_PREFIX: &str = "tmr_";

/// Whether `timer_id` names a run's own timer ([`TIMER_PREFIX`]), not a question's expiry.
pub fn is_run_timer(timer_id: &str) -> bool {
    timer_id.starts_with(TIMER_PREFIX)
}

/// What the engine decided for one message: committed atomically, then its effects performed.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The run's new state, with `version` bumped by one.
    pub run: Run,
    pub appended: Vec<Entry>,
    /// Resolved entries, whole, by seq.
    pub updated: Vec<Entry>,
    pub new_ctas: Vec<Cta>,
    /// Child runs to create in the same commit, with their first entries.
    pub new_runs: Vec<(Run, Vec<Entry>)>,
    pub effects: Vec<Effect>,
    /// The run ended holding an active-run slot ([`Run::active_slot`]): the commit gives it
    /// back to its owner's count.
    pub release_slot: bool,
    /// The top-level run starts again without an active-run slot: the commit takes one.
    pub take_slot: bool,
    /// With `take_slot`, the most its owner may hold (the host's quota, set for a follow-up
    /// that starts an ended run's next turn): the commit takes the slot only while its
    /// owner holds fewer, and is refused otherwise (`PortError::QuotaExceeded`). `None`:
    /// whatever the limit.
    pub slot_limit: Option<u32>,
    /// What this step's own model calls cost, in US dollars: the store adds it to a
    /// budgeted tree's ledger, and with `daily_spend` to the run's owner's spending of the
    /// commit's UTC day.
    pub spent_usd: f64,
    /// The owner's spending of the day is kept (`BATON_MAX_DAILY_COST_USD_PER_OWNER` is set:
    /// the host says so; else it is not written, one item per owner that every think of
    /// theirs would write).
    pub daily_spend: bool,
    /// A raise of the run tree's budget a human approved in this step: the store adds it to
    /// the tree's ledger, as it adds `spent_usd` for a budgeted run ([`crate::budget`]).
    pub budget_raise: Option<crate::budget::Raise>,
}

/// Whether an outbox ends with the run's own next message. Such an outbox proves itself:
/// when that message is received, everything before it was performed (it is sent last), so
/// it is never cleared with a write of its own. Any other outbox *parks*: the run waits,
/// and only a clearing write (or a sweep, after a crash) says it was performed.
pub fn outbox_continues(run_id: &str, outbox: &[Effect]) -> bool {
    outbox
        .iter()
        .any(|e| matches!(e, Effect::Send(m) if m.run_id == run_id))
}

/// Whether `outbox` is what a perform left of it when an effect failed: the effects still
/// owed, then the run's own next message marked [`StepMessage::owed`]. It waits for the
/// sweep as a parking outbox does, though it continues.
pub fn outbox_owes(run_id: &str, outbox: &[Effect]) -> bool {
    outbox
        .iter()
        .any(|e| matches!(e, Effect::Send(m) if m.run_id == run_id && m.owed))
}

impl Transition {
    /// Applies this transition's entries to the run's timeline as held in memory: resolved
    /// entries replace theirs in place (seq is the index), new ones are appended.
    pub fn apply(&self, timeline: &mut Vec<Entry>) {
        // The timeline may be a window: entries from its first seq on.
        let base = timeline.first().map_or(0, |e| e.seq);
        for e in &self.updated {
            if let Some(slot) = e
                .seq
                .checked_sub(base)
                .and_then(|i| timeline.get_mut(i as usize))
            {
                *slot = e.clone();
            }
        }
        timeline.extend(self.appended.iter().cloned());
    }
}

/// The detail-type of the event a plan step's one-time timer puts on the bus when it fires.
pub const TIMER_FIRED: &str = "timer.fired";

/// The id a step message was first sent with, and how many times a dead letter of it was sent
/// back to its queue since (each time with `#r<n>` after that id, so that the queue does not
/// take it for a duplicate of the first).
pub fn requeued(id: &str) -> (&str, u32) {
    match id.rsplit_once("#r") {
        Some((base, n)) => match n.parse() {
            Ok(n) => (base, n),
            Err(_) => (id, 0),
        },
        None => (id, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An outbox a release before the one timer effect committed still reads: a question's
    /// `schedule` and `unschedule` are its `timer` and `cancel_timer`, as they always did
    /// the same scheduler calls.
    #[test]
    fn a_questions_schedule_in_an_older_outbox_reads_as_its_timer() {
        let at = "2026-12-01T00:00:00Z";
        let old: Vec<Effect> = serde_json::from_value(serde_json::json!([
            {"type": "schedule", "cta_id": "cta_1", "run_id": "run_1", "at": at},
            {"type": "unschedule", "cta_id": "cta_1"},
            {"type": "timer", "timer_id": "tmr_1", "run_id": "run_1", "at": at},
        ]))
        .expect("an older outbox reads");
        let at: DateTime<Utc> = at.parse().expect("a time");
        assert_eq!(
            old,
            [
                Effect::Timer {
                    timer_id: "cta_1".into(),
                    run_id: "run_1".into(),
                    at,
                },
                Effect::CancelTimer {
                    timer_id: "cta_1".into()
                },
                Effect::Timer {
                    timer_id: "tmr_1".into(),
                    run_id: "run_1".into(),
                    at,
                },
            ]
        );
        assert!(!is_run_timer("cta_1") && is_run_timer("tmr_1"));
    }
}
