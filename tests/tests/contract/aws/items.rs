//! What DynamoDB holds of a run, item by item: a timeline's segments and the tail its run's
//! item carries, what a commit rewrites, and a commit whose answer was lost.

use super::*;
use baton_aws::dynamo::DynamoStore;
use baton_aws::sdk::Meter;
use baton_core::ports::{RunReads, RunWrites};

/// `GET /runs/{id}` and the timeline's pages read the page they return: on a run of
/// 10,000 entries (500 segments), a page of 100 reads six segments wherever it starts,
/// counted in requests and read units, while the whole timeline is hundreds of units.
#[tokio::test]
async fn a_page_of_a_10000_entry_timeline_reads_only_that_page_on_dynamodb() {
    let Table {
        _aws, meter, store, ..
    } = table("pages").await;
    let (mut run, first) = new_run("run_pages", "dana");
    store
        .create_run(&run, &first, &[], None, None)
        .await
        .unwrap();
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
                body: EntryBody::user(text(run.next_seq + i)),
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

/// A run's latest entries ride in its item (store format 3), and nothing about reading
/// them changes: over 60 commits of one to three entries (a few too large for any tail),
/// some resolving earlier entries in place, every read (`load`, a window from any seq, a
/// page after any cursor) gives the timeline the commits made. A commit of small entries is
/// one plain write, not a transaction: ten of them cost at most 25 write units (a
/// transaction of the run item and a segment costs 4). A second store that read the run
/// long ago (a slow Lambda) commits too late: its copy of the tail it read changes
/// nothing, and neither does a copy of the tail whose commit never came.
#[tokio::test]
async fn a_runs_latest_entries_ride_in_its_item_and_every_read_sees_them_whole_on_dynamodb() {
    let Table {
        _aws,
        p,
        meter,
        store,
        dynamo,
    } = table("tail").await;
    let (mut run, first) = new_run("run_tail", "tia");
    store
        .create_run(&run, &first, &[], None, None)
        .await
        .unwrap();
    let mut expected = first.clone();
    let text = |seed: u64, len: usize| -> String {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (b'a' + (x % 26) as u8) as char
            })
            .collect()
    };
    let user = |seq: u64, t: String| Entry {
        seq,
        at: Utc::now(),
        body: EntryBody::user(t),
    };
    let check = async |store: &DynamoStore, run: &Run, expected: &[Entry]| {
        let (rec, whole) = store.load(&run.run_id).await.unwrap().unwrap();
        assert_eq!(rec.run.version, run.version);
        assert_eq!(whole, expected, "load at version {}", run.version);
        for from in [
            1,
            run.next_seq / 2,
            run.next_seq.saturating_sub(3),
            run.next_seq - 1,
        ] {
            let (_, window, base) = store
                .load_window(&run.run_id, &|_: &Run| from)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(base, from);
            assert_eq!(window, expected[from as usize..], "window from {from}");
        }
        for after in [
            None,
            Some(0),
            Some(run.next_seq / 3),
            Some(run.next_seq - 2),
        ] {
            let page = store.entries_after(&run.run_id, after, 7).await.unwrap();
            let from = after.map_or(0, |a| a as usize + 1);
            let end = (from + 7).min(expected.len());
            assert_eq!(page, expected[from..end], "page after {after:?}");
        }
    };
    // A second store, over the same table, that reads the run now and commits only later.
    let slow = DynamoStore::new(dynamo.clone(), &p.config.table, 90, Meter::shared());
    let mut late: Option<Transition> = None;
    let mut last_tf = None;
    let mut small_units = Vec::new();
    for i in 0..60u64 {
        let mut t = next(&run, vec![]);
        let n = 1 + i % 3;
        let large = i % 17 == 16;
        t.appended = (0..n)
            .map(|k| {
                let len = if large { 6000 } else { 40 + 60 * k as usize };
                user(run.next_seq + k, text(run.next_seq + k, len))
            })
            .collect();
        t.run.next_seq = run.next_seq + n;
        if i % 5 == 4 {
            // Resolved in place: one entry of the last commit (in the tail, most likely)
            // and one long before (in a segment).
            for seq in [run.next_seq - 1, run.next_seq / 2] {
                let mut e = expected[seq as usize].clone();
                e.body = EntryBody::Notice {
                    code: "resolved".into(),
                    message: format!("at {i}"),
                };
                t.updated.push(e);
            }
        }
        // Read by the slow store just after a tail was copied out: the tail it reads is
        // new, and the commits after grow it before it is copied out in turn.
        let tf = tail_first(&dynamo, &p.config.table).await;
        if late.is_none() && i >= 20 && tf != last_tf {
            slow.get_run("run_tail").await.unwrap().unwrap();
            let mut stale = next(&run, vec![]);
            // Too large to join the tail it read: it copies that tail out first.
            stale.appended = vec![user(run.next_seq, text(7, 3000))];
            stale.run.next_seq = run.next_seq + 1;
            late = Some(stale);
        }
        last_tf = tf;
        let before = meter.snapshot().write_units;
        store.commit(run.version, &t).await.unwrap();
        if !large && t.updated.is_empty() {
            small_units.push(meter.snapshot().write_units - before);
        }
        t.apply(&mut expected);
        run = t.run;
        check(&store, &run, &expected).await;
    }
    let ten: u64 = small_units.iter().rev().take(10).sum();
    eprintln!("ten small commits: {ten} write units ({small_units:?})");
    assert!(ten <= 25, "{ten} write units for ten small commits");

    // The slow store's commit: the tail it copies is older than the copy there now.
    let stale = late.expect("a tail was copied out after commit 20");
    let version = stale.run.version - 1;
    let r = slow.commit(version, &stale).await;
    assert!(matches!(r, Err(PortError::Conflict)), "{r:?}");
    check(&store, &run, &expected).await;

    // A copy of the tail whose commit never came (a crash between the two): the tail is
    // read over it, and `load` does not count it.
    let tf = tail_first(&dynamo, &p.config.table)
        .await
        .expect("the run item has a tail");
    let orphan = vec![user(tf, "half a tail, never committed".into())];
    dynamo
        .put_item()
        .table_name(&p.config.table)
        .item(
            "PK",
            aws_sdk_dynamodb::types::AttributeValue::S("RUN#run_tail".into()),
        )
        .item(
            "SK",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("T#{tf:010}")),
        )
        .item("n", aws_sdk_dynamodb::types::AttributeValue::N("1".into()))
        .item("tv", aws_sdk_dynamodb::types::AttributeValue::N("0".into()))
        .item(
            "b",
            aws_sdk_dynamodb::types::AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(
                baton_codec::encode(&orphan).unwrap(),
            )),
        )
        .send()
        .await
        .unwrap();
    check(&store, &run, &expected).await;
    // The commits after it copy the real tail over it.
    for _ in 0..12 {
        let mut t = next(&run, vec![]);
        t.appended = vec![user(run.next_seq, text(run.next_seq, 300))];
        t.run.next_seq = run.next_seq + 1;
        store.commit(run.version, &t).await.unwrap();
        t.apply(&mut expected);
        run = t.run;
    }
    check(&store, &run, &expected).await;
}

