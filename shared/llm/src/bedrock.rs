//! Amazon Bedrock's Converse API through `aws-sdk-bedrockruntime`: the function's IAM role
//! signs the request, no key is kept anywhere.
//!
//! The projected chat maps onto Converse's shape like Anthropic's: a `system` block, and
//! alternating user/assistant messages of content blocks (`toolUse`, `toolResult`). The
//! SDK's own retries are off (see [`client`]): throttling and the service's transient
//! errors are retried here, with backoff and jitter, like every provider; access,
//! validation and unknown-model errors are fatal, in Bedrock's words.

use std::collections::HashMap;

use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::types::{
    AnyToolChoice, AutoToolChoice, ContentBlock, ConversationRole, ConverseOutput, ImageBlock,
    ImageFormat, ImageSource, InferenceConfiguration, Message, ReasoningContentBlock,
    ReasoningTextBlock, SpecificToolChoice, SystemContentBlock, Tool, ToolChoice,
    ToolConfiguration, ToolInputSchema, ToolResultBlock, ToolResultContentBlock, ToolResultStatus,
    ToolSpecification, ToolUseBlock,
};
use aws_smithy_types::{Document, Number};
use serde_json::Value;

use crate::retry::{Attempt, Backoff, with_retries};
use baton_core::config::ModelConfig;
use baton_core::llm::{ChatMessage, ChatRequest, Deltas, Llm, LlmError, LlmReply, ToolCall};
use baton_core::run::Usage;

#[derive(Debug, Clone)]
pub struct BedrockConfig {
    pub max_tokens: u32,
    pub max_retries: u32,
    pub backoff: Backoff,
    /// One attempt's timeout: the one [`client`] was given.
    pub timeout: std::time::Duration,
}

impl BedrockConfig {
    pub fn from_model(model: &ModelConfig) -> Self {
        Self {
            max_tokens: model.max_output_tokens,
            max_retries: model.max_retries,
            backoff: Backoff::default(),
            timeout: std::time::Duration::from_secs(u64::from(model.timeout_secs)),
        }
    }
}

/// A Bedrock Runtime client from the host's SDK config, with the SDK's retries off (this
/// client retries, so that every provider backs off the same way) and `timeout` per attempt.
pub fn client(
    sdk: &aws_sdk_bedrockruntime::config::Builder,
    timeout: std::time::Duration,
) -> aws_sdk_bedrockruntime::Client {
    let conf = sdk
        .clone()
        .retry_config(aws_sdk_bedrockruntime::config::retry::RetryConfig::disabled())
        .timeout_config(
            aws_sdk_bedrockruntime::config::timeout::TimeoutConfig::builder()
                .operation_attempt_timeout(timeout)
                .build(),
        )
        .build();
    aws_sdk_bedrockruntime::Client::from_conf(conf)
}

pub struct BedrockLlm {
    client: aws_sdk_bedrockruntime::Client,
    cfg: BedrockConfig,
}

impl BedrockLlm {
    pub fn new(client: aws_sdk_bedrockruntime::Client, cfg: BedrockConfig) -> Self {
        Self { client, cfg }
    }

    /// The reply's limit: the request's, else the configured one.
    fn inference(&self, limit: Option<u32>) -> InferenceConfiguration {
        let limit = limit.unwrap_or(self.cfg.max_tokens);
        InferenceConfiguration::builder()
            .max_tokens(limit.min(i32::MAX as u32) as i32)
            .build()
    }

    async fn attempt(
        &self,
        model: &str,
        parts: &Parts,
        deltas: Option<&dyn Deltas>,
        limit: Option<u32>,
    ) -> Attempt<LlmReply> {
        let Parts {
            system,
            messages,
            tools,
            fields,
        } = parts;
        if let Some(deltas) = deltas {
            deltas.start();
            let mut call = self
                .client
                .converse_stream()
                .model_id(model)
                .set_system(Some(system.to_vec()))
                .set_messages(Some(messages.to_vec()))
                .set_additional_model_request_fields(fields.clone())
                .inference_config(self.inference(limit));
            if let Some(tools) = tools {
                call = call.tool_config(tools.clone());
            }
            return match call.send().await {
                Ok(out) => stream::read(out, deltas, model).await,
                Err(e) => classify(e),
            };
        }
        let mut call = self
            .client
            .converse()
            .model_id(model)
            .set_system(Some(system.to_vec()))
            .set_messages(Some(messages.to_vec()))
            .set_additional_model_request_fields(fields.clone())
            .inference_config(self.inference(limit));
        if let Some(tools) = tools {
            call = call.tool_config(tools.clone());
        }
        match call.send().await {
            Ok(out) => match reply(out, model) {
                Ok(r) => Attempt::Done(r),
                Err(why) => Attempt::Fatal(why),
            },
            Err(e) => classify(e),
        }
    }
}

