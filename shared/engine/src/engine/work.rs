//! The step under construction: the run as it becomes, and what the commit will hold.
//!
//! Every input handler works on one of these; [`Work::done`] turns it into the
//! [`Transition`] to commit, with the `run.state` event when the run's state changed.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::{Next, Step};
use crate::agent::Book;
use crate::cta::Cta;
use crate::message::{Effect, Event, Input, StepMessage, Transition, is_run_timer};
use crate::run::{Run, RunStatus};
use crate::timeline::{CtaSnapshot, Entry, EntryBody, ToolEntry, ToolResult};

/// The step being built: the run as it becomes, and what the commit will hold.
pub(super) struct Work<'a> {
    /// What the step knows of agents and tools (the MCP servers' as the step found them
    /// listed).
    pub(super) book: &'a Book,
    pub(super) now: DateTime<Utc>,
    pub(super) run: Run,
    /// The run as the step found it (what the model was asked with).
    pub(super) given: &'a Run,
    /// The timeline the step read: the whole of it, or a window from `base` on.
    pub(super) timeline: &'a [Entry],
    /// The seq of `timeline`'s first entry.
    base: u64,
    pub(super) appended: Vec<Entry>,
    pub(super) updated: BTreeMap<u64, Entry>,
    pub(super) new_ctas: Vec<Cta>,
    pub(super) new_runs: Vec<(Run, Vec<Entry>)>,
    pub(super) effects: Vec<Effect>,
    /// The whole final answer of this step, when it completes the turn (the run item keeps
    /// only a preview; the parent is told up to a tool output's cap).
    pub(super) final_text: Option<String>,
    /// The seq of the first entry of the current batch.
    pub(super) batch_start: u64,
    /// The pending CTAs' records, when the run is ending (see `Step::Settle`).
    pub(super) settled: Option<&'a HashMap<String, Cta>>,
    /// The raise of its tree's budget a human approved in this step.
    pub(super) raise: Option<crate::budget::Raise>,
    /// Its tree's budget ledger, once this step has read it ([`Step::ReadBudget`]).
    pub(super) ledger: Option<crate::budget::Ledger>,
    /// This step resolved calls that were due (committed before it): it has work to
    /// commit, whatever its input says.
    pub(super) ran_due: bool,
    /// This step holds the output of an `idempotent` or `once` call it has not committed:
    /// committed before anything else runs or thinks.
    pub(super) unsaved_effects: bool,
    /// Commit this step as a checkpoint and step again from it ([`Step::Checkpoint`]).
    pub(super) go_on: bool,
    /// The `once` calls this step's commit marks started.
    pub(super) marked: Vec<u64>,
}

impl<'a> Work<'a> {
    pub(super) fn new(
        book: &'a Book,
        now: DateTime<Utc>,
        run: &'a Run,
        timeline: &'a [Entry],
        settled: Option<&'a HashMap<String, Cta>>,
    ) -> Self {
        // The timeline may be a window (entries from `base` on) that starts at the batch or
        // before it; with no reply in it, the batch starts where the run says.
        let base = timeline.first().map_or(run.next_seq, |e| e.seq);
        let batch_start = timeline
            .iter()
            .rposition(|e| matches!(e.body, EntryBody::Assistant { .. }))
            .map_or(run.batch_start.min(base), |i| base + i as u64 + 1);
        Self {
            book,
            now,
            run: run.clone(),
            given: run,
            timeline,
            base,
            appended: Vec::new(),
            updated: BTreeMap::new(),
            new_ctas: Vec::new(),
            new_runs: Vec::new(),
            effects: Vec::new(),
            final_text: None,
            batch_start,
            settled,
            raise: None,
            ledger: None,
            ran_due: false,
            unsaved_effects: false,
            go_on: false,
            marked: Vec::new(),
        }
    }

    /// The first seq this step appends.
    fn window_end(&self) -> u64 {
        self.base + self.timeline.len() as u64
    }

    /// Where entry `seq` is in the window; it must be in it ([`super::window_start`] reads
    /// from the earliest seq a step may touch).
    fn index(&self, seq: u64) -> usize {
        assert!(
            seq >= self.base,
            "entry {seq} is before the step's window (from {}): window_start must cover it",
            self.base
        );
        (seq - self.base) as usize
    }

    pub(super) fn entry(&self, seq: u64) -> &Entry {
        if let Some(e) = self.updated.get(&seq) {
            return e;
        }
        if seq >= self.window_end() {
            &self.appended[(seq - self.window_end()) as usize]
        } else {
            &self.timeline[self.index(seq)]
        }
    }

