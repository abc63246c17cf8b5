//! The durable-loop benchmark.
//!
//! A scripted run of agent `bench` makes N iterations, each one `echo` call with a 1 KB
//! argument, then answers. Every iteration goes through the real path: the queue hands out
//! the step, the service re-hydrates, the engine thinks and dispatches, the commit is synced
//! to disk, the next step is enqueued. Variant B parks on an approval CTA at iteration N/2,
//! drops every in-memory object (store, service, worker, caches), reopens the store from
//! disk, answers the CTA and resumes.

use baton_core::ports::RunReads;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use baton_core::agent::{AgentsFile, Catalog, Limits};
use baton_core::cta::{CtaResponse, CtaStatus};
use baton_core::ports::SystemClock;
use baton_core::run::RunStatus;
use baton_core::service::{CreateRun, Service};
use baton_core::timeline::{EntryBody, ToolResult};
use baton_dev::LOCAL_OWNER;
use baton_dev::worker::{StepTimes, Worker, WorkerOptions};
use baton_llm::scripted::{ScriptedCall, ScriptedLlm, ScriptedReply};
use baton_local::local_deps;
use baton_local::store::{LocalStore, WriteStats};
use serde_json::json;

const PAYLOAD: usize = 1024;

/// A 1 KB argument that differs per iteration (and does not compress to nothing).
pub(crate) fn payload(i: u64, pause: bool) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789 ";
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut s = String::with_capacity(PAYLOAD);
    if pause {
        s.push_str("PAUSE ");
    }
    while s.len() < PAYLOAD {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push(ALPHABET[(x % ALPHABET.len() as u64) as usize] as char);
    }
    s
}

/// Where a benchmark keeps its store: the given empty directory, or a fresh temporary one
/// (true: remove it afterwards).
pub(crate) fn bench_dir(data: Option<PathBuf>) -> anyhow::Result<(PathBuf, bool)> {
    Ok(match data {
        Some(d) => {
            ensure!(
                !d.join("baton.db").exists(),
                "{} already holds a store; give an empty directory",
                d.display()
            );
            (d, false)
        }
        None => (
            std::env::temp_dir().join(format!("baton-bench-{}", uuid::Uuid::new_v4().simple())),
            true,
        ),
    })
}

/// The machine's CPU time so far, in ticks: all of it, and what the hypervisor took for
/// other guests ("steal", Linux's `/proc/stat`). None where that is not known.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|t| t.parse::<u64>().ok())
        .collect::<Option<Vec<_>>>()?;
    // user nice system idle iowait irq softirq steal; guest time is counted in user.
    let total = ticks.iter().take(8).sum();
    Some((total, *ticks.get(7)?))
}

/// The share of the machine's CPU time the hypervisor gave to other guests while a
/// benchmark ran (a percentage; null where unknown). On a shared host it varies by the
/// minute, and a run that shares the cores with someone else measures slower.
pub(crate) struct Steal(Option<(u64, u64)>);

impl Steal {
    pub(crate) fn start() -> Self {
        Self(machine_ticks())
    }

    pub(crate) fn pct(&self) -> serde_json::Value {
        match (self.0, machine_ticks()) {
            (Some((t0, s0)), Some((t1, s1))) if t1 > t0 => {
                json!(((s1 - s0) as f64 * 1000.0 / (t1 - t0) as f64).round() / 10.0)
            }
            _ => serde_json::Value::Null,
        }
    }
}

/// How long this disk takes to make a small write durable, where the store will be: a
/// 4 KB overwrite and `fdatasync`, 200 times; the median and the 90th percentile, in ms.
/// A lone run's step cannot take less than one such sync, so the figure says what of a
/// step's time is the disk's (it varies by machine and, on shared disks, by the minute).
pub(crate) fn disk_sync_ms(dir: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    use std::io::{Seek, SeekFrom, Write};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("sync-probe");
    let probe = || -> std::io::Result<Vec<Duration>> {
        let mut f = std::fs::File::create(&path)?;
        let page = [0x5au8; 4096];
        for _ in 0..16 {
            f.write_all(&page)?;
        }
        f.sync_all()?;
        let mut times = Vec::with_capacity(200);
        for i in 0..200u64 {
            let t = Instant::now();
            f.seek(SeekFrom::Start(i % 16 * 4096))?;
            f.write_all(&page)?;
            f.sync_data()?;
            times.push(t.elapsed());
        }
        Ok(times)
    };
    let times = probe();
    let _ = std::fs::remove_file(&path);
    let mut times = times.with_context(|| format!("timing a sync in {}", dir.display()))?;
    times.sort_unstable();
    let ms = |q: f64| {
        let d = times[((times.len() - 1) as f64 * q).round() as usize];
        (d.as_secs_f64() * 1e6).round() / 1e3
    };
    Ok(json!({"p50_ms": ms(0.5), "p90_ms": ms(0.9)}))
}

