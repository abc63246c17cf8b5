//! The calls committed and not yet run. A reply is committed with the calls it asks for
//! before any of them runs, so that no failure after it (a crash, a Lambda timeout, a
//! conflict) asks the model for it again; each call then runs as its effects say
//! ([`Effects`]), its idempotency key derived by its host from the committed call:
//!
//! - `none`: its output rides in the step's commit. A reply whose calls are all `none` is
//!   committed with them due, and its run's next delivery runs them before it thinks: a
//!   loop of such calls commits once an iteration, as before.
//! - `idempotent`: run again after a crash, under the same key; its output is committed
//!   before anything else runs or thinks.
//! - `once`: marked started in the commit before it runs (the reply's own, when it runs
//!   first), its output committed before anything else runs. A delivery that finds it
//!   started and did not mark it knows it was cut off: it is not run again, and the model
//!   is told its outcome is unknown, or (`onUnknownOutcome: "ask"`) a person is asked
//!   whether to run it again.
//!
//! Every input's step first looks here ([`super::step`]): the due calls of the batch run, or
//! are known cut off, before the input is applied.

use super::ask::Ask;
use super::{Execution, Io, Work, preview, to_result};
use crate::agent::UnknownOutcome;
use crate::cta::{CtaRequest, Gated};
use crate::timeline::{EXECUTING, ToolResult};
use crate::tools::Effects;

/// What the due calls need before the step goes on.
pub(super) enum Due {
    /// Run these, in order, and step again with their outputs.
    Run(Vec<Execution>),
    /// Commit what is in hand (and mark the next `once` call started), then step again.
    Commit,
    /// The next call does not fit in the invocation, and nothing is in hand: stop.
    Defer,
}

/// What the model is told of a `once` call cut off while it ran, by its tool.
pub const OUTCOME_UNKNOWN: &str = "outcome_unknown";

