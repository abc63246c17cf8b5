//! The timeline: the ordered, canonical record of everything that happened in a run.
//!
//! Entries are immutable except a pending tool result, which is resolved in place exactly
//! once. The model sees a projection of the timeline ([`project`]); UIs see all of it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cta::{CtaRequest, CtaResponse, CtaStatus};
use crate::llm::{ChatMessage, ToolCall};
use crate::run::Usage;

/// One record of the timeline. `seq` is dense from 0, so it is also the entry's index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub at: DateTime<Utc>,
    #[serde(flatten)]
    pub body: EntryBody,
}

// Most entries are tool entries: boxing the largest variant would allocate for the common case.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntryBody {
    /// A user turn: the run's prompt or a follow-up message.
    User {
        text: String,
        #[serde(rename = "messageId", default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
    },
    /// One model reply. Its tool calls are the `tool` entries that name it in `replySeq`.
    Assistant {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        usage: Usage,
    },
    Tool(ToolEntry),
    /// Something the run did on its own: a guardrail, an expiry, a cancellation.
    Notice {
        code: String,
        message: String,
    },
    /// A failure that ended the run.
    Error {
        code: String,
        message: String,
    },
}

/// A tool call and its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolEntry {
    /// The tool call id the model gave (or the engine derived).
    pub id: String,
    pub name: String,
    /// The parsed arguments object; the raw string if it did not parse.
    pub input: Value,
    pub result: ToolResult,
    /// The `assistant` entry this call belongs to.
    pub reply_seq: u64,
    /// The CTA this result waits for, when a human has to answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cta: Option<CtaSnapshot>,
    /// The child run this result waits for (`spawn_subagent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_run_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum ToolResult {
    Pending { reason: String },
    Success { output: Value },
    Error { error: String },
}

impl ToolResult {
    pub fn is_pending(&self) -> bool {
        matches!(self, Self::Pending { .. })
    }
    pub fn error(msg: impl Into<String>) -> Self {
        Self::Error { error: msg.into() }
    }
}

/// The CTA as the timeline shows it, beside the result it belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CtaSnapshot {
    pub cta_id: String,
    #[serde(flatten)]
    pub request: CtaRequest,
    pub status: CtaStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<CtaResponse>,
    pub expires_at: DateTime<Utc>,
    /// True when the engine raised it to gate a tool call.
    #[serde(default)]
    pub gate: bool,
}

impl Entry {
    pub fn tool(&self) -> Option<&ToolEntry> {
        match &self.body {
            EntryBody::Tool(t) => Some(t),
            _ => None,
        }
    }
}

/// Entry bodies of this size or more are stored deflated: timelines are read whole on a cold
/// start, and most of a large entry is text that compresses well.
const COMPRESS_FROM: usize = 256;
const DEFLATED: u8 = 0;

/// Why a stored entry could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("entry JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("entry compression: {0}")]
    Io(#[from] std::io::Error),
    #[error("unknown entry encoding (first byte {0:#04x})")]
    Unknown(u8),
}

/// Encodes a value for storage: its JSON, deflated when that is smaller (first byte 0; plain
/// JSON never starts with 0).
pub fn encode<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, CodecError> {
    use std::io::Write;
    let json = serde_json::to_vec(v)?;
    if json.len() < COMPRESS_FROM {
        return Ok(json);
    }
    let mut z = flate2::write::DeflateEncoder::new(vec![DEFLATED], flate2::Compression::fast());
    z.write_all(&json)?;
    let packed = z.finish()?;
    Ok(if packed.len() < json.len() {
        packed
    } else {
        json
    })
}

/// Decodes what [`encode`] wrote.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.first() {
        Some(&DEFLATED) => Ok(serde_json::from_reader(flate2::read::DeflateDecoder::new(
            &bytes[1..],
        ))?),
        Some(b'{' | b'[' | b'"') => Ok(serde_json::from_slice(bytes)?),
        other => Err(CodecError::Unknown(other.copied().unwrap_or_default())),
    }
}

pub fn encode_entry(e: &Entry) -> Result<Vec<u8>, CodecError> {
    encode(e)
}

pub fn decode_entry(bytes: &[u8]) -> Result<Entry, CodecError> {
    decode(bytes)
}

/// The entries of the current batch: the tool entries after the last assistant entry.
pub fn current_batch(timeline: &[Entry]) -> &[Entry] {
    let start = timeline
        .iter()
        .rposition(|e| matches!(e.body, EntryBody::Assistant { .. }))
        .map_or(timeline.len(), |i| i + 1);
    &timeline[start..]
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
                });
            }
            EntryBody::Notice { .. } | EntryBody::Error { .. } => {}
        }
    }
    flush(&mut out, &mut results);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(0, 0).unwrap_or_default()
    }

    #[test]
    fn an_entry_serializes_flat_with_its_type() {
        let e = Entry {
            seq: 3,
            at: at(),
            body: EntryBody::Tool(ToolEntry {
                id: "call_1".into(),
                name: "echo".into(),
                input: json!({"text": "hi"}),
                result: ToolResult::Success {
                    output: json!("hi"),
                },
                reply_seq: 2,
                cta: None,
                child_run_id: None,
            }),
        };
        let v = serde_json::to_value(&e).expect("serializes");
        assert_eq!(v["type"], "tool");
        assert_eq!(v["seq"], 3);
        assert_eq!(v["input"]["text"], "hi");
        assert_eq!(v["result"], json!({"status": "success", "output": "hi"}));
        let back: Entry = serde_json::from_value(v).expect("round-trips");
        assert_eq!(back, e);
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
        for e in &timeline {
            assert_eq!(&decode_entry(&encode_entry(e).unwrap()).unwrap(), e);
        }
        let big = Entry {
            seq: 9,
            at: at(),
            body: EntryBody::User {
                text: "word ".repeat(200),
                message_id: None,
            },
        };
        let packed = encode_entry(&big).unwrap();
        assert_eq!(packed[0], 0, "large entries are deflated");
        assert!(packed.len() < 200);
        assert_eq!(decode_entry(&packed).unwrap(), big);
        assert!(decode_entry(b"x").is_err());
        assert_eq!(current_batch(&timeline[..5]).len(), 3);
    }
}
