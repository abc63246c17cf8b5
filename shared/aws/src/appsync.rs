//! The live channel on AWS: an AppSync Events API. Steps publish a watched run's live events
//! to its channel (`/runs/<runId>`) with `POST https://<http domain>/event`, signed with the
//! function's role (SigV4, service `appsync`); watchers subscribe over the API's WebSocket
//! with a watch token the `api` function grants ([`baton_core::live::grant`]).
//!
//! Publishing is best effort and off the step's path: [`AppSyncLive::publish`] queues an
//! event and returns; a task sends them, text pieces of one reply that come within
//! [`COALESCE`] merged into one event, at most [`EVENTS_PER_REQUEST`] events a request, each
//! request bounded by [`REQUEST_TIMEOUT`]. A full queue, a refused or failed request: the
//! events are dropped (and logged), never retried — the run's timeline is the record a
//! watcher catches up from. A step's end waits for what it queued at most
//! [`AppSyncLive::drain`]'s bound, so that Lambda does not freeze the sender mid-request.
//!
//! While a run is watched its steps also publish what they committed (`committed`), so
//! that watchers, which cannot stream the timeline through API Gateway, need not poll it.
//!
//! A run nobody watches costs nothing here: [`AppSyncLive::watched`] reads the watch lease
//! the run was read with (the `LIVE` item, see [`crate::dynamo`]), so its steps neither
//! stream their model calls nor publish.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use baton_core::live::grant::channel;
use baton_core::live::{Live, LiveEvent, LiveKind};
use baton_core::run::Run;
use tokio::sync::{Notify, mpsc};

/// How long text pieces of one reply are gathered into one event.
pub const COALESCE: Duration = Duration::from_millis(100);
/// The most events one publish request carries (the service's limit).
pub const EVENTS_PER_REQUEST: usize = 5;
/// One publish request's bound, connecting included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How many events may wait to be sent; past it, new ones are dropped.
const QUEUE: usize = 4096;
/// The most text one merged event carries (an event may be 240 KB; a watcher's screen wants
/// pieces far smaller).
const MERGED_TEXT_BYTES: usize = 16 * 1024;

/// Publishes live events to an AppSync Events API.
pub struct AppSyncLive {
    tx: mpsc::Sender<LiveEvent>,
    /// Events queued and not yet sent (or dropped).
    pending: Arc<Pending>,
}

#[derive(Default)]
struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

impl Pending {
    fn done(&self, n: usize) {
        if self.count.fetch_sub(n, Ordering::AcqRel) == n {
            self.idle.notify_waiters();
        }
    }
}

/// Where and as whom events are published.
#[derive(Clone)]
pub struct Publisher {
    /// `https://<http domain>/event` (or a stand-in's URL).
    pub url: String,
    pub region: String,
    pub credentials: SharedCredentialsProvider,
}

impl AppSyncLive {
    /// A publisher to `to`; its sender runs on the current Tokio runtime.
    pub fn start(to: Publisher) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let pending = Arc::new(Pending::default());
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .unwrap_or_default();
        tokio::spawn(send(rx, to, http, pending.clone()));
        Arc::new(Self { tx, pending })
    }

    /// Waits until every event queued so far is sent (or dropped), at most `within`.
    pub async fn drain(&self, within: Duration) {
        let wait = async {
            loop {
                let idle = self.pending.idle.notified();
                if self.pending.count.load(Ordering::Acquire) == 0 {
                    return;
                }
                idle.await;
            }
        };
        let _ = tokio::time::timeout(within, wait).await;
    }
}

impl Live for AppSyncLive {
    fn watched(&self, run: &Run) -> bool {
        run.watched_until
            .is_some_and(|until| until > chrono::Utc::now().timestamp_millis())
    }

    fn carries_committed(&self) -> bool {
        true
    }

    fn publish(&self, event: LiveEvent) {
        self.pending.count.fetch_add(1, Ordering::AcqRel);
        if self.tx.try_send(event).is_err() {
            tracing::debug!("live: the queue is full, an event is dropped");
            self.pending.done(1);
        }
    }
}

