//! `GET /runs/{id}/stream`: a run's timeline and state as Server-Sent Events, on the hosts
//! that keep a connection open (`baton dev`, `baton dev --aws`). API Gateway's HTTP APIs do
//! not stream, so the `api` function answers 501 and a client polls
//! `GET /runs/{id}/timeline?after=` instead (the console does either, by what it is offered).
//!
//! Events:
//! - `entry`: one timeline entry, as `GET /runs/{id}` shows it, whenever it is new or has
//!   changed (a pending tool result resolved). A client keeps entries by `seq`.
//! - `run`: the run's status, state, usage and cost, whenever its version moves, once the
//!   stream has caught up with the timeline.
//! - Live events, on a host with a live channel ([`crate::live::Hub`]), as a step makes them
//!   and before it commits: `delta` (a piece of the model's reply), `tool_call_delta` (a
//!   piece of a tool call the model writes), `tool_started`, `tool_finished` and `state`
//!   ([`baton_core::live::LiveKind`]). They carry no id (a reconnect resumes the timeline,
//!   the record) and are never stored: the `assistant` entry that comes at their `seq`
//!   replaces its deltas, and deltas of an `attempt` that is followed by another's are to be
//!   dropped.
//!
//! Each event's id is the timeline cursor just after that event: an `entry` event's own seq
//! when no entry at or before it may still change (a pending tool result), else the last
//! seq before the first one that may; a `run` event's, the cursor after the entries sent
//! before it. A client that reconnects with `Last-Event-ID` gets everything after it, as it
//! now is: nothing it missed, and again only what may have changed since.
//!
//! The stream ends after the `run` event of a run at rest (ended, or `waiting` on an answer
//! or a subagent), unless the client asked `?follow=true`: then it stays open for what
//! comes next (an answer, a follow-up message), as the console's run page does.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use baton_core::live::LiveEvent;
use baton_core::run::{Run, RunStatus};
use baton_core::service::Service;
use baton_core::timeline::{Entry, EntryBody};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::json;
use tokio::sync::{broadcast, watch};

use crate::error::ErrorBody;
use crate::{ApiError, AppState, Caller, Id, MAX_PAGE};

/// How often an open stream looks at its run.
pub const POLL: Duration = Duration::from_millis(250);

pub(crate) async fn stream_run(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Id(run_id): Id,
    Query(q): Query<HashMap<String, String>>,
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
    let keep_open = match q.get("follow").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::invalid("`follow` must be true or false")),
    };
    // Unknown or someone else's run (an operator reads anyone's): a 404 now, not an empty
    // stream.
    let (service, id) = (&s.service, run_id.as_str());
    let (_, owner) = crate::runs::read_as(&s, &caller, id, |owner| async move {
        service
            .requests()
            .timeline(&owner, id, Some(u64::MAX), 1)
            .await
    })
    .await?;
    // Subscribed before the first read: nothing between the two is missed.
    let live = s.live.as_ref().map(|hub| hub.subscribe(&run_id));
    let follow = Follow {
        live,
        stop: s.stop.clone(),
        service: s.service.clone(),
        owner,
        run_id,
        keep_open,
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
    live: Option<broadcast::Receiver<Arc<LiveEvent>>>,
    stop: Option<watch::Receiver<bool>>,
    service: Arc<Service>,
    owner: String,
    run_id: String,
    /// `?follow=true`: stay open while the run is at rest.
    keep_open: bool,
    /// The cursor: entries up to here are final and sent.
    after: Option<u64>,
    /// Entries past the cursor as last sent, by seq.
    sent: BTreeMap<u64, String>,
    version: Option<u64>,
}

/// The events of one poll, and whether they are the stream's last.
struct Batch {
    events: Vec<Result<Event, Infallible>>,
    last: bool,
}

fn events(follow: Follow) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(Some(follow), |state| async move {
        let mut f = state?;
        loop {
            if f.stop.as_ref().is_some_and(|s| *s.borrow()) {
                return None;
            }
            match f.poll().await {
                Ok(b) if b.events.is_empty() && !b.last => {
                    let live = f.pause().await;
                    if !live.is_empty() {
                        return Some((stream::iter(live), Some(f)));
                    }
                }
                Ok(b) => return Some((stream::iter(b.events), (!b.last).then_some(f))),
                // The run is gone, or the store is: say so, and end the stream.
                Err(e) => {
                    let body = ErrorBody::new("stream_ended", e).to_json();
                    let last = Event::default().event("error").data(body);
                    return Some((stream::iter(vec![Ok(last)]), None));
                }
            }
        }
    })
    .flatten()
}

