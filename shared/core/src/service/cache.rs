//! Timelines of recently stepped runs, kept by a warm worker so that a step re-reads only
//! the run item, not the whole history. Bounded by bytes, not by runs: a Lambda container
//! has a fixed memory size, and one long timeline can outweigh a thousand short ones. The
//! least recently used timelines go first. The store stays the truth: a cached timeline is
//! used only at the version it was cached at.

use std::collections::HashMap;

use serde_json::Value;

use crate::engine;
use crate::run::{Run, RunStatus};
use crate::timeline::{Entry, EntryBody, ToolResult};

/// What a step holds of a run's timeline: its entries from seq `base` on and, when `base`
/// is past it and a model is given it, the run's first entry (`head`); `bytes` is about the
/// memory `entries` take ([`approx_bytes`]). The store's window read, the history a think
/// reads back and what the cache keeps are each one of these.
#[derive(Debug, Clone, Default)]
pub(super) struct Window {
    pub base: u64,
    pub entries: Vec<Entry>,
    pub head: Option<Entry>,
    pub bytes: usize,
}

impl Window {
    pub(super) fn new(base: u64, entries: Vec<Entry>, head: Option<Entry>) -> Self {
        let bytes = approx_bytes(&entries);
        Self {
            base,
            entries,
            head,
            bytes,
        }
    }
}

struct Slot {
    version: u64,
    window: Window,
    /// The window's bytes and its `head`'s.
    bytes: usize,
    used: u64,
}

pub(super) struct TimelineCache {
    runs: HashMap<String, Slot>,
    bytes: usize,
    budget: usize,
    tick: u64,
}

impl TimelineCache {
    pub(super) fn budget(&self) -> usize {
        self.budget
    }

    pub(super) fn new(budget: usize) -> Self {
        Self {
            runs: HashMap::new(),
            bytes: 0,
            budget,
            tick: 0,
        }
    }

    /// Takes a run's timeline out, with the run's version it is at.
    pub(super) fn take(&mut self, run_id: &str) -> Option<(u64, Window)> {
        let slot = self.runs.remove(run_id)?;
        self.bytes -= slot.bytes;
        Some((slot.version, slot.window))
    }

