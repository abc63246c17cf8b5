//! What a committed step did, in figures, for hosts that trace and measure: its model calls,
//! its tool calls, the questions it opened and settled, whether it ended its run. Built from
//! the step's committed transition (nothing is measured twice), handed to the host's
//! [`Observer`]s after the commit. The core knows no telemetry SDK: hosts turn a report
//! into spans (OTLP) and metrics (CloudWatch EMF, Prometheus).

use chrono::{DateTime, Utc};

use crate::cost::{Spent, Usage};
use crate::cta::CtaStatus;
use crate::message::{Input, Transition};
use crate::run::{Run, RunStatus};
use crate::timeline::{EntryBody, Operation, ToolResult};

/// One model call a step made.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCall {
    /// The timeline entry of its reply.
    pub seq: u64,
    /// `provider:model-id`, when the provider said.
    pub model: Option<String>,
    pub operation: Operation,
    pub usage: Usage,
    pub cost_usd: Option<f64>,
    pub latency_ms: Option<u64>,
    /// Why the model stopped: `tool_calls` (it asked for tools) or `stop`.
    pub finish_reason: &'static str,
}

impl ModelCall {
    /// The provider part of `model` (`openai`, `anthropic`, `bedrock`, `scripted`...).
    pub fn provider(&self) -> Option<&str> {
        self.model.as_deref()?.split_once(':').map(|(p, _)| p)
    }
}

/// How a tool call a step settled came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Error,
}

/// One tool call a step settled (ran, or resolved with a person's answer or a subagent's).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub seq: u64,
    pub call_id: String,
    pub name: String,
    /// The MCP server that serves it, if one does.
    pub server: Option<String>,
    /// How long it ran, for a tool the step ran itself.
    pub duration_ms: Option<u64>,
    pub outcome: Outcome,
    /// The subagent it started or heard from.
    pub child_run_id: Option<String>,
}

/// What one committed step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    pub run_id: String,
    pub agent: String,
    /// The run that started this one, and the call of its that did.
    pub parent: Option<crate::run::ParentLink>,
    /// The version this step committed: with the run id, the step's identity.
    pub version: u64,
    /// The first timeline seq this step could write.
    pub seq: u64,
    /// Which delivery of its message this was (1 unless an earlier one failed).
    pub attempt: u32,
    /// What the step was asked: `start`, `continue`, `cta_answered`, ...
    pub input: &'static str,
    pub started: DateTime<Utc>,
    pub ended: DateTime<Utc>,
    pub status: RunStatus,
    /// The run ended with this step (from an active state to a terminal one).
    pub ended_run: bool,
    pub run_created: DateTime<Utc>,
    /// What the run and its subagents had spent after the step.
    pub run_total: Spent,
    pub error: Option<String>,
    /// The code of the run's error (`dead_letter`: ended because its message was
    /// dead-lettered).
    pub error_code: Option<String>,
    pub model_calls: Vec<ModelCall>,
    pub tool_calls: Vec<ToolCall>,
    /// Subagents the step started.
    pub children: Vec<String>,
    pub ctas_opened: u32,
    /// How long each CTA answered in this step waited, in ms.
    pub ctas_answered: Vec<u64>,
    /// How long each CTA that expired in this step waited, in ms.
    pub ctas_expired: Vec<u64>,
    /// Budget questions the step raised (its tree had spent its budget).
    pub budget_questions: u32,
    /// What a raise approved in this step added to its tree's budget, in US dollars.
    pub budget_raised_usd: f64,
    /// The moves of its plans' state machines (`plan.phase`): `(from, to)`, `-` when a
    /// plan began; `done` or `failed` when it ended.
    pub plan_phases: Vec<(String, String)>,
    /// The reviews its plans had (`plan.reviewed`): `(by, outcome)`, by `agent`, `human` or
    /// `conversation`; outcome `approved`, `sent_back`, `rejected` or
    /// `answered_in_conversation`.
    pub plan_reviews: Vec<(String, String)>,
    /// The guardrails that refused a call of the step (`run.refused`): `depth`.
    pub refusals: Vec<String>,
}

/// A step that failed before it committed (a model or a store that did not answer): nothing
/// of it was kept, and its message is delivered again, or dead-lettered once its retries are
/// spent (that step, which fails the run, is reported as a committed one).
#[derive(Debug, Clone, PartialEq)]
pub struct StepFailure {
    pub run_id: String,
    pub agent: String,
    pub parent: Option<crate::run::ParentLink>,
    /// The version the step found (it would have committed the next).
    pub version: u64,
    /// Which delivery of its message this was.
    pub attempt: u32,
    pub input: &'static str,
    pub started: DateTime<Utc>,
    pub ended: DateTime<Utc>,
    pub error: String,
}

/// Effects of a commit that failed after it: owed, performed again by the run's next step or
/// by the sweep.
#[derive(Debug, Clone)]
pub struct EffectsFailed {
    pub run_id: String,
    pub agent: String,
    /// Each owed effect's kind (`send`, `publish`, `schedule`, `timer`, ...).
    pub kinds: Vec<&'static str>,
    pub error: String,
    pub at: DateTime<Utc>,
}

/// A host's use of step reports (tracing, metrics). Called after the commit (or the
/// failure), on the step's task: it must not block (record, and send later).
pub trait Observer: Send + Sync {
    fn step(&self, report: &StepReport);

    /// A step that failed and will be tried again. By default, nothing.
    fn step_failed(&self, _failure: &StepFailure) {}

