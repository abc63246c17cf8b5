//! Agents are data: a name, a system prompt, a model, tools, an approval policy, limits.
//!
//! The [`Catalog`] holds every agent and tool a deployment knows, plus the guardrails. It is
//! built once at start-up; a bad agents file is a start-up error that names the problem.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::llm::ToolSpec;
use crate::tools::{self, Tool, ToolDef};

pub const ORCHESTRATOR: &str = "orchestrator";

/// When a tool call needs a human's approval first.
#[derive(Debug, Clone)]
pub enum Approval {
    Always,
    /// When the call's input, serialized as JSON, matches.
    InputMatches(Regex),
}

impl Approval {
    pub fn requires(&self, input: &Value) -> bool {
        match self {
            Self::Always => true,
            Self::InputMatches(re) => re.is_match(&input.to_string()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AgentDef {
    pub name: String,
    pub system: String,
    pub model: Option<String>,
    pub tools: Vec<String>,
    pub approval: HashMap<String, Approval>,
    pub max_iterations: u32,
    /// How long this agent's CTAs wait for an answer (a call may ask for less).
    pub cta_expiry: Duration,
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
        }
    }
}

/// Everything the engine needs to know about agents and tools.
#[derive(Debug)]
pub struct Catalog {
    agents: HashMap<String, AgentDef>,
    tools: HashMap<String, ToolDef>,
    specs: HashMap<String, Vec<ToolSpec>>,
    pub limits: Limits,
}

/// A problem with the agent definitions, reported at start-up.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("cannot read agents file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("agents file {path} is not valid: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
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
    #[error(transparent)]
    Schema(#[from] tools::SchemaError),
}

/// The agents file: `{"agents": {"<name>": {...}}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsFile {
    pub agents: BTreeMap<String, AgentSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AgentSpec {
    #[serde(default)]
    pub system: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    pub tools: Vec<String>,
    #[serde(default)]
    pub approval: BTreeMap<String, ApprovalSpec>,
    #[serde(default)]
    pub max_iterations: Option<u32>,
    /// Seconds this agent's CTAs wait for an answer (default 30 days; 1 to one year).
    #[serde(default)]
    pub cta_expiry_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ApprovalSpec {
    Keyword(AlwaysKeyword),
    Matches {
        #[serde(rename = "inputMatches")]
        input_matches: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlwaysKeyword {
    Always,
}

impl AgentsFile {
    pub fn load(path: &std::path::Path) -> Result<Self, CatalogError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
            path: p.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| CatalogError::Parse { path: p, source })
    }
}

fn builtin_agents(limits: &Limits) -> Vec<AgentDef> {
    let agent = |name: &str, system: &str, tools: &[&str]| AgentDef {
        name: name.into(),
        system: system.into(),
        model: None,
        tools: tools.iter().map(|t| t.to_string()).collect(),
        approval: HashMap::new(),
        max_iterations: limits.max_iterations,
        cta_expiry: limits.cta_expiry,
    };
    vec![
        agent(
            ORCHESTRATOR,
            "You are an orchestrator. You do not do the work yourself: delegate it to \
             subagents with spawn_subagent (explore to investigate, code to change things), \
             in parallel when tasks are independent, and ask the human with \
             request_human_feedback when a decision or approval is theirs to make. When the \
             work is done, answer with a short summary.",
            &[tools::SPAWN_SUBAGENT, tools::REQUEST_HUMAN_FEEDBACK],
        ),
        agent(
            "explore",
            "You are an explore subagent. Investigate what you are asked and report your \
             findings concisely. End every turn with a final answer.",
            &[],
        ),
        agent(
            "code",
            "You are a code subagent. Carry out the change you are asked for and report what \
             you did. End every turn with a final answer.",
            &[],
        ),
    ]
}

impl Catalog {
    /// The built-in agents, the built-in tools plus `extra_tools`, and the agents of `file`
    /// (which may redefine a built-in agent).
    pub fn new(
        limits: Limits,
        extra_tools: Vec<Arc<dyn Tool>>,
        file: Option<AgentsFile>,
    ) -> Result<Self, CatalogError> {
        let mut agents: BTreeMap<String, AgentDef> = builtin_agents(&limits)
            .into_iter()
            .map(|a| (a.name.clone(), a))
            .collect();
        for (name, spec) in file.map(|f| f.agents).unwrap_or_default() {
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
                if !spec.tools.contains(&tool) {
                    return Err(CatalogError::ApprovalForMissingTool { agent: name, tool });
                }
                let policy = match a {
                    ApprovalSpec::Keyword(AlwaysKeyword::Always) => Approval::Always,
                    ApprovalSpec::Matches { input_matches } => match Regex::new(&input_matches) {
                        Ok(re) => Approval::InputMatches(re),
                        Err(source) => {
                            return Err(CatalogError::BadRegex {
                                agent: name,
                                tool,
                                source,
                            });
                        }
                    },
                };
                approval.insert(tool, policy);
            }
            let def = AgentDef {
                system: spec.system.unwrap_or_default(),
                model: spec.model,
                tools: spec.tools,
                approval,
                max_iterations: spec.max_iterations.unwrap_or(limits.max_iterations),
                cta_expiry: spec
                    .cta_expiry_seconds
                    .map_or(limits.cta_expiry, Duration::from_secs),
                name: name.clone(),
            };
            agents.insert(name, def);
        }

        let subagents: Vec<String> = agents
            .keys()
            .filter(|n| n.as_str() != ORCHESTRATOR)
            .cloned()
            .collect();
        let mut tools: HashMap<String, ToolDef> = HashMap::new();
        for def in [
            tools::spawn_subagent(&subagents)?,
            tools::request_human_feedback()?,
        ] {
            tools.insert(def.spec.name.clone(), def);
        }
        let mut executable: Vec<Arc<dyn Tool>> = vec![Arc::new(tools::Echo)];
        executable.extend(extra_tools);
        for t in executable {
            let def = ToolDef::from_tool(t)?;
            tools.insert(def.spec.name.clone(), def);
        }

        let mut specs = HashMap::new();
        for a in agents.values() {
            let mut list = Vec::with_capacity(a.tools.len());
            for t in &a.tools {
                let Some(def) = tools.get(t) else {
                    let mut known: Vec<&str> = tools.keys().map(String::as_str).collect();
                    known.sort_unstable();
                    return Err(CatalogError::UnknownTool {
                        agent: a.name.clone(),
                        tool: t.clone(),
                        known: known.join(", "),
                    });
                };
                list.push(def.spec.clone());
            }
            specs.insert(a.name.clone(), list);
        }
        Ok(Self {
            agents: agents.into_iter().collect(),
            tools,
            specs,
            limits,
        })
    }

    /// The built-in agents and tools, plus the agents of the file at `agents_file` if one
    /// is given, with the default guardrails.
    pub fn load(agents_file: Option<&std::path::Path>) -> Result<Self, CatalogError> {
        let file = agents_file.map(AgentsFile::load).transpose()?;
        Self::new(Limits::default(), vec![], file)
    }

    pub fn agent(&self, name: &str) -> Option<&AgentDef> {
        self.agents.get(name)
    }

    pub fn agent_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.agents.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The tool `name` if `agent` may call it.
    pub fn tool_for(&self, agent: &AgentDef, name: &str) -> Option<&ToolDef> {
        if agent.tools.iter().any(|t| t == name) {
            self.tools.get(name)
        } else {
            None
        }
    }

    pub fn tool(&self, name: &str) -> Option<&ToolDef> {
        self.tools.get(name)
    }

    /// The tool specs an agent's model is given.
    pub fn specs(&self, agent: &str) -> &[ToolSpec] {
        self.specs.get(agent).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str) -> AgentsFile {
        serde_json::from_str(json).expect("parses")
    }

    #[test]
    fn builtins_have_the_seed_tools() {
        let c = Catalog::new(Limits::default(), vec![], None).expect("builds");
        let o = c.agent(ORCHESTRATOR).expect("orchestrator");
        assert_eq!(
            o.tools,
            vec![tools::SPAWN_SUBAGENT, tools::REQUEST_HUMAN_FEEDBACK]
        );
        assert!(c.agent("explore").is_some() && c.agent("code").is_some());
        assert_eq!(c.specs(ORCHESTRATOR).len(), 2);
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
        let spawn = c.tool(tools::SPAWN_SUBAGENT).expect("spawn");
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
}
