//! The crash points of `crashes.rs`, over AWS APIs (an emulator, with or without the fault
//! layer: `common/aws.rs`): each failpoint crashed at, the
//! functions "restarted" (a new host over the same table and queues), the sweep's tick
//! run as the scheduled rule would, and the outcome checked against the fault-free run.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_aws::provision::Names;
use baton_core::failpoint;
use common::aws::{Api, Emulator};
use common::host::{AwsHost, Crash, TestHost};
use common::*;
use serde_json::{Value, json};

const SCRIPT: &str = r#"{"ops": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "ship?"}}]},
    {"text": "shipped"}]}"#;

/// Failpoints are process-wide: the crash tests take turns.
use crate::FAILPOINTS as SERIAL;

/// `baton dev --aws` over the resources `names` names, thinking from `script`, each
/// function's invocations ended at most `timeout` in ([`CRASHED_BACK`]'s when none);
/// restarted over the same resources after a crash.
async fn host(
    aws: &Arc<Emulator>,
    names: &Names,
    script: &str,
    timeout: Option<Duration>,
) -> AwsHost {
    let mut names = names.clone();
    // A message received but not yet held comes back after this, not after 30 s.
    names.visibility_timeout = 2;
    let agents = json!({"agents": {"ops": {"tools": ["echo", "request_human_feedback"]}}});
    let mut options = aws
        .dev_options(names, scripted(script), catalog(Some(agents)), 0)
        .await;
    options.function_timeout = Some(timeout.unwrap_or(CRASHED_BACK));
    options.links = None;
    AwsHost::start(aws.clone(), options).await
}

/// The functions' timeout in these tests: a crashed invocation's records stay hidden for
/// twice it (`baton_lambda::hold_for`), as they would on AWS, so that a crash is recovered
/// from within the API's patience, not after the 120 s a function of 60 s or more holds.
const CRASHED_BACK: Duration = Duration::from_secs(10);

/// Starts a run of `ops`; its id.
async fn start_run(api: &Api) -> String {
    let v = api
        .post_ok("/runs", json!({"prompt": "go", "agent": "ops"}))
        .await;
    v["runId"].as_str().unwrap().to_owned()
}

/// Runs the scenario with `fp` armed; returns the normalized timeline, the run's status and
/// the CTA's, and whether the host was restarted.
async fn scenario(aws: &Arc<Emulator>, prefix: &str, fp: &str, skip: u32) -> (Value, bool) {
    failpoint::reset();
    let host = host(aws, &aws.names(prefix), SCRIPT, None).await;
    let mut crash = Crash::arm(host, fp, skip);
    let run_id = crash.create(json!({"prompt": "go", "agent": "ops"})).await;
    let parked = |r: &Value| r["status"] == "waiting" && r["state"] == "waiting_on_user";
    crash.until(&run_id, |r| parked(r)).await;
    let cta = crash.api().pending_cta().await["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let approve = json!({"kind": "approval", "approved": true});
    crash
        .request(&format!("/ctas/{cta}/response"), approve)
        .await;
    loop {
        let run = crash.until(&run_id, |r| r["status"] == "completed").await;
        let ctas = crash.api().get_ok("/ctas?status=all").await;
        let ctas = ctas["ctas"].as_array().cloned().unwrap_or_default();
        let out = json!({
            "timeline": normalize(&run["timeline"], &run_id),
            "status": run["status"],
            "ctas": ctas.iter().map(|c| normalize(c, &run_id)).collect::<Vec<_>>(),
        });
        // The host stops only once what it holds is handled: a crash in the last step's
        // tail (after its commit, before its ack) shows only now.
        crash.host.stop().await;
        if crash.restart_if_fired().await {
            continue;
        }
        failpoint::reset();
        return (out, crash.restarted);
    }
}

#[tokio::test]
async fn the_crash_points_recover_to_the_fault_free_outcome_over_aws_apis() {
    let _serial = SERIAL.lock().await;
    let aws = Arc::new(Emulator::scenario().await);
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

/// A crash between a run item's tail copied to its segment and the commit that drops it
/// from the item (store format 3: `baton-aws`'s `dynamo/tail.rs`) loses and repeats
/// nothing: a run of eight echo calls of 700 bytes, whose entries fill the tail several times,
/// crashed at the first and at the second copy, ends as the run without a crash did. (How
/// often a tail is copied depends on the run item's size, which a step's noted failure
/// grows: under the fault layer eight calls of 400 bytes were copied as few as once.)
#[tokio::test]
async fn a_crash_between_a_tail_copy_and_its_commit_recovers_over_aws_apis() {
    let _serial = SERIAL.lock().await;
    let aws = Arc::new(Emulator::scenario().await);
    // Text that deflate cannot shrink much, so that the tail fills in a few steps.
    let text = |seed: u64| -> String {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..700)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (b'a' + (x % 26) as u8) as char
            })
            .collect()
    };
    let mut turns: Vec<Value> = (0..8)
        .map(|i| json!({"tool_calls": [{"name": "echo", "arguments": {"text": text(i)}}]}))
        .collect();
    turns.push(json!({"text": "echoed"}));
    let script = json!({"ops": turns}).to_string();
    let outcome = async |prefix: &str, fp: &str, skip: u32| -> (Value, bool) {
        failpoint::reset();
        let host = host(&aws, &aws.names(prefix), &script, None).await;
        let mut crash = Crash::arm(host, fp, skip);
        let run_id = crash.create(json!({"prompt": "go", "agent": "ops"})).await;
        loop {
            let run = crash.until(&run_id, |r| r["status"] == "completed").await;
            let out = json!({
                "timeline": normalize(&run["timeline"], &run_id),
                "status": run["status"],
            });
            crash.host.stop().await;
            if crash.restart_if_fired().await {
                continue;
            }
            let fired = failpoint::fired(fp);
            failpoint::reset();
            return (out, fired);
        }
    };
    let (baseline, _) = outcome("tail-base", "", 0).await;
    assert_eq!(baseline["status"], "completed");
    let echoes = baseline["timeline"]
        .as_array()
        .map_or(0, |t| t.iter().filter(|e| e["name"] == "echo").count());
    assert_eq!(echoes, 8, "{baseline}");
    for skip in [0, 1] {
        let (crashed, fired) =
            outcome(&format!("tail-{skip}"), "store.after_tail_copy", skip).await;
        assert!(fired, "store.after_tail_copy#{skip} was never reached");
        assert_eq!(
            crashed, baseline,
            "after a crash at store.after_tail_copy#{skip}"
        );
    }
}

