//! How a plan is made and checked: the planner, drafts a human approves, the reviewer,
//! the depth of plans within plans.

use super::*;

#[test]
fn a_prompt_is_planned_by_the_planner_then_run() {
    let mut s = sim();
    s.script(
        "orchestrator",
        vec![plan_call(json!({"prompt": "look into cats"})), text("ok")],
    );
    s.script(
        "planner",
        vec![text(
            "```json\n{\"steps\": [{\"id\": \"look\", \"agent\": \"alpha\", \"prompt\": \"cats\"}]}\n```",
        )],
    );
    s.script("alpha", vec![text("cats found")]);
    let id = start(&mut s);
    let planner = state(&s, &id).helper.expect("the planner works");
    assert_eq!(s.run(&planner).agent, "planner");
    assert_eq!(first_prompt(&s, &planner), "Objective: look into cats");
    s.run_all();
    assert_eq!(output(&s, &id)["steps"][0]["outputs"], "cats found");
    assert!(s.runs[&planner].1.iter().any(|e| matches!(
        &e.body,
        EntryBody::Assistant { operation, .. } if *operation == Operation::Plan
    )));
    assert_eq!(s.events("plan.created").len(), 1);
}

#[test]
fn a_planner_that_fails_validation_twice_fails_the_call_with_the_error() {
    let mut s = sim();
    s.script(
        "orchestrator",
        vec![
            plan_call(json!({"prompt": "look into cats"})),
            text("gave up"),
        ],
    );
    s.script(
        "planner",
        vec![text("Let me think about cats."), text("{\"steps\": []}")],
    );
    let id = start(&mut s);
    let planner = state(&s, &id).helper.unwrap();
    s.run_all();
    let err = error(&s, &id);
    assert!(
        err.contains("no valid plan in 2 tries") && err.contains("at least one step"),
        "{err}"
    );
    // It was told what was wrong with its first reply, in its own conversation.
    let retry = s.runs[&planner]
        .1
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::User { text, .. } => Some(text.clone()),
            _ => None,
        })
        .nth(1)
        .expect("a second turn");
    assert!(
        retry.starts_with("That plan is not valid: the reply is not JSON"),
        "{retry}"
    );
    assert_eq!(s.run(&planner).counters.thinks, 2);
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert!(s.events("plan.created").is_empty());
}

#[test]
fn recursion_is_refused_past_the_plan_depth() {
    let mut limits = Limits::default();
    limits.plan.max_depth = 1;
    let mut s = sim_with(limits);
    s.script(
        "orchestrator",
        vec![
            plan_call(json!({"plan": [{"id": "l", "agent": "lead", "prompt": "go"}]})),
            text("ok"),
        ],
    );
    s.script(
        "lead",
        vec![
            plan_call(json!({"plan": [{"id": "x", "agent": "alpha", "prompt": "p"}]})),
            text("lead gave up"),
        ],
    );
    let id = start(&mut s);
    s.run_all();
    let lead = child_of(&s, &id, "l");
    assert!(
        error(&s, &lead).contains("may nest at most 1 deep"),
        "{}",
        error(&s, &lead)
    );
    assert_eq!(output(&s, &id)["steps"][0]["outputs"], "lead gave up");
    assert_eq!(s.runs.len(), 2, "no grandchild was started");
    let refused = s.events("run.refused");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].detail["tool"], "agent_orchestrate");
    assert_eq!(refused[0].detail["maxDepth"], 1);
}

