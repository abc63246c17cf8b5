//! An OpenAI-compatible chat-completions client over `reqwest` (rustls).
//!
//! OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp and LiteLLM all speak this protocol.
//! Rate limits (429), server errors (5xx) and timeouts are retried with exponential
//! backoff, honouring `Retry-After`; other errors and malformed replies are fatal and
//! say what was wrong. The API key is never logged.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::retry::{Backoff, backoff, describe, retry_after};
use baton_core::config::ModelConfig;
use baton_core::llm::{ChatMessage, ChatRequest, KeySource, Llm, LlmError, LlmReply, ToolCall};
use baton_core::run::Usage;

#[derive(Clone)]
pub struct OpenAiConfig {
    /// Up to and including `/v1` (the client appends `/chat/completions`).
    pub base_url: String,
    pub api_key: Option<String>,
    /// The model when the agent names none.
    pub model: String,
    /// Retries after the first attempt.
    pub max_retries: u32,
    pub backoff: Backoff,
    /// One HTTP attempt's timeout.
    pub timeout: Duration,
    /// The most tokens a reply may have when the request says none
    /// (`BATON_MAX_OUTPUT_TOKENS`); none: no limit is sent.
    pub max_tokens: Option<u32>,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

impl OpenAiConfig {
    /// The client for a configured model endpoint, with the configured attempt timeout and
    /// retries, and the default backoff.
    pub fn from_model(model: &ModelConfig) -> Self {
        Self {
            base_url: model.base_url.clone(),
            api_key: model.api_key.clone(),
            model: model.model.clone(),
            max_retries: model.max_retries,
            backoff: Backoff::default(),
            timeout: Duration::from_secs(u64::from(model.timeout_secs)),
            max_tokens: Some(model.max_output_tokens),
        }
    }
}

pub struct OpenAiLlm {
    http: reqwest::Client,
    cfg: OpenAiConfig,
    url: String,
    /// The key in use: `cfg.api_key` until a refresh replaces it.
    key: RwLock<Option<String>>,
    /// Where to read the key again after a 401 (a rotated secret), and when it last was.
    source: Option<Arc<dyn KeySource>>,
    refreshed: Mutex<Option<Instant>>,
    /// The endpoint takes the output limit as `max_completion_tokens` (OpenAI's own API:
    /// its newer models refuse `max_tokens`), not `max_tokens` (compatible servers: vLLM,
    /// llama.cpp, Ollama). Guessed from the URL, and switched when the endpoint refuses one.
    completion_tokens: std::sync::atomic::AtomicBool,
}

/// A key is read again at most this often, however many 401s come.
pub const KEY_REFRESH_INTERVAL: Duration = Duration::from_secs(60);

impl OpenAiLlm {
    pub fn new(cfg: OpenAiConfig) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .build()
            .map_err(|e| LlmError::fatal_from(format!("cannot build the HTTP client: {e}"), e))?;
        let url = format!("{}/chat/completions", cfg.base_url.trim_end_matches('/'));
        let cfg_is_openai = |url: &str| {
            reqwest::Url::parse(url).is_ok_and(|u| {
                u.host_str()
                    .is_some_and(|h| h == "api.openai.com" || h.ends_with(".openai.azure.com"))
            })
        };
        let completion_tokens = std::sync::atomic::AtomicBool::new(cfg_is_openai(&url));
        Ok(Self {
            http,
            key: RwLock::new(cfg.api_key.clone()),
            cfg,
            url,
            source: None,
            refreshed: Mutex::new(None),
            completion_tokens,
        })
    }

    /// Reads the key again from `source` when the provider answers 401 (at most once a
    /// minute), and retries with the new key: a rotated secret does not fail runs.
    pub fn with_key_source(mut self, source: Option<Arc<dyn KeySource>>) -> Self {
        self.source = source;
        self
    }

