//! MCP servers as tool sources, through `rmcp` (the official Rust SDK, client side).
//!
//! A server is `{"url": ..., "headers": {...}}` (streamable HTTP: Lambda and anywhere) or
//! `{"command": ..., "args": [...]}` (stdio: a child process, `baton dev` only). The
//! connection is opened on first use and kept for the process; its tool list is fetched
//! once (the catalog keeps it). `${VAR}` in its arguments, environment and headers is read
//! from the environment at start-up; `${run.sandboxId}`, `${run.githubRepo}` and
//! `${run.githubRef}` from the calling run: such a server keeps a connection (a process, for
//! stdio) per run scope, at most [`MAX_SCOPED_CONNECTIONS`]. A call that fails on the transport reconnects once and
//! tries again (a restarted server, a respawned process); if that fails too the call is an
//! error result the model sees, never a crash.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use baton_core::agents_file::{McpServerSpec, expand};
use baton_core::scope::{RUN_VARS, Scope};
use baton_core::tools::{Effects, Tool, ToolContext, ToolError, ToolServer};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tracing::{info, warn};

use crate::Host;
use crate::vars::{expand_env, expand_run};

/// How long connecting (and the MCP handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

enum Transport {
    Http {
        /// The URL, `${VAR}` filled in, `${run.…}` not yet.
        url: String,
        /// The URL as the agents file writes it: what messages show (a `${VAR}` may be a
        /// secret).
        shown: String,
        /// Header names and values, `${VAR}` expanded, `${run.…}` not yet.
        headers: Vec<(String, String)>,
    },
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

type Client = RunningService<RoleClient, ()>;

/// A server that names a run's scope keeps this many connections (processes, for stdio) at
/// most, one per scope; the least recently used is closed for a new one.
pub const MAX_SCOPED_CONNECTIONS: usize = 8;

struct Inner {
    name: String,
    transport: Transport,
    timeout: Option<Duration>,
    /// Its tools' effects (`once` unless the agents file says), and some tools' own.
    effects: Effects,
    tool_effects: std::collections::BTreeMap<String, Effects>,
    /// The run variables its configuration names ([`RUN_VARS`]): it connects once per run
    /// scope (their values); none, once for every run.
    vars: Vec<&'static str>,
    /// Open connections by the values of `vars`, least recently used first.
    clients: tokio::sync::Mutex<Vec<(Vec<String>, Arc<Client>)>>,
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
            (Some(spec_url), None) => {
                // `${VAR}` now; `${run.…}` per run scope, like the headers.
                let url = expand_env(spec_url, lookup).map_err(|e| format!("`url`: {e}"))?;
                let sample = expand(&url, &|k| RUN_VARS.contains(&k).then(|| "x".to_owned()))?;
                let parsed = reqwest::Url::parse(&sample)
                    .map_err(|e| format!("`url` {spec_url:?} is not a URL: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(format!("`url` {url:?} must be http:// or https://"));
                }
                if !spec.args.is_empty() || !spec.env.is_empty() {
                    return Err("`args` and `env` are for stdio servers (`command`)".into());
                }
                let mut headers = Vec::new();
                for (k, v) in &spec.headers {
                    headers.push((
                        k.clone(),
                        expand_env(v, lookup).map_err(|e| format!("header `{k}`: {e}"))?,
                    ));
                }
                // Each header is valid whatever the run's names (plain names) fill in.
                let filled = Scope {
                    sandbox_id: Some("x".into()),
                    github: Some(baton_core::scope::GithubRepo {
                        repo: "x/x".into(),
                        git_ref: Some("x".into()),
                    }),
                };
                let checked: Result<BTreeMap<_, _>, String> = headers
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), expand_run(v, &filled)?)))
                    .collect();
                crate::vars::headers(&checked?, &|_| None)?;
                Transport::Http {
                    url,
                    shown: spec_url.clone(),
                    headers,
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
                        expand_env(v, lookup).map_err(|e| format!("env `{k}`: {e}"))?,
                    );
                }
                let args = spec
                    .args
                    .iter()
                    .map(|a| expand_env(a, lookup).map_err(|e| format!("args: {e}")))
                    .collect::<Result<_, _>>()?;
                Transport::Stdio {
                    command: command.clone(),
                    args,
                    env,
                }
            }
            _ => {
                return Err(
                    "give exactly one of `url` (streamable HTTP) and `command` (stdio)".into(),
                );
            }
        };
        let texts: Vec<&str> = match &transport {
            Transport::Http { url, headers, .. } => std::iter::once(url.as_str())
                .chain(headers.iter().map(|(_, v)| v.as_str()))
                .collect(),
            Transport::Stdio { args, env, .. } => args
                .iter()
                .chain(env.values())
                .map(String::as_str)
                .collect(),
        };
        let vars = RUN_VARS
            .into_iter()
            .filter(|v| texts.iter().any(|t| t.contains(&format!("${{{v}}}"))))
            .collect();
        Ok(Self(Arc::new(Inner {
            name: name.to_owned(),
            transport,
            timeout: spec.timeout_seconds.map(Duration::from_secs),
            effects: spec.effects.unwrap_or(Effects::Once),
            tool_effects: spec.tool_effects.clone(),
            vars,
            clients: tokio::sync::Mutex::new(Vec::new()),
        })))
    }
}

