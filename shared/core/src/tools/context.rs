//! What a tool call runs with: [`ToolContext`], and where its side outputs go.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::Value;

use super::Widget;
use crate::scope::Scope;

/// What a tool knows of the call it serves — its run, as a read-only view — and where it
/// puts its side outputs. A step makes it; a tool's own tests make one with
/// [`ToolContext::builder`].
///
/// ```
/// use baton_core::tools::ToolContext;
///
/// let ctx = ToolContext::builder("run_1").agent("support").call_id("call_1").build();
/// assert_eq!(ctx.run_id(), "run_1");
/// assert!(ctx.idempotency_key().starts_with("call_"));
/// ```
#[derive(Debug, Default)]
pub struct ToolContext {
    run_id: String,
    owner: String,
    agent: String,
    call_id: String,
    idempotency_key: String,
    scope: Scope,
    plugin_states: BTreeMap<String, Value>,
    /// The agent's plugins, by name: the states a call may set ([`ToolContext::set_plugin_state`]).
    plugins: Vec<String>,
    /// The states this call set, by plugin.
    set_states: Mutex<BTreeMap<String, Value>>,
    widgets: Mutex<Vec<Widget>>,
    files: Mutex<Vec<FileOutput>>,
}

/// Builds a [`ToolContext`]: what is not set is empty, and the idempotency key, if not set,
/// is one for this run and call id.
#[derive(Debug, Default)]
#[must_use]
pub struct ToolContextBuilder {
    ctx: ToolContext,
}

impl ToolContextBuilder {
    /// The run's owner (the API caller that started the root run).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.ctx.owner = owner.into();
        self
    }

    /// The agent the run runs.
    pub fn agent(mut self, agent: impl Into<String>) -> Self {
        self.ctx.agent = agent.into();
        self
    }

    /// The call's id in the model's reply.
    pub fn call_id(mut self, call_id: impl Into<String>) -> Self {
        self.ctx.call_id = call_id.into();
        self
    }

    /// The call's idempotency key (a step sets the one derived from the committed call).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.ctx.idempotency_key = key.into();
        self
    }

    /// The run's sandbox and repository.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.ctx.scope = scope;
        self
    }

    /// The agent's plugins' states, as the step's plugins left them (a name → its JSON).
    pub fn plugin_states(mut self, states: BTreeMap<String, Value>) -> Self {
        self.ctx.plugin_states = states;
        self
    }

    /// One plugin's state (a test's: what its plugin would have kept). The plugin is one of
    /// the agent's: the call may set its state.
    pub fn plugin_state(mut self, plugin: &str, state: Value) -> Self {
        self.ctx.plugin_states.insert(plugin.to_owned(), state);
        self.ctx.plugins.push(plugin.to_owned());
        self
    }

    /// The agent's plugins by name: those whose state a call may set.
    pub fn plugins<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.ctx.plugins.extend(names.into_iter().map(Into::into));
        self
    }

    pub fn build(mut self) -> ToolContext {
        if self.ctx.idempotency_key.is_empty() {
            // Outside a step (a tool's own tests): one for this run and call id. A step
            // sets the one derived from the call's entry (`tools::idempotency_key`).
            self.ctx.idempotency_key = format!(
                "call_{}",
                uuid::Uuid::new_v5(
                    &uuid::Uuid::NAMESPACE_OID,
                    format!("{}/{}", self.ctx.run_id, self.ctx.call_id).as_bytes()
                )
                .simple()
            );
        }
        self.ctx
    }
}

/// A file a tool returns beside its result (see [`ToolContext::file`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FileOutput {
    pub name: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
    /// What the model is told of it.
    pub summary: String,
}

/// A file is at most this large.
pub const MAX_FILE_BYTES: usize = 5 * 1024 * 1024;
/// At most this many files per tool call.
pub const MAX_FILES: usize = 4;
/// A file's summary is at most this long (the model reads it).
pub const MAX_FILE_SUMMARY_BYTES: usize = 1024;

/// A widget's `data` is at most this long as JSON (it is stored in the timeline).
pub const MAX_WIDGET_BYTES: usize = 32 * 1024;

