//! The model port's data: what a think sends and what comes back.
//!
//! Providers live in submodules: [`openai`] (any OpenAI-compatible chat-completions server)
//! and [`scripted`] (replays a JSON file of replies, for demos and tests).

pub mod openai;
pub mod scripted;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::run::Usage;
use crate::timeline::Entry;

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

/// One think: the engine's request, with the history the provider projects if it needs to.
///
/// The history is borrowed, not projected up front: projecting costs O(history), and a
/// provider that doesn't need it (the scripted model) shouldn't pay for it.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    pub run_id: &'a str,
    pub agent: &'a str,
    /// How many thinks this run has had before this one (from 0).
    pub think_index: u32,
    pub model: Option<&'a str>,
    pub system: &'a str,
    pub tools: &'a [ToolSpec],
    pub history: &'a [Entry],
}

impl ChatRequest<'_> {
    /// The chat messages: the system prompt and the projected timeline.
    pub fn messages(&self) -> Vec<ChatMessage> {
        crate::timeline::project(self.system, self.history)
    }
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LlmReply {
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
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
    #[error("{0}")]
    Fatal(String),
}

/// One chat completion with tools.
#[async_trait::async_trait]
pub trait Llm: Send + Sync {
    async fn complete(&self, request: &ChatRequest<'_>) -> Result<LlmReply, LlmError>;
}