/// The error codes of Bedrock's transient faults (throttling, a model not ready or slow, a
/// broken stream): worth another attempt.
const TRANSIENT: [&str; 6] = [
    "ThrottlingException",
    "ServiceUnavailableException",
    "InternalServerException",
    "ModelNotReadyException",
    "ModelTimeoutException",
    "ModelStreamErrorException",
];

/// A fault Bedrock named: another attempt if it is transient, else fatal, in its words.
fn verdict(code: &str, message: Option<&str>) -> Attempt<LlmReply> {
    let words = format!("{code}: {}", message.unwrap_or("(no message)"));
    if TRANSIENT.contains(&code) {
        Attempt::Retry {
            why: format!("Bedrock: {words}"),
            wait: None,
            source: None,
        }
    } else {
        Attempt::Fatal(format!("Bedrock refused the request: {words}"))
    }
}

/// Throttling and the service's transient faults are retried; the rest is fatal (of
/// `Converse`, `ConverseStream`, and an exception in the stream).
fn classify<E, R>(e: SdkError<E, R>) -> Attempt<LlmReply>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match e {
        SdkError::ServiceError(se) => {
            let err = se.err();
            verdict(err.code().unwrap_or("error"), err.message())
        }
        SdkError::ConstructionFailure(_) => Attempt::Fatal(format!(
            "cannot build the Bedrock request: {}",
            aws_sdk_bedrockruntime::error::DisplayErrorContext(&e)
        )),
        other => Attempt::Retry {
            why: format!(
                "cannot reach Bedrock: {}",
                aws_sdk_bedrockruntime::error::DisplayErrorContext(&other)
            ),
            wait: None,
            source: Some(Box::new(other)),
        },
    }
}

fn reply(
    out: aws_sdk_bedrockruntime::operation::converse::ConverseOutput,
    model: &str,
) -> Result<LlmReply, String> {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut reasoning = Vec::new();
    if let Some(ConverseOutput::Message(m)) = out.output() {
        for block in m.content() {
            match block {
                ContentBlock::Text(t) => text.push_str(t),
                ContentBlock::ToolUse(t) => tool_calls.push(ToolCall {
                    id: t.tool_use_id().to_owned(),
                    name: t.name().to_owned(),
                    arguments: to_json(t.input()).to_string(),
                }),
                ContentBlock::ReasoningContent(ReasoningContentBlock::ReasoningText(r)) => {
                    reasoning
                        .push(serde_json::json!({"text": r.text(), "signature": r.signature()}));
                }
                ContentBlock::ReasoningContent(ReasoningContentBlock::RedactedContent(b)) => {
                    reasoning.push(serde_json::json!({"redacted": aws_smithy_types::base64::encode(b.as_ref())}));
                }
                _ => {}
            }
        }
    }
    let mut r = assemble(
        text,
        tool_calls,
        out.stop_reason().as_str(),
        out.usage(),
        model,
    )?;
    r.reasoning = (!reasoning.is_empty()).then_some(Value::Array(reasoning));
    Ok(r)
}

/// A reply's recorded reasoning as the blocks Converse takes back: `{text, signature}` or
/// `{redacted}` (base64), each a `reasoningContent` block.
fn reasoning_blocks(reasoning: Option<Value>) -> Vec<ContentBlock> {
    let Some(Value::Array(blocks)) = reasoning else {
        return Vec::new();
    };
    blocks
        .iter()
        .filter_map(|b| {
            if let Some(data) = b["redacted"].as_str() {
                let bytes = aws_smithy_types::base64::decode(data).ok()?;
                return Some(ReasoningContentBlock::RedactedContent(bytes.into()));
            }
            let text = ReasoningTextBlock::builder()
                .text(b["text"].as_str()?)
                .set_signature(b["signature"].as_str().map(str::to_owned))
                .build()
                .ok()?;
            Some(ReasoningContentBlock::ReasoningText(text))
        })
        .map(ContentBlock::ReasoningContent)
        .collect()
}

