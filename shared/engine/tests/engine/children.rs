//! Subagents: fan-out and fan-in, depth and width, continuing one, their questions.

use super::*;

#[test]
fn fan_in_waits_for_every_subagent_and_cta_of_the_batch() {
    let mut s = sim();
    s.script(
        "orchestrator",
        vec![
            calls(vec![
                spawn("explore", "map the repo"),
                spawn("code", "fix it"),
                call(
                    "request_human_feedback",
                    json!({"kind": "text", "prompt": "Why?"}),
                ),
            ]),
            text("all done"),
        ],
    );
    s.script("explore", vec![text("mapped")]);
    s.script("code", vec![text("fixed")]);
    let id = s.create("orchestrator", "go");
    // Given the orchestrator's first step dispatched all three calls,
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    assert_eq!(s.run(&id).status, RunStatus::Waiting);
    assert_eq!(
        s.events("run.state").last().unwrap().detail["state"],
        "waiting_on_user"
    );
    let kids = s.children(&id);
    assert_eq!(kids.len(), 2);
    assert_eq!(s.run(&kids[0]).origin.parent.as_ref().unwrap().run_id, id);
    assert_eq!(s.run(&kids[0]).origin.depth, 1);
    // when both children finish, the run still waits for the human,
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Waiting);
    assert_eq!(s.run(&id).counters.thinks, 1);
    let tools = s.tools(&id);
    assert_eq!(
        tools[0].result,
        ToolResult::Success {
            output: json!({
        "subagentId": kids[0], "text": "mapped", "stepCount": 1,
        "totalUsage": {"inputTokens": 5, "outputTokens": 1, "totalTokens": 6}})
        }
    );
    assert!(
        matches!(&tools[1].result, ToolResult::Success { output } if output["text"] == "fixed")
    );
    assert_eq!(
        s.events("run.state").last().unwrap().detail["state"],
        "waiting_on_user"
    );
    // and only when the human answers does it think again.
    let cta = s.pending_ctas(&id)[0].cta_id.clone();
    s.answer(
        &cta,
        CtaResponse::Text {
            text: "because".into(),
        },
    );
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.run(&id).counters.thinks, 2);
}

#[test]
fn at_most_four_children_run_at_once_and_the_rest_wait_their_turn() {
    let mut s = sim();
    let six: Vec<ToolCall> = (0..6)
        .map(|i| spawn("explore", &format!("part {i}")))
        .collect();
    s.script("orchestrator", vec![calls(six), text("merged")]);
    s.script("explore", vec![text("part done")]);
    let id = s.create("orchestrator", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    let tools = s.tools(&id);
    assert_eq!(tools.iter().filter(|t| t.child_run_id.is_some()).count(), 4);
    assert!(
        tools[4..]
            .iter()
            .all(|t| matches!(&t.result, ToolResult::Pending { reason } if reason == "queued"))
    );
    // When the first child finishes, the fifth starts.
    let first_child = s.children(&id)[0].clone();
    while let Some(m) = s.queue.pop_front() {
        let is_first = m.run_id == first_child
            || (m.run_id == id
                && matches!(&m.input, Input::ChildFinished { child_run_id, .. } if *child_run_id == first_child));
        if is_first {
            s.deliver(&m);
        } else {
            s.queue.push_back(m);
            if s.queue.iter().all(|m| m.run_id != first_child && !matches!(&m.input, Input::ChildFinished { child_run_id, .. } if *child_run_id == first_child)) {
                break;
            }
        }
    }
    assert_eq!(
        s.tools(&id)
            .iter()
            .filter(|t| t.child_run_id.is_some())
            .count(),
        5
    );
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.children(&id).len(), 6);
    assert!(
        s.tools(&id)
            .iter()
            .all(|t| matches!(t.result, ToolResult::Success { .. }))
    );
}

