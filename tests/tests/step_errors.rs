//! Errors that say whether to retry: a terminal step error (one no redelivery can cure)
//! ends its run as failed at once, with the error's own message, through the local worker
//! and through the Lambda SQS handler alike; a retryable one is redelivered.

use crate::common;
use baton_core::ports::RunReads;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use aws_lambda_events::event::sqs::SqsEvent;
use baton_core::cta::Cta;
use baton_core::error::PortError;
use baton_core::message::{Effect, StepMessage, Transition};
use baton_core::ports::{Created, DueTimer, RunWrites, Store, StoreParts, Sweep, SystemClock};
use baton_core::run::{LastError, Run, RunStatus};
use baton_core::service::{CreateRun, Deps, Service};
use baton_core::timeline::{Entry, EntryBody};
use baton_dev::worker::{Worker, WorkerOptions};
use baton_lambda::{MAX_BATCH, Pace, handle_steps};
use baton_local::store::LocalStore;
use chrono::{DateTime, Utc};
use common::*;
use serde_json::json;

/// A store (the embedded one, or DynamoDB's), except that it refuses (terminally, as
/// DynamoDB refuses an item over 400 KB) any commit that carries the word `poison`, or fails
/// every commit retryably; with `slow_purge`, every purge takes 300 ms and finds as many
/// finished runs as it may take.
struct Refusing {
    inner: Arc<dyn Store>,
    retryable: bool,
    /// Commits still to refuse as a throttle would (then they go through).
    throttle: AtomicU32,
    /// Commits still to refuse as a version conflict (another writer's commit) would.
    conflicts: AtomicU32,
    refused: AtomicU32,
    slow_purge: bool,
    purges: AtomicU32,
}

impl Refusing {
    fn over(inner: Arc<dyn Store>, retryable: bool, slow_purge: bool) -> Self {
        Self {
            inner,
            retryable,
            throttle: AtomicU32::new(0),
            conflicts: AtomicU32::new(0),
            refused: AtomicU32::new(0),
            slow_purge,
            purges: AtomicU32::new(0),
        }
    }

    /// The store with this one's commits and purges: the roles it wraps ([`RunWrites`],
    /// [`Sweep`]) replace the inner store's, the others stay as they are.
    fn as_store(self: &Arc<Self>) -> Arc<dyn Store> {
        let mut parts = StoreParts::of(self.inner.clone());
        parts.run_writes = self.clone();
        parts.sweep = self.clone();
        Arc::new(parts)
    }
}

#[async_trait::async_trait]
impl RunWrites for Refusing {
    async fn commit(&self, expected: u64, t: &Transition) -> Result<(), PortError> {
        let poisoned = serde_json::to_string(&t.appended)
            .unwrap()
            .contains("poison");
        let take = |n: &AtomicU32| {
            n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        };
        if take(&self.conflicts) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(PortError::Conflict);
        }
        if take(&self.throttle) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(PortError::Unavailable {
                message: "ThrottlingException: rate exceeded".into(),
                source: None,
            });
        }
        if self.retryable || poisoned {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(if self.retryable {
                PortError::Unavailable {
                    message: "throttled".into(),
                    source: None,
                }
            } else {
                PortError::Broken {
                    message: "ValidationException: Item size has exceeded the maximum allowed size"
                        .into(),
                    source: None,
                }
            });
        }
        self.inner.commit(expected, t).await
    }
    async fn create_run(
        &self,
        run: &Run,
        entries: &[Entry],
        outbox: &[Effect],
        key: Option<&str>,
        admission: Option<&baton_core::ports::Admission>,
    ) -> Result<Created, PortError> {
        self.inner
            .create_run(run, entries, outbox, key, admission)
            .await
    }
    async fn clear_outbox(&self, run_id: &str, version: u64) -> Result<(), PortError> {
        self.inner.clear_outbox(run_id, version).await
    }
    async fn keep_outbox(
        &self,
        run_id: &str,
        version: u64,
        owed: &[Effect],
        at: DateTime<Utc>,
    ) -> Result<(), PortError> {
        self.inner.keep_outbox(run_id, version, owed, at).await
    }
    async fn record_failure(&self, run_id: &str, failure: &LastError) -> Result<(), PortError> {
        self.inner.record_failure(run_id, failure).await
    }
}

