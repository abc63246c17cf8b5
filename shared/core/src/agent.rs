//! Agents are data: a name, a system prompt, a model, tools, an approval policy, limits.
//!
//! The [`Catalog`] holds every agent and tool a deployment knows, plus the guardrails. It is
//! built once at start-up; a bad agents file is a start-up error that names the problem.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;
use serde_json::Value;

pub use crate::agents_file::{
    AgentSpec, AgentsFile, AlwaysKeyword, ApprovalBatch, ApprovalSpec, FileError,
};
use crate::plan;
use crate::run::Run;
use crate::timeline::{Operation, Tier};
use crate::tools;

mod catalog;
mod plugin;

pub use catalog::{Catalog, HTTP_FETCH, Listed, RELIST_INTERVAL, Toolbox};
pub use plugin::{MAX_PLUGIN_STATE_BYTES, Plugin, PluginError, Preparation, Prepare, Prepared};

pub const ORCHESTRATOR: &str = "orchestrator";

/// When a tool call needs a human's approval first, and what to tell the human why.
#[derive(Debug, Clone)]
pub struct Approval {
    /// Only when the call's input, serialized as JSON, matches (always without one).
    pub input_matches: Option<Regex>,
    /// Shown with the CTA and in `cta.request`.
    pub reason: Option<String>,
}

impl Approval {
    pub const ALWAYS: Approval = Approval {
        input_matches: None,
        reason: None,
    };

    pub fn requires(&self, input: &Value) -> bool {
        self.input_matches
            .as_ref()
            .is_none_or(|re| re.is_match(&input.to_string()))
    }
}

#[derive(Clone)]
pub struct AgentDef {
    pub name: String,
    /// What it is for, as planners and orchestrators are told.
    pub description: Option<String>,
    pub system: String,
    pub model: Option<String>,
    /// The model by the run's context `type` (else `model`).
    pub model_by_context: BTreeMap<String, String>,
    /// The model by the turn's tier, before the context's (else `model`).
    pub model_by_tier: BTreeMap<Tier, String>,
    /// Tool names; `mcp:<server>` grants every tool of that MCP server.
    pub tools: Vec<String>,
    pub approval: HashMap<String, Approval>,
    pub approval_batch: ApprovalBatch,
    pub max_iterations: u32,
    /// Tool calls a turn may make, over all its replies.
    pub max_tool_calls_per_turn: u32,
    /// How long this agent's CTAs wait for an answer (a call may ask for less).
    pub cta_expiry: Duration,
    /// How long a run may work (its clock stops for humans and between turns).
    pub max_wall: Option<Duration>,
    /// How much of a run's history its model is given, in bytes of text
    /// ([`crate::llm::fit`]): the newest groups that fit, after the first message.
    pub context_bytes: usize,
    /// Text added to the system prompt by the run's context `type`.
    pub context_guidance: BTreeMap<String, String>,
    /// Its plugins, asked in order before each think (Rust only: [`Plugin`]).
    pub plugins: Vec<Arc<dyn Prepare>>,
    /// What its model calls are recorded as (`plan` for the planner, `review` for the plan
    /// reviewer, `think` for every other agent).
    pub operation: crate::timeline::Operation,
}

impl std::fmt::Debug for AgentDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentDef")
            .field("name", &self.name)
            .field("model", &self.model)
            .field("tools", &self.tools)
            .field("max_iterations", &self.max_iterations)
            .field("max_wall", &self.max_wall)
            .field("plugins", &self.plugins.len())
            .finish()
    }
}

impl AgentDef {
    /// The system prompt of one iteration: the agent's, the guidance for the run's context
    /// type and the context itself, and what its plugins add.
    pub fn system_prompt(&self, run: &Run, prepared: &Prepared) -> String {
        let mut system = self.system.clone();
        let mut add = |text: &str| {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(text);
        };
        if let Some(context) = &run.context {
            let kind = context.get("type").and_then(Value::as_str).unwrap_or("");
            if let Some(guidance) = self.context_guidance.get(kind) {
                add(guidance);
            }
            add(&format!("Context ({kind}):\n{context}"));
        }
        if let Some(extra) = &prepared.context {
            add(extra);
        }
        system
    }

