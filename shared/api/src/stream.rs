//! `GET /runs/{id}/stream`: a run's timeline and state as Server-Sent Events, on the hosts
//! that keep a connection open (`baton dev`, `baton dev --aws`). API Gateway's HTTP APIs do
//! not stream, so the `api` function answers 501 and a client polls
//! `GET /runs/{id}/timeline?after=` instead (the console does either, by what it is offered).
//!
//! Events:
//! - `entry`: one timeline entry, as `GET /runs/{id}` shows it, whenever it is new or has
//!   changed (a pending tool result resolved). A client keeps entries by `seq`.
//! - `run`: the run's status, state, usage and cost, whenever its version moves.
//!
//! Every event's id is the timeline cursor: the last seq before the first entry that may
//! still change (a pending tool result), or the last seq. A client that reconnects with
//! `Last-Event-ID` gets everything after it again, as it now is, so nothing it missed stays
//! stale.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use baton_core::service::Service;
use baton_core::timeline::{Entry, EntryBody};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::json;
use tokio::sync::watch;

use crate::{ApiError, AppState, Caller, Id, MAX_PAGE};

/// How often an open stream looks at its run.
pub const POLL: Duration = Duration::from_millis(250);

pub(crate) async fn stream_run(
    State(s): State<AppState>,
    Extension(Caller(owner)): Extension<Caller>,
    Id(run_id): Id,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if !s.streams {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_streamed",
            "this host does not stream (API Gateway HTTP APIs buffer responses): poll \
             GET /runs/{id}/timeline?after=<cursor> instead",
        ));
    }
    let after = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| ApiError::invalid("Last-Event-ID must be a timeline cursor"))?,
        ),
    };
    // Unknown or someone else's run: a 404 now, not an empty stream.
    s.service
        .timeline(&owner, &run_id, Some(u64::MAX), 1)
        .await?;
    let follow = Follow {
        stop: s.stop.clone(),
        service: s.service.clone(),
        owner,
        run_id,
        after,
        sent: BTreeMap::new(),
        version: None,
    };
    Ok(Sse::new(events(follow))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// What one open stream has sent.
struct Follow {
    stop: Option<watch::Receiver<bool>>,
    service: Arc<Service>,
    owner: String,
    run_id: String,
    /// The cursor: entries up to here are final and sent.
    after: Option<u64>,
    /// Entries past the cursor as last sent, by seq.
    sent: BTreeMap<u64, String>,
    version: Option<u64>,
}

fn events(follow: Follow) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(Some(follow), |state| async move {
        let mut f = state?;
        loop {
            if f.stop.as_ref().is_some_and(|s| *s.borrow()) {
                return None;
            }
            match f.poll().await {
                Ok(batch) if batch.is_empty() => f.pause().await,
                Ok(batch) => return Some((stream::iter(batch), Some(f))),
                // The run is gone, or the store is: say so, and end the stream.
                Err(e) => {
                    let body = json!({"error": {"code": "stream_ended", "message": e}});
                    let last = Event::default().event("error").data(body.to_string());
                    return Some((stream::iter(vec![Ok(last)]), None));
                }
            }
        }
    })
    .flatten()
}

impl Follow {
    /// Waits for the next poll, or for the server to stop.
    async fn pause(&mut self) {
        match &mut self.stop {
            Some(stop) => {
                let _ = tokio::time::timeout(POLL, stop.wait_for(|s| *s)).await;
            }
            None => tokio::time::sleep(POLL).await,
        }
    }

    /// The events since the last poll (none when nothing changed).
    async fn poll(&mut self) -> Result<Vec<Result<Event, Infallible>>, String> {
        let (run, entries) = self
            .service
            .timeline(&self.owner, &self.run_id, self.after, MAX_PAGE)
            .await
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let mut changed = Vec::new();
        for e in &entries {
            let json = serde_json::to_string(e).map_err(|e| e.to_string())?;
            if self.sent.get(&e.seq) != Some(&json) {
                changed.push(json.clone());
                self.sent.insert(e.seq, json);
            }
        }
        // The cursor moves past every entry that can no longer change.
        let settled = entries
            .iter()
            .take_while(|e| !may_change(e))
            .last()
            .map(|e| e.seq);
        if let Some(seq) = settled {
            self.after = Some(seq);
            self.sent = self.sent.split_off(&(seq + 1));
        }
        let id = self.after.map_or_else(String::new, |a| a.to_string());
        for json in changed {
            out.push(Ok(Event::default().event("entry").id(&id).data(json)));
        }
        if self.version != Some(run.version) {
            self.version = Some(run.version);
            let mut v = json!({
                "runId": run.run_id, "status": run.status, "state": run.state,
                "version": run.version, "usage": run.usage, "costUsd": run.cost_usd,
                "total": run.total(),
            });
            if let Some(e) = &run.error {
                v["error"] = json!(e);
            }
            if let Some(r) = &run.result {
                v["result"] = json!(r);
            }
            out.push(Ok(Event::default()
                .event("run")
                .id(&id)
                .data(v.to_string())));
        }
        Ok(out)
    }
}

/// Whether an entry may still change: a tool result not yet in.
fn may_change(e: &Entry) -> bool {
    matches!(&e.body, EntryBody::Tool(t) if t.result.is_pending())
}
