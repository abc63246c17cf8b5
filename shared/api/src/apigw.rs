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
        }
    }

    /// Operators from `BATON_OPERATORS`: caller ids, comma-separated.
    pub fn from_env() -> Self {
        let list = std::env::var("BATON_OPERATORS").unwrap_or_default();
        Self::new(list.split(',').map(str::to_owned))
    }
}

impl Authenticator for ApiGatewayJwt {
    fn is_operator(&self, caller: &Caller) -> bool {
        self.operators.contains(&caller.0)
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
        match (sub, claims.and_then(|c| c.get("iss"))) {
            (Some(sub), Some(iss)) => Ok(Caller(format!("{iss}#{sub}"))),
            (Some(sub), None) => Ok(Caller(sub.clone())),
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
        assert!(a.is_operator(&Caller("https://idp#ops".into())));
        assert!(!a.is_operator(&Caller("https://idp#u1".into())));
        assert!(
            !a.is_operator(&Caller(String::new())),
            "an empty name names no one"
        );
        let c = a
            .authenticate(&h, &ext(&[("sub", "u1"), ("iss", "https://idp")]))
            .expect("identified");
        assert_eq!(c.0, "https://idp#u1");
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