    /// The model a think calls: the one for its turn's `tier`, else for its run's context
    /// type, else the agent's (`None`: the deployment's, `BATON_MODEL`).
    pub fn model_for(&self, context_type: Option<&str>, tier: Option<Tier>) -> Option<&str> {
        let by_tier = tier.and_then(|t| self.model_by_tier.get(&t));
        let by_context = || context_type.and_then(|kind| self.model_by_context.get(kind));
        by_tier
            .or_else(by_context)
            .or(self.model.as_ref())
            .map(String::as_str)
    }

    /// Every model its runs may call (`None` for the deployment's).
    pub fn models(&self) -> impl Iterator<Item = Option<&str>> {
        std::iter::once(self.model.as_deref()).chain(
            self.model_by_context
                .values()
                .chain(self.model_by_tier.values())
                .map(|m| Some(m.as_str())),
        )
    }
}

/// Guardrails. Hitting one is a recorded, graceful end, never a crash.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Thinks per turn before the run is force-completed.
    pub max_iterations: u32,
    /// Tool calls a turn may make, unless the agent says otherwise; past it they are not
    /// run and the model is asked for its final answer without tools.
    pub max_tool_calls: u32,
    /// How deep subagents may nest (a top-level run is depth 0).
    pub max_depth: u32,
    /// Children running at once per parent; more wait their turn.
    pub max_parallel_children: usize,
    /// How long a CTA waits for its answer, unless the agent says otherwise.
    pub cta_expiry: Duration,
    /// How long a tool call may take, unless the tool says otherwise.
    pub tool_timeout: Duration,
    /// The caps of `agent_orchestrate` plans.
    pub plan: crate::plan::PlanLimits,
    /// How much of a run's history a model is given, unless the agent says otherwise.
    pub context_bytes: usize,
}

/// The default context budget: 400,000 bytes of text, about 100,000 tokens, within the
/// context window of every current chat model with room for its tools and reply.
pub const DEFAULT_CONTEXT_BYTES: usize = 400_000;

/// The smallest context budget an agent may set.
pub const MIN_CONTEXT_BYTES: usize = 1_000;

/// The largest context budget an agent may set: 4,000,000 bytes, about a million tokens, the
/// largest context window of current models. It bounds what a step holds of a run's history
/// (and so a step function's memory, measured at this budget by `tests/lambda/memory.py`).
pub const MAX_CONTEXT_BYTES: usize = 4_000_000;

/// The longest an agent's CTAs may wait: one year, as far as EventBridge Scheduler goes.
pub const MAX_CTA_EXPIRY_SECS: u64 = 365 * 24 * 3600;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_iterations: 25,
            max_tool_calls: 8,
            max_depth: 3,
            max_parallel_children: 4,
            cta_expiry: Duration::from_secs(30 * 24 * 3600),
            tool_timeout: Duration::from_secs(60),
            plan: crate::plan::PlanLimits::default(),
            context_bytes: DEFAULT_CONTEXT_BYTES,
        }
    }
}

