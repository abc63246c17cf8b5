//! The catalog of a host that never runs a tool (the `api` and `events` functions): the
//! agents file's HTTP tools, `http_fetch` and MCP servers known by name only.

use std::sync::Arc;

use serde_json::Value;

use super::catalog::{Catalog, HTTP_FETCH, Toolbox};
use super::{AgentsFile, CatalogError, Extensions, Limits};
use crate::tools::{Tool, ToolContext, ToolError, ToolServer};

impl Catalog {
    /// The catalog of a host that never runs a tool (the `api` and `events` functions): the
    /// file's HTTP tools, `http_fetch` and MCP servers are declared by name, so its agents
    /// check out, but no client is built; a call to one is an error saying where tools run.
    /// The deployment's own Rust tools (`ext`) are there as they are: they are only run
    /// where a step runs them.
    pub fn declared(file: Option<AgentsFile>, ext: &Extensions) -> Result<Self, CatalogError> {
        let mut toolbox = Toolbox {
            tools: ext.tools(),
            ..Toolbox::default()
        };
        let Some(file) = ext.agents_into(file) else {
            return Ok(ext.plugins_onto(Self::assemble(Limits::default(), toolbox, None)?));
        };
        for (name, spec) in &file.tools {
            toolbox.tools.push(Arc::new(Declared {
                name: name.clone(),
                description: spec.description.clone(),
                schema: spec.schema.clone(),
            }));
        }
        if file.http_fetch.is_some() {
            toolbox.tools.push(Arc::new(Declared {
                name: HTTP_FETCH.into(),
                description: "Fetch a page by URL.".into(),
                schema: serde_json::json!({"type": "object"}),
            }));
        }
        for name in file.mcp_servers.keys() {
            toolbox
                .servers
                .insert(name.clone(), Arc::new(Declared::server(name)));
        }
        Ok(ext.plugins_onto(Self::assemble(Limits::default(), toolbox, Some(file))?))
    }
}

/// A tool or MCP server a host knows by name only (see [`Catalog::declared`]).
struct Declared {
    name: String,
    description: String,
    schema: Value,
}

impl Declared {
    fn server(name: &str) -> Self {
        Self {
            name: name.into(),
            description: String::new(),
            schema: Value::Null,
        }
    }

    fn refusal(&self) -> String {
        format!(
            "`{}` runs only where steps run (baton dev, the orchestrator and subagent functions)",
            self.name
        )
    }
}

#[async_trait::async_trait]
impl Tool for Declared {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn schema(&self) -> Value {
        self.schema.clone()
    }
    fn effects(&self) -> crate::tools::Effects {
        // It refuses every call: nothing happens, twice or once.
        crate::tools::Effects::None
    }
    async fn execute(&self, _: &ToolContext, _: Value) -> Result<Value, ToolError> {
        Err(self.refusal().into())
    }
}

#[async_trait::async_trait]
impl ToolServer for Declared {
    async fn list(&self) -> Result<Vec<Arc<dyn Tool>>, String> {
        Err(self.refusal())
    }
}
