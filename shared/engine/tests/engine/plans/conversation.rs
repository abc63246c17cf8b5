//! Draft plans a person answers in the conversation, and what a plan's review and phases
//! say to traces, metrics and UIs.

use super::*;
use baton_engine::cta::CtaStatus;

fn follow_up(text: &str, id: &str) -> Input {
    Input::UserMessage {
        text: text.into(),
        message_id: id.into(),
        reply_to: None,
        options: Default::default(),
    }
}

/// The `plan.phase` events of a run, as `from -> to`.
fn phases(s: &Sim) -> Vec<String> {
    s.events("plan.phase")
        .iter()
        .map(|e| {
            format!(
                "{} -> {}",
                e.detail["from"].as_str().unwrap_or("-"),
                e.detail["to"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

#[test]
fn a_draft_plan_is_confirmed_in_the_conversation_and_then_runs() {
    let mut s = sim();
    let plan = json!([{"id": "x", "agent": "alpha", "prompt": "p"}]);
    s.script(
        "orchestrator",
        vec![
            plan_call(
                json!({"plan": plan, "execution_mode": "draft_only", "approval": "question"}),
            ),
            plan_call(json!({"plan": plan, "execution_mode": "auto_execute"})),
            text("ran"),
        ],
    );
    s.script("alpha", vec![text("X")]);
    let id = start(&mut s);
    let cta = s
        .pending_ctas(&id)
        .pop()
        .expect("the draft's approval question");
    // The run waits on the draft alone: a follow-up would answer it (the API says so).
    assert_eq!(
        s.run(&id).outcome.state_detail.as_ref().unwrap()["draftPlans"],
        true
    );

    // Given the person writes instead of answering the question,
    assert_eq!(
        s.send(&id, follow_up("looks good, run it", "m1")),
        Outcome::Done
    );
    // the question is withdrawn (its record settled first),
    assert_eq!(s.settle_asked, vec![cta.cta_id.clone()]);
    assert_eq!(s.ctas[&cta.cta_id].status, CtaStatus::Cancelled);
    let draft = s.tools(&id)[0].clone();
    assert_eq!(draft.cta.as_ref().unwrap().status, CtaStatus::Cancelled);
    // the call gives the model the plan, held for review,
    let ToolResult::Success { output } = &draft.result else {
        panic!("{:?}", draft.result);
    };
    assert_eq!(output["status"], "held_for_review");
    assert_eq!(output["plan"]["steps"][0]["id"], "x");
    let review = draft.plan.as_ref().unwrap().review.clone().unwrap();
    assert_eq!(
        (review.by.as_str(), review.outcome.as_str()),
        ("conversation", "answered_in_conversation")
    );
    // and the follow-up is the next turn, not a message waiting behind the draft.
    let timeline = &s.runs[&id].1;
    assert!(timeline.iter().any(|e| matches!(&e.body,
        EntryBody::User { text, .. } if text == "looks good, run it")));
    assert!(
        !timeline
            .iter()
            .any(|e| matches!(e.body, EntryBody::Queued { .. }))
    );
    // The model runs the plan it drafted.
    s.run_all();
    let ran = s.tools(&id)[1].clone();
    let ToolResult::Success { output } = &ran.result else {
        panic!("{:?}", ran.result);
    };
    assert_eq!(output["steps"][0]["outputs"], "X");
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(
        phases(&s),
        [
            "- -> awaiting_approval",
            "awaiting_approval -> done",
            "- -> dispatching",
            "dispatching -> awaiting_results",
            "awaiting_results -> merging",
            "merging -> done"
        ]
    );
    let reviewed = s.events("plan.reviewed");
    assert_eq!(reviewed.len(), 1);
    assert_eq!(reviewed[0].detail["by"], "conversation");
}

#[test]
fn a_plan_held_by_policy_is_run_only_by_its_question_and_a_follow_up_waits() {
    let mut s = sim();
    let plan = json!([{"id": "x", "agent": "code", "prompt": "p"}]);
    s.script(
        "careful_lead",
        vec![plan_call(json!({"plan": plan})), text("done")],
    );
    s.script("code", vec![text("changed")]);
    let id = s.create("careful_lead", "go");
    s.run_all();
    let cta = s.pending_ctas(&id).pop().expect("the policy's question");
    assert!(state(&s, &id).held_by_policy);
    assert_eq!(s.send(&id, follow_up("just run it", "m1")), Outcome::Done);
    assert!(s.settle_asked.is_empty(), "the question is not withdrawn");
    assert_eq!(s.ctas[&cta.cta_id].status, CtaStatus::Pending);
    assert!(s.tools(&id)[0].result.is_pending());
    assert!(
        s.runs[&id]
            .1
            .iter()
            .any(|e| matches!(e.body, EntryBody::Queued { .. }))
    );
}

#[test]
fn an_answer_that_came_first_stands_and_the_follow_up_waits_behind_it() {
    let mut s = sim();
    let plan = json!([{"id": "x", "agent": "alpha", "prompt": "p"}]);
    s.script(
        "orchestrator",
        vec![
            plan_call(
                json!({"plan": plan, "execution_mode": "draft_only", "approval": "question"}),
            ),
            text("ran"),
            text("and again"),
        ],
    );
    s.script("alpha", vec![text("X")]);
    let id = start(&mut s);
    let cta = s.pending_ctas(&id).pop().unwrap();
    // Approved on the question (its record written), its message not yet taken up,
    s.answer(&cta.cta_id, CtaResponse::approval(true));
    // when the follow-up comes: the question's record says answered, so the draft waits
    // for its answer and the follow-up behind it.
    assert_eq!(s.send(&id, follow_up("run it", "m1")), Outcome::Done);
    assert_eq!(s.ctas[&cta.cta_id].status, CtaStatus::Answered);
    assert!(s.tools(&id)[0].result.is_pending());
    s.run_all();
    assert_eq!(output(&s, &id)["steps"][0]["outputs"], "X");
    let review = state(&s, &id).review.unwrap();
    assert_eq!(
        (review.by.as_str(), review.outcome.as_str()),
        ("human", "approved")
    );
    let (run, timeline) = &s.runs[&id];
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(
        run.outcome.result.as_deref(),
        Some("and again"),
        "the follow-up's turn came"
    );
    assert!(timeline.iter().any(|e| matches!(&e.body,
        EntryBody::User { text, .. } if text == "run it")));
}

#[test]
fn a_reviewed_plan_says_its_verdict_and_each_phase() {
    let mut s = sim();
    s.script(
        "orchestrator",
        vec![
            plan_call(json!({"prompt": "look", "execution_mode": "agent_review"})),
            text("ok"),
        ],
    );
    s.script(
        "planner",
        vec![text(
            "{\"steps\": [{\"id\": \"x\", \"agent\": \"alpha\", \"prompt\": \"p\"}]}",
        )],
    );
    s.script(
        "plan_reviewer",
        vec![text("{\"approved\": true, \"notes\": \"tight and safe\"}")],
    );
    s.script("alpha", vec![text("X")]);
    let id = start(&mut s);
    s.run_all();
    assert_eq!(output(&s, &id)["steps"][0]["outputs"], "X");
    let review = state(&s, &id).review.unwrap();
    assert_eq!(review.by, "agent");
    assert_eq!(review.outcome, "approved");
    assert_eq!(review.notes.as_deref(), Some("tight and safe"));
    assert!(review.reviewer_run_id.is_some());
    assert_eq!(
        phases(&s),
        [
            "- -> planning",
            "planning -> reviewing",
            "reviewing -> dispatching",
            "dispatching -> awaiting_results",
            "awaiting_results -> merging",
            "merging -> done"
        ]
    );
}

/// By default a draft is told to the model at once (seed 001): no question is asked, the
/// call's result is the plan, the turn ends with the model asking in its own words, and the
/// person's "run it" is the next turn, in which the model runs it. An agent may choose the
/// question instead (`planApproval`), and a call may too (`approval`).
#[test]
fn a_draft_is_told_to_the_model_and_confirmed_in_the_conversation_by_default() {
    let mut s = sim();
    let plan = json!([{"id": "x", "agent": "alpha", "prompt": "p"}]);
    s.script(
        "orchestrator",
        vec![
            plan_call(json!({"plan": plan, "execution_mode": "draft_only"})),
            text("I will have alpha look at p. Shall I run it?"),
            plan_call(json!({"plan": plan, "execution_mode": "auto_execute"})),
            text("Ran it."),
        ],
    );
    s.script("alpha", vec![text("X")]);
    let id = start(&mut s);
    s.run_all();
    assert!(s.pending_ctas(&id).is_empty(), "no question is asked");
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    let drafted = s.tools(&id)[0].clone();
    let ToolResult::Success { output } = &drafted.result else {
        panic!("{:?}", drafted.result);
    };
    assert_eq!(output["status"], "draft");
    assert_eq!(output["plan"]["steps"][0]["agent"], "alpha");
    assert!(output["note"].as_str().unwrap().contains("auto_execute"));
    assert_eq!(s.runs.len(), 1, "nothing ran");
    let ready = &s.events("plan.ready_for_review")[0].detail;
    assert_eq!(ready["in"], "conversation");
    s.send(&id, follow_up("run it", "m1"));
    s.run_all();
    assert_eq!(s.run(&id).outcome.result.as_deref(), Some("Ran it."));
    let ToolResult::Success { output } = &s.tools(&id)[1].result else {
        panic!("ran");
    };
    assert_eq!(output["steps"][0]["outputs"], "X");
    assert_eq!(
        phases(&s),
        [
            "- -> awaiting_approval",
            "awaiting_approval -> done",
            "- -> dispatching",
            "dispatching -> awaiting_results",
            "awaiting_results -> merging",
            "merging -> done"
        ]
    );
}
