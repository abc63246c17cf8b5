//! The `events` function's handler, on the embedded adapters: answers and expiries that arrive
//! on the bus. An answer may name its responder (recorded beside it); a redelivery of the
//! answer that won is a no-op, not a rejection; an expiry before `expiresAt` is refused.

use crate::common;
use baton_core::ports::{Ctas, RunReads};

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use baton_core::cta::{Cta, CtaStatus};
use baton_core::ports::{Clock, ManualClock, Scheduler, SystemClock};
use baton_core::service::{CreateRun, Service};
use baton_dev::worker::{Worker, WorkerOptions};
use baton_lambda::handle_events;
use baton_local::store::LocalStore;
use common::*;
use serde_json::{Value, json};

const ASK: &str = r#"{"asker": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Name?"}}]},
    {"text": "thanks"}]}"#;

static DELIVERIES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The `events` function's handler over the embedded adapters (a handler, not a host: the
/// scenarios' hosts are `common::host`'s), with the worker that steps its runs.
struct Inbox {
    local: LocalStore,
    service: Arc<Service>,
    worker: Worker,
    _dir: tempfile::TempDir,
}

fn env() -> Inbox {
    env_at(Arc::new(SystemClock))
}

fn env_at(clock: Arc<dyn Clock>) -> Inbox {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let agents = json!({"agents": {"asker": {"tools": ["request_human_feedback"]}}});
    let service = local_service(&local, scripted(ASK), catalog(Some(agents)), clock);
    let worker = Worker::new(service.clone(), local.clone(), WorkerOptions::default());
    Inbox {
        local,
        service,
        worker,
        _dir: dir,
    }
}

impl Inbox {
    /// Starts a run and steps it until its question is pending.
    async fn parked(&self) -> Cta {
        let req = CreateRun {
            prompt: "ask".into(),
            agent: Some("asker".into()),
            ..Default::default()
        };
        let run = self
            .service
            .requests()
            .create_run("local", req, None)
            .await
            .unwrap();
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
        let resp = handle_events(&self.service, event).await;
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
    let set = e
        .local
        .timer(&cta.cta_id)
        .await
        .unwrap()
        .expect("set again");
    assert!(
        set >= cta.expires_at && set - cta.expires_at < chrono::Duration::milliseconds(1),
        "its expiry is set again for its time: {set}, due {}",
        cta.expires_at
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

/// The embedded host keeps timers to the millisecond, the service an expiry to the
/// nanosecond. A timer looked at within its expiry's last millisecond is not yet due: it
/// stays set and fires once the time has come. (The worker used to fire it there, and the
/// service, finding it early, set it again, and the worker then deleted it: the question
/// never expired and its run waited for good.)
#[tokio::test]
async fn an_expiry_looked_at_within_its_last_millisecond_stays_set_and_fires_on_time() {
    let whole_ms =
        chrono::DateTime::from_timestamp_millis(chrono::Utc::now().timestamp_millis()).unwrap();
    let clock = Arc::new(ManualClock::new(
        whole_ms + chrono::Duration::microseconds(500),
    ));
    let e = env_at(clock.clone());
    let cta = e.parked().await;
    assert!(
        !cta.expires_at
            .timestamp_subsec_nanos()
            .is_multiple_of(1_000_000)
    );
    // 300 µs before `expiresAt`, in its millisecond.
    clock.advance(cta.expires_at - clock.now() - chrono::Duration::microseconds(300));
    assert_eq!(
        clock.now().timestamp_millis(),
        cta.expires_at.timestamp_millis()
    );
    e.worker.fire_due_timers().await.unwrap();
    e.worker.drain().await.unwrap();
    assert_eq!(e.cta(&cta.cta_id).await.status, CtaStatus::Pending);
    let set = e.local.timer(&cta.cta_id).await.unwrap();
    assert!(set.is_some_and(|t| t >= cta.expires_at), "{set:?}");

    // At `expiresAt` it is due to the nanosecond; the worker fires it at the millisecond
    // that follows.
    clock.advance(chrono::Duration::microseconds(300));
    assert_eq!(e.worker.fire_due_timers().await.unwrap(), 0);
    clock.advance(chrono::Duration::microseconds(500));
    assert_eq!(e.worker.fire_due_timers().await.unwrap(), 1);
    e.worker.drain().await.unwrap();
    assert_eq!(e.cta(&cta.cta_id).await.status, CtaStatus::Expired);
    let run = e.local.get_run(&cta.run_id).await.unwrap().unwrap().run;
    assert_eq!(run.status, baton_core::run::RunStatus::Expired);
    assert_eq!(e.local.timer(&cta.cta_id).await.unwrap(), None);
}

/// An expiry that fires again after it settled its CTA (the resolution's send failed, or
/// the scheduler delivered twice) sends the resolution again: the run ends now, not at the
/// next sweep.
#[tokio::test]
async fn an_expiry_fired_again_after_it_settled_its_cta_tells_the_run() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let e = env_at(clock.clone());
    let cta = e.parked().await;
    clock.advance(cta.expires_at - clock.now());
    // Settled, and its resolution never sent (as when the send after the write failed).
    let settled = e
        .local
        .settle_cta(
            &cta.cta_id,
            &baton_core::cta::Settlement::Expired,
            clock.now(),
        )
        .await
        .unwrap();
    assert!(matches!(settled, baton_core::ports::Settled::Won(_)));
    e.worker.drain().await.unwrap();
    let run = e.local.get_run(&cta.run_id).await.unwrap().unwrap().run;
    assert_eq!(run.status, baton_core::run::RunStatus::Waiting);

    let fire = json!({"ctaId": cta.cta_id, "runId": cta.run_id});
    assert!(e.deliver("cta.expired", fire.clone()).await.is_empty());
    let run = e.local.get_run(&cta.run_id).await.unwrap().unwrap().run;
    assert_eq!(run.status, baton_core::run::RunStatus::Expired);
    // And once more: the run has ended; nothing changes.
    let (_, before) = e.local.load(&cta.run_id).await.unwrap().unwrap();
    assert!(e.deliver("cta.expired", fire).await.is_empty());
    let (_, after) = e.local.load(&cta.run_id).await.unwrap().unwrap();
    assert_eq!(before.len(), after.len());
}

#[tokio::test]
async fn a_five_second_cta_expires_on_time_on_the_embedded_host() {
    let dir = tempfile::tempdir().unwrap();
    let agents = json!({"agents": {"asker": {"tools": ["request_human_feedback"],
        "ctaExpirySeconds": 5}}});
    let h = start(dir.path(), scripted(ASK), catalog(Some(agents))).await;
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
