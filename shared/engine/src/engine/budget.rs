//! Budgets ([`crate::budget`]): before a think, a run whose tree has spent its budget does
//! not call the model. The tree asks its owner once, on its top-level run; its other runs
//! that find the budget spent wait for that question (`BudgetSpent` tells the top-level run,
//! `BudgetRaised` wakes them). The answer raises the budget by the raise and what the tree
//! spent past it (every waiting run thinks on), or ends the tree `failed`,
//! `budget_exhausted`, as its expiry does.

use serde_json::json;

use super::ask::Ask;
use super::{Io, Next, Step, Work, derive_id};
use crate::agent::AgentDef;
use crate::budget::{Budget, BudgetAsk, ENTRY, EXHAUSTED, MAX_USD, MIN_USD, Raise};
use crate::cta::{CtaRequest, CtaResponse, CtaStatus};
use crate::message::{Effect, Input};
use crate::run::RunStatus;
use crate::timeline::{CtaSnapshot, EntryBody, ToolEntry, ToolResult};

impl Work<'_> {
    /// Before the think: with its tree's budget spent, the run does not call the model. A
    /// top-level run asks its owner (an approval on an entry of its own, which the model
    /// never sees) and waits; a run under one waits for the tree's one question, which its
    /// top-level run asks ([`spent`]). `Some` when the step must read the tree's ledger
    /// first, or has asked or parked (then `Some(None)`: commit).
    pub(super) fn check_budget(&mut self, agent: &AgentDef, io: &Io) -> Option<Option<Step>> {
        let budget = self.run.origin.budget?;
        let Some(ledger) = &io.budget else {
            return Some(Some(Step::ReadBudget));
        };
        // A raise this step took counts already: it commits with the think.
        let budget_usd = ledger.budget_usd + self.raise.as_ref().map_or(0.0, |r| r.by_usd);
        if ledger.spent_usd < budget_usd {
            return None;
        }
        if self.run.root() != self.run.run_id {
            // One question for the tree, however many of its runs find it spent at once:
            // its top-level run asks, and this one waits to be told of the raise.
            self.run.waits.budget_parked = true;
            self.run.status = RunStatus::Waiting;
            let (root, me) = (self.run.root().to_owned(), self.run.run_id.clone());
            self.send(
                &root,
                &format!("budget:{me}"),
                Input::BudgetSpent { run_id: me },
            );
            return Some(None);
        }
        self.ask_budget(agent, budget, ledger.spent_usd, budget_usd);
        Some(None)
    }

    /// The tree's budget question pending on this (top-level) run, if one is.
    fn budget_question(&self) -> Option<u64> {
        self.pending_where(|t| {
            t.name == ENTRY
                && t.cta
                    .as_ref()
                    .is_some_and(|c| c.status == CtaStatus::Pending)
        })
    }

    /// Asks the owner whether the tree (which spent `spent_usd` of `budget_usd`) may spend
    /// more, on an entry of this run's; the run waits.
    fn ask_budget(&mut self, agent: &AgentDef, budget: Budget, spent_usd: f64, budget_usd: f64) {
        let ask = BudgetAsk {
            spent_usd,
            budget_usd,
            ask_usd: budget.budget_usd,
        };
        let seq = self.run.next_seq;
        let id = derive_id("budget", &self.run.run_id, seq);
        self.push(EntryBody::Tool(ToolEntry::new(
            id.clone(),
            ENTRY,
            json!(ask),
            ToolResult::pending("asking"),
            self.batch_start.saturating_sub(1),
        )));
        let message = format!(
            "This run has spent ${:.4} of its ${:.4} budget (with its subagents). Allow it to \
             spend ${:.4} more, beyond what it has spent?",
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
    }
}