/// Agent `bench` and its script: `n` echo calls with a 1 KB argument (the one at
/// `pause_at` asks for approval), then an answer.
pub(crate) fn script(n: u64, pause_at: Option<u64>) -> anyhow::Result<(ScriptedLlm, Arc<Catalog>)> {
    let mut replies: Vec<ScriptedReply> = (0..n)
        .map(|i| ScriptedReply {
            text: None,
            tool_calls: vec![ScriptedCall {
                name: "echo".into(),
                arguments: json!({"text": payload(i, Some(i) == pause_at)}),
            }],
            usage: None,
            down: Vec::new(),
        })
        .collect();
    replies.push(ScriptedReply {
        text: Some("done".into()),
        tool_calls: vec![],
        usage: None,
        down: Vec::new(),
    });
    let llm = ScriptedLlm::new(HashMap::from([("bench".to_owned(), replies)]))?;
    let file: AgentsFile = serde_json::from_value(json!({"agents": {"bench": {
        "system": "Echo what you are given.",
        "tools": ["echo"],
        "approval": {"echo": {"inputMatches": "PAUSE"}},
        "maxIterations": n + 1,
        "maxToolCallsPerTurn": n + 1,
    }}}))?;
    let catalog = Arc::new(Catalog::new(Limits::default(), vec![], Some(file))?);
    Ok((llm, catalog))
}

/// Checks that a finished benchmark run lost nothing: every iteration's echo result is in
/// its timeline, and it thought once per iteration plus once to answer (the prompt, two
/// entries an iteration, the answer, the turn's usage).
pub(crate) async fn verify(store: &LocalStore, run_id: &str, n: u64) -> anyhow::Result<()> {
    let (rec, timeline) = store.load(run_id).await?.context("the run vanished")?;
    ensure!(
        rec.run.status == RunStatus::Completed,
        "run {run_id} ended {:?}",
        rec.run.status
    );
    ensure!(
        timeline.len() as u64 == 2 * n + 3,
        "run {run_id}: the timeline has {} entries, expected {}",
        timeline.len(),
        2 * n + 3
    );
    let successes = timeline
        .iter()
        .filter(|e| matches!(&e.body, EntryBody::Tool(t) if matches!(&t.result, ToolResult::Success { output } if output.as_str().is_some_and(|s| s.len() == PAYLOAD))))
        .count();
    ensure!(
        successes as u64 == n,
        "run {run_id}: {successes} of {n} echo results are right"
    );
    ensure!(
        rec.run.counters.thinks as u64 == n + 1,
        "run {run_id} thought {} times",
        rec.run.counters.thinks
    );
    Ok(())
}

struct Parts {
    store: LocalStore,
    service: Arc<Service>,
    worker: Worker,
    /// Each step's duration, as the worker records them (several a delivery when a run's
    /// steps go in a row).
    times: StepTimes,
}

/// What the steps of one opening of the store read: steps with the run's window cached
/// (warm) and without (cold), and the entries and bytes the cold ones read from disk.
#[derive(Default)]
struct Reads {
    warm: u64,
    cold: u64,
    entries: u64,
    bytes: u64,
}

impl Reads {
    fn add(&mut self, p: &Parts) {
        let (warm, cold) = p.service.steps().cache_use();
        let r = p.store.read_stats();
        self.warm += warm;
        self.cold += cold;
        self.entries += r.entries;
        self.bytes += r.bytes;
    }
}

