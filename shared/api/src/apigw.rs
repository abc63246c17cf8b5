//! The caller's identity behind API Gateway (HTTP API): the subject of the JWT its
//! authorizer verified, which Lambda passes in the request context. Only the `api` function
//! uses this (feature `lambda`).

use axum::http::{Extensions, HeaderMap};

use crate::{ApiError, Authenticator, Caller};

/// The caller is the JWT's subject, as API Gateway's JWT authorizer verified it; the
/// operators are callers named in `BATON_OPERATORS` (the template's `Operators`).
#[derive(Debug, Default)]
pub struct ApiGatewayJwt {
    operators: std::collections::HashSet<String>,
    /// The claim that holds the caller's groups (`BATON_GROUPS_CLAIM`, default
    /// `cognito:groups`).
    groups_claim: String,
}

/// The claim of a caller's groups unless `BATON_GROUPS_CLAIM` names another.
pub const DEFAULT_GROUPS_CLAIM: &str = "cognito:groups";

/// A groups claim as API Gateway's JWT authorizer passes it on: a list claim flattened to
/// `[ops admins]`, or a plain string (space- or comma-separated).
fn groups_of(claim: &str) -> Vec<String> {
    claim
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|g| !g.is_empty())
        .map(str::to_owned)
        .collect()
}

impl ApiGatewayJwt {
    /// Operators by caller id (`<iss>#<sub>`, the `owner` of the runs they start).
    pub fn new(operators: impl IntoIterator<Item = String>) -> Self {
        Self {
            operators: operators
                .into_iter()
                .map(|o| o.trim().to_owned())
                .filter(|o| !o.is_empty())
                .collect(),
            groups_claim: DEFAULT_GROUPS_CLAIM.into(),
        }
    }

    /// The same, reading the caller's groups from `claim`.
    #[must_use]
    pub fn groups_claim(mut self, claim: impl Into<String>) -> Self {
        self.groups_claim = claim.into();
        self
    }

    /// Operators from `BATON_OPERATORS` (caller ids, comma-separated), groups from the claim
    /// `BATON_GROUPS_CLAIM` names.
    pub fn from_env() -> Self {
        let list = std::env::var("BATON_OPERATORS").unwrap_or_default();
        let auth = Self::new(list.split(',').map(str::to_owned));
        match std::env::var("BATON_GROUPS_CLAIM") {
            Ok(claim) if !claim.trim().is_empty() => auth.groups_claim(claim.trim()),
            _ => auth,
        }
    }
}

impl Authenticator for ApiGatewayJwt {
    fn is_operator(&self, caller: &Caller) -> bool {
        self.operators.contains(&caller.id)
    }

    fn authenticate(&self, _: &HeaderMap, ext: &Extensions) -> Result<Caller, ApiError> {
        use lambda_http::request::RequestContext;
        let claims = match ext.get::<RequestContext>() {
            Some(RequestContext::ApiGatewayV2(ctx)) => ctx
                .authorizer
                .as_ref()
                .and_then(|a| a.jwt.as_ref())
                .map(|j| &j.claims),
            _ => None,
        };
        let sub = claims.and_then(|c| c.get("sub")).filter(|s| !s.is_empty());
        let groups = claims
            .and_then(|c| c.get(&self.groups_claim))
            .map(|g| groups_of(g))
            .unwrap_or_default();
        match (sub, claims.and_then(|c| c.get("iss"))) {
            (Some(sub), Some(iss)) => Ok(Caller::new(format!("{iss}#{sub}")).with_groups(groups)),
            (Some(sub), None) => Ok(Caller::new(sub.clone()).with_groups(groups)),
            _ => Err(ApiError::unauthorized(
                "no verified identity on the request",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lambda_events::event::apigw::{
        ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerJwtDescription,
        ApiGatewayV2httpRequestContext,
    };
    use lambda_http::request::RequestContext;

    fn ext(claims: &[(&str, &str)]) -> Extensions {
        let mut jwt = ApiGatewayRequestAuthorizerJwtDescription::default();
        jwt.claims = claims
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut auth = ApiGatewayRequestAuthorizer::default();
        auth.jwt = Some(jwt);
        let mut ctx = ApiGatewayV2httpRequestContext::default();
        ctx.authorizer = Some(auth);
        let mut e = Extensions::new();
        e.insert(RequestContext::ApiGatewayV2(ctx));
        e
    }

    #[test]
    fn the_caller_is_the_verified_jwt_subject() {
        let h = HeaderMap::new();
        let a = ApiGatewayJwt::new(["https://idp#ops".to_owned(), " ".to_owned()]);
        assert!(a.is_operator(&Caller::new("https://idp#ops")));
        assert!(!a.is_operator(&Caller::new("https://idp#u1")));
        assert!(
            !a.is_operator(&Caller::new(String::new())),
            "an empty name names no one"
        );
        let c = a
            .authenticate(&h, &ext(&[("sub", "u1"), ("iss", "https://idp")]))
            .expect("identified");
        assert_eq!(c.id, "https://idp#u1");
        assert!(c.groups.is_empty());
        // Groups from the claim the deployment names, as the authorizer flattens a list.
        let c = a
            .authenticate(
                &h,
                &ext(&[
                    ("sub", "u1"),
                    ("iss", "https://idp"),
                    ("cognito:groups", "[ops admins]"),
                ]),
            )
            .expect("identified");
        assert_eq!(c.groups, ["ops", "admins"]);
        let own = ApiGatewayJwt::new([]).groups_claim("teams");
        let c = own
            .authenticate(
                &h,
                &ext(&[
                    ("sub", "u1"),
                    ("teams", "ops,leads"),
                    ("cognito:groups", "[x]"),
                ]),
            )
            .expect("identified");
        assert_eq!(c.groups, ["ops", "leads"]);
        assert!(
            a.authenticate(&h, &ext(&[("iss", "https://idp")])).is_err(),
            "no subject"
        );
        assert!(
            a.authenticate(&h, &Extensions::new()).is_err(),
            "no authorizer"
        );
        // A bearer header alone proves nothing here: API Gateway verifies tokens.
        let mut forged = HeaderMap::new();
        forged.insert("authorization", "Bearer x".parse().expect("header"));
        assert!(a.authenticate(&forged, &Extensions::new()).is_err());
    }
}
