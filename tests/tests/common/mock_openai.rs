//! A mock OpenAI-compatible server on loopback that plays a script file over the real wire
//! format: the agent comes from the system prompt (`agent:<name>`), the reply index from the
//! number of assistant messages in the request (a reply that is a list branches on the last
//! tool message: see `respond`). Like a real server it stops a reply at the request's
//! output limit (`max_tokens`, or `max_completion_tokens`; a word is a token here) and says
//! so with `finish_reason: "length"`. A reply's `down` lists models that answer 503 to it, its `expect` the
//! request's fields it takes, its `expectImages` the images it is given (others get a 400).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use baton_llm::openai::{OpenAiConfig, OpenAiLlm};
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate, matchers};

struct Replay(HashMap<String, Vec<Value>>);

/// What OpenAI refuses with a 400: an assistant message's tool calls not each answered by a
/// `tool` message right after it, or a `tool` message that answers no call.
fn unanswered(messages: &[Value]) -> Option<String> {
    let mut open: Vec<String> = Vec::new();
    for m in messages {
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            let Some(i) = open.iter().position(|c| c == id) else {
                return Some(format!(
                    "tool message for `{id}` answers no preceding tool call"
                ));
            };
            open.remove(i);
            continue;
        }
        if !open.is_empty() {
            return Some(format!(
                "an assistant message with 'tool_calls' must be followed by tool messages \
                 responding to each 'tool_call_id': missing {open:?}"
            ));
        }
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            open.push(c["id"].as_str().unwrap_or_default().to_owned());
        }
    }
    (!open.is_empty()).then(|| format!("tool calls {open:?} have no tool message"))
}

impl Respond for Replay {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if let Some(error) = unanswered(&messages) {
            return ResponseTemplate::new(400).set_body_json(
                json!({"error": {"message": error, "type": "invalid_request_error"}}),
            );
        }
        let system = messages
            .first()
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        // `agent:<name>`, and whatever Baton adds after it.
        let agent = system
            .strip_prefix("agent:")
            .and_then(|a| a.split_whitespace().next())
            .unwrap_or_default();
        let index = messages.iter().filter(|m| m["role"] == "assistant").count();
        let Some(reply) = self.0.get(agent).and_then(|r| r.get(index)) else {
            return ResponseTemplate::new(400)
                .set_body_string(format!("no reply {index} for {agent}"));
        };
        // A list of replies is a branch: the first whose `if` is in the last tool message
        // (or that has none) answers.
        let last_tool = messages
            .iter()
            .rev()
            .find(|m| m["role"] == "tool")
            .map(|m| m["content"].to_string())
            .unwrap_or_default();
        let reply = match reply.as_array() {
            Some(branches) => match branches.iter().find(|b| {
                b["if"]
                    .as_str()
                    .is_none_or(|needle| last_tool.contains(needle))
            }) {
                Some(b) => b,
                None => {
                    return ResponseTemplate::new(400)
                        .set_body_string(format!("no branch of reply {index} for {agent}"));
                }
            },
            None => reply,
        };
        // What the reply expects of the request (the agent's controls, as sent): a request
        // without it is refused, as a server refuses what it does not take.
        for (key, want) in reply["expect"].as_object().into_iter().flatten() {
            if body[key] != *want {
                return ResponseTemplate::new(400).set_body_string(format!(
                    "reply {index} for {agent} expects `{key}` = {want}, the request has {}",
                    body[key]
                ));
            }
        }
        // How many images the reply expects the request to give the model.
        if let Some(want) = reply["expectImages"].as_u64() {
            let urls: Vec<&str> = messages
                .iter()
                .filter_map(|m| m["content"].as_array())
                .flatten()
                .filter_map(|p| p["image_url"]["url"].as_str())
                .collect();
            if urls.len() as u64 != want || urls.iter().any(|u| !u.starts_with("data:image/")) {
                return ResponseTemplate::new(400).set_body_string(format!(
                    "reply {index} for {agent} expects {want} images, the request has {urls:?}"
                ));
            }
        }
        // A model the reply says is down answers as a provider in an outage does.
        let model = body["model"].as_str().unwrap_or_default();
        let model = model.strip_prefix("openai:").unwrap_or(model);
        let down = reply["down"].as_array().into_iter().flatten();
        if down
            .filter_map(Value::as_str)
            .any(|d| d.strip_prefix("openai:").unwrap_or(d) == model)
        {
            return ResponseTemplate::new(503).set_body_json(
                json!({"error": {"message": format!("{model} is overloaded"), "type": "server_error"}}),
            );
        }
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
        let mut text = reply.get("text").cloned().unwrap_or(Value::Null);
        let limit = body["max_tokens"]
            .as_u64()
            .or(body["max_completion_tokens"].as_u64());
        let mut finish = if calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        if let (Some(limit), Some(t)) = (limit, text.as_str()) {
            let words: Vec<&str> = t.split_whitespace().collect();
            if words.len() as u64 > limit {
                text = json!(words[..limit as usize].join(" "));
                finish = "length";
            }
        }
        let mut message = json!({"role": "assistant", "content": text});
        if !calls.is_empty() && finish != "length" {
            message["tool_calls"] = Value::Array(calls);
        }
        let u = &reply["usage"];
        let usage = json!({"prompt_tokens": u["inputTokens"].as_u64().unwrap_or(0),
            "completion_tokens": u["outputTokens"].as_u64().unwrap_or(0),
            "total_tokens": u["totalTokens"].as_u64().unwrap_or(0),
            "completion_tokens_details": {"reasoning_tokens": u["reasoningTokens"].as_u64().unwrap_or(0)}});
        ResponseTemplate::new(200).set_body_json(
            json!({"choices": [{"message": message, "finish_reason": finish}], "usage": usage}),
        )
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
        max_tokens: None,
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
