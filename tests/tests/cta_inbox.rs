//! The `cta` function's handler, on the embedded adapters: answers and expiries that arrive
//! on the bus. An answer may name its responder (recorded beside it); a redelivery of the
//! answer that won is a no-op, not a rejection; an expiry before `expiresAt` is refused.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use baton_core::cta::{Cta, CtaStatus};
use baton_core::ports::{Clock, ManualClock, Scheduler, Store, SystemClock};
use baton_core::service::{CreateRun, Service};
use baton_dev::worker::{Worker, WorkerOptions};
use baton_lambda::handle_cta_inbox;
use baton_local::local_service;
use baton_local::store::LocalStore;
use common::*;
use serde_json::{Value, json};

const ASK: &str = r#"{"asker": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Name?"}}]},
    {"text": "thanks"}]}"#;

static DELIVERIES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

struct Env {
    local: LocalStore,
    service: Arc<Service>,
    worker: Worker,
    _dir: tempfile::TempDir,
}

fn env() -> Env {
    env_at(Arc::new(SystemClock))
}

fn env_at(clock: Arc<dyn Clock>) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let agents = json!({"agents": {"asker": {"tools": ["request_human_feedback"]}}});
    let service = local_service(&local, scripted(ASK), catalog(Some(agents)), clock);
    let worker = Worker::new(service.clone(), local.clone(), WorkerOptions::default());
    Env {
        local,
        service,
        worker,
        _dir: dir,
    }
}

impl Env {
    /// Starts a run and steps it until its question is pending.
    async fn parked(&self) -> Cta {
        let req = CreateRun {
            prompt: "ask".into(),
            agent: Some("asker".into()),
            ..Default::default()
        };
        let run = self.service.create_run("local", req, None).await.unwrap();
        self.worker.drain().await.unwrap();
        let ctas = self
            .local
            .list_ctas("local", &every_cta(Some(CtaStatus::Pending)))
            .await
            .unwrap();
        ctas.into_iter().find(|c| c.run_id == run.run_id).unwrap()
    }

    /// Hands the inbox handler one bus event (as the rule delivers it) and returns the
    /// `cta.rejected` events it published.
    async fn deliver(&self, detail_type: &str, detail: Value) -> Vec<Value> {
        let before = self.local.events_after(0, 1000).await.unwrap().len();
        // SQS message ids are unique; the rejection's event id derives from it.
        let n = DELIVERIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let envelope = json!({"version": "0", "id": format!("ev-{n}"), "detail-type": detail_type,
            "source": "my.app", "time": "2026-11-22T00:00:00Z", "region": "us-east-1",
            "resources": [], "detail": detail});
        let event: SqsEvent = serde_json::from_value(json!({"Records": [{
            "messageId": format!("m{n}"), "receiptHandle": "r1", "body": envelope.to_string(),
            "attributes": {}, "messageAttributes": {}, "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:baton-cta-inbox",
            "awsRegion": "us-east-1"}]}))
        .unwrap();
        let resp = handle_cta_inbox(&self.service, event).await;
        assert!(resp.batch_item_failures.is_empty(), "{resp:?}");
        self.worker.drain().await.unwrap();
        self.local.events_after(0, 1000).await.unwrap()[before..]
            .iter()
            .filter(|(_, e)| e.detail_type == "cta.rejected")
            .map(|(_, e)| e.detail.clone())
            .collect()
    }

    async fn cta(&self, cta_id: &str) -> Cta {
        self.local.get_cta(cta_id).await.unwrap().unwrap()
    }
}

#[tokio::test]
async fn a_bus_answer_names_its_responder_and_its_redelivery_changes_nothing() {
    let e = env();
    let cta = e.parked().await;
    let answer = json!({"ctaId": cta.cta_id, "kind": "text", "text": "Ada",
        "responder": "ops@example.com"});
    assert!(e.deliver("cta.response", answer.clone()).await.is_empty());
    let settled = e.cta(&cta.cta_id).await;
    assert_eq!(settled.status, CtaStatus::Answered);
    assert_eq!(settled.responder.as_deref(), Some("ops@example.com"));
    let (rec, tl) = e.local.load(&cta.run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, baton_core::run::RunStatus::Completed);
    let snap = tl.iter().find_map(|x| x.tool()?.cta.clone()).unwrap();
    assert_eq!(snap.responder.as_deref(), Some("ops@example.com"));

    // The bus delivers at least once: the same answer again is not a rejection.
    assert!(e.deliver("cta.response", answer).await.is_empty());
    // A different answer is: the first one won.
    let other = json!({"ctaId": cta.cta_id, "kind": "text", "text": "Grace"});
    let rejected = e.deliver("cta.response", other).await;
    assert_eq!(rejected.len(), 1);
    assert!(
        rejected[0]["reason"]
            .as_str()
            .unwrap()
            .contains("already answered")
    );
    assert_eq!(e.cta(&cta.cta_id).await.response, settled.response);
}

