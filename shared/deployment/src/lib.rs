//! This deployment's own Rust tools, plugins and agents — the one place to add them.
//!
//! [`extensions`] is what every host builds its catalog with: the five Lambda functions
//! (`functions/*/src/main.rs` hand it to their runtime) and `baton dev` / `baton dev --aws`
//! (the CLI). Add a tool or a plugin here, list the tool in an agent's `tools` (here, with
//! [`Extensions::agent`], or in the agents file), and `sam build` / `baton dev` pick it up;
//! nothing else is edited. The types are [`baton_sdk`]'s, whose crate documentation shows a
//! tool, a plugin and a catalog.
//!
//! What ships here is an example worth copying: [`github::RepoFiles`], which reads the run's
//! GitHub repository through GitHub's REST API (asking a human first for paths that may hold
//! secrets), with a widget and a file beside its result.

pub mod github;

use baton_sdk::Extensions;

/// The deployment's tools, plugins and agents.
pub fn extensions() -> Extensions {
    Extensions::new().tool(github::RepoFiles::from_env())
}