#[async_trait::async_trait]
impl Sweep for Refusing {
    async fn purge_finished(&self, now: DateTime<Utc>, limit: usize) -> Result<usize, PortError> {
        if self.slow_purge {
            self.purges.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            return Ok(limit);
        }
        self.inner.purge_finished(now, limit).await
    }
    async fn stale_outboxes(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<String>, PortError> {
        self.inner.stale_outboxes(before, limit).await
    }
    async fn stale_resolutions(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        self.inner.stale_resolutions(before, limit).await
    }
    async fn overdue_ctas(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        self.inner.overdue_ctas(before, limit).await
    }
    async fn overdue_timers(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<DueTimer>, PortError> {
        self.inner.overdue_timers(before, limit).await
    }
}

const POISON: &str = r#"{"worker": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "poison"}}]},
    {"text": "never reached"}]}"#;

fn service(local: &LocalStore, retryable: bool) -> (Arc<Service>, Arc<Refusing>) {
    service_with(local, retryable, false)
}

fn service_with(
    local: &LocalStore,
    retryable: bool,
    slow_purge: bool,
) -> (Arc<Service>, Arc<Refusing>) {
    let store = Arc::new(Refusing::over(
        Arc::new(local.clone()),
        retryable,
        slow_purge,
    ));
    let deps = Deps {
        store: store.as_store(),
        sending_store: None,
        ..baton_local::local_deps(local, scripted(POISON), Arc::new(SystemClock))
    };
    let catalog = catalog(Some(json!({"agents": {"worker": {"tools": ["echo"]}}})));
    (Arc::new(Service::builder(deps, catalog).build()), store)
}

async fn create(svc: &Service) -> String {
    create_run_of(svc, "worker").await
}

async fn assert_failed_at_once(local: &LocalStore, run_id: &str, store: &Refusing) {
    let (rec, tl) = local.load(run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Failed);
    let error = rec.run.outcome.error.unwrap();
    assert_eq!(error.code, "step_error");
    assert!(
        error.message.contains("Item size has exceeded"),
        "{error:?}"
    );
    // The error, then what the failed turn spent.
    assert!(matches!(tl.last().unwrap().body, EntryBody::Usage { .. }));
    assert!(matches!(
        &tl[tl.len() - 2].body,
        EntryBody::Error { message, .. } if message.contains("Item size has exceeded")
    ));
    assert_eq!(
        store.refused.load(Ordering::SeqCst),
        1,
        "refused once: the message was not redelivered"
    );
    assert_eq!(
        local.queue_depth().await.unwrap(),
        0,
        "nothing left to retry"
    );
}

/// The model, counted.
struct Counted(Arc<dyn baton_core::llm::Llm>, AtomicU32);

#[async_trait::async_trait]
impl baton_core::llm::Llm for Counted {
    async fn complete(
        &self,
        request: &baton_core::llm::ChatRequest<'_>,
    ) -> Result<baton_core::llm::LlmReply, baton_core::llm::LlmError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.complete(request).await
    }
    fn reads_history(&self) -> bool {
        self.0.reads_history()
    }
}

/// How the store turns a reply's commit away.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// Three throttles past the SDK's own retries.
    Throttle,
    /// Five version conflicts running, more than a step without a reply re-reads for.
    Conflict,
}