impl Work<'_> {
    /// The seqs of the batch's due calls, in order.
    pub(super) fn due_seqs(&self) -> Vec<u64> {
        self.pending_seqs(|t| t.is_due())
    }

    /// Whether the due calls are left to the run's next think: they all change nothing,
    /// and the `Continue` their reply's commit sent is on its way (it runs them, then thinks,
    /// in one commit), while `input` is another message (a redelivery finds them so).
    pub(super) fn left_to_continue(&self, input: &crate::message::Input) -> bool {
        let Some(at) = self.run.waits.continue_at else {
            return false;
        };
        let awaited =
            matches!(input, crate::message::Input::Continue { version } if *version == at);
        !awaited
            && self
                .due_seqs()
                .iter()
                .all(|&s| self.tool(s).effects == Some(Effects::None))
    }

    /// The call at `seq`, as its host runs it.
    pub(super) fn execution(&self, seq: u64) -> Execution {
        let t = self.tool(seq);
        Execution {
            call_id: t.id.clone(),
            seq,
            tool: t.name.clone(),
            input: t.input.clone(),
            effects: t.effects.unwrap_or(Effects::Once),
        }
    }

    /// Makes the waiting call at `seq` due: its reply's approvals are settled (or a person
    /// said to run it again), and it runs with this step's calls. Its effects are the ones
    /// recorded when its reply was committed, else its tool's now.
    pub(super) fn make_due(&mut self, seq: u64) {
        let declared = {
            let t = self.tool(seq);
            self.book.tool(&t.name).map(|d| d.effects())
        };
        let t = self.tool_mut(seq);
        t.result = ToolResult::Pending {
            reason: EXECUTING.into(),
        };
        t.effects = t.effects.or(declared).or(Some(Effects::Once));
        t.started = 0;
    }

    /// Whether this delivery marked the `once` call at `seq` started, in a commit that is in.
    fn ours(&self, seq: u64, io: &Io) -> bool {
        io.marked.contains(&seq) && self.tool(seq).started > 0
    }

    /// The due calls, in order: each resolved from its output when it ran, or found cut
    /// off; then what must happen before the step goes on, if anything (`None`: none is
    /// due any more).
    pub(super) fn run_due(&mut self, io: &Io) -> Option<Due> {
        let mut run = Vec::new();
        for seq in self.due_seqs() {
            let effects = self.tool(seq).effects.unwrap_or(Effects::Once);
            if let Some(out) = io.outputs.get(&seq) {
                self.push_widgets(seq, io);
                self.resolve(seq, to_result(out.clone()), None);
                self.time_call(seq, io);
                self.ran_due = true;
                self.unsaved_effects |= effects != Effects::None;
                continue;
            }
            if effects == Effects::Once && self.tool(seq).started > 0 && !self.ours(seq, io) {
                self.cut_off(seq);
                continue;
            }
            // `seq` has yet to run.
            if io.out_of_time.is_some() {
                // Not in this invocation: a start marked for it never happened.
                if self.ours(seq, io) {
                    self.tool_mut(seq).started -= 1;
                }
                if self.has_changes() {
                    self.checkpoint(io);
                    return Some(Due::Commit);
                }
                return Some(Due::Defer);
            }
            if run.is_empty() && self.unsaved_effects {
                // An output with effects is kept before anything else runs.
                self.checkpoint(io);
                return Some(Due::Commit);
            }
            if effects == Effects::Once && !self.ours(seq, io) {
                if run.is_empty() {
                    // Its start, committed before it runs.
                    self.checkpoint(io);
                    return Some(Due::Commit);
                }
                break;
            }
            run.push(self.execution(seq));
            if effects != Effects::None {
                break;
            }
        }
        (!run.is_empty()).then_some(Due::Run(run))
    }

    /// The step that does what the due calls need.
    pub(super) fn step_for(self, need: Due) -> super::Step {
        match need {
            Due::Run(calls) => super::Step::Execute(calls),
            Due::Commit => self.done(),
            Due::Defer => super::Step::Defer,
        }
    }

    /// Makes this step a checkpoint ([`super::Step::Checkpoint`]): its commit marks the
    /// next due call started when it must run once (and the time is there to run it).
    pub(super) fn checkpoint(&mut self, io: &Io) {
        self.go_on = true;
        if io.out_of_time.is_some() {
            return;
        }
        let Some(seq) = self.due_seqs().into_iter().next() else {
            return;
        };
        if self.tool(seq).effects == Some(Effects::Once) && !self.ours(seq, io) {
            self.tool_mut(seq).started += 1;
            self.marked.push(seq);
        }
    }

    /// The `once` call at `seq` was started and its output never recorded: its process
    /// stopped while it ran. It is not run again blindly: the model is told its outcome is
    /// unknown, or, when its agent says `onUnknownOutcome: "ask"`, a person is asked whether
    /// to run it again (approved, it runs under the same key).
    fn cut_off(&mut self, seq: u64) {
        self.ran_due = true;
        let (call_id, name, input) = {
            let t = self.tool(seq);
            (t.id.clone(), t.name.clone(), t.input.clone())
        };
        let agent = self.book.agent(&self.run.agent);
        let ask = agent.is_some_and(|a| a.on_unknown_outcome == UnknownOutcome::Ask);
        let what = format!(
            "`{name}` was started and its process stopped before its result was recorded: it \
             may or may not have taken effect"
        );
        if let (true, Some(agent)) = (ask, agent) {
            let (shown, _) = preview(&input.to_string(), super::PREVIEW_BYTES);
            let message = format!("{what}. Run it again with input {shown}?");
            let gated = Gated {
                tool: name,
                input: super::cap_output(input),
                reason: Some(format!("{OUTCOME_UNKNOWN}: {what}")),
            };
            let ask = Ask::gate(CtaRequest::Approval { message }, gated, agent.cta_expiry);
            let result = self.raise_cta(seq, &call_id, ask);
            self.tool_mut(seq).result = result;
            return;
        }
        self.resolve(
            seq,
            ToolResult::error(format!(
                "{OUTCOME_UNKNOWN}: {what}. It was not run again: find out whether it did \
                 before you call it again."
            )),
            None,
        );
    }
}
