//! The `api` function: the same HTTP router as `baton dev`, behind API Gateway (HTTP API).
//! The caller is the subject of the JWT that API Gateway's authorizer verified (operators:
//! `BATON_OPERATORS`). It never
//! calls a model: steps run in the orchestrator and subagent functions.

use std::sync::Arc;

use baton_api::{ApiGatewayJwt, AppState, router};
use baton_lambda::{Runtime, init_tracing};

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    init_tracing();
    let runtime = Runtime::from_env()
        .await?
        .with_extensions(baton_deployment::extensions());
    let service = runtime.request_service().await?;
    let auth = Arc::new(ApiGatewayJwt::from_env());
    // API Gateway buffers responses: the console polls the timeline, and watches a run live
    // on the live channel (`POST /runs/{id}/watch` grants it) when the deployment has one.
    let state = AppState {
        service,
        auth,
        streams: false,
        stop: None,
        live: None,
        watchers: runtime.watchers().await?,
    };
    lambda_http::run(router(state)).await
}
