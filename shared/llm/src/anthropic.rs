//! The Anthropic Messages API (`POST /v1/messages`) over `reqwest` (rustls).
//!
//! The projected chat maps onto Messages' shape: the system prompt is the top-level
//! `system`; a reply's tool calls are `tool_use` blocks; tool results are `tool_result`
//! blocks of the next user message (several results, and a user message after them, share
//! one, since roles must alternate). Rate limits (429), overload (529) and server errors are
//! retried with backoff and jitter, honouring `retry-after`; other errors are fatal, in the
//! API's own words.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::retry::{Attempt, Backoff, describe, retry_after, with_retries};
use baton_core::config::ModelConfig;
use baton_core::llm::{ChatMessage, ChatRequest, Deltas, Llm, LlmError, LlmReply, ToolCall};
use baton_core::run::Usage;

/// The API version Baton speaks.
pub const API_VERSION: &str = "2023-06-01";

#[derive(Clone)]
pub struct AnthropicConfig {
    /// The API's root, without `/v1`.
    pub base_url: String,
    pub api_key: Option<String>,
    pub max_tokens: u32,
    pub max_retries: u32,
    pub backoff: Backoff,
    /// One HTTP attempt's timeout.
    pub timeout: Duration,
}

impl AnthropicConfig {
    pub fn from_model(model: &ModelConfig) -> Self {
        Self {
            base_url: model.anthropic_base_url.clone(),
            api_key: model.anthropic_api_key.clone(),
            max_tokens: model.max_output_tokens,
            max_retries: model.max_retries,
            backoff: Backoff::default(),
            timeout: Duration::from_secs(u64::from(model.timeout_secs)),
        }
    }
}

pub struct AnthropicLlm {
    http: reqwest::Client,
    cfg: AnthropicConfig,
    url: String,
}

