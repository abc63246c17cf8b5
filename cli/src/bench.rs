//! The durable-loop benchmark.
//!
//! A scripted run of agent `bench` makes N iterations, each one `echo` call with a 1 KB
//! argument, then answers. Every iteration goes through the real path: the queue hands out
//! the step, the service re-hydrates, the engine thinks and dispatches, the commit is synced
//! to disk, the next step is enqueued. Variant B parks on an approval CTA at iteration N/2,
//! drops every in-memory object (store, service, worker, caches), reopens the store from
//! disk, answers the CTA and resumes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use baton::adapters::local::LocalStore;
use baton::agent::{AgentsFile, Catalog, Limits};
use baton::cta::{CtaResponse, CtaStatus};
use baton::llm::scripted::{ScriptedCall, ScriptedLlm, ScriptedReply};
use baton::local::{LOCAL_OWNER, local_service};
use baton::ports::{Store, SystemClock};
use baton::run::RunStatus;
use baton::service::{CreateRun, Service};
use baton::timeline::{EntryBody, ToolResult};
use baton::worker::{Worker, WorkerOptions};
use serde_json::json;

const PAYLOAD: usize = 1024;

/// A 1 KB argument that differs per iteration (and does not compress to nothing).
fn payload(i: u64, pause: bool) -> String {
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

struct Parts {
    store: LocalStore,
    service: Arc<Service>,
    worker: Worker,
}

fn open(dir: &std::path::Path, llm: &ScriptedLlm, catalog: &Arc<Catalog>) -> anyhow::Result<Parts> {
    let store = LocalStore::open(dir)?;
    let service = local_service(
        &store,
        Arc::new(llm.clone()),
        catalog.clone(),
        Arc::new(SystemClock),
    );
    let opts = WorkerOptions {
        concurrency: 1,
        ..WorkerOptions::default()
    };
    let worker = Worker::new(service.clone(), store.clone(), opts);
    Ok(Parts {
        store,
        service,
        worker,
    })
}

/// Steps the run until it parks or ends; returns each step's duration.
async fn drive(p: &Parts, run_id: &str, times: &mut Vec<Duration>) -> anyhow::Result<RunStatus> {
    loop {
        let t = Instant::now();
        if p.worker.pump_once().await? > 0 {
            times.push(t.elapsed());
            continue;
        }
        let rec = p.store.get_run(run_id).await?.context("the run vanished")?;
        let settled = rec.run.status == RunStatus::Waiting || rec.run.status.is_terminal();
        if settled && p.store.queue_depth()? == 0 {
            return Ok(rec.run.status);
        }
        p.store.wait_for_messages(Duration::from_millis(5)).await;
    }
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn mean_ms(d: &[Duration]) -> f64 {
    if d.is_empty() {
        0.0
    } else {
        d.iter().map(Duration::as_secs_f64).sum::<f64>() * 1000.0 / d.len() as f64
    }
}

pub async fn run(n: u64, variant_b: bool, data: Option<PathBuf>) -> anyhow::Result<String> {
    let (dir, remove) = match data {
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
    };
    let pause_at = if variant_b { Some(n / 2) } else { None };
    let mut replies: Vec<ScriptedReply> = (0..n)
        .map(|i| ScriptedReply {
            text: None,
            tool_calls: vec![ScriptedCall {
                name: "echo".into(),
                arguments: json!({"text": payload(i, Some(i) == pause_at)}),
            }],
            usage: None,
        })
        .collect();
    replies.push(ScriptedReply {
        text: Some("done".into()),
        tool_calls: vec![],
        usage: None,
    });
    let llm = ScriptedLlm::new(HashMap::from([("bench".to_owned(), replies)]))?;
    let file: AgentsFile = serde_json::from_value(json!({"agents": {"bench": {
        "system": "Echo what you are given.",
        "tools": ["echo"],
        "approval": {"echo": {"inputMatches": "PAUSE"}},
        "maxIterations": n + 1,
    }}}))?;
    let catalog = Arc::new(Catalog::new(Limits::default(), vec![], Some(file))?);

    let mut parts = open(&dir, &llm, &catalog)?;
    let req = CreateRun {
        prompt: "benchmark".into(),
        agent: Some("bench".into()),
        ..CreateRun::default()
    };
    let run_id = parts
        .service
        .create_run(LOCAL_OWNER, req, None)
        .await?
        .run_id;
    let mut times = Vec::with_capacity(n as usize + 2);
    let started = Instant::now();
    let mut status = drive(&parts, &run_id, &mut times).await?;
    if variant_b {
        ensure!(
            status == RunStatus::Waiting,
            "variant B expected the run parked, found {status:?}"
        );
        drop(parts); // every in-memory object goes: store handle, service, caches, worker
        parts = open(&dir, &llm, &catalog)?;
        parts.worker.sweep().await?;
        let ctas = parts
            .service
            .list_ctas(LOCAL_OWNER, Some(CtaStatus::Pending))
            .await?;
        ensure!(
            ctas.len() == 1,
            "expected one pending CTA, found {}",
            ctas.len()
        );
        parts
            .service
            .answer_cta(
                Some(LOCAL_OWNER),
                &ctas[0].cta_id,
                CtaResponse::Approval {
                    approved: true,
                    reason: None,
                },
            )
            .await?;
        status = drive(&parts, &run_id, &mut times).await?;
    }
    let wall = started.elapsed();
    if status != RunStatus::Completed {
        bail!("the run ended {status:?}");
    }

    let (rec, timeline) = parts.store.load(&run_id).await?.context("run")?;
    ensure!(
        timeline.len() as u64 == 2 * n + 2,
        "timeline has {} entries, expected {}",
        timeline.len(),
        2 * n + 2
    );
    let successes = timeline
        .iter()
        .filter(|e| matches!(&e.body, EntryBody::Tool(t) if matches!(&t.result, ToolResult::Success { output } if output.as_str().is_some_and(|s| s.len() == PAYLOAD))))
        .count();
    ensure!(
        successes as u64 == n,
        "{successes} of {n} echo results are right"
    );
    ensure!(
        rec.run.thinks as u64 == n + 1,
        "the run thought {} times",
        rec.run.thinks
    );

    let db_bytes = parts.store.checkpoint()?;
    let tenth = (times.len() / 10).max(1);
    let report = json!({
        "iterations": n,
        "variant": if variant_b { "B" } else { "A" },
        "wall_s": (wall.as_secs_f64() * 1e4).round() / 1e4,
        "per_step_ms": (wall.as_secs_f64() * 1000.0 / n as f64 * 1e4).round() / 1e4,
        "db_bytes": db_bytes,
        "peak_rss_mb": (peak_rss_mb() * 10.0).round() / 10.0,
        "bytes_per_iteration": db_bytes / n,
        "first_tenth_ms": (mean_ms(&times[..tenth]) * 1e4).round() / 1e4,
        "last_tenth_ms": (mean_ms(&times[times.len() - tenth..]) * 1e4).round() / 1e4,
    });
    drop(parts);
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report.to_string())
}
