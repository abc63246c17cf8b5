//! Every end of a run: cancelled, failed, and (through [`Work::end`]) completed and expired
//! too. Ending settles everything pending, records why, publishes it and tells the parent.

use serde_json::json;

use super::{MAX_OUTPUT_BYTES, Next, PREVIEW_BYTES, Step, Work, cap_at, preview};
use crate::cta::CtaStatus;
use crate::message::{ChildOutcome, Effect, Input, StepMessage};
use crate::run::{RunError, RunStatus};
use crate::timeline::{EntryBody, ToolResult};

/// `Cancel`: end an active run as cancelled, its CTAs and children with it.
pub(super) fn cancel(w: &mut Work, reason: &str) -> Next {
    if w.run.status == RunStatus::Cancelled {
        return Next::Now(Step::Ignore("run already cancelled".into()));
    }
    if w.run.status.is_terminal() {
        // The run ended before the cancel's turn came: say so once, in its timeline.
        let said = w
            .timeline
            .iter()
            .rev()
            .take_while(|e| !matches!(e.body, EntryBody::User { .. }))
            .any(
                |e| matches!(&e.body, EntryBody::Notice { code, .. } if code == "cancel_too_late"),
            );
        if said {
            return Next::Now(Step::Ignore("run already ended".into()));
        }
        w.push(EntryBody::Notice {
            code: "cancel_too_late".into(),
            message: format!(
                "a cancel came after the run had ended ({}); it changed nothing",
                w.run.status.as_str()
            ),
        });
        return Next::Commit;
    }
    w.end(RunStatus::Cancelled, "cancelled", reason);
    Next::Commit
}

/// `Fail`: end an active run as failed, with the error in its timeline.
pub(super) fn fail(w: &mut Work, code: &str, message: &str) -> Next {
    if w.run.status.is_terminal() {
        return Next::Now(Step::Ignore("run already ended".into()));
    }
    w.end(RunStatus::Failed, code, message);
    Next::Commit
}

/// The run's deadline timer fired while it waited on work: past its deadline, it ends
/// failed with its subagents; short of it (its clock stopped a while, for a human), the
/// timer is armed again for what is left.
pub(super) fn deadline(w: &mut Work) -> Next {
    if w.run.status.is_terminal() {
        return Next::Now(Step::Ignore("run already ended".into()));
    }
    w.run.clock.deadline_timer = None;
    if let Some(max) = w.book.agent(&w.run.agent).and_then(|a| a.max_wall) {
        let worked = w.run.working_time(w.now);
        if worked.num_milliseconds() >= max.as_millis() as i64 {
            let msg = format!(
                "stopped after working {} s, past maxWallSeconds = {} for agent `{}`, while it \
                 waited on its subagents (time waiting for a human is not counted)",
                worked.num_seconds(),
                max.as_secs(),
                w.run.agent
            );
            w.end(RunStatus::Failed, "deadline_exceeded", &msg);
        }
    }
    // Short of it: committing arms the timer again, for what is left, if the run still
    // waits on work.
    Next::Commit
}

