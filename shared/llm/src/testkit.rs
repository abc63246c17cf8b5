//! What the clients' tests share: a short history with one tool round trip, and a tool.

use baton_core::llm::ToolSpec;
use baton_core::run::Usage;
use baton_core::timeline::{Entry, EntryBody, ToolEntry, ToolResult};
use serde_json::json;

pub fn history() -> Vec<Entry> {
    let at = chrono::DateTime::from_timestamp(0, 0).unwrap_or_default();
    vec![
        Entry {
            seq: 0,
            at,
            body: EntryBody::User {
                text: "hi".into(),
                message_id: None,
            },
        },
        Entry {
            seq: 1,
            at,
            body: EntryBody::Assistant {
                text: None,
                usage: Usage::default(),
                model: None,
                cost_usd: None,
                operation: Default::default(),
            },
        },
        Entry {
            seq: 2,
            at,
            body: EntryBody::Tool(ToolEntry {
                id: "call_a".into(),
                name: "echo".into(),
                input: json!({"text": "x"}),
                result: ToolResult::Success { output: json!("x") },
                reply_seq: 1,
                cta: None,
                child_run_id: None,
                plan: None,
            }),
        },
    ]
}

pub fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "echo".into(),
        description: "d".into(),
        parameters: json!({"type": "object"}),
    }]
}

/// A think over `history` with `tools`, the system prompt "be brief".
pub fn request<'a>(
    history: &'a [Entry],
    tools: &'a [ToolSpec],
    model: Option<&'a str>,
) -> baton_core::llm::ChatRequest<'a> {
    baton_core::llm::ChatRequest {
        run_id: "r",
        agent: "a",
        think_index: 1,
        model,
        system: "be brief",
        tools,
        history,
    }
}