fn open(
    dir: &std::path::Path,
    llm: &ScriptedLlm,
    catalog: &Arc<Catalog>,
    telemetry: bool,
) -> anyhow::Result<Parts> {
    let store = LocalStore::open(dir)?;
    let deps = local_deps(&store, Arc::new(llm.clone()), Arc::new(SystemClock));
    let mut service = Service::builder(deps, catalog.clone()).cache_bytes(cache_bytes());
    // As `baton dev` observes its steps: the Prometheus metrics, and traces only when an
    // OTLP endpoint is set (none: no exporter is made).
    if telemetry {
        service = service.observer(Arc::new(baton_telemetry::Metrics::prometheus()));
        if let Some(traces) = baton_telemetry::Traces::from_env("baton-bench")? {
            service = service.observer(Arc::new(traces));
        }
    }
    let service = Arc::new(service.build());
    let times = StepTimes::default();
    let opts = WorkerOptions {
        concurrency: 1,
        in_a_row: crate::steps_in_a_row(),
        step_times: Some(times.clone()),
        ..WorkerOptions::default()
    };
    let worker = Worker::new(service.clone(), store.clone(), opts);
    Ok(Parts {
        store,
        service,
        worker,
        times,
    })
}

/// Steps the run until it parks or ends; returns each step's duration.
async fn drive(p: &Parts, run_id: &str, times: &mut Vec<Duration>) -> anyhow::Result<RunStatus> {
    loop {
        if p.worker.pump_once().await? > 0 {
            times.extend(p.times.take());
            continue;
        }
        let rec = p.store.get_run(run_id).await?.context("the run vanished")?;
        let settled = rec.run.status == RunStatus::Waiting || rec.run.status.is_terminal();
        if settled && p.store.queue_depth().await? == 0 {
            return Ok(rec.run.status);
        }
        p.store.wait_for_messages(Duration::from_millis(5)).await;
    }
}

/// The cache budget `baton dev` would have here (`BATON_CACHE_MB` honoured).
pub(crate) fn cache_bytes() -> usize {
    baton_core::config::Config::from_env()
        .map(|c| c.cache_bytes(baton_dev::machine_memory_mb()))
        .unwrap_or(baton_core::service::DEFAULT_CACHE_BYTES)
}

pub(crate) fn peak_rss_mb() -> f64 {
    status_mb("VmHWM:")
}

/// A memory figure of this process in MB, by its `/proc/self/status` key (Linux; 0
/// elsewhere).
pub(crate) fn status_mb(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// What this process has written so far (Linux: `/proc/self/io`; zeros elsewhere): bytes it
/// caused to be sent to storage (`write_bytes`: the database, its WAL and checkpoints, once
/// the kernel writes them back), bytes passed to write calls (`wchar`: sockets and pipes
/// too), and write calls (`syscw`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DiskIo {
    write_bytes: u64,
    wchar: u64,
    syscw: u64,
}

impl DiskIo {
    pub(crate) fn now() -> Self {
        let Ok(text) = std::fs::read_to_string("/proc/self/io") else {
            return Self::default();
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        Self {
            write_bytes: field("write_bytes"),
            wchar: field("wchar"),
            syscw: field("syscw"),
        }
    }

    /// What was written since `self`, per step of `steps` (its syncs flushed first, so
    /// that what the kernel holds counts).
    pub(crate) fn per_step_since(&self, steps: usize) -> serde_json::Value {
        let _ = std::process::Command::new("sync").status();
        let now = Self::now();
        let per = |a: u64, b: u64| {
            ((a.saturating_sub(b)) as f64 / steps.max(1) as f64 * 10.0).round() / 10.0
        };
        json!({
            "bytes_to_storage_per_step": per(now.write_bytes, self.write_bytes),
            "bytes_to_write_calls_per_step": per(now.wchar, self.wchar),
            "write_calls_per_step": per(now.syscw, self.syscw),
        })
    }
}

/// CPU time this process has used, user and system, in seconds (Linux: `/proc/self/stat`,
/// counted in ticks of 10 ms).
pub(crate) fn cpu_s() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest = &s[s.rfind(')')? + 2..];
            let mut f = rest.split_whitespace().skip(11);
            let user: f64 = f.next()?.parse().ok()?;
            let system: f64 = f.next()?.parse().ok()?;
            Some((user + system) / 100.0)
        })
        .unwrap_or(0.0)
}

fn mean_ms(d: &[Duration]) -> f64 {
    if d.is_empty() {
        0.0
    } else {
        d.iter().map(Duration::as_secs_f64).sum::<f64>() * 1000.0 / d.len() as f64
    }
}

