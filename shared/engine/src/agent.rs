//! Agents as the engine sees them: each one's definition (prompt, models, tools, approval
//! policy, limits), the guardrails, what its plugins added to an iteration, and the [`Book`]:
//! everything one step knows of agents and tools, taken by the host before the step.
//!
//! The agents file, the catalog that is built from it, the tools' code and the plugins are
//! the host's (`baton-core`): the engine is handed this data and decides with it alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

mod action;

pub use action::Action;

use crate::cost::Prices;
use crate::llm::{Controls, Reasoning, ToolChoice, ToolSpec};
use crate::run::Run;
use crate::timeline::Tier;
use crate::tools::Offered;

pub const ORCHESTRATOR: &str = "orchestrator";

/// When a tool call needs a human's approval first, and what to tell the human why.
#[derive(Debug, Clone)]
pub struct Approval {
    /// Only when the call's input, serialized as JSON, matches (always without one).
    pub input_matches: Option<Regex>,
    /// Shown with the CTA and in `cta.request`.
    pub reason: Option<String>,
    /// Who approves this tool's calls, over the agent's `questions`.
    pub assignment: Option<crate::cta::Assignment>,
}

impl Approval {
    pub const ALWAYS: Approval = Approval {
        input_matches: None,
        reason: None,
        assignment: None,
    };

    pub fn requires(&self, input: &Value) -> bool {
        self.input_matches
            .as_ref()
            .is_none_or(|re| re.is_match(&input.to_string()))
    }
}

/// What the other calls of a reply do while one of them waits for approval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalBatch {
    /// They wait too, and run once every approval of the reply is settled (seed 003).
    #[default]
    Deferred,
    /// They run at once.
    Independent,
}

/// What a run does with a `once` call whose outcome is unknown: it was started and its
/// process stopped before its result was recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownOutcome {
    /// The model is given an `outcome_unknown` error result, and decides.
    #[default]
    Error,
    /// A person is asked whether to run it again (an approval that shows the call and its
    /// input); approved, it runs under the same key, rejected, the model is told.
    Ask,
}

/// An agent as the engine runs it: its prompt, models, tools, approval policy and limits
/// (its plugins are the host's: they answer before each think, through the step's I/O).
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
    /// Who answers its questions and approves its tools' calls besides the run's owner.
    pub questions: crate::cta::Assignment,
    pub approval_batch: ApprovalBatch,
    /// What its runs do with a `once` call cut off while it ran.
    pub on_unknown_outcome: UnknownOutcome,
    pub max_iterations: u32,
    /// Tool calls a turn may make, over all its replies.
    pub max_tool_calls_per_turn: u32,
    /// How long this agent's CTAs wait for an answer (a call may ask for less).
    pub cta_expiry: Duration,
    /// What its runs do when a question expires, unless the run (or, for a subagent, its
    /// parent) says otherwise.
    pub on_expiry: Option<crate::run::ExpiryPolicy>,
    /// How long a run may work (its clock stops for humans and between turns).
    pub max_wall: Option<Duration>,
    /// What a top-level run of it may spend (with its tree) before its owner is asked
    /// ([`crate::budget`]).
    pub max_cost_usd: Option<f64>,
    /// The most tokens one model reply may have (none: the provider's configured limit).
    pub max_output_tokens: Option<u32>,
    /// How much of a run's history its model is given, in bytes of text
    /// ([`crate::project::fit`]): the newest groups that fit, after the first message.
    pub context_bytes: usize,
    /// Text added to the system prompt by the run's context `type`.
    pub context_guidance: BTreeMap<String, String>,
    /// What its model calls are recorded as (`plan` for the planner, `review` for the plan
    /// reviewer, `think` for every other agent).
    pub operation: crate::timeline::Operation,
    /// Its reply to a turn that asks nothing (a blank prompt or follow-up), given without
    /// calling the model.
    pub clarifying_reply: String,
    /// The models tried in order when the one before fails retryably past its retries.
    pub fallback_models: Vec<String>,
    /// Which tool a turn's first reply must call (after a reply with calls: `auto`, so that
    /// a turn can end), or `none` for every reply.
    pub tool_choice: Option<ToolChoice>,
    pub reasoning: Option<Reasoning>,
    /// Its named actions: what a `spawn_subagent` call or a plan step may ask of it.
    pub actions: BTreeMap<String, Action>,
    /// Its model sees: it is given the images its runs' tools returned, not only their
    /// summaries.
    pub vision: bool,
    /// How its drafted plans are approved, unless the call says (none: in the
    /// conversation).
    pub plan_approval: Option<crate::plan::PlanApproval>,
    /// The steps its plans must include, by the run's context type (`*`: any other, or
    /// none).
    pub plan_requirements: BTreeMap<String, Vec<crate::plan::Required>>,
    /// The shape its final answers must have: the `outputSchema` as the parameters of
    /// [`OUTPUT_TOOL`](crate::llm::OUTPUT_TOOL), compiled by the host (a reply that does not validate is asked
    /// again).
    pub output: Option<Arc<dyn Offered>>,
}

