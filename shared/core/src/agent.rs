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
use crate::timeline::{Entry, Operation};
use crate::tools;

mod catalog;

pub use catalog::{Catalog, HTTP_FETCH, Listed, RELIST_INTERVAL, Toolbox};

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
    /// Tool names; `mcp:<server>` grants every tool of that MCP server.
    pub tools: Vec<String>,
    pub approval: HashMap<String, Approval>,
    pub approval_batch: ApprovalBatch,
    pub max_iterations: u32,
    /// How long this agent's CTAs wait for an answer (a call may ask for less).
    pub cta_expiry: Duration,
    /// How long a run may work, time waiting for a human not counted.
    pub max_wall: Option<Duration>,
    /// Text added to the system prompt by the run's context `type`.
    pub context_guidance: BTreeMap<String, String>,
    /// Tools and context added per iteration (Rust only).
    pub prepare: Option<Arc<dyn Prepare>>,
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
            .field("prepare", &self.prepare.is_some())
            .finish()
    }
}

/// A hook that adds tools and context to an agent's iteration, from the run's state. It
/// must be deterministic: a retried step calls it again with the same run and timeline and
/// must get the same answer (the engine checks a call against it, as the model saw it).
pub trait Prepare: Send + Sync {
    fn prepare(&self, run: &Run, timeline: &[Entry]) -> Prepared;
}

/// What a [`Prepare`] hook adds to one iteration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    /// Names of catalog tools the agent may also call in this iteration.
    pub tools: Vec<String>,
    /// Text added to the system prompt.
    pub context: Option<String>,
}

impl AgentDef {
    /// The system prompt of one iteration: the agent's, the guidance for the run's context
    /// type and the context itself, and what a prepare hook adds.
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

    /// What this iteration adds to the agent: the tools the run was granted, and what its
    /// prepare hook adds for `run` at `timeline`.
    pub fn prepared(&self, run: &Run, timeline: &[Entry]) -> Prepared {
        let mut prepared = self
            .prepare
            .as_ref()
            .map(|p| p.prepare(run, timeline))
            .unwrap_or_default();
        prepared.tools.extend(run.granted.iter().cloned());
        prepared
    }
}

