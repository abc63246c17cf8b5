//! A deployment's own Rust tools, plugins and agents, in one value every host adds to the
//! catalog it builds: the step functions, the `api` and `events` functions (which know the
//! tools by their specs and never run them), `baton dev` and `baton dev --aws`. A project
//! `baton new` wrote makes it in its tools crate; Baton's own functions and `baton` have none.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::catalog::Catalog;
use super::plugin::{Plugin, Prepare, Typed};
use crate::agents_file::{AgentSpec, AgentsFile};
use crate::tools::Tool;

/// Rust tools, plugins (each for one agent) and agents, added to the agents file's.
#[derive(Clone, Default)]
pub struct Extensions {
    tools: Vec<Arc<dyn Tool>>,
    plugins: Vec<(String, Arc<dyn Prepare>)>,
    agents: BTreeMap<String, AgentSpec>,
}

impl Extensions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool: an agent reaches it by listing its name in its `tools`.
    pub fn tool(mut self, tool: impl Tool + 'static) -> Self {
        self.tools.push(Arc::new(tool));
        self
    }

    /// Gives `agent` a plugin, asked before each of its thinks after those it has.
    pub fn plugin(mut self, agent: &str, plugin: impl Plugin) -> Self {
        self.plugins.push((
            agent.to_owned(),
            Arc::new(Typed(plugin)) as Arc<dyn Prepare>,
        ));
        self
    }

    /// Adds an agent, as the agents file would define it. The file's own agent of the same
    /// name wins: a deployment's file can always change what the code ships.
    pub fn agent(mut self, name: &str, spec: AgentSpec) -> Self {
        self.agents.insert(name.to_owned(), spec);
        self
    }

    /// The tools, to build a catalog with.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    /// The names of the tools.
    pub fn tool_names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.name()).collect()
    }

    /// `file` with these agents added (none: a file of these agents alone, if any).
    pub fn agents_into(&self, file: Option<AgentsFile>) -> Option<AgentsFile> {
        if self.agents.is_empty() {
            return file;
        }
        let mut file = file.unwrap_or_default();
        for (name, spec) in &self.agents {
            file.agents
                .entry(name.clone())
                .or_insert_with(|| spec.clone());
        }
        Some(file)
    }

    /// `catalog` with these plugins given to their agents (a plugin for an agent it does not
    /// define is left out, as [`Catalog::with_plugin`] does).
    pub fn plugins_onto(&self, catalog: Catalog) -> Catalog {
        self.plugins
            .iter()
            .fold(catalog, |c, (agent, p)| c.with_prepare(agent, p.clone()))
    }
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extensions")
            .field("tools", &self.tool_names())
            .field(
                "plugins",
                &self
                    .plugins
                    .iter()
                    .map(|(a, p)| format!("{a}: {}", p.name()))
                    .collect::<Vec<_>>(),
            )
            .field("agents", &self.agents.keys().collect::<Vec<_>>())
            .finish()
    }
}
