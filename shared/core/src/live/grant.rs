//! Who may watch a run live when its channel is outside the process (on AWS, an AppSync
//! Events API): the API, which has verified the caller and that the caller owns the run,
//! grants a short-lived token for that run's channel alone; the channel's authorizer checks
//! it when a watcher connects and when it subscribes. Publishing is never granted this way
//! (the step functions publish with their role).
//!
//! A token is `<payload>.<mac>`, both base64url: the payload is `<runId>.<expiry in unix
//! seconds>`, the MAC an HMAC-SHA256 of it under the deployment's link key, in a domain of its
//! own (`baton-live`), so that no one-time answer link is a watch token, nor the reverse.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::links::{MIN_KEY_BYTES, ShortKey};

/// How long a grant lasts, in seconds: its token, and the run's watch lease (a step streams
/// only while a lease holds). A watcher asks again before it ends to go on watching.
pub const GRANT_SECONDS: i64 = 300;

/// The MAC's domain: what a watch token's MAC covers beside its payload.
const DOMAIN: &[u8] = b"baton-live\n";

/// A run's channel: `/runs/<runId>` with `_` written `-` (a channel's segments are letters,
/// digits and dashes; run ids are `run_<hex>` and `sub_<hex>`).
pub fn channel(run_id: &str) -> String {
    format!("/runs/{}", run_id.replace('_', "-"))
}

/// What a watcher is given to watch a run whose channel is outside the process: where to
/// connect, the channel, and the token that lets it in until `expires_at`. A watcher asks
/// again before then (`renewAfterSeconds`) to go on watching: each grant also extends the
/// run's watch lease, and a step streams only while one holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Watch {
    /// `appsync-events`: the AppSync Events WebSocket protocol.
    pub transport: String,
    /// `wss://…/event/realtime`.
    pub realtime_url: String,
    /// The `host` the authorization names (the API's HTTP domain).
    pub host: String,
    pub channel: String,
    /// The `Authorization` of the connection and of the subscription.
    pub token: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    pub renew_after_seconds: i64,
    /// The run's steps also publish what they commit (`committed` events), so a watcher
    /// need not poll the timeline while its subscription holds: it reads it to catch up
    /// (when it subscribes, and when an event is too large to carry its entries or begins
    /// past what it has).
    #[serde(default)]
    pub committed: bool,
}

/// Grants watches of runs (the host's live channel, where it is outside the process).
#[async_trait::async_trait]
pub trait Watchers: Send + Sync {
    /// A watch of `run_id` (whose caller the API has checked owns it) from `now`, with the
    /// run's watch lease extended to its end.
    async fn grant(
        &self,
        run_id: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Watch, crate::error::PortError>;

    /// The origin watchers connect to (`wss://host[:port]`): what a page that watches runs
    /// must be allowed to connect to.
    fn channel_origin(&self) -> String;
}

/// The origin (`scheme://host[:port]`) of a URL.
pub fn origin(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            format!(
                "{scheme}://{}",
                rest.split(['/', '?', '#']).next().unwrap_or("")
            )
        }
        None => url.to_owned(),
    }
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub run_id: String,
    pub expires_at: i64,
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("not a watch token")]
    Invalid,
    #[error("the watch token has expired")]
    Expired,
}

/// What the channel's authorizer is asked: to connect, to subscribe to a channel, or to
/// publish to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation<'a> {
    Connect,
    Subscribe(&'a str),
    Publish,
}

/// The authorizer's answer: allowed or not, and for how long the service may reuse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub ttl_seconds: i64,
}

/// Signs and checks watch tokens.
#[derive(Clone)]
pub struct Grants {
    key: Vec<u8>,
}

impl std::fmt::Debug for Grants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grants").finish_non_exhaustive()
    }
}

impl Grants {
    /// A signer with `key` (at least [`MIN_KEY_BYTES`]).
    pub fn new(key: &[u8]) -> Result<Self, ShortKey> {
        if key.len() < MIN_KEY_BYTES {
            return Err(ShortKey(key.len()));
        }
        Ok(Self { key: key.to_vec() })
    }

    fn mac(&self, payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(DOMAIN);
        mac.update(payload);
        mac
    }

    /// A token for `run_id`'s channel until `expires_at` (unix seconds).
    pub fn token(&self, run_id: &str, expires_at: i64) -> String {
        let payload = format!("{run_id}.{expires_at}");
        let tag = self.mac(payload.as_bytes()).finalize().into_bytes();
        format!("{}.{}", B64.encode(payload), B64.encode(tag))
    }

