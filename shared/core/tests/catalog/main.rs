//! The engine driven with a host's catalog ([`baton_engine::testkit`]'s world over a
//! [`Catalog`]): agents' plugins, and MCP servers listed while a step is under way. The
//! engine's own transitions are tested in `shared/engine`.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Value, json};

use baton_core::agent::{AgentsFile, Book, Catalog, Limits, PluginError, Preparation};
use baton_core::cta::{Cta, CtaResponse};
use baton_core::engine::*;
use baton_core::llm::{LlmError, LlmReply};
use baton_core::message::Input;
use baton_core::run::{NewRun, Run, RunStatus};
use baton_core::timeline::{Entry, EntryBody, ToolResult};
use baton_core::tools::Effects;
use baton_engine::testkit::*;

/// A catalog as the world's agents: its book as listed now, and its plugins.
struct Cat(Arc<Catalog>);

impl Agents for Cat {
    fn book(&self) -> Book {
        self.0.book(&self.0.listed())
    }

    fn prepare<'a>(
        &'a self,
        run: &'a Run,
        seen: Vec<Entry>,
    ) -> Pin<Box<dyn Future<Output = Result<Preparation, PluginError>> + Send + 'a>> {
        Box::pin(async move { self.0.prepare(&run.agent, run, &seen).await })
    }
}

/// The world over the test catalog, its calls keyed as the service keys them.
fn sim() -> Sim {
    let mut s = Sim::over(Cat(Arc::new(catalog_with(Limits::default()))));
    s.key = baton_core::tools::idempotency_key;
    s
}

/// Steps `s` with `catalog` from now on; the catalog is the caller's to read too.
fn use_catalog(s: &mut Sim, catalog: Catalog) -> Arc<Catalog> {
    let catalog = Arc::new(catalog);
    s.agents = Box::new(Cat(catalog.clone()));
    catalog
}

fn catalog_with(limits: Limits) -> Catalog {
    let file: AgentsFile = serde_json::from_value(json!({"agents": {
        "worker": {"tools": ["echo"], "approval": {"echo": {"inputMatches": "danger"}}, "maxIterations": 3},
        "asker": {"tools": ["request_human_feedback", "echo"], "maxToolCallsPerTurn": 20},
        "deep": {"tools": ["spawn_subagent"]},
        "mid": {"tools": ["spawn_subagent"]},
        "quick": {"tools": ["request_human_feedback", "echo"], "ctaExpirySeconds": 60,
                  "approval": {"echo": "always"}},
        "timed": {"tools": ["request_human_feedback", "echo"], "maxWallSeconds": 60},
        "free": {"tools": ["echo"], "approvalBatch": "independent",
                 "approval": {"echo": {"inputMatches": "danger", "reason": "It says danger."}}},
        "capped": {"tools": ["echo"], "maxToolCallsPerTurn": 8, "maxIterations": 10},
        "patient": {"tools": ["spawn_subagent"], "maxWallSeconds": 60},
        "alpha": {"tools": []},
        "beta": {"tools": []},
        "gamma": {"tools": []},
        "lead": {"tools": ["agent_orchestrate"], "maxWallSeconds": 120},
        "careful_lead": {"tools": ["agent_orchestrate"],
                         "approval": {"agent_orchestrate": {"inputMatches": "code"}}},
        "payer": {"tools": ["echo", "book", "pay"], "maxToolCallsPerTurn": 20},
        "careful_payer": {"tools": ["echo", "book", "pay"], "onUnknownOutcome": "ask"},
        "asking_payer": {"tools": ["echo", "book", "pay", "request_human_feedback"]}
    }}))
    .unwrap();
    let tools: Vec<std::sync::Arc<dyn baton_core::tools::Tool>> = vec![
        std::sync::Arc::new(Effectful("book", Effects::Idempotent)),
        std::sync::Arc::new(Effectful("pay", Effects::Once)),
    ];
    Catalog::new(limits, tools, Some(file)).unwrap()
}

/// A tool with effects (`book`: idempotent, `pay`: once): the scripted world runs it as
/// it runs `echo`.
struct Effectful(&'static str, Effects);

#[async_trait::async_trait]
impl baton_core::tools::Tool for Effectful {
    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        "changes the world"
    }
    fn schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn effects(&self) -> Effects {
        self.1
    }
    async fn execute(
        &self,
        _: &baton_core::tools::ToolContext,
        input: Value,
    ) -> Result<Value, baton_core::tools::ToolError> {
        Ok(input)
    }
}

mod listing;
mod plugins;
