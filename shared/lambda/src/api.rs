//! The `api` function: the same HTTP router as `baton dev`, behind API Gateway (HTTP API).

use std::sync::Arc;

use baton_api::{ApiGatewayJwt, AppState, router};

use crate::Startup;

/// Serves the API until Lambda stops the function. The caller is the subject of the JWT that
/// API Gateway's authorizer verified (operators: `BATON_OPERATORS`). It never calls a model:
/// steps run in the step functions.
pub async fn run_api(startup: Startup) -> Result<(), crate::Error> {
    let service = startup.request_service().await?;
    // API Gateway buffers responses: the console polls the timeline, and watches a run live
    // on the live channel (`POST /runs/{id}/watch` grants it) when the deployment has one.
    let state = AppState {
        service,
        auth: Arc::new(ApiGatewayJwt::from_env()),
        streams: false,
        stop: None,
        live: None,
        watchers: startup.watchers().await?,
    };
    lambda_http::run(router(state)).await
}
