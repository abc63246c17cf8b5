//! The AWS adapters: the port contracts on an emulator, and what is DynamoDB's own (pages,
//! items, the sweep's budget).

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
        body: EntryBody::User {
            text: t,
            message_id: None,
            options: Default::default(),
        },
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
        body: EntryBody::User {
            text: "a small step".into(),
            message_id: None,
            options: Default::default(),
        },
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

/// The Lambda functions' SDK config, built from the environment Lambda gives them
/// without the SDK's provider chain, reaches the services with the keys it is given (a
/// table, queues and a bus provisioned through it, and a write and a read), and refuses,
/// saying what to set, when neither keys nor an emulator are there.
#[tokio::test]
async fn the_functions_sdk_config_works_from_lambdas_environment_alone() {
    use baton_aws::sdk::{StaticKeys, lambda_sdk_config};
    use baton_aws::settings::SdkEnv;
    let aws = Emulator::start_with(None).await;
    let env = SdkEnv {
        endpoint: Some(aws.url.clone()),
        function_name: Some("EventsFunction".into()),
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
    store
        .create_run(&run, &first, &[], None, None)
        .await
        .unwrap();
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
        store
            .create_run(&run, &first, &[], None, None)
            .await
            .unwrap();
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
        store
            .create_run(&run, &first, &[], None, None)
            .await
            .unwrap();
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
        store
            .create_run(&child, &first, &[], None, None)
            .await
            .unwrap();
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
        store
            .create_run(&run, &first, &[], None, None)
            .await
            .unwrap();
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
    let svc = Service::builder(deps, catalog(None)).build();
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
    store
        .create_run(&run, &first, &[], None, None)
        .await
        .unwrap();
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
        .create_run(&live, &first, &[], Some("key-1"), None)
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

/// Spending commits of `owners` (one run each of `runs`, owners taken in turn), each run
/// committing `thinks` thinks at random moments over about two seconds, with a daily
/// allowance kept and the runs under one budgeted tree when `budgeted`: how many writes
/// met a transaction in flight on one of their items (the fault layer's DynamoDB
/// isolation), and the day's spending and the tree's as read back.
async fn contention(runs: usize, owners: usize, budgeted: bool) -> (u64, f64, f64) {
    use crate::common::fault::Faults;
    let aws = Emulator::start_with(Some(Faults {
        transaction_conflicts: true,
        ..Faults::isolation_only()
    }))
    .await;
    let names = aws.names("hot");
    provision::ensure(&aws.sdk().await, &names, "arn:aws:iam::123456789012:role/s")
        .await
        .unwrap();
    let sdk = aws.host_sdk().await;
    let store = Arc::new(DynamoStore::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        names.table(),
        90,
        Meter::shared(),
    ));
    let budget = baton_core::budget::Budget { budget_usd: 1000.0 };
    let root = "run_root".to_owned();
    let mut all = Vec::new();
    for i in 0..runs {
        let (mut run, first) = new_run(&format!("run_hot{i:03}"), &format!("owner{}", i % owners));
        if budgeted {
            run.budget = Some(budget);
            run.root_run_id = Some(root.clone());
        }
        store
            .create_run(&run, &first, &[], None, None)
            .await
            .unwrap();
        all.push(run);
    }
    let thinks = 3;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, run) in all.into_iter().enumerate() {
        let store = store.clone();
        tasks.spawn(async move {
            let mut run = run;
            let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for _ in 0..thinks {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                tokio::time::sleep(std::time::Duration::from_millis(x % 700)).await;
                let mut t = next(&run, vec![]);
                t.daily_spend = true;
                t.spent_usd = 0.01;
                store.commit(run.version, &t).await.unwrap();
                run = t.run;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let conflicts = aws
        .faulty
        .as_ref()
        .unwrap()
        .stats
        .conflicts
        .load(std::sync::atomic::Ordering::Relaxed);
    let today = Utc::now().date_naive();
    let mut day = 0.0;
    for o in 0..owners {
        day += store.spent_on(&format!("owner{o}"), today).await.unwrap();
    }
    let tree = match budgeted {
        true => store
            .ledger(&root)
            .await
            .unwrap()
            .map_or(0.0, |l| l.spent_usd),
        false => 0.0,
    };
    (conflicts, day, tree)
}

/// With a daily allowance, every spending commit adds to its owner's day; with a budget,
/// to its tree's ledger. Those counters are sharded (`COUNTER_SHARDS` items, by run): 100
/// runs of one owner, and 100 subagents of one budgeted tree, meet about as few
/// transaction conflicts as 100 runs of 100 owners, and every cent is counted once.
#[tokio::test]
async fn one_owners_hundred_runs_and_a_wide_fan_out_meet_few_conflicts_on_dynamodb() {
    let (apart, day, _) = contention(100, 100, false).await;
    assert!((day - 3.0).abs() < 1e-6, "{day}");
    let (one_owner, day, _) = contention(100, 1, false).await;
    assert!((day - 3.0).abs() < 1e-6, "{day}");
    let (fan_out, _, tree) = contention(100, 1, true).await;
    assert!((tree - 3.0).abs() < 1e-6, "{tree}");
    eprintln!("conflicts: 100 owners {apart}, one owner {one_owner}, one budgeted tree {fan_out}");
    // A conflict is a commit sent again a moment later; with one item per counter, past
    // three of them the commits fail (tried: the first phase's runs fail their thinks). Of
    // these 300 commits, at most one in five may meet one.
    assert!(
        one_owner <= apart + 60 && fan_out <= apart + 60,
        "conflicts: 100 owners {apart}, one owner {one_owner}, one budgeted tree {fan_out}"
    );
}

/// The sweep's indexes over `BATON_SWEEP_SHARDS` partitions: a table written over 16 is
/// swept whole by a store told 4 once it has claimed the table (which records the most it
/// was written with), and a store of 16 writes past the first four.
#[tokio::test]
async fn a_store_of_fewer_sweep_shards_sweeps_every_shard_the_table_was_written_with() {
    let t = table("shards").await;
    let store = |shards: u32| {
        DynamoStore::new(t.dynamo.clone(), &t.p.config.table, 90, t.meter.clone())
            .with_sweep_shards(shards)
    };
    let wide = store(16);
    wide.claim_format().await.unwrap();
    for i in 0..40 {
        let (run, first) = new_run(&format!("run_shard{i:02}"), "alice");
        let start = vec![Effect::Send(msg(&run.run_id, "start"))];
        wide.create_run(&run, &first, &start, None, None)
            .await
            .unwrap();
    }
    let later = Utc::now() + chrono::Duration::seconds(5);
    assert_eq!(wide.stale_outboxes(later, 100).await.unwrap().len(), 40);
    let narrow = store(4);
    let unclaimed = narrow.stale_outboxes(later, 100).await.unwrap().len();
    assert!(
        unclaimed < 40,
        "the runs spread past four shards: {unclaimed}"
    );
    narrow.claim_format().await.unwrap();
    assert_eq!(narrow.read_shards(), 16);
    assert_eq!(narrow.stale_outboxes(later, 100).await.unwrap().len(), 40);
}