    /// Checks a token's MAC (in constant time) and its expiry at `now` (unix seconds).
    pub fn verify(&self, token: &str, now: i64) -> Result<Grant, GrantError> {
        let (payload, tag) = token.split_once('.').ok_or(GrantError::Invalid)?;
        let payload = B64.decode(payload).map_err(|_| GrantError::Invalid)?;
        let tag = B64.decode(tag).map_err(|_| GrantError::Invalid)?;
        self.mac(&payload)
            .verify_slice(&tag)
            .map_err(|_| GrantError::Invalid)?;
        let text = String::from_utf8(payload).map_err(|_| GrantError::Invalid)?;
        let (run_id, exp) = text.rsplit_once('.').ok_or(GrantError::Invalid)?;
        let expires_at: i64 = exp.parse().map_err(|_| GrantError::Invalid)?;
        if now >= expires_at {
            return Err(GrantError::Expired);
        }
        Ok(Grant {
            run_id: run_id.to_owned(),
            expires_at,
        })
    }

    /// The authorizer's decision on `token` for `op` at `now`: connect with any valid token,
    /// subscribe to the token's own run's channel only, publish never. No decision is to be
    /// cached (TTL 0): AppSync may key its cache by token alone, and a connection allowed
    /// from the cache must not let the same token subscribe to another run's channel.
    pub fn decide(&self, token: &str, op: Operation<'_>, now: i64) -> Decision {
        let deny = Decision {
            allowed: false,
            ttl_seconds: 0,
        };
        let Ok(grant) = self.verify(token, now) else {
            return deny;
        };
        match op {
            Operation::Connect => Decision {
                allowed: true,
                ttl_seconds: 0,
            },
            Operation::Subscribe(ch) if ch == channel(&grant.run_id) => Decision {
                allowed: true,
                ttl_seconds: 0,
            },
            Operation::Subscribe(_) | Operation::Publish => deny,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000;

    #[test]
    fn a_token_lets_its_holder_connect_and_subscribe_to_its_run_alone_until_it_expires() {
        let g = Grants::new(&[7; 32]).expect("key");
        let t = g.token("run_abc", NOW + 300);
        assert_eq!(
            g.verify(&t, NOW),
            Ok(Grant {
                run_id: "run_abc".into(),
                expires_at: NOW + 300
            })
        );
        assert_eq!(channel("run_abc"), "/runs/run-abc");
        assert_eq!(
            origin("wss://x.appsync-realtime-api.us-east-1.amazonaws.com/event/realtime"),
            "wss://x.appsync-realtime-api.us-east-1.amazonaws.com"
        );
        assert_eq!(
            origin("ws://127.0.0.1:4510/event/realtime"),
            "ws://127.0.0.1:4510"
        );
        let ok = |op| g.decide(&t, op, NOW).allowed;
        assert!(ok(Operation::Connect));
        assert!(ok(Operation::Subscribe("/runs/run-abc")));
        assert!(!ok(Operation::Subscribe("/runs/run-abd")));
        assert!(!ok(Operation::Subscribe("/runs/*")));
        assert!(!ok(Operation::Publish));
        // No decision is cached, a connection's included.
        assert_eq!(g.decide(&t, Operation::Connect, NOW + 200).ttl_seconds, 0);
        assert_eq!(
            g.decide(&t, Operation::Subscribe("/runs/run-abc"), NOW)
                .ttl_seconds,
            0
        );
        assert_eq!(g.verify(&t, NOW + 300), Err(GrantError::Expired));
        assert!(!g.decide(&t, Operation::Connect, NOW + 300).allowed);
    }

    #[test]
    fn forged_cut_or_foreign_tokens_are_refused() {
        let g = Grants::new(&[7; 32]).expect("key");
        let t = g.token("run_abc", NOW + 300);
        let (_, tag) = t.split_once('.').expect("two parts");
        let forged = format!("{}.{tag}", B64.encode(format!("run_xyz.{}", NOW + 300)));
        assert_eq!(g.verify(&forged, NOW), Err(GrantError::Invalid));
        let longer = format!("{}.{tag}", B64.encode(format!("run_abc.{}", NOW + 9999)));
        assert_eq!(g.verify(&longer, NOW), Err(GrantError::Invalid));
        assert_eq!(
            Grants::new(&[8; 32]).expect("key").verify(&t, NOW),
            Err(GrantError::Invalid)
        );
        assert_eq!(g.verify(&t[..t.len() - 2], NOW), Err(GrantError::Invalid));
        assert_eq!(g.verify("", NOW), Err(GrantError::Invalid));
        // A one-time answer link signed with the same key is not a watch token.
        let links = crate::links::Links::new(&[7; 32], "http://x").expect("key");
        let link = links.token(
            "run_abc",
            "300",
            chrono::DateTime::from_timestamp(NOW + 300, 0).expect("time"),
        );
        assert_eq!(g.verify(&link, NOW), Err(GrantError::Invalid));
        assert!(Grants::new(b"short").is_err());
    }
}
