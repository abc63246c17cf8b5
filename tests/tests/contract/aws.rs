//! The AWS adapters: the port contracts on an emulator, and what is DynamoDB's own (pages,
//! items, the sweep's budget).

use super::*;
use baton_aws::dynamo::DynamoStore;
use baton_aws::eventbridge::EventBridgeBus;
use baton_aws::provision;
use baton_aws::scheduler::SchedulerTimers;
use baton_aws::sdk::Meter;
use baton_aws::sqs::SqsQueue;
use baton_core::ports::{Ctas, Ledgers, RunReads, RunWrites, Sweep};

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
        child.origin.parent = Some(baton_core::run::ParentLink {
            run_id: "run_or_4".into(),
            tool_call_id: format!("call_{i}"),
        });
        child.origin.root_run_id = Some("run_or_4".into());
        child.origin.depth = 1;
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
        sending_store: None,
        ..baton_local::local_deps(&local, scripted("{}"), Arc::new(SystemClock))
    };
    let svc = Service::builder(deps, catalog(None)).build();
    let budget = std::time::Duration::from_secs(2);
    let mut ticks = Vec::new();
    loop {
        let started = std::time::Instant::now();
        svc.steps()
            .sweep_within(chrono::Duration::minutes(5), budget)
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
            run.origin.budget = Some(budget);
            run.origin.root_run_id = Some(root.clone());
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
                // DynamoDB (and LocalStack's) may cancel a transaction that meets another on
                // the owner's spending item (`TransactionConflict`): nothing is written, and
                // the step is delivered again, as here.
                let mut tries = 0;
                while let Err(e) = store.commit(run.version, &t).await {
                    tries += 1;
                    assert!(e.is_retryable() && tries < 10, "{e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50 * tries)).await;
                }
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

mod items;
