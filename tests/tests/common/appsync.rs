//! A stand-in of an AppSync Events API, as its documentation describes the service (LocalStack
//! and moto have none): `POST /event` publishes (SigV4 with service `appsync`, checked by
//! signing the request again with the same keys and time; at most 5 events, each a JSON text
//! of at most 240 KB; channels of 1-5 segments of letters, digits and dashes), and
//! `/event/realtime` is the WebSocket protocol (`aws-appsync-event-ws` and `header-<auth>`
//! subprotocols, `connection_init`/`connection_ack`, `subscribe` with an id and its own
//! authorization, `subscribe_success`/`subscribe_error`, `data` with the event as a JSON
//! text, `unsubscribe`, `ka`; and, for tests, `POST /_standin/close-connections` closes every
//! connection as AppSync does at a connection's time limit). Connections and subscriptions are authorized as the API's
//! `AWS_LAMBDA` mode does, by the `live` function's own code (`baton_aws::watch::authorize`)
//! given the request AppSync sends it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use baton_core::live::grant::Grants;
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// The region the stand-in's API is in.
pub const REGION: &str = "us-east-1";

/// An event the stand-in accepted, and when.
#[derive(Debug, Clone)]
pub struct Published {
    pub channel: String,
    pub event: Value,
    pub at: Instant,
}

#[derive(Clone)]
struct Api {
    grants: Grants,
    /// The keys publishers sign with (the one principal allowed to publish).
    keys: Credentials,
    host: String,
    published: Arc<Mutex<Vec<Published>>>,
    fanout: broadcast::Sender<(String, String)>,
    /// Authorizer requests, by operation.
    asked: Arc<Mutex<HashMap<String, u32>>>,
    /// Decisions cached by the authorizer's `ttlOverride`, keyed by the token alone (the
    /// least a reading of AppSync's documentation allows, as its GraphQL APIs cache): a
    /// cached allow lets any later request with the token through, whatever it asks.
    cached: Arc<Mutex<HashMap<String, Instant>>>,
    /// `data` messages sent to subscribers.
    delivered: Arc<std::sync::atomic::AtomicU32>,
    /// Closes every connection (as AppSync does at a connection's time limit).
    closing: broadcast::Sender<()>,
    /// How many of the next `committed` events are accepted and never delivered.
    losing: Arc<std::sync::atomic::AtomicU32>,
}

pub struct StandIn {
    /// `http://127.0.0.1:<port>`: both domains (`BATON_LIVE_HTTP_DOMAIN` and
    /// `BATON_LIVE_REALTIME_DOMAIN`, as `ws://…`).
    pub url: String,
    api: Api,
}

impl StandIn {
    /// A stand-in whose Lambda authorizer checks watch tokens with `grants`, and whose one
    /// publisher signs with `keys`.
    pub async fn start(grants: Grants, keys: Credentials) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let api = Api {
            grants,
            keys,
            host: addr.to_string(),
            published: Arc::default(),
            fanout: broadcast::channel(4096).0,
            asked: Arc::default(),
            cached: Arc::default(),
            delivered: Arc::default(),
            closing: broadcast::channel(16).0,
            losing: Arc::default(),
        };
        let app = Router::new()
            .route("/event", post(publish))
            .route("/event/realtime", get(connect))
            // The stand-in's own control, for a test that runs elsewhere (a browser's).
            .route("/_standin/close-connections", post(close_connections))
            .with_state(api.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url: format!("http://{addr}"),
            api,
        }
    }

    /// The live channel's settings for a host publishing here.
    pub fn config(&self) -> baton_aws::settings::LiveConfig {
        baton_aws::settings::LiveConfig {
            publish_url: format!("{}/event", self.url),
            realtime_url: format!("{}/event/realtime", self.url.replace("http://", "ws://")),
            http_host: self.api.host.clone(),
        }
    }

    /// What was published to `channel` so far.
    pub fn published(&self, channel: &str) -> Vec<Published> {
        let all = self.api.published.lock().expect("lock");
        all.iter()
            .filter(|p| p.channel == channel)
            .cloned()
            .collect()
    }

    /// How many `data` messages subscribers were sent.
    pub fn delivered(&self) -> u32 {
        self.api
            .delivered
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Closes every WebSocket connection, as AppSync does at a connection's time limit.
    pub fn close_connections(&self) {
        let _ = self.api.closing.send(());
    }

    /// Accepts the next `n` `committed` events and delivers none of them (a delivery is
    /// best effort: a watcher must notice what it missed).
    pub fn lose_committed(&self, n: u32) {
        self.api
            .losing
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// How often the authorizer was asked for `operation`.
    pub fn asked(&self, operation: &str) -> u32 {
        let asked = self.api.asked.lock().expect("lock");
        asked.get(operation).copied().unwrap_or(0)
    }
}

fn refuse(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"errors": [{"errorType": kind, "message": message}]})),
    )
        .into_response()
}

