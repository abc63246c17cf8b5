//! The model port: what a think sends, what comes back, and how a timeline is projected
//! into the chat a model sees.
//!
//! Providers are in the `baton-llm` crate (OpenAI-compatible, scripted); this module knows
//! none of them. The projection lives here, on the model's side: the timeline is the
//! record, and knows nothing of chat formats.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::run::Usage;
use crate::timeline::{Entry, EntryBody, ToolResult};

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
    /// The run's timeline: the whole of it for a model that [`Llm::reads_history`], else
    /// the step's window.
    pub history: &'a [Entry],
}

impl ChatRequest<'_> {
    /// The chat messages: the system prompt and the projected timeline.
    pub fn messages(&self) -> Vec<ChatMessage> {
        project(self.system, self.history)
    }
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

/// One chat completion with tools.
#[async_trait::async_trait]
pub trait Llm: Send + Sync {
    async fn complete(&self, request: &ChatRequest<'_>) -> Result<LlmReply, LlmError>;

    /// Whether the model reads the conversation ([`ChatRequest::history`]). A step reads a
    /// run's whole history only for a model that does; one that does not (the scripted
    /// model) is handed the step's window of it.
    fn reads_history(&self) -> bool {
        true
    }
}

/// A model API key that can change while a process runs (a rotated secret): read again
/// when the provider refuses the key in hand.
#[async_trait::async_trait]
pub trait KeySource: Send + Sync {
    /// The current key, read afresh.
    async fn fetch(&self) -> Result<Option<String>, crate::error::PortError>;
}

/// The model of a host that never thinks (the `api` and `cta` functions): every call is a
/// fatal error, so a misrouted step fails loudly instead of hanging.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoModel;

#[async_trait::async_trait]
impl Llm for NoModel {
    async fn complete(&self, _: &ChatRequest<'_>) -> Result<LlmReply, LlmError> {
        Err(LlmError::fatal(
            "this host does not call models; steps run in the orchestrator and subagent functions",
        ))
    }
}

/// Projects the timeline to the chat messages a model sees.
///
/// Notices and errors are display-only. Tool calls are grouped under the reply that made
/// them, each followed by its result. A result still pending is never projected (the engine
/// does not think while one is pending).
pub fn project(system: &str, timeline: &[Entry]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(timeline.len() + 1);
    if !system.is_empty() {
        out.push(ChatMessage::System {
            content: system.to_owned(),
        });
    }
    let mut results: Vec<ChatMessage> = Vec::new();
    let flush = |out: &mut Vec<ChatMessage>, results: &mut Vec<ChatMessage>| out.append(results);
    for e in timeline {
        match &e.body {
            EntryBody::User { text, .. } => {
                flush(&mut out, &mut results);
                out.push(ChatMessage::User {
                    content: text.clone(),
                });
            }
            EntryBody::Assistant { text, .. } => {
                flush(&mut out, &mut results);
                out.push(ChatMessage::Assistant {
                    content: text.clone(),
                    tool_calls: Vec::new(),
                });
            }
            EntryBody::Tool(t) => {
                if let Some(ChatMessage::Assistant { tool_calls, .. }) = out.last_mut() {
                    tool_calls.push(ToolCall {
                        id: t.id.clone(),
                        name: t.name.clone(),
                        arguments: match &t.input {
                            Value::String(raw) => raw.clone(),
                            v => v.to_string(),
                        },
                    });
                }
                let is_error = matches!(t.result, ToolResult::Error { .. });
                let content = match &t.result {
                    ToolResult::Success {
                        output: Value::String(s),
                    } => s.clone(),
                    ToolResult::Success { output } => output.to_string(),
                    ToolResult::Error { error } => {
                        serde_json::json!({ "error": error }).to_string()
                    }
                    ToolResult::Pending { .. } => continue,
                };
                results.push(ChatMessage::Tool {
                    tool_call_id: t.id.clone(),
                    content,
                    is_error,
                });
            }
            // A file's summary is all the model sees of it, with its call's result.
            EntryBody::File(f) => {
                let call = |m: &&mut ChatMessage| matches!(m, ChatMessage::Tool { tool_call_id, .. } if *tool_call_id == f.call_id);
                if let Some(ChatMessage::Tool { content, .. }) = results.iter_mut().rev().find(call)
                {
                    content.push_str(&format!(
                        "\n[file `{}` ({}, {} bytes): {}]",
                        f.name, f.media_type, f.size, f.summary
                    ));
                }
            }
            EntryBody::Notice { .. }
            | EntryBody::Error { .. }
            | EntryBody::Queued { .. }
            | EntryBody::Widget { .. } => {}
        }
    }
    flush(&mut out, &mut results);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{ToolEntry, current_batch};
    use chrono::{DateTime, Utc};
    use serde_json::json;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(0, 0).unwrap_or_default()
    }

    #[test]
    fn projection_groups_calls_under_their_reply_and_skips_notices() {
        let tool = |seq, id: &str, result| Entry {
            seq,
            at: at(),
            body: EntryBody::Tool(ToolEntry {
                id: id.into(),
                name: "echo".into(),
                input: json!({"text": id}),
                result,
                reply_seq: 1,
                cta: None,
                child_run_id: None,
                plan: None,
            }),
        };
        let timeline = vec![
            Entry {
                seq: 0,
                at: at(),
                body: EntryBody::User {
                    text: "go".into(),
                    message_id: None,
                },
            },
            Entry {
                seq: 1,
                at: at(),
                body: EntryBody::Assistant {
                    text: None,
                    usage: Usage::default(),
                    model: None,
                    cost_usd: None,
                    operation: Default::default(),
                },
            },
            tool(2, "a", ToolResult::Success { output: json!("a") }),
            tool(3, "b", ToolResult::error("boom")),
            Entry {
                seq: 4,
                at: at(),
                body: EntryBody::Notice {
                    code: "x".into(),
                    message: "y".into(),
                },
            },
            Entry {
                seq: 5,
                at: at(),
                body: EntryBody::Assistant {
                    text: Some("done".into()),
                    usage: Usage::default(),
                    model: None,
                    cost_usd: None,
                    operation: Default::default(),
                },
            },
        ];
        let msgs = project("sys", &timeline);
        assert_eq!(msgs.len(), 6, "{msgs:?}");
        assert!(matches!(&msgs[0], ChatMessage::System { content } if content == "sys"));
        match &msgs[2] {
            ChatMessage::Assistant { tool_calls, .. } => {
                assert_eq!(tool_calls.len(), 2);
                assert_eq!(tool_calls[1].arguments, r#"{"text":"b"}"#);
            }
            m => panic!("expected assistant, got {m:?}"),
        }
        assert!(matches!(&msgs[4], ChatMessage::Tool { content, .. } if content.contains("boom")));
        assert!(matches!(&msgs[5], ChatMessage::Assistant { content: Some(t), .. } if t == "done"));
        assert_eq!(current_batch(&timeline).len(), 0);
        assert_eq!(current_batch(&timeline[..5]).len(), 3);
    }
}
