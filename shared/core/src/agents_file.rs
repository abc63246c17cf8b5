//! The agents file (`--agents`, `BATON_AGENTS_FILE`): agents, the tools they may call (HTTP
//! tools, MCP servers, `http_fetch`), model prices and the default tool timeout, as JSON.
//!
//! This module is the file's format and nothing more: [`crate::agent::Catalog`] checks the
//! agents against the tools, and `baton-tools` builds the HTTP and MCP clients.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::cost::Price;
use baton_engine::agent::ApprovalBatch;
pub use baton_engine::tools::Effects;

/// `{"agents": {...}, "mcpServers": {...}, "tools": {...}, "httpFetch": {...},
/// "prices": {...}, "toolTimeoutSeconds": n}`; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AgentsFile {
    #[serde(default)]
    pub agents: BTreeMap<String, AgentSpec>,
    /// MCP servers by name; an agent lists `mcp:<name>` (all its tools) or
    /// `<name>__<tool>` (one).
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
    /// HTTP tools by name.
    #[serde(default)]
    pub tools: BTreeMap<String, HttpToolSpec>,
    /// The `http_fetch` tool the built-in `explore` agent has: which hosts it may GET.
    #[serde(default)]
    pub http_fetch: Option<HttpFetchSpec>,
    /// Prices per model (`provider:model-id`), in US dollars per million tokens; they
    /// replace the built-in table's entry for that model.
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
    /// How long a tool call may take unless the tool says otherwise (default 60).
    #[serde(default)]
    pub tool_timeout_seconds: Option<u64>,
    /// The caps of `agent_orchestrate` plans.
    #[serde(default)]
    pub plans: Option<PlansSpec>,
    /// The channels questions are told through, by name (agents name them in
    /// `questions.notify`).
    #[serde(default)]
    pub notifiers: BTreeMap<String, NotifierSpec>,
}

/// `{"maxSteps": 12, "maxParallel": 4, "maxDepth": 3, "stepTimeoutSeconds": n,
/// "plannerModel", "reviewerModel"}`, every key optional (those are the defaults; no step
/// timeout by default; the helpers think with the deployment's model unless named).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PlansSpec {
    #[serde(default)]
    pub max_steps: Option<u64>,
    #[serde(default)]
    pub max_parallel: Option<u64>,
    #[serde(default)]
    pub max_depth: Option<u64>,
    #[serde(default)]
    pub step_timeout_seconds: Option<u64>,
    /// The built-in planner's model (`provider:model-id`), its prompt kept.
    #[serde(default)]
    pub planner_model: Option<String>,
    /// The built-in plan reviewer's model, its prompt kept.
    #[serde(default)]
    pub reviewer_model: Option<String>,
}

