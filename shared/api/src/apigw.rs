//! The caller's identity behind API Gateway (HTTP API): the subject of the JWT its
//! authorizer verified, which Lambda passes in the request context. Only the `api` function
//! uses this (feature `lambda`).

use axum::http::{Extensions, HeaderMap};

use crate::{ApiError, Authenticator, Caller};

/// The caller is the JWT's subject, as API Gateway's JWT authorizer verified it.
pub struct ApiGatewayJwt;

impl Authenticator for ApiGatewayJwt {
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
        let a = ApiGatewayJwt;
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