impl Follow {
    /// Waits for the next poll, the server to stop, or live events (returned).
    async fn pause(&mut self) -> Vec<Result<Event, Infallible>> {
        let stop = async {
            match &mut self.stop {
                Some(stop) => {
                    let _ = tokio::time::timeout(POLL, stop.wait_for(|s| *s)).await;
                }
                None => tokio::time::sleep(POLL).await,
            }
        };
        let Some(live) = &mut self.live else {
            stop.await;
            return Vec::new();
        };
        let first = tokio::select! {
            _ = stop => return Vec::new(),
            got = live.recv() => got,
        };
        let mut events = Vec::new();
        match first {
            Ok(e) => events.push(live_event(&e)),
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => self.live = None,
        }
        events.extend(self.pending_live());
        events
    }

    /// The live events that came since the last look, without waiting.
    fn pending_live(&mut self) -> Vec<Result<Event, Infallible>> {
        let mut events = Vec::new();
        let Some(live) = &mut self.live else {
            return events;
        };
        loop {
            match live.try_recv() {
                Ok(e) => events.push(live_event(&e)),
                // Missed events are in the timeline, or were only a view of a step.
                Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(_) => return events,
            }
        }
    }

    /// The event id a client holds once it has what was sent so far.
    fn id(&self) -> String {
        self.after.map_or_else(String::new, |a| a.to_string())
    }

    /// The events since the last poll (none when nothing changed).
    async fn poll(&mut self) -> Result<Batch, String> {
        let (run, entries) = self
            .service
            .requests()
            .timeline(&self.owner, &self.run_id, self.after, MAX_PAGE)
            .await
            .map_err(|e| e.to_string())?;
        // A full page may have more entries behind it: the run's state waits for them.
        let caught_up = entries.len() < MAX_PAGE;
        // What the steps showed live came before what they committed.
        let mut events = self.pending_live();
        // The cursor moves past each entry while none at or before it may still change;
        // each event carries the cursor as it stands once that event is in.
        let mut settled = true;
        for e in &entries {
            settled &= !may_change(e);
            let json = serde_json::to_string(e).map_err(|e| e.to_string())?;
            let new = self.sent.get(&e.seq) != Some(&json);
            if settled {
                self.after = Some(e.seq);
                self.sent.remove(&e.seq);
            } else if new {
                self.sent.insert(e.seq, json.clone());
            }
            if new {
                events.push(Ok(Event::default().event("entry").id(self.id()).data(json)));
            }
        }
        if caught_up && self.version != Some(run.version) {
            self.version = Some(run.version);
            events.push(Ok(Event::default()
                .event("run")
                .id(self.id())
                .data(run_event(&run).to_string())));
        }
        let at_rest = run.status.is_terminal() || run.status == RunStatus::Waiting;
        Ok(Batch {
            events,
            last: caught_up && at_rest && !self.keep_open,
        })
    }
}

/// A live event, named by its type.
fn live_event(e: &LiveEvent) -> Result<Event, Infallible> {
    let data = serde_json::to_value(e).unwrap_or_default();
    let name = data["type"].as_str().unwrap_or("live").to_owned();
    Ok(Event::default().event(name).data(data.to_string()))
}

/// A `run` event's data.
fn run_event(run: &Run) -> serde_json::Value {
    let mut v = json!({
        "runId": run.run_id, "status": run.status, "state": run.outcome.state,
        "stateDetail": run.outcome.state_detail,
        "version": run.version, "usage": run.spend.usage, "costUsd": run.spend.cost_usd,
        "total": run.total(),
    });
    if let Some(e) = &run.outcome.error {
        v["error"] = json!(e);
    }
    if let Some(r) = &run.outcome.result {
        v["result"] = json!(r);
    }
    v
}

/// Whether an entry may still change: a tool result not yet in.
fn may_change(e: &Entry) -> bool {
    matches!(&e.body, EntryBody::Tool(t) if t.result.is_pending())
}