/// An agent as an agents file declares it, or code does: with [`AgentSpec::new`] and its
/// builder methods (it grows with each release: a struct literal outside this crate would
/// not build), or from JSON (every field, in the agents file's form).
///
/// ```
/// use baton_core::agents_file::AgentSpec;
///
/// let assistant = AgentSpec::new("You answer questions about a repository.")
///     .description("Answers questions about the run's repository.")
///     .tools(["github_read"])
///     .model("anthropic:claude-haiku-4-5");
/// assert_eq!(assistant.tools, ["github_read"]);
/// // The same from the agents file's JSON.
/// let same: AgentSpec = serde_json::from_value(serde_json::json!({
///     "system": "You answer questions about a repository.", "tools": ["github_read"]}))
///     .expect("an agent");
/// assert_eq!(same.system, assistant.system);
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[non_exhaustive]
pub struct AgentSpec {
    /// What it is for, as a planner is told (default: none).
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub system: Option<String>,
    /// `provider:model-id` (`openai:`, `anthropic:`, `bedrock:`); an id without a known
    /// prefix goes to the OpenAI-compatible endpoint. Default: `BATON_MODEL`.
    #[serde(default)]
    pub model: Option<String>,
    /// The model for runs whose `context` has this `type` (else `model`).
    #[serde(default)]
    pub model_by_context: BTreeMap<String, String>,
    /// The model for turns that ask for this tier (`normal`, `high`), before `modelByContext`.
    #[serde(default)]
    pub model_by_tier: BTreeMap<crate::timeline::Tier, String>,
    pub tools: Vec<String>,
    #[serde(default)]
    pub approval: BTreeMap<String, ApprovalSpec>,
    /// Who answers its questions and approves its tools' calls, besides the run's owner
    /// (default: the owner alone).
    #[serde(default)]
    pub questions: Option<QuestionsSpec>,
    /// `deferred` (default): while a call of a reply waits for approval, the reply's other
    /// tool calls wait too; `independent`: they run at once.
    #[serde(default)]
    pub approval_batch: Option<ApprovalBatch>,
    /// What its runs do with a tool call of `"effects": "once"` that was started and cut off
    /// before its result was recorded (its process died): `error` (default: the model is
    /// told its outcome is unknown) or `ask` (a person approves running it again).
    #[serde(default)]
    pub on_unknown_outcome: Option<baton_engine::agent::UnknownOutcome>,
    #[serde(default)]
    pub max_iterations: Option<u32>,
    /// Tool calls a turn may make (default 8), over all its replies. Past it, the calls are
    /// not run, an `error` entry says so, and the model is asked for its final answer
    /// without tools.
    #[serde(default)]
    pub max_tool_calls_per_turn: Option<u32>,
    /// Seconds this agent's CTAs wait for an answer (default 30 days; 1 to one year).
    #[serde(default)]
    pub cta_expiry_seconds: Option<u64>,
    /// What its runs do when a question expires unanswered, unless `POST /runs` says:
    /// `end` (default), `continue`, or `default` (the question takes the `default` it was
    /// asked with). Its subagents do as their own agent says, else as their parent.
    #[serde(default)]
    pub on_expiry: Option<baton_engine::run::ExpiryPolicy>,
    /// The longest a run of this agent may work: its clock stops while it or a subagent
    /// waits for a human, and between turns. Past it, the run ends failed with
    /// `deadline_exceeded` (at its next think, or by a timer while it waits on subagents).
    #[serde(default)]
    pub max_wall_seconds: Option<u64>,
    /// What a top-level run of this agent may spend, with its subagents and plan steps, in
    /// US dollars, before its owner is asked whether it may spend more (and the most a
    /// run's own `budgetUsd` may be). Above zero; none: unbounded.
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    /// The most tokens one model reply of this agent may have (sent to every provider;
    /// default `BATON_MAX_OUTPUT_TOKENS`, 4096). A reply cut there is marked `truncated` on
    /// its entry, and the model is asked again.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// How much of a run's history the model is given, in bytes of text (default 400,000,
    /// about 100,000 tokens; at least 1,000): the run's first message and the newest
    /// messages that fit, with a note saying what was left out. A step reads about this
    /// much of a run's history, however long the run.
    #[serde(default)]
    pub context_bytes: Option<usize>,
    /// Text added to the system prompt when a run's `context` has this `type`.
    #[serde(default)]
    pub context_guidance: BTreeMap<String, String>,
    /// Its reply to a blank prompt or follow-up, given without calling the model (default:
    /// "What would you like me to do? …").
    #[serde(default)]
    pub clarifying_reply: Option<String>,
    /// Models tried in order when its model's provider fails retryably past its retries
    /// (an outage, 5xx, 429, overload): each reply records the models that failed before
    /// it, and is priced by the one that answered.
    #[serde(default)]
    pub fallback_models: Vec<String>,
    /// Which tool a turn's first reply must call: `auto` (default), `required`, `none`
    /// (no reply of the agent calls a tool), or `{"tool": "<name>"}`. After a reply with
    /// calls the model chooses, so that a turn can end.
    #[serde(default)]
    pub tool_choice: Option<baton_engine::llm::ToolChoice>,
    /// How hard the model reasons: `{"effort": "low"|"medium"|"high"}` (OpenAI) or
    /// `{"budgetTokens": n}` (Anthropic, Bedrock), each mapped to what the other provider
    /// takes. Reasoning tokens are priced as output.
    #[serde(default)]
    pub reasoning: Option<baton_engine::llm::Reasoning>,
    /// A JSON schema its final answers must match: the provider is asked for it natively
    /// (OpenAI's `response_format`, a forced `final_answer` tool on Anthropic and Bedrock),
    /// a reply that does not match is sent back to the model with what is wrong, and the
    /// run's `output` is the answer as JSON.
    #[serde(default)]
    pub output_schema: Option<serde_json::Value>,
    /// Its named actions (seed 002's `ActionID`), by name: what a `spawn_subagent` call
    /// (`action`, `input`) or a plan step (`action`, `with`) may ask of it, each with its own
    /// prompt and the JSON schemas of its input and output.
    #[serde(default)]
    pub actions: BTreeMap<String, ActionSpec>,
    /// Its model sees images (default false): it is given the images its runs' tools
    /// return (MCP image content, a tool's image files) in its provider's format, the
    /// newest 8 within 15 MB (each at most 3.75 MB); a model that does not see reads each
    /// one's summary, as every model does.
    #[serde(default)]
    pub vision: bool,
    /// How its drafted plans (`execution_mode: draft_only`) are approved, unless the call
    /// says (`approval`): `conversation` (default: the draft is the call's result, and the
    /// model asks the person in its own words) or `question` (an approval CTA).
    #[serde(default)]
    pub plan_approval: Option<baton_engine::plan::PlanApproval>,
    /// The steps its plans (`agent_orchestrate`, its own or its planner's) must include, by
    /// the run's context type (`"*"`: any other, or none): `[{"agent", "optional"?,
    /// "purpose"?}]`, in order. A plan without them is sent back to the planner saying what
    /// is missing (a plan the call gave is an error result); its second fails the call.
    #[serde(default)]
    pub plan_requirements: BTreeMap<String, Vec<baton_engine::plan::Required>>,
}