/// The sender: gathers what comes within [`COALESCE`] of the first event, merges text
/// pieces, sends each run's events in order.
async fn send(
    mut rx: mpsc::Receiver<LiveEvent>,
    to: Publisher,
    http: reqwest::Client,
    pending: Arc<Pending>,
) {
    while let Some(first) = rx.recv().await {
        let mut got = vec![first];
        let window = tokio::time::sleep(COALESCE);
        tokio::pin!(window);
        loop {
            tokio::select! {
                e = rx.recv() => match e {
                    Some(e) => got.push(e),
                    None => break,
                },
                () = &mut window => break,
            }
        }
        let n = got.len();
        for (channel, events) in batches(merge(got)) {
            if let Err(e) = post(&http, &to, &channel, &events).await {
                tracing::warn!(channel, error = %e, "live: events not published (dropped)");
            }
        }
        pending.done(n);
    }
}

/// Consecutive text pieces of one reply (same run, attempt and kind) made one.
fn merge(events: Vec<LiveEvent>) -> Vec<LiveEvent> {
    let mut out: Vec<LiveEvent> = Vec::with_capacity(events.len());
    for e in events {
        if let Some(last) = out.last_mut()
            && last.run_id == e.run_id
            && last.attempt == e.attempt
            && last.seq == e.seq
        {
            match (&mut last.kind, &e.kind) {
                (LiveKind::Delta { text }, LiveKind::Delta { text: more })
                    if text.len() + more.len() <= MERGED_TEXT_BYTES =>
                {
                    text.push_str(more);
                    continue;
                }
                (
                    LiveKind::ToolCallDelta {
                        index, arguments, ..
                    },
                    LiveKind::ToolCallDelta {
                        index: i,
                        id: None,
                        name: None,
                        arguments: more,
                    },
                ) if index == i && arguments.len() + more.len() <= MERGED_TEXT_BYTES => {
                    arguments.push_str(more);
                    continue;
                }
                _ => {}
            }
        }
        out.push(e);
    }
    out
}

/// Events by channel, in order, at most [`EVENTS_PER_REQUEST`] a request, each as the JSON
/// text the service carries.
fn batches(events: Vec<LiveEvent>) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for e in events {
        let Ok(text) = serde_json::to_string(&e) else {
            continue;
        };
        let ch = channel(&e.run_id);
        match out.last_mut() {
            Some((c, batch)) if *c == ch && batch.len() < EVENTS_PER_REQUEST => batch.push(text),
            _ => out.push((ch, vec![text])),
        }
    }
    out
}

/// Why a publish request did not land.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("no credentials: {0}")]
    Credentials(String),
    #[error("signing: {0}")]
    Signing(String),
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("refused ({status}): {body}")]
    Refused { status: u16, body: String },
    #[error("{failed} of the events failed: {body}")]
    Failed { failed: usize, body: String },
}

