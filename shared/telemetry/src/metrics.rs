//! Metrics of committed steps, dimensioned by agent and model: as CloudWatch Embedded Metric
//! Format lines in a Lambda function's log (one line per step, written before the step's
//! invocation returns), and as Prometheus counters and histograms that `baton dev` serves at
//! `GET /metrics`.
//!
//! Cardinality is bounded: agents are the deployment's own, and models past the first
//! [`MAX_MODELS`] a process sees are counted as `other` (a model string comes from the
//! provider's reply).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use baton_core::observe::{Observer, Outcome, StepReport};
use baton_core::run::RunStatus;
use metrique::emf::Emf;
use metrique::unit::Count;
use metrique::unit_of_work::metrics;
use metrique::writer::format::Format as _;
use metrique::{CloseValue as _, RootEntry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The CloudWatch namespace of Baton's metrics (the dashboard in `template.yaml` reads it).
pub const NAMESPACE: &str = "Baton";
/// Distinct model names one process reports before the rest are `other`.
pub const MAX_MODELS: usize = 32;
/// The model of a step that called none.
pub const NO_MODEL: &str = "none";

/// One step, as one EMF record: every figure is a metric, `Agent` and `Model` dimensions.
#[metrics(rename_all = "PascalCase", emf::dimension_sets = [["Agent", "Model"], ["Agent"], []])]
struct StepRecord {
    #[metrics(timestamp)]
    timestamp: std::time::SystemTime,
    agent: String,
    model: String,
    #[metrics(unit = Count)]
    steps: u64,
    step_latency: Duration,
    #[metrics(unit = Count)]
    model_calls: u64,
    model_latency: Option<Duration>,
    #[metrics(unit = Count)]
    input_tokens: u64,
    #[metrics(unit = Count)]
    output_tokens: u64,
    #[metrics(unit = Count)]
    cached_input_tokens: u64,
    #[metrics(name = "CostUSD")]
    cost_usd: f64,
    #[metrics(unit = Count)]
    tool_calls: u64,
    #[metrics(unit = Count)]
    tool_errors: u64,
    #[metrics(unit = Count)]
    ctas_opened: u64,
    #[metrics(unit = Count)]
    ctas_answered: u64,
    #[metrics(unit = Count)]
    ctas_expired: u64,
    cta_wait: Option<Duration>,
    #[metrics(unit = Count)]
    runs_completed: u64,
    #[metrics(unit = Count)]
    runs_failed: u64,
    #[metrics(unit = Count)]
    runs_cancelled: u64,
    #[metrics(unit = Count)]
    runs_expired: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentModel {
    agent: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentKind {
    agent: String,
    kind: String,
}

/// Where EMF lines go: the process's standard output (Lambda's log), or a buffer (tests).
enum Sink {
    Stdout,
    Buffer(Vec<u8>),
}

pub struct Metrics {
    registry: Registry,
    steps: Family<AgentModel, Counter>,
    step_seconds: Family<AgentModel, Histogram, fn() -> Histogram>,
    model_seconds: Family<AgentModel, Histogram, fn() -> Histogram>,
    cached_tokens: Family<AgentModel, Counter>,
    input_tokens: Family<AgentModel, Counter>,
    output_tokens: Family<AgentModel, Counter>,
    cost: Family<AgentModel, Counter<f64, std::sync::atomic::AtomicU64>>,
    tool_calls: Family<AgentKind, Counter>,
    ctas: Family<AgentKind, Counter>,
    cta_wait_seconds: Family<AgentModel, Histogram, fn() -> Histogram>,
    runs: Family<AgentKind, Counter>,
    models: Mutex<BTreeSet<String>>,
    emf: Option<Mutex<(Emf, Sink)>>,
}

fn latency_buckets() -> Histogram {
    Histogram::new([
        0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

fn wait_buckets() -> Histogram {
    // From a minute to the 30 days a question may wait.
    Histogram::new([
        60.0,
        600.0,
        3600.0,
        6.0 * 3600.0,
        86400.0,
        7.0 * 86400.0,
        30.0 * 86400.0,
    ])
}

impl Metrics {
    /// Counters for `GET /metrics` only (`baton dev`).
    pub fn prometheus() -> Self {
        Self::new(None)
    }

    /// Counters, and one EMF line per step on standard output (a Lambda function).
    pub fn emf() -> Self {
        Self::new(Some(Sink::Stdout))
    }

    /// Counters, and EMF lines kept in memory for [`Metrics::take_emf`] (tests).
    pub fn emf_in_memory() -> Self {
        Self::new(Some(Sink::Buffer(Vec::new())))
    }

    fn new(sink: Option<Sink>) -> Self {
        let mut registry = Registry::with_prefix("baton");
        let steps = Family::<AgentModel, Counter>::default();
        registry.register("steps", "Committed steps", steps.clone());
        let step_seconds = Family::new_with_constructor(latency_buckets as fn() -> Histogram);
        registry.register(
            "step_seconds",
            "Step latency, from its message to its commit",
            step_seconds.clone(),
        );
        let model_seconds = Family::new_with_constructor(latency_buckets as fn() -> Histogram);
        registry.register(
            "model_call_seconds",
            "Model call latency, retries included",
            model_seconds.clone(),
        );
        let cached_tokens = Family::<AgentModel, Counter>::default();
        registry.register(
            "cached_input_tokens",
            "Input tokens read from the prompt cache",
            cached_tokens.clone(),
        );
        let input_tokens = Family::<AgentModel, Counter>::default();
        registry.register(
            "input_tokens",
            "Input tokens of model calls",
            input_tokens.clone(),
        );
        let output_tokens = Family::<AgentModel, Counter>::default();
        registry.register(
            "output_tokens",
            "Output tokens of model calls",
            output_tokens.clone(),
        );
        let cost = Family::<AgentModel, Counter<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "cost_usd",
            "What model calls cost, in US dollars",
            cost.clone(),
        );
        let tool_calls = Family::<AgentKind, Counter>::default();
        registry.register(
            "tool_calls",
            "Tool calls settled, by outcome (kind)",
            tool_calls.clone(),
        );
        let ctas = Family::<AgentKind, Counter>::default();
        registry.register(
            "ctas",
            "Questions to people: opened, answered, expired (kind)",
            ctas.clone(),
        );
        let cta_wait_seconds = Family::new_with_constructor(wait_buckets as fn() -> Histogram);
        registry.register(
            "cta_wait_seconds",
            "How long answered or expired questions waited",
            cta_wait_seconds.clone(),
        );
        let runs = Family::<AgentKind, Counter>::default();
        registry.register("runs_ended", "Runs ended, by outcome (kind)", runs.clone());
        Self {
            registry,
            steps,
            step_seconds,
            model_seconds,
            cached_tokens,
            input_tokens,
            output_tokens,
            cost,
            tool_calls,
            ctas,
            cta_wait_seconds,
            runs,
            models: Mutex::new(BTreeSet::new()),
            emf: sink
                .map(|s| Mutex::new((Emf::builder(NAMESPACE.into(), vec![vec![]]).build(), s))),
        }
    }

    /// The counters in the Prometheus text format (OpenMetrics 1.0, which Prometheus reads).
    pub fn prometheus_text(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The content type of [`Metrics::prometheus_text`].
    pub const CONTENT_TYPE: &'static str =
        "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// The EMF lines kept so far (a sink made by [`Metrics::emf_in_memory`]), emptied.
    pub fn take_emf(&self) -> Vec<u8> {
        match &self.emf {
            Some(m) => match &mut m.lock().unwrap_or_else(|e| e.into_inner()).1 {
                Sink::Buffer(b) => std::mem::take(b),
                Sink::Stdout => Vec::new(),
            },
            None => Vec::new(),
        }
    }

    /// `model` as a label: itself while fewer than [`MAX_MODELS`] were seen, else `other`.
    fn model_label(&self, model: Option<&str>) -> String {
        let Some(model) = model else {
            return NO_MODEL.into();
        };
        let mut seen = self.models.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(model) || seen.len() < MAX_MODELS {
            seen.insert(model.to_owned());
            model.to_owned()
        } else {
            "other".into()
        }
    }

    fn write_emf(&self, record: StepRecord) {
        let Some(emf) = &self.emf else { return };
        let mut guard = emf.lock().unwrap_or_else(|e| e.into_inner());
        let (format, sink) = &mut *guard;
        let mut line = Vec::with_capacity(1024);
        if let Err(e) = format.format(&RootEntry::new(record.close()), &mut line) {
            tracing::warn!(error = %e, "a step's metrics could not be written as EMF");
            return;
        }
        match sink {
            Sink::Buffer(b) => b.extend_from_slice(&line),
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&line).and_then(|()| out.flush());
            }
        }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Observer for Metrics {
    fn step(&self, r: &StepReport) {
        let call = r.model_calls.first();
        let model = self.model_label(call.and_then(|c| c.model.as_deref()));
        let am = AgentModel {
            agent: r.agent.clone(),
            model: model.clone(),
        };
        let kind = |kind: &str| AgentKind {
            agent: r.agent.clone(),
            kind: kind.to_owned(),
        };
        let step_latency = (r.ended - r.started).to_std().unwrap_or_default();
        self.steps.get_or_create(&am).inc();
        self.step_seconds
            .get_or_create(&am)
            .observe(step_latency.as_secs_f64());
        let (mut input, mut output, mut cached, mut cost) = (0, 0, 0, 0.0);
        let mut model_latency = None;
        for c in &r.model_calls {
            input += c.usage.input_tokens;
            output += c.usage.output_tokens;
            cached += c.usage.cached_input_tokens;
            cost += c.cost_usd.unwrap_or(0.0);
            if let Some(l) = c.latency_ms {
                self.model_seconds
                    .get_or_create(&am)
                    .observe(ms(l).as_secs_f64());
                model_latency = Some(model_latency.unwrap_or_default() + ms(l));
            }
        }
        self.input_tokens.get_or_create(&am).inc_by(input);
        self.output_tokens.get_or_create(&am).inc_by(output);
        self.cached_tokens.get_or_create(&am).inc_by(cached);
        self.cost.get_or_create(&am).inc_by(cost);
        let errors = r
            .tool_calls
            .iter()
            .filter(|t| t.outcome == Outcome::Error)
            .count() as u64;
        let successes = r.tool_calls.len() as u64 - errors;
        self.tool_calls
            .get_or_create(&kind("success"))
            .inc_by(successes);
        self.tool_calls.get_or_create(&kind("error")).inc_by(errors);
        self.ctas
            .get_or_create(&kind("opened"))
            .inc_by(u64::from(r.ctas_opened));
        self.ctas
            .get_or_create(&kind("answered"))
            .inc_by(r.ctas_answered.len() as u64);
        self.ctas
            .get_or_create(&kind("expired"))
            .inc_by(r.ctas_expired.len() as u64);
        let waits: Vec<u64> = r
            .ctas_answered
            .iter()
            .chain(&r.ctas_expired)
            .copied()
            .collect();
        for w in &waits {
            self.cta_wait_seconds
                .get_or_create(&am)
                .observe(ms(*w).as_secs_f64());
        }
        let ended = |s: RunStatus| u64::from(r.ended_run && r.status == s);
        if r.ended_run {
            self.runs.get_or_create(&kind(r.status.as_str())).inc();
        }
        self.write_emf(StepRecord {
            timestamp: r.ended.into(),
            agent: r.agent.clone(),
            model,
            steps: 1,
            step_latency,
            model_calls: r.model_calls.len() as u64,
            model_latency,
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: cached,
            cost_usd: cost,
            tool_calls: r.tool_calls.len() as u64,
            tool_errors: errors,
            ctas_opened: u64::from(r.ctas_opened),
            ctas_answered: r.ctas_answered.len() as u64,
            ctas_expired: r.ctas_expired.len() as u64,
            cta_wait: (!waits.is_empty())
                .then(|| ms(waits.iter().sum::<u64>() / waits.len() as u64)),
            runs_completed: ended(RunStatus::Completed),
            runs_failed: ended(RunStatus::Failed),
            runs_cancelled: ended(RunStatus::Cancelled),
            runs_expired: ended(RunStatus::Expired),
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use baton_core::cost::{Spent, Usage};
    use baton_core::observe::{ModelCall, ToolCall};
    use baton_core::timeline::Operation;
    use chrono::{TimeZone, Utc};
    use serde_json::{Value, json};

    fn report() -> StepReport {
        let at = Utc.with_ymd_and_hms(2026, 11, 26, 12, 0, 0).unwrap();
        StepReport {
            run_id: "run_1".into(),
            agent: "orchestrator".into(),
            parent: None,
            version: 4,
            seq: 5,
            attempt: 1,
            input: "cta_answered",
            started: at,
            ended: at + chrono::Duration::milliseconds(1250),
            status: RunStatus::Completed,
            ended_run: true,
            run_created: at - chrono::Duration::hours(2),
            run_total: Spent::default(),
            error: None,
            model_calls: vec![ModelCall {
                seq: 7,
                model: Some("openai:gpt-4o-mini".into()),
                operation: Operation::Think,
                usage: Usage {
                    input_tokens: 1200,
                    output_tokens: 300,
                    total_tokens: 1500,
                    cached_input_tokens: 200,
                },
                cost_usd: Some(0.0081),
                latency_ms: Some(900),
                finish_reason: "stop",
            }],
            tool_calls: vec![
                ToolCall {
                    seq: 6,
                    call_id: "c1".into(),
                    name: "request_human_feedback".into(),
                    server: None,
                    duration_ms: None,
                    outcome: Outcome::Success,
                    child_run_id: None,
                },
                ToolCall {
                    seq: 8,
                    call_id: "c2".into(),
                    name: "clock__now".into(),
                    server: Some("clock".into()),
                    duration_ms: Some(30),
                    outcome: Outcome::Error,
                    child_run_id: None,
                },
            ],
            children: vec![],
            ctas_opened: 0,
            ctas_answered: vec![7_200_000],
            ctas_expired: vec![],
        }
    }

    /// Checks `line` against CloudWatch's EMF specification: its JSON schema (draft 7, as AWS
    /// publishes it on https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/
    /// CloudWatch_Embedded_Metric_Format_Specification.html, kept in `tests/emf-schema.json`)
    /// and the rules the schema cannot say (targets at the root, numeric metrics, string
    /// dimensions, the limits).
    fn check_emf(line: &Value) {
        let schema: Value = serde_json::from_str(include_str!("../tests/emf-schema.json")).unwrap();
        let validator = jsonschema::draft7::new(&schema).unwrap();
        let errors: Vec<String> = validator.iter_errors(line).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:?} in {line}");
        for directive in line["_aws"]["CloudWatchMetrics"].as_array().unwrap() {
            let metrics = directive["Metrics"].as_array().unwrap();
            assert!(metrics.len() <= 100);
            for m in metrics {
                let name = m["Name"].as_str().unwrap();
                let v = &line[name];
                let numeric = v.is_number()
                    || v.as_array()
                        .is_some_and(|a| a.len() <= 100 && a.iter().all(Value::is_number));
                assert!(numeric, "metric {name} is {v}");
            }
            for set in directive["Dimensions"].as_array().unwrap() {
                let set = set.as_array().unwrap();
                assert!(set.len() <= 30);
                for dim in set {
                    let v = line[dim.as_str().unwrap()].as_str().unwrap();
                    assert!(!v.is_empty() && v.chars().count() <= 1024, "{dim} = {v}");
                }
            }
        }
    }

    #[test]
    fn a_step_is_one_emf_line_that_follows_the_specification() {
        let m = Metrics::emf_in_memory();
        m.step(&report());
        let mut quiet = report();
        quiet.model_calls.clear();
        quiet.ctas_answered.clear();
        quiet.ended_run = false;
        m.step(&quiet);
        let out = String::from_utf8(m.take_emf()).unwrap();
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        for line in &lines {
            check_emf(line);
            let d = &line["_aws"]["CloudWatchMetrics"][0];
            assert_eq!(d["Namespace"], "Baton");
            assert_eq!(d["Dimensions"], json!([["Agent", "Model"], ["Agent"], []]));
        }
        let first = &lines[0];
        assert_eq!(first["Agent"], "orchestrator");
        assert_eq!(first["Model"], "openai:gpt-4o-mini");
        assert_eq!(first["Steps"].as_f64(), Some(1.0));
        assert_eq!(first["StepLatency"].as_f64(), Some(1250.0));
        assert_eq!(first["ModelLatency"].as_f64(), Some(900.0));
        assert_eq!(first["InputTokens"].as_f64(), Some(1200.0));
        assert_eq!(first["CostUSD"].as_f64(), Some(0.0081));
        assert_eq!(first["ToolErrors"].as_f64(), Some(1.0));
        assert_eq!(first["CtaWait"].as_f64(), Some(7_200_000.0));
        assert_eq!(first["RunsCompleted"].as_f64(), Some(1.0));
        assert_eq!(
            first["_aws"]["Timestamp"],
            report().ended.timestamp_millis()
        );
        // A step without a model call has the model `none`, and no latency or wait to report.
        assert_eq!(lines[1]["Model"], NO_MODEL);
        assert!(lines[1].get("ModelLatency").is_none(), "{}", lines[1]);
        assert!(lines[1].get("CtaWait").is_none(), "{}", lines[1]);
        // A record that breaks the specification is caught by the check (it can fail).
        let mut bad = lines[0].clone();
        bad["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"] = json!("USD");
        assert!(std::panic::catch_unwind(|| check_emf(&bad)).is_err());
    }

    #[test]
    fn the_dashboard_graphs_metrics_the_steps_write() {
        let m = Metrics::emf_in_memory();
        m.step(&report());
        let line: Value = serde_json::from_slice(&m.take_emf()).unwrap();
        let written: Vec<&str> = line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["Name"].as_str().unwrap())
            .collect();
        let template = include_str!("../../../template.yaml");
        let body = &template[template.find("DashboardBody").unwrap()..];
        let named =
            regex::Regex::new(r#"MetricName=\\"(\w+)\\"|\["(?:Baton|\.)", "(\w+)""#).unwrap();
        let graphed: Vec<&str> = named
            .captures_iter(body)
            .filter_map(|c| c.get(1).or(c.get(2)))
            .map(|m| m.as_str())
            .collect();
        assert!(graphed.len() >= 15, "{graphed:?}");
        for name in &graphed {
            assert!(
                written.contains(name),
                "the dashboard graphs {name}, which no step writes"
            );
        }
        assert!(body.contains("{Baton,Agent,Model}") && body.contains("{Baton,Agent}"));
    }

    #[test]
    fn models_past_the_bound_are_counted_as_other() {
        let m = Metrics::prometheus();
        for i in 0..MAX_MODELS + 3 {
            let mut r = report();
            r.model_calls[0].model = Some(format!("openai:m{i}"));
            m.step(&r);
        }
        let text = m.prometheus_text();
        assert!(text.contains("model=\"openai:m0\""), "{text}");
        assert!(text.contains("model=\"other\""), "{text}");
        assert!(
            !text.contains(&format!("model=\"openai:m{}\"", MAX_MODELS)),
            "{text}"
        );
        assert!(
            text.contains("baton_runs_ended_total{agent=\"orchestrator\",kind=\"completed\"} 35"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
