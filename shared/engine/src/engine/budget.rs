//! Budgets ([`crate::budget`]): before a think, a run whose tree has spent its budget asks
//! its owner instead of calling the model; the answer raises the budget (the run thinks on)
//! or ends the run `failed`, `budget_exhausted`, as its expiry does.

use serde_json::json;

use super::cta::Ask;
use super::{Io, Next, Step, Work, derive_id};
use crate::agent::AgentDef;
use crate::budget::{BudgetAsk, ENTRY, EXHAUSTED, Raise};
use crate::cta::{CtaRequest, CtaResponse, CtaStatus};
use crate::message::Effect;
use crate::run::RunStatus;
use crate::timeline::{CtaSnapshot, EntryBody, ToolEntry, ToolResult};

impl Work<'_> {
    /// Before the think: with its tree's budget spent, the run asks its owner (an approval
    /// on an entry of its own, which the model never sees) and waits. `Some` when the step
    /// must read the tree's ledger first, or has asked (then `Some(None)`: commit).
    pub(super) fn check_budget(&mut self, agent: &AgentDef, io: &Io) -> Option<Option<Step>> {
        let budget = self.run.budget?;
        let Some(ledger) = &io.budget else {
            return Some(Some(Step::ReadBudget));
        };
        // A raise this step took counts already: it commits with the think.
        let budget_usd = ledger.budget_usd + self.raise.as_ref().map_or(0.0, |r| r.by_usd);
        if ledger.spent_usd < budget_usd {
            return None;
        }
        let ask = BudgetAsk {
            spent_usd: ledger.spent_usd,
            budget_usd,
            ask_usd: budget.budget_usd,
        };
        let seq = self.run.next_seq;
        let id = derive_id("budget", &self.run.run_id, seq);
        self.push(EntryBody::Tool(ToolEntry {
            id: id.clone(),
            name: ENTRY.into(),
            input: json!(ask),
            result: ToolResult::Pending {
                reason: "asking".into(),
            },
            reply_seq: self.batch_start.saturating_sub(1),
            cta: None,
            child_run_id: None,
            plan: None,
            duration_ms: None,
            effects: None,
            started: 0,
        }));
        let message = format!(
            "This run has spent ${:.4} of its ${:.4} budget (with its subagents). Allow it to \
             spend ${:.4} more?",
            ask.spent_usd, ask.budget_usd, ask.ask_usd
        );
        let question = Ask {
            request: CtaRequest::Approval { message },
            default: None,
            gated: None,
            gate: false,
            expiry: agent.cta_expiry,
            budget: Some(ask),
        };
        let result = self.raise_cta(seq, &id, question);
        self.tool_mut(seq).result = result;
        self.run.status = RunStatus::Waiting;
        Some(None)
    }
}

/// The budget question at `seq` answered: approved, the tree's budget is raised (by the
/// answer's `raiseUsd`, else by what it asked) in this step's commit and the run thinks on;
/// rejected, the run ends `failed`.
pub(super) fn answered(
    w: &mut Work,
    seq: u64,
    mut snap: CtaSnapshot,
    response: &CtaResponse,
    responder: Option<&str>,
) -> Next {
    let Some(ask) = snap.budget else {
        return Next::Now(Step::Ignore("not a budget question".into()));
    };
    let cta_id = snap.cta_id.clone();
    snap.status = CtaStatus::Answered;
    snap.response = Some(response.clone());
    snap.responder = responder.map(str::to_owned);
    w.tell_parent_resumed(&cta_id);
    w.effects.push(Effect::Unschedule {
        cta_id: cta_id.clone(),
    });
    match response {
        CtaResponse::Approval {
            approved: true,
            raise_usd,
            ..
        } => {
            let by_usd = raise_usd.unwrap_or(ask.ask_usd);
            let budget_usd = ask.budget_usd + by_usd;
            let output = json!({"approved": true, "raisedUsd": by_usd, "budgetUsd": budget_usd});
            w.resolve(seq, ToolResult::Success { output }, Some(snap));
            w.raise = Some(Raise {
                by_usd,
                run_id: w.run.run_id.clone(),
                cta_id,
                responder: responder.map(str::to_owned),
                at: w.now,
            });
            w.push(EntryBody::Notice {
                code: "budget_raised".into(),
                message: format!(
                    "budget raised by ${by_usd:.4} to ${budget_usd:.4}{}",
                    responder.map_or(String::new(), |r| format!(" by {r}"))
                ),
            });
            w.after_resolution()
        }
        _ => {
            let why = match response {
                CtaResponse::Approval {
                    reason: Some(r), ..
                } if !r.trim().is_empty() => format!(": {r}"),
                _ => String::new(),
            };
            let message = format!(
                "the run's budget of ${:.4} is spent (${:.4}) and more was refused{why}",
                ask.budget_usd, ask.spent_usd
            );
            w.resolve(seq, ToolResult::error(message.clone()), Some(snap));
            w.end(RunStatus::Failed, EXHAUSTED, &message);
            Next::Commit
        }
    }
}

/// The budget question at `seq` expired unanswered: the run ends `failed`, whatever its
/// `onExpiry` (no one agreed to spend more).
pub(super) fn expired(w: &mut Work, seq: u64, mut snap: CtaSnapshot) -> Next {
    let cta_id = snap.cta_id.clone();
    let message = format!(
        "the run's budget is spent and no one answered whether it may spend more before {}",
        snap.expires_at.to_rfc3339()
    );
    snap.status = CtaStatus::Expired;
    w.resolve(seq, ToolResult::error(message.clone()), Some(snap));
    w.tell_parent_resumed(&cta_id);
    w.effects.push(Effect::Unschedule { cta_id });
    w.end(RunStatus::Failed, EXHAUSTED, &message);
    Next::Commit
}