impl Inner {
    fn describe(&self) -> String {
        match &self.transport {
            Transport::Http { shown, .. } => format!("MCP server `{}` at {shown}", self.name),
            Transport::Stdio { command, .. } => format!("MCP server `{}` ({command})", self.name),
        }
    }

    /// The values of the run variables it names, for a run of `scope`.
    fn key(&self, scope: &Scope) -> Result<Vec<String>, String> {
        self.vars
            .iter()
            .map(|v| {
                scope.var(v).map(str::to_owned).ok_or_else(|| {
                    format!(
                        "{} needs the run's `${{{v}}}`, and this run has none",
                        self.describe()
                    )
                })
            })
            .collect()
    }

    async fn open(&self, scope: &Scope) -> Result<Client, String> {
        let started = match &self.transport {
            Transport::Http { url, headers, .. } => {
                let filled: Result<BTreeMap<_, _>, String> = headers
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), expand_run(v, scope)?)))
                    .collect();
                let headers = crate::vars::headers(&filled?, &|_| None)?;
                let refused = Arc::new(std::sync::Mutex::new(None));
                let http = reqwest::Client::builder()
                    .default_headers(headers)
                    .redirect(same_origin_only(refused.clone()))
                    .build()
                    .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
                let url = expand_run(url, scope)?;
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                let transport = StreamableHttpClientTransport::with_client(http, config);
                tokio::time::timeout(CONNECT_TIMEOUT, ().serve(transport))
                    .await
                    .map_err(|_| "no answer to the handshake in time".to_owned())?
                    .map_err(|e| {
                        // The transport's error does not carry the policy's reason: say it.
                        match refused.lock().ok().and_then(|r| r.clone()) {
                            Some(why) => why,
                            None => e.to_string(),
                        }
                    })
            }
            Transport::Stdio { command, args, env } => {
                let mut cmd = tokio::process::Command::new(command);
                for a in args {
                    cmd.arg(expand_run(a, scope)?);
                }
                for (k, v) in env {
                    cmd.env(k, expand_run(v, scope)?);
                }
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

    /// The open connection for `scope`, opening one if there is none (or `fresh` asks for a
    /// new one).
    async fn client(&self, scope: &Scope, fresh: bool) -> Result<Arc<Client>, String> {
        let key = self.key(scope)?;
        let mut open = self.clients.lock().await;
        if let Some(at) = open.iter().position(|(k, _)| *k == key) {
            let (k, c) = open.remove(at);
            if !fresh {
                open.push((k, c.clone()));
                return Ok(c);
            }
            c.cancellation_token().cancel();
        }
        let c = Arc::new(self.open(scope).await?);
        info!(server = %self.name, scope = ?key, "MCP server connected");
        if open.len() >= MAX_SCOPED_CONNECTIONS {
            let (_, oldest) = open.remove(0);
            oldest.cancellation_token().cancel();
        }
        open.push((key, c.clone()));
        Ok(c)
    }

    /// Runs `f` on the connection for `scope`; on a transport failure, once more on a new one.
    async fn with_client<T, F, Fut>(&self, scope: &Scope, f: F) -> Result<T, String>
    where
        F: Fn(Arc<Client>) -> Fut,
        Fut: std::future::Future<Output = Result<T, rmcp::ServiceError>>,
    {
        let first = f(self.client(scope, false).await?).await;
        match first {
            Ok(t) => Ok(t),
            Err(rmcp::ServiceError::McpError(e)) => {
                Err(format!("{}: {}", self.describe(), e.message))
            }
            Err(e) => {
                warn!(server = %self.name, error = %e, "MCP call failed; reconnecting");
                let c = self.client(scope, true).await?;
                f(c).await.map_err(|e| format!("{}: {e}", self.describe()))
            }
        }
    }
}

#[async_trait::async_trait]
impl ToolServer for McpServer {
    async fn list(&self) -> Result<Vec<Arc<dyn Tool>>, String> {
        self.list_for(&Scope::default()).await
    }

    fn lists_for(&self, scope: &Scope) -> bool {
        self.0.key(scope).is_ok()
    }

