//! Watches of runs on AWS: the `api` function grants them ([`Watchers`]): it leases the run
//! to its watchers (the `LIVE` item its steps read with the run) and signs a token for the
//! run's channel on the AppSync Events API, which the `live` function checks.

use crate::settings::LiveConfig;
use baton_core::error::PortError;
use baton_core::live::grant::{GRANT_SECONDS, Grants, Operation, Watch, Watchers, channel, origin};
use chrono::{DateTime, Duration, Utc};

use crate::dynamo::DynamoStore;

/// Grants watches of runs on an AppSync Events API.
pub struct AppSyncWatchers {
    pub store: DynamoStore,
    pub grants: Grants,
    pub live: LiveConfig,
}

#[async_trait::async_trait]
impl Watchers for AppSyncWatchers {
    async fn grant(&self, run_id: &str, now: DateTime<Utc>) -> Result<Watch, PortError> {
        let expires_at = now + Duration::seconds(GRANT_SECONDS);
        self.store.lease_watch(run_id, expires_at).await?;
        Ok(Watch {
            transport: "appsync-events".into(),
            realtime_url: self.live.realtime_url.clone(),
            host: self.live.http_host.clone(),
            channel: channel(run_id),
            token: self.grants.token(run_id, expires_at.timestamp()),
            expires_at,
            // A minute to spare before the token and the lease end.
            renew_after_seconds: GRANT_SECONDS - 60,
            committed: true,
        })
    }

    fn channel_origin(&self) -> String {
        origin(&self.live.realtime_url)
    }
}

/// AppSync Events' request to its Lambda authorizer (`authorizationToken`,
/// `requestContext.operation`: `EVENT_CONNECT`, `EVENT_SUBSCRIBE` with its `channel`,
/// `EVENT_PUBLISH`), answered `{"isAuthorized", "ttlOverride"}` as the `live` function does:
/// watchers connect with a watch token and subscribe to its run's channel alone; nobody
/// publishes this way (the step functions publish with their role).
pub fn authorize(grants: &Grants, request: &serde_json::Value, now: i64) -> serde_json::Value {
    let token = request["authorizationToken"].as_str().unwrap_or_default();
    let token = token.strip_prefix("Bearer ").unwrap_or(token);
    let context = &request["requestContext"];
    let op = match (context["operation"].as_str(), context["channel"].as_str()) {
        (Some("EVENT_CONNECT"), _) => Some(Operation::Connect),
        (Some("EVENT_SUBSCRIBE"), Some(ch)) => Some(Operation::Subscribe(ch)),
        (Some("EVENT_PUBLISH"), _) => Some(Operation::Publish),
        _ => None,
    };
    let decision = op.map(|op| grants.decide(token, op, now));
    serde_json::json!({
        "isAuthorized": decision.is_some_and(|d| d.allowed),
        "ttlOverride": decision.map_or(0, |d| d.ttl_seconds),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_authorizer_answers_appsyncs_requests() {
        let g = Grants::new(&[3; 32]).expect("key");
        let now = 1_700_000_000;
        let token = g.token("run_abc", now + 300);
        let ask = |op: &str, channel: serde_json::Value, token: &str| {
            authorize(
                &g,
                &json!({
                    "authorizationToken": token,
                    "requestContext": {"apiId": "x", "accountId": "1", "requestId": "r",
                        "operation": op, "channelNamespaceName": "runs", "channel": channel},
                    "requestHeaders": {}
                }),
                now,
            )
        };
        assert_eq!(
            ask("EVENT_CONNECT", json!(null), &token),
            json!({"isAuthorized": true, "ttlOverride": 0})
        );
        let bearer = format!("Bearer {token}");
        assert_eq!(
            ask("EVENT_SUBSCRIBE", json!("/runs/run-abc"), &bearer)["isAuthorized"],
            true
        );
        for (op, channel, token) in [
            ("EVENT_SUBSCRIBE", json!("/runs/run-other"), token.as_str()),
            ("EVENT_SUBSCRIBE", json!(null), token.as_str()),
            ("EVENT_PUBLISH", json!("/runs/run-abc"), token.as_str()),
            ("EVENT_CONNECT", json!(null), "forged"),
            ("SOMETHING_ELSE", json!(null), token.as_str()),
        ] {
            assert_eq!(
                ask(op, channel.clone(), token),
                json!({"isAuthorized": false, "ttlOverride": 0}),
                "{op} {channel}"
            );
        }
        assert_eq!(authorize(&g, &json!("garbage"), now)["isAuthorized"], false);
    }
}