/// `POST /event`.
async fn publish(State(api): State<Api>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(why) = check_signature(&api, &headers, &body) {
        return refuse(StatusCode::UNAUTHORIZED, "UnauthorizedException", &why);
    }
    let Ok(req) = serde_json::from_slice::<Value>(&body) else {
        return refuse(StatusCode::BAD_REQUEST, "BadRequestException", "not JSON");
    };
    let channel = req["channel"].as_str().unwrap_or_default().to_owned();
    if !valid_channel(&channel) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            "bad channel",
        );
    }
    let Some(events) = req["events"]
        .as_array()
        .filter(|e| (1..=5).contains(&e.len()))
    else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            "1 to 5 events",
        );
    };
    let mut parsed = Vec::new();
    for e in events {
        let Some(text) = e.as_str().filter(|t| t.len() <= 240 * 1024) else {
            return refuse(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                "event: a JSON text",
            );
        };
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return refuse(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                "event: not JSON",
            );
        };
        parsed.push((text.to_owned(), v));
    }
    let mut successful = Vec::new();
    for (index, (text, event)) in parsed.into_iter().enumerate() {
        api.published.lock().expect("lock").push(Published {
            channel: channel.clone(),
            event: event.clone(),
            at: Instant::now(),
        });
        // Delivery is best effort: a test may have the next `committed` events lost.
        let lost = event["type"] == "committed"
            && api
                .losing
                .fetch_update(
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                    |n| n.checked_sub(1),
                )
                .is_ok();
        if !lost {
            let _ = api.fanout.send((channel.clone(), text));
        }
        successful.push(json!({"identifier": uuid::Uuid::new_v4().to_string(), "index": index}));
    }
    Json(json!({"failed": [], "successful": successful})).into_response()
}

/// Signs the request again with the stand-in's keys, at the time it says it was signed:
/// the `Authorization` headers must match.
fn check_signature(api: &Api, headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
    let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
    let given = header("authorization").ok_or("no Authorization")?;
    let date = header("x-amz-date").ok_or("no X-Amz-Date")?;
    let key = api.keys.access_key_id();
    let prefix = format!(
        "AWS4-HMAC-SHA256 Credential={key}/{}/{REGION}/appsync/aws4_request",
        &date[..8.min(date.len())]
    );
    if !given.starts_with(&prefix) {
        return Err(format!(
            "not signed for appsync in {REGION} by {key}: {given}"
        ));
    }
    let time = chrono::NaiveDateTime::parse_from_str(date, "%Y%m%dT%H%M%SZ")
        .map_err(|e| format!("X-Amz-Date: {e}"))?
        .and_utc();
    let identity = Credentials::new(
        api.keys.access_key_id(),
        api.keys.secret_access_key(),
        header("x-amz-security-token").map(str::to_owned),
        None,
        "stand-in",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(REGION)
        .name("appsync")
        .time(SystemTime::from(time))
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| e.to_string())?;
    let ct = header("content-type").unwrap_or_default();
    let url = format!("http://{}/event", api.host);
    let signable = SignableRequest::new(
        "POST",
        &url,
        [("content-type", ct)].into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| e.to_string())?;
    let (instructions, _) = sign(signable, &params.into())
        .map_err(|e| e.to_string())?
        .into_parts();
    let expected = instructions
        .headers()
        .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.to_owned())
        .unwrap_or_default();
    if expected != given {
        return Err("the signature does not match".into());
    }
    Ok(())
}

/// 1-5 segments of 1-50 letters, digits and dashes (not at either end); a subscription may
/// end in `*`.
fn valid_channel(channel: &str) -> bool {
    let segments: Vec<&str> = channel.trim_start_matches('/').split('/').collect();
    (1..=5).contains(&segments.len())
        && segments.iter().all(|s| {
            (1..=50).contains(&s.len())
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        })
}

/// What AppSync asks its Lambda authorizer, answered by the `live` function's code, or a
/// decision it cached for the token.
fn authorize(api: &Api, token: &str, operation: &str, channel: Option<&str>) -> bool {
    if api
        .cached
        .lock()
        .expect("lock")
        .get(token)
        .is_some_and(|until| Instant::now() < *until)
    {
        return true;
    }
    *api.asked
        .lock()
        .expect("lock")
        .entry(operation.to_owned())
        .or_default() += 1;
    let request = json!({
        "authorizationToken": token,
        "requestContext": {
            "apiId": "standin", "accountId": "123456789012",
            "requestId": uuid::Uuid::new_v4().to_string(),
            "operation": operation,
            "channelNamespaceName": channel.map(|_| "runs"),
            "channel": channel,
        },
        "requestHeaders": {},
    });
    let answer = baton_aws::watch::authorize(&api.grants, &request, chrono::Utc::now().timestamp());
    let allowed = answer["isAuthorized"] == true;
    let ttl = answer["ttlOverride"].as_u64().unwrap_or(0);
    if allowed && ttl > 0 {
        let until = Instant::now() + std::time::Duration::from_secs(ttl);
        api.cached
            .lock()
            .expect("lock")
            .insert(token.to_owned(), until);
    }
    allowed
}

