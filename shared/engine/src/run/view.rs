//! [`RunView`]: what a plugin or a tool reads of a run, and nothing it could change.

use chrono::{DateTime, Utc};

use super::{Run, RunStatus, Usage};
use crate::scope::{GithubRepo, Scope};

/// A run as a plugin sees it: read-only, and only what such code has a use for — not the
/// run item's bookkeeping (its version, waits, clocks, outbox), which may change shape from
/// one release to the next while this stays.
///
/// ```
/// use baton_engine::run::{NewRun, Run, RunView};
///
/// let run = Run::new(NewRun::top_level("run_1", "support", "ada", chrono::Utc::now()));
/// let view = RunView::new(&run);
/// assert_eq!((view.run_id(), view.agent(), view.owner()), ("run_1", "support", "ada"));
/// assert_eq!(view.root_run_id(), "run_1"); // a top-level run is its own root
/// assert_eq!(view.depth(), 0);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RunView<'a> {
    run: &'a Run,
}

impl<'a> RunView<'a> {
    pub fn new(run: &'a Run) -> Self {
        Self { run }
    }

    pub fn run_id(&self) -> &'a str {
        &self.run.run_id
    }

    /// The agent it runs.
    pub fn agent(&self) -> &'a str {
        &self.run.agent
    }

    /// Who started it (the API caller that started the top-level run).
    pub fn owner(&self) -> &'a str {
        &self.run.owner
    }

    pub fn status(&self) -> RunStatus {
        self.run.status
    }

    /// The top-level run it is under: itself if it is one.
    pub fn root_run_id(&self) -> &'a str {
        self.run.root()
    }

    /// The run that spawned it, for a subagent.
    pub fn parent_run_id(&self) -> Option<&'a str> {
        self.run.origin.parent.as_ref().map(|p| p.run_id.as_str())
    }

    /// 0 for a top-level run, its parent's + 1 for a subagent.
    pub fn depth(&self) -> u32 {
        self.run.origin.depth
    }

    /// Its sandbox and repository.
    pub fn scope(&self) -> Scope {
        self.run.scope()
    }

    /// The repository its tools work on.
    pub fn github(&self) -> Option<&'a GithubRepo> {
        self.run.origin.github.as_ref()
    }

    /// The document or object it works on, as its creator gave it.
    pub fn context(&self) -> Option<&'a serde_json::Value> {
        self.run.origin.context.as_ref()
    }

    /// Its creator's metadata.
    pub fn metadata(&self) -> Option<&'a serde_json::Value> {
        self.run.origin.metadata.as_ref()
    }

    /// The start of its current turn's prompt.
    pub fn prompt(&self) -> Option<&'a str> {
        self.run.prompt.as_deref()
    }

    /// How many times it has thought (called the model), in all.
    pub fn thinks(&self) -> u32 {
        self.run.counters.thinks
    }

    /// The tokens its own model calls used.
    pub fn usage(&self) -> &'a Usage {
        &self.run.spend.usage
    }

    /// What its own model calls cost, in USD.
    pub fn cost_usd(&self) -> f64 {
        self.run.spend.cost_usd
    }

    pub fn created_at(&self) -> DateTime<Utc> {
        self.run.created_at
    }
}
