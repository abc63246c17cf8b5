//! The live view of a run: what a step does before it commits — the model's reply as it
//! streams, a tool call as it starts and ends — for whoever watches the run.
//!
//! Live events are never state. The committed timeline stays the record: a watcher that
//! comes late, or misses events, catches up from it, and an event's text that no committed
//! entry confirms (a step that crashed mid-stream, a model call tried again) is to be
//! dropped. Publishing is best effort: it never blocks a step and never fails one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::Serialize;
use serde_json::Value;

use crate::llm::Deltas;

/// One live event of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveEvent {
    pub run_id: String,
    /// The seq the step's next entry takes: a reply's deltas become the `assistant` entry
    /// at this seq (or after it) once the step commits.
    pub seq: u64,
    /// Which attempt at the model call the deltas belong to: a call tried again (a provider
    /// error, a step redelivered after a crash) streams anew under another attempt, and a
    /// watcher drops the text it held for the old one.
    pub attempt: String,
    #[serde(flatten)]
    pub kind: LiveKind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LiveKind {
    /// Text of the model's reply, as it arrives.
    Delta { text: String },
    /// A tool call as the model writes it: its id and name when they come, then pieces of
    /// its arguments (JSON text, whole only at the end).
    #[serde(rename_all = "camelCase")]
    ToolCallDelta {
        index: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        arguments: String,
    },
    /// A tool call about to run (its input, cut to a preview).
    #[serde(rename_all = "camelCase")]
    ToolStarted {
        call_id: String,
        tool: String,
        input_preview: String,
    },
    /// A tool call that ran, how long it took, and whether it failed.
    #[serde(rename_all = "camelCase")]
    ToolFinished {
        call_id: String,
        tool: String,
        duration_ms: u64,
        ok: bool,
    },
    /// What the step is doing: `thinking` (`{model, iteration}`), `executing_tools`
    /// (`{tools}`). (What a run waits on once a step commits is its `state` and
    /// `stateDetail`.)
    State { state: String, detail: Value },
    /// What a step committed, on a channel that carries it ([`Live::carries_committed`]):
    /// the entries it appended and resolved, in seq order, and the run's status and state
    /// after it. `from`: the first seq it appended (the run's next seq, if none), so a
    /// watcher whose entries stop short of it missed a commit (one no step published) and
    /// reads the timeline after its cursor. `truncated`: the entries were too large for one
    /// event and are left out; a watcher reads the timeline after its cursor instead.
    #[serde(rename_all = "camelCase")]
    Committed {
        from: u64,
        entries: Vec<crate::timeline::Entry>,
        version: u64,
        status: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        state: Option<String>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
    },
}

/// The most a `committed` event's entries take, as JSON: AppSync Events takes events of up
/// to 240 KB.
pub const COMMITTED_BYTES: usize = 64 * 1024;

/// The `committed` event of a step of `run` that committed `t`.
pub fn committed(t: &crate::message::Transition) -> LiveEvent {
    let mut entries: Vec<crate::timeline::Entry> =
        t.updated.iter().chain(&t.appended).cloned().collect();
    entries.sort_by_key(|e| e.seq);
    let size = serde_json::to_string(&entries).map_or(usize::MAX, |s| s.len());
    let truncated = size > COMMITTED_BYTES;
    if truncated {
        entries.clear();
    }
    LiveEvent {
        run_id: t.run.run_id.clone(),
        seq: t.run.next_seq,
        attempt: format!("commit.{}", t.run.version),
        kind: LiveKind::Committed {
            from: t.run.next_seq.saturating_sub(t.appended.len() as u64),
            entries,
            version: t.run.version,
            status: t.run.status.as_str().to_owned(),
            state: t.run.outcome.state.clone(),
            truncated,
        },
    }
}

/// Where live events go: the host's channel to its watchers.
pub trait Live: Send + Sync {
    /// Whether anyone may be watching `run` (a channel that cannot know answers true). A
    /// model's reply is streamed only for a watched run, so a run nobody watches pays
    /// nothing for this.
    fn watched(&self, run: &crate::run::Run) -> bool;

    /// Someone said they will watch `run_id` (`POST /runs` or a follow-up with `watch`):
    /// until `until`, count it watched even before their stream opens, so that a reply
    /// written meanwhile streams (they get what is written once they are there). A channel
    /// whose watchers lease runs in the store (AWS) needs nothing here.
    fn expect(&self, _run_id: &str, _until: chrono::DateTime<chrono::Utc>) {}

    /// Hands an event over. Never blocks and never fails: a channel that cannot keep up
    /// drops events (the timeline is the record).
    fn publish(&self, event: LiveEvent);

    /// Whether a watched run's steps also publish what they committed ([`committed`]): a
    /// channel whose watchers cannot stream the timeline from the host (AWS, where API
    /// Gateway does not stream) takes them, so they need not poll. By default, no.
    fn carries_committed(&self) -> bool {
        false
    }
}

pub mod grant;

/// The most of a tool call's input a `tool_started` event carries.
pub const INPUT_PREVIEW_BYTES: usize = 512;

/// The live view of one step of one run: stamps events with the run, the seq and the
/// model call's attempt.
pub(crate) struct StepLive {
    pub live: Arc<dyn Live>,
    pub run_id: String,
    pub seq: u64,
    /// This step's own id, unique to the process: attempts are `<step>.<n>`.
    pub step: String,
    pub attempts: AtomicU32,
    started: std::time::Instant,
    first: std::sync::OnceLock<u64>,
}

impl StepLive {
    pub(crate) fn new(live: Arc<dyn Live>, run_id: &str, seq: u64) -> Self {
        Self {
            live,
            run_id: run_id.to_owned(),
            seq,
            step: uuid::Uuid::new_v4().simple().to_string(),
            attempts: AtomicU32::new(0),
            started: std::time::Instant::now(),
            first: std::sync::OnceLock::new(),
        }
    }

    /// Milliseconds from this view's start to the reply's first streamed piece, if one came.
    pub(crate) fn first_piece_ms(&self) -> Option<u64> {
        self.first.get().copied()
    }

    fn piece_came(&self) {
        self.first.get_or_init(|| millis(self.started.elapsed()));
    }

    pub(crate) fn publish(&self, kind: LiveKind) {
        let n = self.attempts.load(Ordering::Relaxed);
        self.live.publish(LiveEvent {
            run_id: self.run_id.clone(),
            seq: self.seq,
            attempt: format!("{}.{n}", self.step),
            kind,
        });
    }
}

impl Deltas for StepLive {
    fn start(&self) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
    }

    fn text(&self, piece: &str) {
        if !piece.is_empty() {
            self.piece_came();
            self.publish(LiveKind::Delta {
                text: piece.to_owned(),
            });
        }
    }

    fn tool_call(&self, index: u32, id: Option<&str>, name: Option<&str>, arguments: &str) {
        self.piece_came();
        self.publish(LiveKind::ToolCallDelta {
            index,
            id: id.map(str::to_owned),
            name: name.map(str::to_owned),
            arguments: arguments.to_owned(),
        });
    }
}

/// A duration in whole milliseconds.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The input's JSON, cut at a character boundary to [`INPUT_PREVIEW_BYTES`].
pub(crate) fn preview(input: &Value) -> String {
    let mut s = input.to_string();
    if s.len() > INPUT_PREVIEW_BYTES {
        let mut cut = INPUT_PREVIEW_BYTES;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}
