//! Tools as the engine sees them: names it dispatches itself, how it dispatches a call
//! ([`ToolKind`]), how a call may touch the world ([`Effects`]), what a tool may add beside
//! its result ([`Widget`]), and [`Offered`]: a tool's spec and its host's checks of a call's
//! input. The tools' code is the host's.

use serde::{Deserialize, Serialize};
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

/// How a call of a tool may touch the world: what a crash around it may do, and so how
/// often its output is committed. A call's effects are recorded on its `tool` entry when its
/// reply is committed, and it is run as they say from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Effects {
    /// Reads or computes, and changes nothing: run again after a crash, its output rides in
    /// the run's next commit (a loop of such calls commits once an iteration).
    None,
    /// Changes the world, and is safe to repeat under its idempotency key: run again after
    /// a crash under the same key; its output is committed before anything else runs.
    Idempotent,
    /// Must not run twice: marked started in a committed write before it runs, its output
    /// committed before anything else runs. Found started with no output after a crash, it
    /// is not run again: its outcome is unknown, and the model (or a person) is told.
    Once,
}

impl Effects {
    pub fn as_str(self) -> &'static str {
        match self {
            Effects::None => "none",
            Effects::Idempotent => "idempotent",
            Effects::Once => "once",
        }
    }
}

impl std::fmt::Display for Effects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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
    /// How a call may touch the world. What a host does not know must not run twice.
    fn effects(&self) -> Effects {
        Effects::Once
    }
}

/// A typed payload for a UI, beside a tool's result: a `widget` timeline entry that the
/// model never sees. `kind` names how to draw it (`table`, `card`, ...).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Widget {
    pub kind: String,
    pub data: Value,
    /// What a consumer that cannot draw `kind` shows instead (a line of text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}