/// At most this many widgets per tool call.
pub const MAX_WIDGETS: usize = 4;

/// A widget's fallback text is at most this long.
pub const MAX_WIDGET_FALLBACK_BYTES: usize = 2048;

impl ToolContext {
    /// A context for a call of run `run_id`, to build.
    pub fn builder(run_id: impl Into<String>) -> ToolContextBuilder {
        ToolContextBuilder {
            ctx: ToolContext {
                run_id: run_id.into(),
                ..ToolContext::default()
            },
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The run's owner (the API caller that started the root run).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The agent the run runs.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The tool call's id as the model gave it (or Baton made it, when the model gave none):
    /// unique within one reply only. Not an idempotency key: see
    /// [`ToolContext::idempotency_key`].
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// The key a side effect of this call is made once by: derived from the run and the
    /// committed call (its entry, its id in the reply, its input), the same on every run of
    /// this call (after a crash or an invocation's timeout, or a person's "run it again"),
    /// different for every other call of this run or any other (a fork's run of a call
    /// again included). Send it where the receiver deduplicates: HTTP tools send it as
    /// `Idempotency-Key`, MCP tools in `_meta` as `io.baton/idempotencyKey`.
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// The run's sandbox and repository.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Adds a file to this call's output: `name` (a plain file name), its media type, its
    /// bytes (kept in the blob store) and a short summary, which is all the model sees.
    /// Refused, with the reason, past [`MAX_FILES`], [`MAX_FILE_BYTES`] or
    /// [`MAX_FILE_SUMMARY_BYTES`], or for a name that is not a plain file name.
    pub fn file(
        &self,
        name: &str,
        media_type: &str,
        bytes: Vec<u8>,
        summary: &str,
    ) -> Result<(), String> {
        let plain = !name.is_empty()
            && name.len() <= 128
            && name != "."
            && name != ".."
            && !name
                .chars()
                .any(|c| c == '/' || c == '\\' || c == '"' || c.is_control());
        if !plain {
            return Err(format!(
                "`{name}` is not a plain file name (1 to 128 characters; no /, \\, \" or control characters)"
            ));
        }
        let media_ok = media_type.len() <= 128
            && media_type.is_ascii()
            && !media_type.chars().any(|c| c.is_ascii_control() || c == ' ')
            && media_type
                .split_once('/')
                .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty());
        if !media_ok {
            return Err(format!("`{media_type}` is not a media type (type/subtype)"));
        }
        if bytes.len() > MAX_FILE_BYTES {
            return Err(format!(
                "a file is at most {MAX_FILE_BYTES} bytes; `{name}` is {}",
                bytes.len()
            ));
        }
        if summary.len() > MAX_FILE_SUMMARY_BYTES {
            return Err(format!(
                "a file's summary is at most {MAX_FILE_SUMMARY_BYTES} bytes"
            ));
        }
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if files.len() >= MAX_FILES {
            return Err(format!("at most {MAX_FILES} files per tool call"));
        }
        files.push(FileOutput {
            name: name.into(),
            media_type: media_type.into(),
            bytes,
            summary: summary.into(),
        });
        Ok(())
    }

    /// The files added so far.
    pub fn take_files(&self) -> Vec<FileOutput> {
        std::mem::take(&mut *self.files.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Adds a widget to this call's output. Refused (with the reason) past
    /// [`MAX_WIDGETS`], or when `data` is over [`MAX_WIDGET_BYTES`] as JSON.
    pub fn widget(&self, kind: &str, data: Value) -> Result<(), String> {
        self.add_widget(kind, data, None)
    }

    /// [`ToolContext::widget`] with the text a consumer that cannot draw `kind` shows
    /// instead (at most [`MAX_WIDGET_FALLBACK_BYTES`]).
    ///
    /// ```
    /// use baton_core::tools::ToolContext;
    ///
    /// let ctx = ToolContext::builder("run_1").build();
    /// ctx.widget_with_fallback("chart", serde_json::json!({"points": [1, 3]}), "Rising: 1 to 3.")?;
    /// assert_eq!(ctx.take_widgets()[0].fallback.as_deref(), Some("Rising: 1 to 3."));
    /// # Ok::<(), String>(())
    /// ```
    pub fn widget_with_fallback(
        &self,
        kind: &str,
        data: Value,
        fallback: &str,
    ) -> Result<(), String> {
        if fallback.len() > MAX_WIDGET_FALLBACK_BYTES {
            return Err(format!(
                "a widget's fallback is at most {MAX_WIDGET_FALLBACK_BYTES} bytes; this one is {}",
                fallback.len()
            ));
        }
        self.add_widget(kind, data, Some(fallback.to_owned()))
    }

    fn add_widget(&self, kind: &str, data: Value, fallback: Option<String>) -> Result<(), String> {
        let size = data.to_string().len();
        if size > MAX_WIDGET_BYTES {
            return Err(format!(
                "a widget is at most {MAX_WIDGET_BYTES} bytes; this one is {size}"
            ));
        }
        let mut widgets = self.widgets.lock().unwrap_or_else(|e| e.into_inner());
        if widgets.len() >= MAX_WIDGETS {
            return Err(format!("at most {MAX_WIDGETS} widgets per tool call"));
        }
        widgets.push(Widget {
            kind: kind.into(),
            data,
            fallback,
        });
        Ok(())
    }

    /// The widgets added so far.
    pub fn take_widgets(&self) -> Vec<Widget> {
        std::mem::take(&mut *self.widgets.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The state of the agent's plugin `plugin`, typed as the plugin keeps it (its
    /// `Plugin::State`): the default when the plugin has none for this run yet, and the one
    /// this call set, if it did. A state that does not read as `S` is an error naming the
    /// plugin (the model sees it).
    pub fn plugin_state<S: serde::de::DeserializeOwned + Default>(
        &self,
        plugin: &str,
    ) -> Result<S, String> {
        let set = self.set_states.lock().unwrap_or_else(|e| e.into_inner());
        match set.get(plugin).or_else(|| self.plugin_states.get(plugin)) {
            None => Ok(S::default()),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| format!("plugin `{plugin}`'s state does not read: {e}")),
        }
    }

    /// Sets the state of the agent's plugin `plugin` (typed as the plugin keeps it): it
    /// replaces the plugin's in the commit that records this call's output, and the
    /// plugin's next `prepare` reads it. Refused (with the reason) for a plugin the agent
    /// does not have, or a state over the plugin state's limit as JSON.
    ///
    /// ```
    /// use baton_core::tools::ToolContext;
    ///
    /// #[derive(serde::Serialize, serde::Deserialize, Default)]
    /// struct Skills { on: Vec<String> }
    ///
    /// let ctx = ToolContext::builder("run_1").plugins(["skills"]).build();
    /// ctx.set_plugin_state("skills", &Skills { on: vec!["github".into()] })?;
    /// assert_eq!(ctx.plugin_state::<Skills>("skills")?.on, ["github"]);
    /// assert!(ctx.set_plugin_state("notes", &Skills::default()).is_err());
    /// # Ok::<(), String>(())
    /// ```
    pub fn set_plugin_state<S: serde::Serialize>(
        &self,
        plugin: &str,
        state: &S,
    ) -> Result<(), String> {
        if !self.plugins.iter().any(|p| p == plugin) {
            return Err(format!(
                "agent `{}` has no plugin `{plugin}` whose state a tool could set",
                self.agent
            ));
        }
        let value = serde_json::to_value(state)
            .map_err(|e| format!("plugin `{plugin}`'s state does not serialize: {e}"))?;
        let size = value.to_string().len();
        let max = baton_engine::agent::MAX_PLUGIN_STATE_BYTES;
        if size > max {
            return Err(format!(
                "plugin `{plugin}`'s state is {size} bytes as JSON; at most {max} are kept"
            ));
        }
        self.set_states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(plugin.to_owned(), value);
        Ok(())
    }

    /// The plugin states this call set, by plugin.
    pub fn take_plugin_states(&self) -> BTreeMap<String, Value> {
        std::mem::take(&mut *self.set_states.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