#[test]
fn subagents_nest_at_most_three_deep() {
    let mut s = sim();
    s.script(
        "deep",
        vec![calls(vec![spawn("deep", "deeper")]), text("bottom")],
    );
    let id = s.create("deep", "go");
    s.run_all();
    // depth 0 → 1 → 2 → 3; the run at depth 3 gets an error and answers.
    let mut depth = 0;
    let mut cur = id.clone();
    while let Some(child) = s.children(&cur).first().cloned() {
        depth += 1;
        cur = child;
    }
    assert_eq!(depth, 3);
    assert_eq!(s.run(&cur).origin.depth, 3);
    assert!(
        matches!(&s.tools(&cur)[0].result, ToolResult::Error { error } if error.contains("at most 3 deep"))
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    // The refusal is counted: an event on the bus, which the metrics read.
    let refused = s.events("run.refused");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].detail["guardrail"], "depth");
    assert_eq!(refused[0].detail["tool"], "spawn_subagent");
    assert_eq!(refused[0].detail["runId"], cur.as_str());
}

#[test]
fn a_failed_child_is_an_error_result_for_its_parent() {
    let mut s = sim();
    s.script(
        "orchestrator",
        vec![calls(vec![spawn("explore", "x")]), text("recovered")],
    );
    let id = s.create("orchestrator", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    let child = s.children(&id)[0].clone();
    s.queue.clear();
    s.send(
        &child,
        Input::Fail {
            code: "model_error".into(),
            message: "the model is down".into(),
        },
    );
    assert_eq!(s.run(&child).status, RunStatus::Failed);
    assert!(
        matches!(&before_usage(&s.runs[&child].1).body, EntryBody::Error { code, .. } if code == "model_error")
    );
    assert_eq!(s.events("run.failed").len(), 1);
    s.run_all();
    assert!(
        matches!(&s.tools(&id)[0].result, ToolResult::Error { error } if error.contains("failed") && error.contains("the model is down"))
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_parent_can_continue_its_finished_subagent_by_id() {
    let mut s = sim();
    // The child's id is derived from the parent and the seq of the spawning call (2).
    let child = derive_id("sub", "run_top0", 2);
    s.script("explore", vec![text("first look"), text("second look")]);
    s.script(
        "orchestrator",
        vec![
            calls(vec![spawn("explore", "look")]),
            calls(vec![call(
                "spawn_subagent",
                json!({"subagentId": child, "prompt": "look again"}),
            )]),
            text("done"),
        ],
    );
    let id = s.create("orchestrator", "go");
    s.run_all();
    let tools = s.tools(&id);
    assert_eq!(s.children(&id), vec![child.clone(), child.clone()]);
    assert!(
        matches!(&tools[0].result, ToolResult::Success { output } if output["text"] == "first look")
    );
    assert!(
        matches!(&tools[1].result, ToolResult::Success { output } if output["text"] == "second look" && output["stepCount"] == 2)
    );
    assert_eq!(s.run(&child).counters.thinks, 2);
    assert_eq!(
        s.run(&child).origin.parent.as_ref().unwrap().tool_call_id,
        tools[1].id
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_run_cannot_continue_someone_elses_subagent() {
    let mut s = sim();
    s.script("explore", vec![text("mine")]);
    s.script(
        "orchestrator",
        vec![
            calls(vec![call(
                "spawn_subagent",
                json!({"subagentId": "run_top0", "prompt": "leak"}),
            )]),
            text("ok"),
        ],
    );
    let victim = s.create("explore", "secret");
    s.run_all();
    let id = s.create("orchestrator", "go");
    s.run_all();
    assert!(
        matches!(&s.tools(&id)[0].result, ToolResult::Error { error } if error.contains("no such subagent"))
    );
    assert_eq!(
        s.run(&victim).counters.thinks,
        1,
        "the other run did not take a turn"
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_parent_hears_when_a_subagent_at_any_depth_waits_for_a_human() {
    let mut s = sim();
    s.script(
        "deep",
        vec![calls(vec![spawn("mid", "delegate")]), text("done")],
    );
    s.script(
        "mid",
        vec![calls(vec![spawn("asker", "ask")]), text("relayed")],
    );
    s.script(
        "asker",
        vec![
            feedback(json!({"kind": "text", "prompt": "Which branch?"})),
            text("on main"),
        ],
    );
    let id = s.create("deep", "go");
    s.run_all();
    let mid = s.children(&id)[0].clone();
    let asker = s.children(&mid)[0].clone();
    let cta = s.pending_ctas(&asker)[0].clone();
    assert_eq!(
        cta.root_run_id.as_deref(),
        Some(id.as_str()),
        "the CTA knows its root"
    );
    for (run, child) in [(&id, &mid), (&mid, &asker)] {
        let r = s.run(run);
        assert_eq!(r.outcome.state.as_deref(), Some("waiting_on_subagents"));
        let detail = r.outcome.state_detail.clone().expect("details");
        assert_eq!(detail["subagents"], serde_json::json!([child]), "{detail}");
        assert_eq!(r.waits.waiting_ctas.len(), 1, "{run}");
        assert_eq!(r.waits.waiting_ctas[0].cta_id, cta.cta_id);
        assert_eq!(r.waits.waiting_ctas[0].run_id, asker);
        assert_eq!(&r.waits.waiting_ctas[0].child_run_id, child);
        let notice = s.runs[run.as_str()]
            .1
            .iter()
            .find_map(|e| match &e.body {
                EntryBody::Notice { code, message } if code == "subagent_waiting" => {
                    Some(message.clone())
                }
                _ => None,
            })
            .expect("a notice");
        assert!(
            notice.contains("Which branch?")
                && notice.contains(&cta.cta_id)
                && notice.contains(&asker),
            "{notice}"
        );
    }
    // A redelivered notice changes nothing.
    let again = StepMessage {
        run_id: id.clone(),
        id: "again".into(),
        input: Input::ChildWaiting {
            child_run_id: mid.clone(),
            asker_run_id: asker.clone(),
            cta_id: cta.cta_id.clone(),
            question: "Which branch?".into(),
        },
        owed: false,
    };
    assert_eq!(s.deliver(&again), Outcome::Ignored);
    s.answer(
        &cta.cta_id,
        CtaResponse::Text {
            text: "main".into(),
        },
    );
    s.run_all();
    assert!(s.run(&id).waits.waiting_ctas.is_empty());
    assert!(s.run(&mid).waits.waiting_ctas.is_empty());
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn an_orchestrator_may_let_a_built_in_subagent_ask_the_human() {
    let mut s = sim();
    let ask = |who: &str| {
        call(
            "spawn_subagent",
            json!({"agent": who, "prompt": "check with the human", "askHuman": true}),
        )
    };
    s.script(
        "orchestrator",
        vec![calls(vec![ask("explore")]), text("done")],
    );
    s.script(
        "explore",
        vec![
            feedback(json!({"kind": "approval", "message": "Read the logs?"})),
            text("read"),
        ],
    );
    // `deep` cannot grant what it does not have.
    s.script("deep", vec![calls(vec![ask("explore")]), text("alone")]);
    let id = s.create("orchestrator", "go");
    let refused = s.create("deep", "go");
    s.run_all();
    let explore = s.children(&id)[0].clone();
    assert_eq!(
        s.run(&explore).origin.granted,
        vec!["request_human_feedback"]
    );
    let cta = s.pending_ctas(&explore)[0].clone();
    assert_eq!(cta.request.question(), "Read the logs?");
    s.answer(&cta.cta_id, CtaResponse::approval(true));
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert!(s.children(&refused).is_empty());
    assert!(matches!(&s.tools(&refused)[0].result,
        ToolResult::Error { error } if error.contains("does not have itself")));
}
