//! A run: one agent working on one task, with its status, usage, limits and lineage.
//!
//! Plain data, shared by the engine, the store and the API. No I/O here.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::cost::Spent;
pub use crate::cost::Usage;

mod parts;
mod view;
pub use parts::{RunOrigin, RunOutcome, RunWaits};
pub use view::RunView;

/// The lifecycle of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Created, its first step not yet taken.
    Queued,
    /// Thinking or executing: a step message is on its way.
    Running,
    /// Parked on CTAs or subagents; nothing is queued until one resolves.
    Waiting,
    Completed,
    Failed,
    Expired,
    Cancelled,
}

impl RunStatus {
    /// Every change of a run's status one commit may make; a run may also stay as it is. A
    /// step may pass several arrows of the README's diagram at once (a start that thinks
    /// and answers goes from `queued` to `completed`; a follow-up's turn whose model fails for
    /// good, from `completed` to `failed`). Only a completed run goes on (a follow-up's turn);
    /// only a run that has asked a question expires (so never a queued one). The engine
    /// asserts every commit against this table (in debug builds: every test's), and the
    /// engine's tests make every change it lists (`tests/engine/transitions.rs`).
    pub const CHANGES: &'static [(RunStatus, RunStatus)] = {
        use RunStatus::*;
        &[
            (Queued, Running),
            (Queued, Waiting),
            (Queued, Completed),
            (Queued, Failed),
            (Queued, Cancelled),
            (Running, Waiting),
            (Running, Completed),
            (Running, Failed),
            (Running, Expired),
            (Running, Cancelled),
            (Waiting, Running),
            (Waiting, Completed),
            (Waiting, Failed),
            (Waiting, Expired),
            (Waiting, Cancelled),
            (Completed, Running),
            (Completed, Waiting),
            (Completed, Failed),
        ]
    };

    /// Whether one commit may take a run from `self` to `next` ([`Self::CHANGES`]).
    pub fn may_become(self, next: RunStatus) -> bool {
        self == next || Self::CHANGES.contains(&(self, next))
    }

    /// A terminal run takes no step until a follow-up message starts a new turn.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Expired | Self::Cancelled
        )
    }

    /// Ended for good: failed, expired or cancelled. Such a run takes no follow-up (fork it,
    /// or start a new one); only a completed run's next turn starts with one.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Failed | Self::Expired | Self::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
        }
    }
}

/// What a run does when one of its CTAs expires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExpiryPolicy {
    /// End the run gracefully with status `expired` (the default, as in seed 000).
    #[default]
    End,
    /// Give the model an error result and let it carry on.
    Continue,
    /// Answer the question with the default it was asked with (`request_human_feedback`'s
    /// `default`) and carry on; a question without one (or a tool call's approval) ends
    /// the run as [`ExpiryPolicy::End`] does.
    Default,
}

/// The parent a subagent run reports to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ParentLink {
    pub run_id: String,
    pub tool_call_id: String,
}

/// A recorded failure or graceful stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
pub struct RunError {
    pub code: String,
    pub message: String,
}

/// How much of a turn's prompt a run keeps beside it ([`Run::prompt`]).
pub const PROMPT_PREVIEW_BYTES: usize = 280;

/// A run's `context` (and a trigger's `data`) is at most this long as JSON: it goes with
/// every model call. (An agent's `contextBytes`, what a model is given of the conversation,
/// is bounded by the agents' `MAX_CONTEXT_BYTES`.)
pub const MAX_RUN_CONTEXT_BYTES: usize = 16 * 1024;

/// `what` (a run's `context`, a trigger's `data`), as JSON, fits what a run may hold
/// ([`MAX_RUN_CONTEXT_BYTES`]); the error names it and says by how much it does not.
pub fn check_context_size(what: &str, value: &serde_json::Value) -> Result<(), String> {
    let size = value.to_string().len();
    if size > MAX_RUN_CONTEXT_BYTES {
        return Err(format!(
            "`{what}` is {size} bytes as JSON; at most {MAX_RUN_CONTEXT_BYTES} are allowed"
        ));
    }
    Ok(())
}