/// Posts each of `texts` as a follow-up to `run_id`, all at once.
async fn post_all(api: &Api, run_id: &str, texts: &[String]) {
    let path = format!("/runs/{run_id}/messages");
    let post = |t: &String| api.post_ok(&path, json!({"text": t}));
    match texts {
        [one] => {
            post(one).await;
        }
        [a, b] => {
            tokio::join!(post(a), post(b));
        }
        _ => unreachable!("one or two at once"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_up_between_two_steps_gets_exactly_one_turn_over_aws_apis() {
    let _serial = SERIAL.lock().await;
    let aws = Arc::new(Emulator::scenario().await);
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
        let mut host = host(&aws, &aws.names(&format!("f{i}")), script, None).await;
        let api = host.api().clone();
        let gate = failpoint::pause(fp, skip);
        let run_id = start_run(&api).await;
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
        post_all(&api, &run_id, &texts).await;
        gate.release();
        let path = format!("/runs/{run_id}");
        let run = api
            .wait(&format!("{at}: the run's turns"), async |api: &Api| {
                let run = api.get_ok(&path).await;
                (run["status"] == "completed" && of_type(&run, "user").len() == texts.len() + 1)
                    .then_some(run)
            })
            .await;
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
        host.stop().await;
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
    let aws = Arc::new(Emulator::scenario().await);
    let script = r#"{"ops": [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
        {"text": "done"}]}"#;
    let timeout = Some(Duration::from_secs(3));
    let mut host = host(&aws, &aws.names("ended"), script, timeout).await;
    let api = host.api().clone();
    let gate = failpoint::pause("step.before_tool", 0);
    let run_id = start_run(&api).await;
    tokio::time::timeout(Duration::from_secs(30), gate.reached())
        .await
        .expect("the step reached its tool call");
    // Held there past the function's timeout: the invocation is ended.
    let deadline = Instant::now() + Duration::from_secs(30);
    while host.server().invocations_ended() == 0 {
        assert!(Instant::now() < deadline, "the invocation was never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gate.release();
    let run = api.status(&run_id, "completed").await;
    let tools: Vec<&Value> = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool")
        .collect();
    assert_eq!(tools.len(), 1, "{run}");
    assert_eq!(tools[0]["result"]["status"], "success", "{run}");
    assert_eq!(run["result"], "done");
    assert!(host.server().invocations_ended() >= 1);
    host.stop().await;
    failpoint::reset();
}

/// A crashed invocation hides its batch for minutes, not the queue's visibility timeout: the
/// step functions hold their records hidden a little at a time while they work
/// (`baton_lambda::holding`: twice a 3 s timeout here, at most two minutes on AWS), so a
/// batch whose invocation ended at its timeout comes back within that, on a queue whose own
/// visibility timeout (120 s here, 90 minutes on AWS) would have hidden it far longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_invocation_hides_its_batch_for_its_hold_not_the_queue_timeout() {
    let _serial = SERIAL.lock().await;
    failpoint::reset();
    let aws = Arc::new(Emulator::start_with(None).await);
    let script = r#"{"ops": [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
        {"text": "done"}]}"#;
    let mut names = aws.names("held");
    names.visibility_timeout = 120;
    let agents = json!({"agents": {"ops": {"tools": ["echo", "request_human_feedback"]}}});
    let mut options = aws
        .dev_options(names, scripted(script), catalog(Some(agents)), 0)
        .await;
    options.function_timeout = Some(Duration::from_secs(3));
    options.links = None;
    let mut host = AwsHost::start(aws.clone(), options).await;
    let api = host.api().clone();
    let gate = failpoint::pause("step.before_tool", 0);
    let run_id = start_run(&api).await;
    tokio::time::timeout(Duration::from_secs(30), gate.reached())
        .await
        .expect("the step reached its tool call");
    let deadline = Instant::now() + Duration::from_secs(30);
    while host.server().invocations_ended() == 0 {
        assert!(Instant::now() < deadline, "the invocation was never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended = Instant::now();
    gate.release();
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "done");
    let back = ended.elapsed();
    assert!(
        back < Duration::from_secs(30),
        "the batch came back {back:?} after its invocation ended"
    );
    // Its hold cost requests: one at each invocation's start, at least.
    let billed = host.server().billed();
    assert!(billed.mapping_sqs_requests > 0);
    host.stop().await;
    failpoint::reset();
}
