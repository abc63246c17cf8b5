//! `baton bench --runs R --iterations N`: R runs at once, through `baton dev`'s own API.
//!
//! It starts the real local server (API, worker, embedded store) on a loopback port,
//! creates R runs of the scripted `bench` agent with `POST /runs` all at once, and while
//! they step, one client keeps reading `GET /runs/{id}` and `GET /runs/{id}/timeline` of
//! random runs, as a console or a poller would. It reports steps per second, each step's
//! latency (a message received to handled, its commit synced to disk), and the API's
//! latency under that load; then it checks that every run completed with nothing lost.

use baton_core::ports::RunReads;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use baton_dev::worker::StepTimes;
use baton_dev::{LocalOptions, LocalServer, WorkerOptions};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::bench::{
    Steal, bench_dir, cache_bytes, cpu_s, disk_sync_ms, peak_rss_mb, script, verify,
};

pub(crate) const TOKEN: &str = "bench";

/// The `q` quantile of `d` in milliseconds (`d` sorted).
fn quantile_ms(d: &[Duration], q: f64) -> f64 {
    if d.is_empty() {
        return 0.0;
    }
    let i = ((d.len() as f64 * q).ceil() as usize).clamp(1, d.len()) - 1;
    (d[i].as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0
}

pub(crate) fn summary(mut d: Vec<Duration>) -> Value {
    d.sort_unstable();
    json!({
        "count": d.len(),
        "p50_ms": quantile_ms(&d, 0.50),
        "p95_ms": quantile_ms(&d, 0.95),
        "p99_ms": quantile_ms(&d, 0.99),
        "max_ms": quantile_ms(&d, 1.0),
    })
}

pub(crate) async fn create(
    client: &reqwest::Client,
    url: &str,
) -> anyhow::Result<(String, Duration)> {
    let t = Instant::now();
    let resp = client
        .post(format!("{url}/runs"))
        .bearer_auth(TOKEN)
        .json(&json!({"prompt": "benchmark", "agent": "bench"}))
        .send()
        .await?;
    let elapsed = t.elapsed();
    let status = resp.status();
    let body: Value = resp.json().await?;
    ensure!(status.is_success(), "POST /runs: {status} {body}");
    let id = body["runId"].as_str().context("POST /runs: no runId")?;
    Ok((id.to_owned(), elapsed))
}

/// `baton dev` on loopback over `dir`, as the local benchmarks start it: `llm` and
/// `catalog`, the benchmarks' token, the machine's cache, no quotas, links or traces.
pub(crate) async fn start_server(
    dir: &std::path::Path,
    llm: baton_llm::scripted::ScriptedLlm,
    catalog: Arc<baton_core::agent::Catalog>,
    worker: WorkerOptions,
) -> anyhow::Result<LocalServer> {
    Ok(LocalServer::start(LocalOptions {
        token: Some(TOKEN.into()),
        worker,
        cache_bytes: cache_bytes(),
        ..LocalOptions::new(dir, Arc::new(llm), catalog)
    })
    .await?)
}

/// Reads runs and timelines one request at a time until `stop`; returns each latency.
async fn probe(
    client: reqwest::Client,
    url: String,
    ids: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::new();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let id = &ids[i.wrapping_mul(7919) % ids.len()];
        let path = if i.is_multiple_of(2) {
            format!("{url}/runs/{id}")
        } else {
            format!("{url}/runs/{id}/timeline?limit=20")
        };
        let t = Instant::now();
        let resp = client.get(&path).bearer_auth(TOKEN).send().await?;
        let status = resp.status();
        resp.bytes().await?;
        out.push(t.elapsed());
        ensure!(status.is_success(), "GET {path}: {status}");
        i += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(out)
}

pub async fn run(runs: usize, n: u64, data: Option<PathBuf>) -> anyhow::Result<String> {
    let (dir, remove) = bench_dir(data)?;
    let (llm, catalog) = script(n, None)?;
    let disk_sync = disk_sync_ms(&dir)?;
    let times = StepTimes::default();
    let worker = WorkerOptions {
        concurrency: runs.clamp(8, 512),
        step_times: Some(times.clone()),
        in_a_row: crate::steps_in_a_row(),
        ..WorkerOptions::default()
    };
    let server = start_server(&dir, llm, catalog, worker).await?;
    let url = server.url();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(runs.min(256))
        .build()?;

    let (started, cpu_started, steal) = (Instant::now(), cpu_s(), Steal::start());
    let io = crate::bench::DiskIo::now();
    let mut creating = JoinSet::new();
    for _ in 0..runs {
        let (client, url) = (client.clone(), url.clone());
        creating.spawn(async move { create(&client, &url).await });
    }
    let (mut ids, mut create_times) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    while let Some(r) = creating.join_next().await {
        let (id, t) = r??;
        ids.push(id);
        create_times.push(t);
    }
    let ids = Arc::new(ids);
    let stop = Arc::new(AtomicBool::new(false));
    let prober = tokio::spawn(probe(
        client.clone(),
        url.clone(),
        ids.clone(),
        stop.clone(),
    ));

    // Wait for every run to finish, looking at the store (not through the API being measured).
    let deadline = Instant::now() + Duration::from_secs(60 + runs as u64 * n / 50);
    // One read per look: the first run not seen finished is read until it is, then the
    // next (reading every pending run each time cost as much CPU as the steps' own reads).
    let mut pending = ids.iter().peekable();
    while let Some(id) = pending.peek() {
        let rec = server.store.get_run(id).await?.context("a run vanished")?;
        if rec.run.status.is_terminal() {
            pending.next();
            continue;
        }
        ensure!(
            Instant::now() < deadline,
            "{} of {runs} runs had not finished after {:?}",
            pending.len(),
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (wall, cpu, steal) = (started.elapsed(), cpu_s() - cpu_started, steal.pct());
    stop.store(true, Ordering::Relaxed);
    let api_times = prober.await??;
    let steps = times.take();
    let steps_done = steps.len();
    let (warm, cold) = server.service.steps().cache_use();
    let written = io.per_step_since(steps.len());
    let writes = server.store.write_stats();
    let reads = server.store.read_stats();

    for id in ids.iter() {
        verify(&server.store, id, n).await?;
    }
    if steps.len() < runs * n as usize {
        bail!(
            "{} steps were handled, expected at least {}",
            steps.len(),
            runs * n as usize
        );
    }
    let report = json!({
        "runs": runs,
        "iterations": n,
        "wall_s": (wall.as_secs_f64() * 1e3).round() / 1e3,
        "steps": steps.len(),
        "steps_per_s": (steps.len() as f64 / wall.as_secs_f64()).round(),
        "cpu_s": (cpu * 100.0).round() / 100.0,
        "cpu_ms_per_step": (cpu * 1000.0 / steps.len().max(1) as f64 * 1000.0).round() / 1000.0,
        "step_latency": summary(steps),
        "api_reads": summary(api_times),
        "api_creates": summary(create_times),
        "writes": writes.jobs,
        "write_transactions": writes.batches,
        // Counted by the store: one per synced commit, two per checkpoint.
        "synced_commits": writes.synced,
        "checkpoints": writes.checkpoints,
        "fsyncs": writes.fsyncs(),
        "fsyncs_per_step": (writes.fsyncs() as f64 / steps_done.max(1) as f64 * 1000.0).round() / 1000.0,
        // Over the whole process: the API's sockets count in the write calls too.
        "written": written,
        "steps_per_synced_commit": (steps_done as f64 / writes.synced.max(1) as f64 * 10.0).round() / 10.0,
        "steps_with_cached_timeline": warm,
        "steps_loading_timeline": cold,
        "cache_budget_mb": server.service.steps().cache_budget() / (1024 * 1024),
        "cache_hit_rate": (warm as f64 / (warm + cold).max(1) as f64 * 1000.0).round() / 1000.0,
        // What the cold steps read of their timelines (a step's window, not its history).
        "entries_read_per_step_with_api": (reads.entries as f64 / steps_done.max(1) as f64 * 100.0).round() / 100.0,
        "bytes_read_per_step_with_api": (reads.bytes as f64 / steps_done.max(1) as f64).round(),
        "peak_rss_mb": (peak_rss_mb() * 10.0).round() / 10.0,
        "disk_sync": disk_sync,
        "cpu_steal_pct": steal,
        "all_completed": true,
    });
    server.shutdown().await;
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report.to_string())
}
