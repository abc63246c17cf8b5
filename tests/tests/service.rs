//! The service over the ports, on the embedded store (and, where it says so, on AWS): the
//! outbox replayed after a crash, duplicates, dead letters, who sees what, and what a step
//! reads of a long run and gives its model.

use crate::common;
use baton_core::ports::RunReads;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use baton_core::cta::{CtaResponse, CtaStatus};
use baton_core::error::PortError;
use baton_core::message::{Effect, Input, StepMessage};
use baton_core::ports::{Queue, Store, SystemClock};
use baton_core::run::RunStatus;
use baton_core::service::{Deps, Handled, Service, StepError};
use baton_core::timeline::EntryBody;
use baton_local::store::LocalStore;
use chrono::Utc;
use common::*;

use crate::contract::Pump;

/// A queue that fails its first `n` sends: a crash between commit and effects.
struct FlakyQueue {
    inner: LocalStore,
    failures: AtomicU32,
}

#[async_trait::async_trait]
impl Queue for FlakyQueue {
    async fn send(&self, messages: &[StepMessage]) -> Result<(), PortError> {
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(PortError::Unavailable {
                message: "simulated crash".into(),
                source: None,
            });
        }
        self.inner.send(messages).await
    }
}

fn service(local: &LocalStore, queue: Arc<dyn Queue>, script: &str) -> Service {
    let deps = Deps {
        queue,
        sending_store: None,
        ..baton_local::local_deps(local, scripted(script), Arc::new(SystemClock))
    };
    Service::builder(
        deps,
        catalog(Some(
            serde_json::json!({"agents": {"worker": {"tools": ["echo"]}}}),
        )),
    )
    .build()
}

/// The service over `local` whose first send fails: it "crashes" between a commit and the
/// effects it committed.
fn crashing_once(local: &LocalStore) -> Service {
    let queue = FlakyQueue {
        inner: local.clone(),
        failures: AtomicU32::new(1),
    };
    service(local, Arc::new(queue), ECHO_TWICE)
}

const ECHO_TWICE: &str = r#"{"worker": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "one"}}]},
    {"tool_calls": [{"name": "echo", "arguments": {"text": "two"}}]},
    {"text": "done"}]}"#;

async fn start_worker_run(svc: &Service) -> String {
    create_run_of(svc, "worker").await
}

#[tokio::test]
async fn the_outbox_is_replayed_after_a_crash_between_commit_and_effects() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let ok = service(&local, Arc::new(local.clone()), ECHO_TWICE);
    let run_id = start_worker_run(&ok).await;
    let start = Pump::receive(&local, 1).await.remove(0);

    // The step commits, then "crashes" before its next-step message is sent.
    let flaky = crashing_once(&local);
    assert!(matches!(
        flaky.steps().handle(&start.1).await,
        Err(StepError::Port(_))
    ));
    let rec = local.get_run(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.version, 1, "the commit landed");
    assert!(
        rec.outbox.iter().any(|e| matches!(e, Effect::Send(_))),
        "its next-step message is outstanding"
    );
    assert!(
        Pump::receive(&local, 10).await.is_empty(),
        "nothing was sent (start is still in flight)"
    );

    // The redelivery finds the step done, performs the outbox, changes nothing else.
    let fresh = service(&local, Arc::new(local.clone()), ECHO_TWICE);
    assert!(matches!(
        fresh.steps().handle(&start.1).await.unwrap(),
        Handled::Ignored(_)
    ));
    // (The outbox stays: the continuation it sent proves it was performed, so no write is
    // spent clearing it; the next step recognises its own message and skips the replay.)
    Pump::ack(&local, start.0.clone()).await;
    let next = Pump::receive(&local, 10).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].1.input, Input::Continue { version: 1 });

    // The start-up sweep repairs the same gap when no redelivery comes.
    let crash = crashing_once(&local);
    assert!(crash.steps().handle(&next[0].1).await.is_err());
    Pump::ack(&local, next[0].0.clone()).await;
    assert!(Pump::receive(&local, 10).await.is_empty());
    let worker = baton_dev::worker::Worker::new(Arc::new(fresh), local.clone(), Default::default());
    assert_eq!(worker.sweep().await.unwrap(), 1);
    worker.drain().await.unwrap();
    let (rec, tl) = local.load(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Completed);
    assert_eq!(
        tl.len(),
        7,
        "user, 2 × (assistant + tool), final assistant, usage: no duplicates"
    );
}