impl Work<'_> {
    /// Ends the run: settles everything pending, records why, tells the parent.
    pub(super) fn end(&mut self, status: RunStatus, code: &str, message: &str) {
        // An error can quote whatever failed (a provider's reply, a store's refusal): the
        // run item, its events and its parent get a bounded part of it.
        let (message, _) = preview(message, PREVIEW_BYTES);
        let message = message.as_str();
        let why = format!("run {}: {message}", status.as_str());
        for seq in self.pending_seqs(|_| true) {
            let t = self.tool(seq).clone();
            let mut snap = t.cta.clone();
            if let Some(p) = &t.plan {
                self.abandon_plan(p, &why);
            }
            // A CTA answered already (a plan's, approved, its steps running) stays so.
            if let Some(s) = snap.as_mut().filter(|s| s.status == CtaStatus::Pending) {
                // The CTA record decides: an answer (or expiry) written before the run's
                // end stays in the timeline as such; otherwise the CTA is cancelled (the
                // step settled it before this commit, or the effect does after it).
                match self.settled.and_then(|m| m.get(&s.cta_id)) {
                    Some(rec) if rec.status != CtaStatus::Pending => {
                        s.status = rec.status;
                        s.response = rec.response.clone();
                        s.responder = rec.responder.clone();
                    }
                    _ => {
                        s.status = CtaStatus::Cancelled;
                        self.effects.push(Effect::CancelCta {
                            cta_id: s.cta_id.clone(),
                        });
                    }
                }
                super::cta::cancel_timers(&mut self.effects, s);
            }
            if let Some(child) = &t.child_run_id {
                let id = format!("{child}:cancel:{}", self.run.run_id);
                self.effects.push(Effect::Send(StepMessage {
                    run_id: child.clone(),
                    id,
                    input: Input::Cancel {
                        reason: format!("parent {}", why),
                    },
                    owed: false,
                }));
            }
            let error = if t.is_due() && t.started > 0 {
                // A `once` call started and cut off: no one knows whether it took effect.
                format!(
                    "{}: it was started and cut off before its result was recorded ({why})",
                    super::calls::OUTCOME_UNKNOWN
                )
            } else if t.is_due() {
                format!("not run: {why}")
            } else {
                format!("not completed: {why}")
            };
            self.resolve(seq, ToolResult::error(error), snap);
        }
        self.run.status = status;
        let run_id = self.run.run_id.clone();
        if status == RunStatus::Completed {
            if !code.is_empty() {
                self.push(EntryBody::Notice {
                    code: code.into(),
                    message: message.into(),
                });
            }
            // The event carries the run item's preview and where the whole answer is.
            let mut detail = json!({
                "runId": run_id,
                "text": self.run.outcome.result.clone().unwrap_or_default(),
                "usage": self.run.spend.usage,
                "costUsd": self.run.spend.cost_usd,
                "total": self.run.total(),
            });
            if self.run.outcome.result_truncated {
                detail["textTruncated"] = json!(true);
                detail["resultSeq"] = json!(self.run.outcome.result_seq);
            }
            self.publish("run.completed", detail);
        } else {
            let body = EntryBody::Error {
                code: code.into(),
                message: message.into(),
            };
            let body = if status == RunStatus::Failed {
                body
            } else {
                EntryBody::Notice {
                    code: code.into(),
                    message: message.into(),
                }
            };
            self.push(body);
            self.run.outcome.error = Some(RunError {
                code: code.into(),
                message: message.into(),
            });
            self.publish(&format!("run.{}", status.as_str()), json!({
                "runId": run_id, "error": {"code": code, "message": message}, "usage": self.run.spend.usage,
                "costUsd": self.run.spend.cost_usd, "total": self.run.total(),
            }));
        }
        if let Some(parent) = self.run.origin.parent.clone() {
            let outcome = if status == RunStatus::Completed {
                // The parent's tool result: capped like any tool output, in a message that
                // must fit SQS's 256 KB. The whole answer stays in the child's timeline.
                let text = self
                    .final_text
                    .clone()
                    .or_else(|| self.run.outcome.result.clone());
                ChildOutcome::Completed {
                    text: cap_at(text.unwrap_or_default(), MAX_OUTPUT_BYTES),
                    step_count: self.run.counters.thinks,
                    total_usage: self.run.spend.usage,
                }
            } else {
                ChildOutcome::Ended {
                    status,
                    error: message.into(),
                    code: Some(code.to_owned()).filter(|c| !c.is_empty()),
                }
            };
            // What it spent since it last reported (a continued subagent reports again).
            let spent = self.run.total() - self.run.spend.reported;
            self.run.spend.reported = self.run.total();
            let breakdown = crate::cost::lines_since(
                &self.run.spend.cost_breakdown,
                &self.run.spend.reported_breakdown,
            );
            self.run.spend.reported_breakdown = self.run.spend.cost_breakdown.clone();
            self.send(
                &parent.run_id,
                "finished",
                Input::ChildFinished {
                    child_run_id: run_id,
                    tool_call_id: parent.tool_call_id,
                    outcome,
                    spent,
                    breakdown,
                },
            );
        }
        self.next_queued_turn();
    }
}
