//! Metrics of committed steps (and of failed ones, retried), dimensioned by agent and model: as CloudWatch Embedded Metric
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

use baton_core::observe::{EffectsFailed, Observer, Outcome, StepFailure, StepReport};
use baton_core::run::RunStatus;
use metrique::emf::Emf;
use metrique::unit::Count;
use metrique::unit_of_work::metrics;
use metrique::writer::format::Format as _;
use metrique::{CloseValue, InflectableEntry, RootEntry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod labels;
use labels::*;

/// The CloudWatch namespace of Baton's metrics when none is given (`template.yaml` gives
/// each stack `Baton/<stack name>`, which its dashboard reads).
pub const NAMESPACE: &str = "Baton";
/// Distinct model names one process reports before the rest are `other`.
pub const MAX_MODELS: usize = 32;
/// The model of a step that called none.
pub const NO_MODEL: &str = "none";

/// One step, as one EMF record: every figure it counted is a metric (one it did not count,
/// a zero, is left out: CloudWatch Logs bills the line's bytes, and alarms and the dashboard
/// read a missing figure as none), `Agent` and `Model` dimensions.
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
    model_calls: Option<u64>,
    model_latency: Option<Duration>,
    #[metrics(unit = Count)]
    input_tokens: Option<u64>,
    #[metrics(unit = Count)]
    output_tokens: Option<u64>,
    #[metrics(unit = Count)]
    cached_input_tokens: Option<u64>,
    #[metrics(name = "CostUSD")]
    cost_usd: Option<f64>,
    #[metrics(unit = Count)]
    tool_calls: Option<u64>,
    #[metrics(unit = Count)]
    tool_errors: Option<u64>,
    #[metrics(unit = Count)]
    ctas_opened: Option<u64>,
    #[metrics(unit = Count)]
    ctas_answered: Option<u64>,
    #[metrics(unit = Count)]
    ctas_expired: Option<u64>,
    cta_wait: Option<Duration>,
    #[metrics(unit = Count)]
    runs_completed: Option<u64>,
    #[metrics(unit = Count)]
    runs_failed: Option<u64>,
    #[metrics(unit = Count)]
    runs_cancelled: Option<u64>,
    #[metrics(unit = Count)]
    runs_expired: Option<u64>,
    /// Runs ended because a step message was dead-lettered (the alarm's metric: a dead letter
    /// that is sent back, or finds its run moved on, ends nothing and is not counted).
    #[metrics(unit = Count)]
    runs_dead_lettered: Option<u64>,
    /// Questions asking whether a run tree past its budget may spend more.
    #[metrics(unit = Count)]
    budget_questions: Option<u64>,
    /// What approved raises added to run trees' budgets.
    #[metrics(name = "BudgetRaisedUSD")]
    budget_raised_usd: Option<f64>,
    /// Runs ended because more budget was refused or not given in time.
    #[metrics(unit = Count)]
    runs_budget_exhausted: Option<u64>,
    /// Plan reviews by outcome (seed 001: to see draft mode overused): approved by the
    /// reviewer or a person, sent back by the reviewer, rejected by a person, answered in
    /// the conversation.
    #[metrics(unit = Count)]
    plan_reviews_approved: Option<u64>,
    #[metrics(unit = Count)]
    plan_reviews_sent_back: Option<u64>,
    #[metrics(unit = Count)]
    plan_reviews_rejected: Option<u64>,
    #[metrics(unit = Count)]
    plan_reviews_in_conversation: Option<u64>,
    /// Moves of plans' state machines.
    #[metrics(unit = Count)]
    plan_phase_changes: Option<u64>,
    /// Calls refused for nesting past the depth cap (subagents, plans).
    #[metrics(unit = Count)]
    depth_refusals: Option<u64>,
}

/// A step that failed and will be tried again, as one EMF record (`Agent` dimension).
#[metrics(rename_all = "PascalCase", emf::dimension_sets = [["Agent"], []])]
struct FailureRecord {
    #[metrics(timestamp)]
    timestamp: std::time::SystemTime,
    agent: String,
    #[metrics(unit = Count)]
    step_failures: u64,
}

