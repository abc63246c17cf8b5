//! Budgets: a run tree that has spent its budget asks its owner before its next think; the
//! answer raises the budget or ends the run.

use super::*;
use baton_engine::budget::{Budget, ENTRY, EXHAUSTED, Ledger, MAX_USD};

/// A top-level run of `agent` whose tree may spend `usd` (its ledger created with it, as
/// the stores do).
fn budgeted(s: &mut Sim, agent: &str, usd: f64) -> String {
    let id = s.create(agent, "go");
    let b = Budget { budget_usd: usd };
    s.runs.get_mut(&id).unwrap().0.origin.budget = Some(b);
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
    let mut s = sim();
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
    // Approved, the budget is raised in the commit that takes the answer — by the ask and
    // what the tree spent past its budget (0.4e-6), so that one answer is enough — and the
    // run thinks on to its answer.
    s.answer(&ctas[0].cta_id, approve(None));
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.outcome.result.as_deref(), Some("done"));
    let ledger = &s.ledgers[&id];
    let over = 2.0 * CALLS_USD - 5e-6;
    assert!(near(ledger.budget_usd, 1e-5 + over));
    assert_eq!(ledger.raises.len(), 1);
    assert!(near(ledger.raises[0].by_usd, 5e-6 + over));
    assert_eq!(ledger.raises[0].cta_id, ctas[0].cta_id);
    assert!(near(ledger.spent_usd, run.spend.cost_usd));
    let timeline = &s.runs[&id].1;
    assert!(
        timeline
            .iter()
            .any(|e| matches!(&e.body, EntryBody::Notice { code, .. } if code == "budget_raised"))
    );
    // The question is the owner's: the model never sees it among its calls.
    let chat = baton_engine::project::project("", timeline);
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
        let mut s = sim();
        // Two replies only: a third think would find no reply and panic.
        s.script("worker", vec![echo("a"), echo("b")]);
        let id = budgeted(&mut s, "worker", 1e-6);
        // Past its budget after one think, whatever it does at expiry otherwise.
        s.runs.get_mut(&id).unwrap().0.origin.on_expiry = ExpiryPolicy::Continue;
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
        let error = run.outcome.error.as_ref().unwrap();
        assert_eq!(error.code, EXHAUSTED);
        if refuse {
            assert!(error.message.contains("enough"), "{}", error.message);
        }
        assert_eq!(run.counters.thinks, 1);
        assert!(s.ledgers[&id].raises.is_empty());
    }
}

#[test]
fn a_subagent_counts_toward_its_root_at_once_and_its_root_asks() {
    let mut s = sim();
    s.script(
        "deep",
        vec![calls(vec![spawn("worker", "work")]), text("all done")],
    );
    s.script("worker", vec![echo("a"), echo("b"), text("worked")]);
    let id = budgeted(&mut s, "deep", 6e-6);
    s.run_all();
    // The parent's think and the child's two spent 8.1e-6: the child does not think a
    // third time; it waits, and the tree's top-level run asks its owner.
    let kid = s.children(&id)[0].clone();
    assert_eq!(s.run(&kid).origin.budget, Some(Budget { budget_usd: 6e-6 }));
    assert_eq!(s.run(&kid).status, RunStatus::Waiting);
    assert!(s.run(&kid).waits.budget_parked);
    assert_eq!(
        s.run(&kid).outcome.state.as_deref(),
        Some("waiting_on_user")
    );
    assert_eq!(s.run(&kid).counters.thinks, 2);
    assert!(
        s.pending_ctas(&kid).is_empty(),
        "the child asks nothing itself"
    );
    let cta = s.pending_ctas(&id)[0].clone();
    assert!(near(cta.budget.unwrap().spent_usd, 3.0 * CALLS_USD));
    assert_eq!(s.run(&id).waits.budget_waiters, vec![kid.clone()]);
    // An answer may raise by an amount of its own (with what was spent past the budget).
    s.answer(&cta.cta_id, approve(Some(1e-5)));
    s.run_all();
    assert_eq!(s.run(&kid).status, RunStatus::Completed);
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    let ledger = &s.ledgers[&id];
    assert!(near(ledger.budget_usd, 1e-5 + 3.0 * CALLS_USD));
    assert_eq!(ledger.raises[0].run_id, id);
    assert!(near(
        ledger.spent_usd,
        s.run(&id).spend.cost_usd + s.run(&kid).spend.cost_usd
    ));
    assert!(s.run(&id).waits.budget_waiters.is_empty());
}

/// The sum is bounded as each figure is: an answer that would take a tree's budget past a
/// million dollars raises it to a million, and a tree there already cannot be raised.
#[test]
fn a_trees_budget_with_its_raises_is_at_most_a_million_dollars() {
    let mut s = sim();
    s.script("worker", vec![echo("a"), text("done")]);
    let id = budgeted(&mut s, "worker", MAX_USD - 0.5);
    s.ledgers.get_mut(&id).unwrap().spent_usd = MAX_USD - 0.5;
    s.run_all();
    let cta = s.pending_ctas(&id)[0].cta_id.clone();
    s.answer(&cta, approve(Some(MAX_USD)));
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    let ledger = &s.ledgers[&id];
    assert_eq!(ledger.budget_usd, MAX_USD);
    assert!(near(ledger.raises[0].by_usd, 0.5));
    assert!(s.runs[&id].1.iter().any(|e| matches!(&e.body,
        EntryBody::Notice { code, message } if code == "budget_raised"
            && message.contains("the most a budget may be"))));

    let mut s = sim();
    s.script("worker", vec![echo("a")]);
    let id = budgeted(&mut s, "worker", MAX_USD);
    s.ledgers.get_mut(&id).unwrap().spent_usd = MAX_USD;
    s.run_all();
    let cta = s.pending_ctas(&id)[0].cta_id.clone();
    s.answer(&cta, approve(Some(1.0)));
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.outcome.error.as_ref().unwrap();
    assert_eq!(error.code, EXHAUSTED);
    assert!(
        error.message.contains("cannot be raised"),
        "{}",
        error.message
    );
    assert_eq!(s.ledgers[&id].budget_usd, MAX_USD);
    assert!(s.ledgers[&id].raises.is_empty());
}

