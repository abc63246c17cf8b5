//! MCP servers as tool sources, through `rmcp` (the official Rust SDK, client side).
//!
//! A server is `{"url": ..., "headers": {...}}` (streamable HTTP: Lambda and anywhere) or
//! `{"command": ..., "args": [...]}` (stdio: a child process, `baton dev` only). The
//! connection is opened on first use and kept for the process; its tool list is fetched
//! once (the catalog keeps it). A call that fails on the transport reconnects once and
//! tries again (a restarted server, a respawned process); if that fails too the call is an
//! error result the model sees, never a crash.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use baton_core::agents_file::{McpServerSpec, expand};
use baton_core::tools::{Tool, ToolContext, ToolServer};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tracing::{info, warn};

use crate::Host;

/// How long connecting (and the MCP handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

enum Transport {
    Http {
        url: String,
        headers: reqwest::header::HeaderMap,
    },
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

type Client = RunningService<RoleClient, ()>;

struct Inner {
    name: String,
    transport: Transport,
    timeout: Option<Duration>,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
}

/// One configured MCP server.
pub struct McpServer(Arc<Inner>);

impl McpServer {
    pub fn new(
        name: &str,
        spec: &McpServerSpec,
        host: Host,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        if name.is_empty()
            || name.contains("__")
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err("a server name uses letters, digits, `-` and `_` (not `__`)".into());
        }
        if spec.timeout_seconds == Some(0) {
            return Err("`timeoutSeconds` must be at least 1".into());
        }
        let transport = match (&spec.url, &spec.command) {
            (Some(url), None) => {
                let parsed = reqwest::Url::parse(url)
                    .map_err(|e| format!("`url` {url:?} is not a URL: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(format!("`url` {url:?} must be http:// or https://"));
                }
                if !spec.args.is_empty() || !spec.env.is_empty() {
                    return Err("`args` and `env` are for stdio servers (`command`)".into());
                }
                Transport::Http {
                    url: url.clone(),
                    headers: crate::http::headers(&spec.headers, lookup)?,
                }
            }
            (None, Some(command)) => {
                if host == Host::Lambda {
                    return Err(format!(
                        "`command` ({command}) starts a stdio server, which only `baton dev` \
                         can do; on Lambda give the server a `url` (streamable HTTP)"
                    ));
                }
                if !spec.headers.is_empty() {
                    return Err("`headers` are for HTTP servers (`url`)".into());
                }
                let mut env = BTreeMap::new();
                for (k, v) in &spec.env {
                    env.insert(
                        k.clone(),
                        expand(v, lookup).map_err(|e| format!("env `{k}`: {e}"))?,
                    );
                }
                Transport::Stdio {
                    command: command.clone(),
                    args: spec.args.clone(),
                    env,
                }
            }
            _ => {
                return Err(
                    "give exactly one of `url` (streamable HTTP) and `command` (stdio)".into(),
                );
            }
        };
        Ok(Self(Arc::new(Inner {
            name: name.to_owned(),
            transport,
            timeout: spec.timeout_seconds.map(Duration::from_secs),
            client: tokio::sync::Mutex::new(None),
        })))
    }
}

impl Inner {
    fn describe(&self) -> String {
        match &self.transport {
            Transport::Http { url, .. } => format!("MCP server `{}` at {url}", self.name),
            Transport::Stdio { command, .. } => format!("MCP server `{}` ({command})", self.name),
        }
    }

