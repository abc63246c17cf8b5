//! The `api` function: the same HTTP router as `baton dev`, behind API Gateway (HTTP API).
//! The caller is the subject of the JWT that API Gateway's authorizer verified.

use std::sync::Arc;

use baton::api::{AppState, router};
use baton::lambda::{ApiGatewayJwt, init_tracing, service_from_env};

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    init_tracing();
    let service = service_from_env().await?;
    let app = router(AppState {
        service,
        auth: Arc::new(ApiGatewayJwt),
    });
    lambda_http::run(app).await
}