/// What an agent answers a blank turn with, unless its `clarifyingReply` says otherwise.
pub const DEFAULT_CLARIFYING_REPLY: &str =
    "What would you like me to do? Tell me the task, and anything I should know about it.";

impl std::fmt::Debug for AgentDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentDef")
            .field("name", &self.name)
            .field("model", &self.model)
            .field("tools", &self.tools)
            .field("max_iterations", &self.max_iterations)
            .field("max_wall", &self.max_wall)
            .field("max_cost_usd", &self.max_cost_usd)
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
        if let Some(context) = &run.origin.context {
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
                .chain(&self.fallback_models)
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

impl AgentDef {
    /// An agent that thinks with `system` and may call `tools`, every guardrail at the
    /// deployment's default (`limits`).
    pub fn new(name: &str, system: &str, tools: &[&str], limits: &Limits) -> Self {
        Self {
            name: name.into(),
            description: None,
            system: system.into(),
            model: None,
            model_by_context: BTreeMap::new(),
            model_by_tier: BTreeMap::new(),
            tools: tools.iter().map(|t| t.to_string()).collect(),
            approval: HashMap::new(),
            questions: crate::cta::Assignment::default(),
            approval_batch: ApprovalBatch::default(),
            on_unknown_outcome: UnknownOutcome::default(),
            max_iterations: limits.max_iterations,
            max_tool_calls_per_turn: limits.max_tool_calls,
            cta_expiry: limits.cta_expiry,
            on_expiry: None,
            max_wall: None,
            max_cost_usd: None,
            max_output_tokens: None,
            context_bytes: limits.context_bytes,
            context_guidance: BTreeMap::new(),
            operation: crate::timeline::Operation::Think,
            clarifying_reply: DEFAULT_CLARIFYING_REPLY.into(),
            fallback_models: Vec::new(),
            tool_choice: None,
            reasoning: None,
            output: None,
            plan_requirements: BTreeMap::new(),
            plan_approval: None,
            actions: BTreeMap::new(),
            vision: false,
        }
    }

    /// The shape a run's final answers must have: its action's output schema when it
    /// performs one, else the agent's `outputSchema`.
    pub fn output_for(&self, action: Option<&str>) -> Option<&Arc<dyn Offered>> {
        match action.and_then(|a| self.actions.get(a)) {
            Some(a) => a.output.as_ref(),
            None => self.output.as_ref(),
        }
    }

    /// The steps a plan of a run of this context type must include (none: any plan).
    pub fn plan_requirements(&self, context_type: Option<&str>) -> &[crate::plan::Required] {
        context_type
            .and_then(|k| self.plan_requirements.get(k))
            .or_else(|| self.plan_requirements.get(crate::plan::ANY_CONTEXT))
            .map_or(&[], Vec::as_slice)
    }

    /// How a think of a turn that has thought `turn_thinks` times is steered, offered
    /// tools or not: the agent's tool choice holds for the turn's first reply (`none` for
    /// every one), and is not sent with no tools.
    pub fn controls(&self, turn_thinks: u32, has_tools: bool, action: Option<&str>) -> Controls {
        let tool_choice = self.tool_choice.clone().filter(|c| {
            has_tools && (turn_thinks == 0 || matches!(c, ToolChoice::None | ToolChoice::Auto))
        });
        Controls {
            tool_choice,
            reasoning: self.reasoning,
            output: self.output_for(action).map(|o| o.spec().clone()),
        }
    }

    /// What an iteration adds before its plugins answer: the tools the run was granted, and
    /// those its plugins offered its last reply that called tools (see `Run::offered`).
    pub fn granted(&self, run: &Run) -> Prepared {
        Prepared {
            tools: run
                .origin
                .granted
                .iter()
                .chain(&run.offered)
                .cloned()
                .collect(),
            context: None,
        }
    }
}

/// A plugin's state is at most this long as JSON: it is kept in the run item, which every
/// commit rewrites.
pub const MAX_PLUGIN_STATE_BYTES: usize = 16 * 1024;

/// What a plugin adds to one iteration: built with [`Prepared::new`], [`Prepared::tool`] and
/// [`Prepared::context`] (it may grow: a struct literal outside this crate would not build).
///
/// ```
/// use baton_engine::agent::Prepared;
///
/// let p = Prepared::new().tool("github_read").context("Read before you answer.");
/// assert_eq!(p.tools, ["github_read"]);
/// assert_eq!(p.context.as_deref(), Some("Read before you answer."));
/// assert_eq!(Prepared::new(), Prepared::default()); // adds nothing
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Prepared {
    /// Names of catalog tools the agent may also call in this iteration (Rust or HTTP tools,
    /// or tools of MCP servers the agent already uses).
    pub tools: Vec<String>,
    /// Text added to the system prompt.
    pub context: Option<String>,
}

impl Prepared {
    /// Nothing added.
    pub fn new() -> Self {
        Self::default()
    }

    /// A catalog tool the agent may also call in this iteration.
    #[must_use]
    pub fn tool(mut self, name: impl Into<String>) -> Self {
        self.tools.push(name.into());
        self
    }

    /// Text added to the system prompt (a second call adds its text on a new line).
    #[must_use]
    pub fn context(mut self, text: impl Into<String>) -> Self {
        let text = text.into();
        self.context = Some(match self.context.take() {
            Some(before) => format!("{before}\n{text}"),
            None => text,
        });
        self
    }
}

/// Why a plugin could not say what an iteration adds: its own error, not the model's. A
/// [`PluginError::retry`] sends the step's message back to be tried again (a lookup that
/// timed out); a [`PluginError::fatal`] one fails the run at once with it (its stored state
/// no longer reads, its state outgrew what a run keeps, a setting it cannot work with).
/// Either names the plugin and its agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin `{plugin}` of agent `{agent}`: {message}")]
#[non_exhaustive]
pub struct PluginError {
    /// The plugin's name (filled in by the agent that asked it).
    pub plugin: String,
    /// The agent whose iteration it prepared (filled in likewise).
    pub agent: String,
    pub message: String,
    /// Whether the same step, tried again, may succeed.
    pub retryable: bool,
}

impl PluginError {
    /// An error worth trying the step again for.
    pub fn retry(message: impl Into<String>) -> Self {
        Self {
            plugin: String::new(),
            agent: String::new(),
            message: message.into(),
            retryable: true,
        }
    }

    /// An error no retry will mend: the run fails with it.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            retryable: false,
            ..Self::retry(message)
        }
    }
}

