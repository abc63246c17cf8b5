//! `baton bench --aws --runs R --ctas C --iterations N`: R runs stepping at once over AWS
//! APIs (the emulator at `AWS_ENDPOINT_URL`) while C questions wait, through `baton dev
//! --aws`'s own API and its event source mappings.
//!
//! It starts the AWS host on a loopback port with `--pollers` pollers (Lambda's event source
//! mappings scale out so), loads C pending CTAs in bulk under 100 waiting runs (the store's
//! bulk loader: as many runs asking on an emulator would take hours), creates R runs of
//! the scripted `bench` agent with `POST /runs`, and while they step, one client pages
//! through the inbox (`GET /ctas?status=pending&limit=50`, following `nextCursor`, and under
//! one run), the runs (`GET /runs?limit=50`) and single runs, as consoles would. It reports
//! steps per second, the API's latency per route, the largest page it was given, and the
//! AWS requests and DynamoDB units per step; it fails if a run does not complete or a page
//! passes its bound.

use baton_core::ports::{RunReads, RunWrites};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use baton_aws::dynamo::DynamoStore;
use baton_aws::provision::Names;
use baton_aws::sdk::Meter;
use baton_core::cta::{Cta, CtaRequest, CtaStatus};
use baton_core::run::{NewRun, Run, RunStatus};
use baton_core::timeline::{Entry, EntryBody};
use baton_dev::{AwsDevOptions, AwsDevServer, LOCAL_OWNER};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::bench::script;
use crate::load::{TOKEN, create, summary};
/// The runs the waiting CTAs are spread over.
const WAITING_RUNS: usize = 100;
/// The page the inbox asks for, and the most it may be given.
const INBOX_PAGE: usize = 50;
/// POST /runs at most this many at a time.
const CREATING_AT_ONCE: usize = 32;

pub struct LoadAws {
    pub runs: usize,
    pub ctas: usize,
    pub iterations: u64,
    pub pollers: usize,
}

