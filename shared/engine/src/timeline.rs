//! The timeline: the ordered, canonical record of everything that happened in a run.
//!
//! Entries are immutable except a pending tool result, which is resolved in place exactly
//! once. The model sees a projection of the timeline (`project::project`); UIs see all of it.
//! How entries are stored as bytes is the adapters' business (`baton-codec`), not this one's.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cta::{CtaRequest, CtaResponse, CtaStatus};
pub use crate::llm::Usage;

/// How a turn was asked for, beside its text: the model tier it asks for, whether a
/// conversation view shows it, and what started it when no one wrote it (a trigger).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TurnOptions {
    /// The model tier the turn asks for (its agent's `modelByTier` says which model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    /// False: kept in the timeline (the model sees it) but left out of a conversation view.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub visible: bool,
    /// The trigger that started the turn without a user's words (its text says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
}

impl Default for TurnOptions {
    fn default() -> Self {
        Self {
            tier: None,
            visible: true,
            trigger: None,
        }
    }
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

/// A model tier a turn may ask for: an agent maps each to a model (`modelByTier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Normal,
    High,
}

/// One record of the timeline. `seq` is dense from 0, so it is also the entry's index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
pub struct Entry {
    pub seq: u64,
    pub at: DateTime<Utc>,
    #[serde(flatten)]
    pub body: EntryBody,
}

// Most entries are tool entries: boxing the largest variant would allocate for the common case.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntryBody {
    /// A user turn: the run's prompt or a follow-up message.
    User {
        text: String,
        #[serde(rename = "messageId", default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
        #[serde(flatten)]
        options: TurnOptions,
    },
    /// A follow-up message that came while the run was busy. The model does not see it
    /// here: when the turn under way ends, it starts the next turn as a `user` entry.
    Queued {
        text: String,
        #[serde(rename = "messageId")]
        message_id: String,
        #[serde(flatten)]
        options: TurnOptions,
    },
    /// One model reply. Its tool calls are the `tool` entries that name it in `replySeq`.
    Assistant {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        usage: Usage,
        /// The model that answered, `provider:model-id`, when the provider says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// What the call cost in US dollars; absent when the model has no price.
        #[serde(rename = "costUsd", default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        /// Why the model was called.
        #[serde(default)]
        operation: Operation,
        /// How long the model call took, retries included (absent in entries from before).
        #[serde(rename = "latencyMs", default, skip_serializing_if = "Option::is_none")]
        latency_ms: Option<u64>,
        /// How long until its first piece came, when it was streamed (a watched run).
        #[serde(
            rename = "firstTokenMs",
            default,
            skip_serializing_if = "Option::is_none"
        )]
        first_token_ms: Option<u64>,
        /// The reply stopped at its output limit (`maxOutputTokens`): its text is cut, and
        /// a tool call it was writing is not run. `stopReason` is the provider's reason.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
        #[serde(
            rename = "stopReason",
            default,
            skip_serializing_if = "Option::is_none"
        )]
        stop_reason: Option<String>,
        /// The models of the agent's `fallbackModels` chain that failed before `model`
        /// answered, each with why.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        fallbacks: Vec<crate::llm::Fallback>,
        /// The provider's record of the model's reasoning, given back to it with the reply
        /// (Anthropic's and Bedrock's signed thinking blocks): opaque.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<Value>,
    },
    Tool(ToolEntry),
    /// Something the run did on its own: a guardrail, an expiry, a cancellation.
    Notice {
        code: String,
        message: String,
    },
    /// A failure: one that ended the run, or a guardrail a turn hit that changed its course
    /// (`tool_call_limit`: calls past `maxToolCallsPerTurn` were not run).
    Error {
        code: String,
        message: String,
    },
    /// A typed payload a tool returned beside its result, for a UI to draw (a table, a
    /// key/value card, ...). The model never sees it.
    Widget {
        #[serde(rename = "callId")]
        call_id: String,
        kind: String,
        data: Value,
        /// What a consumer that cannot draw `kind` shows instead.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fallback: Option<String>,
    },
    /// A file a tool returned beside its result: its bytes are in the blob store (S3 on
    /// AWS, the data folder locally), served by `GET /runs/{id}/files/{fileId}`. The model
    /// sees its summary alone.
    File(FileRef),
    /// What a turn spent, written as it ends (seed 003): the prompt or follow-up at
    /// `turnSeq` and everything it caused, the run's own model calls and its subagents'.
    /// The model never sees it.
    Usage {
        #[serde(rename = "turnSeq")]
        turn_seq: u64,
        usage: crate::llm::Usage,
        #[serde(rename = "costUsd")]
        cost_usd: f64,
    },
}

/// A stored file, as the timeline names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FileRef {
    pub call_id: String,
    pub file_id: String,
    pub name: String,
    pub media_type: String,
    pub size: u64,
    pub summary: String,
}

/// Why a model was called: an agent's iteration (`think`), the planner writing a plan
/// (`plan`), the plan reviewer reading one (`review`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    #[default]
    Think,
    Plan,
    Review,
}

