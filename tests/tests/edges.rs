//! Exactly once at every edge, on both hosts (the dev host over SQLite, the AWS host over
//! moto): a tool call's idempotency key names one call of one run (three runs and a fork,
//! a receiver that records the keys).

use crate::common;

use std::sync::Arc;

use baton_core::ports::SystemClock;
use common::aws::Api;
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, ResponseTemplate, matchers};

/// The orchestrator's first reply pays (an approval gates it), its second says so.
const PAY: &str = r#"{"orchestrator": [
  {"tool_calls": [{"name": "pay", "arguments": {"cents": 500}}]},
  {"text": "Paid."}]}"#;

fn pay_agents(tool: &MockServer) -> Arc<baton_core::agent::Catalog> {
    let file = serde_json::from_value(json!({
        "tools": {"pay": {"url": format!("{}/pay", tool.uri()), "description": "pays",
            "schema": {"type": "object", "properties": {"cents": {"type": "integer"}}}}},
        "agents": {"orchestrator": {"system": "agent:orchestrator", "tools": ["pay"],
            "approval": {"pay": "always"}}}
    }))
    .unwrap();
    let catalog = baton_tools::catalog(Some(file), baton_tools::Host::Dev, &|_| None, vec![]);
    Arc::new(catalog.unwrap())
}

async fn pay_server() -> MockServer {
    let tool = MockServer::start().await;
    Mock::given(matchers::method("POST"))
        .and(matchers::path("/pay"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"paid": true})))
        .mount(&tool)
        .await;
    tool
}

/// The question waiting in run `run_id`, once there is one.
async fn question_of(api: &Api, run_id: &str) -> Value {
    let path = format!("/ctas?status=pending&rootRunId={run_id}");
    api.wait("the run's question", async |api: &Api| {
        let (_, v) = api.get(&path).await;
        v["ctas"].as_array().and_then(|c| c.first().cloned())
    })
    .await
}

async fn approve(api: &Api, cta: &Value) {
    let (code, v) = api
        .post(
            &format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap()),
            json!({"kind": "approval", "approved": true}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
}

/// The key each run's `pay` call must have sent: derived from the run and its entry.
fn expected_key(run: &Value) -> String {
    let pay = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool" && e["name"] == "pay" && e["result"]["status"] == "success")
        .unwrap_or_else(|| panic!("a paid call: {run}"));
    baton_core::engine::idempotency_key(
        run["runId"].as_str().unwrap(),
        pay["seq"].as_u64().unwrap(),
    )
}

/// Three runs of an agent whose first reply pays, and a fork of the first at its approval
/// that pays again: four calls, four keys, each the run's and the call's.
async fn keys_flow(api: &Api, tool: &MockServer) {
    let mut runs = Vec::new();
    for _ in 0..3 {
        let (code, v) = api.post("/runs", json!({"prompt": "pay"})).await;
        assert_eq!(code, 202, "{v}");
        let run_id = v["runId"].as_str().unwrap().to_owned();
        approve(api, &question_of(api, &run_id).await).await;
        runs.push(api.status(&run_id, "completed").await);
    }
    let at = runs[0]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["cta"].is_object())
        .and_then(|e| e["seq"].as_u64())
        .unwrap();
    let (code, v) = api
        .post(
            &format!("/runs/{}/fork", runs[0]["runId"].as_str().unwrap()),
            json!({"atSeq": at, "replacement": {"response": {"kind": "approval", "approved": true}}}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    runs.push(api.status(v["runId"].as_str().unwrap(), "completed").await);

    let sent: Vec<String> = tool
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| {
            r.headers
                .get("idempotency-key")
                .and_then(|k| k.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    let mut want: Vec<String> = runs.iter().map(expected_key).collect();
    let mut got = sent.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want, "one call each, with its own key");
    let distinct: std::collections::HashSet<_> = sent.iter().collect();
    assert_eq!(distinct.len(), 4, "{sent:?}");
}

#[tokio::test]
async fn each_call_of_each_run_and_fork_has_its_own_idempotency_key_on_the_dev_host() {
    let tool = pay_server().await;
    let (_model, llm) = common::mock_openai::start(PAY).await;
    let dir = tempfile::tempdir().unwrap();
    let h = common::start(dir.path(), llm, pay_agents(&tool), Arc::new(SystemClock)).await;
    keys_flow(&Api::new(h.server.url()), &tool).await;
    h.server.shutdown().await;
}

#[tokio::test]
async fn each_call_of_each_run_and_fork_has_its_own_idempotency_key_on_the_aws_host() {
    let tool = pay_server().await;
    let (_model, llm) = common::mock_openai::start(PAY).await;
    let aws = common::aws::Emulator::start().await;
    let server = aws.dev_host("keys", llm, pay_agents(&tool)).await;
    keys_flow(&Api::new(server.url()), &tool).await;
    server.shutdown().await;
}
