//! A watcher's side of the live channel on AWS: a subscription to a run's channel on an
//! AppSync Events API, over its WebSocket protocol, with a watch the API granted
//! (`POST /runs/{id}/watch`, [`Watch`]).
//!
//! The connection offers the subprotocols `aws-appsync-event-ws` and `header-<auth>` (the
//! authorization, `{"host", "Authorization"}` as JSON, base64url without padding); sends
//! `connection_init` and waits for `connection_ack`; subscribes (`subscribe` with an id, the
//! channel and the same authorization) and waits for `subscribe_success`. Then each `data`
//! message's `event` (a JSON text; an array of them is taken too) is handed over, in order;
//! `ka` messages keep it alive.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use baton_core::live::grant::Watch;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// The protocol's own subprotocol.
pub const SUBPROTOCOL: &str = "aws-appsync-event-ws";
/// How long each step of connecting and subscribing may take.
const STEP: Duration = Duration::from_secs(10);

/// Why a subscription could not be made (or ended).
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("cannot connect to the live channel ({url}): {reason}")]
    Connect { url: String, reason: String },
    #[error("the live channel refused: {0}")]
    Refused(String),
    #[error("the live channel did not answer in time ({0})")]
    Timeout(&'static str),
}

/// A run's live events as they come; `None` from [`Subscription::next`] once the
/// connection ends.
pub struct Subscription {
    events: mpsc::Receiver<Value>,
    task: tokio::task::JoinHandle<()>,
}

impl Subscription {
    /// The next event, or `None` when the connection has ended.
    pub async fn next(&mut self) -> Option<Value> {
        self.events.recv().await
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `authorization` object of a watch: its token, and the API's HTTP domain.
pub fn authorization(watch: &Watch) -> Value {
    json!({"host": watch.host, "Authorization": watch.token})
}

/// Connects and subscribes to the watched run's channel.
pub async fn subscribe(watch: &Watch) -> Result<Subscription, ChannelError> {
    let connect_err = |reason: String| ChannelError::Connect {
        url: watch.realtime_url.clone(),
        reason,
    };
    let auth = authorization(watch);
    let mut request = watch
        .realtime_url
        .as_str()
        .into_client_request()
        .map_err(|e| connect_err(e.to_string()))?;
    let protocols = format!("{SUBPROTOCOL}, header-{}", B64.encode(auth.to_string()));
    request.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_str(&protocols).map_err(|e| connect_err(e.to_string()))?,
    );
    let (mut ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(request))
        .await
        .map_err(|_| ChannelError::Timeout("connect"))?
        .map_err(|e| connect_err(e.to_string()))?;
    let send = |v: Value| Message::text(v.to_string());
    ws.send(send(json!({"type": "connection_init"})))
        .await
        .map_err(|e| connect_err(e.to_string()))?;
    expect(&mut ws, "connection_ack", "connection_ack").await?;
    let id = uuid::Uuid::new_v4().to_string();
    ws.send(send(json!({
        "type": "subscribe",
        "id": id,
        "channel": watch.channel,
        "authorization": auth,
    })))
    .await
    .map_err(|e| connect_err(e.to_string()))?;
    expect(&mut ws, "subscribe_success", "subscribe").await?;
    let (tx, events) = mpsc::channel(1024);
    let task = tokio::spawn(async move {
        while let Some(Ok(message)) = ws.next().await {
            let Message::Text(text) = message else {
                continue;
            };
            let Ok(m) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if m["type"] != "data" || m["id"] != id.as_str() {
                continue;
            }
            for event in payloads(&m["event"]) {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(Subscription { events, task })
}

/// A `data` message's event: a JSON text, or (as the service's documentation also shows
/// it) an array of them.
fn payloads(event: &Value) -> Vec<Value> {
    let texts: Vec<&str> = match event {
        Value::String(s) => vec![s],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    texts
        .into_iter()
        .filter_map(|t| serde_json::from_str(t).ok())
        .collect()
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Waits for a message of type `want`, past keep-alives; an error message is a refusal.
async fn expect(ws: &mut Socket, want: &str, step: &'static str) -> Result<(), ChannelError> {
    let wait = async {
        while let Some(message) = ws.next().await {
            let message = message.map_err(|e| ChannelError::Refused(e.to_string()))?;
            let Message::Text(text) = message else {
                continue;
            };
            let m: Value = serde_json::from_str(&text)
                .map_err(|_| ChannelError::Refused(format!("not JSON: {text}")))?;
            match m["type"].as_str().unwrap_or("") {
                t if t == want => return Ok(()),
                "ka" => {}
                _ => {
                    return Err(ChannelError::Refused(
                        m["errors"][0]["message"]
                            .as_str()
                            .or(m["type"].as_str())
                            .unwrap_or("?")
                            .to_owned(),
                    ));
                }
            }
        }
        Err(ChannelError::Refused("the connection closed".into()))
    };
    tokio::time::timeout(STEP, wait)
        .await
        .map_err(|_| ChannelError::Timeout(step))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_a_json_text_or_an_array_of_them() {
        assert_eq!(
            payloads(&json!("{\"type\":\"delta\"}")),
            [json!({"type": "delta"})]
        );
        assert_eq!(
            payloads(&json!(["1", "{\"a\":2}", 3])),
            [json!(1), json!({"a": 2})]
        );
        assert!(payloads(&json!({"not": "text"})).is_empty());
    }
}