impl AnthropicLlm {
    pub fn new(cfg: AnthropicConfig) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .build()
            .map_err(|e| LlmError::fatal_from(format!("cannot build the HTTP client: {e}"), e))?;
        let url = format!("{}/v1/messages", cfg.base_url.trim_end_matches('/'));
        Ok(Self { http, cfg, url })
    }

    /// The request body for `model` (the id without `anthropic:`).
    pub fn body(&self, req: &ChatRequest<'_>, model: &str) -> Value {
        let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::new();
        let mut system = Vec::new();
        for m in req.messages() {
            let (role, block) = match m {
                ChatMessage::System { content } => {
                    system.push(content);
                    continue;
                }
                ChatMessage::User { content } => ("user", vec![text_block(content)]),
                ChatMessage::Assistant {
                    content,
                    tool_calls,
                    reasoning,
                } => {
                    // The reply's thinking blocks first, signed, as the API gave them.
                    let mut blocks: Vec<Value> = thinking_blocks(reasoning);
                    blocks.extend(
                        content
                            .into_iter()
                            .filter(|t| !t.is_empty())
                            .map(text_block),
                    );
                    blocks.extend(tool_calls.iter().map(|c| {
                        json!({"type": "tool_use", "id": c.id, "name": c.name,
                               "input": input_object(&c.arguments)})
                    }));
                    ("assistant", blocks)
                }
                ChatMessage::Tool {
                    tool_call_id,
                    content,
                    is_error,
                    images,
                } => {
                    // The images the model is given go in the result, after its text.
                    let shown: Vec<Value> = images
                        .iter()
                        .filter_map(|id| req.image(id))
                        .map(|i| {
                            json!({"type": "image", "source": {"type": "base64",
                                   "media_type": i.media_type,
                                   "data": aws_smithy_types::base64::encode(&i.bytes)}})
                        })
                        .collect();
                    let content = match shown.is_empty() {
                        true => json!(content),
                        false => {
                            let mut parts = vec![text_block(content)];
                            parts.extend(shown);
                            Value::Array(parts)
                        }
                    };
                    let mut block = json!({"type": "tool_result", "tool_use_id": tool_call_id, "content": content});
                    if is_error {
                        block["is_error"] = json!(true);
                    }
                    ("user", vec![block])
                }
            };
            match messages.last_mut() {
                Some((last, blocks)) if *last == role => blocks.extend(block),
                _ => messages.push((role, block)),
            }
        }
        let messages: Vec<Value> = messages
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        let limit = req.max_output_tokens.unwrap_or(self.cfg.max_tokens);
        let reasoning = req.controls.reasoning.as_ref();
        // Thinking counts toward `max_tokens`, which must be above its budget: the reply's
        // own limit comes on top.
        let max_tokens = reasoning.map_or(limit, |r| limit.saturating_add(r.budget()));
        let mut body = json!({
            "model": model,
            "max_tokens": max_tokens,
            "messages": messages,
        });
        if !system.is_empty() {
            body["system"] = json!(system.join("\n\n"));
        }
        if let Some(r) = reasoning {
            body["thinking"] = json!({"type": "enabled", "budget_tokens": r.budget()});
        }
        // Extended thinking takes no forced tool: then the model chooses.
        let (tools, choice) = crate::tool_mode(req, reasoning.is_none());
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|t| {
                    json!({"name": t.name, "description": t.description,
                           "input_schema": t.parameters})
                })
                .collect();
            if let Some(choice) = choice {
                body["tool_choice"] = match choice {
                    crate::Choice::Auto => json!({"type": "auto"}),
                    crate::Choice::Any => json!({"type": "any"}),
                    crate::Choice::No => json!({"type": "none"}),
                    crate::Choice::Tool(name) => json!({"type": "tool", "name": name}),
                };
            }
        }
        body
    }

    async fn attempt(
        &self,
        body: &Value,
        model: &str,
        deltas: Option<&dyn Deltas>,
    ) -> Attempt<LlmReply> {
        if let Some(d) = deltas {
            d.start();
        }
        let mut rb = self
            .http
            .post(&self.url)
            .header("anthropic-version", API_VERSION)
            .json(body);
        if let Some(key) = &self.cfg.api_key {
            rb = rb.header("x-api-key", key);
        }
        let resp = match rb.send().await {
            Ok(r) => r,
            Err(e) => {
                return Attempt::Retry {
                    why: describe(&e, &self.url),
                    wait: None,
                    source: Some(Box::new(e)),
                };
            }
        };
        let status = resp.status();
        let wait = retry_after(resp.headers());
        if let (true, Some(deltas)) = (status.is_success(), deltas) {
            return stream::read(resp, deltas, model).await;
        }
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                return Attempt::Retry {
                    why: format!("reading the reply failed: {e}"),
                    wait: None,
                    source: Some(Box::new(e)),
                };
            }
        };
        if status.is_success() {
            return match parse(&bytes, model) {
                Ok(reply) => Attempt::Done(reply),
                Err(why) => Attempt::Fatal(why),
            };
        }
        let why = format!("HTTP {status}: {}", error_words(&bytes));
        // 529 is Anthropic's "overloaded"; 408, 429 and 5xx are worth another attempt too.
        if matches!(status.as_u16(), 408 | 429 | 529) || status.is_server_error() {
            Attempt::Retry {
                why,
                wait,
                source: None,
            }
        } else {
            Attempt::Fatal(format!("Anthropic refused the request: {why}"))
        }
    }
}

/// A reply's recorded reasoning as the content blocks it came in (`thinking` with its
/// signature, `redacted_thinking`); what is not a list of blocks is left out.
fn thinking_blocks(reasoning: Option<Value>) -> Vec<Value> {
    match reasoning {
        Some(Value::Array(blocks)) => blocks
            .into_iter()
            .filter(|b| matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking")))
            .collect(),
        _ => Vec::new(),
    }
}

fn text_block(text: String) -> Value {
    json!({"type": "text", "text": text})
}

/// A tool call's arguments as the object `tool_use.input` must be (arguments that were
/// not a JSON object are kept whole under `arguments`).
fn input_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ if arguments.trim().is_empty() => json!({}),
        _ => json!({"arguments": arguments}),
    }
}

