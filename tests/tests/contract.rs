//! Port contract tests. Each check is written against the traits, so the same suite runs
//! against every adapter: here the embedded one; the AWS adapters add their instantiation.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use baton_core::cta::{Cta, CtaRequest, CtaResponse, CtaStatus, Settlement};
use baton_core::error::PortError;
use baton_core::message::{Effect, Event, Input, StepMessage, Transition};
use baton_core::ports::{
    Bus, Created, CtaPosition, CtaQuery, Queue, RunPage, RunPosition, RunQuery, Scheduler,
    SendingStore, Settled, Store, SystemClock,
};
use baton_core::run::{NewRun, Run, RunStatus, Usage};
use baton_core::service::{Deps, Handled, Service, StepError};
use baton_core::timeline::{Entry, EntryBody};
use baton_local::store::LocalStore;
use chrono::Utc;
use common::*;

/// The receive side of a queue, as a test drives it.
#[async_trait::async_trait]
trait Pump: Send + Sync {
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
    let mut run = Run::new(NewRun {
        run_id: id.into(),
        agent: "explore".into(),
        owner: owner.into(),
        parent: None,
        depth: 0,
        on_expiry: Default::default(),
        sandbox_id: None,
        metadata: None,
        context: None,
        root_run_id: None,
        now: Utc::now(),
    });
    run.next_seq = 1;
    (
        run,
        vec![Entry {
            seq: 0,
            at: Utc::now(),
            body: EntryBody::User {
                text: "hi".into(),
                message_id: None,
                options: Default::default(),
            },
        }],
    )
}

fn msg(run: &str, id: &str) -> StepMessage {
    StepMessage {
        run_id: run.into(),
        id: id.into(),
        input: Input::Continue { version: 0 },
    }
}

fn cta(run: &Run, id: &str) -> Cta {
    Cta {
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
        status: CtaStatus::Pending,
        response: None,
        gate: false,
        gated: None,
        created_at: Utc::now(),
        expires_at: Utc::now() + chrono::Duration::days(30),
        resolved_at: None,
        responder: None,
        link_nonce: Some("lnk_contract".into()),
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
        body: EntryBody::Assistant {
            text: Some("x".repeat(3000)),
            usage: Usage::default(),
            model: None,
            cost_usd: None,
            operation: Default::default(),
            latency_ms: None,
            first_token_ms: None,
        },
    };
    r.next_seq += 1;
    Transition {
        run: r,
        appended: vec![entry],
        updated: vec![],
        new_ctas: vec![],
        new_runs: vec![],
        effects,
    }
}