/// What an agent's plugins answered for one step: what the iteration adds (with the tools
/// the run was granted), and each plugin's state after it, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preparation {
    pub prepared: Prepared,
    pub states: BTreeMap<String, Value>,
}

/// Whether a plan step (or `spawn_subagent`) may start an agent of this name: every agent
/// but the orchestrator and the plan's own helpers.
pub fn is_subagent(name: &str) -> bool {
    ![
        ORCHESTRATOR,
        crate::plan::PLANNER,
        crate::plan::PLAN_REVIEWER,
    ]
    .contains(&name)
}

/// `<server>__<tool>`: the server's name, if `name` has that form.
pub fn server_of(name: &str) -> Option<&str> {
    name.split_once("__").map(|(server, _)| server)
}

/// Whether `agent` lists `tool`, or is granted the MCP server it belongs to.
pub fn grants(agent: &AgentDef, tool: &str) -> bool {
    agent.tools.iter().any(|t| {
        t == tool
            || t.strip_prefix("mcp:")
                .is_some_and(|server| server_of(tool) == Some(server))
    })
}

/// Tools by name, as a step may call them.
pub type Tools = HashMap<String, Arc<dyn Offered>>;

/// What one step knows of agents and tools: the agents' definitions, the deployment's own
/// tools, each MCP server's tools as listed when the step began, the guardrails and the
/// prices. The host takes one before the step (`StepIo::book`); every pass of the step
/// decides with that one, however the servers' listings move meanwhile, and the next step
/// takes a new one. Cheap to take: it shares what it holds.
#[derive(Clone, Default)]
pub struct Book {
    pub agents: Arc<HashMap<String, AgentDef>>,
    /// The deployment's own tools (the engine's, Rust tools, HTTP tools).
    pub tools: Arc<Tools>,
    /// Each MCP server's tools, as listed when the step began (a server not listed yet is
    /// not here).
    pub listed: BTreeMap<String, Arc<Tools>>,
    /// Every MCP server's name, listed or not.
    pub servers: Arc<BTreeSet<String>>,
    pub limits: Limits,
    pub prices: Arc<Prices>,
}

