//! Watching a run live. On a host whose steps run in its own process (`baton dev`, `baton
//! dev --aws`), the [`Hub`]: a broadcast per watched run, from the steps to the run's open
//! streams (`GET /runs/{id}/stream`); a run no stream watches has no channel, and its steps
//! do not stream their model calls. Where the channel is outside the process (on AWS, an
//! AppSync Events API), `POST /runs/{id}/watch` grants a watch of it ([`Watchers`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use baton_core::live::grant::{Watch, Watchers};
use baton_core::live::{Live, LiveEvent};
use schemars::JsonSchema;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::{ApiError, AppState, Caller};

/// How many live events a watcher may fall behind before it misses some (it catches up
/// from the timeline, which is the record).
const BACKLOG: usize = 1024;

/// The runs' live events, for the streams that watch them.
#[derive(Default)]
pub struct Hub {
    runs: Mutex<HashMap<String, broadcast::Sender<Arc<LiveEvent>>>>,
    /// Runs someone said they will watch, until when (unix ms): watched before their
    /// stream opens ([`Live::expect`]).
    expected: Mutex<HashMap<String, i64>>,
}

impl Hub {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The live events of `run_id` from now on.
    pub fn subscribe(&self, run_id: &str) -> broadcast::Receiver<Arc<LiveEvent>> {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        // Channels no stream holds any more go (their streams ended).
        runs.retain(|_, tx| tx.receiver_count() > 0);
        runs.entry(run_id.to_owned())
            .or_insert_with(|| broadcast::channel(BACKLOG).0)
            .subscribe()
    }
}

impl Live for Hub {
    fn watched(&self, run: &baton_core::run::Run) -> bool {
        let streamed = {
            let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
            runs.get(&run.run_id)
                .is_some_and(|tx| tx.receiver_count() > 0)
        };
        let now = chrono::Utc::now().timestamp_millis();
        let mut expected = self.expected.lock().unwrap_or_else(|e| e.into_inner());
        expected.retain(|_, until| *until > now);
        streamed || expected.contains_key(&run.run_id)
    }

    fn expect(&self, run_id: &str, until: chrono::DateTime<chrono::Utc>) {
        let mut expected = self.expected.lock().unwrap_or_else(|e| e.into_inner());
        expected.insert(run_id.to_owned(), until.timestamp_millis());
    }

    fn publish(&self, event: LiveEvent) {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = runs.get(&event.run_id) {
            // No receiver left: nobody to tell.
            let _ = tx.send(Arc::new(event));
        }
    }
}

/// `POST /runs/{runId}/watch`: how to watch the run live on this host.
#[derive(Serialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum WatchBody {
    /// A channel outside the process, with a grant to it.
    Channel(Watch),
    /// This host's own event stream.
    Stream(StreamWatch),
}

/// The event stream of a host that keeps connections open: `{"transport": "sse", "url"}`.
#[derive(Serialize, JsonSchema)]
pub(crate) struct StreamWatch {
    transport: String,
    url: String,
}

/// `POST /runs/{runId}/watch`: a grant to the run's channel where it is outside the process
/// (the run is leased to its watchers until the grant ends), else this host's stream, else
/// 501.
pub(crate) async fn watch_run(
    State(s): State<AppState>,
    Extension(Caller { id: owner, .. }): Extension<Caller>,
    crate::Id(run_id): crate::Id,
) -> Result<Json<WatchBody>, ApiError> {
    // Unknown or someone else's run: a 404, and no lease.
    s.service
        .requests()
        .timeline(&owner, &run_id, Some(u64::MAX), 1)
        .await?;
    if let Some(watchers) = &s.watchers {
        let watch = watchers.grant(&run_id, chrono::Utc::now()).await?;
        return Ok(Json(WatchBody::Channel(watch)));
    }
    if s.streams {
        return Ok(Json(WatchBody::Stream(StreamWatch {
            transport: "sse".into(),
            url: format!("/runs/{run_id}/stream?follow=true"),
        })));
    }
    Err(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "not_streamed",
        "this host has no live channel: poll GET /runs/{id}/timeline?after=<cursor> instead",
    ))
}

/// The host's grants of watches, where its channel is outside the process.
pub type SharedWatchers = Arc<dyn Watchers>;
