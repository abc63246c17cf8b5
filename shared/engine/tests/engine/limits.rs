//! Limits: iterations, tool calls, wall time and deadlines, and what a run spends.

use super::*;

/// A reply of `n` echo calls.
fn echoes(n: usize) -> LlmReply {
    calls(
        (0..n)
            .map(|i| call("echo", json!({"text": format!("e{i}")})))
            .collect(),
    )
}

#[test]
fn the_iteration_cap_force_completes_with_a_recorded_reason() {
    let mut s = sim();
    let echo = || calls(vec![call("echo", json!({"text": "again"}))]);
    s.script("worker", vec![echo(), echo(), echo(), echo()]);
    let id = s.create("worker", "loop");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.counters.thinks, 3, "worker's maxIterations is 3");
    assert_eq!(run.outcome.error.as_ref().map(|e| e.code.as_str()), None);
    assert!(
        matches!(&before_usage(&s.runs[&id].1).body, EntryBody::Notice { code, .. } if code == "max_iterations")
    );
    assert!(
        run.outcome
            .result
            .as_deref()
            .unwrap()
            .contains("3 iterations")
    );
}

#[test]
fn the_tool_call_cap_counts_the_turn_and_ends_it_with_a_final_answer() {
    let mut s = sim();
    // 9 calls over 3 replies, with a cap of 8: the ninth is not run, an error entry says
    // so, and the model is asked for its final answer (without tools, by the thinker).
    s.script(
        "capped",
        vec![
            echoes(3),
            echoes(3),
            echoes(3),
            text("Here is what I found."),
        ],
    );
    let id = s.create("capped", "dig");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.outcome.result.as_deref(), Some("Here is what I found."));
    assert_eq!(
        (run.counters.turn_tool_calls, run.counters.tools_spent),
        (8, true)
    );
    assert_eq!(s.executed.len(), 8, "eight calls ran");
    let timeline = &s.runs[&id].1;
    let not_run: Vec<&ToolEntry> = timeline
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::Tool(t) if matches!(&t.result, ToolResult::Error { error } if error.starts_with("not run")) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(not_run.len(), 1);
    let error = timeline
        .iter()
        .position(|e| matches!(&e.body, EntryBody::Error { code, .. } if code == "tool_call_limit"))
        .expect("an error entry");
    let answer = timeline
        .iter()
        .position(|e| matches!(&e.body, EntryBody::Assistant { text: Some(t), .. } if t == "Here is what I found."))
        .unwrap();
    assert!(error < answer);
    assert_eq!(s.events("run.error").len(), 1);
    // The next turn starts with its own count.
    s.script(
        "capped",
        vec![
            echoes(3),
            echoes(3),
            echoes(3),
            text("Here is what I found."),
            echoes(2),
            text("again"),
        ],
    );
    let msg = Input::UserMessage {
        text: "once more".into(),
        message_id: "m2".into(),
        reply_to: None,
        options: Default::default(),
    };
    s.send(&id, msg);
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.outcome.result.as_deref(), Some("again"));
    assert_eq!(
        (run.counters.turn_tool_calls, run.counters.tools_spent),
        (2, false)
    );
}

#[test]
fn a_model_that_calls_tools_past_the_cap_fails_the_run() {
    let mut s = sim();
    s.script("capped", vec![echoes(5), echoes(5), echoes(1)]);
    let id = s.create("capped", "dig");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(
        run.outcome.error.as_ref().map(|e| e.code.as_str()),
        Some("tool_call_limit")
    );
    assert_eq!(s.executed.len(), 8);
}

#[test]
fn every_call_is_priced_and_subagents_report_what_they_spent_once() {
    let mut s = sim();
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
    // gpt-4o-mini: $0.15 in, $0.60 out per million tokens.
    let price = |input: f64, output: f64| (input * 0.15 + output * 0.60) / 1e6;
    let near = |a: f64, b: f64| (a - b).abs() < 1e-12;
    let kid = s.run(&child);
    assert!(
        near(kid.spend.cost_usd, price(10.0, 2.0)),
        "{}",
        kid.spend.cost_usd
    );
    let parent = s.run(&id);
    assert!(
        near(parent.spend.cost_usd, price(25.0, 5.0)),
        "{}",
        parent.spend.cost_usd
    );
    // The child finished twice; each time it reported only what it spent since.
    assert_eq!(parent.spend.children.usage.input_tokens, 10);
    assert!(near(parent.spend.children.cost_usd, kid.spend.cost_usd));
    assert_eq!(parent.total().usage.total_tokens, 30 + 12);
    let replies: Vec<Option<f64>> = s.runs[&id]
        .1
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::Assistant {
                cost_usd,
                model,
                operation,
                ..
            } => {
                assert_eq!(model.as_deref(), Some("openai:gpt-4o-mini"));
                assert_eq!(*operation, baton_engine::timeline::Operation::Think);
                Some(*cost_usd)
            }
            _ => None,
        })
        .collect();
    assert_eq!(replies.len(), 3);
    assert!(near(replies[2].expect("priced"), price(5.0, 1.0)));
    let done = s.events("run.completed");
    let last = &done.last().expect("completed").detail;
    assert!(near(
        last["total"]["costUsd"].as_f64().expect("total cost"),
        parent.total().cost_usd
    ));
}

