//! Who is calling: an [`Authenticator`] turns a request into a [`Caller`] (the owner of the
//! runs and CTAs it may see) or refuses it with 401.

use axum::http::HeaderMap;

use crate::ApiError;

/// Who is calling. Inserted by the auth layer; handlers read it.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

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

/// `Authorization: Bearer <token>`: one shared token, one owner (local mode).
pub struct BearerToken {
    token: String,
    owner: String,
}

impl BearerToken {
    pub fn new(token: impl Into<String>, owner: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            owner: owner.into(),
        }
    }
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
        // Compare in time independent of where the first difference is.
        let (a, b) = (given.trim().as_bytes(), self.token.as_bytes());
        let diff = a
            .iter()
            .zip(b)
            .fold(a.len() ^ b.len(), |acc, (x, y)| acc | usize::from(x ^ y));
        if diff == 0 {
            Ok(Caller(self.owner.clone()))
        } else {
            Err(ApiError::unauthorized("invalid token"))
        }
    }

    /// The token's holder runs the server: it may read any owner's runs in its store.
    fn is_operator(&self, _caller: &Caller) -> bool {
        true
    }
}
