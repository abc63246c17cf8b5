//! Traces of runs over OTLP/HTTP, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; nothing is built, recorded or sent when it
//! is not.
//!
//! A run's steps happen in different processes (Lambda invocations, or the dev worker), so
//! the ids are derived, not drawn: the trace id from the run id, a step's span id from the
//! run id and the version it committed, a model call's and a tool call's from their timeline
//! entry. Every span of a run lands in one trace; a subagent's spans link to the parent
//! run's trace. The run's own span (`invoke_agent`) is sent once, by the step that ends the
//! run; steps name it as their parent meanwhile (backends show them under it once it comes).
//!
//! Spans are built after the step committed, from its report, and kept until
//! [`Traces::flush`]: on Lambda at the end of every invocation (the process may be frozen
//! as soon as the handler returns: in-process, with a short budget, rather than through
//! the ADOT collector layer, which would still need this flush, to localhost, and bills
//! its own run time and cold start), on `baton dev` every few seconds and at shutdown.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use baton_core::observe::{Observer, Outcome, StepFailure, StepReport};
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use sha2::{Digest, Sha256};

/// Spans kept while the collector does not answer; more are dropped (telemetry never holds
/// a step back, nor grows without bound).
const MAX_PENDING: usize = 8192;
/// Spans per export request.
const MAX_BATCH: usize = 512;

pub struct Traces {
    exporter: tokio::sync::Mutex<opentelemetry_otlp::SpanExporter>,
    pending: Mutex<Vec<SpanData>>,
    scope: InstrumentationScope,
}

/// Why the exporter could not be built (a malformed endpoint): a start-up error.
#[derive(Debug, thiserror::Error)]
#[error("OTLP exporter: {0}")]
pub struct TracesError(String);

/// Whether an OTLP endpoint for traces is named (`var` reads the environment): without one,
/// no exporter is made and nothing is sent anywhere.
fn configured(var: impl Fn(&str) -> Option<String>) -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|k| var(k).is_some_and(|v| !v.trim().is_empty()))
}

impl Traces {
    /// The exporter the environment asks for (`OTEL_EXPORTER_OTLP_ENDPOINT`, with
    /// `/v1/traces` added, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is; `OTEL_SERVICE_NAME`,
    /// else `service`), or `None` when no endpoint is set.
    pub fn from_env(service: &'static str) -> Result<Option<Self>, TracesError> {
        if !configured(|k| std::env::var(k).ok()) {
            return Ok(None);
        }
        Self::build(None, service).map(Some)
    }

    /// The exporter to the OTLP/HTTP collector at `base` (`/v1/traces` added), whatever the
    /// environment says (tests).
    pub fn to(base: &str, service: &'static str) -> Result<Self, TracesError> {
        Self::build(
            Some(format!("{}/v1/traces", base.trim_end_matches('/'))),
            service,
        )
    }

    fn build(endpoint: Option<String>, service: &'static str) -> Result<Self, TracesError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| TracesError(e.to_string()))?;
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(http);
        if let Some(url) = endpoint {
            builder = builder.with_endpoint(url);
        }
        let mut exporter = builder.build().map_err(|e| TracesError(e.to_string()))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none_or(|v| v.is_empty()) {
            resource = resource.with_service_name(service);
        }
        exporter.set_resource(&resource.with_attributes(lambda_resource()).build());
        Ok(Self {
            exporter: tokio::sync::Mutex::new(exporter),
            pending: Mutex::new(Vec::new()),
            scope: InstrumentationScope::builder("baton")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        })
    }

