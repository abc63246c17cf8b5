//! Tools: what an agent can call.
//!
//! Two tools are the engine's own (`spawn_subagent`, `request_human_feedback`): they have a
//! schema but no `execute`, because the engine dispatches them to a child run or a CTA.
//! Every other tool implements [`Tool`] and is executed by the service: a Rust type, an
//! HTTP tool or an MCP server's tool (`baton-tools` builds those two from the agents file).
//! A [`ToolServer`] is a set of tools known only once asked (an MCP server): the catalog
//! lists it once and keeps the list.

mod context;
mod echo;

pub use context::{
    FileOutput, MAX_FILE_BYTES, MAX_FILE_SUMMARY_BYTES, MAX_FILES, MAX_WIDGET_BYTES,
    MAX_WIDGET_FALLBACK_BYTES, MAX_WIDGETS, ToolContext, ToolContextBuilder,
};
pub use echo::Echo;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::Value;

use crate::llm::ToolSpec;

pub use baton_engine::tools::{
    Effects, Offered, REQUEST_HUMAN_FEEDBACK, SPAWN_SUBAGENT, ToolKind, Widget,
};

/// A tool a run can call. Its input has been validated against [`Tool::schema`] before
/// [`Tool::execute`] sees it.
#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    /// The JSON schema of the arguments object.
    fn schema(&self) -> Value;
    /// Whether this call needs a human's approval first, as a function of its input.
    /// Agents may add their own policy on top (see `agent::Approval`).
    fn needs_approval(&self, _input: &Value) -> bool {
        false
    }
    /// Why this call needs approval, for the human (when [`Tool::needs_approval`] says so).
    fn approval_reason(&self, _input: &Value) -> Option<String> {
        None
    }
    /// How long one call may take before it is an error result (default: the catalog's
    /// `toolTimeoutSeconds`).
    fn timeout(&self) -> Option<Duration> {
        None
    }
    /// How a call may touch the world, which says how a crash around it is repaired:
    /// [`Effects::None`] (reads or computes: run again), [`Effects::Idempotent`] (run again
    /// under the same [`ToolContext::idempotency_key`]) or [`Effects::Once`] (never run
    /// twice: after a crash that cut it off, the model or a person is told its outcome is
    /// unknown). The default is `Once`: say less only of a tool that is.
    fn effects(&self) -> Effects {
        Effects::Once
    }
    /// Runs the tool. An `Err` says who deals with it ([`ToolError`]): the model, as the
    /// call's error result (the run goes on), or the step, tried again.
    async fn execute(&self, ctx: &ToolContext, input: Value) -> Result<Value, ToolError>;
}

/// Why a call did not answer, and so who deals with it (as Restate's `TerminalError` splits
/// a handler's errors). A `String` or `&str` converts to [`ToolError::Model`], so `?` on
/// an error message and `Err("...".into())` keep their meaning.
///
/// `Retry` is for a failure that may pass and says nothing of the world: a timeout before
/// the request went out, a 503, a throttle. The step is tried again (the host's backoff,
/// its limit of attempts, then the run fails), and this call with it — unless the tool's
/// [`Effects`] are `Once`, which never runs twice: the model is then told, as an error
/// result, that it failed and was not tried again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The call's error result: the model sees it and decides what next (a bad argument,
    /// a record not found, a refusal).
    #[error("{0}")]
    Model(String),
    /// A transient failure: the step is tried again, the call with it (see above).
    #[error("{0}")]
    Retry(String),
}

impl ToolError {
    /// An error result the model sees.
    pub fn model(message: impl Into<String>) -> Self {
        Self::Model(message.into())
    }

    /// A transient failure: the step is tried again.
    pub fn retry(message: impl Into<String>) -> Self {
        Self::Retry(message.into())
    }

    /// What it says.
    pub fn message(&self) -> &str {
        match self {
            Self::Model(m) | Self::Retry(m) => m,
        }
    }
}

impl From<String> for ToolError {
    fn from(message: String) -> Self {
        Self::Model(message)
    }
}

impl From<&str> for ToolError {
    fn from(message: &str) -> Self {
        Self::Model(message.to_owned())
    }
}