/// An agent's action: its prompt, and what it takes and gives.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[non_exhaustive]
pub struct ActionSpec {
    #[serde(default)]
    pub description: Option<String>,
    /// Given to the child run first, before the call's words and the input.
    pub prompt: String,
    /// A JSON schema of `"type": "object"` its input must match before a child starts.
    #[serde(default)]
    pub input_schema: Option<serde_json::Value>,
    /// A JSON schema of `"type": "object"` the child's final answer must match (asked
    /// again until it does) before the caller binds it.
    #[serde(default)]
    pub output_schema: Option<serde_json::Value>,
}

impl AgentSpec {
    /// An agent with this system prompt, no tools, and the defaults of every setting.
    pub fn new(system: impl Into<String>) -> Self {
        Self {
            system: Some(system.into()),
            ..Self::default()
        }
    }

    /// What it is for, as a planner is told.
    #[must_use]
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// The tools it may call, by name (catalog tools: built-in, Rust, HTTP or MCP).
    #[must_use]
    pub fn tools<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.tools = names.into_iter().map(Into::into).collect();
        self
    }

    /// Its model, `provider:model-id` (default: `BATON_MODEL`).
    #[must_use]
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// How many times a run of it may think (default: the catalog's limit).
    #[must_use]
    pub fn max_iterations(mut self, n: u32) -> Self {
        self.max_iterations = Some(n);
        self
    }
}

/// `"always"`, or `{"inputMatches"?: regex, "reason"?: text}` (always, without a regex).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ApprovalSpec {
    Keyword(AlwaysKeyword),
    Rule(ApprovalRule),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApprovalRule {
    #[serde(default)]
    pub input_matches: Option<String>,
    /// Why a human must approve, shown with the CTA.
    #[serde(default)]
    pub reason: Option<String>,
    /// Who approves this tool's calls, over the agent's `questions.assignees`.
    #[serde(default)]
    pub assignees: Option<Vec<String>>,
    /// How many distinct people must approve, over the agent's `questions.required`.
    #[serde(default)]
    pub required: Option<u32>,
    /// Over the agent's `questions.notify`.
    #[serde(default)]
    pub notify: Option<Vec<String>>,
}