/// A create retried with its idempotency key, after the run's first step committed but
/// before its effects went out, performs only what the create committed (the start message,
/// once more, which the step ignores): the step's own outbox is the step's, or the sweep's,
/// to perform, with grants the API function does not have.
#[tokio::test]
async fn a_retried_create_performs_none_of_its_runs_later_effects() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let svc = service(&local, Arc::new(local.clone()), ECHO_TWICE);
    let req = || baton_core::service::CreateRun {
        prompt: "go".into(),
        agent: Some("worker".into()),
        ..Default::default()
    };
    let run_id = svc
        .requests()
        .create_run("local", req(), Some("k1"))
        .await
        .unwrap()
        .run_id;
    let start = Pump::receive(&local, 1).await.remove(0);
    let flaky = crashing_once(&local);
    assert!(flaky.steps().handle(&start.1).await.is_err());
    Pump::ack(&local, start.0).await;
    let rec = local.get_run(&run_id).await.unwrap().unwrap();
    assert!(
        rec.outbox
            .iter()
            .any(|e| matches!(e, Effect::Send(m) if m.input == Input::Continue { version: 1 })),
        "the step's next message is outstanding: {:?}",
        rec.outbox
    );

    let again = svc
        .requests()
        .create_run("local", req(), Some("k1"))
        .await
        .unwrap();
    assert_eq!(again.run_id, run_id, "the same run");
    let sent = Pump::receive(&local, 10).await;
    assert!(
        sent.iter()
            .all(|(_, m)| m.input != Input::Continue { version: 1 }),
        "the create sent the step's message: {sent:?}"
    );
}

#[tokio::test]
async fn every_message_delivered_twice_gives_the_same_timeline() {
    // Run the same script once normally and once with each message handled twice.
    let mut timelines = Vec::new();
    for duplicate in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let local = LocalStore::open(dir.path()).unwrap();
        let svc = service(&local, Arc::new(local.clone()), ECHO_TWICE);
        let run_id = start_worker_run(&svc).await;
        loop {
            let batch = Pump::receive(&local, 10).await;
            if batch.is_empty() {
                break;
            }
            for (receipt, m) in batch {
                let first = svc.steps().handle(&m).await.unwrap();
                if duplicate {
                    assert!(matches!(first, Handled::Committed { .. }));
                    assert!(
                        matches!(svc.steps().handle(&m).await.unwrap(), Handled::Ignored(_)),
                        "{m:?}"
                    );
                }
                Pump::ack(&local, receipt).await;
            }
        }
        let (rec, tl) = local.load(&run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Completed);
        // What the steps decided; how long a call took is a measurement, not a decision
        // (a busy machine took 4 ms over an echo once).
        let shape: Vec<String> = tl
            .iter()
            .map(|e| {
                let mut v = serde_json::to_value(&e.body).unwrap();
                if let Some(o) = v.as_object_mut() {
                    o.remove("durationMs");
                    o.remove("latencyMs");
                }
                v.to_string()
            })
            .collect();
        timelines.push((
            shape,
            rec.run.version,
            local.events_after(0, 100).await.unwrap().len(),
        ));
    }
    assert_eq!(timelines[0], timelines[1]);
}

