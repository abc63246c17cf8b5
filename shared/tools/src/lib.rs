//! The tools an agents file configures, built into the core's [`Catalog`]:
//! [`mcp`] (MCP servers through `rmcp`, the official Rust SDK: streamable HTTP anywhere, stdio
//! under `baton dev` only), [`http`] (a tool that is an HTTP endpoint) and [`fetch`]
//! (`http_fetch`, the built-in `explore` agent's GET of an allowed page).
//!
//! [`load_catalog`] is what every host calls at start-up.

pub mod fetch;
pub mod http;
pub mod mcp;
pub mod vars;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use baton_core::agent::{AgentsFile, Catalog, CatalogError, Extensions, Limits, Toolbox};
use baton_core::tools::ToolServer;

/// Where the catalog will run: stdio MCP servers start a process, which only `baton dev`
/// may do (a Lambda function has no such process to start, and no state to keep it in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Dev,
    Lambda,
}

/// The catalog of an agents file (or the built-ins alone), with its MCP servers, HTTP tools
/// and `http_fetch` built, and the deployment's own tools, plugins and agents (`ext`) beside
/// them. `${VAR}` in headers and in a
/// stdio server's environment is read through `lookup`. A problem is a start-up error
/// naming it; a server that is down is not (its tools are listed when it answers).
pub fn catalog(
    file: Option<AgentsFile>,
    host: Host,
    lookup: &dyn Fn(&str) -> Option<String>,
    ext: &Extensions,
) -> Result<Catalog, CatalogError> {
    let file = ext.agents_into(file).unwrap_or_default();
    let mut toolbox = Toolbox {
        tools: ext.tools(),
        servers: BTreeMap::new(),
    };
    for (name, spec) in &file.tools {
        let tool =
            http::HttpTool::new(name, spec, lookup).map_err(|message| CatalogError::HttpTool {
                tool: name.clone(),
                message,
            })?;
        toolbox.tools.push(Arc::new(tool));
    }
    if let Some(spec) = &file.http_fetch {
        let fetch = fetch::HttpFetch::new(spec).map_err(|message| CatalogError::HttpTool {
            tool: baton_core::agent::HTTP_FETCH.into(),
            message,
        })?;
        toolbox.tools.push(Arc::new(fetch));
    }
    for (name, spec) in &file.mcp_servers {
        let server = mcp::McpServer::new(name, spec, host, lookup).map_err(|message| {
            CatalogError::Server {
                server: name.clone(),
                message,
            }
        })?;
        toolbox
            .servers
            .insert(name.clone(), Arc::new(server) as Arc<dyn ToolServer>);
    }
    Ok(ext.plugins_onto(Catalog::build(Limits::default(), toolbox, Some(file))?))
}

/// [`catalog`] of the agents file at `path`, else of `config`'s (`BATON_AGENTS_FILE`,
/// `BATON_AGENTS_JSON`), with the process environment and the deployment's `ext`.
pub fn load_catalog(
    path: Option<&Path>,
    config: &baton_core::config::Config,
    host: Host,
    ext: &Extensions,
) -> Result<Catalog, CatalogError> {
    let file = match path {
        Some(p) => Some(AgentsFile::load(p)?),
        None => config.agents()?,
    };
    catalog(file, host, &|k| std::env::var(k).ok(), ext)
}