/// `BudgetSpent`, on the tree's top-level run: `run_id` found the budget spent and waits.
/// The budget read again, it is told at once if it was raised meanwhile; else it is
/// listed to be told, and the owner is asked — unless the tree's question is pending
/// already: a tree has one at a time, whatever number of its runs wait on it.
pub(super) fn spent(w: &mut Work, run_id: &str) -> Next {
    let Some(budget) = w.run.origin.budget.filter(|_| !w.run.status.is_terminal()) else {
        return Next::Now(Step::Ignore(format!(
            "{} has no budget to ask for, or has ended",
            w.run.run_id
        )));
    };
    let Some(ledger) = w.ledger.clone() else {
        return Next::Now(Step::ReadBudget);
    };
    if ledger.spent_usd < ledger.budget_usd {
        w.send(run_id, &format!("raised:{run_id}"), Input::BudgetRaised);
        return Next::Commit;
    }
    let known = w.run.waits.budget_waiters.iter().any(|r| r == run_id);
    let asked = w.budget_question().is_some();
    if known && asked {
        return Next::Now(Step::Ignore(format!(
            "{run_id} already waits on the tree's budget question"
        )));
    }
    if !known {
        w.run.waits.budget_waiters.push(run_id.to_owned());
    }
    if !asked {
        let Some(agent) = w.book.agent(&w.run.agent).cloned() else {
            return Next::Now(Step::Ignore(format!("no agent `{}`", w.run.agent)));
        };
        w.ask_budget(&agent, budget, ledger.spent_usd, ledger.budget_usd);
    }
    Next::Commit
}

/// `BudgetRaised`, on a run that waits for its tree's budget: it thinks on (reading the
/// budget again first: others of the tree may have spent the raise meanwhile).
pub(super) fn raised(w: &mut Work) -> Next {
    if !w.run.waits.budget_parked || w.run.status.is_terminal() {
        return Next::Now(Step::Ignore("not waiting for its tree's budget".into()));
    }
    w.run.waits.budget_parked = false;
    w.after_resolution()
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
    w.effects.push(Effect::CancelTimer {
        timer_id: cta_id.clone(),
    });
    match response {
        CtaResponse::Approval {
            approved: true,
            raise_usd,
            ..
        } => {
            // The answer covers what the tree has spent past its budget by now (its runs'
            // calls under way when it asked, too) and the raise: one answer is enough.
            let Some(ledger) = w.ledger.clone() else {
                return Next::Now(Step::ReadBudget);
            };
            let over = (ledger.spent_usd - ledger.budget_usd).max(0.0);
            let raise = raise_usd.unwrap_or(ask.ask_usd);
            // The sum is bounded as each figure is: a tree's budget with its raises is at
            // most MAX_USD. An answer that would take it past raises it to that; a tree
            // there already and spent may spend no more.
            let room = MAX_USD - ledger.budget_usd;
            if room < MIN_USD {
                let message = format!(
                    "the run's budget of ${:.4} is spent (${:.4}) and is already the most a \
                     budget may be (${MAX_USD}): it cannot be raised",
                    ledger.budget_usd, ledger.spent_usd
                );
                w.resolve(seq, ToolResult::error(message.clone()), Some(snap));
                w.end(RunStatus::Failed, EXHAUSTED, &message);
                return Next::Commit;
            }
            let by_usd = (raise + over).min(room);
            let budget_usd = ledger.budget_usd + by_usd;
            let output = json!({"approved": true, "raisedUsd": by_usd, "budgetUsd": budget_usd});
            w.resolve(seq, ToolResult::Success { output }, Some(snap));
            // The tree's runs that waited on this question think on.
            for r in std::mem::take(&mut w.run.waits.budget_waiters) {
                w.send(&r, &format!("raised:{r}"), Input::BudgetRaised);
            }
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
                    "budget raised by ${by_usd:.4}{} to ${budget_usd:.4}{}",
                    if by_usd < raise + over {
                        format!(" (the most a budget may be, ${MAX_USD})")
                    } else if over > 0.0 {
                        format!(" (${raise:.4} and the ${over:.4} spent past it)")
                    } else {
                        String::new()
                    },
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
    w.effects.push(Effect::CancelTimer { timer_id: cta_id });
    w.end(RunStatus::Failed, EXHAUSTED, &message);
    Next::Commit
}