/// The reply, whole or put together from a stream.
fn assemble(
    text: String,
    tool_calls: Vec<ToolCall>,
    stop_reason: &str,
    usage: Option<&aws_sdk_bedrockruntime::types::TokenUsage>,
    model: &str,
) -> Result<LlmReply, String> {
    if text.is_empty() && tool_calls.is_empty() {
        return Err(format!(
            "malformed reply from Bedrock: no text and no tool use (stopReason {stop_reason})"
        ));
    }
    let usage = usage.map_or_else(Usage::default, |u| {
        let n = |v: i32| u64::try_from(v).unwrap_or(0);
        let cached = u.cache_read_input_tokens().map_or(0, n);
        let written = u.cache_write_input_tokens().map_or(0, n);
        let input = n(u.input_tokens()) + cached + written;
        Usage {
            input_tokens: input,
            output_tokens: n(u.output_tokens()),
            total_tokens: input + n(u.output_tokens()),
            cached_input_tokens: cached,
            // Converse counts reasoning in `outputTokens` and does not say how much.
            reasoning_tokens: 0,
        }
    });
    Ok(LlmReply {
        text: (!text.is_empty()).then_some(text),
        tool_calls,
        usage,
        model: Some(format!("bedrock:{model}")),
        cut: (stop_reason == "max_tokens").then(|| stop_reason.to_owned()),
        ..Default::default()
    })
}

/// What a Converse request is made of.
struct Parts {
    system: Vec<SystemContentBlock>,
    messages: Vec<Message>,
    tools: Option<ToolConfiguration>,
    /// `additionalModelRequestFields`: the model's own settings (its reasoning).
    fields: Option<Document>,
}