/// `{"type": "error", "error": {"type": ..., "message": ...}}` as `type: message`, or the
/// body's first 300 characters.
fn error_words(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Wrapper {
        error: Inner,
    }
    #[derive(Deserialize)]
    struct Inner {
        #[serde(rename = "type", default)]
        kind: String,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Wrapper>(body) {
        Ok(w) => format!("{}: {}", w.error.kind, w.error.message),
        Err(_) => String::from_utf8_lossy(body).chars().take(300).collect(),
    }
}

#[derive(Deserialize)]
struct Message {
    content: Vec<Block>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: ApiUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct ApiUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
}

fn parse(body: &[u8], model: &str) -> Result<LlmReply, String> {
    let malformed = |why: String| format!("malformed reply from Anthropic: {why}");
    let m: Message = serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut thinking = Vec::new();
    for block in m.content {
        match block {
            Block::Text { text: t } => text.push_str(&t),
            Block::ToolUse { id, name, input } => tool_calls.push(ToolCall {
                id,
                name,
                arguments: input.to_string(),
            }),
            Block::Thinking {
                thinking: t,
                signature,
            } => thinking.push(json!({"type": "thinking", "thinking": t, "signature": signature})),
            Block::RedactedThinking { data } => {
                thinking.push(json!({"type": "redacted_thinking", "data": data}));
            }
            Block::Other => {}
        }
    }
    let mut r = reply(text, tool_calls, m.usage, m.stop_reason.as_deref(), model)?;
    r.reasoning = (!thinking.is_empty()).then_some(Value::Array(thinking));
    Ok(r)
}

/// The reply, whole or put together from a stream.
fn reply(
    text: String,
    tool_calls: Vec<ToolCall>,
    u: ApiUsage,
    stop_reason: Option<&str>,
    model: &str,
) -> Result<LlmReply, String> {
    if text.is_empty() && tool_calls.is_empty() {
        return Err(format!(
            "malformed reply from Anthropic: no text and no tool use (stop_reason {})",
            stop_reason.unwrap_or("none")
        ));
    }
    // Messages counts cache reads and writes apart from `input_tokens`; Baton's input is all.
    let input = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
    Ok(LlmReply {
        text: (!text.is_empty()).then_some(text),
        tool_calls,
        usage: Usage {
            input_tokens: input,
            output_tokens: u.output_tokens,
            total_tokens: input + u.output_tokens,
            cached_input_tokens: u.cache_read_input_tokens,
            // Messages counts thinking in `output_tokens` and does not say how much.
            reasoning_tokens: 0,
        },
        model: Some(format!("anthropic:{model}")),
        cut: stop_reason
            .filter(|r| *r == "max_tokens")
            .map(str::to_owned),
        ..Default::default()
    })
}

#[async_trait::async_trait]
impl Llm for AnthropicLlm {
    fn longest_call(&self) -> Option<Duration> {
        let c = &self.cfg;
        Some(crate::retry::longest(c.timeout, c.max_retries, &c.backoff))
    }

    async fn complete(&self, request: &ChatRequest<'_>) -> Result<LlmReply, LlmError> {
        let Some(model) = request.model else {
            return Err(LlmError::fatal("no Anthropic model named"));
        };
        if self.cfg.api_key.is_none() {
            return Err(LlmError::fatal(
                "ANTHROPIC_API_KEY is not set (on AWS: the model secret's ANTHROPIC_API_KEY)",
            ));
        }
        let mut body = self.body(request, model);
        if request.deltas.is_some() {
            body["stream"] = json!(true);
        }
        let reply = with_retries(self.cfg.max_retries, &self.cfg.backoff, || {
            self.attempt(&body, model, request.deltas)
        })
        .await?;
        Ok(crate::answered(request, reply))
    }
}

mod stream;

#[cfg(test)]
pub(crate) mod tests;
