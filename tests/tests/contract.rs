//! Port contract tests. Each check is written against the traits, so the same suite runs
//! against every adapter: here the embedded one; the AWS adapters add their instantiation
//! and what is DynamoDB's own (`contract/aws.rs`). What the service does over the ports is
//! in `service.rs`.

use crate::common;
use baton_core::ports::{RunReads, RunWrites};

use std::sync::Arc;

use baton_core::cta::{Cta, CtaRequest, CtaResponse, CtaStatus, Settlement};
use baton_core::error::PortError;
use baton_core::message::{Effect, Event, Input, StepMessage, Transition};
use baton_core::ports::{
    Bus, Created, CtaPosition, CtaQuery, Queue, RunPosition, RunQuery, Scheduler, SendingStore,
    Settled, Store, SystemClock,
};
use baton_core::run::{NewRun, Run, RunStatus};
use baton_core::service::{Deps, Service};
use baton_core::timeline::{Entry, EntryBody};
use baton_local::store::LocalStore;
use chrono::{DateTime, Utc};
use common::*;

/// The receive side of a queue, as a test drives it.
#[async_trait::async_trait]
pub(crate) trait Pump: Send + Sync {
    /// Receives what is available now (group heads only), hiding it until acked.
    async fn receive(&self, max: usize) -> Vec<(String, StepMessage)>;
    async fn ack(&self, receipt: String);
}

#[async_trait::async_trait]
impl Pump for LocalStore {
    async fn receive(&self, max: usize) -> Vec<(String, StepMessage)> {
        LocalStore::receive(self, max, std::time::Duration::from_secs(60))
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.receipt.to_string(), d.message.unwrap()))
            .collect()
    }
    async fn ack(&self, receipt: String) {
        LocalStore::ack(self, receipt.parse().unwrap())
            .await
            .unwrap()
    }
}

fn new_run(id: &str, owner: &str) -> (Run, Vec<Entry>) {
    let mut run = Run::new(NewRun::top_level(id, "explore", owner, Utc::now()));
    run.next_seq = 1;
    (
        run,
        vec![Entry {
            seq: 0,
            at: Utc::now(),
            body: EntryBody::user("hi"),
        }],
    )
}

fn msg(run: &str, id: &str) -> StepMessage {
    StepMessage {
        run_id: run.into(),
        id: id.into(),
        input: Input::Continue { version: 0 },
        owed: false,
    }
}

fn cta(run: &Run, id: &str) -> Cta {
    Cta {
        budget: None,
        cta_id: id.into(),
        run_id: run.run_id.clone(),
        root_run_id: None,
        agent: None,
        run_prompt: None,
        tool_call_id: "call_0_0".into(),
        owner: run.owner.clone(),
        request: CtaRequest::Approval {
            message: "ok?".into(),
        },
        // Kept by every store with the question.
        default: Some(CtaResponse::Approval {
            raise_usd: None,
            approved: false,
            reason: Some("no answer".into()),
        }),
        status: CtaStatus::Pending,
        response: None,
        gate: false,
        gated: None,
        created_at: Utc::now(),
        expires_at: Utc::now() + chrono::Duration::days(30),
        resolved_at: None,
        defaulted: false,
        responder: None,
        link_nonce: Some("lnk_contract".into()),
        assignees: Vec::new(),
        required: 1,
        approvals: Vec::new(),
        audit: Vec::new(),
        notify: Vec::new(),
        remind_after_seconds: None,
        escalate_after_seconds: None,
        escalate_to: Vec::new(),
        deliveries: Vec::new(),
        rev: 0,
    }
}

/// A transition from `run` that appends one assistant entry and carries `effects`.
fn next(run: &Run, effects: Vec<Effect>) -> Transition {
    let mut r = run.clone();
    r.version += 1;
    r.status = RunStatus::Running;
    let entry = Entry {
        seq: r.next_seq,
        at: Utc::now(),
        body: EntryBody::reply(Some("x".repeat(3000))),
    };
    r.next_seq += 1;
    Transition {
        daily_spend: false,
        budget_raise: None,
        run: r,
        appended: vec![entry],
        updated: vec![],
        new_ctas: vec![],
        new_runs: vec![],
        effects,
        release_slot: false,
        take_slot: false,
        slot_limit: None,
        spent_usd: 0.0,
    }
}