#[tokio::test]
async fn an_expiry_before_expires_at_sets_its_timer_again_and_leaves_the_cta_pending() {
    let e = env();
    let cta = e.parked().await;
    // As the schedule's own firing, early: it deleted itself once fired.
    e.local.unschedule(&cta.cta_id).await.unwrap();
    assert_eq!(e.local.timer(&cta.cta_id).await.unwrap(), None);
    let early = json!({"ctaId": cta.cta_id, "runId": cta.run_id});
    let rejected = e.deliver("cta.expired", early).await;
    assert!(rejected.is_empty(), "not refused: {rejected:?}");
    assert_eq!(e.cta(&cta.cta_id).await.status, CtaStatus::Pending);
    let run = e.local.get_run(&cta.run_id).await.unwrap().unwrap().run;
    assert_eq!(run.status, baton_core::run::RunStatus::Waiting);
    assert_eq!(
        e.local
            .timer(&cta.cta_id)
            .await
            .unwrap()
            .map(|t| t.timestamp_millis()),
        Some(cta.expires_at.timestamp_millis()),
        "its expiry is set again for its time"
    );

    // A responder that is not a short string is refused too, and changes nothing.
    let bad = json!({"ctaId": cta.cta_id, "kind": "text", "text": "x", "responder": 7});
    assert_eq!(e.deliver("cta.response", bad).await.len(), 1);
    assert_eq!(e.cta(&cta.cta_id).await.status, CtaStatus::Pending);
}

/// No skew is tolerated: an expiry a fraction of a second early leaves the question open
/// (an answer posted before `expiresAt` may still be on its way); at `expiresAt` it settles.
#[tokio::test]
async fn an_expiry_200_ms_early_leaves_the_cta_pending_and_one_on_time_settles_it() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let e = env_at(clock.clone());
    let cta = e.parked().await;
    let fire = json!({"ctaId": cta.cta_id, "runId": cta.run_id});
    clock.advance(cta.expires_at - clock.now() - chrono::Duration::milliseconds(200));
    assert!(e.deliver("cta.expired", fire.clone()).await.is_empty());
    assert_eq!(e.cta(&cta.cta_id).await.status, CtaStatus::Pending);
    clock.advance(chrono::Duration::milliseconds(200));
    assert!(e.deliver("cta.expired", fire).await.is_empty());
    assert_eq!(e.cta(&cta.cta_id).await.status, CtaStatus::Expired);
}

#[tokio::test]
async fn a_five_second_cta_expires_on_time_on_the_embedded_host() {
    let dir = tempfile::tempdir().unwrap();
    let agents = json!({"agents": {"asker": {"tools": ["request_human_feedback"],
        "ctaExpirySeconds": 5}}});
    let h = start(
        dir.path(),
        scripted(ASK),
        catalog(Some(agents)),
        Arc::new(SystemClock),
    )
    .await;
    let run_id = h
        .create_run(json!({"prompt": "ask", "agent": "asker"}))
        .await;
    let cta = h.wait_pending(1).await.remove(0);
    let created = chrono::DateTime::parse_from_rfc3339(cta["createdAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let expires = chrono::DateTime::parse_from_rfc3339(cta["expiresAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    assert_eq!(expires - created, chrono::Duration::seconds(5));

    // Not before its time...
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let (_, c) = h
        .get(&format!("/ctas/{}", cta["ctaId"].as_str().unwrap()))
        .await;
    assert_eq!(c["status"], "pending");
    // ...and within a second or so after it.
    let run = h.wait_status(&run_id, &["expired"]).await;
    let ended = chrono::Utc::now();
    assert!(ended >= expires, "expired at {ended}, due {expires}");
    assert!(
        ended - expires < chrono::Duration::milliseconds(2500),
        "expired at {ended}, due {expires}"
    );
    assert_eq!(run["error"]["code"], "cta_expired");
    h.server.shutdown().await;
}