async fn store_contract(store: Arc<dyn Store>) {
    // Create, read back, idempotency per owner.
    let (run, first) = new_run("run_c1", "alice");
    assert_eq!(
        store
            .create_run(&run, &first, &[], Some("k"))
            .await
            .unwrap(),
        Created::Created
    );
    let (other, _) = new_run("run_c2", "alice");
    match store
        .create_run(&other, &first, &[], Some("k"))
        .await
        .unwrap()
    {
        Created::Existing(rec) => assert_eq!(rec.run.run_id, "run_c1"),
        c => panic!("expected the existing run, got {c:?}"),
    }
    let (bob, _) = new_run("run_c3", "bob");
    assert_eq!(
        store
            .create_run(&bob, &first, &[], Some("k"))
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
            body: EntryBody::User {
                text: noise(seq, 380 * 1024),
                message_id: None,
                options: Default::default(),
            },
        })
        .collect();
    long.next_seq = history.len() as u64;
    store.create_run(&long, &history, &[], None).await.unwrap();
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
        .create_run(&parked, &parked_tl, &[], None)
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
    let answer = CtaResponse::Approval {
        approved: true,
        reason: None,
    };
    match store
        .settle_cta(
            "cta_c1",
            &Settlement::Answered {
                response: answer.clone(),
                responder: Some("someone".into()),
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
    store.create_run(&big, &first, &[], None).await.unwrap();
    let mut t = next(&big, vec![]);
    t.appended.clear();
    t.run.next_seq = 1;
    for i in 0..8 {
        t.appended.push(Entry {
            seq: t.run.next_seq,
            at: Utc::now(),
            body: EntryBody::User {
                text: noise(i, 60_000),
                message_id: None,
                options: Default::default(),
            },
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
    store.create_run(&r, &first, &[], None).await.unwrap();
    let failure = baton_core::run::LastError {
        message: "cannot reach the model".into(),
        attempts: 2,
        at: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        message_id: Some("run_fail:start".into()),
        failures: 2,
    };
    store.record_failure("run_fail", &failure).await.unwrap();
    let rec = store.get_run("run_fail").await.unwrap().unwrap();
    assert_eq!(rec.run.last_error.as_ref(), Some(&failure));
    assert_eq!(rec.run.version, 0);
    let (loaded, _) = store.load("run_fail").await.unwrap().unwrap();
    assert_eq!(loaded.run.last_error, Some(failure));
    store.commit(0, &next(&r, vec![])).await.unwrap();
    assert_eq!(
        store
            .get_run("run_fail")
            .await
            .unwrap()
            .unwrap()
            .run
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

/// Creates `n` pending CTAs of `run` (ids `<prefix>_<i>`), created `at`, `at` + 1 ms, …,
/// in commits of up to 90 (a DynamoDB transaction holds 100 items). Returns the run as
/// committed.
async fn raise_ctas(
    store: &dyn Store,
    mut run: Run,
    prefix: &str,
    n: usize,
    at: chrono::DateTime<Utc>,
) -> Run {
    let ids: Vec<usize> = (0..n).collect();
    for chunk in ids.chunks(90) {
        let mut t = next(&run, vec![]);
        t.new_ctas = chunk
            .iter()
            .map(|&i| {
                let mut c = cta(&run, &format!("{prefix}_{i:05}"));
                c.root_run_id = Some(run.root().to_owned());
                c.created_at = at + chrono::Duration::milliseconds(i as i64);
                c
            })
            .collect();
        store.commit(run.version, &t).await.unwrap();
        run = t.run;
    }
    run
}

/// Reads every page of `query` (`limit` a page), checking each page's size; returns the
/// CTAs' ids in the order read.
async fn every_page(store: &dyn Store, owner: &str, mut query: CtaQuery) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let page = store.list_ctas(owner, &query).await.unwrap();
        assert!(page.len() <= query.limit, "a page of {}", page.len());
        let Some(last) = page.last() else { break };
        query.after = Some(CtaPosition::of(last));
        ids.extend(page.iter().map(|c| c.cta_id.clone()));
    }
    ids
}

/// Pages of an owner's top-level runs: newest first, each page after the last one's
/// position, none skipped or repeated; not a subagent's run, not another owner's; with
/// the metadata they were created with, and as their last commit left them.
async fn run_pages_contract(store: Arc<dyn Store>) {
    let at = Utc::now() - chrono::Duration::hours(2);
    for i in 0..7 {
        let (mut run, first) = new_run(&format!("run_ls_{i}"), "lia");
        run.created_at = at + chrono::Duration::seconds(i);
        run.metadata = Some(serde_json::json!({"i": i}));
        store.create_run(&run, &first, &[], None).await.unwrap();
        if i == 3 {
            let t = next(&run, vec![]);
            store.commit(run.version, &t).await.unwrap();
        }
    }
    let (mut child, first) = new_run("run_ls_child", "lia");
    child.parent = Some(baton_core::run::ParentLink {
        run_id: "run_ls_6".into(),
        tool_call_id: "call_1".into(),
    });
    child.root_run_id = Some("run_ls_6".into());
    child.depth = 1;
    child.created_at = at + chrono::Duration::seconds(30);
    store.create_run(&child, &first, &[], None).await.unwrap();
    let (mut other, first) = new_run("run_ls_other", "mo");
    other.created_at = at + chrono::Duration::seconds(40);
    store.create_run(&other, &first, &[], None).await.unwrap();

    let mut ids = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_runs("lia", &RunQuery::page(after.clone(), 3))
            .await
            .unwrap();
        assert!(page.runs.len() <= 3, "a page of {}", page.runs.len());
        // A full page says where the next starts (its last run); a short one, that none does.
        let last = page.runs.last().map(|r| r.run_id.as_str());
        let next = page.next.as_ref().map(|p| p.run_id.as_str());
        assert_eq!(next, last.filter(|_| page.runs.len() == 3));
        for run in &page.runs {
            let i: u64 = run.run_id["run_ls_".len()..].parse().unwrap();
            assert_eq!(run.metadata, Some(serde_json::json!({"i": i})));
            assert_eq!(run.owner, "lia");
            assert_eq!(
                run.status,
                if i == 3 {
                    RunStatus::Running
                } else {
                    RunStatus::Queued
                }
            );
        }
        ids.extend(page.runs.into_iter().map(|r| r.run_id));
        if page.next.is_none() {
            break;
        }
        after = page.next;
    }
    let expected: Vec<String> = (0..7).rev().map(|i| format!("run_ls_{i}")).collect();
    assert_eq!(ids, expected);
    // A span of creation times: `since` inclusive, `until` exclusive, paged within it.
    let span = |after: Option<RunPosition>| RunQuery {
        after,
        since: Some(at + chrono::Duration::seconds(2)),
        until: Some(at + chrono::Duration::seconds(5)),
        limit: 2,
    };
    let first_page = store.list_runs("lia", &span(None)).await.unwrap();
    let ids: Vec<&str> = first_page.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["run_ls_4", "run_ls_3"]);
    let rest = store
        .list_runs("lia", &span(first_page.next))
        .await
        .unwrap();
    let ids: Vec<&str> = rest.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["run_ls_2"]);
    assert_eq!(rest.next, None);
    // The runs under a top-level run: its subagents at any depth, oldest first, paged; not
    // another root's.
    let (mut grandchild, first) = new_run("run_ls_grandchild", "lia");
    grandchild.parent = Some(baton_core::run::ParentLink {
        run_id: "run_ls_child".into(),
        tool_call_id: "call_2".into(),
    });
    grandchild.root_run_id = Some("run_ls_6".into());
    grandchild.depth = 2;
    grandchild.created_at = at + chrono::Duration::seconds(31);
    store
        .create_run(&grandchild, &first, &[], None)
        .await
        .unwrap();
    let (mut elsewhere, first) = new_run("run_ls_elsewhere", "lia");
    elsewhere.parent = Some(baton_core::run::ParentLink {
        run_id: "run_ls_5".into(),
        tool_call_id: "call_3".into(),
    });
    elsewhere.root_run_id = Some("run_ls_5".into());
    elsewhere.depth = 1;
    store
        .create_run(&elsewhere, &first, &[], None)
        .await
        .unwrap();
    let under = store.list_descendants("run_ls_6", None, 1).await.unwrap();
    assert_eq!(under.runs.len(), 1);
    assert_eq!(under.runs[0].run_id, "run_ls_child");
    let more = store
        .list_descendants("run_ls_6", under.next.as_ref(), 10)
        .await
        .unwrap();
    let ids: Vec<&str> = more.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["run_ls_grandchild"]);
    assert_eq!(more.runs[0].parent.as_ref().unwrap().run_id, "run_ls_child");
    assert_eq!(more.next, None);
    let none = store.list_descendants("run_ls_0", None, 10).await.unwrap();
    assert_eq!(none, RunPage::default());
    let mo = store
        .list_runs("mo", &RunQuery::page(None, 10))
        .await
        .unwrap();
    assert_eq!(mo.runs.len(), 1);
    let nobody = store
        .list_runs("nobody", &RunQuery::page(None, 10))
        .await
        .unwrap();
    assert_eq!(nobody, RunPage::default());
}