    /// Its tools are the same for every run: a server that names a run's scope lists them
    /// through the first run that has one.
    async fn list_for(&self, scope: &Scope) -> Result<Vec<Arc<dyn Tool>>, String> {
        let inner = &self.0;
        let tools = inner
            .with_client(scope, |c| async move { c.list_all_tools().await })
            .await?;
        Ok(tools
            .into_iter()
            .map(|t| {
                let effects = inner
                    .tool_effects
                    .get(t.name.as_ref())
                    .copied()
                    .unwrap_or(inner.effects);
                let tool: Arc<dyn Tool> = Arc::new(McpTool {
                    server: self.0.clone(),
                    effects,
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
    effects: Effects,
    name: String,
    remote: String,
    description: String,
    schema: Value,
}

/// Where a `tools/call` request's `_meta` carries the call's idempotency key.
pub const IDEMPOTENCY_META_KEY: &str = "io.baton/idempotencyKey";

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
    fn effects(&self) -> Effects {
        self.effects
    }
    async fn execute(&self, ctx: &ToolContext, input: Value) -> Result<Value, ToolError> {
        let out: Result<Value, String> = async move {
            let arguments = match input {
                Value::Object(map) => map,
                _ => return Err("MCP tool arguments must be an object".into()),
            };
            let remote = self.remote.clone();
            // MCP has no idempotency key of its own: the call's goes in the request's `_meta`,
            // under a key of Baton's (`_meta` keys are namespaced by a reverse-DNS prefix).
            let mut meta = rmcp::model::MetaObject::new();
            meta.0.insert(
                IDEMPOTENCY_META_KEY.into(),
                Value::String(ctx.idempotency_key().to_owned()),
            );
            let meta = rmcp::model::RequestMetaObject(meta);
            let result = self
                .server
                .with_client(ctx.scope(), |c| {
                    let mut params = CallToolRequestParams::new(remote.clone())
                        .with_arguments(arguments.clone());
                    params.meta = Some(meta.clone());
                    async move { c.call_tool(params).await }
                })
                .await?;
            output(ctx, &self.remote, result)
        }
        .await;
        out.map_err(ToolError::Model)
    }
}

/// An image or audio clip a tool returned, kept as a file of the run (its bytes in the blob
/// store, the model told its summary); what the model reads in its place.
fn keep(ctx: &ToolContext, tool: &str, n: usize, kind: &str, data: &str, mime: &str) -> String {
    use base64::Engine;
    let ext = mime.rsplit('/').next().unwrap_or("bin");
    let name = format!("{tool}-{kind}-{n}.{ext}");
    let kept = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| format!("its data is not base64: {e}"))
        .and_then(|bytes| {
            let what = if kind == "image" {
                "an image"
            } else {
                "an audio clip"
            };
            let summary = format!("{what} ({mime}, {} bytes) `{tool}` returned", bytes.len());
            ctx.file(&name, mime, bytes, &summary).map(|()| summary)
        });
    match kept {
        Ok(summary) => format!("[{summary}: kept as the file `{name}`]"),
        Err(why) => format!("[{kind}: {mime}, not kept: {why}]"),
    }
}

/// A tool result from MCP's: structured content if the server gave it, else the text
/// content; `isError` makes it an error result with that text. Images and audio clips are
/// kept as files of the run, the text naming each.
fn output(ctx: &ToolContext, tool: &str, r: CallToolResult) -> Result<Value, String> {
    let text: Vec<String> = r
        .content
        .iter()
        .enumerate()
        .map(|(n, c)| match c {
            ContentBlock::Text(t) => t.text.clone(),
            ContentBlock::Image(i) => keep(ctx, tool, n + 1, "image", &i.data, &i.mime_type),
            ContentBlock::Audio(a) => keep(ctx, tool, n + 1, "audio", &a.data, &a.mime_type),
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

/// An MCP server over HTTP is followed only within its URL's origin (scheme, host and
/// port): a redirect elsewhere would take the server's headers — its secrets — and the
/// calls' inputs to a host the agents file never named, so it fails the connection or call
/// instead, naming where it pointed.
/// What it refused is kept in `refused` (the MCP transport's error does not carry it).
fn same_origin_only(refused: Arc<std::sync::Mutex<Option<String>>>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        let from = attempt.previous().first().map(|u| u.origin());
        let why = if attempt.previous().len() > 5 {
            "more than 5 redirects: not followed".to_owned()
        } else if from.is_some_and(|o| o != attempt.url().origin()) {
            let to = attempt.url().origin().ascii_serialization();
            format!(
                "redirected to another origin ({to}): not followed (an MCP server is followed \
                 only within its URL's origin)"
            )
        } else {
            return attempt.follow();
        };
        if let Ok(mut slot) = refused.lock() {
            *slot = Some(why.clone());
        }
        attempt.error(why)
    })
}

#[cfg(test)]
mod tests;
