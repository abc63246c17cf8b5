//! `baton bench --parked N --iterations I`: N runs parked on a question each, on one
//! `baton dev` started in this process. It reports the memory the parked runs hold (resident
//! memory before they were created and once all are parked), how long a page of the inbox
//! takes among them, and then answers every question in a shuffled order and checks that
//! each run completes, once, with nothing lost.

use baton_core::ports::RunReads;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use baton_core::cta::{CtaResponse, CtaStatus};
use baton_core::run::RunStatus;
use baton_core::service::{CreateRun, MAX_CTA_PAGE};
use baton_dev::LOCAL_OWNER;
use baton_dev::worker::WorkerOptions;
use serde_json::json;
use tokio::task::JoinSet;

use crate::bench::{bench_dir, peak_rss_mb, script, verify};
use crate::load::summary;

/// Requests in flight at once while creating and answering.
const AT_ONCE: usize = 64;

/// This process's resident memory now, in MB.
fn rss_mb() -> f64 {
    crate::bench::status_mb("VmRSS:")
}

pub async fn run(parked: usize, n: u64, data: Option<PathBuf>) -> anyhow::Result<String> {
    let (dir, remove) = bench_dir(data)?;
    // Each run's first iteration asks for approval: it parks there.
    let (llm, catalog) = script(n, Some(0))?;
    let worker = WorkerOptions {
        concurrency: AT_ONCE,
        ..WorkerOptions::default()
    };
    let server = crate::load::start_server(&dir, llm, catalog, worker).await?;
    let service = server.service.clone();
    let rss_before = rss_mb();
    let started = Instant::now();
    let mut ids = Vec::with_capacity(parked);
    let mut creating = JoinSet::new();
    for i in 0..parked {
        if creating.len() >= AT_ONCE
            && let Some(r) = creating.join_next().await
        {
            ids.push(r??);
        }
        let service = service.clone();
        creating.spawn(async move {
            let req = CreateRun {
                prompt: format!("parked {i}"),
                agent: Some("bench".into()),
                ..CreateRun::default()
            };
            anyhow::Ok(
                service
                    .requests()
                    .create_run(LOCAL_OWNER, req, None)
                    .await?
                    .run_id,
            )
        });
    }
    while let Some(r) = creating.join_next().await {
        ids.push(r??);
    }
    let created_s = started.elapsed().as_secs_f64();

    // Every run parked: as many questions pending as runs (the inbox paged through).
    let deadline = Instant::now() + Duration::from_secs(60 + parked as u64 / 100);
    let ctas = loop {
        let mut all = Vec::with_capacity(parked);
        let mut cursor: Option<String> = None;
        loop {
            let (page, next) = service
                .requests()
                .list_ctas(
                    LOCAL_OWNER,
                    Some(CtaStatus::Pending),
                    None,
                    cursor.as_deref(),
                    MAX_CTA_PAGE,
                )
                .await?;
            all.extend(page.into_iter().map(|c| c.cta_id));
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        if all.len() == parked {
            break all;
        }
        if Instant::now() > deadline {
            bail!("{} of {parked} runs parked in time", all.len());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let parked_s = started.elapsed().as_secs_f64();
    let rss_parked = rss_mb();
    // What the benchmark itself holds at that moment, not the server: the ids of every run
    // and question (the strings and their slots in the two lists).
    let held_mb = [&ids, &ctas]
        .iter()
        .map(|l| {
            l.capacity() * std::mem::size_of::<String>()
                + l.iter().map(String::capacity).sum::<usize>()
        })
        .sum::<usize>() as f64
        / (1024.0 * 1024.0);

    // The inbox's first page among them, as a console opens it.
    let mut page_times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let (page, _) = service
            .requests()
            .list_ctas(LOCAL_OWNER, Some(CtaStatus::Pending), None, None, 50)
            .await?;
        page_times.push(t.elapsed());
        ensure!(
            page.len() == parked.min(50),
            "an inbox page of {}",
            page.len()
        );
    }

    // Answered in a shuffled order (a stride prime to any count below it walks them all).
    let stride = 7919 % parked.max(1);
    let stride = if stride == 0 || parked.is_multiple_of(stride) {
        1
    } else {
        stride
    };
    let mut answering = JoinSet::new();
    for k in 0..parked {
        if answering.len() >= AT_ONCE
            && let Some(r) = answering.join_next().await
        {
            r??;
        }
        let cta = ctas[(k * stride) % parked].clone();
        let service = service.clone();
        answering.spawn(async move {
            let approve = CtaResponse::approval(true);
            service
                .requests()
                .answer_cta(
                    &baton_core::service::Answerer::caller(
                        LOCAL_OWNER,
                        Vec::new(),
                        baton_core::cta::Via::Api,
                    ),
                    &cta,
                    approve,
                )
                .await?;
            anyhow::Ok(())
        });
    }
    while let Some(r) = answering.join_next().await {
        r??;
    }
    // Each completes, once: one look at a time at the first not seen completed.
    let deadline = Instant::now() + Duration::from_secs(60 + parked as u64 * n / 50);
    for id in &ids {
        loop {
            let rec = server.store.get_run(id).await?.context("a run vanished")?;
            if rec.run.status == RunStatus::Completed {
                break;
            }
            ensure!(
                !rec.run.status.is_terminal(),
                "run {id} ended {:?}",
                rec.run.status
            );
            if Instant::now() > deadline {
                bail!("run {id} is still {:?}", rec.run.status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        verify(&server.store, id, n).await?;
    }
    let done_s = started.elapsed().as_secs_f64();
    let per_run_kb = (rss_parked - rss_before - held_mb).max(0.0) * 1024.0 / parked.max(1) as f64;
    let report = json!({
        "parked": parked,
        "iterations": n,
        "created_s": (created_s * 100.0).round() / 100.0,
        "parked_s": (parked_s * 100.0).round() / 100.0,
        "all_completed_s": (done_s * 100.0).round() / 100.0,
        "rss_mb_before": (rss_before * 10.0).round() / 10.0,
        "rss_mb_parked": (rss_parked * 10.0).round() / 10.0,
        "bench_held_mb": (held_mb * 10.0).round() / 10.0,
        "rss_kb_per_parked_run": (per_run_kb * 100.0).round() / 100.0,
        "peak_rss_mb": (peak_rss_mb() * 10.0).round() / 10.0,
        "inbox_first_page": summary(page_times),
        "all_completed_once": true,
    });
    server.shutdown().await;
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report.to_string())
}