    /// After a 401: a fresh key, if the source has one that differs and it is time to ask.
    async fn refreshed_key(&self) -> Option<String> {
        let source = self.source.as_ref()?;
        {
            let mut last = self.refreshed.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < KEY_REFRESH_INTERVAL) {
                return None;
            }
            *last = Some(Instant::now());
        }
        match source.fetch().await {
            Ok(Some(new)) => {
                let mut key = self.key.write().unwrap_or_else(|e| e.into_inner());
                if key.as_deref() == Some(new.as_str()) {
                    return None;
                }
                info!("model API key re-read after a 401");
                *key = Some(new.clone());
                Some(new)
            }
            Ok(None) => None,
            Err(e) => {
                warn!(error = %e, "re-reading the model API key failed");
                None
            }
        }
    }

    /// The name the endpoint takes the output limit by.
    fn limit_param(&self) -> &'static str {
        if self
            .completion_tokens
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            "max_completion_tokens"
        } else {
            "max_tokens"
        }
    }

    /// After a 400 that names the limit's parameter: whether the other name is worth a
    /// try (it is switched to, for this call and the next).
    fn switch_limit_param(&self, refusal: &str) -> bool {
        let sent = self.limit_param();
        let other = if sent == "max_tokens" {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        // "Unsupported parameter: 'max_tokens' … Use 'max_completion_tokens' instead", or
        // "Unrecognized request argument supplied: max_completion_tokens" (an older API
        // version). Neither name holds the other.
        if !refusal.contains(sent) {
            return false;
        }
        self.completion_tokens.store(
            other == "max_completion_tokens",
            std::sync::atomic::Ordering::Relaxed,
        );
        true
    }

    fn body(&self, req: &ChatRequest<'_>) -> Value {
        // Chat Completions takes no image in a tool message: the images the tools of a reply
        // returned follow their results, in a user message of their own.
        let mut seen: Vec<Value> = Vec::new();
        let mut messages: Vec<Value> = Vec::new();
        for m in req.messages() {
            let is_tool = matches!(m, ChatMessage::Tool { .. });
            if let ChatMessage::Tool { images, .. } = &m {
                seen.extend(images.iter().filter_map(|id| req.image(id)).map(|i| {
                    let data = aws_smithy_types::base64::encode(&i.bytes);
                    json!({"type": "image_url",
                           "image_url": {"url": format!("data:{};base64,{data}", i.media_type)}})
                }));
            }
            if !is_tool && !seen.is_empty() {
                messages.push(images_message(std::mem::take(&mut seen)));
            }
            messages.push(Self::message(m));
        }
        if !seen.is_empty() {
            messages.push(images_message(seen));
        }
        self.body_of(req, messages)
    }

    /// One message as Chat Completions takes it.
    fn message(m: ChatMessage) -> Value {
        match m {
            ChatMessage::System { content } => json!({"role": "system", "content": content}),
            ChatMessage::User { content } => json!({"role": "user", "content": content}),
            // OpenAI keeps a reply's reasoning itself: nothing of it is given back.
            ChatMessage::Assistant {
                content,
                tool_calls,
                ..
            } => {
                let mut v = json!({"role": "assistant", "content": content});
                if !tool_calls.is_empty() {
                    v["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments}})
                        })
                        .collect();
                }
                v
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
                ..
            } => {
                json!({"role": "tool", "tool_call_id": tool_call_id, "content": content})
            }
        }
    }

    /// The request's body around its `messages`.
    fn body_of(&self, req: &ChatRequest<'_>, messages: Vec<Value>) -> Value {
        let mut body = json!({
            "model": req.model.unwrap_or(&self.cfg.model),
            "messages": messages,
        });
        if req.deltas.is_some() {
            // The usage comes in a last chunk of its own (OpenAI, vLLM, Ollama, LiteLLM).
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        if let Some(limit) = req.max_output_tokens.or(self.cfg.max_tokens) {
            body[self.limit_param()] = json!(limit);
        }
        if !req.tools.is_empty() {
            body["tools"] = req
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}})
                })
                .collect();
            use baton_core::llm::ToolChoice;
            match &req.controls.tool_choice {
                None => {}
                Some(ToolChoice::Auto) => body["tool_choice"] = json!("auto"),
                Some(ToolChoice::Required) => body["tool_choice"] = json!("required"),
                Some(ToolChoice::None) => body["tool_choice"] = json!("none"),
                Some(ToolChoice::Tool { tool }) => {
                    body["tool_choice"] = json!({"type": "function", "function": {"name": tool}});
                }
            }
        }
        if let Some(r) = &req.controls.reasoning {
            body["reasoning_effort"] = json!(r.effort().as_str());
        }
        if let Some(output) = &req.controls.output {
            // Not `strict`: that takes only schemas whose every property is required and
            // closed; Baton validates the answer against the schema as given, either way.
            body["response_format"] = json!({"type": "json_schema", "json_schema": {
                "name": output.name, "description": output.description,
                "schema": output.parameters, "strict": false}});
        }
        body
    }
}

