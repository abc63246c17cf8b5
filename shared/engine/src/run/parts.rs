//! The parts of a run item a reader looks for together ([`super::Run::origin`],
//! [`super::Run::waits`], [`super::Run::outcome`]), flattened into the run's JSON.

use serde::{Deserialize, Serialize};

use super::{ExpiryPolicy, ForkedFrom, LastError, ParentLink, RunError, WaitingCta};

/// Where a run comes from and what it was started with: its place in its tree, what it
/// works on, what its parent granted it, its tree's budget, and its turn's tier and plan
/// mode ([`Run::origin`](super::Run::origin)).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunOrigin {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// 0 for a top-level run, parent's depth + 1 for a subagent.
    pub depth: u32,
    /// The top-level run this one is under (none for a top-level run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<String>,
    /// The run and entry this one was forked from (`POST /runs/{id}/fork`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// The document or object this run works on (`{"type": ..., ...}`), given at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// The repository its tools work on (a subagent's is its parent's unless its call gave one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github: Option<crate::scope::GithubRepo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    #[serde(default)]
    pub on_expiry: ExpiryPolicy,
    /// The action of its agent it performs (a `spawn_subagent` call's or a plan step's):
    /// its final answer must match the action's output schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Tools its parent granted this run beside its agent's (`askHuman`:
    /// `request_human_feedback`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub granted: Vec<String>,
    /// Its tree's first budget (its top-level run's, given to each run under it), also
    /// each budget question's step; the tree's spending and raises are kept by the store
    /// ([`crate::budget::Ledger`]). `budgetStep` in JSON: `GET /runs/{id}` shows the tree's
    /// figures as `budget`.
    #[serde(
        rename = "budgetStep",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub budget: Option<crate::budget::Budget>,
    /// The model tier its current turn asked for (a subagent's is its parent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<crate::timeline::Tier>,
    /// The plan mode its model calls ran under: set on a plan's planner, reviewer and
    /// steps, and inherited by their subagents (none outside plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_mode: Option<crate::plan::ExecutionMode>,
}

/// What a run waits on besides its own next step: its subagents' questions, its tree's
/// budget question, the follow-ups queued behind its turn, and the think already on its
/// way ([`Run::waits`](super::Run::waits)).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunWaits {
    /// CTAs pending in this run's subagents (at any depth), as their notices told it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_ctas: Vec<WaitingCta>,
    /// On a top-level run: the runs of its tree that found its budget spent and wait for
    /// the tree's one budget question, which this run asks; each is told once it is raised.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budget_waiters: Vec<String>,
    /// A run under a top-level run that found its tree's budget spent: it waits for the
    /// tree's one budget question (asked by its top-level run) instead of asking its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub budget_parked: bool,
    /// Follow-up messages that came while a turn was under way (the seqs of their `queued`
    /// entries), oldest first: each starts a turn of its own when the one before ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<u64>,
    /// The version whose commit sent this run's own `Continue` (its next think is on the
    /// way), until that message is taken. A commit in between (a follow-up queued, a
    /// subagent's notice) moves the version but not this, so the continue still applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_at: Option<u64>,
}

/// What a run shows of where it stands: its reported state, its last turn's answer, its
/// error, and the last failure of a step being retried ([`Run::outcome`](super::Run::outcome)).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunOutcome {
    /// The last reported `run.state`, so that only changes are published: `thinking`,
    /// `waiting_on_user`, `executing_plan` or `waiting_on_subagents`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// What the state is about: `{iteration}` thinking, `{ctaIds}` waiting on the user,
    /// `{callId, done, total}` (plan steps) executing a plan, `{subagents}` waiting on them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_detail: Option<serde_json::Value>,
    /// The final answer of the last completed turn: whole if short, else a preview (see
    /// `result_truncated`). The run item stays small; the whole answer is in the timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The timeline entry (an `assistant` reply) that holds the whole final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_seq: Option<u64>,
    /// True when `result` is only a preview of the entry at `result_seq`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub result_truncated: bool,
    /// True when the result is JSON that matched the agent's `outputSchema` (the API shows
    /// it parsed, as `output`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub structured: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// The last failure of a step that is being retried, until a step commits. Not part of
    /// a commit: the store keeps it beside the run item and reads it back with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<LastError>,
}
