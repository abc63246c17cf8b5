//! A follow-up is written, then sent: a request that dies in between leaves what it wrote.
//! On both hosts, each such write crashed at: the place the follow-up took under its run's
//! cap comes back by rule (one its run never took up, fifteen minutes on), its turn's
//! active-run slot is never taken before the commit that starts the turn, and a follow-up
//! that finds no slot free there is refused in the timeline, the run left as it ended.

use crate::common;

use std::sync::Arc;

use baton_core::failpoint;
use baton_core::ports::ManualClock;
use common::aws::{Api, Emulator};
use common::host::{AwsHost, LocalHost, TestHost};
use common::*;
use serde_json::{Value, json};

use crate::FAILPOINTS as SERIAL;

/// `talker` answers each turn; `asker` asks a question first (and is active until it is
/// answered).
const SCRIPT: &str = r#"{
    "talker": [{"text": "first"}, {"text": "second"}],
    "asker": [
        {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "go?"}}]},
        {"text": "asked"},
        {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "go?"}}]},
        {"text": "asked"}]}"#;

fn agents() -> Value {
    json!({"agents": {
        "talker": {"tools": []},
        "asker": {"tools": ["request_human_feedback"]},
    }})
}

/// One active run per owner.
fn quotas() -> baton_core::service::Quotas {
    baton_core::service::Quotas {
        active_runs: Some(1),
        ..Default::default()
    }
}

async fn local(dir: &std::path::Path, clock: Arc<ManualClock>) -> LocalHost {
    let mut options = local_options(dir, scripted(SCRIPT), catalog(Some(agents())), clock);
    options.quotas = quotas();
    LocalHost::start(options).await
}

/// Through the fault layer's DynamoDB isolation alone (the writes to an item one at a
/// time, as `Emulator::start_with(None)` puts in front of every emulator), without its
/// random faults: their 503s are tried again, and a
/// request that dies here must not be.
async fn aws(prefix: &str, clock: Arc<ManualClock>) -> AwsHost {
    let aws = Arc::new(Emulator::start_with(None).await);
    let mut names = aws.names(prefix);
    names.visibility_timeout = 2;
    let mut options = aws
        .dev_options(names, scripted(SCRIPT), catalog(Some(agents())), 0)
        .await;
    options.clock = clock;
    options.quotas = quotas();
    options.links = None;
    AwsHost::start(aws, options).await
}

/// Starts a run of `agent` and waits for it to complete (`talker`) or ask (`asker`).
async fn start(api: &Api, agent: &str) -> String {
    let v = api
        .post_ok("/runs", json!({"prompt": "go", "agent": agent}))
        .await;
    let run_id = v["runId"].as_str().unwrap().to_owned();
    if agent == "asker" {
        api.wait("its question", async |api: &Api| {
            let (_, v) = api.get("/ctas?status=pending").await;
            v["ctas"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["runId"] == run_id.as_str()).cloned())
        })
        .await;
    } else {
        api.status(&run_id, "completed").await;
    }
    run_id
}

/// The owner's active runs, once they are `n`.
async fn active_is(api: &Api, n: u32) {
    api.wait(&format!("{n} active runs"), async |api: &Api| {
        let usage = api.get_ok("/usage").await;
        (usage["activeRuns"]["current"] == n).then_some(())
    })
    .await;
}

