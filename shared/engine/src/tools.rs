//! Tools as the engine sees them: names it dispatches itself, how it dispatches a call
//! ([`ToolKind`]), what a tool may add beside its result ([`Widget`]), and [`Offered`]: a
//! tool's spec and its host's checks of a call's input. The tools' code is the host's.

use serde_json::Value;

use crate::llm::ToolSpec;

pub const SPAWN_SUBAGENT: &str = "spawn_subagent";
pub const REQUEST_HUMAN_FEEDBACK: &str = "request_human_feedback";

/// How the engine dispatches a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    /// `spawn_subagent`: a child run.
    Spawn,
    /// `request_human_feedback`: a CTA.
    Feedback,
    /// `agent_orchestrate`: the engine runs a plan of child runs.
    Orchestrate,
    /// Any other tool: its host executes it (a Rust tool, an HTTP tool, an MCP server's).
    Exec,
}

/// A tool as a step may call it: what the model is told, how the engine dispatches a call,
/// and the checks of a call's input its host made ready (the schema compiled, the tool's own
/// approval rule).
pub trait Offered: Send + Sync {
    fn spec(&self) -> &ToolSpec;
    fn kind(&self) -> ToolKind;
    /// Validates a call's input against the tool's schema; the message lists every violation.
    fn validate(&self, input: &Value) -> Result<(), String>;
    /// Whether the tool itself wants a human's approval before a call with this input runs
    /// (the agent's policy may ask too).
    fn needs_approval(&self, _input: &Value) -> bool {
        false
    }
    /// Why a call with this input needs approval, for the human.
    fn approval_reason(&self, _input: &Value) -> Option<String> {
        None
    }
}

/// A typed payload for a UI, beside a tool's result: a `widget` timeline entry that the
/// model never sees. `kind` names how to draw it (`table`, `card`, ...).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Widget {
    pub kind: String,
    pub data: Value,
}