    fn record(&self, span: SpanData) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.len() < MAX_PENDING {
            pending.push(span);
        }
    }

    /// Sends what was recorded, within `budget`. What cannot be sent is dropped, with a
    /// warning: a trace is worth less than a step.
    pub async fn flush(&self, budget: Duration) {
        let spans = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if spans.is_empty() {
            return;
        }
        let exporter = self.exporter.lock().await;
        let send = async {
            let mut spans = spans;
            while !spans.is_empty() {
                let rest = spans.split_off(spans.len().min(MAX_BATCH));
                let batch = std::mem::replace(&mut spans, rest);
                exporter.export(batch).await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        };
        match tokio::time::timeout(budget, send).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "spans not exported"),
            Err(_) => tracing::warn!(?budget, "spans not exported in time"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn span(
        &self,
        trace: TraceId,
        id: SpanId,
        parent: SpanId,
        remote_parent: bool,
        name: String,
        kind: SpanKind,
        (start, end): (SystemTime, SystemTime),
        attributes: Vec<KeyValue>,
        links: Vec<Link>,
        status: Status,
    ) {
        let mut span_links = SpanLinks::default();
        span_links.links = links;
        self.record(SpanData {
            span_context: SpanContext::new(trace, id, TraceFlags::SAMPLED, false, TraceState::NONE),
            parent_span_id: parent,
            parent_span_is_remote: remote_parent,
            span_kind: kind,
            name: name.into(),
            start_time: start,
            end_time: end,
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: span_links,
            status,
            instrumentation_scope: self.scope.clone(),
        });
    }
}

fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    h.finalize().into()
}

/// A run's trace id: the same in every process that steps it.
pub fn trace_id(run_id: &str) -> TraceId {
    let d = hash(&[b"baton.trace", run_id.as_bytes()]);
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    if b == [0; 16] {
        b[15] = 1;
    }
    TraceId::from_bytes(b)
}

fn span_id(parts: &[&[u8]]) -> SpanId {
    let d = hash(parts);
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    if b == [0; 8] {
        b[7] = 1;
    }
    SpanId::from_bytes(b)
}

/// The span of the whole run (`invoke_agent`).
pub fn run_span_id(run_id: &str) -> SpanId {
    span_id(&[b"baton.run", run_id.as_bytes()])
}

/// The span of the step that committed `version`.
pub fn step_span_id(run_id: &str, version: u64) -> SpanId {
    span_id(&[b"baton.step", run_id.as_bytes(), &version.to_be_bytes()])
}

/// The span of a failed step: one per delivery (a message sent back to its queue counts
/// its deliveries again, so the time it started tells two first ones apart).
fn failed_step_span_id(f: &StepFailure) -> SpanId {
    let started = f.started.timestamp_nanos_opt().unwrap_or_default();
    span_id(&[
        b"baton.failed_step",
        f.run_id.as_bytes(),
        &f.version.to_be_bytes(),
        &f.attempt.to_be_bytes(),
        &started.to_be_bytes(),
    ])
}

