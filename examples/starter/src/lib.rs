//! Your own Rust tools, plugins and agents: what every function of this project
//! (`functions/*/src/main.rs`) and its `dev` binary build their catalog with.
//!
//! Add a tool in a module of its own, give it to [`extensions`] (`.tool(Typed(YourTool))`
//! where the comment says), list it in an agent's `tools` (here, with [`Extensions::agent`],
//! or in an agents file), and `cargo run -p dev -- dev` and `sam build` pick it up. The types
//! are [`baton_sdk`]'s, whose documentation shows every extension point.
//!
//! What `baton new` put here are examples worth copying, or deleting:
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

/// This project's tools, plugins and agents.
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
    let assistant = AgentSpec::new("You answer questions about a GitHub repository.")
        .description("Answers questions about the run's GitHub repository.");
    Extensions::new()
        // Your tools: one line each.
        .tool(Typed(github))
        .tool(skills.activate_tool())
        .agent("repo_assistant", assistant)
        .plugin("repo_assistant", skills)
}
