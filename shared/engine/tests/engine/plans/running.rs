//! How a plan runs: its steps in order and at once, their results and bindings, caps,
//! timeouts and timers, failures, cancellation.

use super::*;

#[test]
fn sequential_steps_pass_results_and_bindings_along() {
    let mut s = sim();
    let steps = json!([
        {"id": "find", "agent": "alpha", "prompt": "find {{bindings.topic}}", "result_key": "found"},
        {"id": "use", "agent": "beta", "prompt": "use {{result.found.n}}",
         "with": {"all": "{{result.found}}"}, "result_key": "used"}
    ]);
    s.script(
        "orchestrator",
        vec![
            plan_call(json!({"plan": {"steps": steps}, "bindings": {"topic": "cats"}})),
            text("done"),
        ],
    );
    s.script("alpha", vec![text("{\"n\": 7}")]);
    s.script("beta", vec![text("used 7")]);
    let id = start(&mut s);
    // Only the first step runs, with its binding filled in, as a child of the call.
    assert_eq!(status(&s, &id, "find"), StepStatus::Running);
    assert_eq!(status(&s, &id, "use"), StepStatus::Pending);
    let find = child_of(&s, &id, "find");
    assert_eq!(first_prompt(&s, &find), "find cats");
    let link = s.run(&find).origin.parent.clone().expect("a child");
    assert_eq!(
        (link.run_id.as_str(), s.run(&find).origin.depth),
        (id.as_str(), 1)
    );
    assert_eq!(link.tool_call_id, s.tools(&id)[0].id);
    assert_eq!(s.run(&id).outcome.state.as_deref(), Some("executing_plan"));
    let detail = s.run(&id).outcome.state_detail.clone().expect("details");
    assert_eq!(
        (detail["done"].as_u64(), detail["total"].as_u64()),
        (Some(0), Some(2)),
        "{detail}"
    );
    s.run_all();
    let used = child_of(&s, &id, "use");
    let prompt = first_prompt(&s, &used);
    assert!(prompt.starts_with("use 7\n\nInput:\n"), "{prompt}");
    assert!(prompt.contains("\"all\": {\n    \"n\": 7\n  }"), "{prompt}");
    assert_eq!(
        output(&s, &id),
        json!({
            "success": true,
            "steps": [
                {"id": "find", "type": "agent", "status": "success", "exec_id": find,
                 "outputs": {"n": 7}},
                {"id": "use", "type": "agent", "status": "success", "exec_id": used,
                 "outputs": "used 7"}
            ],
            "bindings": {"found": {"n": 7}, "used": "used 7"}
        })
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.run(&id).outcome.result.as_deref(), Some("done"));
    let counts: Vec<usize> = [
        "plan.created",
        "plan.step.started",
        "plan.step.completed",
        "plan.completed",
    ]
    .iter()
    .map(|t| s.events(t).len())
    .collect();
    assert_eq!(counts, [1, 2, 2, 1]);
    assert_eq!(s.events("plan.step.completed")[1].detail["stepId"], "use");
    // The children's spending is the parent's too.
    assert_eq!(s.run(&id).spend.children.usage.total_tokens, 12);
}