/// A commit of the run item alone that DynamoDB applied but whose answer was lost (a 500
/// after the write: the SDK sends it again, and finds its own write's version) is the
/// commit's success, as a transaction's retry is by its `ClientRequestToken`, not a
/// conflict: the step would hydrate again for nothing.
#[tokio::test]
async fn a_plain_commit_whose_answer_was_lost_is_its_own_write_on_dynamodb() {
    use crate::common::fault::{Faults, FaultyAws};
    let Table { _aws, p, store, .. } = table("lost").await;
    let (run, first) = new_run("run_lost", "lou");
    store
        .create_run(&run, &first, &[], None, None)
        .await
        .unwrap();
    let faulty = FaultyAws::start(
        &_aws.url,
        Faults {
            lost_answers: 1.0,
            fire_schedules: false,
            ..Faults::default()
        },
    )
    .await;
    faulty.turn_on();
    let lossy = DynamoStore::new(
        aws_sdk_dynamodb::Client::new(&faulty.sdk().await),
        &p.config.table,
        90,
        Meter::shared(),
    );
    lossy.get_run("run_lost").await.unwrap().unwrap();
    let mut t = next(&run, vec![]);
    t.appended = vec![Entry {
        seq: run.next_seq,
        at: Utc::now(),
        body: EntryBody::user("a small step"),
    }];
    t.run.next_seq = run.next_seq + 1;
    let r = lossy.commit(run.version, &t).await;
    assert!(r.is_ok(), "{r:?}");
    assert!(faulty.stats.lost.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    let (rec, entries) = store.load("run_lost").await.unwrap().unwrap();
    assert_eq!(rec.run.version, t.run.version);
    assert_eq!(entries.len(), 2);
    // Another writer's commit at the version it read is a conflict all the same.
    let r = lossy.commit(run.version, &t).await;
    assert!(matches!(r, Err(PortError::Conflict)), "{r:?}");
}

/// The first seq of `run_tail`'s tail (`tf`), if its item has one.
async fn tail_first(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Option<u64> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let item = dynamo
        .get_item()
        .table_name(table)
        .key("PK", AttributeValue::S("RUN#run_tail".into()))
        .key("SK", AttributeValue::S("META".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item?;
    match item.get("tf") {
        Some(AttributeValue::N(x)) => x.parse().ok(),
        _ => None,
    }
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
            run.origin.metadata = Some(metadata.clone());
            run.origin.context = Some(context.clone());
        }
        store
            .create_run(&run, &first, &[], None, None)
            .await
            .unwrap();
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
            assert_eq!(r.origin.metadata, run.origin.metadata, "{id}");
            assert_eq!(r.origin.context, run.origin.context, "{id}");
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
    run.origin.metadata = Some(metadata.clone());
    run.origin.context = Some(context.clone());
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
    assert_eq!(got.origin.metadata, run.origin.metadata);
    assert_eq!(got.origin.context, run.origin.context);
    let listed = store
        .list_runs("ivy", &RunQuery::page(None, 10))
        .await
        .unwrap();
    assert!(
        listed
            .runs
            .iter()
            .any(|r| r.run_id == "run_legacy" && r.origin.metadata == run.origin.metadata)
    );
}
