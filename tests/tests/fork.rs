//! Forking a run (`POST /runs/{id}/fork`) on both hosts: the dev host (SQLite) and the AWS
//! host (DynamoDB, SQS, EventBridge and Scheduler on moto), each with a mock OpenAI server
//! whose requests are counted, and an HTTP tool whose calls are counted: the fork at a
//! question answered differently takes the other branch, and nothing before the question
//! (a model call, the tool, the subagent) runs again.

use crate::common;

use std::sync::Arc;

use common::aws::Api;
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, ResponseTemplate, matchers};

/// The orchestrator looks something up and asks a subagent at once, then asks where to ship;
/// its last reply depends on the answer.
const SCRIPT: &str = r#"{
  "orchestrator": [
    {"text": "Looking first.",
     "tool_calls": [{"name": "lookup", "arguments": {"q": "targets"}},
                    {"name": "spawn_subagent", "arguments": {"agent": "explore", "prompt": "map the repo"}}],
     "usage": {"inputTokens": 100, "outputTokens": 10, "totalTokens": 110}},
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "choice", "prompt": "Where to ship?",
       "options": [{"id": "staging", "label": "Staging"}, {"id": "prod", "label": "Production"}]}}],
     "usage": {"inputTokens": 200, "outputTokens": 20, "totalTokens": 220}},
    [{"if": "staging", "text": "Shipped to staging.", "usage": {"inputTokens": 300, "outputTokens": 5, "totalTokens": 305}},
     {"text": "Shipped to production.", "usage": {"inputTokens": 300, "outputTokens": 6, "totalTokens": 306}}]],
  "explore": [{"text": "The repo has 3 crates.", "usage": {"inputTokens": 50, "outputTokens": 8, "totalTokens": 58}}]
}"#;

fn agents(tool: &MockServer) -> Arc<baton_core::agent::Catalog> {
    common::tools_catalog(json!({
        "tools": {"lookup": {"url": format!("{}/lookup", tool.uri()), "description": "looks things up",
            "schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}},
        "agents": {
            "orchestrator": {"system": "agent:orchestrator",
                "tools": ["lookup", "spawn_subagent", "request_human_feedback"]},
            "explore": {"system": "agent:explore", "tools": []}
        }
    }))
}

/// Requests the mock model received from `agent`.
async fn model_calls(model: &MockServer, agent: &str) -> usize {
    let want = format!("agent:{agent}");
    model
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| {
            let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
            // `agent:<name>`, and whatever Baton adds after it (a model offered no tools
            // is told so).
            body["messages"][0]["content"]
                .as_str()
                .and_then(|c| c.split_whitespace().next())
                == Some(want.as_str())
        })
        .count()
}

async fn tool_server() -> MockServer {
    let tool = MockServer::start().await;
    Mock::given(matchers::method("POST"))
        .and(matchers::path("/lookup"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"targets": ["staging", "prod"]})),
        )
        .mount(&tool)
        .await;
    tool
}

