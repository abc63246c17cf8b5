//! What a model is told and answers, as data: the chat it sees (projected from a timeline
//! by `project`), the tools it is offered, its reply and how a call can fail. The model port itself (the
//! `Llm` trait a provider implements) is `baton-core`'s.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of the chat a model sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum ChatMessage {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        content: Option<String>,
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        content: String,
        /// The tool failed (providers that can say so are told).
        #[serde(default)]
        is_error: bool,
    },
}

/// A tool call as the model made it: the arguments are the model's raw JSON string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A tool as the model is told about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LlmReply {
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    /// The model that answered, `provider:model-id` (for its price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The reply stopped at its output limit: the provider's reason (`length`,
    /// `max_tokens`). Its text is cut, and so may be its last tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<String>,
    /// How long the call took, and until its first streamed piece (set by the service, not
    /// by providers).
    #[serde(skip)]
    pub latency_ms: Option<u64>,
    #[serde(skip)]
    pub first_token_ms: Option<u64>,
}

/// A model call that did not give a reply.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Worth trying again later (rate limits, 5xx, timeouts), after the client's own retries.
    #[error("model provider unavailable: {message}")]
    Unavailable {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Trying again will not help (bad request, auth, a malformed reply, a script run out).
    /// `message` is what the run's timeline says.
    #[error("{message}")]
    Fatal {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl LlmError {
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::Fatal {
            message: message.into(),
            source: None,
        }
    }

    /// A fatal error caused by `source` (its text is in `message` too, for the timeline).
    pub fn fatal_from(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Fatal {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// Token usage, per model call and summed per run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Every input token, read from the provider's prompt cache or not.
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    /// The part of `input_tokens` read from the prompt cache (billed at a lower price).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