/// The images tools returned, as a user message after their results.
fn images_message(images: Vec<Value>) -> Value {
    let mut parts =
        vec![json!({"type": "text", "text": "The images the tool calls above returned:"})];
    parts.extend(images);
    json!({"role": "user", "content": parts})
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<ApiUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: ApiMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ApiMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ApiToolCall>>,
}

#[derive(Deserialize)]
struct ApiToolCall {
    id: String,
    function: ApiFunction,
}

#[derive(Deserialize)]
struct ApiFunction {
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Deserialize)]
pub(super) struct ApiUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    total_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    /// Counted in `completion_tokens` too.
    #[serde(default)]
    reasoning_tokens: u64,
}

impl ApiUsage {
    pub(super) fn into_usage(self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            total_tokens: self
                .total_tokens
                .unwrap_or(self.prompt_tokens + self.completion_tokens),
            cached_input_tokens: self.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
            reasoning_tokens: self
                .completion_tokens_details
                .map_or(0, |d| d.reasoning_tokens),
        }
    }
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: u64,
}

/// The reply to a request for `model` (the id sent, without the `openai:` prefix).
fn parse(body: &[u8], model: &str) -> Result<LlmReply, LlmError> {
    let malformed =
        |why: String| LlmError::fatal(format!("malformed reply from the model provider: {why}"));
    let c: Completion = serde_json::from_slice(body).map_err(|e| {
        LlmError::fatal_from(format!("malformed reply from the model provider: {e}"), e)
    })?;
    let Some(choice) = c.choices.into_iter().next() else {
        return Err(malformed("no choices".into()));
    };
    let usage = c.usage.map_or_else(Usage::default, ApiUsage::into_usage);
    let tool_calls: Vec<ToolCall> = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|t| ToolCall {
            id: t.id,
            name: t.function.name,
            arguments: t.function.arguments,
        })
        .collect();
    let finish = choice.finish_reason.as_deref();
    reply(choice.message.content, tool_calls, usage, finish, model)
}

pub(super) fn reply(
    text: Option<String>,
    tool_calls: Vec<ToolCall>,
    usage: Usage,
    finish_reason: Option<&str>,
    model: &str,
) -> Result<LlmReply, LlmError> {
    let text = text.filter(|t| !t.is_empty());
    if text.is_none() && tool_calls.is_empty() {
        return Err(LlmError::fatal(
            "malformed reply from the model provider: the message has neither content nor tool calls",
        ));
    }
    Ok(LlmReply {
        text,
        tool_calls,
        usage,
        model: Some(format!("openai:{model}")),
        cut: finish_reason.filter(|r| *r == "length").map(str::to_owned),
        ..Default::default()
    })
}

