//! What a tool's or a plugin's tests are written with: a run to view ([`TestRun`]). A tool's
//! context is [`crate::ToolContext::builder`]'s.

use baton_core::run::{NewRun, Run};
use baton_core::scope::GithubRepo;

use crate::RunView;

/// A top-level run, queued, for a plugin's test to hand a [`RunView`] of to its `prepare`.
///
/// ```
/// use baton_sdk::testing::TestRun;
///
/// let run = TestRun::new("run_1", "writer")
///     .owner("ada")
///     .context(baton_sdk::json!({"type": "ticket", "id": 7}));
/// let view = run.view();
/// assert_eq!((view.run_id(), view.agent(), view.owner()), ("run_1", "writer", "ada"));
/// assert_eq!(view.context().map(|c| &c["id"]), Some(&baton_sdk::json!(7)));
/// assert_eq!(view.parent_run_id(), None);
/// ```
#[derive(Debug, Clone)]
pub struct TestRun {
    run: Run,
}

impl TestRun {
    /// A run of `agent`, owned by `owner` (change it with [`TestRun::owner`]).
    pub fn new(run_id: &str, agent: &str) -> Self {
        Self {
            run: Run::new(NewRun::top_level(
                run_id,
                agent,
                "owner",
                chrono::Utc::now(),
            )),
        }
    }

    /// Who started it.
    #[must_use]
    pub fn owner(mut self, owner: &str) -> Self {
        self.run.owner = owner.to_owned();
        self
    }

    /// The repository its tools work on (`owner/name`, at a ref or the default branch).
    #[must_use]
    pub fn github(mut self, repo: &str, git_ref: Option<&str>) -> Self {
        self.run.origin.github = Some(GithubRepo {
            repo: repo.to_owned(),
            git_ref: git_ref.map(str::to_owned),
        });
        self
    }

    /// Its sandbox.
    #[must_use]
    pub fn sandbox(mut self, sandbox_id: &str) -> Self {
        self.run.origin.sandbox_id = Some(sandbox_id.to_owned());
        self
    }

    /// The document or object it works on.
    #[must_use]
    pub fn context(mut self, context: serde_json::Value) -> Self {
        self.run.origin.context = Some(context);
        self
    }

    /// What a plugin is handed of it.
    pub fn view(&self) -> RunView<'_> {
        RunView::new(&self.run)
    }
}