    /// Effects of a commit that failed after it (owed). By default, nothing.
    fn effects_failed(&self, _failed: &EffectsFailed) {}

    /// A sweep tick that could not repair `run_id`'s outbox (its effects still fail: only
    /// the next tick tries again). By default, nothing.
    fn repair_failed(&self, _run_id: &str, _error: &str) {}
}

impl StepReport {
    /// The report of a step of `before` that committed `t`.
    pub fn new(
        catalog: &crate::agent::Catalog,
        before: &Run,
        input: &Input,
        t: &Transition,
        started: DateTime<Utc>,
        ended: DateTime<Utc>,
    ) -> Self {
        let run = &t.run;
        let mut r = StepReport {
            run_id: run.run_id.clone(),
            agent: run.agent.clone(),
            parent: run.origin.parent.clone(),
            version: run.version,
            seq: before.next_seq,
            attempt: before
                .outcome
                .last_error
                .as_ref()
                .map_or(1, |e| e.attempts + 1),
            input: input_name(input),
            started,
            ended,
            status: run.status,
            ended_run: run.status.is_terminal() && !before.status.is_terminal(),
            run_created: run.created_at,
            run_total: run.total(),
            error: run.outcome.error.as_ref().map(|e| e.message.clone()),
            error_code: run.outcome.error.as_ref().map(|e| e.code.clone()),
            model_calls: Vec::new(),
            tool_calls: Vec::new(),
            children: t.new_runs.iter().map(|(r, _)| r.run_id.clone()).collect(),
            ctas_opened: t.new_ctas.len() as u32,
            ctas_answered: Vec::new(),
            ctas_expired: Vec::new(),
            budget_questions: t.new_ctas.iter().filter(|c| c.budget.is_some()).count() as u32,
            budget_raised_usd: t.budget_raise.as_ref().map_or(0.0, |r| r.by_usd),
            plan_phases: Vec::new(),
            plan_reviews: Vec::new(),
            refusals: Vec::new(),
        };
        for e in &t.effects {
            let crate::message::Effect::Publish(ev) = e else {
                continue;
            };
            let field = |k: &str| ev.detail[k].as_str().unwrap_or("-").to_owned();
            match ev.detail_type.as_str() {
                crate::plan::PHASE_EVENT => r.plan_phases.push((field("from"), field("to"))),
                "plan.reviewed" => {
                    let by = field("by");
                    let approved = ev.detail["approved"].as_bool();
                    let outcome = match (by.as_str(), approved) {
                        (_, Some(true)) => "approved",
                        ("agent", _) => "sent_back",
                        ("human", _) => "rejected",
                        _ => "answered_in_conversation",
                    };
                    r.plan_reviews.push((by, outcome.to_owned()));
                }
                "run.refused" => r.refusals.push(field("guardrail")),
                _ => {}
            }
        }
        for e in t.appended.iter().chain(&t.updated) {
            match &e.body {
                EntryBody::Assistant {
                    model,
                    usage,
                    cost_usd,
                    operation,
                    latency_ms,
                    ..
                } => {
                    let asked = t
                        .appended
                        .iter()
                        .any(|c| c.tool().is_some_and(|c| c.reply_seq == e.seq));
                    r.model_calls.push(ModelCall {
                        seq: e.seq,
                        model: model.clone(),
                        operation: *operation,
                        usage: *usage,
                        cost_usd: *cost_usd,
                        latency_ms: *latency_ms,
                        finish_reason: if asked { "tool_calls" } else { "stop" },
                    })
                }
                EntryBody::Tool(tool) => {
                    let waited = (ended - e.at).num_milliseconds().max(0) as u64;
                    match tool.cta.as_ref().map(|c| c.status) {
                        Some(CtaStatus::Answered) if !tool.result.is_pending() => {
                            r.ctas_answered.push(waited)
                        }
                        Some(CtaStatus::Expired) => r.ctas_expired.push(waited),
                        _ => {}
                    }
                    // A budget question is no tool call.
                    if tool.name == crate::budget::ENTRY {
                        continue;
                    }
                    let outcome = match &tool.result {
                        ToolResult::Pending { .. } => continue,
                        ToolResult::Success { .. } => Outcome::Success,
                        ToolResult::Error { .. } => Outcome::Error,
                    };
                    r.tool_calls.push(ToolCall {
                        seq: e.seq,
                        call_id: tool.id.clone(),
                        name: tool.name.clone(),
                        server: catalog.mcp_server_of(&tool.name).map(str::to_owned),
                        duration_ms: tool.duration_ms,
                        outcome,
                        child_run_id: tool.child_run_id.clone(),
                    });
                }
                _ => {}
            }
        }
        r
    }
}

pub(crate) fn input_name(input: &Input) -> &'static str {
    match input {
        Input::Start => "start",
        Input::Continue { .. } => "continue",
        Input::UserMessage { .. } => "user_message",
        Input::CtaAnswered { .. } => "cta_answered",
        Input::CtaExpired { .. } => "cta_expired",
        Input::ChildFinished { .. } => "child_finished",
        Input::ChildWaiting { .. } => "child_waiting",
        Input::ChildResumed { .. } => "child_resumed",
        Input::BudgetSpent { .. } => "budget_spent",
        Input::BudgetRaised => "budget_raised",
        Input::Cancel { .. } => "cancel",
        Input::Timer { .. } => "timer",
        Input::Fail { .. } => "fail",
    }
}
