//! Crash points, on the embedded store: a process that dies with messages in flight, and
//! every failpoint of a step and of the API's writes (see `baton_core::failpoint`), each
//! crashed at, restarted from, and checked against the fault-free run.
//!
//! Failpoints are process-wide, so the crash tests take turns (`SERIAL`, with `aws_crashes.rs`).

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::failpoint;
use baton_core::ports::SystemClock;
use baton_local::store::LocalStore;
use common::host::{Crash, LocalHost, TestHost};
use common::*;
use serde_json::{Value, json};

use crate::FAILPOINTS as SERIAL;

/// Think, a tool, think, a human's approval, think; then a follow-up turn.
const SCRIPT: &str = r#"{"ops": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "ship?"}}]},
    {"text": "shipped"},
    {"text": "and again"}]}"#;

#[tokio::test]
async fn a_message_in_flight_when_its_process_died_is_taken_at_once_after_a_restart() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // A process creates a run, receives its start message, and dies before acknowledging.
    let store = LocalStore::open(dir.path()).unwrap();
    let service = local_service(
        &store,
        scripted(r#"{"orchestrator": [{"text": "hi"}]}"#),
        catalog(None),
        Arc::new(SystemClock),
    );
    let run = service
        .requests()
        .create_run(
            "local",
            baton_core::service::CreateRun {
                watch: false,
                budget_usd: None,
                prompt: "go".into(),
                agent: None,
                sandbox_id: None,
                github: None,
                metadata: None,
                context: None,
                on_expiry: Default::default(),
                options: Default::default(),
            },
            None,
        )
        .await
        .unwrap();
    let leased = store.receive(10, Duration::from_secs(900)).await.unwrap();
    assert_eq!(leased.len(), 1, "the start message is in flight");
    drop((service, store));
    // The next process takes it at once, not after the 900 s visibility timeout.
    let h = start_scripted(dir.path(), r#"{"orchestrator": [{"text": "hi"}]}"#).await;
    let done = h.wait_status(&run.run_id, &["completed"]).await;
    assert_eq!(done["result"], "hi");
    h.server.shutdown().await;
}

/// How many events of each type the local bus recorded.
async fn events_by_type(h: &Harness) -> BTreeMap<String, usize> {
    let (_, events) = h.get("/events?limit=1000").await;
    let mut by_type = BTreeMap::new();
    for e in events["events"].as_array().unwrap() {
        *by_type
            .entry(e["detailType"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
    }
    by_type
}

/// One scenario's observable outcome, with what differs between runs (ids, times) taken out.
#[derive(Debug, PartialEq)]
struct Outcome {
    timeline: Value,
    status: Value,
    events: BTreeMap<String, usize>,
    ctas: Vec<Value>,
}

/// The scenario's agent: a tool the step executes, and a human to ask.
fn ops() -> Arc<baton_core::agent::Catalog> {
    catalog(Some(
        json!({"agents": {"ops": {"tools": ["echo", "request_human_feedback"]}}}),
    ))
}

/// `baton dev` on `dir` thinking from `script`, every message handled twice when
/// `duplicate`: restarted on the same directory after a crash.
async fn local_host(
    dir: &Path,
    script: &str,
    catalog: Arc<baton_core::agent::Catalog>,
    duplicate: bool,
) -> LocalHost {
    let mut options = local_options(dir, scripted(script), catalog, Arc::new(SystemClock));
    options.worker.duplicate = duplicate;
    LocalHost::start(options).await
}

/// The scenario's host: [`ops`] thinking from [`SCRIPT`].
async fn ops_host(dir: &Path, duplicate: bool) -> LocalHost {
    local_host(dir, SCRIPT, ops(), duplicate).await
}

/// The plan example's host: a drafted plan, approved, runs two steps at once, then one.
async fn plan_host(dir: &Path) -> LocalHost {
    local_host(dir, &examples("plan.json"), catalog(None), false).await
}

/// Lets what the host still holds land (a crash in the last step's tail, after its commit,
/// shows only now: restarts then too).
async fn drain(crash: &mut Crash<LocalHost>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while crash.host.h().server.store.queue_depth().await.unwrap() > 0 {
        crash.restart_if_fired().await;
        assert!(
            Instant::now() < deadline,
            "{}: the queue never drained",
            crash.fp
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The full scenario, crashing at `fp` (after `skip` passes) when it is armed.
async fn scenario(fp: &str, skip: u32, cancel: bool) -> (Outcome, bool) {
    scenario_with(fp, skip, cancel, false).await
}

async fn scenario_with(fp: &str, skip: u32, cancel: bool, duplicate: bool) -> (Outcome, bool) {
    failpoint::reset();
    let dir = tempfile::tempdir().unwrap();
    let mut crash = Crash::arm(ops_host(dir.path(), duplicate).await, fp, skip);
    let run_id = crash.create(json!({"prompt": "go", "agent": "ops"})).await;
    let parked = |r: &Value| r["status"] == "waiting" && r["state"] == "waiting_on_user";
    crash.until(&run_id, |r| parked(r)).await;
    let cta = crash.api().pending_cta().await["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    if cancel {
        crash
            .request(&format!("/runs/{run_id}/cancel"), json!({}))
            .await;
        crash.until(&run_id, |r| r["status"] == "cancelled").await;
    } else {
        let approve = json!({"kind": "approval", "approved": true});
        crash
            .request(&format!("/ctas/{cta}/response"), approve)
            .await;
        crash.until(&run_id, |r| r["status"] == "completed").await;
        crash
            .request(&format!("/runs/{run_id}/messages"), json!({"text": "more"}))
            .await;
        crash
            .until(&run_id, |r| {
                r["status"] == "completed" && r["result"] == "and again"
            })
            .await;
    }
    // Then read what a user can see.
    drain(&mut crash).await;
    let fired = crash.fired();
    failpoint::reset();
    let h = crash.host.h();
    let (_, run) = h.get(&format!("/runs/{run_id}")).await;
    let by_type = events_by_type(h).await;
    let (_, ctas) = h.get("/ctas?status=all").await;
    assert!(
        h.server.store.timer(&cta).await.unwrap().is_none(),
        "{fp}: the expiry timer outlived its CTA"
    );
    let outcome = Outcome {
        timeline: normalize(&run["timeline"], &run_id),
        status: run["status"].clone(),
        events: by_type,
        ctas: ctas["ctas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| normalize(c, &run_id))
            .collect(),
    };
    crash.host.stop().await;
    (outcome, fired)
}

const STEP_POINTS: &[&str] = &[
    "step.before_think",
    "step.after_think",
    "step.before_tool",
    "step.after_tool",
    "step.before_commit",
    "step.after_commit",
    "effect.after_send",
    "effect.after_publish",
    "effect.after_schedule",
    "effect.after_unschedule",
    "step.before_ack",
];

#[tokio::test]
async fn every_crash_point_recovers_to_the_fault_free_outcome() {
    let _serial = SERIAL.lock().await;
    let (baseline, _) = scenario("", 0, false).await;
    assert_eq!(baseline.status, "completed");
    let mut crashed = Vec::new();
    let api_points = [
        "create.after_insert",
        "answer.after_settle",
        "resolution.after_send",
        "message.after_queue",
    ];
    for fp in api_points {
        let (outcome, fired) = scenario(fp, 0, false).await;
        assert!(fired, "{fp} was never reached");
        assert_eq!(outcome, baseline, "after a crash at {fp}");
        crashed.push(fp.to_owned());
    }
    // Each step point at each of its first passes, until the scenario no longer reaches it.
    for fp in STEP_POINTS {
        for skip in 0..6 {
            let (outcome, fired) = scenario(fp, skip, false).await;
            assert_eq!(outcome, baseline, "after a crash at {fp} (pass {skip})");
            if !fired {
                assert!(skip > 0, "{fp} was never reached");
                break;
            }
            crashed.push(format!("{fp}#{skip}"));
        }
    }
    eprintln!("crashed and recovered at: {crashed:?}");
}

#[tokio::test]
async fn a_fork_whose_answer_was_not_sent_before_a_crash_is_answered_by_the_sweep() {
    let _serial = SERIAL.lock().await;
    failpoint::reset();
    let dir = tempfile::tempdir().unwrap();
    let host = ops_host(dir.path(), false).await;
    let api = host.api();
    let v = api
        .post_ok("/runs", json!({"prompt": "go", "agent": "ops"}))
        .await;
    let run_id = v["runId"].as_str().unwrap().to_owned();
    let cta = api.pending_cta().await["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let answer = json!({"kind": "approval", "approved": true});
    api.post_ok(&format!("/ctas/{cta}/response"), answer).await;
    let done = api.status(&run_id, "completed").await;
    let at = question_seq(&done);
    // The fork is written, then the process dies before its first message (the answer) is
    // sent; the restart's sweep sends it, and the fork completes.
    let mut crash = Crash::arm(host, "fork.after_insert", 0);
    let code = crash
        .request(&format!("/runs/{run_id}/fork"), json!({"atSeq": at}))
        .await;
    assert_eq!(code, 503);
    let runs = crash.api().get_ok("/runs").await;
    let fork = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["runId"] != run_id.as_str())
        .expect("the fork was written")["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let forked = crash.until(&fork, |r| r["status"] == "completed").await;
    assert_eq!(forked["result"], "shipped");
    assert_eq!(forked["forkedFrom"]["runId"], run_id.as_str());
    failpoint::reset();
    crash.host.stop().await;
}

#[tokio::test]
async fn a_crash_while_cancelling_recovers_to_the_fault_free_outcome() {
    let _serial = SERIAL.lock().await;
    let (baseline, _) = scenario("", 0, true).await;
    assert_eq!(baseline.status, "cancelled");
    for (fp, skip) in [
        ("cancel.after_queue", 0),
        // The third step is the cancel's: it settles the CTA, commits, unschedules.
        ("step.before_commit", 2),
        ("step.after_commit", 2),
        ("effect.after_unschedule", 0),
        ("step.before_ack", 2),
    ] {
        let (outcome, fired) = scenario(fp, skip, true).await;
        assert!(fired, "{fp} was never reached");
        assert_eq!(outcome, baseline, "after a crash at {fp} (pass {skip})");
    }
}

#[tokio::test]
async fn every_message_handled_twice_changes_nothing() {
    let _serial = SERIAL.lock().await;
    for cancel in [false, true] {
        let (once, _) = scenario_with("", 0, cancel, false).await;
        let (twice, _) = scenario_with("", 0, cancel, true).await;
        assert_eq!(twice, once, "cancel={cancel}");
    }
    // And every example script, its CTAs answered as they come.
    for name in ["orchestrator.json", "full-flow.json", "plan.json"] {
        let once = drive_example(name, false).await;
        let twice = drive_example(name, true).await;
        assert_eq!(twice, once, "{name}");
        assert_eq!(once.status, "completed", "{name}: {once:#?}");
    }
}

/// Runs an example script to its end, approving, choosing the first option or answering
/// "yes" to each CTA as it comes.
async fn drive_example(name: &str, duplicate: bool) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let h = start_with(
        dir.path(),
        scripted(&examples(name)),
        catalog(None),
        Arc::new(SystemClock),
        duplicate,
    )
    .await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let run = loop {
        let (_, run) = h.get(&format!("/runs/{run_id}")).await;
        if ["completed", "failed", "expired", "cancelled"]
            .contains(&run["status"].as_str().unwrap())
        {
            break run;
        }
        for c in h.pending_ctas().await {
            let answer = match c["kind"].as_str().unwrap() {
                "approval" => json!({"kind": "approval", "approved": true}),
                "choice" => {
                    json!({"kind": "choice", "selectedId": c["options"][0]["id"]})
                }
                _ => json!({"kind": "text", "text": "yes"}),
            };
            let (code, v) = h
                .post(
                    &format!("/ctas/{}/response", c["ctaId"].as_str().unwrap()),
                    answer,
                )
                .await;
            assert_eq!(code, 202, "{v}");
        }
        assert!(Instant::now() < deadline, "{name}: {run:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    while h.server.store.queue_depth().await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "{name}: the queue never drained");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let by_type = events_by_type(&h).await;
    let (_, ctas) = h.get("/ctas?status=all").await;
    let outcome = Outcome {
        timeline: normalize(&run["timeline"], &run_id),
        status: run["status"].clone(),
        events: by_type,
        ctas: {
            let mut c: Vec<Value> = ctas["ctas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| normalize(c, &run_id))
                .collect();
            c.sort_by_key(|v| v.to_string());
            c
        },
    };
    h.server.shutdown().await;
    outcome
}

/// The plan example, crashing at `fp` (after `skip` passes): its outcome, its plan's child
/// runs as they ended (normalized), and whether the failpoint fired.
async fn plan_scenario(fp: &str, skip: u32) -> (Outcome, Vec<Value>, bool) {
    failpoint::reset();
    let dir = tempfile::tempdir().unwrap();
    let mut crash = Crash::arm(plan_host(dir.path()).await, fp, skip);
    let run_id = crash.create(json!({"prompt": "go"})).await;
    let drafted = |r: &Value| r["status"] == "waiting" && r["state"] == "waiting_on_user";
    crash.until(&run_id, |r| drafted(r)).await;
    let cta = crash.api().pending_cta().await["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let approve = json!({"kind": "approval", "approved": true});
    crash
        .request(&format!("/ctas/{cta}/response"), approve)
        .await;
    crash.until(&run_id, |r| r["status"] == "completed").await;
    drain(&mut crash).await;
    let fired = crash.fired();
    failpoint::reset();
    let h = crash.host.h();
    let (_, run) = h.get(&format!("/runs/{run_id}")).await;
    let plan = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "agent_orchestrate")
        .unwrap()["result"]["output"]
        .clone();
    let mut children = Vec::new();
    for step in plan["steps"].as_array().unwrap() {
        for s in step["children"]
            .as_array()
            .cloned()
            .unwrap_or(vec![step.clone()])
        {
            let (_, child) = h
                .get(&format!("/runs/{}", s["exec_id"].as_str().unwrap()))
                .await;
            children.push(json!({
                "status": child["status"],
                "thinks": child["thinks"],
                "timeline": normalize(&child["timeline"], &run_id),
            }));
        }
    }
    let (_, ctas) = h.get("/ctas?status=all").await;
    let outcome = Outcome {
        timeline: normalize(&run["timeline"], &run_id),
        status: run["status"].clone(),
        events: events_by_type(h).await,
        ctas: ctas["ctas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| normalize(c, &run_id))
            .collect(),
    };
    crash.host.stop().await;
    (outcome, children, fired)
}

#[tokio::test]
async fn a_crash_at_any_step_of_a_plan_starts_each_child_once() {
    let _serial = SERIAL.lock().await;
    let (baseline, children, _) = plan_scenario("", 0).await;
    assert_eq!(baseline.status, "completed");
    assert_eq!(baseline.events["plan.step.started"], 3);
    // What docs/plans.md shows of this example's result.
    let plan = baseline.timeline.as_array().unwrap()[2]["result"]["output"].clone();
    assert_eq!(plan["success"], true, "{plan:#}");
    assert_eq!(
        plan["bindings"]["fix"],
        "Added 2 tests for the uncovered endpoints."
    );
    assert_eq!(
        plan["steps"][0]["outputs"]["tests"],
        "Found 4 endpoints and 9 tests."
    );
    assert_eq!(children.len(), 3);
    for c in &children {
        assert_eq!(c["status"], "completed", "{c}");
        assert_eq!(c["thinks"], 1, "each child thought once: {c}");
    }
    let mut crashed = Vec::new();
    // No tool runs in a plan of its own: every other point of a step, and the answer's.
    let points = STEP_POINTS
        .iter()
        .filter(|p| !matches!(**p, "step.before_tool" | "step.after_tool"))
        .chain(&["answer.after_settle", "resolution.after_send"]);
    for fp in points {
        for skip in 0..10 {
            let (outcome, kids, fired) = plan_scenario(fp, skip).await;
            assert_eq!(outcome, baseline, "after a crash at {fp} (pass {skip})");
            assert_eq!(kids, children, "after a crash at {fp} (pass {skip})");
            if !fired {
                assert!(skip > 0, "{fp} was never reached");
                break;
            }
            crashed.push(format!("{fp}#{skip}"));
        }
    }
    eprintln!("plan: crashed and recovered at: {crashed:?}");
}

/// A turn of two tool steps, then one reply per later turn.
const FOLLOW_SCRIPT: &str = r#"{"ops": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
    {"tool_calls": [{"name": "echo", "arguments": {"text": "b"}}]},
    {"text": "turn 1"}, {"text": "turn 2"}, {"text": "turn 3"}, {"text": "turn 4"}]}"#;

/// Posts `texts` as follow-ups, all at once.
async fn post_all(h: &Harness, run_id: &str, texts: &[String]) {
    let path = format!("/runs/{run_id}/messages");
    let replies = match texts {
        [one] => vec![h.post(&path, json!({"text": one})).await],
        [a, b] => {
            let (a, b) = tokio::join!(
                h.post(&path, json!({"text": a})),
                h.post(&path, json!({"text": b}))
            );
            vec![a, b]
        }
        _ => unreachable!("one or two at once"),
    };
    for (code, v) in replies {
        assert_eq!(code, 202, "{v}");
    }
}

/// Waits until the run has ended a turn for every one of `texts` (and its prompt), then
/// checks that each got exactly one turn, in a `user` entry of its own.
async fn every_follow_up_had_one_turn(h: &Harness, run_id: &str, texts: &[String], at: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let run = loop {
        let (_, run) = h.get(&format!("/runs/{run_id}")).await;
        let turns = of_type(&run, "user").len();
        if run["status"] == "completed" && turns == texts.len() + 1 {
            break run;
        }
        assert!(Instant::now() < deadline, "{at}: stranded: {run:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for t in texts {
        let n = of_type(&run, "user")
            .iter()
            .filter(|e| e["text"] == t.as_str())
            .count();
        assert_eq!(n, 1, "{at}: {t} had {n} turns: {run:#}");
    }
    assert!(run.get("queued").is_none(), "{at}: {run:#}");
    let last = format!("turn {}", texts.len() + 1);
    assert_eq!(run["result"], last.as_str(), "{at}: {run:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_up_at_any_point_of_a_turn_gets_exactly_one_turn() {
    let _serial = SERIAL.lock().await;
    let catalog = || catalog(Some(json!({"agents": {"ops": {"tools": ["echo"]}}})));
    // Every point between one step's commit and the next one's, at each pass the turn
    // makes through it (three steps: start, and a continue after each tool step).
    let mut probes: Vec<(&str, u32)> = Vec::new();
    for fp in [
        "step.after_commit",
        "step.before_ack",
        "step.before_think",
        "step.before_tool",
    ] {
        let passes = if fp == "step.before_tool" { 2 } else { 3 };
        probes.extend((0..passes).map(|skip| (fp, skip)));
    }
    for (fp, skip) in probes {
        // One follow-up there, then (sequentially) one more; then two at once.
        for concurrent in [false, true] {
            failpoint::reset();
            let dir = tempfile::tempdir().unwrap();
            let h = start(dir.path(), scripted(FOLLOW_SCRIPT), catalog()).await;
            let gate = failpoint::pause(fp, skip);
            let run_id = h.create_run(json!({"prompt": "go", "agent": "ops"})).await;
            let reached = tokio::time::timeout(Duration::from_secs(20), gate.reached())
                .await
                .is_ok();
            let at = format!("{fp}#{skip} concurrent={concurrent}");
            assert!(reached, "{at} was never reached");
            let texts: Vec<String> = if concurrent {
                let both = vec![format!("{at} one"), format!("{at} two")];
                post_all(&h, &run_id, &both).await;
                gate.release();
                both
            } else {
                let first = vec![format!("{at} one")];
                post_all(&h, &run_id, &first).await;
                gate.release();
                // The second after the first has been taken in (queued or turned).
                tokio::time::sleep(Duration::from_millis(30)).await;
                let second = vec![format!("{at} two")];
                post_all(&h, &run_id, &second).await;
                [first, second].concat()
            };
            every_follow_up_had_one_turn(&h, &run_id, &texts, &at).await;
            h.server.shutdown().await;
        }
    }
    failpoint::reset();

    // While a CTA waits, and after the run completed: the same.
    let dir = tempfile::tempdir().unwrap();
    let script = SCRIPT.replace(
        r#"{"text": "and again"}"#,
        r#"{"text": "and again"}, {"text": "third"}, {"text": "fourth"}"#,
    );
    // A model that takes its time, as real ones do: a turn is under way for a while.
    struct Slow(Arc<dyn baton_core::llm::Llm>);
    #[async_trait::async_trait]
    impl baton_core::llm::Llm for Slow {
        async fn complete(
            &self,
            r: &baton_core::llm::ChatRequest<'_>,
        ) -> Result<baton_core::llm::LlmReply, baton_core::llm::LlmError> {
            tokio::time::sleep(Duration::from_millis(300)).await;
            self.0.complete(r).await
        }
    }
    let slow = Arc::new(Slow(scripted(&script)));
    let h = start(dir.path(), slow, ops()).await;
    let run_id = h.create_run(json!({"prompt": "go", "agent": "ops"})).await;
    let cta = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (code, v) = h
        .post(
            &format!("/runs/{run_id}/messages"),
            json!({"text": "while waiting"}),
        )
        .await;
    assert_eq!((code, &v["queued"]), (202, &json!(true)), "{v}");
    let (code, v) = h
        .post(
            &format!("/ctas/{cta}/response"),
            json!({"kind": "approval", "approved": true}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    let run = h.wait_status(&run_id, &["completed"]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut run = run;
    while of_type(&run, "user").len() < 2 {
        assert!(Instant::now() < deadline, "{run:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        run = h.get(&format!("/runs/{run_id}")).await.1;
    }
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(run["result"], "and again", "{run:#}");
    // Two back to back on the finished run: the first starts its next turn, the second
    // waits for it, and each reply says which.
    let path = format!("/runs/{run_id}/messages");
    let (_, first) = h.post(&path, json!({"text": "first after"})).await;
    let (_, second) = h.post(&path, json!({"text": "second after"})).await;
    assert_eq!(
        (&first["queued"], &second["queued"]),
        (&json!(false), &json!(true)),
        "{first} {second}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut run = run;
    while of_type(&run, "user").len() < 4 || run["status"] != "completed" {
        assert!(Instant::now() < deadline, "{run:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        run = h.get(&format!("/runs/{run_id}")).await.1;
    }
    for text in ["while waiting", "first after", "second after"] {
        let turns = of_type(&run, "user")
            .iter()
            .filter(|e| e["text"] == text)
            .count();
        assert_eq!(turns, 1, "{text}: {run:#}");
    }
    h.server.shutdown().await;
}

/// The events of a run's stream until `done` says stop (or 30 s pass), as `(event, data)`.
async fn stream_until(
    resp: &mut reqwest::Response,
    reader: &mut baton_llm::sse::SseReader,
    seen: &mut Vec<(String, Value)>,
    done: impl Fn(&[(String, Value)]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, resp.chunk())
            .await
            .unwrap_or_else(|_| panic!("the stream stalled: {seen:#?}"))
            .unwrap()
            .expect("the stream stays open");
        for e in reader.push(&chunk) {
            let data = serde_json::from_str(&e.data).unwrap();
            seen.push((e.event.unwrap_or_default(), data));
        }
    }
}

#[tokio::test]
async fn a_crash_mid_stream_leaves_no_streamed_text_in_the_timeline() {
    let _serial = SERIAL.lock().await;
    failpoint::reset();
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"writer": [
        {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Write it?"}}]},
        {"text": "The answer is forty-two, as computed."}]}"#;
    let agents = json!({"agents": {"writer": {"tools": ["request_human_feedback"]}}});
    let h = start(dir.path(), scripted(script), catalog(Some(agents))).await;
    let run_id = h
        .create_run(json!({"prompt": "the answer?", "agent": "writer"}))
        .await;
    let cta = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut resp = h.follow(&run_id).await;
    let (mut reader, mut seen) = (baton_llm::sse::SseReader::default(), Vec::new());
    let status_is = |s: &str| {
        let s = s.to_owned();
        move |seen: &[(String, Value)]| seen.iter().any(|(e, d)| e == "run" && d["status"] == s)
    };
    stream_until(&mut resp, &mut reader, &mut seen, status_is("waiting")).await;
    // The model streams its reply, and the process dies before the step commits it (the
    // one write between a reply and its commit: the model is asked again).
    failpoint::arm("step.before_commit", 0);
    h.post(
        &format!("/ctas/{cta}/response"),
        json!({"kind": "approval", "approved": true}),
    )
    .await;
    stream_until(&mut resp, &mut reader, &mut seen, status_is("completed")).await;
    assert!(failpoint::fired("step.before_commit"));
    let reply = "The answer is forty-two, as computed.";
    // The timeline holds the reply once, as committed: nothing of the lost attempt.
    let (_, run) = h.get(&format!("/runs/{run_id}")).await;
    let texts: Vec<&Value> = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "assistant")
        .filter_map(|e| e.get("text"))
        .collect();
    assert_eq!(texts, [reply]);
    // The stream showed both attempts, each whole, under different attempt ids; a client
    // that keeps the last attempt's text and lets the entry replace it ends with the reply.
    let seq = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["text"] == reply)
        .unwrap()["seq"]
        .clone();
    let mut attempts: Vec<(String, String)> = Vec::new();
    let mut shown = String::new();
    for (event, data) in &seen {
        match event.as_str() {
            "delta" if data["seq"] == seq => {
                let attempt = data["attempt"].as_str().unwrap().to_owned();
                if attempts.last().is_none_or(|(a, _)| *a != attempt) {
                    attempts.push((attempt, String::new()));
                    shown.clear();
                }
                attempts.last_mut().unwrap().1 += data["text"].as_str().unwrap();
                shown += data["text"].as_str().unwrap();
            }
            "entry" if data["seq"] == seq => shown = data["text"].as_str().unwrap().to_owned(),
            _ => {}
        }
    }
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert!(
        attempts.iter().all(|(_, text)| text == reply),
        "{attempts:?}"
    );
    assert_eq!(shown, reply);
    failpoint::reset();
}

/// Ready before serving: a host held in its start, its port bound but links not yet set
/// up, answers no request (the kernel holds the connection); once it goes on, the request
/// made meanwhile finds links on. (Before, `baton dev` served first and set links up after:
/// a link asked for at that instant was a 409 `links_off`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_host_serves_nothing_until_it_is_set_up() {
    let _serial = SERIAL.lock().await;
    failpoint::reset();
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"orchestrator": [{"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "?"}}]}]}"#;
    let h = start_scripted(dir.path(), script).await;
    h.create_run(json!({"prompt": "ask"})).await;
    let cta = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    h.server.shutdown().await;

    let port = common::python::free_port();
    let gate = failpoint::pause("host.before_links", 0);
    let data_dir = dir.path().to_path_buf();
    let starting = tokio::spawn(baton_dev::LocalServer::start(baton_dev::LocalOptions {
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        token: Some(TOKEN.into()),
        worker: Default::default(),
        ..baton_dev::LocalOptions::new(data_dir, scripted(script), catalog(None))
    }));
    tokio::time::timeout(Duration::from_secs(30), gate.reached())
        .await
        .expect("the start reached its links");
    let url = format!("http://127.0.0.1:{port}/ctas/{cta}/link");
    let asking = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(url)
            .bearer_auth(TOKEN)
            .json(&json!({}))
            .send()
            .await
            .expect("the bound port takes the connection");
        let code = r.status().as_u16();
        (code, r.json::<Value>().await.unwrap_or(Value::Null))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!asking.is_finished(), "answered before links were set up");
    gate.release();
    let server = starting.await.unwrap().unwrap();
    let (code, v) = asking.await.unwrap();
    assert_eq!(code, 200, "{v}");
    server.shutdown().await;
    failpoint::reset();
}