#[tokio::test]
async fn a_dead_lettered_message_ends_its_run_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let svc = service(&local, Arc::new(local.clone()), ECHO_TWICE);
    let run_id = start_worker_run(&svc).await;
    let (_, start) = Pump::receive(&local, 1).await.remove(0);
    // Four of its deliveries failed in its own step.
    let unreachable = || {
        StepError::Port(PortError::unavailable(
            "the model is unreachable",
            "refused",
        ))
    };
    for n in 1..=4 {
        svc.steps()
            .note_failure(&start, n, &unreachable(), Utc::now())
            .await;
    }
    svc.steps()
        .dead_letter(&start, "failed 5 times")
        .await
        .unwrap();
    let (rec, tl) = local.load(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Failed);
    assert_eq!(rec.run.outcome.error.unwrap().code, "dead_letter");
    // The error, then what the failed turn spent.
    assert!(matches!(tl.last().unwrap().body, EntryBody::Usage { .. }));
    assert!(
        matches!(&tl[tl.len() - 2].body, EntryBody::Error { message, .. } if message.contains("failed 5 times") && message.contains("the model is unreachable"))
    );
}

/// SQS counts a record deferred behind others of its run (the invocation's time ran out, or
/// an earlier record of the run failed) as a receive: a message dead-lettered with fewer
/// than four failures of its own goes back to its queue under a new deduplication id, at
/// most twice, instead of failing a healthy run; after that (a crash loop records no
/// failures) its run ends.
#[tokio::test]
async fn a_dead_letter_whose_deliveries_were_deferred_goes_back_to_its_queue() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let svc = service(&local, Arc::new(local.clone()), ECHO_TWICE);
    let run_id = start_worker_run(&svc).await;
    let (receipt, start) = Pump::receive(&local, 1).await.remove(0);
    Pump::ack(&local, receipt).await;
    // One failure of its own; the other deliveries were deferrals.
    let unreachable = StepError::Port(PortError::unavailable("the model is unreachable", "x"));
    svc.steps()
        .note_failure(&start, 1, &unreachable, Utc::now())
        .await;
    let mut dead = start.clone();
    for n in 1..=2 {
        let handled = svc
            .steps()
            .dead_letter(&dead, "failed 8 times")
            .await
            .unwrap();
        assert!(
            matches!(handled, Handled::Ignored(ref why) if why.contains("sent back")),
            "{handled:?}"
        );
        let rec = local.get_run(&run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Queued, "not failed");
        let (receipt, again) = Pump::receive(&local, 1).await.remove(0);
        assert_eq!(again.id, format!("{}#r{n}", start.id));
        assert_eq!(again.input, start.input);
        Pump::ack(&local, receipt).await;
        dead = again;
    }
    // A third time: its run ends.
    svc.steps()
        .dead_letter(&dead, "failed 8 times")
        .await
        .unwrap();
    let rec = local.get_run(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Failed);
    // And no third copy went back.
    let left = Pump::receive(&local, 10).await;
    assert!(
        left.iter().all(|(_, m)| m.id != format!("{}#r3", start.id)),
        "{left:?}"
    );
}

/// A model provider that is down fails no run: a dead letter whose last failure was the
/// provider's goes back to its queue round after round (each round's deliveries all
/// failed, more than the four a run's own failures end it after), up to
/// `MAX_OUTAGE_REQUEUES` rounds; then its run ends, naming the cause. (A failure of the
/// run's own ends it after its first round: `a_dead_lettered_message_ends_its_run_as_failed`.)
#[tokio::test]
async fn a_dead_letter_of_a_provider_outage_goes_back_until_the_outage_bound() {
    use baton_core::service::MAX_OUTAGE_REQUEUES;
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let svc = service(&local, Arc::new(local.clone()), ECHO_TWICE);
    let run_id = start_worker_run(&svc).await;
    let (receipt, start) = Pump::receive(&local, 1).await.remove(0);
    Pump::ack(&local, receipt).await;
    let down = || {
        StepError::Llm(baton_core::llm::LlmError::Unavailable {
            message: "503 Service Unavailable".into(),
            source: None,
        })
    };
    let mut dead = start.clone();
    for round in 1..=3 {
        for n in 1..=8 {
            svc.steps()
                .note_failure(&dead, n, &down(), Utc::now())
                .await;
        }
        let handled = svc
            .steps()
            .dead_letter(&dead, "failed 8 times")
            .await
            .unwrap();
        assert!(
            matches!(handled, Handled::Ignored(ref why) if why.contains("model provider")),
            "{handled:?}"
        );
        let rec = local.get_run(&run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Queued, "not failed");
        assert!(rec.run.outcome.last_error.unwrap().provider);
        let (receipt, again) = Pump::receive(&local, 1).await.remove(0);
        assert_eq!(again.id, format!("{}#r{round}", start.id));
        Pump::ack(&local, receipt).await;
        dead = again;
    }
    // Its last round: the run ends, with the provider's error as the cause.
    dead.id = format!("{}#r{MAX_OUTAGE_REQUEUES}", start.id);
    svc.steps()
        .note_failure(&dead, 8, &down(), Utc::now())
        .await;
    svc.steps()
        .dead_letter(&dead, "failed 8 times")
        .await
        .unwrap();
    let rec = local.get_run(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Failed);
    let error = rec.run.outcome.error.unwrap();
    assert_eq!(error.code, "dead_letter");
    assert!(error.message.contains("503"), "{}", error.message);
}