    pub(super) fn entry_mut(&mut self, seq: u64) -> &mut Entry {
        let end = self.window_end();
        if seq >= end {
            return &mut self.appended[(seq - end) as usize];
        }
        let entry = &self.timeline[self.index(seq)];
        self.updated.entry(seq).or_insert_with(|| entry.clone())
    }

    pub(super) fn tool(&self, seq: u64) -> &ToolEntry {
        match &self.entry(seq).body {
            EntryBody::Tool(t) => t,
            _ => unreachable!("seq {seq} is a tool entry by construction"),
        }
    }

    pub(super) fn tool_mut(&mut self, seq: u64) -> &mut ToolEntry {
        match &mut self.entry_mut(seq).body {
            EntryBody::Tool(t) => t,
            _ => unreachable!("seq {seq} is a tool entry by construction"),
        }
    }

    pub(super) fn push(&mut self, body: EntryBody) -> u64 {
        let seq = self.run.next_seq;
        self.run.next_seq += 1;
        if matches!(body, EntryBody::Assistant { .. }) {
            self.batch_start = seq + 1;
        }
        self.appended.push(Entry {
            seq,
            at: self.now,
            body,
        });
        seq
    }

    /// How long the call ran, on its entry, once its result is in (from this step's run).
    pub(super) fn time_call(&mut self, seq: u64, io: &super::Io) {
        let t = self.tool_mut(seq);
        if !t.result.is_pending() {
            t.duration_ms = io.durations.get(&seq).copied().or(t.duration_ms);
        }
    }

    /// The widgets and files the call at `seq` added beside its output, as entries after it,
    /// and the plugin states it set, onto the run (committed with its output).
    pub(super) fn push_widgets(&mut self, seq: u64, io: &super::Io) {
        let call_id = self.tool(seq).id.clone();
        for w in io.widgets.get(&seq).into_iter().flatten() {
            self.push(EntryBody::Widget {
                call_id: call_id.clone(),
                kind: w.kind.clone(),
                data: w.data.clone(),
                fallback: w.fallback.clone(),
            });
        }
        if let Some(states) = io.states.get(&seq) {
            self.run.plugin_state.extend(states.clone());
        }
        for f in io.files.get(&seq).into_iter().flatten() {
            self.push(EntryBody::File(f.clone()));
        }
    }

    pub(super) fn batch(&self) -> std::ops::Range<u64> {
        self.batch_start..self.run.next_seq
    }

    /// The pending tool entries of the current batch that match.
    pub(super) fn pending_seqs(&self, pred: impl Fn(&ToolEntry) -> bool) -> Vec<u64> {
        self.batch()
            .filter(|&s| match &self.entry(s).body {
                EntryBody::Tool(t) => t.result.is_pending() && pred(t),
                _ => false,
            })
            .collect()
    }

    pub(super) fn pending_where(&self, pred: impl Fn(&ToolEntry) -> bool) -> Option<u64> {
        self.pending_seqs(pred).into_iter().next()
    }

    pub(super) fn resolve(&mut self, seq: u64, result: ToolResult, cta: Option<CtaSnapshot>) {
        let t = self.tool_mut(seq);
        t.result = result;
        if cta.is_some() {
            t.cta = cta;
        }
    }

    pub(super) fn send(&mut self, run_id: &str, tag: &str, input: Input) {
        let id = format!("{}:{}:{tag}", self.run.run_id, self.run.version + 1);
        self.effects.push(Effect::Send(StepMessage {
            run_id: run_id.into(),
            id,
            input,
            owed: false,
        }));
    }

    /// Sends the run its own next step (think again), marked with the version this step
    /// commits, which [`super::start::resume`] checks.
    pub(super) fn send_continue(&mut self) {
        let version = self.run.version + 1;
        self.run.waits.continue_at = Some(version);
        let run_id = self.run.run_id.clone();
        self.send(&run_id, "continue", Input::Continue { version });
    }

    pub(super) fn publish(&mut self, detail_type: &str, detail: Value) {
        let n = self
            .effects
            .iter()
            .filter(|e| matches!(e, Effect::Publish(_)))
            .count();
        let id = format!("{}:{}:{n}", self.run.run_id, self.run.version + 1);
        self.effects.push(Effect::Publish(Event {
            id,
            detail_type: detail_type.into(),
            detail,
            time: self.now,
        }));
    }