#[test]
fn a_run_past_its_wall_time_fails_naming_the_limit_and_human_waits_do_not_count() {
    let mut s = sim();
    s.script(
        "timed",
        vec![
            feedback(json!({"kind": "approval", "message": "Go?"})),
            calls(vec![call("echo", json!({"text": "a"}))]),
            calls(vec![call("echo", json!({"text": "b"}))]),
            text("never"),
        ],
    );
    let id = s.create("timed", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    assert_eq!(s.run(&id).outcome.state.as_deref(), Some("waiting_on_user"));
    // Ten days pass before the human answers: that wait is not the run's working time.
    s.now += chrono::Duration::days(10);
    let cta = s.pending_ctas(&id)[0].cta_id.clone();
    s.answer(&cta, CtaResponse::approval(true));
    let answered = s.queue.pop_front().unwrap();
    s.deliver(&answered);
    assert_eq!(s.run(&id).status, RunStatus::Running, "thought and echoed");
    assert_eq!(s.run(&id).clock.human_wait_ms, 10 * 24 * 3600 * 1000);
    // Then it works past its 60 s: the next iteration ends it.
    s.now += chrono::Duration::seconds(61);
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.outcome.error.as_ref().expect("error");
    assert_eq!(error.code, "deadline_exceeded");
    assert!(
        error.message.contains("maxWallSeconds = 60"),
        "{}",
        error.message
    );
    assert_eq!(s.tools(&id).len(), 2, "the third think never happened");
}

/// The deadline timers a run has had armed: (id, when), and those cancelled.
fn deadline_timers(
    s: &Sim,
    run: &str,
) -> (Vec<(String, chrono::DateTime<chrono::Utc>)>, Vec<String>) {
    let mut armed = Vec::new();
    let mut cancelled = Vec::new();
    for e in &s.effects {
        match e {
            Effect::Timer {
                timer_id,
                run_id,
                at,
            } if run_id == run && timer_id.contains("deadline") => {
                armed.push((timer_id.clone(), *at));
            }
            Effect::CancelTimer { timer_id } if timer_id.contains("deadline") => {
                cancelled.push(timer_id.clone());
            }
            _ => {}
        }
    }
    (armed, cancelled)
}

#[test]
fn idle_time_between_turns_is_not_work() {
    let mut s = sim();
    s.script("timed", vec![text("first"), text("second")]);
    let id = s.create("timed", "go");
    s.now += chrono::Duration::seconds(10);
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    // Two hours idle, far past its 60 s: a follow-up still runs.
    s.now += chrono::Duration::hours(2);
    let msg = Input::UserMessage {
        text: "and now?".into(),
        message_id: "m1".into(),
        reply_to: None,
        options: Default::default(),
    };
    s.send(&id, msg);
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.outcome.error);
    assert_eq!(run.outcome.result.as_deref(), Some("second"));
    assert!(run.working_time(s.now).num_seconds() < 60);
}

#[test]
fn a_subagents_wait_for_a_human_is_not_its_parents_work() {
    let mut s = sim();
    s.script(
        "patient",
        vec![calls(vec![spawn("asker", "check")]), text("parent done")],
    );
    s.script(
        "asker",
        vec![
            feedback(json!({"kind": "approval", "message": "Ok?"})),
            text("checked"),
        ],
    );
    let id = s.create("patient", "go");
    s.run_all();
    let child = s.children(&id)[0].clone();
    assert_eq!(
        s.run(&child).outcome.state.as_deref(),
        Some("waiting_on_user")
    );
    assert!(!s.run(&id).waits.waiting_ctas.is_empty());
    // Armed while the parent waited on its subagent's work, cancelled when that became a
    // wait for a human: the parent's clock stopped.
    let (armed, cancelled) = deadline_timers(&s, &id);
    assert_eq!(
        (armed.len(), cancelled.len()),
        (1, 1),
        "{armed:?} {cancelled:?}"
    );
    assert_eq!(s.run(&id).clock.working_since, None);
    // Three days later the human answers: the parent goes on and completes.
    s.now += chrono::Duration::days(3);
    let cta = s.pending_ctas(&child)[0].cta_id.clone();
    s.answer(&cta, CtaResponse::approval(true));
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.outcome.error);
    assert_eq!(run.outcome.result.as_deref(), Some("parent done"));
    assert!(run.working_time(s.now).num_seconds() < 60);
    // Every deadline timer armed was cancelled by the end.
    let (armed, cancelled) = deadline_timers(&s, &id);
    assert_eq!(armed.len(), cancelled.len(), "{armed:?} {cancelled:?}");
}

#[test]
fn a_run_waiting_on_a_slow_subagent_is_stopped_at_its_deadline() {
    let mut s = sim();
    s.script(
        "patient",
        vec![calls(vec![spawn("alpha", "take your time")])],
    );
    let id = s.create("patient", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    // The child's messages are never delivered: it is slow.
    s.queue.clear();
    assert_eq!(s.run(&id).status, RunStatus::Waiting);
    let (armed, _) = deadline_timers(&s, &id);
    let [(timer_id, at)] = armed.as_slice() else {
        panic!("one deadline timer: {armed:?}");
    };
    assert_eq!(*at, s.now + chrono::Duration::seconds(60));
    let fire = |t: &str| Input::Timer { timer_id: t.into() };
    // Another timer id is not the deadline's.
    assert_eq!(s.send(&id, fire("tmr_other")), Outcome::Ignored);
    s.now = *at;
    assert_eq!(s.send(&id, fire(timer_id)), Outcome::Done);
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.outcome.error.as_ref().expect("error");
    assert_eq!(error.code, "deadline_exceeded");
    assert!(error.message.contains("subagents"), "{}", error.message);
    // Its subagent is told to stop.
    let child = s.children(&id)[0].clone();
    assert!(
        s.queue
            .iter()
            .any(|m| m.run_id == child && matches!(m.input, Input::Cancel { .. })),
        "{:?}",
        s.queue
    );
    // A stale firing after the end changes nothing more.
    let version = s.run(&id).version;
    s.send(&id, fire(timer_id));
    assert_eq!(s.run(&id).version, version);
}