#[test]
fn a_raise_must_be_an_approval_of_a_positive_amount() {
    let request = CtaRequest::Approval {
        message: "more?".into(),
    };
    for bad in [
        0.0,
        -1.0,
        1e-200,
        0.000_000_9,
        1_000_000.01,
        f64::NAN,
        f64::INFINITY,
    ] {
        assert!(
            approve(Some(bad)).validate_against(&request).is_err(),
            "{bad}"
        );
    }
    for good in [0.000_001, 1_000_000.0] {
        assert!(
            approve(Some(good)).validate_against(&request).is_ok(),
            "{good}"
        );
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
    let mut s = sim();
    s.script("worker", vec![echo("a"), text("done")]);
    let id = s.create("worker", "go");
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert!(s.ledgers.is_empty());
}

#[test]
fn a_tree_asks_once_however_many_runs_find_its_budget_spent() {
    let mut s = sim();
    s.script(
        "deep",
        vec![
            calls(vec![
                spawn("worker", "one"),
                spawn("worker", "two"),
                spawn("worker", "three"),
                spawn("worker", "four"),
            ]),
            text("all done"),
        ],
    );
    s.script("worker", vec![echo("a"), text("worked")]);
    // The parent's think spends the budget: all four subagents find it spent before their
    // first think, and one question is asked, on the top-level run.
    let id = budgeted(&mut s, "deep", 1e-6);
    s.run_all();
    let kids = s.children(&id);
    assert_eq!(kids.len(), 4);
    for k in &kids {
        assert!(s.run(k).waits.budget_parked, "{k} waits");
        assert!(s.pending_ctas(k).is_empty(), "{k} asks nothing");
        assert_eq!(s.run(k).counters.thinks, 0);
    }
    let ctas = s.pending_ctas(&id);
    assert_eq!(ctas.len(), 1, "one question for the tree");
    let mut waiters = s.run(&id).waits.budget_waiters.clone();
    waiters.sort();
    let mut sorted = kids.clone();
    sorted.sort();
    assert_eq!(waiters, sorted);
    // A run's message delivered again (or a late one) adds no question.
    let version = s.run(&id).version;
    s.send(
        &id,
        Input::BudgetSpent {
            run_id: kids[0].clone(),
        },
    );
    assert_eq!(s.pending_ctas(&id).len(), 1);
    assert_eq!(s.run(&id).waits.budget_waiters.len(), 4);
    assert_eq!(s.run(&id).version, version, "nothing committed");
    assert_eq!(s.events("cta.request").len(), 1);
    // One approval of the ask ($1e-6) covers the $0.7e-6 spent past the budget too: the
    // four think on, and the tree asks again only once they have spent the raise.
    s.answer(&ctas[0].cta_id, approve(Some(1e-4)));
    s.run_all();
    assert_eq!(
        s.run(&id).status,
        RunStatus::Completed,
        "{:?}",
        s.run(&id).outcome.error
    );
    for k in &kids {
        assert_eq!(s.run(k).status, RunStatus::Completed);
    }
    assert_eq!(s.events("cta.request").len(), 1, "asked once");
    assert_eq!(s.ledgers[&id].raises.len(), 1);
    // A raise told to a run that no longer waits changes nothing.
    let version = s.run(&kids[0]).version;
    s.send(&kids[0], Input::BudgetRaised);
    assert_eq!(s.run(&kids[0]).version, version);
}

#[test]
fn a_refused_subagent_question_ends_the_whole_tree() {
    let mut s = sim();
    s.script(
        "deep",
        vec![calls(vec![
            spawn("worker", "work"),
            spawn("worker", "more"),
        ])],
    );
    s.script("worker", vec![echo("a"), echo("b")]);
    // The parent's think spends the budget: both subagents wait before their first, and
    // the top-level run asks.
    let id = budgeted(&mut s, "deep", 1e-6);
    s.run_all();
    let kids = s.children(&id);
    assert_eq!(kids.len(), 2);
    let asked = s.pending_ctas(&id)[0].cta_id.clone();
    s.answer(&asked, CtaResponse::approval(false));
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.outcome.error.as_ref().unwrap().code, EXHAUSTED);
    // The subagents are cancelled with their tree.
    assert_eq!(s.run(&kids[0]).status, RunStatus::Cancelled);
    assert_eq!(s.run(&kids[1]).status, RunStatus::Cancelled);
    assert_eq!(s.run(&kids[0]).counters.thinks, 0);
    assert_eq!(s.run(&kids[1]).counters.thinks, 0);
}