/// Guardrails. Hitting one is a recorded, graceful end, never a crash.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Thinks per turn before the run is force-completed.
    pub max_iterations: u32,
    /// Tool calls run per reply; the rest get error results.
    pub max_tool_calls: usize,
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
}

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
    #[error("agent `{0}`: maxIterations must be at least 1")]
    ZeroIterations(String),
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
        tools: tools.iter().map(|t| t.to_string()).collect(),
        approval: HashMap::new(),
        approval_batch: ApprovalBatch::default(),
        max_iterations: limits.max_iterations,
        cta_expiry: limits.cta_expiry,
        max_wall: None,
        context_guidance: BTreeMap::new(),
        prepare: None,
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
    if spec.max_wall_seconds == Some(0) {
        return Err(CatalogError::ZeroWall { agent: name });
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
        tools: spec.tools,
        approval,
        approval_batch: spec.approval_batch.unwrap_or_default(),
        max_iterations: spec.max_iterations.unwrap_or(limits.max_iterations),
        cta_expiry: spec
            .cta_expiry_seconds
            .map_or(limits.cta_expiry, Duration::from_secs),
        max_wall: spec.max_wall_seconds.map(Duration::from_secs),
        context_guidance: spec.context_guidance,
        prepare: None,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{Tool, ToolServer};

    fn file(json: &str) -> AgentsFile {
        serde_json::from_str(json).expect("parses")
    }

    #[test]
    fn builtins_have_the_seed_tools() {
        let c = Catalog::new(Limits::default(), vec![], None).expect("builds");
        let o = c.agent(ORCHESTRATOR).expect("orchestrator");
        assert_eq!(
            o.tools,
            vec![
                tools::SPAWN_SUBAGENT,
                tools::REQUEST_HUMAN_FEEDBACK,
                plan::AGENT_ORCHESTRATE
            ]
        );
        assert!(c.agent("explore").is_some() && c.agent("code").is_some());
        assert_eq!(c.specs(&c.listed(), o, &Prepared::default()).len(), 3);
        // The plan's helpers: no tools (the planner cannot call agent_orchestrate), their
        // calls recorded as `plan` and `review`, and the planner told which agents it has.
        let planner = c.agent(plan::PLANNER).expect("planner");
        assert!(planner.tools.is_empty());
        assert_eq!(planner.operation, Operation::Plan);
        assert!(
            planner.system.contains("- explore: investigates"),
            "{}",
            planner.system
        );
        assert!(!planner.system.contains("- planner"));
        assert_eq!(
            c.agent(plan::PLAN_REVIEWER).expect("reviewer").operation,
            Operation::Review
        );
        assert!(!c.is_subagent(plan::PLANNER) && !c.is_subagent(ORCHESTRATOR));
        assert!(c.is_subagent("explore"));
    }

    #[test]
    fn plan_caps_come_from_the_agents_file_within_bounds() {
        let f = file(r#"{"plans": {"maxSteps": 3, "maxParallel": 2, "stepTimeoutSeconds": 30}}"#);
        let c = Catalog::new(Limits::default(), vec![], Some(f)).expect("builds");
        assert_eq!(c.limits.plan.max_steps, 3);
        assert_eq!(c.limits.plan.max_parallel, 2);
        assert_eq!(c.limits.plan.max_depth, 3);
        assert_eq!(c.limits.plan.step_timeout, Some(Duration::from_secs(30)));
        for (bad, want) in [
            (
                r#"{"plans": {"maxSteps": 0}}"#,
                "plans.maxSteps must be from 1 to 100",
            ),
            (
                r#"{"plans": {"maxParallel": 99}}"#,
                "plans.maxParallel must be from 1 to 32",
            ),
            (
                r#"{"agents": {"planner": {"tools": ["echo"]}}}"#,
                "agent `planner` writes or reviews plans; it cannot have tools",
            ),
        ] {
            let err = Catalog::new(Limits::default(), vec![], Some(file(bad)))
                .expect_err(bad)
                .to_string();
            assert_eq!(err, want);
        }
    }

    #[test]
    fn an_agents_file_adds_agents_with_policies() {
        let f = file(
            r#"{"agents": {"ops": {"system": "s", "tools": ["echo"], "maxIterations": 3,
                 "approval": {"echo": {"inputMatches": "rm -rf"}}},
                "careful": {"tools": ["echo"], "approval": {"echo": "always"}}}}"#,
        );
        let c = Catalog::new(Limits::default(), vec![], Some(f)).expect("builds");
        let ops = c.agent("ops").expect("ops");
        assert_eq!(ops.max_iterations, 3);
        let policy = &ops.approval["echo"];
        assert!(policy.requires(&serde_json::json!({"text": "rm -rf /"})));
        assert!(!policy.requires(&serde_json::json!({"text": "ls"})));
        assert!(
            c.agent("careful").expect("careful").approval["echo"].requires(&serde_json::json!({}))
        );
        // New agents can be spawned as subagents.
        let spawn = c.tool(&c.listed(), tools::SPAWN_SUBAGENT).expect("spawn");
        assert!(
            spawn
                .validate(&serde_json::json!({"agent": "ops", "prompt": "x"}))
                .is_ok()
        );
    }

    #[test]
    fn bad_agent_files_are_clear_start_up_errors() {
        let cases = [
            (
                r#"{"agents": {"a": {"tools": ["nope"]}}}"#,
                "unknown tool `nope`",
            ),
            (
                r#"{"agents": {"a": {"tools": [], "approval": {"echo": "always"}}}}"#,
                "not one of its tools",
            ),
            (
                r#"{"agents": {"a": {"tools": ["echo"], "approval": {"echo": {"inputMatches": "("}}}}}"#,
                "regex",
            ),
            (r#"{"agents": {"a b": {"tools": []}}}"#, "not valid"),
            (
                r#"{"agents": {"a": {"tools": [], "maxIterations": 0}}}"#,
                "at least 1",
            ),
            (
                r#"{"agents": {"a": {"tools": [], "ctaExpirySeconds": 0}}}"#,
                "ctaExpirySeconds is 0",
            ),
            (
                r#"{"agents": {"a": {"tools": [], "ctaExpirySeconds": 31536001}}}"#,
                "one year",
            ),
        ];
        for (json, expected) in cases {
            let err = Catalog::new(Limits::default(), vec![], Some(file(json))).expect_err(json);
            assert!(err.to_string().contains(expected), "{json}: {err}");
        }
        assert!(serde_json::from_str::<AgentsFile>(r#"{"agents": {"a": {"tool": []}}}"#).is_err());
        assert!(
            serde_json::from_str::<AgentsFile>(
                r#"{"agents": {"a": {"tools": [], "approval": {"echo": "sometimes"}}}}"#
            )
            .is_err()
        );
    }

    /// A server with one tool, `<name>__ping`, that can be made to fail listing.
    struct FakeServer {
        name: &'static str,
        up: std::sync::atomic::AtomicBool,
        lists: std::sync::atomic::AtomicU32,
    }

    struct Ping(String);

    #[async_trait::async_trait]
    impl Tool for Ping {
        fn name(&self) -> &str {
            &self.0
        }
        fn description(&self) -> &str {
            "ping"
        }
        fn schema(&self) -> Value {
            serde_json::json!({"type": "object"})
        }
        async fn execute(&self, _: &tools::ToolContext, _: Value) -> Result<Value, String> {
            Ok("pong".into())
        }
    }

    #[async_trait::async_trait]
    impl ToolServer for FakeServer {
        async fn list(&self) -> Result<Vec<Arc<dyn Tool>>, String> {
            use std::sync::atomic::Ordering;
            self.lists.fetch_add(1, Ordering::SeqCst);
            if self.up.load(Ordering::SeqCst) {
                Ok(vec![Arc::new(Ping(format!("{}__ping", self.name)))])
            } else {
                Err("down".into())
            }
        }
    }

    fn with_server(json: &str, up: bool) -> (Result<Catalog, CatalogError>, Arc<FakeServer>) {
        let server = Arc::new(FakeServer {
            name: "calc",
            up: std::sync::atomic::AtomicBool::new(up),
            lists: Default::default(),
        });
        let toolbox = Toolbox {
            tools: vec![],
            servers: BTreeMap::from([("calc".to_owned(), server.clone() as Arc<dyn ToolServer>)]),
        };
        (
            Catalog::build(Limits::default(), toolbox, Some(file(json))),
            server,
        )
    }

    #[test]
    fn mcp_grants_are_checked_and_listed_once() {
        let ok = r#"{"mcpServers": {"calc": {"url": "http://x", "agents": ["explore"]}},
                     "agents": {"ops": {"tools": ["calc__ping"], "approval": {"calc__ping": "always"}},
                                "all": {"tools": ["mcp:calc"], "approval": {"calc__other": "always"}}}}"#;
        let (c, server) = with_server(ok, true);
        let c = c.expect("builds");
        let explore = c.agent("explore").expect("explore");
        assert!(
            explore.tools.contains(&"mcp:calc".to_owned()),
            "granted by the server spec"
        );
        let none = Prepared::default();
        // Not listed yet: the model is offered nothing of it, and a call finds no tool.
        assert!(c.specs(&c.listed(), explore, &none).is_empty());
        assert!(
            c.tool_for(&c.listed(), explore, &none, "calc__ping")
                .is_none()
        );
        let block = |f| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime")
                .block_on(f)
        };
        block(c.list_servers(explore, &none));
        block(c.list_servers(c.agent("ops").expect("ops"), &none));
        assert_eq!(
            server.lists.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "listed once"
        );
        assert_eq!(c.specs(&c.listed(), explore, &none)[0].name, "calc__ping");
        assert!(
            c.tool_for(
                &c.listed(),
                c.agent("ops").expect("ops"),
                &none,
                "calc__ping"
            )
            .is_some()
        );
        assert!(
            c.tool_for(
                &c.listed(),
                c.agent("code").expect("code"),
                &none,
                "calc__ping"
            )
            .is_none()
        );

        // A server that is down is asked again only after a while.
        let (c, server) = with_server(ok, false);
        let c = c.expect("builds");
        block(c.list_servers(explore_of(&c), &none));
        block(c.list_servers(explore_of(&c), &none));
        assert_eq!(server.lists.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(c.specs(&c.listed(), explore_of(&c), &none).is_empty());

        for (json, expected) in [
            (
                r#"{"mcpServers": {"calc": {"url": "http://x"}}, "agents": {"a": {"tools": ["mcp:nope"]}}}"#,
                "unknown tool `mcp:nope`",
            ),
            (
                r#"{"mcpServers": {"calc": {"url": "http://x"}}, "agents": {"a": {"tools": ["nope__x"]}}}"#,
                "unknown tool `nope__x`",
            ),
            (
                r#"{"mcpServers": {"calc": {"url": "http://x", "agents": ["ghost"]}}}"#,
                "`ghost`, which is not an agent",
            ),
            (
                r#"{"mcpServers": {"calc": {"url": "http://x"}}, "agents": {"a": {"tools": ["mcp:calc"], "approval": {"echo": "always"}}}}"#,
                "not one of its tools",
            ),
        ] {
            let err = with_server(json, true).0.expect_err(json);
            assert!(err.to_string().contains(expected), "{json}: {err}");
        }
    }

    #[test]
    fn a_snapshot_keeps_the_listings_it_was_taken_with() {
        let ok = r#"{"mcpServers": {"calc": {"url": "http://x"}},
                     "agents": {"ops": {"tools": ["mcp:calc"]}}}"#;
        let (c, _) = with_server(ok, true);
        let c = c.expect("builds");
        let before = c.listed();
        assert!(c.tool(&before, "calc__ping").is_none());
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(c.list_servers(c.agent("ops").expect("ops"), &Prepared::default()));
        assert!(c.tool(&before, "calc__ping").is_none(), "frozen");
        assert!(c.tool(&c.listed(), "calc__ping").is_some());
    }

    fn explore_of(c: &Catalog) -> &AgentDef {
        c.agent("explore").expect("explore")
    }

    #[test]
    fn a_host_that_runs_no_tools_knows_them_by_name() {
        let f = file(
            r#"{"mcpServers": {"calc": {"url": "http://x"}},
                "tools": {"lookup": {"url": "http://x", "description": "d", "schema": {"type": "object"}}},
                "httpFetch": {"allowHosts": ["docs.rs"]},
                "agents": {"ops": {"tools": ["lookup", "mcp:calc", "calc__add"]}}}"#,
        );
        let c = Catalog::declared(Some(f)).expect("builds without clients");
        assert!(c.agent("ops").is_some());
        assert!(
            c.agent("explore")
                .expect("explore")
                .tools
                .contains(&HTTP_FETCH.to_owned())
        );
        let def = c.tool(&c.listed(), "lookup").expect("declared");
        let tools::ToolKind::Exec(tool) = &def.kind else {
            panic!("an executable tool")
        };
        let ctx = tools::ToolContext::new("r", "o", "ops", "c");
        let out = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(tool.execute(&ctx, serde_json::json!({})));
        assert!(out.is_err_and(|e| e.contains("runs only where steps run")));
    }
}