#[tokio::test]
async fn a_caller_sees_only_its_own_runs_and_ctas() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let script =
        r#"{"worker": [{"tool_calls": [{"name": "echo", "arguments": {"text": "danger"}}]}]}"#;
    let deps = baton_local::local_deps(&local, scripted(script), Arc::new(SystemClock));
    let agents = serde_json::json!({"agents": {"worker": {"tools": ["echo"], "approval": {"echo": "always"}}}});
    let svc = Arc::new(Service::builder(deps, catalog(Some(agents))).build());
    let req = baton_core::service::CreateRun {
        prompt: "go".into(),
        agent: Some("worker".into()),
        ..Default::default()
    };
    let run = svc.requests().create_run("alice", req, None).await.unwrap();
    let worker = baton_dev::worker::Worker::new(svc.clone(), local.clone(), Default::default());
    worker.drain().await.unwrap();
    let cta = svc
        .requests()
        .list_ctas("alice", None, None, None, 10)
        .await
        .unwrap()
        .0
        .remove(0);
    use baton_core::service::ServiceError::NotFound;
    assert!(matches!(
        svc.requests().get_run("bob", &run.run_id, 10).await,
        Err(NotFound(_))
    ));
    assert!(matches!(
        svc.requests().cancel("bob", &run.run_id, None).await,
        Err(NotFound(_))
    ));
    assert!(matches!(
        svc.requests()
            .post_message(
                "bob",
                &run.run_id,
                baton_core::service::FollowUp::text("hi"),
                None
            )
            .await,
        Err(NotFound(_))
    ));
    assert!(
        svc.requests()
            .list_ctas("bob", None, None, None, 10)
            .await
            .unwrap()
            .0
            .is_empty()
    );
    assert!(matches!(
        svc.requests().get_cta(Some("bob"), &cta.cta_id).await,
        Err(NotFound(_))
    ));
    let answer = CtaResponse::approval(true);
    assert!(matches!(
        svc.requests()
            .answer_cta(&as_api("bob"), &cta.cta_id, answer.clone())
            .await,
        Err(NotFound(_))
    ));
    assert_eq!(
        svc.requests()
            .get_cta(Some("alice"), &cta.cta_id)
            .await
            .unwrap()
            .status,
        CtaStatus::Pending
    );
    svc.requests()
        .answer_cta(&as_api("alice"), &cta.cta_id, answer)
        .await
        .unwrap();
}