#[test]
fn a_draft_plan_waits_for_a_humans_approval_then_runs() {
    let mut s = sim();
    let plan = json!([{"id": "x", "agent": "alpha", "prompt": "p"}]);
    s.script(
        "orchestrator",
        vec![
            plan_call(
                json!({"plan": plan, "execution_mode": "draft_only", "approval": "question"}),
            ),
            text("ran"),
        ],
    );
    s.script("alpha", vec![text("X")]);
    let id = start(&mut s);
    assert_eq!(s.runs.len(), 1, "nothing runs before the approval");
    assert_eq!(s.run(&id).outcome.state.as_deref(), Some("waiting_on_user"));
    let cta = s.pending_ctas(&id).pop().expect("an approval CTA");
    let gated = cta.gated.clone().expect("it shows the plan");
    assert_eq!(gated.tool, "agent_orchestrate");
    assert_eq!(gated.input["plan"]["steps"][0]["id"], "x");
    assert!(
        !cta.gate,
        "the reply's other calls do not wait for a plan's review"
    );
    assert!(
        matches!(&cta.request, CtaRequest::Approval { message } if message.contains("`x` (alpha)"))
    );
    let ready = s.events("plan.ready_for_review");
    assert_eq!(ready[0].detail["ctaId"], cta.cta_id);
    s.answer(&cta.cta_id, CtaResponse::approval(true));
    s.run_all();
    assert_eq!(output(&s, &id)["steps"][0]["outputs"], "X");
    let snap = s.tools(&id)[0].cta.clone().unwrap();
    assert_eq!(snap.status, CtaStatus::Answered);
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_rejected_draft_gives_the_model_the_reason_and_runs_nothing() {
    let mut s = sim();
    // The seed's legacy flag: `auto_execute: false` drafts.
    let plan = json!([{"id": "x", "agent": "alpha", "prompt": "p"}]);
    s.script(
        "orchestrator",
        vec![
            plan_call(json!({"plan": plan, "auto_execute": false, "approval": "question"})),
            text("ok, not running it"),
        ],
    );
    let id = start(&mut s);
    let cta = s.pending_ctas(&id).pop().expect("an approval CTA");
    s.answer(
        &cta.cta_id,
        CtaResponse::Approval {
            raise_usd: None,
            approved: false,
            reason: Some("too risky".into()),
        },
    );
    s.run_all();
    assert_eq!(
        error(&s, &id),
        "a human rejected this plan, so it did not run: too risky"
    );
    assert_eq!(s.runs.len(), 1);
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_reviewer_approves_a_plan_or_sends_its_notes_back() {
    for (verdict, runs) in [
        ("{\"approved\": true, \"notes\": \"fine\"}", true),
        (
            "{\"approved\": false, \"notes\": \"add a test step\"}",
            false,
        ),
        ("sure, go ahead", false),
    ] {
        let mut s = sim();
        let plan = json!([{"id": "x", "agent": "alpha", "prompt": "p"}]);
        s.script(
            "orchestrator",
            vec![
                plan_call(json!({"plan": plan, "execution_mode": "agent_review"})),
                text("ok"),
            ],
        );
        s.script("plan_reviewer", vec![text(verdict)]);
        s.script("alpha", vec![text("X")]);
        let id = start(&mut s);
        let reviewer = state(&s, &id).helper.expect("the reviewer reads it");
        assert!(first_prompt(&s, &reviewer).contains("\"agent\": \"alpha\""));
        s.run_all();
        let reviewed = s.events("plan.reviewed");
        assert_eq!(reviewed[0].detail["approved"], runs, "{verdict}");
        if runs {
            assert_eq!(output(&s, &id)["steps"][0]["outputs"], "X");
        } else {
            let err = error(&s, &id);
            assert!(
                err.starts_with("the reviewer did not approve the plan"),
                "{err}"
            );
            if verdict.contains("notes") {
                assert!(err.contains("add a test step"), "{err}");
            }
            assert_eq!(s.runs.len(), 2, "only the reviewer ran");
        }
        assert!(s.runs[&reviewer].1.iter().any(|e| matches!(
            &e.body,
            EntryBody::Assistant { operation, .. } if *operation == Operation::Review
        )));
    }
}

#[test]
fn an_approval_policy_on_agent_orchestrate_drafts_the_plans_it_matches() {
    for (agent, drafted) in [("alpha", false), ("code", true)] {
        let mut s = sim();
        let plan = json!([{"id": "x", "agent": agent, "prompt": "p"}]);
        s.script("careful_lead", vec![plan_call(json!({"plan": plan}))]);
        let id = s.create("careful_lead", "go");
        let first = s.queue.pop_front().unwrap();
        s.deliver(&first);
        assert_eq!(s.pending_ctas(&id).len(), usize::from(drafted), "{agent}");
        assert_eq!(s.runs.len(), if drafted { 1 } else { 2 }, "{agent}");
    }
}

#[test]
fn requested_outputs_and_priority_entities_reach_the_planner() {
    let mut s = sim();
    s.script(
        "orchestrator",
        vec![
            plan_call(json!({"prompt": "audit billing",
                "requested_outputs": ["findings", "fix"],
                "priority_entities": ["invoices", "refunds"]})),
            text("ok"),
        ],
    );
    let id = start(&mut s);
    let planner = state(&s, &id).helper.expect("the planner works");
    let prompt = first_prompt(&s, &planner);
    assert!(prompt.starts_with("Objective: audit billing"), "{prompt}");
    assert!(
        prompt.contains("The plan must produce (a step's result_key for each): findings, fix"),
        "{prompt}"
    );
    assert!(
        prompt.contains("Attend to these first: invoices, refunds"),
        "{prompt}"
    );
}
