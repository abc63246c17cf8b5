//! The crash points of `crashes.rs`, over AWS APIs (an emulator, with or without the fault
//! layer: `common/aws.rs`): each failpoint crashed at, the
//! functions "restarted" (a new host over the same table and queues), the sweep's tick
//! run as the scheduled rule would, and the outcome checked against the fault-free run.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_aws::provision::Names;
use baton_core::failpoint;
use baton_core::ports::SystemClock;
use baton_dev::aws_host::{AwsDevOptions, AwsDevServer};
use common::aws::{Emulator, api_call, patience};
use common::*;
use serde_json::{Value, json};

const SCRIPT: &str = r#"{"ops": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "ship?"}}]},
    {"text": "shipped"}]}"#;

/// Failpoints are process-wide: the crash tests take turns.
use crate::FAILPOINTS as SERIAL;

async fn host(aws: &Emulator, names: &Names) -> AwsDevServer {
    host_with(aws, names, SCRIPT).await
}

/// A host over the resources `names` names (a restarted one over the same): creating them
/// meets no faults, the host's calls after that do.
async fn host_with(aws: &Emulator, names: &Names, script: &str) -> AwsDevServer {
    host_timed(aws, names, script, None).await
}

/// [`host_with`], each function's invocations ended at most `timeout` in.
async fn host_timed(
    aws: &Emulator,
    names: &Names,
    script: &str,
    timeout: Option<Duration>,
) -> AwsDevServer {
    let mut names = names.clone();
    // A message a crash leaves in flight comes back after this, not after 30 s.
    names.visibility_timeout = 2;
    aws.turn_off();
    let host = AwsDevServer::start(AwsDevOptions {
        sdk: aws.host_sdk().await,
        names,
        scheduler_role_arn: "arn:aws:iam::123456789012:role/crash-scheduler".into(),
        addr: "127.0.0.1:0".parse().unwrap(),
        token: TOKEN.into(),
        llm: scripted(script),
        catalog: catalog(Some(
            json!({"agents": {"ops": {"tools": ["echo", "request_human_feedback"]}}}),
        )),
        clock: Arc::new(SystemClock),
        duplicate: false,
        function_timeout: timeout,
        steps_at_once: None,
        live: None,
        links: None,
        traces: None,
    })
    .await
    .unwrap();
    aws.turn_on();
    host
}

async fn call(
    s: &AwsDevServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let busy = common::aws::scenario_faults().is_some();
    let http = reqwest::Client::new();
    api_call(&http, &s.url(), busy, method, path, body.as_ref()).await
}

/// Starts a run of `ops`; its id.
async fn start_run(s: &AwsDevServer) -> String {
    let (code, v) = call(
        s,
        reqwest::Method::POST,
        "/runs",
        Some(json!({"prompt": "go", "agent": "ops"})),
    )
    .await;
    assert_eq!(code, 202, "{v}");
    v["runId"].as_str().unwrap().to_owned()
}

/// The sweep's tick, as its scheduled rule runs it: a tick that meets a throttle (under the
/// fault layer) fails and the next tick runs it again.
async fn sweep(s: &AwsDevServer) {
    for tick in 1.. {
        match s.sweep(chrono::Duration::zero()).await {
            Ok(_) => return,
            Err(e) if e.is_retryable() && tick < 20 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the sweep failed {tick} times: {e}"),
        }
    }
}

