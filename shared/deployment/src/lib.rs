//! This deployment's own Rust tools, plugins and agents — the one place to add them.
//!
//! [`extensions`] is what every host builds its catalog with: the five Lambda functions
//! (`functions/*/src/main.rs` hand it to their runtime) and `baton dev` / `baton dev --aws`
//! (the CLI). Add a tool or a plugin here, list the tool in an agent's `tools` (here, with
//! [`Extensions::agent`], or in the agents file), and `sam build` / `baton dev` pick it up;
//! nothing else is edited. The types are [`baton_sdk`]'s, whose crate documentation shows a
//! tool, a plugin and a catalog.
//!
//! What ships here are examples worth copying:
//!
//! - [`github::RepoFiles`] (`github_read`, a typed tool: its input is [`github::Read`]) reads
//!   the run's GitHub repository through GitHub's REST API, asking a human first for paths
//!   that may hold secrets, with a card and the file itself beside its result;
//! - [`skills::Skills`], a plugin with typed state: the agent `repo_assistant` starts with
//!   one tool, `activate_skill`; once it turns the `github` skill on, the plugin adds that
//!   skill's instructions and `github_read` to its later iterations. The tool reads the
//!   plugin's state through its context.

pub mod github;
pub mod skills;

use baton_sdk::{AgentSpec, Extensions, Typed};

/// The deployment's tools, plugins and agents.
pub fn extensions() -> Extensions {
    extensions_with(github::RepoFiles::from_env())
}

/// [`extensions`], reading GitHub through `github` (a test's stand-in of its API).
pub fn extensions_with(github: github::RepoFiles) -> Extensions {
    let skills = skills::Skills::new(vec![skills::Skill {
        name: "github".into(),
        summary: "read the run's GitHub repository".into(),
        instructions: "Answer from the repository's files: read them with `github_read` \
                       (\"\" lists the root) before you answer."
            .into(),
        tools: vec!["github_read".into()],
    }]);
    let assistant = AgentSpec {
        description: Some("Answers questions about the run's GitHub repository.".into()),
        system: Some("You answer questions about a GitHub repository.".into()),
        tools: vec![],
        ..AgentSpec::default()
    };
    Extensions::new()
        .tool(Typed(github))
        .tool(skills.activate_tool())
        .agent("repo_assistant", assistant)
        .plugin("repo_assistant", skills)
}