/// A reply whose commit the store turns away for now is not thrown away: the commit is
/// tried again with the reply in hand (a throttle after a pause, a conflict after reading
/// the run again), and the model is asked once per reply. `deps` are a host's ports; its
/// queue is received from through `pump`, as the host's consumers do.
async fn a_reply_is_kept_through(
    refusal: Refusal,
    mut deps: Deps,
    pump: &dyn crate::contract::Pump,
) {
    let script = r#"{"worker": [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]},
        {"text": "done"}]}"#;
    let model = Arc::new(Counted(scripted(script), AtomicU32::new(0)));
    let store = Arc::new(Refusing::over(deps.store.clone(), false, false));
    deps.store = store.as_store();
    deps.sending_store = None;
    deps.llm = model.clone();
    let catalog = catalog(Some(json!({"agents": {"worker": {"tools": ["echo"]}}})));
    let svc = Arc::new(Service::builder(deps, catalog).build());
    create(&svc).await;
    let counter = match refusal {
        Refusal::Throttle => &store.throttle,
        Refusal::Conflict => &store.conflicts,
    };
    let refusals = match refusal {
        Refusal::Throttle => 3,
        Refusal::Conflict => 5,
    };
    // The first commit after the create is the first reply's.
    counter.store(refusals, Ordering::SeqCst);
    let mut status = RunStatus::Queued;
    for _ in 0..100 {
        for (receipt, msg) in pump.receive(10).await {
            // A failed step's message is left to come back, as on the hosts' queues.
            match svc.steps().handle(&msg).await {
                Ok(baton_core::service::Handled::Committed { status: s, .. }) => status = s,
                Ok(_) => {}
                Err(e) => {
                    eprintln!("{refusal:?}: {e}");
                    continue;
                }
            }
            pump.ack(receipt).await;
        }
        if status == RunStatus::Completed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(status, RunStatus::Completed, "{refusal:?}");
    assert_eq!(store.refused.load(Ordering::SeqCst), refusals);
    assert_eq!(
        model.1.load(Ordering::SeqCst),
        2,
        "{refusal:?}: one model call per reply"
    );
}

#[tokio::test]
async fn a_reply_whose_commit_is_throttled_or_conflicts_is_not_asked_for_again() {
    for refusal in [Refusal::Throttle, Refusal::Conflict] {
        let dir = tempfile::tempdir().unwrap();
        let local = LocalStore::open(dir.path()).unwrap();
        let deps = baton_local::local_deps(&local, scripted("{}"), Arc::new(SystemClock));
        a_reply_is_kept_through(refusal, deps, &local).await;
    }
}

#[tokio::test]
async fn a_reply_whose_commit_is_throttled_or_conflicts_is_not_asked_for_again_on_aws() {
    let aws = common::aws::Emulator::start_with(None).await;
    let sdk = aws.sdk().await;
    for refusal in [Refusal::Throttle, Refusal::Conflict] {
        let names = aws.names(&format!("kept-{refusal:?}").to_lowercase());
        let p = baton_aws::provision::ensure(&sdk, &names, "arn:aws:iam::123456789012:role/s")
            .await
            .unwrap();
        let deps = baton_aws::aws_deps(
            &p.config,
            &sdk,
            scripted("{}"),
            Arc::new(SystemClock),
            baton_aws::sdk::Meter::shared(),
        );
        let pump = crate::contract::aws::SqsPump {
            client: aws_sdk_sqs::Client::new(&sdk),
            urls: vec![p.config.steps_queue_url.clone()],
        };
        a_reply_is_kept_through(refusal, deps, &pump).await;
    }
}

#[tokio::test]
async fn the_worker_fails_a_run_at_once_on_a_terminal_error() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let (svc, store) = service(&local, false);
    let run_id = create(&svc).await;
    let worker = Worker::new(svc, local.clone(), WorkerOptions::default());
    worker.drain().await.unwrap();
    assert_failed_at_once(&local, &run_id, &store).await;
}