pub async fn run(opts: LoadAws, config: &crate::Settings) -> anyhow::Result<String> {
    ensure!(
        config.aws.sdk.endpoint.is_some(),
        "set AWS_ENDPOINT_URL to an emulator (moto or LocalStack)"
    );
    let sdk = baton_aws::sdk::sdk_config(&config.aws.sdk).await;
    let names = Names::new(format!(
        "load-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let (llm, catalog) = script(opts.iterations, None)?;
    let mut server = AwsDevServer::start(AwsDevOptions {
        steps_at_once: config.steps_at_once.map(|n| n as usize),
        steps_in_a_row: config.steps_in_a_row.map(|n| n as usize),
        ..AwsDevOptions::new(
            sdk.clone(),
            names,
            "arn:aws:iam::000000000000:role/bench-scheduler",
            TOKEN,
            Arc::new(llm),
            catalog,
        )
    })
    .await?;
    server.add_pollers(opts.pollers.saturating_sub(1));
    let store = DynamoStore::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &server.provisioned.config.table,
        server.provisioned.config.retention_days,
        Meter::shared(),
    );
    let roots = seed_ctas(&store, opts.ctas).await?;

    let url = server.url();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let meter_start = server.meter.snapshot();
    let billed_start = server.billed();
    let started = Instant::now();
    let mut creating = JoinSet::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(CREATING_AT_ONCE));
    for _ in 0..opts.runs {
        let (client, url, gate) = (client.clone(), url.clone(), gate.clone());
        creating.spawn(async move {
            let _slot = gate.acquire_owned().await?;
            create(&client, &url).await
        });
    }
    let (mut ids, mut create_times) = (Vec::with_capacity(opts.runs), Vec::new());
    while let Some(r) = creating.join_next().await {
        let (id, t) = r??;
        ids.push(id);
        create_times.push(t);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let prober = tokio::spawn(probe(
        client.clone(),
        url.clone(),
        Arc::new(ids.clone()),
        roots.first().cloned(),
        stop.clone(),
    ));

    // Every run completes: read from the store, a run at a time until it has.
    let deadline = Instant::now() + Duration::from_secs(300 + opts.runs as u64 * opts.iterations);
    let mut pending = ids.iter().peekable();
    while let Some(id) = pending.peek() {
        let run = store.get_run(id).await?.context("a run vanished")?.run;
        if run.status.is_terminal() {
            ensure!(
                run.status == RunStatus::Completed,
                "run {id} ended {:?}: {:?}",
                run.status,
                run.outcome.error
            );
            pending.next();
            continue;
        }
        ensure!(
            Instant::now() < deadline,
            "{} of {} runs had not completed after {:?}",
            pending.len(),
            opts.runs,
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let probes = prober.await??;
    let used = server.meter.snapshot();
    let billed = server.billed();
    let (warm, cold) = server.steps_taken();
    let steps = warm + cold;
    ensure!(
        steps >= opts.runs as u64 * (opts.iterations + 1),
        "{steps} steps for {} runs of {} iterations",
        opts.runs,
        opts.iterations
    );
    let per_step = |x: f64| (x / steps.max(1) as f64 * 100.0).round() / 100.0;
    let requests = (used.dynamodb_requests - meter_start.dynamodb_requests)
        + (used.sqs_requests - meter_start.sqs_requests)
        + (used.eventbridge_requests - meter_start.eventbridge_requests)
        + (used.scheduler_requests - meter_start.scheduler_requests);
    // All in, as AWS bills it: DynamoDB's units, every SQS request (the adapters' sends and
    // the mappings' receives, deletes and visibility changes), EventBridge and Scheduler,
    // and Lambda's requests and duration at each function's memory, as the stand-in ran them
    // (on this machine, against the emulator: its duration is this machine's, not AWS's).
    use crate::bench_aws::{
        PRICE_EVENT, PRICE_LAMBDA_GB_S, PRICE_LAMBDA_REQUEST, PRICE_READ_UNIT, PRICE_SCHEDULER,
        PRICE_SQS_FIFO_REQUEST, PRICE_WRITE_UNIT,
    };
    let invocations = billed.invocations - billed_start.invocations;
    let gb_s = billed.gb_seconds - billed_start.gb_seconds;
    let mapping_sqs = billed.mapping_sqs_requests - billed_start.mapping_sqs_requests;
    let parts = [
        (
            "dynamodb",
            (used.write_units - meter_start.write_units) as f64 * PRICE_WRITE_UNIT
                + (used.read_units - meter_start.read_units) * PRICE_READ_UNIT,
        ),
        (
            "sqs",
            ((used.sqs_requests - meter_start.sqs_requests) + mapping_sqs) as f64
                * PRICE_SQS_FIFO_REQUEST,
        ),
        (
            "eventbridge",
            (used.eventbridge_requests - meter_start.eventbridge_requests) as f64 * PRICE_EVENT,
        ),
        (
            "scheduler",
            (used.scheduler_requests - meter_start.scheduler_requests) as f64 * PRICE_SCHEDULER,
        ),
        ("lambda_requests", invocations as f64 * PRICE_LAMBDA_REQUEST),
        ("lambda_duration", gb_s * PRICE_LAMBDA_GB_S),
    ];
    let per_million = |usd: f64| (usd / steps.max(1) as f64 * 1e6 * 100.0).round() / 100.0;
    let all_in: f64 = parts.iter().map(|(_, usd)| usd).sum();
    let breakdown: serde_json::Map<String, Value> = parts
        .iter()
        .map(|(k, usd)| ((*k).to_owned(), json!(per_million(*usd))))
        .collect();
    // What a step waiting on a model adds: the step function's duration at its memory for
    // each second, shared by the runs an invocation steps at once.
    let memory = baton_dev::functions::Functions::deployed()?
        .fed_by("StepsQueue")?
        .memory_mb;
    let at_once = config.steps_at_once.map_or_else(
        || baton_lambda::steps_at_once(Some(memory), baton_core::service::budget_for(memory)),
        |n| n as usize,
    );
    let wait_usd = memory as f64 / 1024.0 * PRICE_LAMBDA_GB_S * 1e6;
    let mut routes = serde_json::Map::new();
    let mut largest = 0;
    for (route, (times, most)) in probes {
        largest = largest.max(most);
        routes.insert(route, summary(times));
    }
    let report = json!({
        "runs": opts.runs,
        "iterations": opts.iterations,
        "ctas_waiting": opts.ctas,
        "pollers": opts.pollers,
        "wall_s": (wall.as_secs_f64() * 1e3).round() / 1e3,
        "steps": steps,
        "steps_per_s": (steps as f64 / wall.as_secs_f64() * 10.0).round() / 10.0,
        "steps_with_cached_timeline": warm,
        "api_creates": summary(create_times),
        "api_reads": routes,
        "largest_inbox_page": largest,
        // Every AWS call of every function while the runs stepped, the API's reads included.
        "aws_requests_per_step": per_step(requests as f64),
        "dynamodb_read_units_per_step": per_step(used.read_units - meter_start.read_units),
        "dynamodb_write_units_per_step": per_step((used.write_units - meter_start.write_units) as f64),
        // As DynamoDB answered (`ReturnConsumedCapacity`, its indexes' writes included):
        // real units on DynamoDB Local or AWS; moto answers a fixed unit for some calls.
        "dynamodb_consumed_read_units_per_step":
            per_step(used.consumed_read_units - meter_start.consumed_read_units),
        "dynamodb_consumed_write_units_per_step":
            per_step(used.consumed_write_units - meter_start.consumed_write_units),
        // Of those, what transactions' answers named: DynamoDB bills a transaction's writes
        // twice, DynamoDB Local reports them once (add this to its report for AWS's bill).
        "dynamodb_consumed_write_units_per_step_in_transactions": per_step(
            used.consumed_transact_write_units - meter_start.consumed_transact_write_units
        ),
        "dynamodb_usd_per_million_steps_as_consumed": per_million(
            (used.consumed_read_units - meter_start.consumed_read_units) * PRICE_READ_UNIT
                + (used.consumed_write_units - meter_start.consumed_write_units)
                    * PRICE_WRITE_UNIT,
        ),
        "mapping_sqs_requests_per_step": per_step(mapping_sqs as f64),
        "lambda_invocations_per_step": per_step(invocations as f64),
        "lambda_gb_s_per_step": (gb_s / steps.max(1) as f64 * 1e6).round() / 1e6,
        "usd_per_million_steps_all_in": per_million(all_in),
        "usd_per_million_steps_by_service": breakdown,
        "model_wait_usd_per_million_step_seconds": {
            "alone": (wait_usd * 100.0).round() / 100.0,
            "runs_an_invocation_steps_at_once": at_once,
            "shared": (wait_usd / at_once as f64 * 100.0).round() / 100.0,
        },
        "all_completed": true,
    });
    server.shutdown().await;
    Ok(report.to_string())
}

/// `ctas` pending CTAs of the API's owner, spread over [`WAITING_RUNS`] waiting runs
/// (created first), loaded in bulk. Returns the runs' ids.
async fn seed_ctas(store: &DynamoStore, ctas: usize) -> anyhow::Result<Vec<String>> {
    if ctas == 0 {
        return Ok(Vec::new());
    }
    let now = chrono::Utc::now();
    let mut roots = Vec::new();
    for i in 0..WAITING_RUNS.min(ctas) {
        let mut run = Run::new(NewRun::top_level(
            format!("run_waiting_{i:03}"),
            "bench",
            LOCAL_OWNER,
            now,
        ));
        run.status = RunStatus::Waiting;
        run.next_seq = 1;
        run.set_prompt("waits for its questions");
        let first = Entry {
            seq: 0,
            at: now,
            body: EntryBody::user("waits for its questions"),
        };
        store.create_run(&run, &[first], &[], None, None).await?;
        roots.push(run);
    }
    let all: Vec<Cta> = (0..ctas)
        .map(|i| {
            let run = &roots[i % roots.len()];
            Cta {
                budget: None,
                cta_id: format!("cta_load_{i:05}"),
                run_id: run.run_id.clone(),
                root_run_id: Some(run.run_id.clone()),
                agent: Some(run.agent.clone()),
                run_prompt: run.prompt.clone(),
                tool_call_id: format!("call_{i}"),
                owner: LOCAL_OWNER.into(),
                request: CtaRequest::Approval {
                    message: format!("May I go on with step {i}?"),
                },
                default: None,
                status: CtaStatus::Pending,
                response: None,
                gate: false,
                gated: None,
                created_at: now + chrono::Duration::milliseconds(i as i64),
                expires_at: now + chrono::Duration::days(30),
                resolved_at: None,
                defaulted: false,
                responder: None,
                link_nonce: None,
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
        })
        .collect();
    store.import_ctas(&all).await?;
    Ok(roots.into_iter().map(|r| r.run_id).collect())
}

/// A route's latencies, and the most items a page of it held.
type Probed = HashMap<String, (Vec<Duration>, usize)>;

/// Reads what consoles read, one request at a time, until `stop`: the inbox page after
/// page (starting again at the end), one run's questions, the list of runs, and single
/// runs. Fails when a page holds more than it asked for.
async fn probe(
    client: reqwest::Client,
    url: String,
    ids: Arc<Vec<String>>,
    root: Option<String>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Probed> {
    let mut out: Probed = HashMap::new();
    let mut cursor: Option<String> = None;
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let (route, path) = match i % 4 {
            0 => (
                "GET /ctas?status=pending&limit=50",
                format!(
                    "{url}/ctas?status=pending&limit={INBOX_PAGE}{}",
                    cursor
                        .as_ref()
                        .map(|c| format!("&cursor={c}"))
                        .unwrap_or_default()
                ),
            ),
            1 => match &root {
                Some(root) => (
                    "GET /ctas?rootRunId=…&limit=50",
                    format!("{url}/ctas?status=pending&rootRunId={root}&limit={INBOX_PAGE}"),
                ),
                None => ("GET /runs?limit=50", format!("{url}/runs?limit=50")),
            },
            2 => ("GET /runs?limit=50", format!("{url}/runs?limit=50")),
            _ => (
                "GET /runs/{id}",
                format!("{url}/runs/{}", ids[i.wrapping_mul(7919) % ids.len()]),
            ),
        };
        let t = Instant::now();
        let resp = client.get(&path).bearer_auth(TOKEN).send().await?;
        let status = resp.status();
        let body: Value = resp.json().await?;
        let took = t.elapsed();
        ensure!(status.is_success(), "GET {path}: {status} {body}");
        let items = body["ctas"]
            .as_array()
            .or(body["runs"].as_array())
            .map_or(0, Vec::len);
        ensure!(
            items <= INBOX_PAGE,
            "GET {path} gave a page of {items} for a limit of {INBOX_PAGE}"
        );
        if i.is_multiple_of(4) {
            cursor = body["nextCursor"].as_str().map(str::to_owned);
        }
        let slot = out.entry(route.to_owned()).or_default();
        slot.0.push(took);
        slot.1 = slot.1.max(items);
        i += 1;
    }
    Ok(out)
}