/// The run item: everything about a run except its timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub run_id: String,
    pub agent: String,
    pub owner: String,
    pub status: RunStatus,
    /// Bumped by every commit; a commit is conditional on it.
    pub version: u64,
    /// Where it comes from and what it was started with (flattened in JSON).
    #[serde(flatten)]
    pub origin: RunOrigin,
    /// What it waits on besides its own next step (flattened in JSON).
    #[serde(flatten)]
    pub waits: RunWaits,
    /// The tools its plugins offered its last reply that called tools: a call of that reply
    /// that waits (for an approval, or behind another call's) is checked against them when it
    /// may run, as the model was offered them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offered: Vec<String>,
    /// What it has spent: its own model calls, and what its subagents reported.
    #[serde(flatten)]
    pub spend: Spending,
    /// Its agent's plugins' state, by plugin, as the last step that thought left it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub plugin_state: std::collections::BTreeMap<String, serde_json::Value>,
    /// Its clocks: how long it worked and waited for humans, and the timers it armed.
    #[serde(flatten)]
    pub clock: Clocks,
    /// Its model and tool calls, over the run and in the current turn.
    #[serde(flatten)]
    pub counters: Counters,
    /// The seq the next timeline entry gets.
    pub next_seq: u64,
    /// The seq the current batch begins at (the entry after the last reply): with the
    /// follow-ups waiting, all that a step of the loop reads of the timeline
    /// (the engine's `window_start`). 0 until a step has set it (a run stored before).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub batch_start: u64,
    /// Where it stands: its state, answer and error (flattened in JSON).
    #[serde(flatten)]
    pub outcome: RunOutcome,
    /// What the run was asked in its current turn (its prompt, a follow-up, or a subagent's
    /// task): the first [`PROMPT_PREVIEW_BYTES`], for an inbox to show beside its questions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Until when someone watches the run live (unix ms), on a host whose watchers lease a
    /// run (AWS: the API writes the lease, every step reads it with the run). Not part of
    /// the run's record: the store keeps it beside the run item.
    #[serde(skip)]
    #[cfg_attr(feature = "schemas", schemars(skip))]
    pub watched_until: Option<i64>,
    /// The top-level run holds one of its owner's active-run slots
    /// (`BATON_MAX_ACTIVE_RUNS_PER_OWNER`): taken when it was created or a follow-up
    /// started it again, given back by the commit that ends it. Not part of the run's
    /// record: the store keeps it beside the run item, taken and given back with its
    /// owner's count in one write.
    #[serde(skip)]
    #[cfg_attr(feature = "schemas", schemars(skip))]
    pub active_slot: bool,
}

/// What a run has spent ([`Run::spend`]): its own model calls' tokens and cost, what its
/// subagents reported, and the engine's ledger of what it reported to its parent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Spending {
    /// This run's own model calls' tokens.
    pub usage: Usage,
    /// What this run's own model calls cost, in US dollars (models without a price count 0).
    #[serde(default)]
    pub cost_usd: f64,
    /// What its subagents (and theirs) spent, as far as they have reported.
    #[serde(default)]
    pub children: Spent,
    /// What this run has reported to its parent so far (a continued subagent reports only
    /// what it spent since). The engine's own ledger: the API does not show it.
    #[serde(default, skip_serializing_if = "Spent::is_zero")]
    #[cfg_attr(feature = "schemas", schemars(skip))]
    pub reported: Spent,
    /// What its model calls and its subagents' cost, by operation, model, context type and
    /// execution mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cost_breakdown: Vec<crate::cost::CostLine>,
    /// The part of `cost_breakdown` already reported to its parent (the engine's ledger).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schemas", schemars(skip))]
    pub reported_breakdown: Vec<crate::cost::CostLine>,
    /// The turn under way: the seq of the `user` entry that began it, and what the run
    /// (with its subagents) had spent then. When the turn ends, a `usage` entry says what
    /// it spent.
    #[serde(rename = "turnSeq", default)]
    pub turn_seq: u64,
    #[serde(rename = "turnStart", default, skip_serializing_if = "Spent::is_zero")]
    pub turn_start: Spent,
}