/// Where EMF lines go: the process's standard output (Lambda's log), or a buffer (tests).
enum Sink {
    Stdout,
    Buffer(Vec<u8>),
}

pub struct Metrics {
    registry: Registry,
    steps: Family<AgentModel, Counter>,
    step_failures: Family<Agent, Counter>,
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
    budget: Family<AgentKind, Counter>,
    budget_raised: Family<Agent, Counter<f64, std::sync::atomic::AtomicU64>>,
    plan_reviews: Family<PlanReview, Counter>,
    plan_phases: Family<PlanPhase, Counter>,
    refusals: Family<AgentKind, Counter>,
    effect_failures: Family<Kind, Counter>,
    repair_failures: Counter,
    models: Mutex<BTreeSet<String>>,
    emf: Option<Mutex<(Emf, Sink)>>,
}

impl Metrics {
    /// Counters for `GET /metrics` only (`baton dev`).
    pub fn prometheus() -> Self {
        Self::new(None)
    }

    /// Counters, and one EMF line per step on standard output (a Lambda function), in
    /// `namespace` (`BATON_METRICS_NAMESPACE`).
    pub fn emf(namespace: &str) -> Self {
        Self::new(Some((namespace, Sink::Stdout)))
    }

    /// Counters, and EMF lines in [`NAMESPACE`] kept in memory for [`Metrics::take_emf`]
    /// (tests).
    pub fn emf_in_memory() -> Self {
        Self::new(Some((NAMESPACE, Sink::Buffer(Vec::new()))))
    }

