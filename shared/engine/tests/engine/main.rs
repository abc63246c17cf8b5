//! The engine's tests: every transition, no I/O, on the in-memory world of
//! [`baton_engine::testkit`]. This file holds the book its runs are decided with (the
//! built-in agents and tools, the test agents below, and `echo`, `book` and `pay`, their
//! inputs checked against their schemas as a host checks them); each topic has a file of
//! its own.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use baton_engine::agent::{AgentDef, Approval, ApprovalBatch, Book, Limits, Tools, UnknownOutcome};
use baton_engine::cta::{ChoiceOption, CtaRequest, CtaResponse, CtaStatus};
use baton_engine::engine::*;
use baton_engine::llm::{LlmReply, ToolCall, ToolSpec};
use baton_engine::message::{ChildOutcome, Effect, Input, StepMessage};
use baton_engine::run::{ExpiryPolicy, RunStatus, Usage};
use baton_engine::testkit::*;
use baton_engine::timeline::{Entry, EntryBody, ToolEntry, ToolResult};
use baton_engine::tools::{Effects, Offered, ToolKind};
use baton_engine::{builtin, cost::Prices};

/// The world over the test book, at the default guardrails.
fn sim() -> Sim {
    sim_with(Limits::default())
}

/// The world over the test book with these guardrails.
fn sim_with(limits: Limits) -> Sim {
    let agents = test_agents(&limits);
    Sim::over(book(limits, agents))
}

/// The agents the topics' runs are of (beside the built-in ones).
fn test_agents(l: &Limits) -> Vec<AgentDef> {
    const ASK: &str = "request_human_feedback";
    const SPAWN: &str = "spawn_subagent";
    const PLAN: &str = "agent_orchestrate";
    let a = |name: &str, tools: &[&str]| AgentDef::new(name, "", tools, l);
    let wall = |s| Some(Duration::from_secs(s));
    vec![
        AgentDef {
            approval: approval("echo", Some("danger"), None),
            max_iterations: 3,
            ..a("worker", &["echo"])
        },
        AgentDef {
            max_tool_calls_per_turn: 20,
            ..a("asker", &[ASK, "echo"])
        },
        a("deep", &[SPAWN]),
        a("mid", &[SPAWN]),
        AgentDef {
            cta_expiry: Duration::from_secs(60),
            approval: approval("echo", None, None),
            ..a("quick", &[ASK, "echo"])
        },
        AgentDef {
            max_wall: wall(60),
            ..a("timed", &[ASK, "echo"])
        },
        AgentDef {
            approval_batch: ApprovalBatch::Independent,
            approval: approval("echo", Some("danger"), Some("It says danger.")),
            ..a("free", &["echo"])
        },
        AgentDef {
            max_tool_calls_per_turn: 8,
            max_iterations: 10,
            ..a("capped", &["echo"])
        },
        AgentDef {
            max_wall: wall(60),
            ..a("patient", &[SPAWN])
        },
        a("alpha", &[]),
        a("beta", &[]),
        a("gamma", &[]),
        AgentDef {
            max_wall: wall(120),
            ..a("lead", &[PLAN])
        },
        AgentDef {
            approval: approval(PLAN, Some("code"), None),
            ..a("careful_lead", &[PLAN])
        },
        AgentDef {
            max_tool_calls_per_turn: 20,
            ..a("payer", &["echo", "book", "pay"])
        },
        AgentDef {
            on_unknown_outcome: UnknownOutcome::Ask,
            ..a("careful_payer", &["echo", "book", "pay"])
        },
        a("asking_payer", &["echo", "book", "pay", ASK]),
    ]
}

/// An agent's approval rule for `tool`: always, or when its input matches `matches`.
fn approval(tool: &str, matches: Option<&str>, reason: Option<&str>) -> HashMap<String, Approval> {
    let rule = Approval {
        input_matches: matches.map(|m| regex::Regex::new(m).unwrap()),
        reason: reason.map(str::to_owned),
        assignment: None,
    };
    HashMap::from([(tool.to_owned(), rule)])
}

/// The book of the built-in agents and `agents` (which may redefine a built-in one): the
/// engine's tools, and `echo` (no effects), `book` (idempotent) and `pay` (once).
fn book(limits: Limits, agents: Vec<AgentDef>) -> Book {
    let mut all: BTreeMap<String, AgentDef> = builtin::agents(&limits, &[])
        .into_iter()
        .chain(agents)
        .map(|a| (a.name.clone(), a))
        .collect();
    let mut tools = Tools::new();
    for (spec, kind) in builtin::tools(&mut all, &limits) {
        tools.insert(
            spec.name.clone(),
            Checked::offered(spec, kind, Effects::None),
        );
    }
    let echo = json!({"type": "object", "properties": {"text": {"type": "string"}},
        "required": ["text"], "additionalProperties": false});
    for (name, schema, effects) in [
        ("echo", echo, Effects::None),
        ("book", json!({"type": "object"}), Effects::Idempotent),
        ("pay", json!({"type": "object"}), Effects::Once),
    ] {
        let spec = ToolSpec {
            name: name.into(),
            description: "a test's tool".into(),
            parameters: schema,
        };
        tools.insert(name.into(), Checked::offered(spec, ToolKind::Exec, effects));
    }
    Book {
        agents: Arc::new(all.into_iter().collect()),
        tools: Arc::new(tools),
        listed: BTreeMap::new(),
        servers: Arc::new(BTreeSet::new()),
        limits,
        prices: Arc::new(Prices::default()),
    }
}

/// A tool whose calls' inputs are checked against its JSON Schema, as a host checks them.
struct Checked {
    spec: ToolSpec,
    kind: ToolKind,
    effects: Effects,
    schema: jsonschema::Validator,
}

impl Checked {
    fn offered(spec: ToolSpec, kind: ToolKind, effects: Effects) -> Arc<dyn Offered> {
        let schema = jsonschema::validator_for(&spec.parameters).unwrap();
        Arc::new(Self {
            spec,
            kind,
            effects,
            schema,
        })
    }
}

impl Offered for Checked {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn kind(&self) -> ToolKind {
        self.kind
    }

    fn validate(&self, input: &Value) -> Result<(), String> {
        let errors: Vec<String> = self
            .schema
            .iter_errors(input)
            .map(|e| match e.instance_path().to_string() {
                path if path.is_empty() => e.to_string(),
                path => format!("{path}: {e}"),
            })
            .collect();
        match errors.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "invalid arguments for `{}`: {}",
                self.spec.name,
                errors.join("; ")
            )),
        }
    }

    fn effects(&self) -> Effects {
        self.effects
    }
}

mod approvals;
mod budgets;
mod calls;
mod children;
mod ctas;
mod cut_replies;
mod limits;
mod plans;
mod thinking;
mod transitions;
mod turns;
