//! The `live` function: the authorizer of the live channel (the AppSync Events API the step
//! functions publish runs' live events to). A watcher connects and subscribes with the watch
//! token the `api` function granted it; this checks the token, and that the channel is the
//! token's run's. It reads nothing but its key.

use baton_lambda::{Runtime, init_tracing, run_live_authorizer};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_tracing();
    run_live_authorizer(
        Runtime::from_env()
            .await?
            .with_extensions(baton_deployment::extensions()),
    )
    .await
}
