//! Plugins: what an agent's iterations are given beyond its own tools and prompt, decided
//! before each think. A plugin may read (a search, a lookup: it is async), adds catalog tools
//! and system-prompt text to the iteration, and keeps typed state per run that commits with
//! the step that thought. What the plugins answered is the step's input: the model is offered
//! it, and the engine checks the model's calls against that same answer, so a plugin that
//! would answer otherwise a moment later changes nothing in the step. A step tried again
//! (nothing of it committed) asks them again.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AgentDef;
use crate::run::Run;
use crate::timeline::Entry;

/// A plugin's state is at most this long as JSON: it is kept in the run item, which every
/// commit rewrites.
pub const MAX_PLUGIN_STATE_BYTES: usize = 16 * 1024;

/// What a plugin adds to one iteration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    /// Names of catalog tools the agent may also call in this iteration (Rust or HTTP tools,
    /// or tools of MCP servers the agent already uses).
    pub tools: Vec<String>,
    /// Text added to the system prompt.
    pub context: Option<String>,
}

/// Why a plugin could not say what an iteration adds: its own error, not the model's. A
/// [`PluginError::retry`] sends the step's message back to be tried again (a lookup that
/// timed out); a [`PluginError::fatal`] one fails the run at once with it (its stored state
/// no longer reads, its state outgrew what a run keeps, a setting it cannot work with).
/// Either names the plugin and its agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin `{plugin}` of agent `{agent}`: {message}")]
pub struct PluginError {
    /// The plugin's name (filled in by the agent that asked it).
    pub plugin: String,
    /// The agent whose iteration it prepared (filled in likewise).
    pub agent: String,
    pub message: String,
    /// Whether the same step, tried again, may succeed.
    pub retryable: bool,
}

impl PluginError {
    /// An error worth trying the step again for.
    pub fn retry(message: impl Into<String>) -> Self {
        Self {
            plugin: String::new(),
            agent: String::new(),
            message: message.into(),
            retryable: true,
        }
    }

    /// An error no retry will mend: the run fails with it.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            retryable: false,
            ..Self::retry(message)
        }
    }
}

/// A plugin of an agent, with its typed state (`Default` for a run it has not seen).
#[async_trait::async_trait]
pub trait Plugin: Send + Sync + 'static {
    type State: Serialize + DeserializeOwned + Default + Send + Sync;
    /// Its name among the agent's plugins: its state is kept under it.
    fn name(&self) -> &str;
    /// What it adds to the next iteration of `run` (`timeline` as the step read it). It may
    /// change `state`; an error stops the step, tried again or failing the run as the error
    /// says ([`PluginError`]).
    async fn prepare(
        &self,
        run: &Run,
        timeline: &[Entry],
        state: &mut Self::State,
    ) -> Result<Prepared, PluginError>;
}

/// A [`Plugin`] with its state as JSON, as an agent holds it.
#[async_trait::async_trait]
pub trait Prepare: Send + Sync {
    fn name(&self) -> &str;
    async fn prepare(
        &self,
        run: &Run,
        timeline: &[Entry],
        state: Option<&Value>,
    ) -> Result<(Prepared, Value), PluginError>;
}

pub(super) struct Typed<P>(pub(super) P);

#[async_trait::async_trait]
impl<P: Plugin> Prepare for Typed<P> {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn prepare(
        &self,
        run: &Run,
        timeline: &[Entry],
        state: Option<&Value>,
    ) -> Result<(Prepared, Value), PluginError> {
        let mut typed = match state {
            Some(v) => P::State::deserialize(v).map_err(|e| {
                PluginError::fatal(format!("its stored state does not read back: {e}"))
            })?,
            None => P::State::default(),
        };
        let prepared = self.0.prepare(run, timeline, &mut typed).await?;
        let state = serde_json::to_value(&typed)
            .map_err(|e| PluginError::fatal(format!("its state: {e}")))?;
        Ok((prepared, state))
    }
}

/// What an agent's plugins answered for one step: what the iteration adds (with the tools
/// the run was granted), and each plugin's state after it, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preparation {
    pub prepared: Prepared,
    pub states: BTreeMap<String, Value>,
}

impl AgentDef {
    /// Asks each plugin, in order, what the next iteration of `run` adds.
    pub async fn prepare(&self, run: &Run, timeline: &[Entry]) -> Result<Preparation, PluginError> {
        let mut out = Preparation::default();
        for plugin in &self.plugins {
            let name = plugin.name();
            let named = |e: PluginError| PluginError {
                plugin: name.to_owned(),
                agent: self.name.clone(),
                ..e
            };
            let (add, state) = plugin
                .prepare(run, timeline, run.plugin_state.get(name))
                .await
                .map_err(named)?;
            let size = state.to_string().len();
            if size > MAX_PLUGIN_STATE_BYTES {
                return Err(named(PluginError::fatal(format!(
                    "its state is {size} bytes as JSON; at most {MAX_PLUGIN_STATE_BYTES} are kept"
                ))));
            }
            out.prepared.tools.extend(add.tools);
            if let Some(text) = add.context {
                let context = out.prepared.context.get_or_insert_default();
                if !context.is_empty() {
                    context.push_str("\n\n");
                }
                context.push_str(&text);
            }
            out.states.insert(name.to_owned(), state);
        }
        out.prepared.tools.extend(run.granted.iter().cloned());
        Ok(out)
    }

    /// What an iteration adds before its plugins answer: the tools the run was granted.
    pub fn granted(&self, run: &Run) -> Prepared {
        Prepared {
            tools: run.granted.clone(),
            context: None,
        }
    }
}
