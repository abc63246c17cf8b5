//! What a run hands its tools beside their input: its sandbox and its repository. A run gets
//! them at creation (`sandboxId` on `POST /runs`) or from its parent (`spawn_subagent`'s
//! `sandboxId` and `github`; a subagent has its parent's unless the call gives its own).
//! Tools see them in `ToolContext::scope` (`baton-core`); an MCP server's arguments,
//! environment and headers name them as `${run.sandboxId}`, `${run.githubRepo}` and
//! `${run.githubRef}`. Since they end up in command lines and paths, each is a plain name.

use serde::{Deserialize, Serialize};

/// A repository on GitHub, and the branch, tag or commit to work on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
pub struct GithubRepo {
    /// `owner/name` (what [`check_github`] takes).
    #[cfg_attr(
        feature = "schemas",
        schemars(regex(
            pattern = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,38}/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}$"
        ))
    )]
    pub repo: String,
    /// A branch, tag or commit.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schemas",
        schemars(
            regex(pattern = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*$"),
            length(max = 200)
        )
    )]
    pub git_ref: Option<String>,
}

/// A run's sandbox and repository, as its tools get them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub sandbox_id: Option<String>,
    pub github: Option<GithubRepo>,
}

/// The names an MCP server's configuration may use for a run's scope.
pub const RUN_VARS: [&str; 3] = ["run.sandboxId", "run.githubRepo", "run.githubRef"];

impl Scope {
    /// The value of `var` (one of [`RUN_VARS`]) for this run, if it has one.
    pub fn var(&self, var: &str) -> Option<&str> {
        match var {
            "run.sandboxId" => self.sandbox_id.as_deref(),
            "run.githubRepo" => self.github.as_ref().map(|g| g.repo.as_str()),
            "run.githubRef" => self.github.as_ref().and_then(|g| g.git_ref.as_deref()),
            _ => None,
        }
    }
}

/// A sandbox id: 1 to 64 letters, digits, `-` and `_`.
pub fn check_sandbox_id(id: &str) -> Result<(), String> {
    let plain = (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if plain {
        Ok(())
    } else {
        Err(format!(
            "`sandboxId` {id:?} must be 1 to 64 letters, digits, `-` and `_`"
        ))
    }
}

/// `repo` is `owner/name` and `ref` a branch, tag or commit: letters, digits, `-`, `_`, `.`
/// (and `/` in a ref), no part that is empty or starts with a dot.
pub fn check_github(g: &GithubRepo) -> Result<(), String> {
    let part_ok = |p: &str, max: usize| {
        !p.is_empty()
            && p.len() <= max
            && !p.starts_with('.')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    let repo_ok =
        matches!(g.repo.split_once('/'), Some((o, n)) if part_ok(o, 39) && part_ok(n, 100));
    if !repo_ok {
        return Err(format!("`github.repo` {:?} must be `owner/name`", g.repo));
    }
    if let Some(r) = &g.git_ref
        && !(r.len() <= 200 && r.split('/').all(|p| part_ok(p, 200)))
    {
        return Err(format!(
            "`github.ref` {r:?} must be a branch, tag or commit (letters, digits, `-_./`)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_values_are_plain_names() {
        assert!(check_sandbox_id("sb-1_a").is_ok());
        for bad in ["", "../x", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_sandbox_id(bad).is_err(), "{bad:?}");
        }
        let repo = |repo: &str, r: Option<&str>| GithubRepo {
            repo: repo.into(),
            git_ref: r.map(str::to_owned),
        };
        assert!(check_github(&repo("acme/web.app", Some("release/v1.2"))).is_ok());
        for (r, gr) in [
            ("acme", None),
            ("acme/..", None),
            ("acme/web/x", None),
            ("/web", None),
            ("acme/web", Some("../main")),
            ("acme/web", Some("a//b")),
            ("acme/web", Some("a b")),
        ] {
            assert!(check_github(&repo(r, gr)).is_err(), "{r} {gr:?}");
        }
        let scope = Scope {
            sandbox_id: Some("sb".into()),
            github: Some(repo("acme/web", None)),
        };
        assert_eq!(scope.var("run.sandboxId"), Some("sb"));
        assert_eq!(scope.var("run.githubRepo"), Some("acme/web"));
        assert_eq!(scope.var("run.githubRef"), None);
    }
}