fn sqs_event(records: &[(&str, &StepMessage)]) -> SqsEvent {
    let records: Vec<_> = records
        .iter()
        .map(|(id, m)| {
            json!({
                "messageId": id,
                "receiptHandle": id,
                "body": serde_json::to_string(m).unwrap(),
                "attributes": {"MessageGroupId": m.run_id},
                "messageAttributes": {},
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:baton-steps.fifo",
                "awsRegion": "us-east-1",
            })
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

#[tokio::test]
async fn the_lambda_handler_acknowledges_a_terminal_error_and_retries_the_rest() {
    // Terminal: the run fails in this invocation; the record is not reported as failed.
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let (svc, store) = service(&local, false);
    let run_id = create(&svc).await;
    let delivery = local
        .receive(1, std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .remove(0);
    let start = delivery.message.clone().unwrap();
    let resp = handle_steps(
        &svc,
        &[],
        sqs_event(&[("m1", &start)]),
        None,
        Pace::step_by_step(MAX_BATCH),
    )
    .await
    .response;
    assert!(resp.batch_item_failures.is_empty(), "{resp:?}");
    local.ack(delivery.receipt).await.unwrap();
    assert_failed_at_once(&local, &run_id, &store).await;

    // Retryable: reported failed, and so is the later message of the same group, in order.
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let (svc, store) = service(&local, true);
    let run_id = create(&svc).await;
    let start = local
        .receive(1, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let start = start[0].message.clone().unwrap();
    let later = StepMessage {
        id: "later".into(),
        ..start.clone()
    };
    let resp = handle_steps(
        &svc,
        &[],
        sqs_event(&[("m1", &start), ("m2", &later)]),
        None,
        Pace::step_by_step(MAX_BATCH),
    )
    .await
    .response;
    let failed: Vec<_> = resp
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    assert_eq!(failed, ["m1", "m2"]);
    // The commit held a reply: tried four more times in the step, the reply in hand.
    assert_eq!(store.refused.load(Ordering::SeqCst), 5);
    let rec = local.get_run(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Queued, "nothing changed");
}

#[tokio::test]
async fn a_stale_dead_letter_does_not_fail_a_live_run() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    // Every echo waits for a human: the run stays live, parked on the approval.
    let svc = common::local_service(
        &local,
        scripted(
            r#"{"worker": [{"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]}, {"text": "done"}]}"#,
        ),
        catalog(Some(
            json!({"agents": {"worker": {"tools": ["echo"], "approval": {"echo": "always"}}}}),
        )),
        Arc::new(SystemClock),
    );
    let run_id = create(&svc).await;
    let start = local
        .receive(1, std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .remove(0);
    svc.steps()
        .handle(start.message.as_ref().unwrap())
        .await
        .unwrap();
    local.ack(start.receipt).await.unwrap();
    Worker::new(svc.clone(), local.clone(), WorkerOptions::default())
        .drain()
        .await
        .unwrap();
    assert_eq!(
        local.get_run(&run_id).await.unwrap().unwrap().run.status,
        RunStatus::Waiting
    );
    // The start and a continue of an older version are long done: their dead letters must
    // not fail the live run.
    let stale_start = start.message.unwrap();
    let stale_continue = StepMessage {
        id: "old".into(),
        input: baton_core::message::Input::Continue { version: 1 },
        ..stale_start.clone()
    };
    for m in [&stale_start, &stale_continue] {
        let r = svc.steps().dead_letter(m, "failed 5 times").await.unwrap();
        assert!(
            matches!(r, baton_core::service::Handled::Ignored(_)),
            "{r:?}"
        );
    }
    let rec = local.get_run(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Waiting);
    assert!(rec.run.outcome.error.is_none());
}

/// A model for two agents: `slow` answers only once `fast` has been called (or gives up
/// after 20 s and says so in its reply), `fast` answers at once.
struct Gate {
    fast_called: tokio::sync::watch::Sender<bool>,
}

#[async_trait::async_trait]
impl baton_core::llm::Llm for Gate {
    async fn complete(
        &self,
        request: &baton_core::llm::ChatRequest<'_>,
    ) -> Result<baton_core::llm::LlmReply, baton_core::llm::LlmError> {
        let text = if request.agent == "fast" {
            self.fast_called.send_replace(true);
            "fast done"
        } else {
            let mut rx = self.fast_called.subscribe();
            let waited = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                rx.wait_for(|called| *called),
            )
            .await;
            if waited.is_ok() {
                "slow done after fast"
            } else {
                "slow gave up: fast never ran"
            }
        };
        Ok(baton_core::llm::LlmReply {
            text: Some(text.into()),
            tool_calls: vec![],
            usage: Default::default(),
            ..Default::default()
        })
    }
}

#[tokio::test]
async fn a_slow_model_call_holds_back_only_its_own_run_in_a_lambda_batch() {
    // Lambda puts records of different runs (FIFO groups) in one batch: the slow run's model
    // call must not keep the other run's step from running meanwhile.
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let svc = common::local_service(
        &local,
        Arc::new(Gate {
            fast_called: tokio::sync::watch::channel(false).0,
        }),
        catalog(Some(
            json!({"agents": {"slow": {"tools": []}, "fast": {"tools": []}}}),
        )),
        Arc::new(SystemClock),
    );
    let mut ids = Vec::new();
    for agent in ["slow", "fast"] {
        let req = CreateRun {
            prompt: "go".into(),
            agent: Some(agent.into()),
            ..Default::default()
        };
        ids.push(
            svc.requests()
                .create_run("local", req, None)
                .await
                .unwrap()
                .run_id,
        );
    }
    let starts = local
        .receive(2, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let mut messages: Vec<StepMessage> =
        starts.iter().map(|d| d.message.clone().unwrap()).collect();
    messages.sort_by_key(|m| ids.iter().position(|id| *id == m.run_id)); // the slow run first
    let started = std::time::Instant::now();
    // Two at once: the fewest a function steps (`steps_at_once`: a 128 MB function's).
    let at_once = baton_lambda::steps_at_once(Some(128), baton_core::service::budget_for(128));
    assert_eq!(at_once, 2);
    let resp = baton_lambda::handle_steps(
        &svc,
        &[],
        sqs_event(&[("m1", &messages[0]), ("m2", &messages[1])]),
        None,
        baton_lambda::Pace::step_by_step(at_once),
    )
    .await
    .response;
    assert!(resp.batch_item_failures.is_empty(), "{resp:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    for (id, said) in ids.iter().zip(["slow done after fast", "fast done"]) {
        let (rec, timeline) = local.load(id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Completed, "{id}");
        let answer = timeline.iter().rev().find_map(|e| match &e.body {
            EntryBody::Assistant { text, .. } => text.clone(),
            _ => None,
        });
        assert_eq!(answer.as_deref(), Some(said));
    }
}

/// A sweep tick keeps to its budget however many finished runs wait to be purged: it purges
/// `PURGE_CHUNK` runs at a time and starts no new chunk once its time is spent, leaving the
/// rest to the next tick (it shares the `events` function's 30 s with answers).
#[tokio::test]
async fn a_sweep_tick_keeps_to_its_budget_with_endless_runs_to_purge() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let (svc, store) = service_with(&local, false, true);
    let started = std::time::Instant::now();
    svc.steps()
        .sweep_within(chrono::Duration::zero(), std::time::Duration::from_secs(1))
        .await
        .unwrap();
    let took = started.elapsed();
    let purges = store.purges.load(Ordering::SeqCst);
    // 300 ms a chunk: the fourth starts at 0.9 s (fewer on a loaded machine), none after the
    // budget, and the last one under way is finished.
    assert!((2..=4).contains(&purges), "{purges} chunks");
    assert!(took < std::time::Duration::from_millis(2_500), "{took:?}");
}

/// A sweep tick that takes its whole budget does not hold back the answers delivered in
/// its batch: the `events` function handles a batch's records at once (its queue keeps no
/// order). Here the answer names no CTA, so it is refused at once, which the bus shows.
#[tokio::test]
async fn a_long_sweep_tick_does_not_hold_back_the_answers_in_its_batch() {
    struct TimedBus {
        inner: LocalStore,
        published: std::sync::Mutex<Vec<(String, std::time::Instant)>>,
    }
    #[async_trait::async_trait]
    impl baton_core::ports::Bus for TimedBus {
        async fn publish(&self, events: &[baton_core::message::Event]) -> Result<(), PortError> {
            let now = std::time::Instant::now();
            {
                let mut published = self.published.lock().unwrap();
                published.extend(events.iter().map(|e| (e.detail_type.clone(), now)));
            }
            self.inner.publish(events).await
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let (slow, store) = service_with(&local, false, true);
    let bus = Arc::new(TimedBus {
        inner: local.clone(),
        published: Default::default(),
    });
    let mut deps = slow.deps().clone();
    deps.bus = bus.clone();
    let svc = Service::builder(deps, catalog(Some(json!({"agents": {}})))).build();
    let record = |id: &str, detail_type: &str, detail: serde_json::Value| json!({"messageId": id, "body": json!({"detail-type": detail_type, "detail": detail}).to_string()});
    let event: SqsEvent = serde_json::from_value(json!({"Records": [
        record("tick", baton_core::service::SWEEP_EVENT, json!({})),
        record("answer", "cta.response", json!({"ctaId": "cta_none", "kind": "approval", "approved": true})),
    ]}))
    .unwrap();
    let started = std::time::Instant::now();
    let resp = baton_lambda::handle_events(&svc, event).await;
    let took = started.elapsed();
    assert!(resp.batch_item_failures.is_empty(), "nothing to retry");
    assert!(store.purges.load(Ordering::SeqCst) >= 2, "the tick purged");
    let refused = bus
        .published
        .lock()
        .unwrap()
        .iter()
        .find(|(t, _)| t == "cta.rejected")
        .map(|(_, at)| *at - started)
        .expect("the answer was refused");
    assert!(
        took >= baton_core::service::SWEEP_BUDGET / 2,
        "the tick took its budget: {took:?}"
    );
    assert!(
        refused < std::time::Duration::from_secs(3),
        "the answer waited {refused:?} for the tick ({took:?})"
    );
}

/// A run's steps go in a row only from its last record in a batch: a cancel behind its start
/// in the same batch is handled before the run's next step, so the run ends cancelled
/// (stepped in a row from its start, it would have completed first, the cancel let go).
#[tokio::test]
async fn a_cancel_behind_a_runs_record_in_its_batch_comes_before_the_runs_next_step() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let script = json!({"worker": [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "one"}}]},
        {"tool_calls": [{"name": "echo", "arguments": {"text": "two"}}]},
        {"text": "done"}]})
    .to_string();
    let deps = baton_local::local_deps(&local, scripted(&script), Arc::new(SystemClock));
    let catalog = catalog(Some(json!({"agents": {"worker": {"tools": ["echo"]}}})));
    let svc = Service::builder(deps, catalog).build();
    let run_id = create(&svc).await;
    let start = local
        .receive(1, std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .remove(0)
        .message
        .unwrap();
    // Sent to the batch alone, not to the embedded queue (which would end the row itself).
    let cancel = StepMessage {
        run_id: run_id.clone(),
        id: format!("{run_id}:cancel:1"),
        input: baton_core::message::Input::Cancel {
            reason: "cancelled by the user".into(),
        },
        owed: false,
    };
    let pace = Pace {
        at_once: MAX_BATCH,
        in_a_row: 10,
    };
    let resp = handle_steps(
        &svc,
        &[],
        sqs_event(&[("m1", &start), ("m2", &cancel)]),
        None,
        pace,
    )
    .await
    .response;
    assert!(resp.batch_item_failures.is_empty(), "{resp:?}");
    let rec = local.get_run(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Cancelled);
}