/// The span of the model call or tool call whose entry is `seq`.
fn entry_span_id(run_id: &str, seq: u64) -> SpanId {
    span_id(&[b"baton.entry", run_id.as_bytes(), &seq.to_be_bytes()])
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn time(t: chrono::DateTime<chrono::Utc>) -> SystemTime {
    t.into()
}

/// The run's link to the trace of the run that started it, if one did.
fn parent_link(parent: Option<&baton_core::run::ParentLink>) -> Vec<Link> {
    let Some(p) = parent else {
        return Vec::new();
    };
    vec![Link::new(
        SpanContext::new(
            trace_id(&p.run_id),
            run_span_id(&p.run_id),
            TraceFlags::SAMPLED,
            true,
            TraceState::NONE,
        ),
        vec![
            KeyValue::new("baton.link", "parent_run"),
            KeyValue::new("baton.parent.tool_call_id", p.tool_call_id.clone()),
        ],
        0,
    )]
}

impl Observer for Traces {
    fn step(&self, r: &StepReport) {
        let trace = trace_id(&r.run_id);
        let run_span = run_span_id(&r.run_id);
        let step = step_span_id(&r.run_id, r.version);
        let (start, end) = (time(r.started), time(r.ended));
        let status = match (&r.error, r.ended_run) {
            (Some(e), true) => Status::error(e.clone()),
            _ => Status::Unset,
        };
        let mut step_attributes = vec![
            KeyValue::new("baton.run.id", r.run_id.clone()),
            KeyValue::new("baton.step.seq", int(r.seq)),
            KeyValue::new("baton.step.version", int(r.version)),
            KeyValue::new("baton.step.attempt", i64::from(r.attempt)),
            KeyValue::new("baton.step.input", r.input),
            KeyValue::new("baton.run.status", r.status.as_str()),
            KeyValue::new("gen_ai.agent.name", r.agent.clone()),
            KeyValue::new("gen_ai.conversation.id", r.run_id.clone()),
        ];
        // What the step's plans did: each move of their state machines, each review.
        let joined = |pairs: &[(String, String)], sep: &str| {
            pairs
                .iter()
                .map(|(a, b)| format!("{a}{sep}{b}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        if !r.plan_phases.is_empty() {
            step_attributes.push(KeyValue::new(
                "baton.plan.phases",
                joined(&r.plan_phases, "->"),
            ));
        }
        if !r.plan_reviews.is_empty() {
            step_attributes.push(KeyValue::new(
                "baton.plan.reviews",
                joined(&r.plan_reviews, ":"),
            ));
        }
        if !r.refusals.is_empty() {
            step_attributes.push(KeyValue::new("baton.refusals", r.refusals.join(",")));
        }
        self.span(
            trace,
            step,
            run_span,
            true,
            format!("step {}", r.agent),
            SpanKind::Internal,
            (start, end),
            step_attributes,
            parent_link(r.parent.as_ref()),
            status.clone(),
        );
        for c in &r.model_calls {
            let requested = c.model.clone().unwrap_or_else(|| "unknown".into());
            // The model is called early in its step: from the step's start, for its latency.
            let latency = Duration::from_millis(c.latency_ms.unwrap_or(0));
            let call_end = end.min(start + latency).max(start);
            let mut attributes = vec![
                KeyValue::new("gen_ai.operation.name", "chat"),
                KeyValue::new("gen_ai.request.model", requested.clone()),
                KeyValue::new("gen_ai.response.model", requested.clone()),
                KeyValue::new("gen_ai.usage.input_tokens", int(c.usage.input_tokens)),
                KeyValue::new("gen_ai.usage.output_tokens", int(c.usage.output_tokens)),
                KeyValue::new(
                    "gen_ai.usage.cache_read.input_tokens",
                    int(c.usage.cached_input_tokens),
                ),
                KeyValue::new(
                    "gen_ai.response.finish_reasons",
                    Value::Array(Array::String(vec![StringValue::from(c.finish_reason)])),
                ),
                KeyValue::new(
                    "baton.operation",
                    format!("{:?}", c.operation).to_lowercase(),
                ),
            ];
            if let Some(p) = c.provider() {
                attributes.push(KeyValue::new(
                    "gen_ai.provider.name",
                    provider_name(p).to_owned(),
                ));
            }
            if let Some(cost) = c.cost_usd {
                attributes.push(KeyValue::new("baton.cost.usd", cost));
            }
            self.span(
                trace,
                entry_span_id(&r.run_id, c.seq),
                step,
                false,
                format!("chat {requested}"),
                SpanKind::Client,
                (start, call_end),
                attributes,
                Vec::new(),
                Status::Unset,
            );
        }
        for t in &r.tool_calls {
            let ran = Duration::from_millis(t.duration_ms.unwrap_or(0));
            let mut attributes = vec![
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", t.name.clone()),
                KeyValue::new("gen_ai.tool.call.id", t.call_id.clone()),
                KeyValue::new(
                    "gen_ai.tool.type",
                    if t.server.is_some() {
                        "extension"
                    } else {
                        "function"
                    },
                ),
                KeyValue::new(
                    "baton.tool.outcome",
                    if t.outcome == Outcome::Success {
                        "success"
                    } else {
                        "error"
                    },
                ),
            ];
            if let Some(ms) = t.duration_ms {
                attributes.push(KeyValue::new("baton.tool.duration_ms", int(ms)));
            }
            if let Some(s) = &t.server {
                attributes.push(KeyValue::new("baton.mcp.server", s.clone()));
            }
            let mut links = Vec::new();
            if let Some(child) = &t.child_run_id {
                attributes.push(KeyValue::new("baton.child_run.id", child.clone()));
                links.push(Link::new(
                    SpanContext::new(
                        trace_id(child),
                        run_span_id(child),
                        TraceFlags::SAMPLED,
                        true,
                        TraceState::NONE,
                    ),
                    vec![KeyValue::new("baton.link", "child_run")],
                    0,
                ));
            }
            let status = match t.outcome {
                Outcome::Success => Status::Unset,
                Outcome::Error => Status::error("the tool call failed"),
            };
            // A tool runs late in its step: up to the step's end, for its duration.
            let tool_end = end.max(start);
            let tool_start = tool_end
                .checked_sub(ran)
                .filter(|s| *s >= start)
                .unwrap_or(start);
            self.span(
                trace,
                entry_span_id(&r.run_id, t.seq),
                step,
                false,
                format!("execute_tool {}", t.name),
                SpanKind::Internal,
                (tool_start, tool_end),
                attributes,
                links,
                status,
            );
        }
        if r.ended_run {
            self.span(
                trace,
                run_span,
                SpanId::INVALID,
                false,
                format!("invoke_agent {}", r.agent),
                SpanKind::Internal,
                (time(r.run_created), end),
                vec![
                    KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                    KeyValue::new("gen_ai.agent.name", r.agent.clone()),
                    KeyValue::new("gen_ai.conversation.id", r.run_id.clone()),
                    KeyValue::new("baton.run.id", r.run_id.clone()),
                    KeyValue::new("baton.run.status", r.status.as_str()),
                    KeyValue::new(
                        "gen_ai.usage.input_tokens",
                        int(r.run_total.usage.input_tokens),
                    ),
                    KeyValue::new(
                        "gen_ai.usage.output_tokens",
                        int(r.run_total.usage.output_tokens),
                    ),
                    KeyValue::new("baton.cost.usd", r.run_total.cost_usd),
                ],
                parent_link(r.parent.as_ref()),
                status,
            );
        }
    }

    /// A failed step is a span of its own under the run's, its status the error: the
    /// delivery that comes next is another span (a committed step's, or a failed one's).
    fn step_failed(&self, f: &StepFailure) {
        self.span(
            trace_id(&f.run_id),
            failed_step_span_id(f),
            run_span_id(&f.run_id),
            true,
            format!("step {}", f.agent),
            SpanKind::Internal,
            (time(f.started), time(f.ended).max(time(f.started))),
            vec![
                KeyValue::new("baton.run.id", f.run_id.clone()),
                KeyValue::new("baton.step.version", int(f.version)),
                KeyValue::new("baton.step.attempt", i64::from(f.attempt)),
                KeyValue::new("baton.step.input", f.input),
                KeyValue::new("error.type", "step_failed"),
                KeyValue::new("gen_ai.agent.name", f.agent.clone()),
                KeyValue::new("gen_ai.conversation.id", f.run_id.clone()),
            ],
            parent_link(f.parent.as_ref()),
            Status::error(f.error.clone()),
        );
    }
}

/// The GenAI conventions' `gen_ai.provider.name` for a Baton provider prefix.
fn provider_name(prefix: &str) -> &str {
    match prefix {
        "bedrock" => "aws.bedrock",
        other => other,
    }
}

/// Resource attributes of a Lambda function (the `cloud.*` and `faas.*` conventions), none
/// elsewhere.
fn lambda_resource() -> Vec<KeyValue> {
    let Ok(name) = std::env::var("AWS_LAMBDA_FUNCTION_NAME") else {
        return Vec::new();
    };
    let mut kv = vec![
        KeyValue::new("cloud.provider", "aws"),
        KeyValue::new("cloud.platform", "aws_lambda"),
        KeyValue::new("faas.name", name),
    ];
    for (env, key) in [
        ("AWS_REGION", "cloud.region"),
        ("AWS_LAMBDA_FUNCTION_VERSION", "faas.version"),
        ("AWS_LAMBDA_LOG_STREAM_NAME", "faas.instance"),
    ] {
        if let Ok(v) = std::env::var(env) {
            kv.push(KeyValue::new(key, v));
        }
    }
    kv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_endpoint_makes_no_exporter() {
        let env = |pairs: &'static [(&str, &str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(!configured(env(&[])));
        assert!(!configured(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
        assert!(!configured(env(&[("OTEL_SERVICE_NAME", "x")])));
        assert!(configured(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )])));
        assert!(configured(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces"
        )])));
    }
}
