//! Budgets: a run tree that has spent its budget asks its owner before its next think; the
//! answer raises the budget or ends the run.

use super::*;
use baton_core::budget::{Budget, ENTRY, EXHAUSTED, Ledger};

/// A top-level run of `agent` whose tree may spend `usd` (its ledger created with it, as
/// the stores do).
fn budgeted(s: &mut Sim, agent: &str, usd: f64) -> String {
    let id = s.create(agent, "go");
    let b = Budget { budget_usd: usd };
    s.runs.get_mut(&id).unwrap().0.budget = Some(b);
    s.ledgers.insert(id.clone(), Ledger::new(b));
    id
}

fn echo(text: &str) -> LlmReply {
    calls(vec![call("echo", json!({ "text": text }))])
}

/// What one `calls` reply costs (10 in, 2 out, gpt-4o-mini).
const CALLS_USD: f64 = (10.0 * 0.15 + 2.0 * 0.60) / 1e6;

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

fn approve(raise_usd: Option<f64>) -> CtaResponse {
    CtaResponse::Approval {
        approved: true,
        reason: None,
        raise_usd,
    }
}

#[test]
fn a_run_that_spent_its_budget_asks_before_thinking_and_thinks_on_when_raised() {
    let mut s = Sim::new();
    s.script("worker", vec![echo("a"), echo("b"), text("done")]);
    let id = budgeted(&mut s, "worker", 5e-6);
    s.run_all();
    // Two thinks spent 5.4e-6 of 5e-6: the third is not made; the owner is asked.
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Waiting);
    assert_eq!(run.counters.thinks, 2);
    let ctas = s.pending_ctas(&id);
    assert_eq!(ctas.len(), 1);
    let ask = ctas[0].budget.expect("a budget question");
    assert!(near(ask.spent_usd, 2.0 * CALLS_USD));
    assert!(near(ask.budget_usd, 5e-6));
    assert!(near(ask.ask_usd, 5e-6), "another step of the budget");
    assert_eq!(ctas[0].request.kind(), "approval");
    let event = s.events("cta.request").last().unwrap().clone();
    assert!(near(
        event.detail["budget"]["askUsd"].as_f64().unwrap(),
        5e-6
    ));
    assert_eq!(
        s.events("run.state").last().unwrap().detail["state"],
        "waiting_on_user"
    );
    // Approved, the budget is raised by the ask in the commit that takes the answer, and
    // the run thinks on to its answer.
    s.answer(&ctas[0].cta_id, approve(None));
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.result.as_deref(), Some("done"));
    let ledger = &s.ledgers[&id];
    assert!(near(ledger.budget_usd, 1e-5));
    assert_eq!(ledger.raises.len(), 1);
    assert!(near(ledger.raises[0].by_usd, 5e-6));
    assert_eq!(ledger.raises[0].cta_id, ctas[0].cta_id);
    assert!(near(ledger.spent_usd, run.spend.cost_usd));
    let timeline = &s.runs[&id].1;
    assert!(
        timeline
            .iter()
            .any(|e| matches!(&e.body, EntryBody::Notice { code, .. } if code == "budget_raised"))
    );
    // The question is the owner's: the model never sees it among its calls.
    let chat = baton_core::llm::project("", timeline);
    let seen = serde_json::to_string(&chat).unwrap();
    assert!(
        timeline
            .iter()
            .any(|e| e.tool().is_some_and(|t| t.name == ENTRY))
    );
    assert!(!seen.contains(ENTRY), "{seen}");
}

#[test]
fn a_refused_or_unanswered_budget_question_ends_the_run_failed() {
    for refuse in [true, false] {
        let mut s = Sim::new();
        // Two replies only: a third think would find no reply and panic.
        s.script("worker", vec![echo("a"), echo("b")]);
        let id = budgeted(&mut s, "worker", 1e-6);
        // Past its budget after one think, whatever it does at expiry otherwise.
        s.runs.get_mut(&id).unwrap().0.on_expiry = ExpiryPolicy::Continue;
        s.run_all();
        assert_eq!(s.run(&id).counters.thinks, 1);
        let cta = s.pending_ctas(&id)[0].cta_id.clone();
        if refuse {
            s.answer(
                &cta,
                CtaResponse::Approval {
                    approved: false,
                    reason: Some("enough".into()),
                    raise_usd: None,
                },
            );
            s.run_all();
        } else {
            s.send(&id, Input::CtaExpired { cta_id: cta });
        }
        let run = s.run(&id);
        assert_eq!(run.status, RunStatus::Failed);
        let error = run.error.as_ref().unwrap();
        assert_eq!(error.code, EXHAUSTED);
        if refuse {
            assert!(error.message.contains("enough"), "{}", error.message);
        }
        assert_eq!(run.counters.thinks, 1);
        assert!(s.ledgers[&id].raises.is_empty());
    }
}