/// A run's clocks ([`Run::clock`]): its work and its waits for humans, in ms, and the timers
/// it has armed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Clocks {
    /// Time spent waiting for humans, in ms.
    #[serde(default)]
    pub human_wait_ms: u64,
    /// How long the run has worked, in ms, up to `working_since` (what `maxWallSeconds`
    /// bounds): its turns, from their first step to their end, less any time it or one of
    /// its subagents waited for a human. Idle time between turns is not work.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub worked_ms: u64,
    /// Since when the run works, while it does (its clock runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_since: Option<DateTime<Utc>>,
    /// The timer armed to end the run at its deadline while it waits on work (subagents,
    /// a plan, tools), when its agent has `maxWallSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemas", schemars(skip))]
    pub deadline_timer: Option<String>,
    /// The run's timers armed and not yet fired nor cancelled (its deadline's, its plan
    /// steps' timeouts), with when each is due: the stores index the soonest, so that the
    /// sweep fires one whose schedule was lost.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[cfg_attr(feature = "schemas", schemars(skip))]
    pub timers: std::collections::BTreeMap<String, DateTime<Utc>>,
    /// Since when the run waits for a human, while it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<DateTime<Utc>>,
}

/// A run's counters ([`Run::counters`]): model and tool calls, over the run and in its
/// current turn (what the iteration and tool-call caps apply to).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// Model calls over the whole run (the scripted model indexes its replies by it).
    pub thinks: u32,
    /// Model calls in the current turn (the iteration cap applies to it).
    pub turn_thinks: u32,
    /// Tool calls the model made in the current turn (`maxToolCallsPerTurn` applies to it).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub turn_tool_calls: u32,
    /// The turn's tool calls are spent: its next think is asked for a final answer, without
    /// tools.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tools_spent: bool,
}

/// A CTA a subagent (or one of its own) waits on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WaitingCta {
    pub cta_id: String,
    /// The run that asked.
    pub run_id: String,
    /// This run's child the asker is under (or is).
    pub child_run_id: String,
}

/// A step that failed and will be tried again: what went wrong, and how often.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LastError {
    pub message: String,
    /// The deliveries of the failing message so far.
    pub attempts: u32,
    pub at: DateTime<Utc>,
    /// The failing message (its id as first sent: see `message::requeued`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// How many of its deliveries failed in its own step, not counting those deferred
    /// behind others (which SQS counts as receives all the same).
    #[serde(default)]
    pub failures: u32,
    /// The failure was the model provider's (unreachable, overloaded, a 5xx, after the
    /// client's own retries), not the run's: while the provider is down, its step message
    /// is not given up on (`Steps::dead_letter`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub provider: bool,
}

/// At most this many follow-up messages wait for a busy run; more are refused.
pub const MAX_QUEUED: usize = 10;

/// What it takes to create a run (top-level or child).
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: String,
    pub agent: String,
    pub owner: String,
    pub parent: Option<ParentLink>,
    pub depth: u32,
    pub on_expiry: ExpiryPolicy,
    pub sandbox_id: Option<String>,
    pub metadata: Option<serde_json::Value>,
    pub context: Option<serde_json::Value>,
    pub root_run_id: Option<String>,
    pub now: DateTime<Utc>,
}

impl NewRun {
    /// A top-level run of `agent` for `owner`, as of `now`: no parent, sandbox, metadata or
    /// context, its questions' expiry as its agent says.
    pub fn top_level(
        run_id: impl Into<String>,
        agent: impl Into<String>,
        owner: impl Into<String>,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            run_id: run_id.into(),
            agent: agent.into(),
            owner: owner.into(),
            parent: None,
            depth: 0,
            on_expiry: ExpiryPolicy::default(),
            sandbox_id: None,
            metadata: None,
            context: None,
            root_run_id: None,
            now,
        }
    }
}

