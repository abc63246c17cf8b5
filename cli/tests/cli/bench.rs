//! `baton bench`: its one JSON line of figures for each variant, many runs through the API,
//! and parked runs answered in any order.

use super::*;

use std::process::Command;

use serde_json::Value;

#[test]
fn the_benchmark_prints_one_json_line_for_both_variants() {
    for variant in ["A", "B"] {
        let v = bench_report(&["--iterations", "40", "--variant", variant]);
        for key in [
            "iterations",
            "variant",
            "wall_s",
            "per_step_ms",
            "steps_per_s",
            "db_bytes",
            "peak_rss_mb",
            "written",
            "fsyncs_per_step",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        assert_eq!(v["iterations"], 40);
        assert_eq!(v["variant"], variant);
        assert!(v["db_bytes"].as_u64().unwrap() > 40 * 500, "{v}");
        // A lone run's step commits alone: one synced commit each (the store's checkpoints
        // add a little), no step left unsynced.
        let fsyncs = v["fsyncs_per_step"].as_f64().unwrap();
        assert!((1.0..1.5).contains(&fsyncs), "{v}");
        assert_machine_figures(&v);
    }
    // Observed as `baton dev` observes (the default), or not at all, to compare; with no
    // OTLP endpoint set, no exporter is made either way.
    for telemetry in ["dev", "none"] {
        let v = bench_report(&["--iterations", "20", "--telemetry", telemetry]);
        assert_eq!(v["telemetry"], telemetry);
        assert_eq!(v["steps"], 21, "{v}");
    }
    for bad in [
        &["bench", "--iterations", "0"][..],
        &["bench", "--iterations", "2", "--parked", "0"],
        &["bench", "--iterations", "2", "--parked", "5", "--runs", "5"],
        &["bench", "--iterations", "20", "--telemetry", "otlp"],
        &[
            "bench",
            "--iterations",
            "20",
            "--runs",
            "2",
            "--telemetry",
            "none",
        ],
    ] {
        let out = Command::new(BIN).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

/// Runs `baton bench` with `args`; it must succeed and print one JSON line, returned.
fn bench_report(args: &[&str]) -> Value {
    let out = Command::new(BIN).arg("bench").args(args).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert_eq!(text.trim().lines().count(), 1, "{text}");
    serde_json::from_str(text.trim()).unwrap()
}

/// What the machine gave the benchmark: the disk's own sync time (a median and a 90th
/// percentile) and the share of CPU time the hypervisor gave to other guests.
fn assert_machine_figures(v: &Value) {
    let steal = v["cpu_steal_pct"].as_f64();
    assert!(
        matches!(steal, Some(p) if (0.0..=100.0).contains(&p)),
        "cpu_steal_pct in {v}"
    );
    let (p50, p90) = (
        v["disk_sync"]["p50_ms"].as_f64(),
        v["disk_sync"]["p90_ms"].as_f64(),
    );
    assert!(
        // (On a tmpfs a sync may round to 0.)
        matches!((p50, p90), (Some(a), Some(b)) if a >= 0.0 && a <= b),
        "disk_sync in {v}"
    );
}

/// Parked runs: each parks on its question, holds little while it waits, and completes
/// once when answered (the benchmark checks every run, and fails otherwise).
#[test]
fn two_hundred_parked_runs_are_answered_in_any_order_and_complete_once() {
    let v = bench_report(&["--parked", "200", "--iterations", "2"]);
    assert_eq!(v["all_completed_once"], true, "{v}");
    assert_eq!(v["parked"], 200);
    assert_eq!(v["inbox_first_page"]["count"], 20, "{v}");
    assert!(v["rss_mb_parked"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn a_thousand_runs_at_once_all_complete_through_the_api() {
    let v = bench_report(&["--runs", "1000", "--iterations", "3"]);
    // The benchmark itself reads every run back and fails unless each completed with its
    // three echo results in its timeline.
    assert_eq!(v["all_completed"], true, "{v}");
    assert_eq!(v["runs"], 1000);
    // Each run's three echo steps and its answer were all stepped (the step timings count
    // only what had finished when the last run was seen complete: a run's final step may
    // still be acknowledging its message then).
    let stepped = v["steps_with_cached_timeline"].as_u64().unwrap()
        + v["steps_loading_timeline"].as_u64().unwrap();
    assert!(stepped >= 4000, "{v}");
    assert!(v["steps"].as_u64().unwrap() >= 3000, "{v}");
    assert_eq!(v["api_creates"]["count"], 1000, "{v}");
    assert!(v["steps_per_s"].as_f64().unwrap() > 0.0, "{v}");
    // Many runs' commits shared each fsync.
    assert!(v["steps_per_synced_commit"].as_f64().unwrap() > 1.0, "{v}");
    assert!(v["fsyncs_per_step"].as_f64().unwrap() < 1.0, "{v}");
    assert_machine_figures(&v);
}