    async fn open(&self) -> Result<Client, String> {
        let started = match &self.transport {
            Transport::Http { url, headers } => {
                let http = reqwest::Client::builder()
                    .default_headers(headers.clone())
                    .build()
                    .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                let transport = StreamableHttpClientTransport::with_client(http, config);
                tokio::time::timeout(CONNECT_TIMEOUT, ().serve(transport))
                    .await
                    .map_err(|_| "no answer to the handshake in time".to_owned())?
                    .map_err(|e| e.to_string())
            }
            Transport::Stdio { command, args, env } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).envs(env);
                let (child, _) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map_err(|e| format!("cannot start `{command}`: {e}"))?;
                tokio::time::timeout(CONNECT_TIMEOUT, ().serve(child))
                    .await
                    .map_err(|_| "no answer to the handshake in time".to_owned())?
                    .map_err(|e| e.to_string())
            }
        };
        started.map_err(|e| format!("cannot connect to the {}: {e}", self.describe()))
    }

    /// The open connection, opening one if there is none (or `fresh` asks for a new one).
    async fn client(&self, fresh: bool) -> Result<Arc<Client>, String> {
        let mut slot = self.client.lock().await;
        if fresh && let Some(old) = slot.take() {
            old.cancellation_token().cancel();
        }
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = Arc::new(self.open().await?);
        info!(server = %self.name, "MCP server connected");
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Runs `f` on the connection; on a transport failure, once more on a new one.
    async fn with_client<T, F, Fut>(&self, f: F) -> Result<T, String>
    where
        F: Fn(Arc<Client>) -> Fut,
        Fut: std::future::Future<Output = Result<T, rmcp::ServiceError>>,
    {
        let first = f(self.client(false).await?).await;
        match first {
            Ok(t) => Ok(t),
            Err(rmcp::ServiceError::McpError(e)) => {
                Err(format!("{}: {}", self.describe(), e.message))
            }
            Err(e) => {
                warn!(server = %self.name, error = %e, "MCP call failed; reconnecting");
                let c = self.client(true).await?;
                f(c).await.map_err(|e| format!("{}: {e}", self.describe()))
            }
        }
    }
}

#[async_trait::async_trait]
impl ToolServer for McpServer {
    async fn list(&self) -> Result<Vec<Arc<dyn Tool>>, String> {
        let inner = &self.0;
        let tools = inner
            .with_client(|c| async move { c.list_all_tools().await })
            .await?;
        Ok(tools
            .into_iter()
            .map(|t| {
                let tool: Arc<dyn Tool> = Arc::new(McpTool {
                    server: self.0.clone(),
                    name: format!("{}__{}", inner.name, t.name),
                    remote: t.name.to_string(),
                    description: t
                        .description
                        .map(|d| d.to_string())
                        .unwrap_or_else(|| format!("`{}` of MCP server `{}`", t.name, inner.name)),
                    schema: Value::Object((*t.input_schema).clone()),
                });
                tool
            })
            .collect())
    }
}

/// One tool of an MCP server, as the model sees it: `<server>__<tool>`.
struct McpTool {
    server: Arc<Inner>,
    name: String,
    remote: String,
    description: String,
    schema: Value,
}

#[async_trait::async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn schema(&self) -> Value {
        self.schema.clone()
    }
    fn timeout(&self) -> Option<Duration> {
        self.server.timeout
    }
    async fn execute(&self, _: &ToolContext, input: Value) -> Result<Value, String> {
        let arguments = match input {
            Value::Object(map) => map,
            _ => return Err("MCP tool arguments must be an object".into()),
        };
        let remote = self.remote.clone();
        let result = self
            .server
            .with_client(|c| {
                let params =
                    CallToolRequestParams::new(remote.clone()).with_arguments(arguments.clone());
                async move { c.call_tool(params).await }
            })
            .await?;
        output(result)
    }
}

/// A tool result from MCP's: structured content if the server gave it, else the text
/// content; `isError` makes it an error result with that text.
fn output(r: CallToolResult) -> Result<Value, String> {
    let text: Vec<String> = r
        .content
        .iter()
        .map(|c| match c {
            ContentBlock::Text(t) => t.text.clone(),
            ContentBlock::Image(i) => format!("[image: {}]", i.mime_type),
            ContentBlock::Audio(a) => format!("[audio: {}]", a.mime_type),
            ContentBlock::Resource(_) => "[embedded resource]".to_owned(),
            ContentBlock::ResourceLink(l) => format!("[resource: {}]", l.uri),
            _ => "[content of a kind Baton does not show]".to_owned(),
        })
        .collect();
    let text = text.join("\n");
    if r.is_error == Some(true) {
        return Err(if text.is_empty() {
            "the tool reported an error".into()
        } else {
            text
        });
    }
    Ok(match r.structured_content {
        Some(v) if !v.is_null() => v,
        _ => Value::String(text),
    })
}