/// A problem with the agent definitions, reported at start-up.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("agent `{agent}` lists unknown tool `{tool}` (known tools: {known})")]
    UnknownTool {
        agent: String,
        tool: String,
        known: String,
    },
    #[error("agent `{agent}` sets an approval policy for `{tool}`, which is not one of its tools")]
    ApprovalForMissingTool { agent: String, tool: String },
    #[error("agent `{agent}`: approval regex for `{tool}` is invalid: {source}")]
    BadRegex {
        agent: String,
        tool: String,
        #[source]
        source: regex::Error,
    },
    #[error("agent name `{0}` is not valid: use letters, digits, `-` and `_`")]
    BadName(String),
    #[error(
        "agent `{agent}`: contextBytes is {bytes}; it must be from {MIN_CONTEXT_BYTES} to {MAX_CONTEXT_BYTES}"
    )]
    ContextBudget { agent: String, bytes: usize },
    #[error("agent `{0}`: maxIterations must be at least 1")]
    ZeroIterations(String),
    #[error("agent `{0}`: maxToolCallsPerTurn must be at least 1")]
    ZeroToolCalls(String),
    #[error(
        "agent `{agent}`: ctaExpirySeconds is {seconds}; it must be from 1 to {MAX_CTA_EXPIRY_SECS} (one year)"
    )]
    BadCtaExpiry { agent: String, seconds: u64 },
    #[error("agent `{agent}`: maxWallSeconds must be at least 1")]
    ZeroWall { agent: String },
    #[error("mcpServers.{server}: {message}")]
    Server { server: String, message: String },
    #[error("tools.{tool}: {message}")]
    HttpTool { tool: String, message: String },
    #[error("toolTimeoutSeconds must be at least 1")]
    ZeroTimeout,
    #[error("agent `{0}` writes or reviews plans; it cannot have tools")]
    InternalWithTools(String),
    #[error("plans.{field} must be from 1 to {max}")]
    PlanLimit { field: &'static str, max: u64 },
    #[error(transparent)]
    Schema(#[from] tools::SchemaError),
}

fn builtin_agents(limits: &Limits, fetch: bool) -> Vec<AgentDef> {
    let agent = |name: &str, system: &str, tools: &[&str]| AgentDef {
        name: name.into(),
        description: None,
        system: system.into(),
        model: None,
        model_by_context: BTreeMap::new(),
        model_by_tier: BTreeMap::new(),
        tools: tools.iter().map(|t| t.to_string()).collect(),
        approval: HashMap::new(),
        approval_batch: ApprovalBatch::default(),
        max_iterations: limits.max_iterations,
        max_tool_calls_per_turn: limits.max_tool_calls,
        cta_expiry: limits.cta_expiry,
        max_wall: None,
        context_bytes: limits.context_bytes,
        context_guidance: BTreeMap::new(),
        plugins: Vec::new(),
        operation: Operation::Think,
    };
    let explore_tools: &[&str] = if fetch { &[HTTP_FETCH] } else { &[] };
    let described = |mut a: AgentDef, d: &str| {
        a.description = Some(d.into());
        a
    };
    let internal = |mut a: AgentDef, op: Operation| {
        a.operation = op;
        a.max_iterations = 2;
        a
    };
    vec![
        agent(
            ORCHESTRATOR,
            "You are an orchestrator. You do not do the work yourself: delegate it to \
             subagents with spawn_subagent (explore to investigate, code to change things), \
             in parallel when tasks are independent, or run a whole plan of them at once with \
             agent_orchestrate when later work needs earlier results; ask the human with \
             request_human_feedback when a decision or approval is theirs to make. When the \
             work is done, answer with a short summary.",
            &[
                tools::SPAWN_SUBAGENT,
                tools::REQUEST_HUMAN_FEEDBACK,
                plan::AGENT_ORCHESTRATE,
            ],
        ),
        described(
            agent(
                "explore",
                "You are an explore subagent. Investigate what you are asked and report your \
                 findings concisely. End every turn with a final answer.",
                explore_tools,
            ),
            "investigates a question and reports its findings",
        ),
        described(
            agent(
                "code",
                "You are a code subagent. Carry out the change you are asked for and report \
                 what you did. End every turn with a final answer.",
                &[],
            ),
            "carries out a change and reports what it did",
        ),
        internal(agent(plan::PLANNER, PLANNER_PROMPT, &[]), Operation::Plan),
        internal(
            agent(plan::PLAN_REVIEWER, REVIEWER_PROMPT, &[]),
            Operation::Review,
        ),
    ]
}

/// The planner's fixed instructions; the catalog adds the agents a plan may use.
const PLANNER_PROMPT: &str = "You write plans for agent_orchestrate. Reply with one JSON \
object and nothing else: {\"steps\": [...]}. Steps run in order. An agent step is \
{\"id\": \"...\", \"agent\": \"<agent>\", \"prompt\": \"...\", \"result_key\": \"...\"} (also \
optional: \"with\": {...} input for the agent, \"timeout_ms\"). A parallel step runs agent steps \
at once: {\"id\": \"...\", \"parallel\": [agent steps], \"merge\": \"collect\" or \
\"first_success\"}. A prompt may use an earlier step's output as {{result.<result_key>}} \
(or a field of it, {{result.<result_key>.<field>}}) and the call's bindings as \
{{bindings.<name>}}; steps of one parallel step cannot use each other's results. Ids and \
result keys use letters, digits, - and _. Keep plans short: only the steps the objective \
needs.";

/// The plan reviewer's fixed instructions.
const REVIEWER_PROMPT: &str = "You review plans before they run. Approve a plan that \
accomplishes its objective with the agents it names, in a sensible order, without needless \
or risky steps. Reply with one JSON object and nothing else: {\"approved\": true or false, \
\"notes\": \"what to change, or why it is fine\"}.";

/// An agent of the agents file, checked.
fn agent_def(limits: &Limits, name: String, spec: AgentSpec) -> Result<AgentDef, CatalogError> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(CatalogError::BadName(name));
    }
    if spec.max_iterations == Some(0) {
        return Err(CatalogError::ZeroIterations(name));
    }
    if spec.max_tool_calls_per_turn == Some(0) {
        return Err(CatalogError::ZeroToolCalls(name));
    }
    if spec.max_wall_seconds == Some(0) {
        return Err(CatalogError::ZeroWall { agent: name });
    }
    if let Some(bytes) = spec.context_bytes
        && !(MIN_CONTEXT_BYTES..=MAX_CONTEXT_BYTES).contains(&bytes)
    {
        return Err(CatalogError::ContextBudget { agent: name, bytes });
    }
    if let Some(seconds) = spec.cta_expiry_seconds
        && !(1..=MAX_CTA_EXPIRY_SECS).contains(&seconds)
    {
        return Err(CatalogError::BadCtaExpiry {
            agent: name,
            seconds,
        });
    }
    let mut approval = HashMap::new();
    for (tool, a) in spec.approval {
        let policy = match a {
            ApprovalSpec::Keyword(AlwaysKeyword::Always) => Approval::ALWAYS,
            ApprovalSpec::Rule(rule) => Approval {
                input_matches: match rule.input_matches.as_deref().map(Regex::new) {
                    None => None,
                    Some(Ok(re)) => Some(re),
                    Some(Err(source)) => {
                        return Err(CatalogError::BadRegex {
                            agent: name,
                            tool,
                            source,
                        });
                    }
                },
                reason: rule.reason,
            },
        };
        approval.insert(tool, policy);
    }
    Ok(AgentDef {
        description: spec.description,
        operation: match name.as_str() {
            plan::PLANNER => Operation::Plan,
            plan::PLAN_REVIEWER => Operation::Review,
            _ => Operation::Think,
        },
        system: spec.system.unwrap_or_default(),
        model: spec.model,
        model_by_context: spec.model_by_context,
        model_by_tier: spec.model_by_tier,
        tools: spec.tools,
        approval,
        approval_batch: spec.approval_batch.unwrap_or_default(),
        max_iterations: spec.max_iterations.unwrap_or(limits.max_iterations),
        max_tool_calls_per_turn: spec
            .max_tool_calls_per_turn
            .unwrap_or(limits.max_tool_calls),
        cta_expiry: spec
            .cta_expiry_seconds
            .map_or(limits.cta_expiry, Duration::from_secs),
        max_wall: spec.max_wall_seconds.map(Duration::from_secs),
        context_bytes: spec.context_bytes.unwrap_or(limits.context_bytes),
        context_guidance: spec.context_guidance,
        plugins: Vec::new(),
        name,
    })
}

#[cfg(test)]
mod tests;
