//! Every end of a run: cancelled, failed, and (through [`Work::end`]) completed and expired
//! too. Ending settles everything pending, records why, publishes it and tells the parent.

use serde_json::json;

use super::{Next, Step, Work};
use crate::cta::CtaStatus;
use crate::message::{ChildOutcome, Effect, Input, StepMessage};
use crate::run::{RunError, RunStatus};
use crate::timeline::{EntryBody, ToolResult};

/// `Cancel`: end an active run as cancelled, its CTAs and children with it.
pub(super) fn cancel(w: &mut Work, reason: &str) -> Next {
    if w.run.status.is_terminal() {
        return Next::Now(Step::Ignore("run already ended".into()));
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

impl Work<'_> {
    /// Ends the run: settles everything pending, records why, tells the parent.
    pub(super) fn end(&mut self, status: RunStatus, code: &str, message: &str) {
        let why = format!("run {}: {message}", status.as_str());
        for seq in self.pending_seqs(|_| true) {
            let t = self.tool(seq).clone();
            let mut snap = t.cta.clone();
            if let Some(s) = snap.as_mut() {
                s.status = CtaStatus::Cancelled;
                self.effects.push(Effect::CancelCta {
                    cta_id: s.cta_id.clone(),
                });
                self.effects.push(Effect::Unschedule {
                    cta_id: s.cta_id.clone(),
                });
            }
            if let Some(child) = &t.child_run_id {
                let id = format!("{child}:cancel:{}", self.run.run_id);
                self.effects.push(Effect::Send(StepMessage {
                    run_id: child.clone(),
                    id,
                    input: Input::Cancel {
                        reason: format!("parent {}", why),
                    },
                }));
            }
            self.resolve(
                seq,
                ToolResult::error(format!("not completed: {why}")),
                snap,
            );
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
            let text = self.run.result.clone().unwrap_or_default();
            self.publish(
                "run.completed",
                json!({
                    "runId": run_id, "text": text, "usage": self.run.usage,
                }),
            );
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
            self.run.error = Some(RunError {
                code: code.into(),
                message: message.into(),
            });
            self.publish(&format!("run.{}", status.as_str()), json!({
                "runId": run_id, "error": {"code": code, "message": message}, "usage": self.run.usage,
            }));
        }
        if let Some(parent) = self.run.parent.clone() {
            let outcome = if status == RunStatus::Completed {
                ChildOutcome::Completed {
                    text: self.run.result.clone().unwrap_or_default(),
                    step_count: self.run.thinks,
                    total_usage: self.run.usage,
                }
            } else {
                ChildOutcome::Ended {
                    status,
                    error: message.into(),
                }
            };
            self.send(
                &parent.run_id,
                "finished",
                Input::ChildFinished {
                    child_run_id: run_id,
                    tool_call_id: parent.tool_call_id,
                    outcome,
                },
            );
        }
    }
}