#[test]
fn a_parallel_step_runs_at_once_and_a_later_step_binds_both_results() {
    let mut s = sim();
    let steps = json!([
        {"id": "research", "parallel": [
            {"id": "a", "agent": "alpha", "prompt": "one", "result_key": "a"},
            {"id": "b", "agent": "beta", "prompt": "two", "result_key": "b"}
        ], "result_key": "both"},
        {"id": "merge", "agent": "gamma", "prompt": "{{result.a}} + {{result.b}}; {{result.both.b}}"}
    ]);
    s.script(
        "orchestrator",
        vec![plan_call(json!({"plan": steps})), text("merged")],
    );
    s.script("alpha", vec![text("A")]);
    s.script("beta", vec![text("B")]);
    s.script("gamma", vec![text("A and B")]);
    let id = start(&mut s);
    assert_eq!(status(&s, &id, "a"), StepStatus::Running);
    assert_eq!(status(&s, &id, "b"), StepStatus::Running);
    assert_eq!(status(&s, &id, "merge"), StepStatus::Pending);
    s.run_all();
    assert_eq!(first_prompt(&s, &child_of(&s, &id, "merge")), "A + B; B");
    let out = output(&s, &id);
    assert_eq!(out["success"], true);
    assert_eq!(out["steps"][0]["type"], "parallel");
    assert_eq!(out["steps"][0]["status"], "success");
    assert_eq!(out["steps"][0]["outputs"], json!({"a": "A", "b": "B"}));
    assert_eq!(
        out["steps"][0]["children"][1]["exec_id"],
        child_of(&s, &id, "b")
    );
    assert_eq!(out["steps"][1]["outputs"], "A and B");
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn first_success_takes_the_winner_and_cancels_the_rest() {
    let mut s = sim();
    let steps = json!([
        {"id": "race", "parallel": [
            {"id": "fast", "agent": "alpha", "prompt": "x"},
            {"id": "slow", "agent": "beta", "prompt": "y"}
        ], "merge": "first_success", "result_key": "winner"},
        {"id": "after", "agent": "gamma", "prompt": "got {{result.winner}}"}
    ]);
    s.script(
        "orchestrator",
        vec![plan_call(json!({"plan": steps})), text("ok")],
    );
    s.script("alpha", vec![text("X")]);
    s.script("beta", vec![text("Y")]);
    s.script("gamma", vec![text("done")]);
    let id = start(&mut s);
    let slow = child_of(&s, &id, "slow");
    // The fast child finishes while the slow one has not even started.
    run_all_but(&mut s, &slow);
    let st = state(&s, &id);
    assert_eq!(st.steps["fast"].status, StepStatus::Success);
    assert_eq!(st.steps["slow"].status, StepStatus::Skipped);
    assert_eq!(
        st.steps["slow"].error.as_deref(),
        Some("cancelled: step `fast` succeeded first")
    );
    assert_eq!(sent(&s, &slow, |i| matches!(i, Input::Cancel { .. })), 1);
    assert_eq!(first_prompt(&s, &child_of(&s, &id, "after")), "got X");
    let out = output(&s, &id);
    assert_eq!(out["steps"][0]["status"], "success");
    assert_eq!(out["steps"][0]["outputs"], "X");
    assert_eq!(out["bindings"]["winner"], "X");
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    // The loser's start was queued before its cancel (one FIFO group): it may finish
    // anyway; its late word changes nothing.
    s.run_all();
    assert!(s.run(&slow).status.is_terminal());
    assert_eq!(
        output(&s, &id)["steps"][0]["children"][1]["status"],
        "skipped"
    );
}

#[test]
fn a_step_that_binds_a_failed_result_is_skipped_and_independent_steps_still_run() {
    let mut s = sim();
    let steps = json!([
        {"id": "a", "agent": "alpha", "prompt": "x", "result_key": "a"},
        {"id": "b", "agent": "beta", "prompt": "use {{result.a}}"},
        {"id": "c", "agent": "gamma", "prompt": "independent"}
    ]);
    s.script(
        "orchestrator",
        vec![plan_call(json!({"plan": steps})), text("partly")],
    );
    s.script("gamma", vec![text("C")]);
    let id = start(&mut s);
    let a = child_of(&s, &id, "a");
    s.queue.clear();
    s.send(
        &a,
        Input::Fail {
            code: "model_error".into(),
            message: "the model is down".into(),
        },
    );
    s.run_all();
    let st = state(&s, &id);
    assert_eq!(st.steps["a"].status, StepStatus::Failed);
    assert!(
        st.steps["a"]
            .error
            .as_deref()
            .unwrap()
            .contains("the model is down")
    );
    assert_eq!(st.steps["b"].status, StepStatus::Skipped);
    assert_eq!(
        st.steps["b"].error.as_deref(),
        Some("skipped: it uses the result of step `a`, which did not succeed")
    );
    assert!(
        st.steps["b"].child_run_id.is_none(),
        "a skipped step starts no child"
    );
    assert_eq!(st.steps["c"].status, StepStatus::Success);
    let out = output(&s, &id);
    assert_eq!(out["success"], false);
    assert_eq!(out["bindings"], json!({}));
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn caps_bound_plans_and_a_call_may_lower_but_not_raise_them() {
    let three = |extra: Value| {
        let mut input = json!({"plan": [{"id": "p", "parallel": [
            {"id": "x", "agent": "alpha", "prompt": "1"},
            {"id": "y", "agent": "alpha", "prompt": "2"},
            {"id": "z", "agent": "alpha", "prompt": "3"}]}]});
        if let (Value::Object(i), Value::Object(e)) = (&mut input, extra) {
            i.extend(e);
        }
        input
    };
    let running = |s: &Sim, id: &str| {
        state(s, id)
            .steps
            .values()
            .filter(|r| r.status == StepStatus::Running)
            .count()
    };
    let mut capped = Limits::default();
    capped.plan.max_parallel = 2;
    let thirteen: Vec<Value> = (0..13)
        .map(|i| json!({"id": format!("s{i}"), "agent": "alpha", "prompt": "p"}))
        .collect();
    // (limits, input, children running at first; or the error)
    let table: Vec<(Limits, Value, Result<usize, &str>)> = vec![
        (Limits::default(), three(json!({})), Ok(3)),
        (Limits::default(), three(json!({"max_parallel": 1})), Ok(1)),
        (capped.clone(), three(json!({})), Ok(2)),
        (capped.clone(), three(json!({"max_parallel": 8})), Ok(2)),
        (
            Limits::default(),
            json!({"plan": [{"id": "p", "max_concurrency": 1, "parallel": [
                {"id": "x", "agent": "alpha", "prompt": "1"},
                {"id": "y", "agent": "alpha", "prompt": "2"}]}]}),
            Ok(1),
        ),
        (
            Limits::default(),
            json!({"plan": thirteen}),
            Err("at most 12 agent steps"),
        ),
        (
            Limits::default(),
            json!({"plan": [{"id": "x", "agent": "orchestrator", "prompt": "p"}]}),
            Err("no agent `orchestrator` a plan may use"),
        ),
        (
            Limits::default(),
            json!({"plan": [], "prompt": "both"}),
            Err("invalid arguments"),
        ),
    ];
    for (limits, input, want) in table {
        let mut s = sim_with(limits);
        s.script("orchestrator", vec![plan_call(input.clone()), text("ok")]);
        s.script("alpha", vec![text("done")]);
        let id = start(&mut s);
        match want {
            Ok(n) => {
                assert_eq!(running(&s, &id), n, "{input}");
                s.run_all();
                assert_eq!(output(&s, &id)["success"], true, "{input}");
            }
            Err(e) => {
                assert!(error(&s, &id).contains(e), "{input}: {}", error(&s, &id));
                assert_eq!(s.runs.len(), 1, "{input}: no child run");
            }
        }
    }
}

#[test]
fn a_step_past_its_timeout_fails_its_child_is_cancelled_and_the_plan_goes_on() {
    let mut s = sim();
    let steps = json!([
        {"id": "slow", "agent": "alpha", "prompt": "x"},
        {"id": "next", "agent": "beta", "prompt": "y", "timeout_ms": 2000}
    ]);
    s.script(
        "orchestrator",
        vec![
            plan_call(json!({"plan": steps, "timeout_ms": 5000})),
            text("ok"),
        ],
    );
    s.script("beta", vec![text("B")]);
    let id = start(&mut s);
    let slow = child_of(&s, &id, "slow");
    let (timer_id, at) = s
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::Timer { timer_id, at, .. } => Some((timer_id.clone(), *at)),
            _ => None,
        })
        .expect("a timer for the step");
    assert_eq!(at, t0() + chrono::Duration::seconds(5));
    // The child never answers. A timer that is early, or unknown, changes nothing;
    s.queue.clear();
    s.now = t0() + chrono::Duration::seconds(3);
    let timer = |t: &str| Input::Timer { timer_id: t.into() };
    assert_eq!(s.send(&id, timer(&timer_id)), Outcome::Ignored);
    assert_eq!(s.send(&id, timer("tmr_other")), Outcome::Ignored);
    // at its deadline the step fails, its child is told to stop, and the next step starts
    // (with the shorter of its own timeout and the call's).
    s.now = at;
    assert_eq!(s.send(&id, timer(&timer_id)), Outcome::Done);
    let st = state(&s, &id);
    assert_eq!(st.steps["slow"].status, StepStatus::Failed);
    assert!(
        st.steps["slow"]
            .error
            .as_deref()
            .unwrap()
            .starts_with("timed out")
    );
    assert_eq!(
        st.steps["next"].deadline,
        Some(at + chrono::Duration::seconds(2))
    );
    assert_eq!(sent(&s, &slow, |i| matches!(i, Input::Cancel { .. })), 1);
    s.run_all();
    assert_eq!(s.run(&slow).status, RunStatus::Cancelled);
    // The step that finished in time cancels its timer.
    let next_timer = st.steps["next"].timer_id.clone().unwrap();
    assert!(s.effects.contains(&Effect::CancelTimer {
        timer_id: next_timer
    }));
    let out = output(&s, &id);
    assert_eq!(out["success"], false);
    assert_eq!(out["steps"][1]["status"], "success");
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_step_timeout_never_outlasts_the_runs_own_deadline() {
    let mut s = sim();
    s.script(
        "lead",
        vec![plan_call(
            json!({"plan": [{"id": "x", "agent": "alpha", "prompt": "p"}],
                              "timeout_ms": 3_600_000}),
        )],
    );
    let id = s.create("lead", "go");
    s.now = t0() + chrono::Duration::seconds(20);
    let first = s.queue.pop_front().unwrap();
    s.deliver(&first);
    // `lead` may work 120 s; 20 have gone.
    let at = state(&s, &id).steps["x"].deadline;
    assert_eq!(at, Some(t0() + chrono::Duration::seconds(120)));
}

#[test]
fn cancelling_the_run_cancels_its_plans_children_and_timers() {
    let mut s = sim();
    let steps = json!([{"id": "p", "parallel": [
        {"id": "x", "agent": "alpha", "prompt": "1"},
        {"id": "y", "agent": "beta", "prompt": "2"}]}]);
    s.script(
        "orchestrator",
        vec![plan_call(json!({"plan": steps, "timeout_ms": 60000}))],
    );
    let id = start(&mut s);
    let (x, y) = (child_of(&s, &id, "x"), child_of(&s, &id, "y"));
    s.queue.clear();
    s.send(
        &id,
        Input::Cancel {
            reason: "stop".into(),
        },
    );
    assert_eq!(s.run(&id).status, RunStatus::Cancelled);
    for child in [&x, &y] {
        assert_eq!(sent(&s, child, |i| matches!(i, Input::Cancel { .. })), 1);
    }
    let cancelled = s
        .effects
        .iter()
        .filter(|e| matches!(e, Effect::CancelTimer { .. }))
        .count();
    assert_eq!(cancelled, 2);
    assert!(error(&s, &id).starts_with("not completed: run cancelled"));
}

#[test]
fn a_plan_steps_question_reaches_the_parent() {
    let mut s = sim();
    s.script(
        "orchestrator",
        vec![plan_call(
            json!({"plan": [{"id": "ask", "agent": "asker", "prompt": "ask"}]}),
        )],
    );
    s.script(
        "asker",
        vec![feedback(json!({"kind": "text", "prompt": "Which repo?"}))],
    );
    let id = start(&mut s);
    s.run_all();
    let asker = child_of(&s, &id, "ask");
    let cta = s.pending_ctas(&asker).pop().expect("the step asks");
    assert_eq!(s.run(&id).waits.waiting_ctas[0].cta_id, cta.cta_id);
    assert!(s.runs[&id].1.iter().any(|e| matches!(
        &e.body,
        EntryBody::Notice { code, message } if code == "subagent_waiting" && message.contains("Which repo?")
    )));
}

#[test]
fn a_parallel_step_with_a_failed_child_is_partial_and_the_output_lists_what_failed() {
    let mut s = sim();
    let steps = json!([{"id": "both", "parallel": [
        {"id": "ok", "agent": "alpha", "prompt": "a", "result_key": "a"},
        {"id": "bad", "agent": "beta", "prompt": "b", "result_key": "b"}]}]);
    s.script(
        "orchestrator",
        vec![plan_call(json!({"plan": steps})), text("half done")],
    );
    s.script("alpha", vec![text("A")]);
    let id = start(&mut s);
    let bad = child_of(&s, &id, "bad");
    // Three seconds later, the good step completes and the other fails.
    s.now += chrono::Duration::seconds(3);
    run_all_but(&mut s, &bad);
    s.queue.clear();
    s.send(
        &bad,
        Input::Fail {
            code: "model_error".into(),
            message: "the model is down".into(),
        },
    );
    s.run_all();
    let out = output(&s, &id);
    assert_eq!(out["success"], false);
    assert_eq!(out["steps"][0]["status"], "partial", "{out}");
    assert_eq!(out["steps"][0]["outputs"]["a"], "A", "{out}");
    let errors = out["errors"]
        .as_array()
        .expect("errors when something failed");
    assert_eq!(errors.len(), 1, "{out}");
    assert_eq!(errors[0]["step"], "bad");
    assert_eq!(errors[0]["status"], "failed");
    assert!(
        errors[0]["error"]
            .as_str()
            .unwrap()
            .contains("the model is down")
    );
    // Each step and the plan say how long they took.
    for e in s.events("plan.step.completed") {
        assert_eq!(e.detail["durationMs"], 3000, "{}", e.detail);
    }
    assert_eq!(state(&s, &id).steps["ok"].duration_ms, Some(3000));
    let done = &s.events("plan.completed")[0].detail;
    assert_eq!(done["durationMs"], 3000, "{done}");
    assert_eq!(s.run(&id).outcome.result.as_deref(), Some("half done"));
    // Its state machine on a failure's path: each move an event, with when it came and how
    // long the phase it left lasted.
    let moves: Vec<(String, String, Value, Value)> = s
        .events("plan.phase")
        .iter()
        .map(|e| {
            let d = &e.detail;
            let from = d["from"].as_str().unwrap_or("-").to_owned();
            (
                from,
                d["to"].as_str().unwrap().to_owned(),
                d["inPhaseMs"].clone(),
                d["sincePlanMs"].clone(),
            )
        })
        .collect();
    let n = |ms: i64| json!(ms);
    assert_eq!(
        moves,
        [
            ("-".into(), "dispatching".into(), Value::Null, n(0)),
            ("dispatching".into(), "awaiting_results".into(), n(0), n(0)),
            (
                "awaiting_results".into(),
                "merging".into(),
                n(3000),
                n(3000)
            ),
            ("merging".into(), "failed".into(), n(0), n(3000)),
        ]
    );
    assert_eq!(state(&s, &id).phase, baton_engine::plan::Phase::Failed);
}

#[test]
fn a_plan_that_succeeds_has_no_errors() {
    let mut s = sim();
    let steps = json!([{"id": "a", "agent": "alpha", "prompt": "x"}]);
    s.script(
        "orchestrator",
        vec![plan_call(json!({"plan": steps})), text("ok")],
    );
    s.script("alpha", vec![text("A")]);
    let id = start(&mut s);
    s.run_all();
    let out = output(&s, &id);
    assert_eq!(out["success"], true);
    assert!(out.get("errors").is_none(), "{out}");
}

#[test]
fn a_run_holds_the_timers_it_armed_until_they_fire_or_are_cancelled() {
    // The stores index a run by its soonest armed timer, so that the sweep fires one whose
    // schedule was lost: the run must hold each timer from its arming to its firing or
    // cancelling, and none once it ends.
    let mut s = sim();
    let steps = json!([
        {"id": "slow", "agent": "alpha", "prompt": "x"},
        {"id": "next", "agent": "beta", "prompt": "y", "timeout_ms": 2000}
    ]);
    s.script(
        "orchestrator",
        vec![
            plan_call(json!({"plan": steps, "timeout_ms": 5000})),
            text("ok"),
        ],
    );
    s.script("beta", vec![text("B")]);
    let id = start(&mut s);
    // The slow step's child never answers.
    s.queue.clear();
    let first = state(&s, &id).steps["slow"].timer_id.clone().unwrap();
    let armed: Vec<&String> = s.run(&id).clock.timers.keys().collect();
    assert_eq!(armed, [&first]);
    assert_eq!(
        s.run(&id).clock.timers[&first],
        t0() + chrono::Duration::seconds(5)
    );
    s.now = t0() + chrono::Duration::seconds(5);
    let fire = Input::Timer {
        timer_id: first.clone(),
    };
    assert_eq!(s.send(&id, fire), Outcome::Done);
    let next = state(&s, &id).steps["next"].timer_id.clone().unwrap();
    assert!(!s.run(&id).clock.timers.contains_key(&first), "fired: gone");
    assert!(
        s.run(&id).clock.timers.contains_key(&next),
        "the next step's armed"
    );
    s.run_all();
    // The next step ended in time (its timer cancelled) and the run completed: none left.
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert!(
        s.run(&id).clock.timers.is_empty(),
        "{:?}",
        s.run(&id).clock.timers
    );
}