/// The request's system blocks, messages, tool configuration and model settings.
fn request(req: &ChatRequest<'_>) -> Result<Parts, String> {
    let mut system = Vec::new();
    let mut turns: Vec<(ConversationRole, Vec<ContentBlock>)> = Vec::new();
    for m in req.messages() {
        let (role, blocks) = match m {
            ChatMessage::System { content } => {
                system.push(SystemContentBlock::Text(content));
                continue;
            }
            ChatMessage::User { content } => {
                (ConversationRole::User, vec![ContentBlock::Text(content)])
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
                reasoning,
            } => {
                // The reply's reasoning first, signed, as Converse gave it.
                let mut blocks = reasoning_blocks(reasoning);
                blocks.extend(
                    content
                        .into_iter()
                        .filter(|t| !t.is_empty())
                        .map(ContentBlock::Text),
                );
                for c in tool_calls {
                    let input = match serde_json::from_str::<Value>(&c.arguments) {
                        Ok(v @ Value::Object(_)) => v,
                        _ => serde_json::json!({"arguments": c.arguments}),
                    };
                    let block = ToolUseBlock::builder()
                        .tool_use_id(c.id)
                        .name(c.name)
                        .input(to_document(&input))
                        .build()
                        .map_err(|e| e.to_string())?;
                    blocks.push(ContentBlock::ToolUse(block));
                }
                (ConversationRole::Assistant, blocks)
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
                is_error,
                images,
            } => {
                // The images the model is given go in the result, after its text.
                let mut parts = vec![ToolResultContentBlock::Text(content)];
                for image in images.iter().filter_map(|id| req.image(id)) {
                    let format = match image.media_type.as_str() {
                        "image/png" => ImageFormat::Png,
                        "image/jpeg" => ImageFormat::Jpeg,
                        "image/gif" => ImageFormat::Gif,
                        _ => ImageFormat::Webp,
                    };
                    let block = ImageBlock::builder()
                        .format(format)
                        .source(ImageSource::Bytes(image.bytes.clone().into()))
                        .build()
                        .map_err(|e| e.to_string())?;
                    parts.push(ToolResultContentBlock::Image(block));
                }
                let block = ToolResultBlock::builder()
                    .tool_use_id(tool_call_id)
                    .set_content(Some(parts))
                    .status(if is_error {
                        ToolResultStatus::Error
                    } else {
                        ToolResultStatus::Success
                    })
                    .build()
                    .map_err(|e| e.to_string())?;
                (
                    ConversationRole::User,
                    vec![ContentBlock::ToolResult(block)],
                )
            }
        };
        match turns.last_mut() {
            Some((last, b)) if *last == role => b.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages = turns
        .into_iter()
        .map(|(role, content)| {
            Message::builder()
                .role(role)
                .set_content(Some(content))
                .build()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let reasoning = req.controls.reasoning.as_ref();
    let model = req.model.unwrap_or_default();
    // Claude's extended thinking takes no forced tool: then the model chooses.
    let (offered, choice) = crate::tool_mode(req, reasoning.is_none() || !is_claude(model));
    let tools = if offered.is_empty() {
        None
    } else {
        let mut b = ToolConfiguration::builder();
        for t in offered {
            let spec = ToolSpecification::builder()
                .name(&t.name)
                .description(&t.description)
                .input_schema(ToolInputSchema::Json(to_document(&t.parameters)))
                .build()
                .map_err(|e| e.to_string())?;
            b = b.tools(Tool::ToolSpec(spec));
        }
        // Converse has no `none`: the tools stay offered (a conversation with tool use
        // must have them), and the model chooses.
        let choice = match choice {
            Some(crate::Choice::Any) => Some(ToolChoice::Any(AnyToolChoice::builder().build())),
            Some(crate::Choice::Tool(name)) => Some(ToolChoice::Tool(
                SpecificToolChoice::builder()
                    .name(name)
                    .build()
                    .map_err(|e| e.to_string())?,
            )),
            Some(crate::Choice::Auto) => Some(ToolChoice::Auto(AutoToolChoice::builder().build())),
            Some(crate::Choice::No) | None => None,
        };
        Some(
            b.set_tool_choice(choice)
                .build()
                .map_err(|e| e.to_string())?,
        )
    };
    // Claude on Bedrock thinks with a budget; Amazon's reasoning models take an effort.
    let fields = reasoning.map(|r| {
        to_document(&if is_claude(model) {
            serde_json::json!({"thinking": {"type": "enabled", "budget_tokens": r.budget()}})
        } else {
            serde_json::json!({"reasoningConfig": {"type": "enabled",
                               "maxReasoningEffort": r.effort().as_str()}})
        })
    });
    Ok(Parts {
        system,
        messages,
        tools,
        fields,
    })
}

/// An Anthropic model on Bedrock (`anthropic.…`, or a cross-region profile `us.anthropic.…`).
fn is_claude(model: &str) -> bool {
    model.starts_with("anthropic.") || model.contains(".anthropic.")
}

fn to_document(v: &Value) -> Document {
    match v {
        Value::Null => Document::Null,
        Value::Bool(b) => Document::Bool(*b),
        Value::Number(n) => Document::Number(if let Some(u) = n.as_u64() {
            Number::PosInt(u)
        } else if let Some(i) = n.as_i64() {
            Number::NegInt(i)
        } else {
            Number::Float(n.as_f64().unwrap_or(0.0))
        }),
        Value::String(s) => Document::String(s.clone()),
        Value::Array(a) => Document::Array(a.iter().map(to_document).collect()),
        Value::Object(o) => Document::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), to_document(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn to_json(d: &Document) -> Value {
    match d {
        Document::Null => Value::Null,
        Document::Bool(b) => Value::Bool(*b),
        Document::Number(Number::PosInt(u)) => Value::from(*u),
        Document::Number(Number::NegInt(i)) => Value::from(*i),
        Document::Number(Number::Float(f)) => Value::from(*f),
        Document::String(s) => Value::String(s.clone()),
        Document::Array(a) => Value::Array(a.iter().map(to_json).collect()),
        Document::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), to_json(v))).collect())
        }
    }
}

#[async_trait::async_trait]
impl Llm for BedrockLlm {
    fn longest_call(&self) -> Option<std::time::Duration> {
        let c = &self.cfg;
        Some(crate::retry::longest(c.timeout, c.max_retries, &c.backoff))
    }

    async fn complete(&self, req: &ChatRequest<'_>) -> Result<LlmReply, LlmError> {
        let Some(model) = req.model else {
            return Err(LlmError::fatal("no Bedrock model named"));
        };
        let parts = request(req).map_err(|e| {
            LlmError::fatal_from(format!("cannot build the Bedrock request: {e}"), e)
        })?;
        // Claude's thinking counts toward `maxTokens`, which must be above its budget.
        let limit = match (&req.controls.reasoning, is_claude(model)) {
            (Some(r), true) => Some(
                req.max_output_tokens
                    .unwrap_or(self.cfg.max_tokens)
                    .saturating_add(r.budget()),
            ),
            _ => req.max_output_tokens,
        };
        let reply = with_retries(self.cfg.max_retries, &self.cfg.backoff, || {
            self.attempt(model, &parts, req.deltas, limit)
        })
        .await?;
        Ok(crate::answered(req, reply))
    }
}

mod stream;

#[cfg(test)]
pub(crate) mod tests;