/// Pages of CTAs: by owner or by top-level run (the run's own and its subagents'), of one
/// status or all, in order (by status, then oldest first), each page after the last one's
/// position, none skipped or repeated, and a position still good after its CTA moved on.
async fn cta_pages_contract(store: Arc<dyn Store>) {
    let at = Utc::now() - chrono::Duration::hours(1);
    let (root_a, first) = new_run("run_pg_a", "paula");
    store.create_run(&root_a, &first, &[], None).await.unwrap();
    let (mut child, first) = new_run("run_pg_c", "paula");
    child.root_run_id = Some("run_pg_a".into());
    child.depth = 1;
    store.create_run(&child, &first, &[], None).await.unwrap();
    let (root_b, first) = new_run("run_pg_b", "paula");
    store.create_run(&root_b, &first, &[], None).await.unwrap();
    let (other, first) = new_run("run_pg_o", "oscar");
    store.create_run(&other, &first, &[], None).await.unwrap();
    // Raised in time order, interleaved across the runs: a_*, then c_*, then b_*.
    raise_ctas(&*store, root_a, "pa", 70, at).await;
    raise_ctas(&*store, child, "pc", 40, at + chrono::Duration::seconds(1)).await;
    raise_ctas(&*store, root_b, "pb", 50, at + chrono::Duration::seconds(2)).await;
    raise_ctas(&*store, other, "po", 5, at).await;
    // Ten of root A's are answered.
    for i in 0..10 {
        let settled = store
            .settle_cta(
                &format!("pa_{i:05}"),
                &Settlement::Answered {
                    response: CtaResponse::Approval {
                        approved: true,
                        reason: None,
                    },
                    responder: None,
                },
                Utc::now(),
            )
            .await
            .unwrap();
        assert!(matches!(settled, Settled::Won(_)));
    }
    let ids = |p: &str, r: std::ops::Range<usize>| -> Vec<String> {
        r.map(|i| format!("{p}_{i:05}")).collect()
    };
    let pending = [ids("pa", 10..70), ids("pc", 0..40), ids("pb", 0..50)].concat();
    let query = |status, root: Option<&str>, limit| CtaQuery {
        status,
        root_run_id: root.map(str::to_owned),
        after: None,
        limit,
    };
    assert_eq!(
        every_page(&*store, "paula", query(Some(CtaStatus::Pending), None, 50)).await,
        pending
    );
    assert_eq!(
        every_page(&*store, "paula", query(Some(CtaStatus::Pending), None, 7)).await,
        pending
    );
    // All statuses: by status name (answered before pending), oldest first in each.
    assert_eq!(
        every_page(&*store, "paula", query(None, None, 33)).await,
        [ids("pa", 0..10), pending.clone()].concat()
    );
    // Under root A: its own and its subagent's, not root B's nor another owner's.
    assert_eq!(
        every_page(
            &*store,
            "paula",
            query(Some(CtaStatus::Pending), Some("run_pg_a"), 25)
        )
        .await,
        [ids("pa", 10..70), ids("pc", 0..40)].concat()
    );
    assert_eq!(
        every_page(&*store, "paula", query(None, Some("run_pg_b"), 100)).await,
        ids("pb", 0..50)
    );
    assert!(
        every_page(&*store, "oscar", query(None, Some("run_pg_a"), 10))
            .await
            .is_empty()
    );
    // A page ends where asked; the next starts after its last CTA, even once that CTA has
    // been answered since.
    let mut q = query(Some(CtaStatus::Pending), None, 5);
    let page = store.list_ctas("paula", &q).await.unwrap();
    assert_eq!(
        page.iter().map(|c| c.cta_id.clone()).collect::<Vec<_>>(),
        ids("pa", 10..15)
    );
    q.after = Some(CtaPosition::of(&page[4]));
    store
        .settle_cta("pa_00014", &Settlement::Expired, Utc::now())
        .await
        .unwrap();
    let page = store.list_ctas("paula", &q).await.unwrap();
    assert_eq!(
        page.iter().map(|c| c.cta_id.clone()).collect::<Vec<_>>(),
        ids("pa", 15..20)
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
    local.create_run(&run, &first, &[], None).await.unwrap();
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
        store: Arc::new(local.clone()),
        queue,
        bus: Arc::new(local.clone()),
        scheduler: Arc::new(local.clone()),
        blobs: Arc::new(baton_local::blobs::FileBlobs::new(
            local.path().parent().unwrap(),
        )),
        llm: scripted(script),
        clock: Arc::new(SystemClock),
        sending_store: None,
    };
    Service::new(
        deps,
        catalog(Some(
            serde_json::json!({"agents": {"worker": {"tools": ["echo"]}}}),
        )),
    )
}

const ECHO_TWICE: &str = r#"{"worker": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "one"}}]},
    {"tool_calls": [{"name": "echo", "arguments": {"text": "two"}}]},
    {"text": "done"}]}"#;

async fn start_worker_run(svc: &Service) -> String {
    let req = baton_core::service::CreateRun {
        prompt: "go".into(),
        agent: Some("worker".into()),
        ..Default::default()
    };
    svc.create_run("local", req, None).await.unwrap().run_id
}