    /// Records the turn's final answer: whole in the timeline entry `seq` (if any), a
    /// preview on the run.
    pub(super) fn set_result(&mut self, text: String, seq: Option<u64>) {
        let (shown, cut) = super::preview(&text, super::PREVIEW_BYTES);
        self.run.outcome.result = Some(shown);
        self.run.outcome.result_seq = seq;
        self.run.outcome.result_truncated = cut;
        self.final_text = Some(text);
    }

    /// What the run is doing once this step commits, and the details: thinking (its
    /// iteration); waiting on the user (the CTAs), a plan (its steps done of all) or
    /// subagents (which).
    fn state(&self) -> (Option<&'static str>, Option<serde_json::Value>) {
        match self.run.status {
            RunStatus::Running | RunStatus::Queued => (
                Some("thinking"),
                Some(json!({"iteration": self.run.counters.thinks})),
            ),
            RunStatus::Waiting if self.run.waits.budget_parked => (
                // Its tree's budget question, which its top-level run asks: a human's.
                Some("waiting_on_user"),
                Some(json!({"ctaIds": [], "budgetQuestionOf": self.run.root()})),
            ),
            RunStatus::Waiting => {
                let pending: Vec<&ToolEntry> = self
                    .pending_seqs(|_| true)
                    .into_iter()
                    .map(|s| self.tool(s))
                    .collect();
                let ctas: Vec<&str> = pending
                    .iter()
                    .filter_map(|t| t.cta.as_ref())
                    .filter(|c| c.status == crate::cta::CtaStatus::Pending)
                    .map(|c| c.cta_id.as_str())
                    .collect();
                if !ctas.is_empty() {
                    let mut detail = json!({"ctaIds": ctas});
                    // Drafts alone: a follow-up answers them in the conversation.
                    if !self.conversational_drafts().is_empty() {
                        detail["draftPlans"] = json!(true);
                    }
                    return (Some("waiting_on_user"), Some(detail));
                }
                if let Some(t) = pending.iter().find(|t| t.plan.is_some()) {
                    let steps = t.plan.as_ref().map(|p| &p.steps);
                    let done =
                        steps.map_or(0, |s| s.values().filter(|s| s.status.is_done()).count());
                    let total = steps.map_or(0, |s| s.len());
                    let detail = json!({"callId": t.id, "done": done, "total": total});
                    return (Some("executing_plan"), Some(detail));
                }
                let subagents: Vec<&str> = pending
                    .iter()
                    .filter_map(|t| t.child_run_id.as_deref())
                    .collect();
                (
                    Some("waiting_on_subagents"),
                    Some(json!({"subagents": subagents})),
                )
            }
            _ => (None, None),
        }
    }

    /// The run's working clock, as this commit leaves it: it runs while the run works —
    /// queued or running, or waiting on work (subagents, a plan, tools) — and stops while it
    /// or a subagent waits for a human, and between turns. While it runs and the run
    /// waits, a timer is armed for its deadline (`maxWallSeconds`), which a step would
    /// otherwise only check before a think.
    fn clock(&mut self, state: Option<&str>) {
        if let Some(since) = self.run.clock.working_since.take() {
            self.run.clock.worked_ms += (self.now - since).num_milliseconds().max(0) as u64;
        }
        let works = match self.run.status {
            RunStatus::Queued | RunStatus::Running => true,
            RunStatus::Waiting => {
                state != Some("waiting_on_user") && self.run.waits.waiting_ctas.is_empty()
            }
            _ => false,
        };
        if works {
            self.run.clock.working_since = Some(self.now);
        }
        let max = self.book.agent(&self.run.agent).and_then(|a| a.max_wall);
        let waits_on_work = works && self.run.status == RunStatus::Waiting;
        match (&self.run.clock.deadline_timer, max) {
            (None, Some(max)) if waits_on_work => {
                let left = max.as_millis() as i64 - self.run.clock.worked_ms as i64;
                let at = self.now + chrono::Duration::milliseconds(left.max(1000));
                let timer_id = format!(
                    "{}deadline_{}",
                    crate::message::TIMER_PREFIX,
                    super::derive_id("dl", &self.run.run_id, self.run.version)
                );
                self.run.clock.deadline_timer = Some(timer_id.clone());
                self.effects.push(Effect::Timer {
                    timer_id,
                    run_id: self.run.run_id.clone(),
                    at,
                });
            }
            (Some(_), _) if !waits_on_work => {
                // Working again (a think checks the deadline itself), paused, or ended.
                if let Some(timer_id) = self.run.clock.deadline_timer.take() {
                    self.effects.push(Effect::CancelTimer { timer_id });
                }
            }
            _ => {}
        }
    }