/// Money at its bounds: a tree budgeted at the most (a million dollars), a raise of the
/// least (a millionth) and the least a think can cost (a token at the least price, 10⁻¹²)
/// are kept and read back as written, on the day's spending too (DynamoDB holds numbers
/// from 10⁻¹³⁰ with 38 digits; DynamoDB Local enforces them).
async fn money_contract(store: &dyn Store) {
    use baton_core::budget::{Budget, MAX_USD, MIN_USD, Raise};
    let (mut run, first) = new_run("run_money", "payer");
    run.origin.budget = Some(Budget {
        budget_usd: MAX_USD,
    });
    store
        .create_run(&run, &first, &[], None, None)
        .await
        .unwrap();
    let least = 1e-12;
    let mut t = next(&run, vec![]);
    t.spent_usd = least;
    t.daily_spend = true;
    t.budget_raise = Some(Raise {
        by_usd: MIN_USD,
        run_id: run.run_id.clone(),
        cta_id: "cta_money".into(),
        responder: None,
        at: Utc::now(),
    });
    store.commit(run.version, &t).await.unwrap();
    let ledger = store.ledger("run_money").await.unwrap().expect("a ledger");
    let close = |a: f64, b: f64| (a - b).abs() <= b * 1e-12;
    assert!(close(ledger.budget_usd, MAX_USD + MIN_USD), "{ledger:?}");
    assert!(close(ledger.spent_usd, least), "{ledger:?}");
    assert_eq!(ledger.raises.len(), 1, "{ledger:?}");
    assert!(close(ledger.raises[0].by_usd, MIN_USD), "{ledger:?}");
    let day = store
        .spent_on("payer", Utc::now().date_naive())
        .await
        .unwrap();
    assert!(close(day, least), "{day}");
}

