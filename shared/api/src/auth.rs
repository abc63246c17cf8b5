//! Who is calling: an [`Authenticator`] turns a request into a [`Caller`] (the owner of the
//! runs and CTAs it may see) or refuses it with 401.

use axum::http::HeaderMap;

use crate::ApiError;

/// Who is calling. Inserted by the auth layer; handlers read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Its id: the owner of the runs it starts, what a `user:` assignee names.
    pub id: String,
    /// The groups it is in, which a `group:` assignee names.
    pub groups: Vec<String>,
}

impl Caller {
    /// A caller in no group.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            groups: Vec::new(),
        }
    }

    /// The same, in `groups`.
    #[must_use]
    pub fn with_groups(mut self, groups: Vec<String>) -> Self {
        self.groups = groups;
        self
    }
}

/// A user of `baton dev --users FILE`: the token it is known by, its id and its groups.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenUser {
    pub token: String,
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// `{"users": [{"token": "...", "user": "alice", "groups": ["ops"]}]}`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsersFile {
    pub users: Vec<TokenUser>,
}

impl UsersFile {
    /// A users file's text, checked: tokens of at least 16 characters, each once; users,
    /// each once; no user the server's own owner.
    pub fn parse(text: &str, owner: &str) -> Result<Self, String> {
        let file: Self = serde_json::from_str(text).map_err(|e| format!("users file: {e}"))?;
        let mut tokens = std::collections::HashSet::new();
        let mut users = std::collections::HashSet::new();
        for u in &file.users {
            if u.token.trim().len() < 16 {
                return Err(format!(
                    "users file: the token of `{}` is shorter than 16 characters",
                    u.user
                ));
            }
            if u.user.trim().is_empty() || u.user == owner {
                return Err(format!(
                    "users file: `{}` is no user's name (blank, or the server's owner)",
                    u.user
                ));
            }
            if !tokens.insert(u.token.as_str()) || !users.insert(u.user.as_str()) {
                return Err(format!(
                    "users file: `{}` or its token is listed twice",
                    u.user
                ));
            }
            if u.groups.iter().any(|g| g.trim().is_empty()) {
                return Err(format!("users file: `{}` has a blank group", u.user));
            }
        }
        Ok(file)
    }
}

/// Turns a request's headers and extensions into a caller, or refuses it.
pub trait Authenticator: Send + Sync {
    fn authenticate(
        &self,
        headers: &HeaderMap,
        extensions: &axum::http::Extensions,
    ) -> Result<Caller, ApiError>;

    /// Whether the caller may read every owner's runs (`GET /runs?owner=`, and a run, its
    /// timeline and tree, whoever started it). Steering a run stays its owner's.
    fn is_operator(&self, _caller: &Caller) -> bool {
        false
    }
}

/// `Authorization: Bearer <token>`: the server's token, its owner's (local mode), and the
/// tokens of a users file, each its user's.
pub struct BearerToken {
    token: String,
    owner: String,
    users: Vec<TokenUser>,
}

impl BearerToken {
    pub fn new(token: impl Into<String>, owner: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            owner: owner.into(),
            users: Vec::new(),
        }
    }

    /// The same, with the users of a users file.
    #[must_use]
    pub fn with_users(mut self, users: Vec<TokenUser>) -> Self {
        self.users = users;
        self
    }
}

/// Whether `a` is `b`, in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.iter()
        .zip(b)
        .fold(a.len() ^ b.len(), |acc, (x, y)| acc | usize::from(x ^ y))
        == 0
}

impl Authenticator for BearerToken {
    fn authenticate(
        &self,
        headers: &HeaderMap,
        _: &axum::http::Extensions,
    ) -> Result<Caller, ApiError> {
        let given = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                ApiError::unauthorized("missing `Authorization: Bearer <token>` header")
            })?;
        let given = given.trim().as_bytes();
        if same(given, self.token.as_bytes()) {
            return Ok(Caller::new(self.owner.clone()));
        }
        // Every user's token is compared, whichever matches.
        let mut found = None;
        for u in &self.users {
            if same(given, u.token.as_bytes()) {
                found = Some(u);
            }
        }
        match found {
            Some(u) => Ok(Caller::new(u.user.clone()).with_groups(u.groups.clone())),
            None => Err(ApiError::unauthorized("invalid token")),
        }
    }

    /// The server's token's holder runs the server: it may read any owner's runs in its
    /// store (a users file's users may not).
    fn is_operator(&self, caller: &Caller) -> bool {
        caller.id == self.owner
    }
}
