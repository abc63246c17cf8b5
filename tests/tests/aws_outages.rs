//! Outages over AWS wire protocols: a scheduler or a bus that is down holds back neither a
//! question nor a step, and what they owed is done once they are back.

use crate::common;

use std::sync::Arc;

use common::aws::Emulator;
use common::host::{AwsHost, TestHost};
use common::*;
use serde_json::{Value, json};

/// `baton dev --aws` with agent `ops` thinking from `script` with `tool`, `service` in an
/// outage (the fault layer answers its every request with a 500) once the host is up, and
/// a run of `ops` started.
async fn run_in_outage(
    service: &'static str,
    script: &str,
    tool: &str,
) -> (Arc<Emulator>, AwsHost, String) {
    let aws = Arc::new(Emulator::start_with(None).await);
    let agents = json!({"agents": {"ops": {"tools": [tool]}}});
    let options = aws
        .dev_options(
            aws.names(service),
            scripted(script),
            catalog(Some(agents)),
            0,
        )
        .await;
    let host = AwsHost::start(aws.clone(), options).await;
    aws.outage(service, true);
    let run_id = host
        .api()
        .post_ok("/runs", json!({"prompt": "go", "agent": "ops"}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    (aws, host, run_id)
}

/// A Scheduler outage (the fault layer answers its every request with a 500) holds back
/// neither a question nor its run: the question reaches its inbox and is answered, and the
/// run completes; the expiry timer and its removal are owed, kept in the run's outbox for
/// the sweep. A tick during the outage repairs nothing and says so (the alarm's metric);
/// the first tick after it performs them, in their order, and the outbox is done.
#[tokio::test]
async fn a_scheduler_outage_holds_back_neither_a_question_nor_its_run() {
    let script = r#"{"ops": [
        {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "ship?"}}]},
        {"text": "shipped"}]}"#;
    let (aws, host, run_id) = run_in_outage("scheduler", script, "request_human_feedback").await;
    let api = host.api().clone();
    api.status(&run_id, "waiting").await;
    let cta = api.pending_cta().await["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let approve = json!({"kind": "approval", "approved": true});
    api.post_ok(&format!("/ctas/{cta}/response"), approve).await;
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "shipped");

    // The run reads as completed as its last commit lands; its effects follow: the
    // outbox is narrowed to what failed once they are tried.
    let store = host.server().events_service().deps().store.clone();
    let kinds = |outbox: &[baton_core::message::Effect]| -> Vec<Value> {
        outbox
            .iter()
            .map(|e| serde_json::to_value(e).unwrap()["type"].clone())
            .collect()
    };
    let owed = api
        .wait("the outbox narrowed to what failed", async |_| {
            let outbox = store.get_run(&run_id).await.unwrap().unwrap().outbox;
            (kinds(&outbox) == [json!("timer"), json!("cancel_timer")]).then_some(outbox)
        })
        .await;
    let metrics = async || {
        let page = api
            .http
            .get(format!("{}/metrics", api.base))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200);
        page.text().await.unwrap()
    };
    let page = metrics().await;
    assert!(
        page.contains(r#"baton_effect_failures_total{kind="timer"}"#),
        "{page}"
    );

    // A tick during the outage: nothing repaired, and the failure counted.
    host.sweep().await;
    assert_eq!(store.get_run(&run_id).await.unwrap().unwrap().outbox, owed);
    assert!(
        metrics()
            .await
            .contains("baton_outbox_repair_failures_total 1"),
        "a tick that repaired nothing says so"
    );

    // Scheduler back: the next tick performs what is owed; no timer is left.
    aws.outage("scheduler", false);
    host.sweep().await;
    let rec = store.get_run(&run_id).await.unwrap().unwrap();
    assert!(rec.outbox.is_empty(), "{:?}", rec.outbox);
    let sch = aws_sdk_scheduler::Client::new(&aws.sdk().await);
    let left = sch
        .get_schedule()
        .name(&cta)
        .group_name(host.names().schedule_group())
        .send()
        .await;
    assert!(left.is_err(), "the answered question's timer is gone");
    assert!(
        metrics()
            .await
            .contains("baton_outbox_repair_failures_total 1"),
        "the repair that worked counts no failure"
    );
}

/// A bus outage holds back no step of a run that goes on: each step's `run.state` event
/// fails, its run's next message goes all the same (marked owed), and that step publishes
/// them again before it thinks, carrying what still fails into its own commit. The run
/// completes during the outage owing only events, which the first tick after it publishes.
#[tokio::test]
async fn a_bus_outage_holds_back_no_step_and_its_events_are_published_after() {
    let script = r#"{"ops": [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
        {"tool_calls": [{"name": "echo", "arguments": {"text": "b"}}]},
        {"tool_calls": [{"name": "echo", "arguments": {"text": "c"}}]},
        {"text": "done"}]}"#;
    let (aws, host, run_id) = run_in_outage("events", script, "echo").await;
    let api = host.api().clone();
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "done");
    let store = host.server().events_service().deps().store.clone();
    let owed = api
        .wait("the last outbox narrowed to what failed", async |_| {
            let outbox = store.get_run(&run_id).await.unwrap().unwrap().outbox;
            let types: Vec<Value> = outbox
                .iter()
                .map(|e| serde_json::to_value(e).unwrap()["type"].clone())
                .collect();
            let only_events = types.iter().all(|t| t == "publish");
            let completed = outbox.iter().any(|e| {
                matches!(e, baton_core::message::Effect::Publish(ev) if ev.detail_type == "run.completed")
            });
            (only_events && completed).then_some(outbox)
        })
        .await;
    // The first step's `thinking` event is owed still: carried by each step after it, none
    // of which it held back.
    let first = format!("{run_id}:1:0");
    assert!(
        owed.iter().any(|e| matches!(e, baton_core::message::Effect::Publish(ev) if ev.id == first && ev.detail_type == "run.state")),
        "{owed:?}"
    );

    aws.outage("events", false);
    host.sweep().await;
    let rec = store.get_run(&run_id).await.unwrap().unwrap();
    assert!(rec.outbox.is_empty(), "{:?}", rec.outbox);
}
