//! Traces and metrics as an operator's tools receive them: the OTLP export decoded by a
//! receiver built on the official protobuf definitions (PyPI `opentelemetry-proto`), and
//! `GET /metrics` read by the Prometheus project's own parsers (PyPI `prometheus-client`).
//! The run has a subagent, an MCP tool (`mcp-server-time`, from PyPI, over stdio) and a
//! question answered through the API.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::ports::SystemClock;
use common::aws::Api;
use common::python::venv_bin;
use common::*;
use serde_json::{Value, json};

/// `tests/otlp/receiver.py`, writing the spans it decodes to `out`; killed when dropped.
struct Receiver {
    child: Child,
    url: String,
    out: PathBuf,
}

impl Receiver {
    fn start(dir: &Path) -> Self {
        let out = dir.join("spans.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("otlp/receiver.py");
        let mut child = Command::new(venv_bin().join("python"))
            .arg(script)
            .args(["--port", "0", "--out"])
            .arg(&out)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the OTLP receiver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the receiver says where it listens");
        Self {
            child,
            url: line.trim().to_owned(),
            out,
        }
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a span as JSON"))
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// Samples of a metrics page, as `tests/otlp/parse_metrics.py` reads them.
fn parse_metrics(page: &str) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("otlp/parse_metrics.py");
    let mut child = Command::new(venv_bin().join("python"))
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the parser");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("write the page");
    let out = child.wait_with_output().expect("the parser ends");
    assert!(
        out.status.success(),
        "the page does not parse: {}\n{page}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a sample"))
        .collect()
}

fn sample(samples: &[Value], name: &str, labels: Value) -> f64 {
    samples
        .iter()
        .filter(|s| s["name"] == name)
        .filter(|s| {
            labels
                .as_object()
                .expect("labels")
                .iter()
                .all(|(k, v)| &s["labels"][k] == v)
        })
        .map(|s| s["value"].as_f64().expect("a number"))
        .sum()
}

/// The agents (one with the MCP server `clock`, one subagent) and their scripted replies.
fn agents_and_script() -> (Arc<baton_core::agent::Catalog>, Value) {
    let bin = venv_bin();
    let catalog = common::tools_catalog(json!({
        "mcpServers": {"clock": {"command": bin.join("mcp-server-time"), "args": ["--local-timezone", "UTC"]}},
        "agents": {
            "orchestrator": {"model": "openai:gpt-4o-mini",
                "tools": ["clock__get_current_time", "spawn_subagent", "request_human_feedback"]},
            "explore": {"model": "openai:gpt-4o-mini", "tools": []}
        }
    }));
    let script = json!({
        "orchestrator": [
            {"tool_calls": [
                {"name": "clock__get_current_time", "arguments": {"timezone": "UTC"}},
                {"name": "spawn_subagent", "arguments": {"agent": "explore", "prompt": "map the repo"}}],
             "usage": {"inputTokens": 100, "outputTokens": 10, "totalTokens": 110}},
            {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Ship?"}}],
             "usage": {"inputTokens": 200, "outputTokens": 20, "totalTokens": 220}},
            {"text": "Shipped.", "usage": {"inputTokens": 300, "outputTokens": 30, "totalTokens": 330}}],
        "explore": [{"text": "3 crates.", "usage": {"inputTokens": 50, "outputTokens": 5, "totalTokens": 55}}]
    });
    (catalog, script)
}

/// Starts the run, answers its question, waits for it to complete: its id and its
/// subagent's.
async fn drive(api: &Api) -> (String, String) {
    let (code, v) = api.post("/runs", json!({"prompt": "Ship it"})).await;
    assert_eq!(code, 202, "{v}");
    let run_id = v["runId"].as_str().expect("run id").to_owned();
    let cta = api.pending_cta().await;
    let (code, v) = api
        .post(
            &format!("/ctas/{}/response", cta["ctaId"].as_str().expect("id")),
            json!({"kind": "approval", "approved": true}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    let run = api.status(&run_id, "completed").await;
    let child = of_type(&run, "tool")
        .iter()
        .find_map(|t| t["childRunId"].as_str())
        .expect("a subagent")
        .to_owned();
    (run_id, child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_a_subagent_an_mcp_tool_and_a_question_exports_one_linked_trace_and_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = Receiver::start(dir.path());
    let (catalog, script) = agents_and_script();
    let traces = baton_telemetry::Traces::to(&receiver.url, "baton-test").expect("exporter");
    let mut options = common::local_options(
        dir.path(),
        scripted(&script.to_string()),
        catalog,
        Arc::new(SystemClock),
    );
    options.traces = Some(Arc::new(traces));
    let h = common::start_from(options).await;
    let api = Api::new(h.server.url());
    let (run_id, child) = drive(&api).await;
    check_metrics(&api).await;
    // Stopping the server sends what is left; the receiver writes what it decoded.
    h.server.shutdown().await;
    check_trace(&receiver, &run_id, &child).await;
}

/// `baton dev --aws`: the step functions' handlers over AWS APIs (moto) are observed as
/// `baton dev`'s worker is: the same trace, the same counters at `GET /metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_run_on_the_aws_host_exports_the_same_trace_and_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = Receiver::start(dir.path());
    let (catalog, script) = agents_and_script();
    let aws = common::aws::Emulator::start().await;
    let traces = baton_telemetry::Traces::to(&receiver.url, "baton-test").expect("exporter");
    let mut options = aws
        .dev_options(
            aws.names("telemetry"),
            scripted(&script.to_string()),
            catalog,
            0,
        )
        .await;
    options.traces = Some(Arc::new(traces));
    let server = aws.dev_host_from(options).await;
    let api = Api::new(server.url());
    let (run_id, child) = drive(&api).await;
    check_metrics(&api).await;
    server.shutdown().await;
    check_trace(&receiver, &run_id, &child).await;
}

/// The samples of `GET /metrics` (with the server's token), read again until `done` says
/// they hold what is awaited, for at most 10 s: a step's counters are added just after its
/// commit, so a run can read as ended a moment before its last step is counted.
async fn counted(api: &Api, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let page = api
            .http
            .get(format!("{}/metrics", api.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("metrics");
        assert_eq!(page.status(), 200);
        assert!(
            page.headers()["content-type"]
                .to_str()
                .unwrap_or_default()
                .starts_with("application/openmetrics-text"),
        );
        let samples = parse_metrics(&page.text().await.expect("page"));
        if done(&samples) || std::time::Instant::now() > deadline {
            return samples;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The counters, as Prometheus reads them (with the server's token; none without it).
/// A step's counters are added just after its commit, so the run can read as completed a
/// moment before its last step is counted: the page is read again until it is.
async fn check_metrics(api: &Api) {
    let orch = json!({"agent": "orchestrator", "model": "openai:gpt-4o-mini"});
    let samples = counted(api, |samples| {
        sample(samples, "baton_input_tokens_total", orch.clone()) >= 600.0
    })
    .await;
    assert_eq!(
        sample(&samples, "baton_input_tokens_total", orch.clone()),
        600.0
    );
    assert_eq!(
        sample(&samples, "baton_output_tokens_total", orch.clone()),
        60.0
    );
    assert!(
        sample(
            &samples,
            "baton_steps_total",
            json!({"agent": "orchestrator"})
        ) >= 3.0
    );
    assert_eq!(
        sample(&samples, "baton_model_call_seconds_count", orch),
        3.0
    );
    let answered = json!({"agent": "orchestrator", "kind": "answered"});
    assert_eq!(sample(&samples, "baton_ctas_total", answered), 1.0);
    let opened = json!({"agent": "orchestrator", "kind": "opened"});
    assert_eq!(sample(&samples, "baton_ctas_total", opened), 1.0);
    let ok = json!({"agent": "orchestrator", "kind": "success"});
    assert_eq!(sample(&samples, "baton_tool_calls_total", ok), 3.0);
    for agent in ["orchestrator", "explore"] {
        let done = json!({"agent": agent, "kind": "completed"});
        assert_eq!(
            sample(&samples, "baton_runs_ended_total", done),
            1.0,
            "{agent}"
        );
    }
    let anonymous = api
        .http
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .expect("metrics");
    assert_eq!(anonymous.status(), 401);
}

/// The spans the receiver decoded: one trace for the run, its subagent's linked.
async fn check_trace(receiver: &Receiver, run_id: &str, child: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let spans = receiver.spans();
        if named(&spans, "invoke_agent orchestrator").len() == 1 || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let of_run = |id: &str| -> Vec<&Value> {
        spans
            .iter()
            .filter(|s| {
                s["attributes"]["baton.run.id"] == id
                    || s["attributes"]["gen_ai.conversation.id"] == id
            })
            .collect()
    };
    let root = named(&spans, "invoke_agent orchestrator");
    assert_eq!(root.len(), 1, "{spans:#?}");
    let root = root[0];
    let trace = root["trace_id"].as_str().expect("trace id");
    assert!(root["parent_span_id"].is_null());
    assert_eq!(root["resource"]["service.name"], "baton-test");
    // Every span of the run is in its trace, under the run's span or a step of it.
    let steps: Vec<&Value> = named(&spans, "step orchestrator");
    assert!(steps.len() >= 3, "{steps:#?}");
    let step_ids: Vec<&str> = steps
        .iter()
        .map(|s| s["span_id"].as_str().expect("id"))
        .collect();
    for s in &steps {
        assert_eq!(s["trace_id"], trace);
        assert_eq!(s["parent_span_id"], root["span_id"]);
        assert_eq!(s["attributes"]["baton.run.id"], run_id);
        for key in ["baton.step.seq", "baton.step.attempt", "gen_ai.agent.name"] {
            assert!(!s["attributes"][key].is_null(), "{key} in {s}");
        }
    }
    assert!(of_run(run_id).iter().all(|s| s["trace_id"] == trace));
    let in_trace: Vec<&Value> = spans.iter().filter(|s| s["trace_id"] == trace).collect();
    let chats: Vec<&&Value> = in_trace
        .iter()
        .filter(|s| s["name"] == "chat openai:gpt-4o-mini")
        .collect();
    assert_eq!(chats.len(), 3, "{in_trace:#?}");
    let inputs: Vec<i64> = chats
        .iter()
        .map(|c| {
            c["attributes"]["gen_ai.usage.input_tokens"]
                .as_i64()
                .expect("tokens")
        })
        .collect();
    assert_eq!(inputs.iter().sum::<i64>(), 600);
    for c in &chats {
        let a = &c["attributes"];
        assert_eq!(a["gen_ai.operation.name"], "chat");
        assert_eq!(a["gen_ai.provider.name"], "openai");
        assert_eq!(a["gen_ai.request.model"], "openai:gpt-4o-mini");
        assert!(a["gen_ai.usage.output_tokens"].is_i64());
        assert!(a["gen_ai.response.finish_reasons"].is_array());
        assert_eq!(c["kind"], "SPAN_KIND_CLIENT");
        assert!(step_ids.contains(&c["parent_span_id"].as_str().expect("parent")));
    }
    let clock: Vec<&&Value> = in_trace
        .iter()
        .filter(|s| s["name"] == "execute_tool clock__get_current_time")
        .collect();
    assert_eq!(clock.len(), 1, "{in_trace:#?}");
    assert_eq!(clock[0]["attributes"]["baton.mcp.server"], "clock");
    assert_eq!(clock[0]["attributes"]["baton.tool.outcome"], "success");
    assert!(clock[0]["attributes"]["baton.tool.duration_ms"].is_i64());
    let asked: Vec<&&Value> = in_trace
        .iter()
        .filter(|s| s["name"] == "execute_tool request_human_feedback")
        .collect();
    assert_eq!(asked.len(), 1);
    // The subagent: its own trace, linked to its parent's run; the spawn links to it.
    let spawn: Vec<&&Value> = in_trace
        .iter()
        .filter(|s| s["name"] == "execute_tool spawn_subagent")
        .collect();
    assert_eq!(spawn.len(), 1);
    assert_eq!(spawn[0]["attributes"]["baton.child_run.id"], child);
    let sub = of_run(child);
    assert!(!sub.is_empty(), "{spans:#?}");
    let sub_trace = sub[0]["trace_id"].as_str().expect("trace");
    assert_ne!(sub_trace, trace);
    assert_eq!(spawn[0]["links"][0]["trace_id"], sub_trace);
    for s in sub
        .iter()
        .filter(|s| s["name"] == "step explore" || s["name"] == "invoke_agent explore")
    {
        assert_eq!(s["trace_id"], sub_trace);
        assert_eq!(s["links"][0]["trace_id"], trace, "{s}");
        assert_eq!(s["links"][0]["span_id"], root["span_id"], "{s}");
    }
    assert_eq!(named(&spans, "invoke_agent explore").len(), 1);
}

/// A real plan's state machine in the counters: a plan of two stages whose second step's
/// model fails goes `dispatching → awaiting_results` twice, then `merging → failed`; the
/// counters at `GET /metrics` are the moves its events said, not a report built by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_plans_phases_are_counted_as_its_events_said() {
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = common::catalog(Some(json!({"agents": {
        "orchestrator": {"tools": ["agent_orchestrate"]},
        "writer": {"tools": []}}})));
    // The writer's script is empty: its think fails, and so does its step.
    let script = json!({
        "orchestrator": [
            {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"plan": {"steps": [
                {"id": "read", "agent": "explore", "prompt": "Read the API", "result_key": "api"},
                {"id": "write", "agent": "writer", "prompt": "Write up {{result.api}}"}]}}}]},
            {"text": "The write-up failed."}],
        "explore": [{"text": "API ok"}],
        "writer": []
    });
    let options = common::local_options(
        dir.path(),
        scripted(&script.to_string()),
        catalog,
        Arc::new(SystemClock),
    );
    let h = common::start_from(options).await;
    let api = Api::new(h.server.url());
    let (code, v) = api
        .post("/runs", json!({"prompt": "Document the API"}))
        .await;
    assert_eq!(code, 202, "{v}");
    let run_id = v["runId"].as_str().expect("run id").to_owned();
    let run = api.status(&run_id, "completed").await;
    let plan = &of_type(&run, "tool")[0]["result"]["output"];
    assert_eq!(plan["success"], false, "{run}");
    let moves = [
        ("-", "dispatching", 1.0),
        ("dispatching", "awaiting_results", 2.0),
        ("awaiting_results", "dispatching", 1.0),
        ("awaiting_results", "merging", 1.0),
        ("merging", "failed", 1.0),
    ];
    let count = |samples: &[Value], from: &str, to: &str| {
        let labels = json!({"agent": "orchestrator", "from": from, "to": to});
        sample(samples, "baton_plan_phase_changes_total", labels)
    };
    let samples = counted(&api, |samples| count(samples, "merging", "failed") >= 1.0).await;
    for (from, to, n) in moves {
        assert_eq!(count(&samples, from, to), n, "{from} -> {to}");
    }
    assert_eq!(count(&samples, "merging", "done"), 0.0);
    h.server.shutdown().await;
}
