//! A mock OpenAI-compatible server on loopback that plays a script file over the real wire
//! format: the agent comes from the system prompt (`agent:<name>`), the reply index from the
//! number of assistant messages in the request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use baton_llm::openai::{OpenAiConfig, OpenAiLlm};
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate, matchers};

struct Replay(HashMap<String, Vec<Value>>);

impl Respond for Replay {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let system = messages
            .first()
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        let agent = system.strip_prefix("agent:").unwrap_or_default();
        let index = messages.iter().filter(|m| m["role"] == "assistant").count();
        let Some(reply) = self.0.get(agent).and_then(|r| r.get(index)) else {
            return ResponseTemplate::new(400)
                .set_body_string(format!("no reply {index} for {agent}"));
        };
        let calls: Vec<Value> = reply["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, c)| {
                json!({"id": format!("call_{index}_{i}"), "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"].to_string()}})
            })
            .collect();
        let mut message = json!({"role": "assistant", "content": reply.get("text").cloned().unwrap_or(Value::Null)});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        let u = &reply["usage"];
        let usage = json!({"prompt_tokens": u["inputTokens"].as_u64().unwrap_or(0),
            "completion_tokens": u["outputTokens"].as_u64().unwrap_or(0),
            "total_tokens": u["totalTokens"].as_u64().unwrap_or(0)});
        ResponseTemplate::new(200)
            .set_body_json(json!({"choices": [{"message": message}], "usage": usage}))
    }
}

/// Starts the mock and returns it with a client pointed at it.
pub async fn start(script: &str) -> (MockServer, Arc<OpenAiLlm>) {
    let script: HashMap<String, Vec<Value>> = serde_json::from_str(script).expect("script");
    let server = MockServer::start().await;
    Mock::given(matchers::method("POST"))
        .and(matchers::path("/v1/chat/completions"))
        .respond_with(Replay(script))
        .mount(&server)
        .await;
    let llm = OpenAiLlm::new(OpenAiConfig {
        base_url: format!("{}/v1", server.uri()),
        api_key: Some("sk-mock".into()),
        model: "mock".into(),
        max_retries: 2,
        backoff: baton_llm::retry::Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(20),
        },
        timeout: Duration::from_secs(5),
    })
    .expect("client");
    (server, Arc::new(llm))
}

/// Agents whose system prompt names them, so the mock knows who is asking.
pub fn named_agents() -> Value {
    json!({"agents": {
        "orchestrator": {"system": "agent:orchestrator", "tools": ["spawn_subagent", "request_human_feedback"]},
        "explore": {"system": "agent:explore", "tools": []},
        "code": {"system": "agent:code", "tools": []}
    }})
}