#[tokio::test]
async fn the_outbox_is_replayed_after_a_crash_between_commit_and_effects() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let ok = service(&local, Arc::new(local.clone()), ECHO_TWICE);
    let run_id = start_worker_run(&ok).await;
    let start = Pump::receive(&local, 1).await.remove(0);

    // The step commits, then "crashes" before its next-step message is sent.
    let flaky = service(
        &local,
        Arc::new(FlakyQueue {
            inner: local.clone(),
            failures: AtomicU32::new(1),
        }),
        ECHO_TWICE,
    );
    assert!(matches!(
        flaky.handle(&start.1).await,
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
        fresh.handle(&start.1).await.unwrap(),
        Handled::Ignored(_)
    ));
    // (The outbox stays: the continuation it sent proves it was performed, so no write is
    // spent clearing it; the next step recognises its own message and skips the replay.)
    Pump::ack(&local, start.0.clone()).await;
    let next = Pump::receive(&local, 10).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].1.input, Input::Continue { version: 1 });

    // The start-up sweep repairs the same gap when no redelivery comes.
    let crash = service(
        &local,
        Arc::new(FlakyQueue {
            inner: local.clone(),
            failures: AtomicU32::new(1),
        }),
        ECHO_TWICE,
    );
    assert!(crash.handle(&next[0].1).await.is_err());
    Pump::ack(&local, next[0].0.clone()).await;
    assert!(Pump::receive(&local, 10).await.is_empty());
    let worker = baton_dev::worker::Worker::new(Arc::new(fresh), local.clone(), Default::default());
    assert_eq!(worker.sweep().await.unwrap(), 1);
    worker.drain().await.unwrap();
    let (rec, tl) = local.load(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Completed);
    assert_eq!(
        tl.len(),
        6,
        "user, 2 × (assistant + tool), final assistant: no duplicates"
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
                let first = svc.handle(&m).await.unwrap();
                if duplicate {
                    assert!(matches!(first, Handled::Committed { .. }));
                    assert!(
                        matches!(svc.handle(&m).await.unwrap(), Handled::Ignored(_)),
                        "{m:?}"
                    );
                }
                Pump::ack(&local, receipt).await;
            }
        }
        let (rec, tl) = local.load(&run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Completed);
        let shape: Vec<String> = tl
            .iter()
            .map(|e| serde_json::to_value(&e.body).unwrap().to_string())
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
        svc.note_failure(&start, n, &unreachable(), Utc::now())
            .await;
    }
    svc.dead_letter(&start, "failed 5 times").await.unwrap();
    let (rec, tl) = local.load(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Failed);
    assert_eq!(rec.run.error.unwrap().code, "dead_letter");
    assert!(
        matches!(&tl.last().unwrap().body, EntryBody::Error { message, .. } if message.contains("failed 5 times") && message.contains("the model is unreachable"))
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
    svc.note_failure(&start, 1, &unreachable, Utc::now()).await;
    let mut dead = start.clone();
    for n in 1..=2 {
        let handled = svc.dead_letter(&dead, "failed 8 times").await.unwrap();
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
    svc.dead_letter(&dead, "failed 8 times").await.unwrap();
    let rec = local.get_run(&run_id).await.unwrap().unwrap();
    assert_eq!(rec.run.status, RunStatus::Failed);
    // And no third copy went back.
    let left = Pump::receive(&local, 10).await;
    assert!(
        left.iter().all(|(_, m)| m.id != format!("{}#r3", start.id)),
        "{left:?}"
    );
}

mod aws {
    use super::*;
    use baton_aws::dynamo::DynamoStore;
    use baton_aws::eventbridge::EventBridgeBus;
    use baton_aws::provision;
    use baton_aws::scheduler::SchedulerTimers;
    use baton_aws::sdk::Meter;
    use baton_aws::sqs::SqsQueue;

    use crate::common::aws::Emulator;

    /// Receives from SQS queues as Lambda's event source mapping would.
    pub struct SqsPump {
        pub client: aws_sdk_sqs::Client,
        pub urls: Vec<String>,
    }

    #[async_trait::async_trait]
    impl Pump for SqsPump {
        async fn receive(&self, max: usize) -> Vec<(String, StepMessage)> {
            let mut out = Vec::new();
            for url in &self.urls {
                let r = self
                    .client
                    .receive_message()
                    .queue_url(url)
                    .max_number_of_messages(max.min(10) as i32)
                    .visibility_timeout(60)
                    .wait_time_seconds(0)
                    .send()
                    .await
                    .unwrap();
                for m in r.messages() {
                    let body: StepMessage = serde_json::from_str(m.body().unwrap()).unwrap();
                    out.push((format!("{url}|{}", m.receipt_handle().unwrap()), body));
                }
            }
            out
        }
        async fn ack(&self, receipt: String) {
            let (url, handle) = receipt.split_once('|').unwrap();
            self.client
                .delete_message()
                .queue_url(url)
                .receipt_handle(handle)
                .send()
                .await
                .unwrap();
        }
    }

    /// A table of its own on the emulator, and a store over it that meters its requests.
    struct Table {
        /// Bind it (`_aws`) for the table's life: the emulator stops when it is dropped.
        _aws: Emulator,
        p: provision::Provisioned,
        meter: Arc<Meter>,
        store: DynamoStore,
        dynamo: aws_sdk_dynamodb::Client,
    }

    async fn table(prefix: &str) -> Table {
        let aws = Emulator::start_with(None).await;
        let sdk = aws.sdk().await;
        let names = aws.names(prefix);
        let p = provision::ensure(&sdk, &names, "arn:aws:iam::123456789012:role/scheduler")
            .await
            .unwrap();
        let meter = Meter::shared();
        let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
        let store = DynamoStore::new(dynamo.clone(), &p.config.table, 90, meter.clone());
        Table {
            _aws: aws,
            p,
            meter,
            store,
            dynamo,
        }
    }

    /// `GET /runs/{id}` and the timeline's pages read the page they return: on a run of
    /// 10,000 entries (500 segments), a page of 100 reads six segments wherever it starts,
    /// counted in requests and read units, while the whole timeline is hundreds of units.
    #[tokio::test]
    async fn a_page_of_a_10000_entry_timeline_reads_only_that_page_on_dynamodb() {
        let Table {
            _aws, meter, store, ..
        } = table("pages").await;
        let (mut run, first) = new_run("run_pages", "dana");
        store.create_run(&run, &first, &[], None).await.unwrap();
        // 200 bytes that pack to about 120 (as text of a real run does, more or less).
        let text = |seq: u64| -> String {
            let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            (0..200)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (b'a' + (x % 26) as u8) as char
                })
                .collect()
        };
        // 500 commits of 20 entries: 10,001 entries.
        for _ in 0..500 {
            let mut t = next(&run, vec![]);
            t.appended = (0..20)
                .map(|i| Entry {
                    seq: run.next_seq + i,
                    at: Utc::now(),
                    body: EntryBody::User {
                        text: text(run.next_seq + i),
                        message_id: None,
                        options: Default::default(),
                    },
                })
                .collect();
            t.run.next_seq = run.next_seq + 20;
            store.commit(run.version, &t).await.unwrap();
            run = t.run;
        }
        assert_eq!(run.next_seq, 10_001);
        for (after, expect) in [
            (None, 0..100),
            (Some(4_999), 5_000..5_100),
            (Some(9_950), 9_951..10_001),
        ] {
            let before = meter.snapshot();
            let page = store.entries_after("run_pages", after, 100).await.unwrap();
            let used = meter.snapshot();
            let seqs: Vec<u64> = page.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, expect.collect::<Vec<_>>(), "after {after:?}");
            let (requests, units) = (
                used.dynamodb_requests - before.dynamodb_requests,
                used.read_units - before.read_units,
            );
            eprintln!("a page after {after:?}: {requests} requests, {units} read units");
            assert!(
                requests <= 5,
                "{requests} requests for a page after {after:?}"
            );
            assert!(
                units <= 12.0,
                "{units} read units for a page after {after:?}"
            );
        }
        let before = meter.snapshot();
        let (_, whole) = store.load("run_pages").await.unwrap().unwrap();
        let whole_units = meter.snapshot().read_units - before.read_units;
        eprintln!("the whole timeline: {whole_units} read units");
        assert_eq!(whole.len(), 10_001);
        assert!(whole_units > 100.0, "{whole_units}");
    }

    /// The Lambda functions' SDK config, built from the environment Lambda gives them
    /// without the SDK's provider chain, reaches the services with the keys it is given (a
    /// table, queues and a bus provisioned through it, and a write and a read), and refuses,
    /// saying what to set, when neither keys nor an emulator are there.
    #[tokio::test]
    async fn the_functions_sdk_config_works_from_lambdas_environment_alone() {
        use baton_aws::sdk::{StaticKeys, lambda_sdk_config};
        use baton_core::config::SdkEnv;
        let aws = Emulator::start_with(None).await;
        let env = SdkEnv {
            endpoint: Some(aws.url.clone()),
            function_name: Some("CtaFunction".into()),
            ..SdkEnv::default()
        };
        let keys = StaticKeys {
            access_key_id: "AKIDLAMBDA".into(),
            secret_access_key: "secret".into(),
            session_token: Some("token".into()),
        };
        let sdk = lambda_sdk_config(&env, Some(keys), Some("us-east-1".into())).unwrap();
        let names = aws.names("lean");
        let p = provision::ensure(&sdk, &names, "arn:aws:iam::123456789012:role/scheduler")
            .await
            .unwrap();
        let store = DynamoStore::new(
            aws_sdk_dynamodb::Client::new(&sdk),
            &p.config.table,
            90,
            Meter::shared(),
        );
        let (run, first) = new_run("run_lean", "lee");
        store.create_run(&run, &first, &[], None).await.unwrap();
        assert_eq!(store.get_run("run_lean").await.unwrap().unwrap().run, run);
        // Without keys, an emulator's defaults; without either, a clear refusal.
        assert!(lambda_sdk_config(&env, None, None).is_ok());
        let bare = SdkEnv::default();
        let e = lambda_sdk_config(&bare, None, Some("us-east-1".into())).unwrap_err();
        assert!(e.contains("AWS_ACCESS_KEY_ID"), "{e}");
        let keys = StaticKeys {
            access_key_id: "a".into(),
            secret_access_key: "b".into(),
            session_token: None,
        };
        let e = lambda_sdk_config(&bare, Some(keys), None).unwrap_err();
        assert!(e.contains("AWS_REGION"), "{e}");
    }

    /// A page of an owner's runs is one query of the index and one batch read of the runs,
    /// wherever it starts, however many runs the owner has: 300 runs, pages of 50.
    #[tokio::test]
    async fn a_page_of_an_owners_runs_is_two_requests_on_dynamodb() {
        let Table {
            _aws, meter, store, ..
        } = table("runlist").await;
        let at = Utc::now() - chrono::Duration::hours(1);
        for i in 0..300 {
            let (mut run, first) = new_run(&format!("run_many_{i:03}"), "nell");
            run.created_at = at + chrono::Duration::milliseconds(i * 10);
            store.create_run(&run, &first, &[], None).await.unwrap();
        }
        let mut after = None;
        let mut seen = Vec::new();
        for page_no in 0..6 {
            let before = meter.snapshot();
            let page = store
                .list_runs("nell", &RunQuery::page(after.clone(), 50))
                .await
                .unwrap();
            let used = meter.snapshot();
            let requests = used.dynamodb_requests - before.dynamodb_requests;
            let units = used.read_units - before.read_units;
            eprintln!(
                "page {page_no}: {} runs, {requests} requests, {units} read units",
                page.runs.len()
            );
            assert_eq!(page.runs.len(), 50);
            assert_eq!(requests, 2, "page {page_no}");
            assert!(units <= 20.0, "page {page_no}: {units} read units");
            after = page.next;
            seen.extend(page.runs.into_iter().map(|r| r.run_id));
        }
        let expected: Vec<String> = (0..300).rev().map(|i| format!("run_many_{i:03}")).collect();
        assert_eq!(seen, expected);
    }

    /// A listing whose run is gone (an `INFO` item written ahead of a commit that never
    /// came, or a purge half done) is left out of its page but does not end the list: a
    /// page of nothing but such listings still says where the next one starts.
    #[tokio::test]
    async fn a_listing_whose_run_is_gone_does_not_end_a_list_on_dynamodb() {
        use aws_sdk_dynamodb::types::AttributeValue::S;
        let Table {
            _aws,
            p,
            store,
            dynamo,
            ..
        } = table("orphans").await;
        let at = Utc::now() - chrono::Duration::hours(1);
        for i in 0..5 {
            let (mut run, first) = new_run(&format!("run_or_{i}"), "otto");
            run.created_at = at + chrono::Duration::seconds(i);
            store.create_run(&run, &first, &[], None).await.unwrap();
        }
        for i in 0..4 {
            let (mut child, first) = new_run(&format!("run_or_child_{i}"), "otto");
            child.parent = Some(baton_core::run::ParentLink {
                run_id: "run_or_4".into(),
                tool_call_id: format!("call_{i}"),
            });
            child.root_run_id = Some("run_or_4".into());
            child.depth = 1;
            child.created_at = at + chrono::Duration::seconds(10 + i);
            store.create_run(&child, &first, &[], None).await.unwrap();
        }
        // Two top-level runs and two subagents, side by side: their listings left alone.
        for id in ["run_or_2", "run_or_1", "run_or_child_1", "run_or_child_2"] {
            dynamo
                .delete_item()
                .table_name(&p.config.table)
                .key("PK", S(format!("RUN#{id}")))
                .key("SK", S("META".into()))
                .send()
                .await
                .unwrap();
        }
        let mut pages = Vec::new();
        let mut after = None;
        loop {
            let page = store
                .list_runs("otto", &RunQuery::page(after, 2))
                .await
                .unwrap();
            let ids: Vec<String> = page.runs.iter().map(|r| r.run_id.clone()).collect();
            pages.push(ids);
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(
            pages,
            [
                vec!["run_or_4".to_owned(), "run_or_3".to_owned()],
                vec![],
                vec!["run_or_0".to_owned()],
            ]
        );
        let mut under = Vec::new();
        let mut after: Option<RunPosition> = None;
        for _ in 0..10 {
            let page = store
                .list_descendants("run_or_4", after.as_ref(), 1)
                .await
                .unwrap();
            under.extend(page.runs.into_iter().map(|r| r.run_id));
            after = page.next;
            if after.is_none() {
                break;
            }
        }
        assert_eq!(under, ["run_or_child_0", "run_or_child_3"]);
    }

    /// A run's `metadata` (up to 4 KB) and `context` (up to 16 KB) are written once, in an
    /// item of their own, not into the run item every commit rewrites (and DynamoDB bills
    /// whole): a commit of a run that has both costs what one of a run without them does,
    /// and every read of the run still gives them back.
    #[tokio::test]
    async fn metadata_and_context_stay_out_of_the_item_each_commit_rewrites_on_dynamodb() {
        let Table {
            _aws,
            p,
            meter,
            store,
            dynamo,
            ..
        } = table("info").await;
        use aws_sdk_dynamodb::types::AttributeValue::{self, S};
        let metadata = serde_json::json!({"team": "x".repeat(4_000)});
        let context = serde_json::json!({"type": "document", "text": "y".repeat(16_000)});
        let mut units = Vec::new();
        for (id, info) in [("run_bare", false), ("run_info", true)] {
            let (mut run, first) = new_run(id, "ivy");
            if info {
                run.metadata = Some(metadata.clone());
                run.context = Some(context.clone());
            }
            store.create_run(&run, &first, &[], None).await.unwrap();
            let before = meter.snapshot();
            for _ in 0..3 {
                let t = next(&run, vec![]);
                store.commit(run.version, &t).await.unwrap();
                run = t.run;
            }
            units.push(meter.snapshot().write_units - before.write_units);
            let raw = dynamo
                .get_item()
                .table_name(&p.config.table)
                .key("PK", S(format!("RUN#{id}")))
                .key("SK", S("META".into()))
                .send()
                .await
                .unwrap()
                .item
                .unwrap();
            let size: usize = raw
                .iter()
                .map(|(k, v)| k.len() + v.as_s().map_or(8, String::len))
                .sum();
            assert!(size < 2_048, "the run item of {id} is {size} bytes");
            let got = store.get_run(id).await.unwrap().unwrap().run;
            let (loaded, _) = store.load(id).await.unwrap().unwrap();
            let (windowed, _, _) = store.load_window(id, &|_| 1).await.unwrap().unwrap();
            for r in [&got, &loaded.run, &windowed.run] {
                assert_eq!(r.metadata, run.metadata, "{id}");
                assert_eq!(r.context, run.context, "{id}");
                assert_eq!(r.version, run.version, "{id}");
            }
        }
        assert_eq!(
            units[0], units[1],
            "write units of 3 commits, bare and with info"
        );

        // A run stored before runs had an INFO item (metadata and context in the run item's
        // body): its next step gives it one, so the commit after loses nothing, and it is
        // listed from then on.
        let (mut run, _) = new_run("run_legacy", "ivy");
        run.metadata = Some(metadata.clone());
        run.context = Some(context.clone());
        let legacy = std::collections::HashMap::from([
            ("PK".to_owned(), S("RUN#run_legacy".into())),
            ("SK".to_owned(), S("META".into())),
            ("v".to_owned(), AttributeValue::N(run.version.to_string())),
            ("own".to_owned(), S("ivy".into())),
            ("st".to_owned(), S("queued".into())),
            ("body".to_owned(), S(serde_json::to_string(&run).unwrap())),
            ("ni".to_owned(), AttributeValue::N("0".into())),
        ]);
        dynamo
            .put_item()
            .table_name(&p.config.table)
            .set_item(Some(legacy))
            .send()
            .await
            .unwrap();
        assert_eq!(store.get_run("run_legacy").await.unwrap().unwrap().run, run);
        let (loaded, _, _) = store
            .load_window("run_legacy", &|_| 1)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(loaded.run, run);
        let t = next(&run, vec![]);
        store.commit(run.version, &t).await.unwrap();
        let got = store.get_run("run_legacy").await.unwrap().unwrap().run;
        assert_eq!(got.metadata, run.metadata);
        assert_eq!(got.context, run.context);
        let listed = store
            .list_runs("ivy", &RunQuery::page(None, 10))
            .await
            .unwrap();
        assert!(
            listed
                .runs
                .iter()
                .any(|r| r.run_id == "run_legacy" && r.metadata == run.metadata)
        );
    }

    /// The sweep purges a thousand finished runs on DynamoDB tick after tick, each tick
    /// within its budget: 1,000 runs finished past their retention (0 days here), each with
    /// its timeline, are all gone after ticks of 2 s, not one of them left half-purged.
    #[tokio::test]
    async fn the_sweep_purges_a_thousand_finished_runs_tick_by_tick_within_its_budget() {
        const RUNS: usize = 1_000;
        let aws = Emulator::start_with(None).await;
        let sdk = aws.sdk().await;
        let names = aws.names("purge");
        let p = provision::ensure(&sdk, &names, "arn:aws:iam::123456789012:role/scheduler")
            .await
            .unwrap();
        let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
        let store = Arc::new(DynamoStore::new(
            dynamo.clone(),
            &p.config.table,
            0,
            Meter::shared(),
        ));
        // One at a time: moto's server answers concurrent transactions with a 500.
        for i in 0..RUNS {
            // Stored finished, as a run's last commit leaves it (indexed by its finish
            // time), with its timeline.
            let (mut run, first) = new_run(&format!("run_done_{i}"), "erin");
            run.status = RunStatus::Completed;
            store.create_run(&run, &first, &[], None).await.unwrap();
        }
        let items = || async {
            let mut n = 0;
            let mut after = None;
            loop {
                let out = dynamo
                    .scan()
                    .table_name(&p.config.table)
                    .projection_expression("PK")
                    .set_exclusive_start_key(after)
                    .send()
                    .await
                    .unwrap();
                n += out.items().len();
                after = out.last_evaluated_key;
                if after.is_none() {
                    return n;
                }
            }
        };
        assert!(items().await >= 2 * RUNS, "each run and its timeline");

        let local_dir = tempfile::tempdir().unwrap();
        let local = LocalStore::open(local_dir.path()).unwrap();
        let deps = Deps {
            store: store.clone(),
            queue: Arc::new(local.clone()),
            bus: Arc::new(local.clone()),
            scheduler: Arc::new(local.clone()),
            blobs: Arc::new(baton_local::blobs::FileBlobs::new(local_dir.path())),
            llm: scripted("{}"),
            clock: Arc::new(SystemClock),
            sending_store: None,
        };
        let svc = Service::new(deps, catalog(None));
        let budget = std::time::Duration::from_secs(2);
        let mut ticks = Vec::new();
        loop {
            let started = std::time::Instant::now();
            svc.sweep_within(chrono::Duration::minutes(5), budget)
                .await
                .unwrap();
            ticks.push(started.elapsed());
            // A tick that ends before its budget found fewer than a chunk left: it is done.
            if started.elapsed() < budget {
                break;
            }
            assert!(
                ticks.len() < 100,
                "still purging after {} ticks",
                ticks.len()
            );
        }
        eprintln!(
            "{RUNS} finished runs purged in {} ticks: {ticks:?}",
            ticks.len()
        );
        assert_eq!(items().await, 0, "every item of every run is gone");
        assert!(
            ticks.len() > 1,
            "{RUNS} runs took more than one tick's budget"
        );
        // A tick stops starting chunks once its budget is spent: it ends within the chunk
        // under way (10 runs; a few hundred milliseconds here, however loaded).
        let longest = ticks.iter().max().copied().unwrap_or_default();
        assert!(
            longest < budget + std::time::Duration::from_secs(5),
            "a tick took {longest:?}, its budget {budget:?}"
        );
    }

    /// `GET /ctas` pages read their page: with 10,000 CTAs pending, a page of 50 (51 read,
    /// to know whether more follow) is one `Query`, from the start, the middle, or under a
    /// top-level run, counted in requests and read units.
    #[tokio::test]
    async fn a_page_of_10000_pending_ctas_is_one_query_on_dynamodb() {
        let Table {
            _aws, meter, store, ..
        } = table("ctapages").await;
        let (run, first) = new_run("run_many", "mia");
        store.create_run(&run, &first, &[], None).await.unwrap();
        let at = Utc::now() - chrono::Duration::hours(1);
        // Loaded in bulk: 112 commits of 90 would take moto minutes (it copies the table for
        // each transaction).
        let ctas: Vec<Cta> = (0..10_000)
            .map(|i| {
                let mut c = cta(&run, &format!("m_{i:05}"));
                c.root_run_id = Some("run_many".into());
                c.created_at = at + chrono::Duration::milliseconds(i as i64);
                c
            })
            .collect();
        store.import_ctas(&ctas).await.unwrap();
        for (root, after) in [(None, None), (None, Some(4_999)), (Some("run_many"), None)] {
            let q = CtaQuery {
                status: Some(CtaStatus::Pending),
                root_run_id: root.map(str::to_owned),
                after: after.map(|i: usize| CtaPosition {
                    status: CtaStatus::Pending,
                    created_at: at + chrono::Duration::milliseconds(i as i64),
                    cta_id: format!("m_{i:05}"),
                }),
                limit: 51,
            };
            let before = meter.snapshot();
            let page = store.list_ctas("mia", &q).await.unwrap();
            let used = meter.snapshot();
            let start = after.map_or(0, |i| i + 1);
            let expect: Vec<String> = (start..start + 51).map(|i| format!("m_{i:05}")).collect();
            assert_eq!(
                page.iter().map(|c| c.cta_id.clone()).collect::<Vec<_>>(),
                expect
            );
            let (requests, units) = (
                used.dynamodb_requests - before.dynamodb_requests,
                used.read_units - before.read_units,
            );
            eprintln!(
                "a page of 51 ({root:?}, after {after:?}): {requests} requests, {units} read units"
            );
            assert_eq!(requests, 1, "{requests} requests");
            assert!(units <= 8.0, "{units} read units");
            // What DynamoDB answered it consumed is counted too (moto answers a fixed
            // amount; DynamoDB Local and AWS, what the page read).
            let consumed = used.consumed_read_units - before.consumed_read_units;
            assert!(
                consumed > 0.0 && consumed <= 8.0,
                "{consumed} consumed read units"
            );
        }
    }

    #[tokio::test]
    async fn the_aws_adapters_pass_the_port_contracts_on_an_emulator() {
        let aws = Emulator::start_with(None).await;
        let sdk = aws.sdk().await;
        let names = aws.names("contract");
        let p = provision::ensure(&sdk, &names, "arn:aws:iam::123456789012:role/scheduler")
            .await
            .unwrap();
        // Provisioning twice is fine.
        provision::ensure(&sdk, &names, "arn:aws:iam::123456789012:role/scheduler")
            .await
            .unwrap();
        let c = &p.config;
        let meter = Meter::shared();
        let store = DynamoStore::new(
            aws_sdk_dynamodb::Client::new(&sdk),
            &c.table,
            90,
            meter.clone(),
        );
        let store = Arc::new(store);
        store_contract(store.clone()).await;
        run_pages_contract(store.clone()).await;
        cta_pages_contract(store).await;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let queue = SqsQueue::new(
            sqs.clone(),
            &c.steps_queue_url,
            &c.subagent_queue_url,
            meter.clone(),
        );
        let pump = SqsPump {
            client: sqs.clone(),
            urls: vec![c.steps_queue_url.clone(), c.subagent_queue_url.clone()],
        };
        queue_contract(Arc::new(queue), Arc::new(pump)).await;
        let bus = EventBridgeBus::new(
            aws_sdk_eventbridge::Client::new(&sdk),
            &c.bus_name,
            meter.clone(),
        );
        let timers = SchedulerTimers::new(
            aws_sdk_scheduler::Client::new(&sdk),
            &c.schedule_group,
            &c.bus_arn,
            &c.scheduler_role_arn,
            meter.clone(),
        );
        bus_and_scheduler_contract(Arc::new(bus), Arc::new(timers)).await;
        let s3 = baton_aws::s3::S3Blobs::new(aws_sdk_s3::Client::new(&sdk), &c.bucket);
        blobs_contract(Arc::new(s3)).await;
        // Finished runs, settled CTAs and idempotency keys carry a DynamoDB TTL; live ones do not.
        let ddb = aws_sdk_dynamodb::Client::new(&sdk);
        let raw = |pk: String| {
            let (ddb, table) = (ddb.clone(), c.table.clone());
            async move {
                use aws_sdk_dynamodb::types::AttributeValue::S;
                ddb.get_item()
                    .table_name(table)
                    .key("PK", S(pk))
                    .key("SK", S("META".into()))
                    .send()
                    .await
                    .unwrap()
                    .item
                    .unwrap()
            }
        };
        let ttl =
            |item: &std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>| {
                item.get("ttl")
                    .map(|v| v.as_n().unwrap().parse::<i64>().unwrap())
            };
        let store = DynamoStore::new(ddb.clone(), &c.table, 90, meter.clone());
        let (live, first) = new_run("run_ttl", "carol");
        store
            .create_run(&live, &first, &[], Some("key-1"))
            .await
            .unwrap();
        assert_eq!(
            ttl(&raw("RUN#run_ttl".into()).await),
            None,
            "a live run never expires"
        );
        let idem = raw(format!("IDEM#{}#carol#key-1", "carol".len())).await;
        assert!(
            ttl(&idem).unwrap() > Utc::now().timestamp(),
            "idempotency keys expire after a day"
        );
        let mut done = next(&live, vec![]);
        done.run.status = RunStatus::Completed;
        store.commit(0, &done).await.unwrap();
        let expected = (done.run.updated_at + chrono::Duration::days(97)).timestamp();
        assert_eq!(
            ttl(&raw("RUN#run_ttl".into()).await),
            Some(expected),
            "a finished run's own TTL is the backstop, a week after the retention"
        );
        // The sweep's purge: nothing before the retention is over; then every item of the
        // run (its timeline with it), and nothing of any other run.
        assert_eq!(store.purge_finished(Utc::now(), 10).await.unwrap(), 0);
        let over = done.run.updated_at + chrono::Duration::days(91);
        assert_eq!(store.purge_finished(over, 10).await.unwrap(), 1);
        assert!(store.load("run_ttl").await.unwrap().is_none());
        let left = ddb
            .query()
            .table_name(&c.table)
            .key_condition_expression("PK = :pk")
            .expression_attribute_values(
                ":pk",
                aws_sdk_dynamodb::types::AttributeValue::S("RUN#run_ttl".into()),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(left.count(), 0, "no item of the run is left");
        assert!(store.load("run_c1").await.unwrap().is_some(), "others stay");
        assert_eq!(
            store.purge_finished(over, 10).await.unwrap(),
            0,
            "done once"
        );
        assert!(
            ttl(&raw("CTA#cta_c1".into()).await).is_some(),
            "a settled CTA expires"
        );
        let used = meter.snapshot();
        assert!(
            used.dynamodb_requests > 10 && used.write_units > 0,
            "{used:?}"
        );
    }
}

#[tokio::test]
async fn a_caller_sees_only_its_own_runs_and_ctas() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let script =
        r#"{"worker": [{"tool_calls": [{"name": "echo", "arguments": {"text": "danger"}}]}]}"#;
    let deps = Deps {
        store: Arc::new(local.clone()),
        queue: Arc::new(local.clone()),
        bus: Arc::new(local.clone()),
        scheduler: Arc::new(local.clone()),
        blobs: Arc::new(baton_local::blobs::FileBlobs::new(
            local.path().parent().unwrap(),
        )),
        llm: scripted(script),
        clock: Arc::new(SystemClock),
        sending_store: Some(Arc::new(local.clone())),
    };
    let agents = serde_json::json!({"agents": {"worker": {"tools": ["echo"], "approval": {"echo": "always"}}}});
    let svc = Arc::new(Service::new(deps, catalog(Some(agents))));
    let req = baton_core::service::CreateRun {
        prompt: "go".into(),
        agent: Some("worker".into()),
        ..Default::default()
    };
    let run = svc.create_run("alice", req, None).await.unwrap();
    let worker = baton_dev::worker::Worker::new(svc.clone(), local.clone(), Default::default());
    worker.drain().await.unwrap();
    let cta = svc
        .list_ctas("alice", None, None, None, 10)
        .await
        .unwrap()
        .0
        .remove(0);
    use baton_core::service::ServiceError::NotFound;
    assert!(matches!(
        svc.get_run("bob", &run.run_id, 10).await,
        Err(NotFound(_))
    ));
    assert!(matches!(
        svc.cancel("bob", &run.run_id, None).await,
        Err(NotFound(_))
    ));
    assert!(matches!(
        svc.post_message(
            "bob",
            &run.run_id,
            baton_core::service::FollowUp::text("hi"),
            None
        )
        .await,
        Err(NotFound(_))
    ));
    assert!(
        svc.list_ctas("bob", None, None, None, 10)
            .await
            .unwrap()
            .0
            .is_empty()
    );
    assert!(matches!(
        svc.get_cta(Some("bob"), &cta.cta_id).await,
        Err(NotFound(_))
    ));
    let answer = CtaResponse::Approval {
        approved: true,
        reason: None,
    };
    assert!(matches!(
        svc.answer_cta(Some("bob"), &cta.cta_id, answer.clone(), None)
            .await,
        Err(NotFound(_))
    ));
    assert_eq!(
        svc.get_cta(Some("alice"), &cta.cta_id)
            .await
            .unwrap()
            .status,
        CtaStatus::Pending
    );
    svc.answer_cta(Some("alice"), &cta.cta_id, answer, None)
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
        let svc = baton_local::local_service(
            &local,
            scripted(&script),
            catalog(Some(agents)),
            Arc::new(SystemClock),
        );
        svc.set_cache_bytes(0);
        let req = baton_core::service::CreateRun {
            prompt: "go".into(),
            agent: Some("worker".into()),
            ..Default::default()
        };
        let run = svc.create_run("alice", req, None).await.unwrap();
        let worker = baton_dev::worker::Worker::new(svc.clone(), local.clone(), Default::default());
        worker.drain().await.unwrap();
        let (rec, timeline) = local.load(&run.run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Completed);
        let (warm, cold) = svc.cache_use();
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
/// and a cold step reads about the budget, not the history: as much per step at 200 (160)
/// rounds as at 80 (entries on the embedded store; read units on DynamoDB).
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

    // The same on DynamoDB (moto), every step cold.
    let aws = crate::common::aws::Emulator::start_with(None).await;
    let (on_dynamo, short, _) = budgeted::conversation(0, 80, Some(&aws), SIZES).await;
    budgeted::same(
        &on_dynamo,
        &warm,
        "DynamoDB, cold, and the embedded store, warm",
    );
    let (_, long, _) = budgeted::conversation(0, 160, Some(&aws), SIZES).await;
    eprintln!("DynamoDB read units per cold step: {short:.1} at 80 rounds, {long:.1} at 160");
    assert!(
        long <= short * 1.2,
        "a cold step reads what the budget holds on DynamoDB too: {long:.1} read units at 160 \
         rounds, {short:.1} at 80"
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
        let svc = baton_local::local_service(
            &local,
            Arc::new(llm),
            catalog(Some(agents)),
            Arc::new(SystemClock),
        );
        svc.set_cache_bytes(cache);
        let req = baton_core::service::CreateRun {
            prompt: "go".into(),
            agent: Some("worker".into()),
            ..Default::default()
        };
        let run = svc.create_run("alice", req, None).await.unwrap();
        let worker = baton_dev::worker::Worker::new(svc.clone(), local.clone(), Default::default());
        worker.drain().await.unwrap();
        svc.post_message(
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
        let svc = match aws {
            None => baton_local::local_service(
                &local,
                Arc::new(llm),
                catalog(Some(agents)),
                Arc::new(SystemClock),
            ),
            Some(_) => {
                let deps = Deps {
                    store: store.clone(),
                    queue: Arc::new(local.clone()),
                    bus: Arc::new(local.clone()),
                    scheduler: Arc::new(local.clone()),
                    blobs: Arc::new(baton_local::blobs::FileBlobs::new(dir.path())),
                    llm: Arc::new(llm),
                    clock: Arc::new(SystemClock),
                    sending_store: None,
                };
                Arc::new(Service::new(deps, catalog(Some(agents))))
            }
        };
        svc.set_cache_bytes(cache_bytes);
        let req = baton_core::service::CreateRun {
            prompt: "go".into(),
            agent: Some("worker".into()),
            ..Default::default()
        };
        let run = svc.create_run("alice", req, None).await.unwrap();
        let worker = baton_dev::worker::Worker::new(svc.clone(), local.clone(), Default::default());
        let units = meter.snapshot().read_units;
        worker.drain().await.unwrap();
        let read = match aws {
            None => local.read_stats().entries as f64,
            Some(_) => meter.snapshot().read_units - units,
        };
        let (rec, timeline) = store.load(&run.run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.status, RunStatus::Completed);
        let (_, cold) = svc.cache_use();
        let requests = seen.seen.lock().unwrap().clone();
        (requests, read / cold.max(1) as f64, timeline)
    }

    /// The OpenAI-compatible client, pointed at `server`, without retries.
    pub fn openai(server: &wiremock::MockServer) -> baton_llm::openai::OpenAiLlm {
        baton_llm::openai::OpenAiLlm::new(baton_llm::openai::OpenAiConfig {
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
