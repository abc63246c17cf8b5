//! `baton bench`: its arguments, checked, and which benchmark they ask for.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::{bench, bench_aws, config, load, load_aws, parked, refuse};

/// The durable-loop benchmark's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Echo iterations per run (at least 2).
    #[arg(long)]
    iterations: u64,
    /// A: straight through. B: park on an approval at N/2, drop all state, resume from disk.
    #[arg(long, default_value = "A", value_parser = ["A", "B", "a", "b"])]
    variant: String,
    /// Measure AWS requests, capacity units and cost per iteration on the emulator at
    /// AWS_ENDPOINT_URL instead, at histories of 10, 100, 1,000 and 10,000 entries (up to
    /// --iterations entries).
    #[arg(long)]
    aws: bool,
    /// Run this many runs at once through the local server's API, and report steps per
    /// second, step latency and API latency under that load. With --aws: over AWS APIs
    /// (the emulator at AWS_ENDPOINT_URL), through `baton dev --aws`'s API and event
    /// source mappings, with --ctas questions waiting.
    #[arg(long, conflicts_with = "variant")]
    runs: Option<usize>,
    /// Park this many runs on a question each (one `baton dev`, in this process): the
    /// memory they hold parked, an inbox page's latency among them, then every one
    /// answered in a shuffled order and checked complete, once.
    #[arg(long, conflicts_with_all = ["variant", "runs", "aws"])]
    parked: Option<usize>,
    /// With --aws --runs: this many questions waiting meanwhile (loaded in bulk), which
    /// the inbox pages through.
    #[arg(long, requires_all = ["runs", "aws"], default_value_t = 0)]
    ctas: usize,
    /// With --aws --runs: the event source mappings' pollers.
    #[arg(long, requires_all = ["runs", "aws"], default_value_t = 16)]
    pollers: usize,
    /// How the one-run benchmark observes its steps: `dev`, as `baton dev` does (its
    /// metrics; traces only with OTEL_EXPORTER_OTLP_ENDPOINT), or `none`, to compare.
    #[arg(long, default_value = "dev", value_parser = ["dev", "none"],
          conflicts_with_all = ["runs", "aws"])]
    telemetry: String,
    /// With --aws (one run): the effects the iteration's tool declares, `none` (`echo`),
    /// `idempotent` or `once`: what an iteration writes for each kind of tool.
    #[arg(long, default_value = "none", value_parser = ["none", "idempotent", "once"],
          requires = "aws", conflicts_with = "runs")]
    effects: String,
}

/// Runs the benchmark `args` ask for and prints its report (one JSON line).
pub(crate) async fn run(args: BenchArgs, data: Option<PathBuf>) -> ExitCode {
    let BenchArgs {
        iterations,
        variant,
        aws,
        runs,
        parked,
        ctas,
        pollers,
        telemetry,
        effects,
    } = args;
    if iterations < 2 {
        return refuse("--iterations must be at least 2");
    }
    if runs.is_some_and(|r| !(1..=10_000).contains(&r)) {
        return refuse("--runs must be between 1 and 10000");
    }
    if parked.is_some_and(|p| !(1..=1_000_000).contains(&p)) {
        return refuse("--parked must be between 1 and 1000000");
    }
    if ctas > 100_000 {
        return refuse("--ctas must be at most 100000");
    }
    if !(1..=256).contains(&pollers) {
        return refuse("--pollers must be between 1 and 256");
    }
    let report = if let (Some(runs), true) = (runs, aws) {
        let config = match config() {
            Ok(c) => c,
            Err(code) => return code,
        };
        let opts = load_aws::LoadAws {
            runs,
            ctas,
            iterations,
            pollers,
        };
        load_aws::run(opts, &config).await
    } else if let Some(parked) = parked {
        parked::run(parked, iterations, data).await
    } else if let Some(runs) = runs {
        load::run(runs, iterations, data).await
    } else if aws {
        let config = match config() {
            Ok(c) => c,
            Err(code) => return code,
        };
        let effects = match effects.as_str() {
            "idempotent" => baton_core::tools::Effects::Idempotent,
            "once" => baton_core::tools::Effects::Once,
            _ => baton_core::tools::Effects::None,
        };
        bench_aws::run_aws(iterations, effects, &config).await
    } else {
        bench::run(
            iterations,
            variant.eq_ignore_ascii_case("B"),
            telemetry == "dev",
            data,
        )
        .await
    };
    match report {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("baton: benchmark failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