/// A cold step reads its window, not the run's history: with no timeline cache (every step
/// cold), a run of 150 tool iterations reads no more entries per step than one of 15, far
/// fewer than its timeline holds.
#[tokio::test]
async fn a_cold_step_reads_its_window_whatever_the_runs_length() {
    async fn per_step(iterations: usize) -> (f64, usize) {
        let dir = tempfile::tempdir().unwrap();
        let local = LocalStore::open(dir.path()).unwrap();
        let call =
            serde_json::json!({"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]});
        let mut replies = vec![call; iterations];
        replies.push(serde_json::json!({"text": "done"}));
        let script = serde_json::json!({"worker": replies}).to_string();
        let agents = serde_json::json!({"agents": {"worker": {"tools": ["echo"],
            "maxIterations": iterations + 1, "maxToolCallsPerTurn": iterations + 1}}});
        let deps = baton_local::local_deps(&local, scripted(&script), Arc::new(SystemClock));
        let svc = Service::builder(deps, catalog(Some(agents)))
            .cache_bytes(0)
            .build();
        let svc = Arc::new(svc);
        let req = baton_core::service::CreateRun {
            prompt: "go".into(),
            agent: Some("worker".into()),
            ..Default::default()
        };
        let run = svc.requests().create_run("alice", req, None).await.unwrap();
        let worker = baton_dev::worker::Worker::new(svc.clone(), local.clone(), Default::default());
        worker.drain().await.unwrap();
        let (rec, timeline) = local.load(&run.run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Completed);
        let (warm, cold) = svc.steps().cache_use();
        assert_eq!(warm, 0, "no cache: every step cold");
        let read = local.read_stats().entries - timeline.len() as u64; // less the check's own
        (read as f64 / cold as f64, timeline.len())
    }
    let (short, _) = per_step(15).await;
    let (long, entries) = per_step(150).await;
    eprintln!(
        "entries read per cold step: {short:.2} at 15 iterations, {long:.2} at 150 ({entries} entries)"
    );
    assert!(entries > 300, "{entries} entries");
    assert!(
        long <= short + 0.5 && long < 4.0,
        "entries read per cold step: {long:.2} at 150 iterations, {short:.2} at 15"
    );
}

/// A run longer than its agent's context budget gives a model that reads the conversation
/// what the budget holds: the first message (with a note saying what is left out) and the
/// newest rounds. Warm or cold, on either store, the same messages turn by turn, each
/// exactly what the stored timeline gives (`llm::fit`, rebuilt here from the whole of it);
/// and a cold step reads about the budget, not the history: as much per step at 200 rounds
/// as at 80 (entries on the embedded store), at 320 as at 160 (read units on DynamoDB).
#[tokio::test]
async fn a_run_past_its_context_budget_gives_the_model_what_fits_and_reads_only_that() {
    const SIZES: (usize, usize) = (budgeted::BUDGET, budgeted::TEXT);
    let cache = baton_core::service::DEFAULT_CACHE_BYTES;
    let (warm, _, timeline) = budgeted::conversation(cache, 80, None, SIZES).await;
    let (cold, short, _) = budgeted::conversation(0, 80, None, SIZES).await;
    let (_, long, _) = budgeted::conversation(0, 200, None, SIZES).await;
    assert_eq!(warm.len(), 81, "80 rounds, then the answer");
    budgeted::same(&cold, &warm, "cold and warm");
    budgeted::rebuilt(&cold, &timeline, budgeted::BUDGET);
    let last = cold.last().unwrap().as_array().unwrap();
    let first = last[0]["content"].as_str().unwrap_or_default();
    assert!(first.starts_with("go\n\n[Baton: the "), "{first}");
    let results = last.iter().filter(|m| m["role"] == "tool").count();
    assert!(
        (1..40).contains(&results),
        "the newest rounds alone: {results}"
    );
    eprintln!("entries read per cold step: {short:.1} at 80 rounds, {long:.1} at 200");
    assert!(
        long <= short * 1.2,
        "a cold step reads what the budget holds, not the history: {long:.1} entries at 200 \
         rounds, {short:.1} at 80"
    );

    // The same on DynamoDB (moto), every step cold. The averages compared are over runs
    // mostly past the budget (160 and 320 rounds): a step whose conversation still fits
    // reads less, and with store format 3 a step's fixed reads are small enough that the
    // rise to the budget showed in an average over 80 rounds (10.0 read units against 12.5
    // at 160; then 12.3 at 320). Where the tail's copies fall moves a run's figure by up to
    // a seventh (10.7 to 12.5 at 160, seen): entry sizes vary with their timestamps'
    // digits; on a loaded machine (the whole test command at four threads) 9.2 at 160 against
    // 13.6 at 320 was seen, 10.2 against 11.1 alone. A step that read the history would read
    // twice as much at 320: the bound sits between.
    let aws = crate::common::aws::Emulator::start_with(None).await;
    let (on_dynamo, _, _) = budgeted::conversation(0, 80, Some(&aws), SIZES).await;
    budgeted::same(
        &on_dynamo,
        &warm,
        "DynamoDB, cold, and the embedded store, warm",
    );
    let (_, short, _) = budgeted::conversation(0, 160, Some(&aws), SIZES).await;
    let (_, long, _) = budgeted::conversation(0, 320, Some(&aws), SIZES).await;
    eprintln!("DynamoDB read units per cold step: {short:.1} at 160 rounds, {long:.1} at 320");
    assert!(
        long <= short * 1.6,
        "a cold step reads what the budget holds on DynamoDB too: {long:.1} read units at 320 \
         rounds, {short:.1} at 160"
    );
}

/// A round larger than the whole budget is still given whole, after the run's first
/// message (with its note), cold or warm.
#[tokio::test]
async fn a_round_over_the_whole_budget_is_given_after_the_first_message() {
    const SIZES: (usize, usize) = (1_000, 1_200);
    let cache = baton_core::service::DEFAULT_CACHE_BYTES;
    let (warm, _, timeline) = budgeted::conversation(cache, 8, None, SIZES).await;
    let (cold, _, _) = budgeted::conversation(0, 8, None, SIZES).await;
    budgeted::same(&cold, &warm, "cold and warm");
    budgeted::rebuilt(&cold, &timeline, SIZES.0);
    let last = cold.last().unwrap().as_array().unwrap();
    let first = last[0]["content"].as_str().unwrap_or_default();
    assert!(first.starts_with("go\n\n[Baton: the "), "{first}");
    let results = last.iter().filter(|m| m["role"] == "tool").count();
    assert_eq!(results, 1, "the newest round alone");
}

/// A follow-up on a finished run reaches the model in the step that adds it: that step
/// thinks at once, and the model is given the timeline with the new message on it (cold
/// and warm alike).
#[tokio::test]
async fn a_follow_up_reaches_the_model_in_the_step_that_adds_it() {
    for cache in [0, baton_core::service::DEFAULT_CACHE_BYTES] {
        let server = wiremock::MockServer::start().await;
        let reply = serde_json::json!({
            "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(reply))
            .mount(&server)
            .await;
        let llm = budgeted::openai(&server);
        let dir = tempfile::tempdir().unwrap();
        let local = LocalStore::open(dir.path()).unwrap();
        let agents = serde_json::json!({"agents": {"worker": {"tools": ["echo"]}}});
        let deps = baton_local::local_deps(&local, Arc::new(llm), Arc::new(SystemClock));
        let svc = Service::builder(deps, catalog(Some(agents)))
            .cache_bytes(cache)
            .build();
        let svc = Arc::new(svc);
        let req = baton_core::service::CreateRun {
            prompt: "go".into(),
            agent: Some("worker".into()),
            ..Default::default()
        };
        let run = svc.requests().create_run("alice", req, None).await.unwrap();
        let worker = baton_dev::worker::Worker::new(svc.clone(), local.clone(), Default::default());
        worker.drain().await.unwrap();
        svc.requests()
            .post_message(
                "alice",
                &run.run_id,
                baton_core::service::FollowUp::text("and then?"),
                None,
            )
            .await
            .unwrap();
        worker.drain().await.unwrap();
        let rec = local.get_run(&run.run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Completed);
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), 2, "one think a turn");
        let body: serde_json::Value = serde_json::from_slice(&requests[1].body).unwrap();
        let messages = body["messages"].as_array().unwrap();
        let roles: Vec<_> = messages
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(
            roles,
            ["user", "assistant", "user"],
            "cache {cache}: {body}"
        );
        assert_eq!(messages[2]["content"], "and then?", "cache {cache}");
    }
}

/// The budgeted conversation's set-up: a mock OpenAI-compatible model that calls `echo`
/// for a number of rounds, then answers.
mod budgeted {
    use super::*;
    use baton_core::timeline::Entry;

    pub const BUDGET: usize = 6_000;

    /// The size of each round's echo text: a round of about 330 bytes of the model's text.
    pub const TEXT: usize = 150;

    struct Rounds {
        seen: std::sync::Mutex<Vec<serde_json::Value>>,
        rounds: usize,
        text: usize,
    }

    impl wiremock::Respond for Rounds {
        fn respond(&self, req: &wiremock::Request) -> wiremock::ResponseTemplate {
            let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
            let mut seen = self.seen.lock().unwrap();
            seen.push(body["messages"].clone());
            let n = seen.len();
            let message = if n <= self.rounds {
                let text = format!("r{n}-{}", "x".repeat(self.text));
                serde_json::json!({"role": "assistant", "content": format!("round {n}"),
                    "tool_calls": [{"id": format!("call_{n}"), "type": "function", "function": {
                    "name": "echo", "arguments": serde_json::json!({"text": text}).to_string()}}]})
            } else {
                serde_json::json!({"role": "assistant", "content": "done"})
            };
            wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "choices": [{"message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}))
        }
    }

    struct Shared(Arc<Rounds>);

    impl wiremock::Respond for Shared {
        fn respond(&self, req: &wiremock::Request) -> wiremock::ResponseTemplate {
            self.0.respond(req)
        }
    }

    /// The requests the model got, what a cold step read (entries on the embedded store,
    /// read units on DynamoDB), and the timeline. With `aws`, the run's store is DynamoDB
    /// on the emulator (its queue, bus and timers stay embedded).
    pub async fn conversation(
        cache_bytes: usize,
        rounds: usize,
        aws: Option<&crate::common::aws::Emulator>,
        (budget, text): (usize, usize),
    ) -> (Vec<serde_json::Value>, f64, Vec<Entry>) {
        let server = wiremock::MockServer::start().await;
        let seen = Arc::new(Rounds {
            seen: Default::default(),
            rounds,
            text,
        });
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .respond_with(Shared(seen.clone()))
            .mount(&server)
            .await;
        let llm = budgeted::openai(&server);
        let dir = tempfile::tempdir().unwrap();
        let local = LocalStore::open(dir.path()).unwrap();
        let agents = serde_json::json!({"agents": {"worker": {"tools": ["echo"],
            "maxIterations": rounds + 1, "maxToolCallsPerTurn": rounds * 8 + 1,
            "contextBytes": budget}}});
        let meter = baton_aws::sdk::Meter::shared();
        let store: Arc<dyn Store> = match aws {
            None => Arc::new(local.clone()),
            Some(aws) => {
                let sdk = aws.sdk().await;
                let names = aws.names(&format!("budget{rounds}"));
                let p = baton_aws::provision::ensure(
                    &sdk,
                    &names,
                    "arn:aws:iam::123456789012:role/scheduler",
                )
                .await
                .unwrap();
                Arc::new(baton_aws::dynamo::DynamoStore::new(
                    aws_sdk_dynamodb::Client::new(&sdk),
                    &p.config.table,
                    90,
                    meter.clone(),
                ))
            }
        };
        let deps = match aws {
            None => baton_local::local_deps(&local, Arc::new(llm), Arc::new(SystemClock)),
            Some(_) => Deps {
                store: store.clone(),
                sending_store: None,
                ..baton_local::local_deps(&local, Arc::new(llm), Arc::new(SystemClock))
            },
        };
        let svc = Service::builder(deps, catalog(Some(agents)))
            .cache_bytes(cache_bytes)
            .build();
        let svc = Arc::new(svc);
        let req = baton_core::service::CreateRun {
            prompt: "go".into(),
            agent: Some("worker".into()),
            ..Default::default()
        };
        let run = svc.requests().create_run("alice", req, None).await.unwrap();
        let worker = baton_dev::worker::Worker::new(svc.clone(), local.clone(), Default::default());
        let units = meter.snapshot().read_units;
        worker.drain().await.unwrap();
        let read = match aws {
            None => local.read_stats().entries as f64,
            Some(_) => meter.snapshot().read_units - units,
        };
        let (rec, timeline) = store.load(&run.run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Completed);
        let (_, cold) = svc.steps().cache_use();
        let requests = seen.seen.lock().unwrap().clone();
        (requests, read / cold.max(1) as f64, timeline)
    }

    /// The OpenAI-compatible client, pointed at `server`, without retries.
    pub fn openai(server: &wiremock::MockServer) -> baton_llm::openai::OpenAiLlm {
        baton_llm::openai::OpenAiLlm::new(baton_llm::openai::OpenAiConfig {
            max_tokens: None,
            base_url: format!("{}/v1", server.uri()),
            api_key: Some("sk-mock".into()),
            model: "mock".into(),
            max_retries: 0,
            backoff: baton_llm::retry::Backoff {
                initial: std::time::Duration::from_millis(5),
                max: std::time::Duration::from_millis(20),
            },
            timeout: std::time::Duration::from_secs(5),
        })
        .unwrap()
    }

    /// Two conversations sent the model the same messages, turn by turn.
    pub fn same(a: &[serde_json::Value], b: &[serde_json::Value], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: thinks");
        if let Some(k) = (0..a.len()).find(|&k| a[k] != b[k]) {
            panic!("think {k}: {what} gave the model different messages");
        }
    }

    /// Each think's messages are what the stored timeline gives, rebuilt from it: the
    /// entries before its reply, fitted to the budget.
    pub fn rebuilt(requests: &[serde_json::Value], timeline: &[Entry], budget: usize) {
        let replies: Vec<u64> = timeline
            .iter()
            .filter(|e| matches!(e.body, EntryBody::Assistant { .. }))
            .map(|e| e.seq)
            .collect();
        assert_eq!(replies.len(), requests.len());
        for (k, (request, reply)) in requests.iter().zip(&replies).enumerate() {
            let before = &timeline[..*reply as usize];
            let given = baton_core::llm::fit(None, before, budget);
            let expected = baton_core::llm::project("", &given);
            let messages = request.as_array().unwrap();
            assert_eq!(messages.len(), expected.len(), "think {k}: {request}");
            let ids = |m: &serde_json::Value| m["tool_call_id"].as_str().map(str::to_owned);
            let sent: Vec<_> = messages.iter().filter_map(ids).collect();
            let rebuilt: Vec<_> = expected
                .iter()
                .filter_map(|m| match m {
                    baton_core::llm::ChatMessage::Tool { tool_call_id, .. } => {
                        Some(tool_call_id.clone())
                    }
                    _ => None,
                })
                .collect();
            assert_eq!(sent, rebuilt, "think {k}");
        }
    }
}

/// A model that reads the conversation is given all of it (within its budget), whether the
/// step was warm or cold: with no cache, each think reads back from its window and sends
/// the same messages as with one.
#[tokio::test]
async fn a_cold_think_gives_a_real_model_the_whole_conversation() {
    const SIZES: (usize, usize) = (budgeted::BUDGET, budgeted::TEXT);
    let cache = baton_core::service::DEFAULT_CACHE_BYTES;
    let (warm, _, timeline) = budgeted::conversation(cache, 6, None, SIZES).await;
    let (cold, _, _) = budgeted::conversation(0, 6, None, SIZES).await;
    assert_eq!(warm.len(), 7, "six echoes, then the answer");
    budgeted::same(&cold, &warm, "cold and warm");
    budgeted::rebuilt(&cold, &timeline, budgeted::BUDGET);
    let last = cold.last().unwrap().as_array().unwrap();
    let results = last.iter().filter(|m| m["role"] == "tool").count();
    assert_eq!(results, 6, "the last think saw every result: {last:?}");
    assert_eq!(last[0]["content"], "go", "nothing left out");
}

/// An API caller `id`, in no group.
fn as_api(id: &str) -> baton_core::service::Answerer {
    baton_core::service::Answerer::caller(id, Vec::new(), baton_core::cta::Via::Api)
}