    fn new(sink: Option<(&str, Sink)>) -> Self {
        let mut registry = Registry::with_prefix("baton");
        let steps = Family::<AgentModel, Counter>::default();
        registry.register("steps", "Committed steps", steps.clone());
        let step_failures = Family::<Agent, Counter>::default();
        registry.register(
            "step_failures",
            "Steps that failed before they committed (each is tried again)",
            step_failures.clone(),
        );
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
        let budget = Family::<AgentKind, Counter>::default();
        registry.register(
            "budget",
            "Budgets: questions asked past a budget, runs ended budget_exhausted (kind)",
            budget.clone(),
        );
        let budget_raised = Family::<Agent, Counter<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "budget_raised_usd",
            "What approved raises added to run trees' budgets, in US dollars",
            budget_raised.clone(),
        );
        let plan_reviews = Family::<PlanReview, Counter>::default();
        registry.register(
            "plan_reviews",
            "Plans reviewed, by who reviewed (agent, human, conversation) and outcome",
            plan_reviews.clone(),
        );
        let plan_phases = Family::<PlanPhase, Counter>::default();
        registry.register(
            "plan_phase_changes",
            "Moves of plans' state machines (from - when a plan began, to ended when it ended)",
            plan_phases.clone(),
        );
        let refusals = Family::<AgentKind, Counter>::default();
        registry.register(
            "refusals",
            "Calls a guardrail refused, by guardrail (kind: depth)",
            refusals.clone(),
        );
        let effect_failures = Family::<Kind, Counter>::default();
        registry.register(
            "effect_failures",
            "Effects that failed after their commit, by kind (owed: performed again later)",
            effect_failures.clone(),
        );
        let repair_failures = Counter::default();
        registry.register(
            "outbox_repair_failures",
            "Outboxes a sweep could not repair (their effects still failed)",
            repair_failures.clone(),
        );
        Self {
            registry,
            steps,
            step_failures,
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
            budget,
            budget_raised,
            plan_reviews,
            plan_phases,
            refusals,
            effect_failures,
            repair_failures,
            models: Mutex::new(BTreeSet::new()),
            emf: sink.map(|(namespace, s)| {
                Mutex::new((Emf::builder(namespace.into(), vec![vec![]]).build(), s))
            }),
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

    fn write_emf<R: CloseValue>(&self, record: R)
    where
        R::Closed: InflectableEntry,
    {
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

/// A count, unless zero (left out of the line).
fn nz(n: u64) -> Option<u64> {
    (n > 0).then_some(n)
}

/// An amount, unless zero (left out of the line).
fn nzf(x: f64) -> Option<f64> {
    (x != 0.0).then_some(x)
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
        let exhausted = r.ended_run
            && r.status == RunStatus::Failed
            && r.error_code.as_deref() == Some(baton_core::budget::EXHAUSTED);
        self.budget
            .get_or_create(&kind("asked"))
            .inc_by(u64::from(r.budget_questions));
        if exhausted {
            self.budget.get_or_create(&kind("exhausted")).inc();
        }
        if r.budget_raised_usd > 0.0 {
            self.budget_raised
                .get_or_create(&Agent {
                    agent: r.agent.clone(),
                })
                .inc_by(r.budget_raised_usd);
        }
        for (by, outcome) in &r.plan_reviews {
            self.plan_reviews
                .get_or_create(&PlanReview {
                    agent: r.agent.clone(),
                    by: by.clone(),
                    outcome: outcome.clone(),
                })
                .inc();
        }
        for (from, to) in &r.plan_phases {
            self.plan_phases
                .get_or_create(&PlanPhase {
                    agent: r.agent.clone(),
                    from: from.clone(),
                    to: to.clone(),
                })
                .inc();
        }
        for guardrail in &r.refusals {
            self.refusals.get_or_create(&kind(guardrail)).inc();
        }
        let reviews = |o: &str| r.plan_reviews.iter().filter(|(_, x)| x == o).count() as u64;
        self.write_emf(StepRecord {
            timestamp: r.ended.into(),
            agent: r.agent.clone(),
            model,
            steps: 1,
            step_latency,
            model_calls: nz(r.model_calls.len() as u64),
            model_latency,
            input_tokens: nz(input),
            output_tokens: nz(output),
            cached_input_tokens: nz(cached),
            cost_usd: nzf(cost),
            tool_calls: nz(r.tool_calls.len() as u64),
            tool_errors: nz(errors),
            ctas_opened: nz(u64::from(r.ctas_opened)),
            ctas_answered: nz(r.ctas_answered.len() as u64),
            ctas_expired: nz(r.ctas_expired.len() as u64),
            cta_wait: (!waits.is_empty())
                .then(|| ms(waits.iter().sum::<u64>() / waits.len() as u64)),
            runs_completed: nz(ended(RunStatus::Completed)),
            runs_failed: nz(ended(RunStatus::Failed)),
            runs_cancelled: nz(ended(RunStatus::Cancelled)),
            runs_expired: nz(ended(RunStatus::Expired)),
            runs_dead_lettered: nz(u64::from(
                r.ended_run
                    && r.status == RunStatus::Failed
                    && r.error_code.as_deref() == Some(baton_core::service::DEAD_LETTER_CODE),
            )),
            budget_questions: nz(u64::from(r.budget_questions)),
            budget_raised_usd: nzf(r.budget_raised_usd),
            runs_budget_exhausted: nz(u64::from(exhausted)),
            plan_reviews_approved: nz(reviews("approved")),
            plan_reviews_sent_back: nz(reviews("sent_back")),
            plan_reviews_rejected: nz(reviews("rejected")),
            plan_reviews_in_conversation: nz(reviews("answered_in_conversation")),
            plan_phase_changes: nz(r.plan_phases.len() as u64),
            depth_refusals: nz(r.refusals.iter().filter(|g| *g == "depth").count() as u64),
        });
    }

    fn effects_failed(&self, f: &EffectsFailed) {
        for kind in &f.kinds {
            self.effect_failures
                .get_or_create(&Kind {
                    kind: (*kind).to_owned(),
                })
                .inc();
        }
    }

    /// (On Lambda, `baton-lambda`'s `OutboxMetrics` writes these two as EMF, in every
    /// function: these counters are `baton dev`'s `GET /metrics`.)
    fn repair_failed(&self, _run_id: &str, _error: &str) {
        self.repair_failures.inc();
    }

    fn step_failed(&self, f: &StepFailure) {
        self.step_failures
            .get_or_create(&Agent {
                agent: f.agent.clone(),
            })
            .inc();
        self.write_emf(FailureRecord {
            timestamp: f.ended.into(),
            agent: f.agent.clone(),
            step_failures: 1,
        });
    }
}

#[cfg(test)]
mod tests;