#[async_trait::async_trait]
impl Llm for OpenAiLlm {
    fn longest_call(&self) -> Option<Duration> {
        let c = &self.cfg;
        Some(crate::retry::longest(c.timeout, c.max_retries, &c.backoff))
    }

    async fn complete(&self, request: &ChatRequest<'_>) -> Result<LlmReply, LlmError> {
        let mut body = self.body(request);
        let model = request.model.unwrap_or(&self.cfg.model);
        let mut attempt = 0;
        let mut key_refreshed = false;
        let mut limit_switched = false;
        loop {
            if let Some(d) = request.deltas {
                d.start();
            }
            let mut rb = self.http.post(&self.url).json(&body);
            let key = self.key.read().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(key) = key {
                rb = rb.bearer_auth(key);
            }
            let (wait, why, source): (
                Option<Duration>,
                String,
                Option<Box<dyn std::error::Error + Send + Sync>>,
            ) = match (rb.send().await, request.deltas) {
                (Ok(resp), Some(deltas)) if resp.status().is_success() => {
                    match read_stream(resp, deltas, model).await {
                        Ok(reply) => return reply,
                        Err(why) if attempt >= self.cfg.max_retries => {
                            return Err(LlmError::Unavailable {
                                message: format!("gave up after {} attempts: {why}", attempt + 1),
                                source: None,
                            });
                        }
                        Err(why) => {
                            warn!(attempt = attempt + 1, %why, "the model's stream broke; retrying");
                            attempt += 1;
                            tokio::time::sleep(backoff(&self.cfg.backoff, attempt - 1)).await;
                            continue;
                        }
                    }
                }
                (Ok(resp), _) => {
                    let status = resp.status();
                    let hinted = retry_after(resp.headers());
                    let bytes = match resp.bytes().await {
                        Ok(b) => b,
                        Err(e) => {
                            let why = format!("reading the reply failed: {e}");
                            if attempt >= self.cfg.max_retries {
                                return Err(LlmError::Unavailable {
                                    message: why,
                                    source: Some(Box::new(e)),
                                });
                            }
                            attempt += 1;
                            tokio::time::sleep(backoff(&self.cfg.backoff, attempt - 1)).await;
                            continue;
                        }
                    };
                    if status.is_success() {
                        return parse(&bytes, model);
                    }
                    let snippet: String =
                        String::from_utf8_lossy(&bytes).chars().take(300).collect();
                    let why = format!("HTTP {status}: {snippet}");
                    if !(status.as_u16() == 429
                        || status.as_u16() == 408
                        || status.is_server_error())
                    {
                        if status.as_u16() == 401
                            && !key_refreshed
                            && self.refreshed_key().await.is_some()
                        {
                            key_refreshed = true;
                            continue;
                        }
                        // The output limit under the other name this endpoint takes.
                        if status.as_u16() == 400
                            && !limit_switched
                            && self.switch_limit_param(&String::from_utf8_lossy(&bytes))
                        {
                            limit_switched = true;
                            info!(
                                param = self.limit_param(),
                                "the endpoint takes the output limit by another name"
                            );
                            body = self.body(request);
                            continue;
                        }
                        return Err(LlmError::fatal(format!(
                            "the model provider refused the request: {why}"
                        )));
                    }
                    (hinted, why, None)
                }
                (Err(e), _) => (None, describe(&e, &self.url), Some(Box::new(e))),
            };
            if attempt >= self.cfg.max_retries {
                return Err(LlmError::Unavailable {
                    message: format!("gave up after {} attempts: {why}", attempt + 1),
                    source,
                });
            }
            let delay = wait
                .unwrap_or_else(|| backoff(&self.cfg.backoff, attempt))
                .min(self.cfg.backoff.max);
            warn!(attempt = attempt + 1, delay_ms = delay.as_millis() as u64, %why, "model call failed; retrying");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }
}

mod stream;
use stream::read_stream;

#[cfg(test)]
pub(crate) mod tests;
