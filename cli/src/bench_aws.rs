//! `baton bench --aws`: what one iteration costs on AWS, measured on an emulator with the
//! real adapters (requests, capacity units, dollars at list prices), warm and cold.

use baton_core::ports::RunReads;
use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, bail, ensure};
use baton_aws::dynamo::DynamoStore;
use baton_core::agent::{AgentsFile, Catalog, Limits};
use baton_core::ports::SystemClock;
use baton_core::service::{CreateRun, Service};
use baton_core::tools::{Effects, Tool};
use baton_dev::LOCAL_OWNER;
use baton_llm::scripted::{ScriptedCall, ScriptedLlm, ScriptedReply};
use serde_json::json;

use crate::bench::payload;

/// The shared-workers measurement: runs, containers, and steps per run.
const FLEET_RUNS: usize = 100;
const FLEET_WORKERS: usize = 10;
const FLEET_STEPS: usize = 5;

/// Published on-demand prices (us-east-1) used for the cost figures.
pub const PRICE_WRITE_UNIT: f64 = 0.625 / 1e6;
pub const PRICE_READ_UNIT: f64 = 0.125 / 1e6;
pub const PRICE_SQS_FIFO_REQUEST: f64 = 0.50 / 1e6;
pub const PRICE_EVENT: f64 = 1.00 / 1e6;
pub const PRICE_SCHEDULER: f64 = 1.00 / 1e6;
/// Lambda (us-east-1, x86): a request, and a GB-second of duration.
pub const PRICE_LAMBDA_REQUEST: f64 = 0.20 / 1e6;
pub const PRICE_LAMBDA_GB_S: f64 = 0.000_016_666_7;