/// The flow both hosts go through: a run answered `prod`, then its fork at the question
/// answered `staging`, with the refusals a fork gives.
async fn fork_flow(api: &Api, model: &MockServer, tool: &MockServer) {
    let (code, v) = api.post("/runs", json!({"prompt": "Ship it"})).await;
    assert_eq!(code, 202, "{v}");
    let run_id = v["runId"].as_str().unwrap().to_owned();
    let cta = api.pending_cta().await;
    let (code, v) = api
        .post(
            &format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap()),
            json!({"kind": "choice", "selectedId": "prod"}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    let original = api.status(&run_id, "completed").await;
    assert_eq!(original["result"], "Shipped to production.");
    let timeline = original["timeline"].as_array().unwrap().clone();
    let question = timeline
        .iter()
        .find(|e| e["cta"].is_object())
        .expect("the question's entry");
    let at = question["seq"].as_u64().unwrap();
    let counts = (
        model_calls(model, "orchestrator").await,
        model_calls(model, "explore").await,
        tool.received_requests().await.unwrap_or_default().len(),
    );
    assert_eq!(counts, (3, 1, 1));

    // Refusals change nothing.
    let fork = format!("/runs/{run_id}/fork");
    // A malformed body is a 400; a well-formed one that does not fit the run's entries (no
    // such entry, the wrong kind of replacement, an answer the question does not offer, an
    // entry a fork cannot start at) a 409 `fork_mismatch`.
    let refusals = [
        (json!({"atSeq": 999}), 409),
        (json!({"atSeq": at, "replacement": {"text": "no"}}), 409),
        (
            json!({"atSeq": at, "replacement": {"response": {"kind": "choice", "selectedId": "moon"}}}),
            409,
        ),
        (
            json!({"atSeq": at, "replacement": {"text": "a", "response": {"kind": "approval", "approved": true}}}),
            400,
        ),
        (json!({"atSeq": 2}), 409),
        // An integer past u64 is still one (JSON Schema's), and past the end.
        (
            serde_json::from_str(r#"{"atSeq": 75684231006104336728064}"#).unwrap(),
            409,
        ),
        (json!({"atSeq": 2.5}), 400),
        (json!({"at": 2}), 400),
    ];
    for (body, want) in refusals {
        let (code, v) = api.post(&fork, body.clone()).await;
        assert_eq!(code, want, "{body}: {v}");
        let code = v["error"]["code"].as_str().unwrap();
        assert_eq!(
            code,
            if want == 409 {
                "fork_mismatch"
            } else {
                "invalid_request"
            },
            "{body}"
        );
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    let (code, _) = api.post("/runs/run_nope/fork", json!({"atSeq": 0})).await;
    assert_eq!(code, 404);
    let child = timeline
        .iter()
        .find_map(|e| e["childRunId"].as_str())
        .unwrap();
    let (code, v) = api
        .post(&format!("/runs/{child}/fork"), json!({"atSeq": 0}))
        .await;
    assert_eq!(code, 409, "{v}");
    let (_, runs) = api.get("/runs").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs}");

    // The fork at the question, answered the other way.
    let (code, v) = api
        .post(
            &fork,
            json!({"atSeq": at, "replacement": {"response": {"kind": "choice", "selectedId": "staging"}}}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    assert_eq!(v["forkedFrom"], json!({"runId": run_id, "atSeq": at}));
    let forked_id = v["runId"].as_str().unwrap().to_owned();
    let forked = api.status(&forked_id, "completed").await;
    assert_eq!(forked["result"], "Shipped to staging.");
    assert_eq!(forked["forkedFrom"]["runId"], run_id.as_str());
    // Its history before the question is the original's, as recorded.
    let ft = forked["timeline"].as_array().unwrap();
    assert_eq!(&ft[..at as usize], &timeline[..at as usize]);
    assert_eq!(ft[at as usize]["cta"]["response"]["selectedId"], "staging");
    assert_eq!(ft[at as usize]["result"]["output"]["selectedId"], "staging");
    assert_ne!(ft[at as usize]["cta"]["ctaId"], question["cta"]["ctaId"]);
    // One model call more (the reply after the answer); the tool and the subagent not again.
    let after = (
        model_calls(model, "orchestrator").await,
        model_calls(model, "explore").await,
        tool.received_requests().await.unwrap_or_default().len(),
    );
    assert_eq!(after, (counts.0 + 1, counts.1, counts.2));
    // It spent its own call only.
    assert_eq!(forked["usage"]["totalTokens"], 305);
    // The original is as it was.
    let (_, again) = api.get(&format!("/runs/{run_id}")).await;
    assert_eq!(again["timeline"], original["timeline"]);
    assert_eq!(again["version"], original["version"]);

    // A fork at the prompt with new words starts over from there (its first reply again).
    let (code, v) = api
        .post(
            &fork,
            json!({"atSeq": 0, "replacement": {"text": "Ship it, carefully"}}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    let second = v["runId"].as_str().unwrap().to_owned();
    api.wait("its question", async |api: &Api| {
        let (_, v) = api
            .get(&format!("/ctas?status=pending&rootRunId={second}"))
            .await;
        v["ctas"].as_array().and_then(|c| c.first().cloned())
    })
    .await;
    let (_, run) = api.get(&format!("/runs/{second}")).await;
    assert_eq!(run["timeline"][0]["text"], "Ship it, carefully");
    assert_eq!(run["status"], "waiting");
    let (_, runs) = api.get("/runs").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 3, "{runs}");
}

#[tokio::test]
async fn a_fork_at_a_question_takes_the_other_branch_on_the_dev_host_with_nothing_run_again() {
    let tool = tool_server().await;
    let (model, llm) = common::mock_openai::start(SCRIPT).await;
    let dir = tempfile::tempdir().unwrap();
    let h = common::start(dir.path(), llm, agents(&tool)).await;
    let api = Api::new(h.server.url());
    fork_flow(&api, &model, &tool).await;
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_fork_at_a_question_takes_the_other_branch_on_the_aws_host_with_nothing_run_again() {
    let tool = tool_server().await;
    let (model, llm) = common::mock_openai::start(SCRIPT).await;
    let aws = common::aws::Emulator::start().await;
    let server = aws.dev_host("fork", llm, agents(&tool)).await;
    let api = Api::new(server.url());
    fork_flow(&api, &model, &tool).await;
    server.shutdown().await;
}

/// The orchestrator asks a plain approval, then is done.
const APPROVAL: &str = r#"{"orchestrator": [
  {"tool_calls": [{"name": "request_human_feedback",
                   "arguments": {"kind": "approval", "message": "Deploy?"}}]},
  {"text": "deployed"}]}"#;

/// `raiseUsd` answers a budget question only, through the API and in a fork's replacement
/// answer alike: on a plain approval both refuse it (409), and the fork makes no run.
async fn a_raise_answers_no_plain_question(api: &Api) {
    let run_id = api.post_ok("/runs", json!({"prompt": "deploy"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cta = api.pending_cta().await;
    let path = format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap());
    let raise = json!({"kind": "approval", "approved": true, "raiseUsd": 5});
    let (code, v) = api.post(&path, raise.clone()).await;
    assert_eq!(code, 409, "{v}");
    api.post_ok(&path, json!({"kind": "approval", "approved": true}))
        .await;
    let done = api.status(&run_id, "completed").await;
    let at = common::question_seq(&done);
    let (code, v) = api
        .post(
            &format!("/runs/{run_id}/fork"),
            json!({"atSeq": at, "replacement": {"response": raise}}),
        )
        .await;
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["error"]["code"], "fork_mismatch", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("raiseUsd")),
        "{v}"
    );
    let (_, runs) = api.get("/runs").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs}");
}

#[tokio::test]
async fn a_raise_answers_no_plain_question_on_either_host() {
    let dir = tempfile::tempdir().unwrap();
    let h = common::start(
        dir.path(),
        common::scripted(APPROVAL),
        common::catalog(None),
    )
    .await;
    a_raise_answers_no_plain_question(&Api::new(h.server.url())).await;
    h.server.shutdown().await;
    let aws = common::aws::Emulator::start().await;
    let server = aws
        .dev_host(
            "forkraise",
            common::scripted(APPROVAL),
            common::catalog(None),
        )
        .await;
    a_raise_answers_no_plain_question(&Api::new(server.url())).await;
    server.shutdown().await;
}