async fn store_contract(store: Arc<dyn Store>) {
    money_contract(&*store).await;
    // Create, read back, idempotency per owner.
    let (run, first) = new_run("run_c1", "alice");
    assert_eq!(
        store
            .create_run(&run, &first, &[], Some("k"), None)
            .await
            .unwrap(),
        Created::Created
    );
    let (other, _) = new_run("run_c2", "alice");
    match store
        .create_run(&other, &first, &[], Some("k"), None)
        .await
        .unwrap()
    {
        Created::Existing(rec) => assert_eq!(rec.run.run_id, "run_c1"),
        c => panic!("expected the existing run, got {c:?}"),
    }
    let (bob, _) = new_run("run_c3", "bob");
    assert_eq!(
        store
            .create_run(&bob, &first, &[], Some("k"), None)
            .await
            .unwrap(),
        Created::Created,
        "keys are per owner"
    );
    assert!(store.get_run("run_c2").await.unwrap().is_none());
    let (rec, tl) = store.load("run_c1").await.unwrap().unwrap();
    assert_eq!((rec.run.clone(), tl.clone()), (run.clone(), first.clone()));
    assert!(store.load("run_missing").await.unwrap().is_none());

    // A run created with a long history (a fork's copy) reads back whole, even when it
    // is more than one DynamoDB transaction holds (4 MB): 20 entries of ~380 KB of text
    // that does not compress.
    let (mut long, _) = new_run("run_c_long", "alice");
    let history: Vec<Entry> = (0..20u64)
        .map(|seq| Entry {
            seq,
            at: Utc::now(),
            body: EntryBody::user(noise(seq, 380 * 1024)),
        })
        .collect();
    long.next_seq = history.len() as u64;
    store
        .create_run(&long, &history, &[], None, None)
        .await
        .unwrap();
    let (rec, tl) = store.load("run_c_long").await.unwrap().unwrap();
    assert_eq!(rec.run, long);
    assert_eq!(tl, history);

    // A commit at the right version lands whole, with its outbox.
    let send = Effect::Send(msg("run_c1", "m1"));
    let t1 = next(&run, vec![send.clone()]);
    store.commit(0, &t1).await.unwrap();
    let rec = store.get_run("run_c1").await.unwrap().unwrap();
    assert_eq!(rec.run.version, 1);
    assert_eq!(rec.outbox, vec![send.clone()]);

    // A stale commit is a conflict and changes nothing.
    let stale = next(&run, vec![]);
    assert!(matches!(
        store.commit(0, &stale).await,
        Err(PortError::Conflict)
    ));
    let (rec, tl) = store.load("run_c1").await.unwrap().unwrap();
    assert_eq!(rec.run, t1.run);
    assert_eq!(tl.len(), 2);
    assert_eq!(tl[1], t1.appended[0], "a 3 KB entry round-trips");

    // Clearing the outbox of an older version does not touch a newer one.
    let t2 = next(&t1.run, vec![Effect::Send(msg("run_c1", "m2"))]);
    store.commit(1, &t2).await.unwrap();
    store.clear_outbox("run_c1", 1).await.unwrap();
    assert_eq!(
        store.get_run("run_c1").await.unwrap().unwrap().outbox.len(),
        1
    );
    store.clear_outbox("run_c1", 2).await.unwrap();
    assert!(
        store
            .get_run("run_c1")
            .await
            .unwrap()
            .unwrap()
            .outbox
            .is_empty()
    );

    // The sweep's view: a parking outbox (no next message of its own run) older than the
    // cut-off, until it is cleared; a continuing outbox proves itself and is never listed.
    let (parked, parked_tl) = new_run("run_sw", "alice");
    store
        .create_run(&parked, &parked_tl, &[], None, None)
        .await
        .unwrap();
    let event = Effect::Publish(Event {
        id: "ev_sw".into(),
        detail_type: "run.state".into(),
        detail: serde_json::json!({}),
        time: Utc::now(),
    });
    let p1 = next(&parked, vec![event, Effect::Send(msg("run_other", "m_sw"))]);
    store.commit(0, &p1).await.unwrap();
    let later = p1.run.updated_at + chrono::Duration::seconds(1);
    let earlier = p1.run.updated_at - chrono::Duration::seconds(1);
    assert_eq!(store.stale_outboxes(later, 10).await.unwrap(), ["run_sw"]);
    assert!(store.stale_outboxes(earlier, 10).await.unwrap().is_empty());
    store.clear_outbox("run_sw", 1).await.unwrap();
    assert!(store.stale_outboxes(later, 10).await.unwrap().is_empty());
    let p2 = next(&p1.run, vec![Effect::Send(msg("run_sw", "m_sw2"))]);
    store.commit(1, &p2).await.unwrap();
    assert!(
        store.stale_outboxes(later, 10).await.unwrap().is_empty(),
        "run_c1 and run_sw have continuing outboxes"
    );

    // CTAs and child runs are created with the commit; resolved entries are replaced.
    let mut t3 = next(&t2.run, vec![]);
    t3.new_ctas.push(cta(&t2.run, "cta_c1"));
    let (child, child_tl) = new_run("run_c1_child", "alice");
    t3.new_runs.push((child.clone(), child_tl));
    let mut resolved = t1.appended[0].clone();
    resolved.body = EntryBody::Notice {
        code: "n".into(),
        message: "replaced".into(),
    };
    t3.updated.push(resolved.clone());
    store.commit(2, &t3).await.unwrap();
    assert_eq!(
        store.get_cta("cta_c1").await.unwrap().unwrap().status,
        CtaStatus::Pending
    );
    assert_eq!(
        store.get_run("run_c1_child").await.unwrap().unwrap().run,
        child
    );
    assert_eq!(store.load("run_c1").await.unwrap().unwrap().1[1], resolved);

    // Paging the timeline.
    let page = store.entries_after("run_c1", Some(1), 10).await.unwrap();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(
        store.entries_after("run_c1", None, 2).await.unwrap().len(),
        2
    );
    // A cursor past every seq, up to the largest, is past every entry.
    for after in [u64::MAX, i64::MAX as u64, i64::MAX as u64 + 1, 1_000_000] {
        assert!(
            store
                .entries_after("run_c1", Some(after), 10)
                .await
                .unwrap()
                .is_empty(),
            "after {after}"
        );
    }

    // A step's window: the run as of the same commit, and the entries from a seq on
    // (a resolved entry as resolved), whatever the seq.
    let (rec, whole) = store.load("run_c1").await.unwrap().unwrap();
    for from in [0, 1, 2, 3, 4, 100] {
        let (r, window) = store.load_from("run_c1", from).await.unwrap().unwrap();
        assert_eq!(r.run, rec.run, "from {from}");
        let want: Vec<Entry> = whole.iter().filter(|e| e.seq >= from).cloned().collect();
        assert_eq!(window, want, "from {from}");
    }
    assert!(store.load_from("run_nope", 1).await.unwrap().is_none());
    // The same, with the window's start decided from the run the store read.
    for from in [0, 2, 100] {
        let window = move |_: &Run| from;
        let (r, entries, base) = store.load_window("run_c1", &window).await.unwrap().unwrap();
        assert_eq!((r.run, base), (rec.run.clone(), from), "from {from}");
        let want: Vec<Entry> = whole.iter().filter(|e| e.seq >= from).cloned().collect();
        assert_eq!(entries, want, "from {from}");
    }
    let next_seq = |run: &Run| run.next_seq;
    assert!(
        store
            .load_window("run_nope", &next_seq)
            .await
            .unwrap()
            .is_none()
    );

    // Settling a CTA: the first write wins, later ones lose and see the winner.
    let answer = CtaResponse::approval(true);
    match store
        .settle_cta(
            "cta_c1",
            &Settlement::Answered {
                response: answer.clone(),
                responder: Some("someone".into()),
                via: Some(baton_core::cta::Via::Api),
            },
            Utc::now(),
        )
        .await
        .unwrap()
    {
        Settled::Won(c) => assert_eq!(
            (c.status, c.response, c.responder.as_deref()),
            (CtaStatus::Answered, Some(answer.clone()), Some("someone"))
        ),
        s => panic!("{s:?}"),
    }
    match store
        .settle_cta("cta_c1", &Settlement::Expired, Utc::now())
        .await
        .unwrap()
    {
        Settled::Lost(c) => {
            assert_eq!(c.status, CtaStatus::Answered);
            assert_eq!(
                c.responder.as_deref(),
                Some("someone"),
                "the winner is kept"
            );
        }
        s => panic!("{s:?}"),
    }
    assert_eq!(
        store
            .settle_cta("cta_nope", &Settlement::Expired, Utc::now())
            .await
            .unwrap(),
        Settled::NotFound
    );

    // A commit larger than one DynamoDB item (8 incompressible ~60 KB results) round-trips.
    let (big, first) = new_run("run_big", "alice");
    store
        .create_run(&big, &first, &[], None, None)
        .await
        .unwrap();
    let mut t = next(&big, vec![]);
    t.appended.clear();
    t.run.next_seq = 1;
    for i in 0..8 {
        t.appended.push(Entry {
            seq: t.run.next_seq,
            at: Utc::now(),
            body: EntryBody::user(noise(i, 60_000)),
        });
        t.run.next_seq += 1;
    }
    store.commit(0, &t).await.unwrap();
    let (_, tl) = store.load("run_big").await.unwrap().unwrap();
    assert_eq!(tl.len(), 9);
    assert_eq!(&tl[1..], &t.appended[..]);
    assert_eq!(
        store.entries_after("run_big", Some(4), 100).await.unwrap(),
        t.appended[4..].to_vec()
    );
    // A window that starts inside an item stored in parts.
    assert_eq!(
        store.load_from("run_big", 6).await.unwrap().unwrap().1,
        t.appended[5..].to_vec()
    );

    // Listing by owner and status.
    assert_eq!(
        store
            .list_ctas("alice", &every_cta(None))
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        store
            .list_ctas("alice", &every_cta(Some(CtaStatus::Pending)))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list_ctas("bob", &every_cta(None))
            .await
            .unwrap()
            .is_empty()
    );

    // A retrying step's failure is kept beside the run, read back with it, and cleared by
    // the next commit; it never moves the version.
    let (r, first) = new_run("run_fail", "alice");
    store.create_run(&r, &first, &[], None, None).await.unwrap();
    let failure = baton_core::run::LastError {
        message: "cannot reach the model".into(),
        attempts: 2,
        at: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        message_id: Some("run_fail:start".into()),
        failures: 2,
        provider: true,
    };
    store.record_failure("run_fail", &failure).await.unwrap();
    let rec = store.get_run("run_fail").await.unwrap().unwrap();
    assert_eq!(rec.run.outcome.last_error.as_ref(), Some(&failure));
    assert_eq!(rec.run.version, 0);
    let (loaded, _) = store.load("run_fail").await.unwrap().unwrap();
    assert_eq!(loaded.run.outcome.last_error, Some(failure));
    store.commit(0, &next(&r, vec![])).await.unwrap();
    assert_eq!(
        store
            .get_run("run_fail")
            .await
            .unwrap()
            .unwrap()
            .run
            .outcome
            .last_error,
        None
    );

    // A finished run's next turn is claimed by one follow-up: again by the same one, not
    // by another until the claim goes stale or the run commits; never moving the version.
    let t = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let minute = chrono::Duration::minutes(1);
    let claim = |m: &'static str, at, stale| store.claim_turn("run_fail", m, at, stale);
    assert!(claim("msg_a", t, t - minute).await.unwrap());
    assert!(
        claim("msg_a", t, t - minute).await.unwrap(),
        "its own again"
    );
    assert!(!claim("msg_b", t, t - minute).await.unwrap(), "claimed");
    assert!(
        claim("msg_b", t + minute * 20, t + minute).await.unwrap(),
        "stale"
    );
    assert_eq!(
        store
            .get_run("run_fail")
            .await
            .unwrap()
            .unwrap()
            .run
            .version,
        1
    );
    store
        .commit(
            1,
            &next(
                &store.get_run("run_fail").await.unwrap().unwrap().run,
                vec![],
            ),
        )
        .await
        .unwrap();
    assert!(
        claim("msg_c", t, t - minute).await.unwrap(),
        "a commit clears it"
    );
    assert!(
        !store
            .claim_turn("run_missing", "msg_c", t, t - minute)
            .await
            .unwrap()
    );

    // A run's waiting follow-ups: `cap` places, a retry no new one. A follow-up its run
    // holds in its queue keeps its place however old; one that never reached the run
    // (admitted before `stale`, not held) gives it back when a follow-up needs it.
    let (fu, first) = new_run("run_fu", "alice");
    store
        .create_run(&fu, &first, &[], None, None)
        .await
        .unwrap();
    let (t0, quarter) = (Utc::now(), chrono::Duration::minutes(15));
    let admit = |id: &'static str, at: DateTime<Utc>| {
        let store = store.clone();
        async move {
            store
                .admit_follow_up("run_fu", id, 3, at, at - quarter)
                .await
                .unwrap()
        }
    };
    for id in ["msg_1", "msg_2", "msg_3", "msg_1"] {
        assert!(admit(id, t0).await, "{id}");
    }
    assert!(
        !admit("msg_4", t0).await,
        "three wait: the fourth is refused"
    );
    store
        .hold_follow_ups("run_fu", &["msg_1".into()])
        .await
        .unwrap();
    let later = t0 + chrono::Duration::minutes(20);
    assert!(
        admit("msg_4", later).await,
        "the places of the two that never reached the run are given back"
    );
    assert!(admit("msg_5", later).await);
    assert!(
        !admit("msg_6", later).await,
        "the held one and two fresh ones wait"
    );
    store
        .release_follow_ups("run_fu", &["msg_1".into(), "msg_none".into()])
        .await
        .unwrap();
    assert!(admit("msg_6", later).await, "a released place is free");
    assert!(
        !store
            .admit_follow_up("run_missing", "msg_1", 3, t0, t0 - quarter)
            .await
            .unwrap()
    );
    store
        .hold_follow_ups("run_missing", &["msg_1".into()])
        .await
        .unwrap();
    // The first places of a run, taken at once: each admitted (the map the first makes).
    let (fu2, first) = new_run("run_fu2", "alice");
    store
        .create_run(&fu2, &first, &[], None, None)
        .await
        .unwrap();
    let mut posts = tokio::task::JoinSet::new();
    for i in 0..5 {
        let store = store.clone();
        posts.spawn(async move {
            let id = format!("msg_at_once_{i}");
            store
                .admit_follow_up("run_fu2", &id, 5, t0, t0 - quarter)
                .await
        });
    }
    let at_once = posts.join_all().await;
    assert!(at_once.iter().all(|r| matches!(r, Ok(true))), "{at_once:?}");
    assert!(
        !store
            .admit_follow_up("run_fu2", "msg_sixth", 5, t0, t0 - quarter)
            .await
            .unwrap()
    );

    // An answer's resolution stays outstanding until cleared; a cancel has none.
    let before = Utc::now() + chrono::Duration::seconds(5);
    let outstanding = store.stale_resolutions(before, 10).await.unwrap();
    assert!(
        !outstanding.is_empty(),
        "the answers and expiries above are outstanding"
    );
    assert!(outstanding.iter().all(|c| c.status != CtaStatus::Cancelled));
    for c in &outstanding {
        store.clear_resolution(&c.cta_id).await.unwrap();
    }
    assert!(
        store
            .stale_resolutions(before, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn queue_contract(queue: Arc<dyn Queue>, pump: Arc<dyn Pump>) {
    // Deduplication by id, FIFO per run, runs independent of each other.
    queue
        .send(&[msg("run_a", "a1"), msg("run_a", "a2"), msg("run_b", "b1")])
        .await
        .unwrap();
    queue.send(&[msg("run_a", "a1")]).await.unwrap();
    let ids = |v: &[(String, StepMessage)], run: &str| -> Vec<String> {
        v.iter()
            .filter(|(_, m)| m.run_id == run)
            .map(|(_, m)| m.id.clone())
            .collect()
    };
    let first = pump.receive(10).await;
    let a = ids(&first, "run_a");
    assert!(
        a == ["a1"] || a == ["a1", "a2"],
        "a run's messages come in order: {a:?}"
    );
    assert_eq!(ids(&first, "run_b"), ["b1"], "another run is not held up");
    // While run_a has a message in flight, none of its later messages is handed out.
    queue.send(&[msg("run_a", "a3")]).await.unwrap();
    assert!(
        ids(&pump.receive(10).await, "run_a").is_empty(),
        "run_a is in flight"
    );
    let mut seen = a;
    for (receipt, _) in first {
        pump.ack(receipt).await;
    }
    for _ in 0..10 {
        let batch = pump.receive(10).await;
        if batch.is_empty() {
            break;
        }
        seen.extend(ids(&batch, "run_a"));
        for (receipt, _) in batch {
            pump.ack(receipt).await;
        }
    }
    assert_eq!(
        seen,
        ["a1", "a2", "a3"],
        "each once, in order: the duplicate a1 was dropped"
    );
}

async fn bus_and_scheduler_contract(bus: Arc<dyn Bus>, scheduler: Arc<dyn Scheduler>) {
    let ev = Event {
        id: "e1".into(),
        detail_type: "run.state".into(),
        detail: serde_json::json!({"runId": "r"}),
        time: Utc::now(),
    };
    bus.publish(std::slice::from_ref(&ev)).await.unwrap();
    bus.publish(&[ev]).await.unwrap();
    let at = Utc::now() + chrono::Duration::days(30);
    scheduler.schedule("cta_s", "run_s", at).await.unwrap();
    scheduler.schedule("cta_s", "run_s", at).await.unwrap();
    scheduler.unschedule("cta_s").await.unwrap();
    scheduler.unschedule("cta_s").await.unwrap();
}

/// Files: put twice is harmless, read back whole with their name and type, a missing key is
/// `None`; a 3 MB file too.
async fn blobs_contract(blobs: Arc<dyn baton_core::ports::Blobs>) {
    use baton_core::ports::Blob;
    let blob = Blob {
        name: "résumé 100%.csv".into(),
        media_type: "text/csv".into(),
        bytes: b"region,sales\neu,12\n".to_vec(),
    };
    let key = "run_b1/file_0123456789abcdef0123456789abcdef";
    blobs.put(key, &blob).await.unwrap();
    blobs.put(key, &blob).await.unwrap();
    assert_eq!(blobs.get(key).await.unwrap(), Some(blob));
    assert_eq!(blobs.get("run_b1/file_nothing").await.unwrap(), None);
    let big = Blob {
        name: "big.bin".into(),
        media_type: "application/octet-stream".into(),
        bytes: (0..3 * 1024 * 1024).map(|i| (i % 251) as u8).collect(),
    };
    blobs.put("run_b1/file_big", &big).await.unwrap();
    assert_eq!(blobs.get("run_b1/file_big").await.unwrap(), Some(big));
}

#[tokio::test]
async fn the_embedded_adapter_passes_the_port_contracts() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    store_contract(Arc::new(local.clone())).await;
    cta_pages_contract(Arc::new(local.clone())).await;
    run_pages_contract(Arc::new(local.clone())).await;
    queue_contract(Arc::new(local.clone()), Arc::new(local.clone())).await;
    bus_and_scheduler_contract(Arc::new(local.clone()), Arc::new(local.clone())).await;
    blobs_contract(Arc::new(baton_local::blobs::FileBlobs::new(dir.path()))).await;
    // A key that is not `<run>/<file>` names no path.
    let blobs = baton_local::blobs::FileBlobs::new(dir.path());
    for bad in ["../escape/x", "run/../../x", "x"] {
        assert!(
            baton_core::ports::Blobs::get(&blobs, bad).await.is_err(),
            "{bad}"
        );
    }
    // Adapter-specific read-backs of what the generic checks did.
    assert_eq!(
        local.events_after(0, 10).await.unwrap().len(),
        1,
        "events are deduplicated by id"
    );
    assert_eq!(local.timer("cta_s").await.unwrap(), None);
    // And everything is on disk: a second handle sees it.
    let again = LocalStore::open(dir.path()).unwrap();
    assert_eq!(
        again.get_run("run_c1").await.unwrap().unwrap().run.version,
        3
    );
}

/// The embedded store is its host's queue: a step that only sends commits its messages in
/// the commit's own transaction, and acknowledgements ride on the next receive.
#[tokio::test]
async fn the_embedded_store_commits_sends_with_the_step_and_acks_with_the_next_receive() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let (run, first) = new_run("run_e1", "alice");
    local
        .create_run(&run, &first, &[], None, None)
        .await
        .unwrap();
    let sends = vec![
        Effect::Send(msg("run_e1", "e1")),
        Effect::Send(msg("run_child", "c1")),
    ];
    let t1 = next(&run, sends);
    local.commit_sending(0, &t1).await.unwrap();
    let rec = local.get_run("run_e1").await.unwrap().unwrap();
    assert_eq!(rec.run.version, 1);
    assert!(rec.outbox.is_empty(), "nothing is left to perform");
    // A stale commit enqueues nothing; nor does one with an effect it cannot perform.
    let stale = next(&run, vec![Effect::Send(msg("run_e1", "stale"))]);
    assert!(matches!(
        local.commit_sending(0, &stale).await,
        Err(PortError::Conflict)
    ));
    let publish = Effect::Publish(Event {
        id: "ev".into(),
        detail_type: "run.state".into(),
        detail: serde_json::json!({}),
        time: Utc::now(),
    });
    let mixed = next(&t1.run, vec![Effect::Send(msg("run_e1", "e2")), publish]);
    assert!(local.commit_sending(1, &mixed).await.is_err());
    assert_eq!(
        local.get_run("run_e1").await.unwrap().unwrap().run.version,
        1
    );
    let got = Pump::receive(&local, 10).await;
    let mut ids: Vec<_> = got.iter().map(|(_, m)| m.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["c1", "e1"], "both messages, once each, and no other");

    // An acknowledgement held for the next receive is applied by it, and that same receive
    // hands out the group's next message.
    local.send(&[msg("run_e1", "e3")]).await.unwrap();
    assert!(
        Pump::receive(&local, 10).await.is_empty(),
        "e1 is in flight"
    );
    for (receipt, m) in &got {
        if m.id == "e1" {
            local.ack_later(receipt.parse().unwrap());
        }
    }
    let after = Pump::receive(&local, 10).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].1.id, "e3");
    // A process that dies holding an acknowledgement leaves its message in flight; the
    // next one's start-up releases and redelivers it (a duplicate the engine ignores).
    local.ack_later(after[0].0.parse().unwrap());
    drop(local);
    let again = LocalStore::open(dir.path()).unwrap();
    assert_eq!(again.release_leases().await.unwrap(), 2, "c1 and e3");
    let redelivered = Pump::receive(&again, 10).await;
    let mut ids: Vec<_> = redelivered.iter().map(|(_, m)| m.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["c1", "e3"]);
    // Flushed, the acknowledgements empty the queue.
    for (receipt, _) in &redelivered {
        again.ack_later(receipt.parse().unwrap());
    }
    assert_eq!(again.queue_depth().await.unwrap(), 0);
}

pub(crate) mod aws;
mod pages;

use pages::{cta_pages_contract, run_pages_contract};