impl EntryBody {
    /// A person's turn: `text`, shown, at the agent's usual tier.
    pub fn user(text: impl Into<String>) -> Self {
        Self::User {
            text: text.into(),
            message_id: None,
            options: TurnOptions::default(),
        }
    }

    /// A model's reply with only its text (or none): no usage, price, model or timing
    /// recorded, as a test or a synthetic history writes one.
    pub fn reply(text: Option<String>) -> Self {
        Self::Assistant {
            stop_reason: None,
            truncated: false,
            text,
            usage: Usage::default(),
            model: None,
            cost_usd: None,
            operation: Operation::default(),
            latency_ms: None,
            first_token_ms: None,
            fallbacks: Vec::new(),
            reasoning: None,
        }
    }
}

/// A tool call and its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
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
    /// The plan this result waits for (`agent_orchestrate`), as it goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Box<crate::plan::PlanState>>,
    /// How long the tool ran, for a tool this step ran (not a question, a subagent, a plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// How a call its host runs may touch the world, as its tool declared when the reply
    /// was committed (absent for the engine's own tools, and in entries from before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects: Option<crate::tools::Effects>,
    /// How many times a `once` call was marked started, each in a committed write before it
    /// ran. Found started with no result by a step that did not mark it, it was cut off (its
    /// process died while it ran): its outcome is unknown.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub started: u32,
}

fn is_zero32(n: &u32) -> bool {
    *n == 0
}

impl ToolEntry {
    /// A call of the reply at `reply_seq` with its result so far, waiting on no person,
    /// subagent or plan, not run yet by its host.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        input: Value,
        result: ToolResult,
        reply_seq: u64,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            input,
            result,
            reply_seq,
            cta: None,
            child_run_id: None,
            plan: None,
            duration_ms: None,
            effects: None,
            started: 0,
        }
    }

    /// Whether the call is committed and due to run: its reply (or its approval) is
    /// committed, and its host has not recorded its output yet.
    pub fn is_due(&self) -> bool {
        matches!(&self.result, ToolResult::Pending { reason } if reason == EXECUTING)
    }
}

/// The pending reason of a call committed to run (see [`ToolEntry::is_due`]).
pub const EXECUTING: &str = "executing";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
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
    pub fn is_error(&self) -> bool {
        matches!(self, Self::Error { .. })
    }
    pub fn error(msg: impl Into<String>) -> Self {
        Self::Error { error: msg.into() }
    }
    pub fn pending(reason: impl Into<String>) -> Self {
        Self::Pending {
            reason: reason.into(),
        }
    }
}

/// The CTA as the timeline shows it, beside the result it belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CtaSnapshot {
    pub cta_id: String,
    #[serde(flatten)]
    pub request: CtaRequest,
    /// The answer it takes at expiry, under `onExpiry: "default"` ([`crate::cta::Cta::default`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<CtaResponse>,
    pub status: CtaStatus,
    /// Its answer: a human's, or (status `expired`, `defaulted`) its default, given at expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<CtaResponse>,
    /// True when `response` is the default, applied when the question expired unanswered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub defaulted: bool,
    /// Who answered, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responder: Option<String>,
    pub expires_at: DateTime<Utc>,
    /// True when the engine raised it to gate a tool call.
    #[serde(default)]
    pub gate: bool,
    /// The figures a budget question asks about ([`crate::budget`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::budget::BudgetAsk>,
    /// Its notifications' timers (`ntf-`, `rmd-`, `esc-` and its id), cancelled with its
    /// expiry's when it settles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timers: Vec<String>,
}

impl Entry {
    pub fn tool(&self) -> Option<&ToolEntry> {
        match &self.body {
            EntryBody::Tool(t) => Some(t),
            _ => None,
        }
    }
}

/// `span` (contiguous, in seq order) with `changed` over it: an entry of the same seq
/// replaced, a later one added (one before `span` is left out).
pub fn overlay(span: &[Entry], changed: &[Entry]) -> Vec<Entry> {
    let mut out = span.to_vec();
    let from = span.first().map_or(0, |e| e.seq);
    for e in changed.iter().filter(|e| e.seq >= from) {
        match out.binary_search_by_key(&e.seq, |x| x.seq) {
            Ok(i) => out[i] = e.clone(),
            Err(i) => out.insert(i, e.clone()),
        }
    }
    out
}

/// The entries of the current batch: the tool entries after the last assistant entry.
pub fn current_batch(timeline: &[Entry]) -> &[Entry] {
    let start = timeline
        .iter()
        .rposition(|e| matches!(e.body, EntryBody::Assistant { .. }))
        .map_or(timeline.len(), |i| i + 1);
    &timeline[start..]
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
            body: EntryBody::Tool(ToolEntry::new(
                "call_1",
                "echo",
                json!({"text": "hi"}),
                ToolResult::Success {
                    output: json!("hi"),
                },
                2,
            )),
        };
        let v = serde_json::to_value(&e).expect("serializes");
        assert_eq!(v["type"], "tool");
        assert_eq!(v["seq"], 3);
        assert_eq!(v["input"]["text"], "hi");
        assert_eq!(v["result"], json!({"status": "success", "output": "hi"}));
        let back: Entry = serde_json::from_value(v).expect("round-trips");
        assert_eq!(back, e);
    }
}