impl Run {
    /// What this run and its subagents spent.
    pub fn total(&self) -> Spent {
        let mut total = self.own();
        total += self.spend.children;
        total
    }

    /// What this run's own model calls spent.
    pub fn own(&self) -> Spent {
        Spent {
            usage: self.spend.usage,
            cost_usd: self.spend.cost_usd,
        }
    }

    /// How long this run has worked at `now` (see [`Clocks::worked_ms`]).
    pub fn working_time(&self, now: DateTime<Utc>) -> chrono::Duration {
        let running = self
            .clock
            .working_since
            .map_or(chrono::Duration::zero(), |t| {
                (now - t).max(chrono::Duration::zero())
            });
        chrono::Duration::milliseconds(self.clock.worked_ms as i64) + running
    }

    /// The `type` of the context it works on, if it has one.
    pub fn context_type(&self) -> Option<&str> {
        self.origin.context.as_ref()?.get("type")?.as_str()
    }

    /// What it hands its tools: its sandbox and repository.
    pub fn scope(&self) -> crate::scope::Scope {
        crate::scope::Scope {
            sandbox_id: self.origin.sandbox_id.clone(),
            github: self.origin.github.clone(),
        }
    }

    /// The top-level run this one is under: itself if it is one.
    pub fn root(&self) -> &str {
        self.origin.root_run_id.as_deref().unwrap_or(&self.run_id)
    }

    /// Records what the run's current turn was asked (its preview: see [`Run::prompt`]).
    pub fn set_prompt(&mut self, text: &str) {
        // From its first word: a blank one is an empty preview (see `Work::think`).
        let text = text.trim_start();
        let mut end = text.len().min(PROMPT_PREVIEW_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.prompt = Some(text[..end].to_owned());
    }

    pub fn new(n: NewRun) -> Self {
        Self {
            run_id: n.run_id,
            agent: n.agent,
            owner: n.owner,
            status: RunStatus::Queued,
            version: 0,
            origin: RunOrigin {
                parent: n.parent,
                depth: n.depth,
                root_run_id: n.root_run_id,
                context: n.context,
                on_expiry: n.on_expiry,
                sandbox_id: n.sandbox_id,
                metadata: n.metadata,
                ..RunOrigin::default()
            },
            waits: RunWaits::default(),
            offered: Vec::new(),
            spend: Spending::default(),
            plugin_state: Default::default(),
            clock: Clocks {
                // Queued, it works: its clock runs from its creation.
                working_since: Some(n.now),
                ..Clocks::default()
            },
            counters: Counters::default(),
            next_seq: 0,
            batch_start: 0,
            outcome: RunOutcome::default(),
            watched_until: None,
            active_slot: false,
            prompt: None,
            created_at: n.now,
            updated_at: n.now,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero32(n: &u32) -> bool {
    *n == 0
}

/// Where a fork came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    pub run_id: String,
    /// The entry of that run the fork starts at (its own entry at the same seq replaces it).
    pub at_seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run's groups of fields are a shape in the code only: the stored item (and the
    /// API's JSON) keeps every field at the top, as before the groups, and reads back whole.
    #[test]
    fn a_runs_groups_are_flat_in_its_json_and_read_back_whole() {
        let now = DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default();
        let mut run = Run::new(NewRun::top_level("run_1", "worker", "o", now));
        run.spend.cost_usd = 0.25;
        run.spend.usage.input_tokens = 7;
        run.clock.worked_ms = 1_500;
        run.clock.timers.insert("timer_1".into(), now);
        run.counters.thinks = 3;
        run.counters.tools_spent = true;
        let json = serde_json::to_value(&run).unwrap_or_default();
        for key in [
            "usage",
            "costUsd",
            "workedMs",
            "workingSince",
            "timers",
            "thinks",
        ] {
            assert!(json.get(key).is_some(), "`{key}` at the top: {json}");
        }
        assert_eq!(json["toolsSpent"], true);
        for group in ["spend", "clock", "counters"] {
            assert!(json.get(group).is_none(), "no `{group}` key: {json}");
        }
        let back: Run = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, run);
    }
}