    /// After a pending result resolved: run the calls that are due, think if the batch is
    /// complete, else keep waiting.
    pub(super) fn after_resolution(&mut self) -> Next {
        if self.pending_where(|t| t.is_due()).is_some() {
            return Next::RunDue;
        }
        if self.pending_where(|_| true).is_some() {
            self.run.status = RunStatus::Waiting;
            Next::Commit
        } else {
            self.run.status = RunStatus::Running;
            Next::Think
        }
    }

    /// What a step whose own input was stale commits after running the due calls: the run
    /// waits on what is still pending, or thinks in its next delivery (a delivery thinks
    /// only for its own input).
    pub(super) fn carry_on(&mut self) -> Next {
        if self.pending_where(|_| true).is_some() {
            self.run.status = RunStatus::Waiting;
        } else {
            self.run.status = RunStatus::Running;
            self.send_continue();
        }
        Next::Commit
    }

    /// Whether this step has anything to commit: entries, questions, runs or effects.
    pub(super) fn has_changes(&self) -> bool {
        !self.appended.is_empty()
            || !self.updated.is_empty()
            || !self.new_ctas.is_empty()
            || !self.new_runs.is_empty()
            || !self.effects.is_empty()
    }

    pub(super) fn done(mut self) -> Step {
        let (state, detail) = self.state();
        if let Some(s) = state
            && self.run.outcome.state.as_deref() != Some(s)
        {
            let mut event = json!({"runId": self.run.run_id, "state": s});
            if let Some(d) = &detail {
                event["detail"] = d.clone();
            }
            // What the run works on, for consumers that route by it (seed 003).
            if let Some(t) = self.run.context_type() {
                event["contextType"] = json!(t);
            }
            self.publish("run.state", event);
        }
        // Time waiting for a human is kept apart.
        if state == Some("waiting_on_user") {
            self.run.clock.waiting_since.get_or_insert(self.now);
        } else if let Some(since) = self.run.clock.waiting_since.take() {
            self.run.clock.human_wait_ms += (self.now - since).num_milliseconds().max(0) as u64;
        }
        self.clock(state);
        self.run.outcome.state = state.map(str::to_owned);
        self.run.outcome.state_detail = detail;
        if self.run.status != RunStatus::Running {
            // No think is on its way to a run that is not running.
            self.run.waits.continue_at = None;
        }
        // The run's own timers it has armed and not fired nor cancelled, for the stores'
        // index (a question's expiry is indexed with its CTA).
        for e in &self.effects {
            match e {
                Effect::Timer { timer_id, at, .. } if is_run_timer(timer_id) => {
                    self.run.clock.timers.insert(timer_id.clone(), *at);
                }
                Effect::CancelTimer { timer_id } if is_run_timer(timer_id) => {
                    self.run.clock.timers.remove(timer_id);
                }
                _ => {}
            }
        }
        if self.run.status.is_terminal() {
            self.run.clock.timers.clear();
        }
        let began = self.run.spend.turn_seq != self.given.spend.turn_seq;
        if self.run.status.is_terminal() && (!self.given.status.is_terminal() || began) {
            // The turn ended (begun in this step, or before it): what it spent, with its
            // subagents.
            let spent = self.run.total() - self.run.spend.turn_start;
            self.push(EntryBody::Usage {
                turn_seq: self.run.spend.turn_seq,
                usage: spent.usage,
                cost_usd: spent.cost_usd,
            });
        }
        // What this step's own model calls cost: added to its owner's spending of the day.
        let spent_usd = (self.run.spend.cost_usd - self.given.spend.cost_usd).max(0.0);
        // An ended run gives its active-run slot back, with this commit.
        let release_slot = self.run.active_slot && self.run.status.is_terminal();
        if release_slot {
            self.run.active_slot = false;
        }
        self.run.version += 1;
        self.run.batch_start = self.batch_start;
        self.run.updated_at = self.now;
        // A step committed: whatever failed before is behind the run.
        self.run.outcome.last_error = None;
        let transition = Box::new(Transition {
            run: self.run,
            appended: self.appended,
            updated: self.updated.into_values().collect(),
            new_ctas: self.new_ctas,
            new_runs: self.new_runs,
            effects: self.effects,
            release_slot,
            take_slot: false,
            slot_limit: None,
            spent_usd,
            daily_spend: false,
            budget_raise: self.raise,
        });
        if self.go_on {
            Step::Checkpoint {
                transition,
                marked: self.marked,
            }
        } else {
            Step::Done(transition)
        }
    }
}