/// `{"assignees": ["user:alice", "group:ops"], "required": 2}`: who may answer an agent's
/// questions besides the run's owner (`user:<id>`, `group:<name>`; none: the owner alone),
/// and how many distinct people must approve an approval (default 1; at most the number of
/// users named, unless a group is). The model never chooses who answers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuestionsSpec {
    #[serde(default)]
    pub assignees: Vec<String>,
    #[serde(default)]
    pub required: Option<u32>,
    /// The channels (`notifiers`) each assignee is told through, with a one-time link of
    /// their own.
    #[serde(default)]
    pub notify: Option<Vec<String>>,
    /// Tell them again after this many seconds, and every as many after, while it waits.
    #[serde(default)]
    pub remind_after_seconds: Option<u64>,
    /// After this many seconds unanswered, add `escalateTo` to its assignees and tell them.
    #[serde(default)]
    pub escalate_after_seconds: Option<u64>,
    #[serde(default)]
    pub escalate_to: Option<Vec<String>>,
}

/// A channel questions are told through, named by agents' `questions.notify`:
/// `{"type": "webhook", "url", "secret"}` (JSON, signed with `secret`: the
/// `Baton-Signature` header), `{"type": "slack", "url"}` (Slack's incoming-webhook format,
/// with a button holding the recipient's link) or `{"type": "email", "from", "to"}` (a
/// message from `from` to each recipient's address in `to`, which maps `user:`/`group:`
/// names to addresses; sent through SES on AWS and SMTP on `baton dev`). `${VAR}` in `url`,
/// `secret` and `from` is read from the environment at start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NotifierSpec {
    #[serde(rename = "type")]
    pub kind: NotifierKind,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub secret: Option<String>,
    /// An e-mail channel's sender (on AWS, an identity verified in SES).
    #[serde(default)]
    pub from: Option<String>,
    /// An e-mail channel's address book: each recipient's address.
    #[serde(default)]
    pub to: BTreeMap<String, String>,
}

/// What a channel speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotifierKind {
    Webhook,
    Slack,
    Email,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlwaysKeyword {
    Always,
}

/// An MCP server: `url` (streamable HTTP) or `command` (stdio, `baton dev` only).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct McpServerSpec {
    #[serde(default)]
    pub url: Option<String>,
    /// Sent with every request; `${VAR}` is replaced from the environment (on AWS, from
    /// the tool secret first).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub command: Option<String>,
    /// A stdio server's arguments, `${VAR}` expanded. `${run.sandboxId}`, `${run.githubRepo}`
    /// and `${run.githubRef}` (here, in `env` and in `headers`) are the calling run's: the
    /// server is started once per run scope.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment for a stdio server, `${VAR}` expanded.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A call to one of its tools may take this long (default: `toolTimeoutSeconds`).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// Agents granted all of this server's tools, built-in ones (`explore`, `code`)
    /// included, as if they listed `mcp:<name>`.
    #[serde(default)]
    pub agents: Vec<String>,
    /// How a call of its tools may touch the world: `none`, `idempotent` or `once` (the
    /// default: Baton cannot know what a server's tool does, so none runs twice).
    #[serde(default)]
    pub effects: Option<Effects>,
    /// The effects of some of its tools, by the tool's name on the server (`get_time`, not
    /// `clock__get_time`), over `effects`.
    #[serde(default)]
    pub tool_effects: BTreeMap<String, Effects>,
}