/// The token of an authorization object (its key in any case).
fn token_of(auth: &Value) -> String {
    auth.as_object()
        .and_then(|o| {
            o.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
                .and_then(|(_, v)| v.as_str())
        })
        .unwrap_or_default()
        .to_owned()
}

/// Closes every WebSocket connection, as AppSync does when one reaches its time limit.
async fn close_connections(State(api): State<Api>) -> StatusCode {
    let _ = api.closing.send(());
    StatusCode::NO_CONTENT
}

/// `GET /event/realtime`: the upgrade, authorized by the `header-` subprotocol.
async fn connect(State(api): State<Api>, headers: HeaderMap, ws: WebSocketUpgrade) -> Response {
    let offered: Vec<String> = headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .collect();
    if !offered.iter().any(|p| p == "aws-appsync-event-ws") {
        return refuse(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            "subprotocol aws-appsync-event-ws not offered",
        );
    }
    let auth = offered
        .iter()
        .find_map(|p| p.strip_prefix("header-"))
        .and_then(|h| B64.decode(h).ok())
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let Some(auth) = auth else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "UnauthorizedException",
            "no header- subprotocol",
        );
    };
    if auth["host"] != api.host.as_str()
        || !authorize(&api, &token_of(&auth), "EVENT_CONNECT", None)
    {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "UnauthorizedException",
            "not authorized to connect",
        );
    }
    ws.protocols(["aws-appsync-event-ws"])
        .on_upgrade(move |socket| session(api, socket))
}

async fn session(api: Api, mut socket: WebSocket) {
    let mut fanout = api.fanout.subscribe();
    let mut closing = api.closing.subscribe();
    let mut subs: HashMap<String, String> = HashMap::new();
    let mut ka = tokio::time::interval(Duration::from_secs(60));
    let send = |v: Value| Message::Text(v.to_string().into());
    loop {
        tokio::select! {
            m = socket.recv() => {
                let Some(Ok(Message::Text(text))) = m else { return };
                let Ok(m) = serde_json::from_str::<Value>(&text) else { return };
                let id = m["id"].as_str().unwrap_or_default().to_owned();
                let reply = match m["type"].as_str().unwrap_or_default() {
                    "connection_init" => json!({"type": "connection_ack", "connectionTimeoutMs": 300000}),
                    "subscribe" => {
                        let channel = m["channel"].as_str().unwrap_or_default();
                        let id_ok = (1..=128).contains(&id.len())
                            && id.chars().all(|c| c.is_ascii_alphanumeric() || "-_+".contains(c));
                        let wildcard = channel.strip_suffix("/*").unwrap_or(channel);
                        if id_ok && !subs.contains_key(&id) && valid_channel(wildcard)
                            && authorize(&api, &token_of(&m["authorization"]), "EVENT_SUBSCRIBE", Some(channel))
                        {
                            subs.insert(id.clone(), channel.to_owned());
                            json!({"type": "subscribe_success", "id": id})
                        } else {
                            json!({"type": "subscribe_error", "id": id, "errors": [
                                {"errorType": "UnauthorizedException", "message": "not authorized to subscribe"}]})
                        }
                    }
                    "unsubscribe" => match subs.remove(&id) {
                        Some(_) => json!({"type": "unsubscribe_success", "id": id}),
                        None => json!({"type": "unsubscribe_error", "id": id, "errors": [
                            {"errorType": "UnknownOperationError", "message": format!("Unknown operation id {id}")}]}),
                    },
                    other => json!({"type": "error", "id": id, "errors": [
                        {"errorType": "UnsupportedOperation", "message": format!("{other} is not supported here")}]}),
                };
                if socket.send(send(reply)).await.is_err() {
                    return;
                }
            }
            e = fanout.recv() => {
                let Ok((channel, text)) = e else { return };
                for (id, sub) in &subs {
                    let matches = match sub.strip_suffix('*') {
                        Some(prefix) => channel.starts_with(prefix),
                        None => *sub == channel,
                    };
                    if matches {
                        if socket.send(send(json!({"type": "data", "id": id, "event": text}))).await.is_err() {
                            return;
                        }
                        api.delivered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
            _ = closing.recv() => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            _ = ka.tick() => {
                if socket.send(send(json!({"type": "ka"}))).await.is_err() {
                    return;
                }
            }
        }
    }
}