/// `telemetry`: observe the steps as `baton dev` does (else not at all, to compare).
pub async fn run(
    n: u64,
    variant_b: bool,
    telemetry: bool,
    data: Option<PathBuf>,
) -> anyhow::Result<String> {
    let (dir, remove) = bench_dir(data)?;
    let pause_at = if variant_b { Some(n / 2) } else { None };
    let (llm, catalog) = script(n, pause_at)?;
    let disk_sync = disk_sync_ms(&dir)?;

    let mut parts = open(&dir, &llm, &catalog, telemetry)?;
    let req = CreateRun {
        prompt: "benchmark".into(),
        agent: Some("bench".into()),
        ..CreateRun::default()
    };
    let run_id = parts
        .service
        .requests()
        .create_run(LOCAL_OWNER, req, None)
        .await?
        .run_id;
    let mut times = Vec::with_capacity(n as usize + 2);
    let (started, cpu_started, steal) = (Instant::now(), cpu_s(), Steal::start());
    let io = DiskIo::now();
    let mut synced = parts.store.write_stats();
    let mut reads = Reads::default();
    let mut status = drive(&parts, &run_id, &mut times).await?;
    // Counted by the store (one per synced commit, two per checkpoint); a reopened store
    // counts from zero.
    let mut fsyncs = 0;
    if variant_b {
        ensure!(
            status == RunStatus::Waiting,
            "variant B expected the run parked, found {status:?}"
        );
        reads.add(&parts);
        fsyncs += parts.store.write_stats().fsyncs() - synced.fsyncs();
        drop(parts); // every in-memory object goes: store handle, service, caches, worker
        parts = open(&dir, &llm, &catalog, telemetry)?;
        synced = WriteStats::default();
        parts.worker.sweep().await?;
        let (ctas, _) = parts
            .service
            .requests()
            .list_ctas(LOCAL_OWNER, Some(CtaStatus::Pending), None, None, 2)
            .await?;
        ensure!(
            ctas.len() == 1,
            "expected one pending CTA, found {}",
            ctas.len()
        );
        parts
            .service
            .requests()
            .answer_cta(
                &baton_core::service::Answerer::caller(
                    LOCAL_OWNER,
                    Vec::new(),
                    baton_core::cta::Via::Api,
                ),
                &ctas[0].cta_id,
                CtaResponse::approval(true),
            )
            .await?;
        status = drive(&parts, &run_id, &mut times).await?;
    }
    let (wall, cpu, steal) = (started.elapsed(), cpu_s() - cpu_started, steal.pct());
    reads.add(&parts);
    if status != RunStatus::Completed {
        bail!("the run ended {status:?}");
    }

    verify(&parts.store, &run_id, n).await?;
    // What the steps wrote (before the checkpoint below, which is the bench's, not theirs).
    let written = io.per_step_since(times.len());
    fsyncs += parts.store.write_stats().fsyncs() - synced.fsyncs();

    let db_bytes = parts.store.checkpoint().await?;
    let tenth = (times.len() / 10).max(1);
    let report = json!({
        "iterations": n,
        "variant": if variant_b { "B" } else { "A" },
        "telemetry": if telemetry { "dev" } else { "none" },
        "wall_s": (wall.as_secs_f64() * 1e4).round() / 1e4,
        "per_step_ms": (wall.as_secs_f64() * 1000.0 / n as f64 * 1e4).round() / 1e4,
        "steps_per_s": (times.len() as f64 / wall.as_secs_f64()).round(),
        "steps": times.len(),
        "cpu_ms_per_step": (cpu * 1000.0 / times.len().max(1) as f64 * 1000.0).round() / 1000.0,
        "cache_budget_mb": parts.service.steps().cache_budget() / (1024 * 1024),
        "cache_hit_rate": (reads.warm as f64 / (reads.warm + reads.cold).max(1) as f64 * 1000.0).round() / 1000.0,
        "entries_read_per_step": (reads.entries as f64 / times.len().max(1) as f64 * 100.0).round() / 100.0,
        "bytes_read_per_step": (reads.bytes as f64 / times.len().max(1) as f64).round(),
        "db_bytes": db_bytes,
        "peak_rss_mb": (peak_rss_mb() * 10.0).round() / 10.0,
        "bytes_per_iteration": db_bytes / n,
        "written": written,
        "fsyncs_per_step": (fsyncs as f64 / times.len().max(1) as f64 * 1000.0).round() / 1000.0,
        "first_tenth_ms": (mean_ms(&times[..tenth]) * 1e4).round() / 1e4,
        "last_tenth_ms": (mean_ms(&times[times.len() - tenth..]) * 1e4).round() / 1e4,
        "disk_sync": disk_sync,
        "cpu_steal_pct": steal,
    });
    drop(parts);
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report.to_string())
}
