//! The loop: a think, its tool calls, the next think; what a step reads and mints.

use super::*;

#[test]
fn a_final_answer_completes_the_run_with_usage_and_an_event() {
    let mut s = sim();
    s.script("explore", vec![text("found it")]);
    let id = s.create("explore", "look");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.outcome.result.as_deref(), Some("found it"));
    assert_eq!(run.spend.usage.total_tokens, 6);
    assert_eq!((run.counters.thinks, run.version), (1, 1));
    let done = s.events("run.completed");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].detail["text"], "found it");
}

#[test]
fn ordinary_tools_execute_within_the_step_and_the_run_thinks_again() {
    let mut s = sim();
    s.script(
        "worker",
        vec![
            LlmReply {
                text: Some("let me echo".into()),
                ..calls(vec![
                    call("echo", json!({"text": "hi"})),
                    call("echo", json!({"text": "yo"})),
                ])
            },
            text("done"),
        ],
    );
    let id = s.create("worker", "go");
    s.run_all();
    let tools = s.tools(&id);
    assert_eq!(tools.len(), 2);
    assert_eq!(
        tools[0].result,
        ToolResult::Success {
            output: json!("hi")
        }
    );
    assert_eq!(
        tools[1].result,
        ToolResult::Success {
            output: json!("yo")
        }
    );
    assert_eq!(
        tools[0].input,
        json!({"text": "hi"}),
        "input is the parsed object"
    );
    assert_eq!(s.executed, vec!["call_0_0", "call_0_1"]);
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.spend.usage.total_tokens, 18);
    let timeline = &s.runs[&id].1;
    assert!(
        matches!(&timeline[1].body, EntryBody::Assistant { text: Some(t), .. } if t == "let me echo")
    );
}

#[test]
fn bad_calls_become_error_results_the_model_sees() {
    // (name, arguments, expected error fragment)
    let table = [
        ("echo", "{not json".to_owned(), "not valid JSON"),
        (
            "echo",
            json!({"text": 5}).to_string(),
            "invalid arguments for `echo`",
        ),
        (
            "echo",
            json!({}).to_string(),
            "\"text\" is a required property",
        ),
        ("rm_rf", json!({}).to_string(), "unknown tool `rm_rf`"),
        (
            "spawn_subagent",
            json!({"agent": "explore", "prompt": "x"}).to_string(),
            "unknown tool `spawn_subagent`",
        ),
    ];
    for (name, args, expected) in table {
        let mut s = sim();
        s.script(
            "worker",
            vec![
                calls(vec![ToolCall {
                    id: "c1".into(),
                    name: name.into(),
                    arguments: args.clone(),
                }]),
                text("ok"),
            ],
        );
        let id = s.create("worker", "go");
        s.run_all();
        let t = &s.tools(&id)[0];
        match &t.result {
            ToolResult::Error { error } => {
                assert!(error.contains(expected), "{name} {args}: {error}")
            }
            r => panic!("{name} {args}: expected an error, got {r:?}"),
        }
        assert_eq!(s.run(&id).status, RunStatus::Completed, "the run recovers");
        assert!(s.executed.is_empty());
    }
}

#[test]
fn calls_of_one_reply_beyond_the_turns_cap_are_not_run() {
    let mut s = sim();
    let many: Vec<ToolCall> = (0..10)
        .map(|i| call("echo", json!({"text": format!("t{i}")})))
        .collect();
    s.script("worker", vec![calls(many), text("ok")]);
    let id = s.create("worker", "go");
    s.run_all();
    let tools = s.tools(&id);
    assert_eq!(tools.len(), 10);
    assert!(
        tools[..8]
            .iter()
            .all(|t| matches!(t.result, ToolResult::Success { .. }))
    );
    assert!(
        tools[8..].iter().all(
            |t| matches!(&t.result, ToolResult::Error { error } if error.contains("limit of 8 tool calls"))
        )
    );
    assert_eq!(s.executed.len(), 8);
}

#[test]
fn redelivered_and_stale_messages_do_nothing() {
    let mut s = sim();
    s.script(
        "worker",
        vec![calls(vec![call("echo", json!({"text": "x"}))]), text("ok")],
    );
    let id = s.create("worker", "go");
    let start = s.queue.pop_front().unwrap();
    assert_eq!(s.deliver(&start), Outcome::Done);
    assert_eq!(s.deliver(&start), Outcome::Ignored);
    let cont = s.queue.pop_front().unwrap();
    assert_eq!(s.deliver(&cont), Outcome::Done);
    assert_eq!(s.deliver(&cont), Outcome::Ignored);
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    let tail = StepMessage {
        run_id: id.clone(),
        id: "x".into(),
        input: Input::ChildFinished {
            child_run_id: "run_nope".into(),
            tool_call_id: "call_0_0".into(),
            outcome: ChildOutcome::Completed {
                text: "x".into(),
                step_count: 1,
                total_usage: Usage::default(),
            },
            spent: Default::default(),
            breakdown: vec![],
        },
        owed: false,
    };
    assert_eq!(s.deliver(&tail), Outcome::Ignored);
    assert_eq!(
        s.send(
            &id,
            Input::Fail {
                code: "x".into(),
                message: "y".into()
            }
        ),
        Outcome::Ignored
    );
}