/// A tool served by an HTTP endpoint: Baton POSTs the validated input as JSON, with the
/// call's `Idempotency-Key` (derived from the run and the committed call: the same on every
/// run of that call); a 2xx JSON body is the result.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpToolSpec {
    pub url: String,
    pub description: String,
    /// The JSON schema of the input object.
    pub schema: Value,
    /// How a call may touch the world: `idempotent` (the default: the endpoint is sent the
    /// call's key and is trusted to deduplicate on it), `none` or `once`.
    #[serde(default)]
    pub effects: Option<Effects>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// `${VAR}` is expanded as for MCP servers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Which redirects a call follows: within its URL's origin (the default), or to any
    /// origin, sent none of the tool's headers nor its key there.
    #[serde(default)]
    pub redirects: Redirects,
}

/// Which redirects an HTTP tool follows. A redirect to another origin (scheme, host and
/// port) would carry the tool's headers — its secrets — and its key to a host the agents
/// file never named: by default it is not followed, and the call is an error result
/// naming where it pointed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Redirects {
    /// Only to the same scheme, host and port, with the tool's headers.
    #[default]
    SameOrigin,
    /// Also to another origin, sent none of the tool's headers, per-run headers or
    /// `Idempotency-Key` from there on.
    Any,
}

/// `http_fetch`: GET a page from one of `allowHosts` (exact host names, or `*.example.com`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpFetchSpec {
    pub allow_hosts: Vec<String>,
    /// The most of a body kept (default 256 KiB); the model sees at most 64 KiB of text.
    #[serde(default)]
    pub max_bytes: Option<usize>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// An agents file that cannot be read, or is not one.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
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
}

impl AgentsFile {
    pub fn load(path: &std::path::Path) -> Result<Self, FileError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
            path: p.clone(),
            source,
        })?;
        Self::parse(&text, &p)
    }

    /// The file's JSON, `source` naming where it came from in errors.
    pub fn parse(text: &str, source: &str) -> Result<Self, FileError> {
        serde_json::from_str(text).map_err(|e| FileError::Parse {
            path: source.to_owned(),
            source: e,
        })
    }
}

/// Replaces every `${VAR}` in `text` with `lookup(VAR)`; an unset variable is an error
/// naming it (a header without its secret would only fail later, less clearly).
pub fn expand(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("`{text}` has a `${{` without its `}}`"));
        };
        let name = &after[..end];
        match lookup(name) {
            Some(v) => out.push_str(&v),
            None => return Err(format!("`${{{name}}}` is not set")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_expand_and_a_missing_one_is_named() {
        let env = |k: &str| (k == "TOKEN").then(|| "s3cret".to_owned());
        assert_eq!(
            expand("Bearer ${TOKEN}", &env).as_deref(),
            Ok("Bearer s3cret")
        );
        assert_eq!(expand("plain", &env).as_deref(), Ok("plain"));
        let err = expand("x ${NOPE} y", &env).expect_err("unset");
        assert!(err.contains("${NOPE}"), "{err}");
        assert!(expand("${TOKEN", &env).is_err());
    }

    #[test]
    fn the_full_file_parses() {
        let f: AgentsFile = serde_json::from_str(
            r#"{"mcpServers": {
                  "calc": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer ${T}"}},
                  "clock": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "agents": ["explore"]}},
                "tools": {"lookup": {"url": "http://127.0.0.1:1/x", "description": "d",
                  "schema": {"type": "object"}, "timeoutSeconds": 5}},
                "httpFetch": {"allowHosts": ["example.com"]},
                "prices": {"openai:gpt-4o-mini": {"input": 0.15, "output": 0.6}},
                "toolTimeoutSeconds": 30,
                "agents": {"ops": {"tools": ["mcp:calc", "clock__get_current_time"],
                  "maxWallSeconds": 600, "contextGuidance": {"document": "Cite it."}}}}"#,
        )
        .expect("parses");
        assert_eq!(f.mcp_servers["clock"].agents, vec!["explore"]);
        assert_eq!(f.tools["lookup"].timeout_seconds, Some(5));
        assert_eq!(f.agents["ops"].max_wall_seconds, Some(600));
        assert_eq!(f.prices["openai:gpt-4o-mini"].output, 0.6);
    }
}