async fn places_and_slots_come_back(mut host: impl TestHost, clock: Arc<ManualClock>) {
    failpoint::reset();
    let run_id = start(host.api(), "talker").await;
    let path = format!("/runs/{run_id}/messages");
    // Ten follow-ups, each request dying once its follow-up is admitted and none tried
    // again: the run's ten places are taken, and nothing reached it.
    for i in 0..10 {
        failpoint::arm("message.after_admit", 0);
        let (code, v) = host
            .api()
            .post(&path, json!({"text": format!("lost {i}")}))
            .await;
        assert_eq!(code, 503, "{v}");
    }
    host.restart().await;
    let (code, v) = host.api().post(&path, json!({"text": "more"})).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("queue_full")),
        "{v}"
    );
    // None of them took the owner's one active-run slot: another run takes it.
    let asker = start(host.api(), "asker").await;
    active_is(host.api(), 1).await;
    // Fifteen minutes on, the places of the ten that never reached the run are given back:
    // the next follow-up is admitted, and refused for the slot the asker holds.
    clock.advance(chrono::Duration::minutes(16));
    let (code, v) = host.api().post(&path, json!({"text": "more"})).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{v}"
    );
    let cta = host.api().pending_cta().await["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    host.api()
        .post_ok(
            &format!("/ctas/{cta}/response"),
            json!({"kind": "approval", "approved": true}),
        )
        .await;
    host.api().status(&asker, "completed").await;
    active_is(host.api(), 0).await;
    // The claim on the run's next turn written, then the request dies: sent again (its
    // key), the follow-up starts the turn once, and its slot is back when it ends.
    failpoint::arm("message.after_claim", 0);
    let more = json!({"text": "more"});
    let (code, v) = host.api().post_keyed(&path, more.clone(), "more-1").await;
    assert_eq!(code, 503, "{v}");
    host.restart().await;
    let (code, v) = host.api().post_keyed(&path, more, "more-1").await;
    assert_eq!(code, 202, "{v}");
    let run = host
        .api()
        .wait("the follow-up's turn", async |api: &Api| {
            let run = api.get_ok(&format!("/runs/{run_id}")).await;
            (run["status"] == "completed" && run["result"] == "second").then_some(run)
        })
        .await;
    let users = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "user")
        .count();
    assert_eq!(
        users, 2,
        "the prompt and one follow-up: {}",
        run["timeline"]
    );
    active_is(host.api(), 0).await;
    assert!(failpoint::fired("message.after_admit"));
    assert!(failpoint::fired("message.after_claim"));
    failpoint::reset();
    host.stop().await;
}

/// A follow-up that passes the quota as read, and whose turn's commit finds the owner's
/// slot taken meanwhile: refused in the run's timeline, the run left as it ended, the
/// slot the other run's.
async fn a_follow_up_without_a_slot_at_its_commit_is_refused(mut host: impl TestHost) {
    failpoint::reset();
    let run_id = start(host.api(), "talker").await;
    let gate = failpoint::pause("message.after_claim", 0);
    let api = host.api().clone();
    let path = format!("/runs/{run_id}/messages");
    let late = tokio::spawn(async move { api.post(&path, json!({"text": "late"})).await });
    gate.reached().await;
    start(host.api(), "asker").await;
    gate.release();
    let (code, v) = late.await.unwrap();
    assert_eq!(code, 202, "{v}");
    let run = host
        .api()
        .wait("the refusal", async |api: &Api| {
            let run = api.get_ok(&format!("/runs/{run_id}")).await;
            run["timeline"]
                .as_array()?
                .iter()
                .any(|e| e["code"] == "follow_up_refused")
                .then_some(run)
        })
        .await;
    assert_eq!(
        (run["status"].as_str(), run["result"].as_str()),
        (Some("completed"), Some("first")),
        "{run}"
    );
    let refusal = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["code"] == "follow_up_refused")
        .unwrap();
    assert!(
        refusal["message"]
            .as_str()
            .unwrap()
            .contains("already has 1 active runs"),
        "{refusal}"
    );
    active_is(host.api(), 1).await;
    // Its place was given back with the refusal: the run takes ten more.
    for i in 0..10 {
        let (code, v) = host
            .api()
            .post(
                &format!("/runs/{run_id}/messages"),
                json!({"text": format!("again {i}")}),
            )
            .await;
        assert_ne!(v["error"]["code"], "queue_full", "{i}: {code} {v}");
    }
    failpoint::reset();
    host.stop().await;
}

#[tokio::test]
async fn places_and_slots_a_dead_request_left_come_back_on_the_embedded_host() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let host = local(dir.path(), clock.clone()).await;
    places_and_slots_come_back(host, clock).await;
}

#[tokio::test]
async fn places_and_slots_a_dead_request_left_come_back_over_aws_apis() {
    let _serial = SERIAL.lock().await;
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let host = aws("fuslot", clock.clone()).await;
    places_and_slots_come_back(host, clock).await;
}

#[tokio::test]
async fn a_follow_up_without_a_slot_at_its_commit_is_refused_on_the_embedded_host() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let host = local(dir.path(), clock).await;
    a_follow_up_without_a_slot_at_its_commit_is_refused(host).await;
}

#[tokio::test]
async fn a_follow_up_without_a_slot_at_its_commit_is_refused_over_aws_apis() {
    let _serial = SERIAL.lock().await;
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let host = aws("furace", clock).await;
    a_follow_up_without_a_slot_at_its_commit_is_refused(host).await;
}