#[test]
fn a_subagent_counts_toward_its_root_at_once_and_asks_itself() {
    let mut s = Sim::new();
    s.script(
        "deep",
        vec![calls(vec![spawn("worker", "work")]), text("all done")],
    );
    s.script("worker", vec![echo("a"), echo("b"), text("worked")]);
    let id = budgeted(&mut s, "deep", 6e-6);
    s.run_all();
    // The parent's think and the child's two spent 8.1e-6: the child asks before its third.
    let kid = s.children(&id)[0].clone();
    assert_eq!(s.run(&kid).budget, Some(Budget { budget_usd: 6e-6 }));
    assert_eq!(s.run(&kid).status, RunStatus::Waiting);
    assert_eq!(s.run(&kid).counters.thinks, 2);
    let cta = s.pending_ctas(&kid)[0].clone();
    assert!(near(cta.budget.unwrap().spent_usd, 3.0 * CALLS_USD));
    assert_eq!(cta.root_run_id.as_deref(), Some(id.as_str()));
    // Its parent (and so the inbox of its tree) knows the question waits.
    assert!(
        s.run(&id)
            .waiting_ctas
            .iter()
            .any(|w| w.cta_id == cta.cta_id)
    );
    // An answer may raise by an amount of its own.
    s.answer(&cta.cta_id, approve(Some(1e-5)));
    s.run_all();
    assert_eq!(s.run(&kid).status, RunStatus::Completed);
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    let ledger = &s.ledgers[&id];
    assert!(near(ledger.budget_usd, 1.6e-5));
    assert_eq!(ledger.raises[0].run_id, kid);
    assert!(near(
        ledger.spent_usd,
        s.run(&id).spend.cost_usd + s.run(&kid).spend.cost_usd
    ));
    assert!(s.run(&id).waiting_ctas.is_empty());
}

#[test]
fn a_raise_must_be_an_approval_of_a_positive_amount() {
    let request = CtaRequest::Approval {
        message: "more?".into(),
    };
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(approve(Some(bad)).validate_against(&request).is_err());
    }
    let refused_with_amount = CtaResponse::Approval {
        approved: false,
        reason: None,
        raise_usd: Some(1.0),
    };
    assert!(refused_with_amount.validate_against(&request).is_err());
    assert!(approve(Some(0.5)).validate_against(&request).is_ok());
}

#[test]
fn an_unbudgeted_run_never_reads_a_ledger() {
    let mut s = Sim::new();
    s.script("worker", vec![echo("a"), text("done")]);
    let id = s.create("worker", "go");
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert!(s.ledgers.is_empty());
}

#[test]
fn a_refused_subagent_question_ends_the_whole_tree() {
    let mut s = Sim::new();
    s.script(
        "deep",
        vec![calls(vec![
            spawn("worker", "work"),
            spawn("worker", "more"),
        ])],
    );
    s.script("worker", vec![echo("a"), echo("b")]);
    // The parent's think spends the budget: both subagents ask before their first.
    let id = budgeted(&mut s, "deep", 1e-6);
    s.run_all();
    let kids = s.children(&id);
    assert_eq!(kids.len(), 2);
    let asked = s.pending_ctas(&kids[0])[0].cta_id.clone();
    assert_eq!(s.pending_ctas(&kids[1]).len(), 1);
    s.answer(
        &asked,
        CtaResponse::Approval {
            approved: false,
            reason: None,
            raise_usd: None,
        },
    );
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error.as_ref().unwrap().code, EXHAUSTED);
    // The other subagent is cancelled with its tree, and its question with it.
    assert_eq!(s.run(&kids[1]).status, RunStatus::Cancelled);
    assert!(s.pending_ctas(&kids[1]).is_empty());
    assert_eq!(s.run(&kids[0]).counters.thinks, 0);
    assert_eq!(s.run(&kids[1]).counters.thinks, 0);
}