/// `baton bench --aws`: what one iteration costs on AWS, measured on the emulator at
/// `AWS_ENDPOINT_URL` with the real adapters: requests and DynamoDB capacity units (derived
/// from item sizes by DynamoDB's rules), warm (a container that stepped the run before) and
/// cold (a fresh container), at histories of about 10, 100, 1,000 and 10,000 entries.
pub async fn run_aws(
    max_history: u64,
    effects: Effects,
    config: &crate::Settings,
) -> anyhow::Result<String> {
    use baton_aws::provision::{self, Names};
    use baton_aws::sdk::{Meter, Usage};
    use baton_dev::event_source::{EventSources, Feeds};

    ensure!(
        config.aws.sdk.endpoint.is_some(),
        "set AWS_ENDPOINT_URL to an emulator (moto or LocalStack)"
    );
    let sdk = baton_aws::sdk::sdk_config(&config.aws.sdk).await;
    let names = Names::new(format!(
        "bench-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let p = provision::ensure(
        &sdk,
        &names,
        "arn:aws:iam::000000000000:role/bench-scheduler",
    )
    .await?;
    let iterations = max_history / 2 + 1;
    // The iteration's call: the built-in `echo` (`none`), or an echo that says it has effects.
    let tool = match effects {
        Effects::None => "echo".to_owned(),
        other => format!("echo_{other}"),
    };
    let replies: Vec<ScriptedReply> = (0..iterations)
        .map(|i| ScriptedReply {
            text: None,
            tool_calls: vec![ScriptedCall {
                name: tool.clone(),
                arguments: json!({"text": payload(i, false)}),
            }],
            usage: None,
            down: Vec::new(),
        })
        .chain([ScriptedReply {
            text: Some("done".into()),
            tool_calls: vec![],
            usage: None,
            down: Vec::new(),
        }])
        .collect();
    // `fleet`: the short runs of the shared-workers measurement below.
    let fleet: Vec<ScriptedReply> = replies[..FLEET_STEPS - 1]
        .iter()
        .cloned()
        .chain(replies.last().cloned())
        .collect();
    let llm: Arc<dyn baton_core::llm::Llm> = Arc::new(ScriptedLlm::new(HashMap::from([
        ("bench".to_owned(), replies),
        ("fleet".to_owned(), fleet),
    ]))?);
    let file: AgentsFile = serde_json::from_value(json!({"agents": {
        "bench": {"tools": [tool], "maxIterations": iterations + 1,
                  "maxToolCallsPerTurn": iterations + 1},
        "fleet": {"tools": [tool]}}}))?;
    let extra: Vec<Arc<dyn Tool>> = match effects {
        Effects::None => vec![],
        _ => vec![Arc::new(EchoWith(tool.clone(), effects))],
    };
    let catalog = Arc::new(Catalog::new(Limits::default(), extra, Some(file))?);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let orchestrator = baton_dev::functions::Functions::deployed()?.fed_by("StepsQueue")?;
    let steps =
        EventSources::queue(&sqs, &p.config.steps_queue_url, Feeds::Steps, orchestrator).await?;
    let container = |meter: Arc<Meter>| {
        let deps = baton_aws::aws_deps(&p.config, &sdk, llm.clone(), Arc::new(SystemClock), meter);
        let service = Arc::new(Service::builder(deps, catalog.clone()).build());
        (
            service.clone(),
            EventSources::new(sqs.clone(), service, vec![steps.clone()]),
        )
    };
    let meter = Meter::shared();
    let (service, warm) = container(meter.clone());
    let reader = DynamoStore::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        &p.config.table,
        p.config.retention_days,
        Meter::shared(),
    );
    let req = CreateRun {
        prompt: "benchmark".into(),
        agent: Some("bench".into()),
        ..CreateRun::default()
    };
    let run_id = service
        .requests()
        .create_run(LOCAL_OWNER, req, None)
        .await?
        .run_id;

    let delta = |a: Usage, b: Usage| Usage {
        dynamodb_requests: b.dynamodb_requests - a.dynamodb_requests,
        sqs_requests: b.sqs_requests - a.sqs_requests,
        eventbridge_requests: b.eventbridge_requests - a.eventbridge_requests,
        scheduler_requests: b.scheduler_requests - a.scheduler_requests,
        read_units: b.read_units - a.read_units,
        write_units: b.write_units - a.write_units,
        consumed_read_units: b.consumed_read_units - a.consumed_read_units,
        consumed_write_units: b.consumed_write_units - a.consumed_write_units,
        consumed_transact_write_units: b.consumed_transact_write_units
            - a.consumed_transact_write_units,
    };
    let cost = |u: &Usage| {
        u.write_units as f64 * PRICE_WRITE_UNIT
            + u.read_units * PRICE_READ_UNIT
            + u.sqs_requests as f64 * PRICE_SQS_FIFO_REQUEST
            + u.eventbridge_requests as f64 * PRICE_EVENT
            + u.scheduler_requests as f64 * PRICE_SCHEDULER
    };
    let describe = |u: Usage| {
        json!({
            "requests": u.dynamodb_requests + u.sqs_requests + u.eventbridge_requests + u.scheduler_requests,
            "dynamodb_requests": u.dynamodb_requests, "sqs_requests": u.sqs_requests,
            "eventbridge_requests": u.eventbridge_requests, "scheduler_requests": u.scheduler_requests,
            "read_units": u.read_units, "write_units": u.write_units,
            "consumed_read_units": u.consumed_read_units,
            "consumed_write_units": u.consumed_write_units,
            "usd_per_million_iterations": (cost(&u) * 1e6 * 100.0).round() / 100.0,
        })
    };
    let mut samples = Vec::new();
    // Every step of the run the warm container takes: the mean, over the tail's whole cycle
    // (an entry joins the run item's tail, or the tail is copied out), not one step's.
    let (first, mut warm_steps) = (meter.snapshot(), 0u64);
    let mut targets: Vec<u64> = [10u64, 100, 1000, 10_000]
        .into_iter()
        .filter(|h| *h <= max_history)
        .collect();
    loop {
        let history = parts_history(&reader, &run_id).await?;
        if targets.first().is_some_and(|t| history + 1 >= *t) {
            let target = targets.remove(0);
            // Warm: the container that committed the last step checks only the run item.
            let before = meter.snapshot();
            ensure!(warm.pump_once().await? == 1, "expected one step message");
            warm_steps += 1;
            let warm_use = delta(before, meter.snapshot());
            // Cold: a fresh container reads the run item and its step's window.
            let cold_meter = Meter::shared();
            let (_, cold) = container(cold_meter.clone());
            let before = cold_meter.snapshot();
            ensure!(cold.pump_once().await? == 1, "expected one step message");
            let cold_use = delta(before, cold_meter.snapshot());
            samples.push(json!({"history_entries": target, "warm": describe(warm_use), "cold": describe(cold_use)}));
            if targets.is_empty() {
                break;
            }
            continue;
        }
        if warm.pump_once().await? == 0 {
            bail!("the run stopped before reaching the history sizes");
        }
        warm_steps += 1;
    }
    let all = delta(first, meter.snapshot());
    let per_step = |n: f64| (n / warm_steps.max(1) as f64 * 100.0).round() / 100.0;
    let mean = json!({
        "steps": warm_steps,
        "write_units": per_step(all.write_units as f64),
        "read_units": per_step(all.read_units),
        "dynamodb_requests": per_step(all.dynamodb_requests as f64),
        "usd_per_million_iterations": (cost(&all) / warm_steps.max(1) as f64 * 1e8).round() / 100.0,
    });

    // 100 runs on 10 containers. Lambda keeps no FIFO group on one container: each batch
    // goes to whichever is free (here, one picked at random), so most steps find another
    // container's cache and take the cold path.
    let workers: Vec<_> = (0..FLEET_WORKERS)
        .map(|_| container(Meter::shared()))
        .collect();
    for i in 0..FLEET_RUNS {
        let req = CreateRun {
            prompt: format!("fleet {i}"),
            agent: Some("fleet".into()),
            ..CreateRun::default()
        };
        workers[0]
            .0
            .requests()
            .create_run(LOCAL_OWNER, req, None)
            .await?;
    }
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut idle = 0;
    while idle < 3 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let (_, w) = &workers[(rng % FLEET_WORKERS as u64) as usize];
        idle = if w.pump_once().await? == 0 {
            idle + 1
        } else {
            0
        };
    }
    let (warm_steps, cold_steps) = workers.iter().fold((0, 0), |(w, c), (s, _)| {
        let (sw, sc) = s.steps().cache_use();
        (w + sw, c + sc)
    });
    ensure!(
        warm_steps + cold_steps >= (FLEET_RUNS * FLEET_STEPS) as u64,
        "the fleet did not finish: {warm_steps} warm and {cold_steps} cold steps"
    );
    let cold_share = cold_steps as f64 / (warm_steps + cold_steps) as f64;
    let blended: Vec<serde_json::Value> = samples
        .iter()
        .map(|s| {
            let usd = |k: &str| s[k]["usd_per_million_iterations"].as_f64().unwrap_or(0.0);
            let mix = cold_share * usd("cold") + (1.0 - cold_share) * usd("warm");
            json!({"history_entries": s["history_entries"],
                   "usd_per_million_iterations": (mix * 100.0).round() / 100.0})
        })
        .collect();
    // One sweep tick, as the scheduled rule runs it every 5 minutes: its requests, measured.
    let sweep_meter = Meter::shared();
    let (sweeper, _) = container(sweep_meter.clone());
    sweeper.steps().sweep(chrono::Duration::minutes(5)).await?;
    let tick = sweep_meter.snapshot();
    let ticks_per_month = 12.0 * 24.0 * 30.0;
    let tick_usd = cost(&tick) + 0.2e-6; // + one Lambda request
    let sweep = json!({
        "requests_per_tick": tick.dynamodb_requests + tick.sqs_requests,
        "read_units_per_tick": tick.read_units,
        "ticks_per_month": ticks_per_month,
        "usd_per_month": (tick_usd * ticks_per_month * 10_000.0).round() / 10_000.0,
        "index_write_units_per_parking_commit": 2,
        "usd_per_million_parking_commits": 2.0 * PRICE_WRITE_UNIT * 1e6,
    });
    Ok(json!({
        "tool_effects": effects,
        "aws": samples,
        "warm_mean": mean,
        "sweep": sweep,
        "shared_workers": {"runs": FLEET_RUNS, "workers": FLEET_WORKERS,
            "steps_per_run": FLEET_STEPS, "warm_steps": warm_steps, "cold_steps": cold_steps,
            "cold_share": (cold_share * 1000.0).round() / 1000.0, "blended": blended},
        "prices_usd": {"write_request_unit": 0.625e-6, "read_request_unit": 0.125e-6, "sqs_fifo_request": 0.5e-6,
                        "eventbridge_event": 1e-6, "scheduler_invocation": 1e-6},
    })
    .to_string())
}

async fn parts_history(store: &DynamoStore, run_id: &str) -> anyhow::Result<u64> {
    // Before the sample's meter snapshot, and on a meter of its own: what it reads is not
    // counted. The run item alone: a view of the run would read timeline pages, at every
    // step of a long run.
    let rec = store.get_run(run_id).await?.context("the run vanished")?;
    Ok(rec.run.next_seq)
}

/// `echo` under another name, declaring `effects`: what an iteration whose call has effects
/// writes (its reply committed before the call runs, its output before the next think, a
/// `once` call's start before it runs).
struct EchoWith(String, Effects);

#[async_trait::async_trait]
impl Tool for EchoWith {
    fn name(&self) -> &str {
        &self.0
    }
    fn description(&self) -> &str {
        baton_core::tools::Echo.description()
    }
    fn schema(&self) -> serde_json::Value {
        baton_core::tools::Echo.schema()
    }
    fn effects(&self) -> Effects {
        self.1
    }
    async fn execute(
        &self,
        ctx: &baton_core::tools::ToolContext,
        input: serde_json::Value,
    ) -> Result<serde_json::Value, baton_core::tools::ToolError> {
        baton_core::tools::Echo.execute(ctx, input).await
    }
}