/// One `POST /event`: `{"channel", "events": [<JSON text>…]}`, SigV4-signed.
pub async fn post(
    http: &reqwest::Client,
    to: &Publisher,
    channel: &str,
    events: &[String],
) -> Result<(), PublishError> {
    let body = serde_json::to_vec(&serde_json::json!({"channel": channel, "events": events}))
        .map_err(|e| PublishError::Signing(e.to_string()))?;
    let credentials = to
        .credentials
        .provide_credentials()
        .await
        .map_err(|e| PublishError::Credentials(e.to_string()))?;
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&to.region)
        .name("appsync")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| PublishError::Signing(e.to_string()))?;
    let headers = [("content-type", "application/json")];
    let signable = SignableRequest::new(
        "POST",
        &to.url,
        headers.iter().copied(),
        SignableBody::Bytes(&body),
    )
    .map_err(|e| PublishError::Signing(e.to_string()))?;
    let (instructions, _) = sign(signable, &params.into())
        .map_err(|e| PublishError::Signing(e.to_string()))?
        .into_parts();
    let mut request = http
        .post(&to.url)
        .header("content-type", "application/json")
        .body(body);
    for (name, value) in instructions.headers() {
        request = request.header(name, value);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    if !(200..300).contains(&status) {
        return Err(PublishError::Refused { status, body: text });
    }
    let failed = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["failed"].as_array().map(Vec::len))
        .unwrap_or(0);
    if failed > 0 {
        return Err(PublishError::Failed { failed, body: text });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(run: &str, attempt: &str, kind: LiveKind) -> LiveEvent {
        LiveEvent {
            run_id: run.into(),
            seq: 4,
            attempt: attempt.into(),
            kind,
        }
    }
    fn delta(t: &str) -> LiveKind {
        LiveKind::Delta { text: t.into() }
    }

    #[test]
    fn pieces_of_one_reply_merge_and_batches_keep_order_by_channel() {
        let tool = LiveKind::ToolStarted {
            call_id: "c1".into(),
            tool: "echo".into(),
            input_preview: "{}".into(),
        };
        let merged = merge(vec![
            ev("run_a", "s.1", delta("Hel")),
            ev("run_a", "s.1", delta("lo")),
            // Another attempt's text is not the same reply's.
            ev("run_a", "s.2", delta("Hi")),
            ev("run_a", "s.2", tool.clone()),
            ev("run_a", "s.2", delta("after")),
            ev("run_b", "t.1", delta("other run")),
        ]);
        let kinds: Vec<&LiveKind> = merged.iter().map(|e| &e.kind).collect();
        assert_eq!(
            kinds,
            [
                &delta("Hello"),
                &delta("Hi"),
                &tool,
                &delta("after"),
                &delta("other run")
            ]
        );
        let many: Vec<LiveEvent> = (0..7)
            .map(|i| ev("run_a", &format!("s.{i}"), delta("x")))
            .chain([ev("run_b", "t", delta("y"))])
            .collect();
        let b = batches(many);
        let shape: Vec<(&str, usize)> = b.iter().map(|(c, e)| (c.as_str(), e.len())).collect();
        assert_eq!(
            shape,
            [("/runs/run-a", 5), ("/runs/run-a", 2), ("/runs/run-b", 1)]
        );
        let first: serde_json::Value = serde_json::from_str(&b[0].1[0]).expect("JSON text");
        assert_eq!(first["type"], "delta");
        assert_eq!(first["runId"], "run_a");
    }

    /// A publisher to `url` with made-up keys.
    fn publisher(url: String) -> Arc<AppSyncLive> {
        let keys = aws_credential_types::Credentials::new("AKID", "secret", None, None, "test");
        AppSyncLive::start(Publisher {
            url,
            region: "us-east-1".into(),
            credentials: SharedCredentialsProvider::new(keys),
        })
    }

    /// A server that takes connections and requests and never answers.
    async fn silent_server() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        format!("http://{addr}/event")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_channel_that_never_answers_costs_a_step_nothing_and_its_end_at_most_the_bound() {
        let live = publisher(silent_server().await);
        let started = std::time::Instant::now();
        for i in 0..50 {
            live.publish(ev("run_a", &format!("s.{i}"), delta("x")));
        }
        // Publishing never waits.
        assert!(
            started.elapsed() < Duration::from_millis(50),
            "{:?}",
            started.elapsed()
        );
        // The invocation's end waits at most its bound, not for every request's timeout.
        let drained = std::time::Instant::now();
        live.drain(Duration::from_millis(500)).await;
        let took = drained.elapsed();
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_millis(1500),
            "{took:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_publish_drops_its_events_and_the_queue_drains() {
        // Nothing listens here: every request is refused at once.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let live = publisher(format!("http://127.0.0.1:{port}/event"));
        for i in 0..20 {
            live.publish(ev("run_a", &format!("s.{i}"), delta("x")));
        }
        let started = std::time::Instant::now();
        live.drain(Duration::from_secs(5)).await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(live.pending.count.load(Ordering::Acquire), 0);
    }

    #[test]
    fn merged_text_stays_under_its_bound() {
        let big = "x".repeat(MERGED_TEXT_BYTES - 10);
        let merged = merge(vec![
            ev("run_a", "s.1", delta(&big)),
            ev("run_a", "s.1", delta(&"y".repeat(20))),
        ]);
        assert_eq!(merged.len(), 2);
    }
}