#[test]
fn ids_are_derived_so_a_retried_step_mints_the_same_ones() {
    assert_eq!(derive_id("cta", "run_a", 3), derive_id("cta", "run_a", 3));
    assert_ne!(derive_id("cta", "run_a", 3), derive_id("cta", "run_a", 4));
    assert_ne!(derive_id("cta", "run_a", 3), derive_id("run", "run_a", 3));
    assert!(derive_id("cta", "run_a", 3).starts_with("cta_"));
    let choice = CtaRequest::Choice {
        prompt: "p".into(),
        options: vec![ChoiceOption {
            id: "a".into(),
            label: "A".into(),
            description: None,
        }],
    };
    assert_eq!(choice.kind(), "choice");
}

#[test]
fn a_fatal_model_error_fails_the_run_after_applying_the_input() {
    let mut s = sim();
    s.script("orchestrator", vec![calls(vec![spawn("explore", "x")])]);
    s.script("explore", vec![text("found")]);
    let id = s.create("orchestrator", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    let child = s.children(&id)[0].clone();
    let child_start = s.queue.pop_front().unwrap();
    s.deliver(&child_start);
    let finished = s.queue.pop_front().unwrap();
    // The parent's next think fails for good: the child's result is still recorded.
    let (run, timeline) = s.runs[&id].clone();
    let io = Io {
        book: s.agents.book(),
        model_error: Some("the model refused".into()),
        ..Io::default()
    };
    let Step::Done(t) = step(s.now, &run, &timeline, &finished.input, &io) else {
        panic!("expected a transition")
    };
    assert_eq!(t.run.status, RunStatus::Failed);
    assert_eq!(t.run.outcome.error.as_ref().unwrap().code, "model_error");
    let resolved = t.updated[0].tool().unwrap();
    assert_eq!(resolved.child_run_id.as_deref(), Some(child.as_str()));
    assert!(
        matches!(&resolved.result, ToolResult::Success { output } if output["text"] == "found")
    );
}

#[test]
fn oversized_tool_outputs_are_cut_with_a_marker() {
    let big = "x".repeat(MAX_OUTPUT_BYTES + 10);
    let mut s = sim();
    s.script(
        "worker",
        vec![calls(vec![call("echo", json!({"text": big}))]), text("ok")],
    );
    let id = s.create("worker", "go");
    s.run_all();
    match &s.tools(&id)[0].result {
        ToolResult::Success { output } => {
            assert_eq!(output["truncated"], true);
            assert_eq!(output["originalBytes"], MAX_OUTPUT_BYTES + 10);
            assert!(output["preview"].as_str().unwrap().ends_with(&format!(
                "[truncated: {MAX_OUTPUT_BYTES} of {} bytes kept]",
                MAX_OUTPUT_BYTES + 10
            )));
        }
        r => panic!("{r:?}"),
    }
    assert!(s.children(&id).is_empty());
    assert!(derive_id("sub", "run_a", 1).starts_with("sub_"));
}

/// What a step of the loop reads is its batch, however long the run: after twelve tool
/// iterations, the answer to the question the run waits on needs the entries from the
/// question's reply on (every step of the loop is also checked to decide alike on its
/// window and on the whole timeline: `Sim::deliver`). A follow-up reads the whole timeline.
#[test]
fn a_steps_window_is_its_batch_whatever_the_runs_length() {
    let mut s = sim();
    let mut replies: Vec<LlmReply> = (0..12)
        .map(|i| calls(vec![call("echo", json!({"text": format!("{i}")}))]))
        .collect();
    replies.push(feedback(json!({"kind": "text", "prompt": "Name?"})));
    replies.push(text("thanks"));
    s.script("asker", replies);
    let id = s.create("asker", "ask");
    s.run_all();
    let run = s.run(&id).clone();
    assert_eq!(run.status, RunStatus::Waiting);
    let timeline = s.runs[&id].1.clone();
    assert!(timeline.len() > 25, "{} entries", timeline.len());
    let cta_id = s.ctas.keys().next().unwrap().clone();
    let answer = Input::CtaAnswered {
        cta_id,
        response: CtaResponse::Text { text: "Ada".into() },
        responder: None,
    };
    let from = super::window_start(&run, &answer);
    assert!(
        matches!(
            timeline[from as usize - 1].body,
            EntryBody::Assistant { .. }
        ),
        "the window starts after the last reply"
    );
    assert_eq!(timeline.len() as u64 - from, 1, "the question's call alone");
    let follow_up = Input::UserMessage {
        text: "again".into(),
        message_id: "m1".into(),
        reply_to: None,
        options: Default::default(),
    };
    assert_eq!(super::window_start(&run, &follow_up), 0);
}

#[test]
fn run_state_events_carry_the_context_type_the_run_works_on() {
    let mut s = sim();
    // Each asks a question: it waits on its user (a state, published).
    let ask = feedback(json!({"kind": "text", "prompt": "Which?"}));
    s.script("asker", vec![ask]);
    let id = s.create("asker", "summarize");
    s.runs.get_mut(&id).unwrap().0.origin.context = Some(json!({"type": "ticket", "id": "T-1"}));
    let plain = s.create("asker", "hello");
    s.run_all();
    let states = s.events("run.state");
    let of = |run: &str| {
        states
            .iter()
            .filter(|e| e.detail["runId"] == run)
            .collect::<Vec<_>>()
    };
    assert!(!of(&id).is_empty());
    assert!(of(&id).iter().all(|e| e.detail["contextType"] == "ticket"));
    assert!(
        of(&plain)
            .iter()
            .all(|e| e.detail.get("contextType").is_none())
    );
}