/// Runs the scenario with `fp` armed; returns the normalized timeline, the run's status and
/// the CTA's, and whether the failpoint fired.
async fn scenario(aws: &Emulator, prefix: &str, fp: &str, skip: u32) -> (Value, bool) {
    failpoint::reset();
    let names = aws.names(prefix);
    let mut s = host(aws, &names).await;
    if !fp.is_empty() {
        failpoint::arm(fp, skip);
    }
    let mut restarted = false;
    // A crash: the host stops (what it received and failed goes back to its queue), a new
    // one starts, and the sweep's tick repairs what was committed but not performed.
    macro_rules! restart_if_fired {
        () => {
            if failpoint::fired(fp) && !restarted {
                s.shutdown().await;
                s = host(aws, &names).await;
                sweep(&s).await;
                restarted = true;
            }
        };
    }
    let (code, v) = call(
        &s,
        reqwest::Method::POST,
        "/runs",
        Some(json!({"prompt": "go", "agent": "ops"})),
    )
    .await;
    let run_id = if code == 202 {
        v["runId"].as_str().unwrap().to_owned()
    } else {
        assert!(failpoint::fired(fp), "{code} {v}");
        restart_if_fired!();
        String::new()
    };
    let deadline = Instant::now() + patience(Duration::from_secs(60));
    let mut answered = false;
    let mut run_id = run_id;
    loop {
        restart_if_fired!();
        let (_, ctas) = call(&s, reqwest::Method::GET, "/ctas?status=all", None).await;
        let ctas = ctas["ctas"].as_array().cloned().unwrap_or_default();
        if run_id.is_empty()
            && let Some(c) = ctas.first()
        {
            run_id = c["runId"].as_str().unwrap().to_owned();
        }
        if !answered && let Some(c) = ctas.iter().find(|c| c["status"] == "pending") {
            let (code, v) = call(
                &s,
                reqwest::Method::POST,
                &format!("/ctas/{}/response", c["ctaId"].as_str().unwrap()),
                Some(json!({"kind": "approval", "approved": true})),
            )
            .await;
            assert!(
                code == 202 || (code == 503 && failpoint::fired(fp)),
                "{fp}: {code} {v}"
            );
            answered = true;
            continue;
        }
        if !run_id.is_empty() {
            let (_, run) = call(&s, reqwest::Method::GET, &format!("/runs/{run_id}"), None).await;
            if run["status"] == "completed" && failpoint::fired(fp) == restarted {
                let out = json!({
                    "timeline": normalize(&run["timeline"], &run_id),
                    "status": run["status"],
                    "ctas": ctas.iter().map(|c| normalize(c, &run_id)).collect::<Vec<_>>(),
                });
                // The host stops only once what it holds is handled: a crash in the last
                // step's tail (after its commit, before its ack) shows only now.
                s.shutdown().await;
                if failpoint::fired(fp) && !restarted {
                    s = host(aws, &names).await;
                    sweep(&s).await;
                    restarted = true;
                    continue;
                }
                failpoint::reset();
                return (out, restarted);
            }
        }
        assert!(Instant::now() < deadline, "{fp}#{skip}: stuck");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_crash_points_recover_to_the_fault_free_outcome_over_aws_apis() {
    let _serial = SERIAL.lock().await;
    let aws = Emulator::scenario().await;
    let (baseline, _) = scenario(&aws, "base", "", 0).await;
    assert_eq!(baseline["status"], "completed");
    let points = [
        ("create.after_insert", 0),
        ("answer.after_settle", 0),
        ("resolution.after_send", 0),
        ("step.after_think", 0),
        ("step.after_think", 2),
        ("step.after_tool", 0),
        ("step.before_commit", 1),
        ("step.after_commit", 1),
        ("effect.after_send", 1),
        ("effect.after_publish", 1),
        ("effect.after_schedule", 0),
        ("effect.after_unschedule", 0),
        ("step.before_ack", 0),
        ("step.before_ack", 2),
    ];
    for (i, (fp, skip)) in points.into_iter().enumerate() {
        let (outcome, fired) = scenario(&aws, &format!("c{i}"), fp, skip).await;
        assert!(fired, "{fp}#{skip} was never reached");
        assert_eq!(outcome, baseline, "after a crash at {fp}#{skip}");
    }
}

/// Posts each of `texts` as a follow-up to `run_id`, all at once.
async fn post_all(s: &AwsDevServer, run_id: &str, texts: &[String]) {
    let path = format!("/runs/{run_id}/messages");
    let post = |t: &String| call(s, reqwest::Method::POST, &path, Some(json!({"text": t})));
    let replies = match texts {
        [one] => vec![post(one).await],
        [a, b] => {
            let (a, b) = tokio::join!(post(a), post(b));
            vec![a, b]
        }
        _ => unreachable!("one or two at once"),
    };
    for (code, v) in replies {
        assert_eq!(code, 202, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_up_between_two_steps_gets_exactly_one_turn_over_aws_apis() {
    let _serial = SERIAL.lock().await;
    let aws = Emulator::scenario().await;
    // A tool step, then a reply; one reply per later turn.
    let script = r#"{"ops": [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
        {"text": "turn 1"}, {"text": "turn 2"}, {"text": "turn 3"}]}"#;
    let probes = [
        ("step.after_commit", 0, false),
        ("step.after_commit", 0, true),
        ("step.before_ack", 0, false),
        ("step.before_think", 1, true),
        ("step.before_tool", 0, false),
    ];
    for (i, (fp, skip, concurrent)) in probes.into_iter().enumerate() {
        failpoint::reset();
        let s = host_with(&aws, &aws.names(&format!("f{i}")), script).await;
        let gate = failpoint::pause(fp, skip);
        let run_id = start_run(&s).await;
        let reached = tokio::time::timeout(Duration::from_secs(30), gate.reached())
            .await
            .is_ok();
        let at = format!("{fp}#{skip} concurrent={concurrent}");
        assert!(reached, "{at} was never reached");
        let texts: Vec<String> = if concurrent {
            vec![format!("{at} one"), format!("{at} two")]
        } else {
            vec![format!("{at} one")]
        };
        post_all(&s, &run_id, &texts).await;
        gate.release();
        let deadline = Instant::now() + patience(Duration::from_secs(60));
        let run = loop {
            let (_, run) = call(&s, reqwest::Method::GET, &format!("/runs/{run_id}"), None).await;
            if run["status"] == "completed" && of_type(&run, "user").len() == texts.len() + 1 {
                break run;
            }
            assert!(Instant::now() < deadline, "{at}: stranded: {run:#}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for t in &texts {
            let n = of_type(&run, "user")
                .iter()
                .filter(|e| e["text"] == t.as_str())
                .count();
            assert_eq!(n, 1, "{at}: {t}: {run:#}");
        }
        assert_eq!(
            run["result"],
            format!("turn {}", texts.len() + 1).as_str(),
            "{at}: {run:#}"
        );
        s.shutdown().await;
    }
    failpoint::reset();
}

/// The stand-in ends an invocation at its function's timeout, as Lambda does: a step held in
/// its tool call past a 3 s timeout is ended there (its future dropped), its batch comes back
/// after the queue's visibility timeout with its receive count raised, and the run goes on
/// to complete with one result for the call — nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invocation_past_its_timeout_is_ended_mid_tool_and_its_run_goes_on() {
    let _serial = SERIAL.lock().await;
    failpoint::reset();
    let aws = Emulator::scenario().await;
    let script = r#"{"ops": [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
        {"text": "done"}]}"#;
    let s = host_timed(
        &aws,
        &aws.names("ended"),
        script,
        Some(Duration::from_secs(3)),
    )
    .await;
    let gate = failpoint::pause("step.before_tool", 0);
    let run_id = start_run(&s).await;
    tokio::time::timeout(Duration::from_secs(30), gate.reached())
        .await
        .expect("the step reached its tool call");
    // Held there past the function's timeout: the invocation is ended.
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.invocations_ended() == 0 {
        assert!(Instant::now() < deadline, "the invocation was never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gate.release();
    let deadline = Instant::now() + patience(Duration::from_secs(60));
    let run = loop {
        let (_, run) = call(&s, reqwest::Method::GET, &format!("/runs/{run_id}"), None).await;
        if run["status"] == "completed" {
            break run;
        }
        assert!(Instant::now() < deadline, "stuck: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let tools: Vec<&Value> = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool")
        .collect();
    assert_eq!(tools.len(), 1, "{run}");
    assert_eq!(tools[0]["result"]["status"], "success", "{run}");
    assert_eq!(run["result"], "done");
    assert!(s.invocations_ended() >= 1);
    s.shutdown().await;
    failpoint::reset();
}
