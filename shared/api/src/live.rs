//! The live channel of a host whose steps run in its own process (`baton dev`, `baton dev
//! --aws`): a broadcast per watched run, from the steps to the run's open streams
//! (`GET /runs/{id}/stream`). A run no stream watches has no channel, and its steps do not
//! stream their model calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use baton_core::live::{Live, LiveEvent};
use tokio::sync::broadcast;

/// How many live events a watcher may fall behind before it misses some (it catches up
/// from the timeline, which is the record).
const BACKLOG: usize = 1024;

/// The runs' live events, for the streams that watch them.
#[derive(Default)]
pub struct Hub {
    runs: Mutex<HashMap<String, broadcast::Sender<Arc<LiveEvent>>>>,
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
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.get(&run.run_id).is_some_and(|tx| tx.receiver_count() > 0)
    }

    fn publish(&self, event: LiveEvent) {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = runs.get(&event.run_id) {
            // No receiver left: nobody to tell.
            let _ = tx.send(Arc::new(event));
        }
    }
}
