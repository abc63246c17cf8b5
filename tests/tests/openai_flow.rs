//! End-to-end with the OpenAI-compatible client against a mock server on loopback: the real
//! wire format, a rate limit on the way, usage summed across calls.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use baton_llm::openai::{OpenAiConfig, OpenAiLlm};
use common::*;
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate, matchers};

/// Plays a model: asks for `echo` when the last message is the user's, answers with the
/// tool's output when the last message is a tool result. The first request is rate-limited.
struct FakeModel {
    calls: AtomicUsize,
    seen: std::sync::Mutex<Vec<Value>>,
}

impl Respond for FakeModel {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            return ResponseTemplate::new(429).insert_header("retry-after", "0");
        }
        let body: Value = serde_json::from_slice(&req.body).expect("JSON request");
        self.seen.lock().unwrap().push(body.clone());
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        let usage = json!({"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110});
        let message = if last["role"] == "user" {
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_xyz", "type": "function",
                "function": {"name": "echo", "arguments": json!({"text": format!("echo of {}", last["content"].as_str().unwrap_or(""))}).to_string()}}]})
        } else {
            json!({"role": "assistant", "content": format!("The tool said: {}", last["content"].as_str().unwrap_or(""))})
        };
        ResponseTemplate::new(200).set_body_json(
            json!({"choices": [{"message": message, "finish_reason": "stop"}], "usage": usage}),
        )
    }
}

#[tokio::test]
async fn a_run_over_the_openai_wire_format_completes() {
    let mock = MockServer::start().await;
    let model = Arc::new(FakeModel {
        calls: AtomicUsize::new(0),
        seen: Default::default(),
    });
    Mock::given(matchers::method("POST"))
        .and(matchers::path("/v1/chat/completions"))
        .and(matchers::header("authorization", "Bearer sk-local"))
        .respond_with(ModelRef(model.clone()))
        .mount(&mock)
        .await;
    let llm = OpenAiLlm::new(OpenAiConfig {
        max_tokens: None,
        base_url: format!("{}/v1", mock.uri()),
        api_key: Some("sk-local".into()),
        model: "mock-model".into(),
        max_retries: 3,
        backoff: baton_llm::retry::Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
        },
        timeout: Duration::from_secs(5),
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agents = json!({"agents": {"worker": {"system": "You echo.", "tools": ["echo"]}}});
    let h = start(dir.path(), Arc::new(llm), catalog(Some(agents))).await;
    let run_id = h
        .create_run(json!({"prompt": "hello", "agent": "worker"}))
        .await;
    let run = h.wait_status(&run_id, &["completed"]).await;

    assert_eq!(run["result"], "The tool said: echo of hello");
    assert_eq!(
        run["usage"],
        json!({"inputTokens": 200, "outputTokens": 20, "totalTokens": 220})
    );
    let tool = of_type(&run, "tool")[0];
    assert_eq!(
        tool["id"], "call_xyz",
        "the provider's tool call id is kept"
    );
    assert_eq!(tool["input"], json!({"text": "echo of hello"}));
    assert_eq!(
        tool["result"],
        json!({"status": "success", "output": "echo of hello"})
    );

    // The second think sent the whole projected history back, with the tool definitions.
    let seen = model.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1]["model"], "mock-model");
    assert_eq!(seen[1]["tools"][0]["function"]["name"], "echo");
    let roles: Vec<&str> = seen[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    assert_eq!(seen[1]["messages"][2]["tool_calls"][0]["id"], "call_xyz");
    assert_eq!(seen[1]["messages"][3]["tool_call_id"], "call_xyz");
    assert_eq!(
        model.calls.load(Ordering::SeqCst),
        3,
        "one 429, then two thinks"
    );
    h.server.shutdown().await;
}

struct ModelRef(Arc<FakeModel>);

impl Respond for ModelRef {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        self.0.respond(req)
    }
}

/// An agent's `maxOutputTokens` reaches an OpenAI-compatible server (the mock stops a reply
/// there, as a real one does): the cut reply is marked on its entry and not taken as the
/// answer; asked again, the model answers within the limit.
#[tokio::test]
async fn a_reply_cut_at_the_agent_s_output_limit_is_marked_and_asked_again() {
    const SCRIPT: &str = r#"{"orchestrator": [
        {"text": "Here is a very long answer that rambles on and on well past any limit"},
        {"text": "Forty-two, briefly."}]}"#;
    let (mock, llm) = crate::common::mock_openai::start(SCRIPT).await;
    let agents = json!({"agents": {"orchestrator": {"system": "agent:orchestrator",
        "tools": [], "maxOutputTokens": 5}}});
    let dir = tempfile::tempdir().unwrap();
    let h = crate::common::start(dir.path(), llm, crate::common::catalog(Some(agents))).await;
    let id = h.create_run(json!({"prompt": "the answer?"})).await;
    h.wait_status(&id, &["completed"]).await;
    let (_, run) = h.get(&format!("/runs/{id}")).await;
    assert_eq!(run["result"], "Forty-two, briefly.", "{run}");
    let timeline = run["timeline"].as_array().unwrap();
    let cut = &timeline[1];
    assert_eq!(cut["type"], "assistant", "{run}");
    assert_eq!(cut["text"], "Here is a very long", "{run}");
    assert_eq!(cut["truncated"], true, "{run}");
    assert_eq!(cut["stopReason"], "length", "{run}");
    assert_eq!(timeline[2]["type"], "user", "{run}");
    assert_eq!(timeline[2]["visible"], false, "{run}");
    assert!(timeline[3].get("truncated").is_none(), "{run}");
    // Offered no tools, the model is told so (seed 001).
    let asked = mock.received_requests().await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&asked[0].body).unwrap();
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("You have no tools"), "{system}");
    assert!(body.get("tools").is_none(), "{body}");
    h.server.shutdown().await;
}
