//! Plugins: what an agent's iterations are given beyond its own tools and prompt, decided
//! before each think. A plugin may read (a search, a lookup: it is async), adds catalog tools
//! and system-prompt text to the iteration, and keeps typed state per run that commits with
//! the step that thought. What the plugins answered is the step's input: the model is offered
//! it, and the engine checks the model's calls against that same answer, so a plugin that
//! would answer otherwise a moment later changes nothing in the step. A step tried again
//! (nothing of it committed) asks them again.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use std::sync::Arc;

use super::{MAX_PLUGIN_STATE_BYTES, PluginError, Preparation, Prepared};
use crate::run::{Run, RunView};
use crate::timeline::Entry;

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
        run: RunView<'_>,
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
        let prepared = self
            .0
            .prepare(RunView::new(run), timeline, &mut typed)
            .await?;
        let state = serde_json::to_value(&typed)
            .map_err(|e| PluginError::fatal(format!("its state: {e}")))?;
        Ok((prepared, state))
    }
}

/// Asks each of `agent`'s `plugins`, in order, what the next iteration of `run` adds.
pub(super) async fn prepare(
    agent: &str,
    plugins: &[Arc<dyn Prepare>],
    run: &Run,
    timeline: &[Entry],
) -> Result<Preparation, PluginError> {
    let mut out = Preparation::default();
    for plugin in plugins {
        let name = plugin.name();
        let named = |mut e: PluginError| {
            e.plugin = name.to_owned();
            e.agent = agent.to_owned();
            e
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
    Ok(out)
}
