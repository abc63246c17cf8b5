//! Configured tools, deadlines and cost through `baton dev`'s server: an HTTP tool gets
//! its input with the call id as `Idempotency-Key`, a tool that hangs past its timeout is
//! an error result and the run goes on, a run past `maxWallSeconds` ends failed with an
//! entry naming the limit, and what the model calls cost is on the run.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::agent::AgentsFile;
use baton_core::ports::SystemClock;
use common::{Harness, of_type, scripted};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

async fn start(dir: &std::path::Path, file: Value, script: Value) -> Harness {
    let file: AgentsFile = serde_json::from_value(file).expect("agents file");
    let catalog = baton_tools::catalog(Some(file), baton_tools::Host::Dev, &|_| None, vec![])
        .expect("catalog");
    common::start(
        dir,
        scripted(&script.to_string()),
        Arc::new(catalog),
        Arc::new(SystemClock),
    )
    .await
}

async fn tool_server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/lookup"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "shipped"})))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/hang"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/slow"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"ok": true}))
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(&server)
        .await;
    server
}

fn http_tool(server: &MockServer, route: &str, timeout: u64) -> Value {
    json!({"url": format!("{}{route}", server.uri()), "description": route,
           "schema": {"type": "object"}, "timeoutSeconds": timeout})
}

fn usage(input: u64, output: u64) -> Value {
    json!({"inputTokens": input, "outputTokens": output, "totalTokens": input + output})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tools_are_posted_once_per_call_a_hung_one_times_out_and_calls_are_priced() {
    let server = tool_server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = json!({
        "tools": {"lookup": http_tool(&server, "/lookup", 5), "hang": http_tool(&server, "/hang", 1)},
        "agents": {"ops": {"model": "openai:gpt-4o-mini", "tools": ["lookup", "hang"]}}
    });
    let script = json!({"ops": [
        {"tool_calls": [{"name": "lookup", "arguments": {"order": 42}},
                        {"name": "hang", "arguments": {}}],
         "usage": usage(1_000_000, 0)},
        {"text": "shipped; the other one hung", "usage": usage(0, 1_000_000)}
    ]});
    let h = start(dir.path(), file, script).await;
    let started = Instant::now();
    let run_id = h
        .create_run(json!({"prompt": "where is order 42?", "agent": "ops"}))
        .await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the hung tool was cut at 1 s"
    );

    let tools = of_type(&run, "tool");
    assert_eq!(tools[0]["result"]["output"], json!({"status": "shipped"}));
    let hung = &tools[1]["result"];
    assert_eq!(hung["status"], "error");
    assert!(
        hung["error"]
            .as_str()
            .unwrap_or("")
            .contains("did not finish within its 1 s timeout"),
        "{hung}"
    );
    // The receiver saw the input, with the tool call's id as the idempotency key.
    let lookups: Vec<_> = server
        .received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.url.path() == "/lookup")
        .collect();
    assert_eq!(lookups.len(), 1);
    assert_eq!(
        lookups[0]
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok()),
        tools[0]["id"].as_str()
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&lookups[0].body).ok(),
        Some(json!({"order": 42}))
    );

    // A million tokens in at $0.15, a million out at $0.60.
    let cost = run["costUsd"].as_f64().expect("costUsd");
    assert!((cost - 0.75).abs() < 1e-9, "{run:#}");
    assert!((run["total"]["costUsd"].as_f64().unwrap_or(0.0) - 0.75).abs() < 1e-9);
    let replies = of_type(&run, "assistant");
    assert_eq!(replies[0]["model"], "openai:gpt-4o-mini");
    assert_eq!(replies[0]["operation"], "think");
    assert!((replies[1]["costUsd"].as_f64().unwrap_or(0.0) - 0.60).abs() < 1e-9);
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_deadline_ends_failed_with_an_entry_naming_the_limit() {
    let server = tool_server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = json!({
        "tools": {"slow": http_tool(&server, "/slow", 5)},
        "agents": {"brief": {"tools": ["slow"], "maxWallSeconds": 1}}
    });
    let script = json!({"brief": [
        {"tool_calls": [{"name": "slow", "arguments": {}}]},
        {"tool_calls": [{"name": "slow", "arguments": {}}]},
        {"text": "never reached"}
    ]});
    let h = start(dir.path(), file, script).await;
    let run_id = h
        .create_run(json!({"prompt": "take your time", "agent": "brief"}))
        .await;
    let run = h.wait_status(&run_id, &["failed"]).await;
    assert_eq!(run["error"]["code"], "deadline_exceeded", "{run:#}");
    let last = run["timeline"]
        .as_array()
        .and_then(|t| t.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["type"], "error");
    assert!(
        last["message"]
            .as_str()
            .unwrap_or("")
            .contains("maxWallSeconds = 1"),
        "{last}"
    );
    assert_eq!(
        of_type(&run, "tool").len(),
        1,
        "no iteration after the deadline"
    );
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_context_reaches_the_agent_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = start(
        dir.path(),
        json!({"agents": {"reader": {"tools": [], "contextGuidance": {"document": "Cite it."}}}}),
        json!({"reader": [{"text": "read"}]}),
    )
    .await;
    let run_id = h
        .create_run(json!({"prompt": "summarise", "agent": "reader",
                           "context": {"type": "document", "id": "doc-7"}}))
        .await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(run["context"]["id"], "doc-7");
    for bad in [json!({"id": "x"}), json!("document"), json!({"type": ""})] {
        let (code, v) = h
            .post(
                "/runs",
                json!({"prompt": "p", "agent": "reader", "context": bad}),
            )
            .await;
        assert_eq!(code, 400, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("`context`"),
            "{v}"
        );
    }
    h.server.shutdown().await;
}

#[test]
fn the_readmes_example_agents_file_builds_and_lambda_refuses_its_stdio_server() {
    let text = common::examples("agents.json");
    let file = || AgentsFile::parse(&text, "examples/agents.json").expect("parses");
    let vars = |k: &str| matches!(k, "CALC_TOKEN" | "ORDERS_KEY").then(|| "x".to_owned());
    let catalog = baton_tools::catalog(Some(file()), baton_tools::Host::Dev, &vars, vec![])
        .expect("builds under baton dev");
    let explore = catalog.agent("explore").expect("explore");
    assert!(
        explore.tools.iter().any(|t| t == "http_fetch"),
        "{:?}",
        explore.tools
    );
    assert!(explore.tools.iter().any(|t| t == "mcp:clock"));
    assert_eq!(
        catalog.agent("ops").expect("ops").max_wall,
        Some(Duration::from_secs(600))
    );
    assert_eq!(catalog.limits.plan.max_steps, 8);
    assert_eq!(
        catalog.limits.plan.step_timeout,
        Some(Duration::from_secs(900))
    );
    let planner = catalog.agent("planner").expect("the planner");
    assert!(
        planner
            .system
            .contains("- ops: answers questions about orders"),
        "{}",
        planner.system
    );
    let err = baton_tools::catalog(Some(file()), baton_tools::Host::Lambda, &vars, vec![])
        .expect_err("stdio on Lambda");
    assert!(
        err.to_string().contains("mcpServers.clock")
            && err.to_string().contains("only `baton dev`"),
        "{err}"
    );
    let err = baton_tools::catalog(Some(file()), baton_tools::Host::Dev, &|_| None, vec![])
        .expect_err("unset variable");
    assert!(err.to_string().contains("is not set"), "{err}");
}