/// The idempotency key of a committed tool call: derived from its run, its `tool` entry's
/// seq, the call's id in the committed reply and its input. The same on every run of that
/// call (after a crash, a timeout, a person's "run it again"), and different for every
/// other call, of this run or any other (a fork is a run of its own: a call it runs again
/// gets a key of its own, and so does a call with another input at the same place).
/// `call_` and 32 hex digits of their SHA-256.
pub fn idempotency_key(run_id: &str, seq: u64, call_id: &str, input: &Value) -> String {
    use sha2::Digest;
    /// Feeds what is written to it to the hash: the input is hashed as it is serialized.
    struct Hashing<'a>(&'a mut sha2::Sha256);
    impl std::io::Write for Hashing<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.update(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut hash = sha2::Sha256::new();
    // Each part's length first: no two different calls write the same bytes.
    for part in [run_id.as_bytes(), call_id.as_bytes()] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hash.update(seq.to_le_bytes());
    // A `Value` always serializes (its map keys are strings).
    let _ = serde_json::to_writer(Hashing(&mut hash), input);
    let digest = hash.finalize();
    let mut key = String::with_capacity(37);
    key.push_str("call_");
    for b in &digest[..16] {
        key.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        key.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    key
}

/// A set of tools known only by asking (an MCP server).
#[async_trait::async_trait]
pub trait ToolServer: Send + Sync {
    /// Its tools, each named `<server>__<tool>`. An `Err` says why they cannot be listed
    /// (the server is down); the catalog asks again later.
    async fn list(&self) -> Result<Vec<Arc<dyn Tool>>, String>;
    /// Its tools, listed for a run with this scope (a server whose configuration names the
    /// run's sandbox or repository is started for one to list it). By default, [`Self::list`].
    async fn list_for(&self, _scope: &crate::scope::Scope) -> Result<Vec<Arc<dyn Tool>>, String> {
        self.list().await
    }
    /// Whether a run with this scope has what listing needs (a server that names the run's
    /// sandbox cannot be started for a run without one).
    fn lists_for(&self, _scope: &crate::scope::Scope) -> bool {
        true
    }
}

/// A tool as the catalog holds it: spec, compiled schema, how the engine dispatches it, and
/// its code when it is one a host executes. What a step is handed of it is [`Offered`].
pub struct ToolDef {
    pub spec: ToolSpec,
    pub kind: ToolKind,
    /// Its code (`Some` for a [`ToolKind::Exec`] tool).
    pub exec: Option<Arc<dyn Tool>>,
    /// How long one call may take (`None`: the catalog's default).
    pub timeout: Option<Duration>,
    /// How a call may touch the world (the engine's own tools run none: `None` here).
    pub effects: Effects,
    /// The schema, compiled when first needed: a catalog that runs tools compiles every
    /// schema when it is built ([`ToolDef::check`]); one that only knows tools by name (the
    /// `api` and `events` functions) never does, and does not link a validator.
    validator: OnceLock<Result<jsonschema::Validator, String>>,
}

impl std::fmt::Debug for ToolDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolDef")
            .field("name", &self.spec.name)
            .finish()
    }
}

/// A schema that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("tool `{tool}` has an invalid JSON schema: {message}")]
pub struct SchemaError {
    pub tool: String,
    pub message: String,
}

impl ToolDef {
    pub fn new(name: &str, description: &str, schema: Value, kind: ToolKind) -> Self {
        let spec = ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters: schema,
        };
        Self::from_spec(spec, kind)
    }

    /// A tool the engine dispatches itself ([`baton_engine::builtin::tools`]).
    pub fn from_spec(spec: ToolSpec, kind: ToolKind) -> Self {
        Self {
            spec,
            kind,
            exec: None,
            timeout: None,
            effects: Effects::None,
            validator: OnceLock::new(),
        }
    }

    pub fn from_tool(tool: Arc<dyn Tool>) -> Self {
        let (name, description, schema) = (
            tool.name().to_owned(),
            tool.description().to_owned(),
            tool.schema(),
        );
        let timeout = tool.timeout();
        let effects = tool.effects();
        let mut def = Self::new(&name, &description, schema, ToolKind::Exec);
        def.exec = Some(tool);
        def.timeout = timeout;
        def.effects = effects;
        def
    }

    fn compiled(&self) -> &Result<jsonschema::Validator, String> {
        self.validator.get_or_init(|| {
            jsonschema::validator_for(&self.spec.parameters).map_err(|e| e.to_string())
        })
    }

    /// Compiles the schema, if not yet: a schema that does not compile is an error.
    pub fn check(&self) -> Result<(), SchemaError> {
        match self.compiled() {
            Ok(_) => Ok(()),
            Err(message) => Err(SchemaError {
                tool: self.spec.name.clone(),
                message: message.clone(),
            }),
        }
    }

    /// Validates model-supplied arguments; the message lists every violation.
    pub fn validate(&self, input: &Value) -> Result<(), String> {
        let validator = self.compiled().as_ref().map_err(|e| {
            format!(
                "`{}` cannot be called: its schema is invalid: {e}",
                self.spec.name
            )
        })?;
        let errors: Vec<String> = validator
            .iter_errors(input)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "invalid arguments for `{}`: {}",
                self.spec.name,
                errors.join("; ")
            ))
        }
    }
}