impl std::fmt::Debug for Book {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut agents: Vec<&String> = self.agents.keys().collect();
        agents.sort_unstable();
        f.debug_struct("Book")
            .field("agents", &agents)
            .field("servers", &self.servers)
            .finish()
    }
}

impl Book {
    pub fn agent(&self, name: &str) -> Option<&AgentDef> {
        self.agents.get(name)
    }

    /// Whether a plan step (or `spawn_subagent`) may start agent `name`.
    pub fn is_subagent(&self, name: &str) -> bool {
        self.agents.contains_key(name) && is_subagent(name)
    }

    /// The MCP server that serves the tool `name`, if one of the deployment's does.
    pub fn mcp_server_of<'a>(&self, name: &'a str) -> Option<&'a str> {
        server_of(name).filter(|s| self.servers.contains(*s))
    }

    /// A tool by name: one of the deployment's, or an MCP server's as listed.
    pub fn tool(&self, name: &str) -> Option<&Arc<dyn Offered>> {
        if let Some(t) = self.tools.get(name) {
            return Some(t);
        }
        self.listed.get(server_of(name)?)?.get(name)
    }

    /// The tool `name` if `agent` may call it in an iteration `prepared` added to: a tool
    /// it lists, one its plugins added, or a listed tool of an MCP server it is granted.
    pub fn tool_for(
        &self,
        agent: &AgentDef,
        prepared: &Prepared,
        name: &str,
    ) -> Option<&Arc<dyn Offered>> {
        if prepared.tools.iter().any(|t| t == name) || grants(agent, name) {
            self.tool(name)
        } else {
            None
        }
    }

    /// The tool specs an agent's model is given in an iteration: its own tools, its MCP
    /// servers' as listed, and what its plugins added.
    pub fn specs(&self, agent: &AgentDef, prepared: &Prepared) -> Vec<ToolSpec> {
        let mut out = Vec::with_capacity(agent.tools.len() + prepared.tools.len());
        let mut seen = std::collections::HashSet::new();
        let mut add = |t: &dyn Offered, out: &mut Vec<ToolSpec>| {
            if seen.insert(t.spec().name.clone()) {
                out.push(t.spec().clone());
            }
        };
        for t in agent.tools.iter().chain(&prepared.tools) {
            if let Some(server) = t.strip_prefix("mcp:") {
                let Some(tools) = self.listed.get(server) else {
                    continue;
                };
                let mut listed: Vec<&Arc<dyn Offered>> = tools.values().collect();
                listed.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
                for tool in listed {
                    add(&**tool, &mut out);
                }
            } else if let Some(tool) = self.tool(t) {
                add(&**tool, &mut out);
            }
        }
        out
    }
}
