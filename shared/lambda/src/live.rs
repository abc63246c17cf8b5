//! The `live` function: the authorizer of the live channel (the AppSync Events API's
//! `AWS_LAMBDA` auth). AppSync asks it when a watcher connects and when it subscribes; it
//! answers from the watch token alone ([`baton_aws::watch::authorize`]), reading nothing.

use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

use crate::Startup;

/// Answers AppSync's authorization requests until Lambda stops the function.
pub async fn run_live_authorizer(startup: Startup) -> Result<(), lambda_runtime::Error> {
    let grants = startup.grants().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let answer =
            baton_aws::watch::authorize(&grants, &event.payload, chrono::Utc::now().timestamp());
        async move { Ok::<_, lambda_runtime::Error>(answer) }
    }))
    .await
}