impl Offered for ToolDef {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn kind(&self) -> ToolKind {
        self.kind
    }

    fn validate(&self, input: &Value) -> Result<(), String> {
        ToolDef::validate(self, input)
    }

    fn needs_approval(&self, input: &Value) -> bool {
        self.exec.as_ref().is_some_and(|t| t.needs_approval(input))
    }

    fn approval_reason(&self, input: &Value) -> Option<String> {
        self.exec.as_ref()?.approval_reason(input)
    }

    fn effects(&self) -> Effects {
        self.effects
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_validate_model_arguments() {
        use baton_engine::builtin::{agent_orchestrate, request_human_feedback, spawn_subagent};
        let from = |(spec, kind)| ToolDef::from_spec(spec, kind);
        let spawn = from(spawn_subagent(&["explore".into(), "code".into()]));
        let feedback = from(request_human_feedback());
        let orchestrate = from(agent_orchestrate(&["explore".into()]));
        for def in [&spawn, &feedback, &orchestrate] {
            def.check().expect("the built-in schemas compile");
        }
        let table = [
            (&spawn, json!({"agent": "explore", "prompt": "look"}), true),
            (
                &spawn,
                json!({"subagentId": "run_1", "prompt": "more"}),
                true,
            ),
            (&spawn, json!({"agent": "nope", "prompt": "look"}), false),
            (&spawn, json!({"prompt": "look"}), false),
            (&spawn, json!({"agent": "explore"}), false),
            (
                &feedback,
                json!({"kind": "approval", "message": "ok?"}),
                true,
            ),
            (
                &feedback,
                json!({"kind": "choice", "prompt": "p", "options": [{"id": "a", "label": "A"}]}),
                true,
            ),
            (
                &feedback,
                json!({"kind": "choice", "prompt": "p", "options": []}),
                false,
            ),
            (&feedback, json!({"kind": "text"}), false),
            (
                &feedback,
                json!({"kind": "text", "prompt": "p", "expiresInSeconds": 60}),
                true,
            ),
            (
                &feedback,
                json!({"kind": "text", "prompt": "p", "expiresInSeconds": 0}),
                false,
            ),
            (&feedback, json!({"kind": "vote", "prompt": "p"}), false),
            (
                &feedback,
                json!({"kind": "approval", "message": "ok?", "default": {"approved": true}}),
                true,
            ),
            (
                &feedback,
                json!({"kind": "text", "prompt": "p", "default": {"kind": "text", "text": "x"}}),
                true,
            ),
            // A default of another kind, or not of its kind's shape.
            (
                &feedback,
                json!({"kind": "text", "prompt": "p", "default": {"approved": true}}),
                false,
            ),
            (
                &feedback,
                json!({"kind": "approval", "message": "ok?", "default": {"kind": "text", "approved": true}}),
                false,
            ),
            (
                &feedback,
                json!({"kind": "choice", "prompt": "p", "options": [{"id": "a", "label": "A"}],
                    "default": "a"}),
                false,
            ),
        ];
        for (tool, input, ok) in table {
            assert_eq!(
                tool.validate(&input).is_ok(),
                ok,
                "{} {input}",
                tool.spec.name
            );
        }
        let err = spawn
            .validate(&json!({"agent": 3, "prompt": "x"}))
            .expect_err("invalid");
        assert!(err.contains("/agent"), "{err}");
    }

    /// A schema that does not compile is refused when checked (a catalog that runs tools
    /// checks at start-up), and a call to its tool says why rather than passing unchecked.
    #[test]
    fn a_schema_that_does_not_compile_is_an_error_not_a_pass() {
        let bad = ToolDef::new(
            "odd",
            "",
            json!({"type": "no-such-type"}),
            ToolKind::Feedback,
        );
        let e = bad.check().expect_err("an invalid schema");
        assert_eq!(e.tool, "odd");
        let refused = bad.validate(&json!({})).expect_err("not validated");
        assert!(refused.contains("its schema is invalid"), "{refused}");
    }

    #[test]
    fn keys_derive_from_the_run_and_the_committed_call() {
        let key =
            |run: &str, seq: u64, id: &str, input: Value| idempotency_key(run, seq, id, &input);
        let k = key("run_a", 3, "call_1", json!({"amount": 5}));
        assert_eq!(k, key("run_a", 3, "call_1", json!({"amount": 5})), "a redo");
        assert_eq!(k.len(), 37);
        for other in [
            key("run_b", 3, "call_1", json!({"amount": 5})),
            key("run_a", 4, "call_1", json!({"amount": 5})),
            key("run_a", 3, "call_2", json!({"amount": 5})),
            // A reply asked again at the same place, with another input.
            key("run_a", 3, "call_1", json!({"amount": 6})),
        ] {
            assert_ne!(k, other);
        }
    }
}