    /// Keeps a timeline, evicting the least recently used ones to stay within the budget.
    /// A timeline larger than the whole budget is not kept.
    pub(super) fn put(&mut self, run_id: &str, version: u64, window: Window) {
        // The slot counts its first entry too; `Window::bytes` is the entries' alone.
        let bytes = window.bytes
            + window
                .head
                .as_ref()
                .map_or(0, |h| approx_bytes(std::slice::from_ref(h)));
        if let Some(old) = self.runs.remove(run_id) {
            self.bytes -= old.bytes;
        }
        if bytes > self.budget {
            return;
        }
        while self.bytes + bytes > self.budget {
            let Some(lru) = self
                .runs
                .iter()
                .min_by_key(|(_, s)| s.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(s) = self.runs.remove(&lru) {
                self.bytes -= s.bytes;
            }
        }
        self.tick += 1;
        self.bytes += bytes;
        self.runs.insert(
            run_id.to_owned(),
            Slot {
                version,
                window,
                bytes,
                used: self.tick,
            },
        );
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// About how much memory entries take: their texts and JSON values, plus a fixed overhead.
/// Cheap (no allocation), so it can be counted for each step's new entries.
pub(super) fn approx_bytes(entries: &[Entry]) -> usize {
    fn value(v: &Value) -> usize {
        match v {
            Value::String(s) => s.len() + 24,
            Value::Array(a) => a.iter().map(value).sum::<usize>() + 24,
            Value::Object(o) => o
                .iter()
                .map(|(k, v)| k.len() + value(v) + 48)
                .sum::<usize>(),
            _ => 16,
        }
    }
    entries
        .iter()
        .map(|e| {
            128 + match &e.body {
                EntryBody::User { text, .. } | EntryBody::Queued { text, .. } => text.len(),
                EntryBody::Assistant { text, .. } => text.as_ref().map_or(0, String::len),
                EntryBody::Widget { data, .. } => data.to_string().len(),
                EntryBody::File(f) => f.name.len() + f.summary.len() + f.media_type.len(),
                EntryBody::Notice { message, .. } | EntryBody::Error { message, .. } => {
                    message.len()
                }
                EntryBody::Usage { .. } => 64,
                EntryBody::Tool(t) => {
                    t.name.len()
                        + value(&t.input)
                        + match &t.result {
                            ToolResult::Success { output } => value(output),
                            ToolResult::Error { error } => error.len(),
                            ToolResult::Pending { reason } => reason.len(),
                        }
                        + 256
                }
            }
        })
        .sum()
}

/// What a warm worker keeps of a run after a commit.
impl super::Steps {
    /// What of `window` (after a commit of `run`) the run's next step reads: the loop's next
    /// window and, for a model that reads history, as much before it as its budget holds.
    pub(super) fn kept(&self, run: &Run, mut window: Window) -> Window {
        let from = self.keep_from(run, window.base, &window.entries);
        if from > window.base {
            let drop = ((from - window.base) as usize).min(window.entries.len());
            if window.base == 0 && self.shared.deps.llm.reads_history() {
                window.head = window.entries.first().cloned();
            }
            window.entries.drain(..drop);
            window = Window::new(from, window.entries, window.head);
        }
        window
    }

    pub(super) fn cache_put(&self, run_id: &str, version: u64, window: Window) {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(run_id, version, window);
    }

    /// The first seq of `timeline` (from `base` on) the run's next step needs: the loop's
    /// next window, and for a model that reads history, the newest stretch before it that
    /// is over the agent's context budget (what the step's think would read back to).
    fn keep_from(&self, run: &crate::run::Run, base: u64, timeline: &[Entry]) -> u64 {
        let window = engine::window_start(run, &LOOP);
        if !self.shared.deps.llm.reads_history() {
            return window;
        }
        let budget = self
            .shared
            .catalog
            .agent(&run.agent)
            .map_or(self.shared.catalog.limits.context_bytes, |a| {
                a.context_bytes
            });
        let (mut bytes, mut grouped) = (0usize, false);
        for e in timeline.iter().rev() {
            bytes += crate::llm::model_bytes(e);
            grouped |= crate::llm::starts_group(e);
            if bytes > budget && grouped {
                return e.seq.min(window);
            }
        }
        base
    }
}

/// Whether `run`'s next step waits on a person: a question (`waiting_on_user`), or a
/// follow-up to a run that ended.
pub(super) fn at_a_persons_pace(run: &Run) -> bool {
    run.status.is_terminal()
        || (run.status == RunStatus::Waiting
            && run.outcome.state.as_deref() == Some("waiting_on_user"))
}

/// The loop's input, for the window the next step of the loop reads.
const LOOP: crate::message::Input = crate::message::Input::Continue { version: 0 };

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline(text_bytes: usize) -> Vec<Entry> {
        vec![Entry {
            seq: 0,
            at: chrono::DateTime::from_timestamp(0, 0).unwrap_or_default(),
            body: EntryBody::user("x".repeat(text_bytes)),
        }]
    }

    #[test]
    fn the_budget_is_bytes_and_the_least_recently_used_go_first() {
        let mut c = TimelineCache::new(10_000);
        let window = |size| Window::new(0, timeline(size), None);
        for (run, size) in [("a", 3_000), ("b", 3_000), ("c", 3_000)] {
            c.put(run, 1, window(size));
        }
        assert!(c.bytes() <= 10_000);
        // Touch `a` (take and put back, as a step does): `b` is now the oldest.
        let (version, a) = c.take("a").expect("cached");
        c.put("a", version + 1, a);
        c.put("d", 1, window(3_000));
        assert!(c.take("b").is_none(), "the least recently used was evicted");
        assert_eq!(c.take("a").map(|(v, _)| v), Some(2));
        assert!(c.take("c").is_some() && c.take("d").is_some());
        assert_eq!(c.bytes(), 0, "taking everything out leaves nothing counted");
        // One timeline over the whole budget is not kept, and evicts nothing.
        c.put("small", 1, window(1_000));
        c.put("huge", 1, window(20_000));
        assert!(c.take("huge").is_none());
        assert!(c.take("small").is_some());
    }

    #[test]
    fn sizes_grow_with_the_text() {
        assert!(approx_bytes(&timeline(100_000)) > 100_000);
        assert!(approx_bytes(&timeline(10)) < 1_000);
    }
}
