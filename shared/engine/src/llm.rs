//! What a model is told and answers, as data: the chat it sees (projected from a timeline),
//! the tools it is offered, its reply and how a call can fail. The model port itself (the
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

mod project;

pub use project::{fit, model_bytes, project, starts_group};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Entry;
    use crate::timeline::{EntryBody, ToolEntry, ToolResult, current_batch};
    use chrono::{DateTime, Utc};
    use serde_json::json;
    use std::borrow::Cow;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(0, 0).unwrap_or_default()
    }

    #[test]
    fn projection_groups_calls_under_their_reply_and_skips_notices() {
        let tool = |seq, id: &str, result| Entry {
            seq,
            at: at(),
            body: EntryBody::Tool(ToolEntry::new(id, "echo", json!({"text": id}), result, 1)),
        };
        let timeline = vec![
            Entry {
                seq: 0,
                at: at(),
                body: EntryBody::user("go"),
            },
            Entry {
                seq: 1,
                at: at(),
                body: EntryBody::reply(None),
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
                body: EntryBody::reply(Some("done".into())),
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

    /// A run of `turns` tool rounds: the prompt, then per round a reply calling `echo` with
    /// `size` bytes and its result, a notice now and then, and a follow-up every fifth round.
    fn long_run(turns: u64, size: usize) -> Vec<Entry> {
        let mut t = vec![Entry {
            seq: 0,
            at: at(),
            body: EntryBody::user("go"),
        }];
        let mut push = |body| {
            let seq = t.len() as u64;
            t.push(Entry {
                seq,
                at: at(),
                body,
            });
        };
        for n in 0..turns {
            push(EntryBody::reply(Some(format!("round {n}"))));
            let reply_seq = n; // not read by the projection
            push(EntryBody::Tool(ToolEntry::new(
                format!("c{n}"),
                "echo",
                json!({"text": "x".repeat(size)}),
                ToolResult::Success {
                    output: json!("y".repeat(size)),
                },
                reply_seq,
            )));
            if n % 3 == 0 {
                push(EntryBody::Notice {
                    code: "n".into(),
                    message: "m".into(),
                });
            }
            if n % 5 == 4 {
                push(EntryBody::user(format!("and then {n}")));
            }
        }
        t
    }

    #[test]
    fn a_history_within_its_budget_is_given_whole_and_borrowed() {
        let t = long_run(10, 50);
        let given = fit(None, &t, 1_000_000);
        assert!(matches!(given, Cow::Borrowed(_)));
        assert_eq!(given.as_ref(), t.as_slice());
    }

    #[test]
    fn past_its_budget_a_model_gets_the_first_message_a_note_and_the_newest_groups() {
        let t = long_run(40, 100);
        let budget = 2_000;
        let given = fit(None, &t, budget);
        assert!(given.len() < t.len());
        assert_eq!(given[0].seq, 0);
        let EntryBody::User { text, .. } = &given[0].body else {
            panic!("the first message first: {:?}", given[0]);
        };
        let left_out = given[1].seq - 1;
        assert!(text.starts_with("go\n\n[Baton: the "), "{text}");
        assert!(
            text.contains(&format!("the {left_out} timeline entries")),
            "{text}"
        );
        // After it, a stretch of the timeline up to its end, starting at a group.
        assert!(starts_group(&given[1]));
        let tail = &t[given[1].seq as usize..];
        assert_eq!(&given[1..], tail);
        let size: usize = tail.iter().map(model_bytes).sum();
        assert!(size <= budget, "{size} bytes given, budget {budget}");
        // One more group would not have fitted.
        let before = t[..given[1].seq as usize]
            .iter()
            .rposition(starts_group)
            .expect("a group before");
        let more: usize = t[before..].iter().map(model_bytes).sum();
        assert!(more > budget);
        // The projection pairs every result with its call.
        let msgs = project("", &given);
        let calls: usize = msgs
            .iter()
            .map(|m| match m {
                ChatMessage::Assistant { tool_calls, .. } => tool_calls.len(),
                _ => 0,
            })
            .sum();
        let results = msgs
            .iter()
            .filter(|m| matches!(m, ChatMessage::Tool { .. }))
            .count();
        assert_eq!(calls, results);
    }

    #[test]
    fn the_newest_group_is_given_whatever_its_size() {
        let t = long_run(6, 5_000);
        let given = fit(None, &t, 1_000);
        let last = t.iter().rposition(starts_group).expect("a group");
        assert_eq!(given[0].seq, 0);
        assert_eq!(&given[1..], &t[last..]);
    }

    /// The projection is derived from the timeline alone: any read backwards from the end
    /// that is over the budget and holds a group start, with the first message beside it,
    /// gives exactly what the whole timeline gives.
    #[test]
    fn any_read_over_the_budget_gives_what_the_whole_timeline_gives() {
        for (turns, size, budget) in [(30, 40, 1_000), (25, 300, 2_500), (12, 10, 100_000)] {
            let t = long_run(turns, size);
            let whole = fit(None, &t, budget).into_owned();
            for lo in 1..t.len() {
                let span = &t[lo..];
                let over = span.iter().map(model_bytes).sum::<usize>() > budget;
                if !over || !span.iter().any(starts_group) {
                    continue;
                }
                let read = fit(Some(&t[0]), span, budget);
                assert_eq!(
                    read.as_ref(),
                    whole.as_slice(),
                    "read from {lo}, budget {budget}"
                );
            }
            // Read from the start, the first message inside the span, beside it, or both.
            assert_eq!(fit(Some(&t[0]), &t[1..], budget).as_ref(), whole.as_slice());
            assert_eq!(fit(Some(&t[0]), &t, budget).as_ref(), whole.as_slice());
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
