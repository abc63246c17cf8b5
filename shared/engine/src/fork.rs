//! Forking a run: a new run whose history is another's up to one of its entries, taken as
//! it was recorded (no model or tool call before that entry runs again), which goes on
//! from there, the entry replaced if the caller says how.
//!
//! A fork starts at a `user` turn (its text replaced, or the same again), at an `assistant`
//! reply (thought again), or at a question (a `tool` entry with a CTA) with an answer (a
//! different one, or the one given). Plain data here: the service reads the original and
//! writes the fork (`service/fork.rs`).

use chrono::{DateTime, Utc};

use crate::cta::{CtaResponse, CtaStatus};
use crate::message::Input;
use crate::run::{NewRun, Run, RunStatus};
use crate::timeline::{Entry, EntryBody, Operation, ToolEntry, ToolResult};

pub use crate::run::ForkedFrom;

/// What takes the forked entry's place.
#[derive(Debug, Clone, PartialEq)]
pub enum Replacement {
    /// A `user` turn's new text.
    Text(String),
    /// A question's answer.
    Response(CtaResponse),
}

/// Why a fork was refused: a well-formed request does not fit the run's entries (`Mismatch`:
/// no such entry, an entry a fork cannot start at, a replacement of the wrong kind or an
/// answer that does not fit the question), or the run's history at that entry cannot be
/// taken along (`Conflict`). Both depend on the run as it is: 409s, as a CTA's answer that
/// does not fit it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    Mismatch(String),
    Conflict(String),
}

/// The fork, ready to be created: its run item, its history and its first message.
#[derive(Debug, Clone)]
pub struct Fork {
    pub run: Run,
    pub entries: Vec<Entry>,
    pub first: Input,
}

/// Builds the fork of `original` at `at_seq`. `timeline` holds the original's entries from
/// 0 at least to the end of the batch `at_seq` is in.
pub fn fork(
    original: &Run,
    timeline: &[Entry],
    at_seq: u64,
    replacement: Option<Replacement>,
    run_id: String,
    now: DateTime<Utc>,
) -> Result<Fork, Refused> {
    if original.origin.parent.is_some() {
        return Err(Refused::Conflict(format!(
            "run `{}` is a subagent: fork its top-level run `{}` instead",
            original.run_id,
            original.root()
        )));
    }
    let Some(at) = timeline.iter().position(|e| e.seq == at_seq) else {
        return Err(Refused::Mismatch(format!(
            "`atSeq` {at_seq} names no entry of run `{}` (it has {})",
            original.run_id, original.next_seq
        )));
    };
    if let Some(t) = timeline[..at]
        .iter()
        .filter_map(Entry::tool)
        .find(|t| t.result.is_pending())
    {
        return Err(Refused::Conflict(format!(
            "call `{}` ({}) before entry {at_seq} still waits: a fork takes only a settled history",
            t.id, t.name
        )));
    }
    let mut entries = timeline[..at].to_vec();
    let mut run = Run::new(NewRun {
        run_id,
        agent: original.agent.clone(),
        owner: original.owner.clone(),
        parent: None,
        depth: 0,
        on_expiry: original.origin.on_expiry,
        sandbox_id: original.origin.sandbox_id.clone(),
        metadata: original.origin.metadata.clone(),
        context: original.origin.context.clone(),
        root_run_id: None,
        now,
    });
    run.origin.github = original.origin.github.clone();
    // A fork is a tree of its own: the same budget, nothing of it spent yet.
    run.origin.budget = original.origin.budget;
    run.origin.forked_from = Some(ForkedFrom {
        run_id: original.run_id.clone(),
        at_seq,
    });
    let first = match (&timeline[at].body, replacement) {
        (EntryBody::User { text, options, .. }, r) => {
            let text = match r {
                None => text.clone(),
                Some(Replacement::Text(t)) if t.trim().is_empty() => {
                    return Err(Refused::Mismatch(
                        "`replacement.text` must not be empty".into(),
                    ));
                }
                Some(Replacement::Text(t)) => t,
                Some(Replacement::Response(_)) => {
                    return Err(Refused::Mismatch(format!(
                        "entry {at_seq} is a user turn: its replacement is `{{\"text\": ...}}`"
                    )));
                }
            };
            entries.push(Entry {
                seq: at_seq,
                at: now,
                body: EntryBody::User {
                    text,
                    message_id: None,
                    options: options.clone(),
                },
            });
            Input::Start
        }
        (EntryBody::Assistant { .. }, None) => Input::Start,
        (EntryBody::Assistant { .. }, Some(_)) => {
            return Err(Refused::Mismatch(format!(
                "entry {at_seq} is a reply: a fork there thinks it again, with no replacement"
            )));
        }
        (EntryBody::Tool(t), _) if t.cta.is_some() && t.plan.is_some() => {
            return Err(Refused::Conflict(format!(
                "entry {at_seq} is a plan's approval: a fork cannot start there (fork at the \
                 reply that made the plan, or at the user turn before it)"
            )));
        }
        (EntryBody::Tool(t), r) if t.cta.is_some() => {
            let response = answer(t, at_seq, r)?;
            let cta_id = crate::engine::derive_id("cta", &run.run_id, at_seq);
            let mut asked = t.clone();
            asked.result = ToolResult::Pending {
                reason: "waiting for a human".into(),
            };
            asked.duration_ms = None;
            if let Some(snap) = &mut asked.cta {
                snap.cta_id = cta_id.clone();
                snap.status = CtaStatus::Pending;
                snap.response = None;
                snap.responder = None;
                snap.expires_at = now + chrono::Duration::days(30);
            }
            entries.push(Entry {
                seq: at_seq,
                at: now,
                body: EntryBody::Tool(asked),
            });
            // The reply's later calls run again once the answer is in, as calls deferred
            // behind an approval do.
            for later in timeline[at + 1..].iter().filter_map(Entry::tool) {
                if later.reply_seq != t.reply_seq {
                    continue;
                }
                // A later call that waited for its own approval runs again like the others:
                // it is asked about again if its approval policy wants it when it runs.
                let asked = later.cta.as_ref().is_some_and(|c| !c.gate);
                if asked || later.child_run_id.is_some() || later.plan.is_some() {
                    return Err(Refused::Conflict(format!(
                        "the same reply's later call `{}` ({}) waits on a person, a subagent or \
                         a plan: a fork at entry {at_seq} cannot take it along",
                        later.id, later.name
                    )));
                }
                let seq = entries.len() as u64;
                entries.push(Entry {
                    seq,
                    at: now,
                    body: EntryBody::Tool(ToolEntry {
                        result: ToolResult::Pending {
                            reason: crate::engine::DEFERRED.into(),
                        },
                        duration_ms: None,
                        cta: None,
                        // Not started by the fork: it runs there as a call of its own.
                        started: 0,
                        ..later.clone()
                    }),
                });
            }
            run.status = RunStatus::Waiting;
            run.clock.working_since = None;
            run.clock.waiting_since = Some(now);
            run.outcome.state = Some("waiting_on_user".into());
            run.outcome.state_detail = Some(serde_json::json!({ "ctaIds": [cta_id] }));
            Input::CtaAnswered {
                cta_id,
                response,
                responder: Some(original.owner.clone()),
            }
        }
        (body, _) => {
            return Err(Refused::Mismatch(format!(
                "entry {at_seq} is {}: a fork starts at a `user` turn, an `assistant` reply \
                 (thought again) or a question (a `tool` entry with a `cta`, answered anew)",
                describe(body)
            )));
        }
    };
    // The run's counters, as they stood at the fork point.
    let turn = entries
        .iter()
        .rposition(|e| matches!(e.body, EntryBody::User { .. }))
        .unwrap_or(0);
    if let Some(EntryBody::User { text, options, .. }) = entries.get(turn).map(|e| &e.body) {
        run.set_prompt(text);
        run.origin.tier = options.tier;
    }
    let think = |e: &&Entry| {
        matches!(
            e.body,
            EntryBody::Assistant {
                operation: Operation::Think,
                ..
            }
        )
    };
    run.counters.thinks = entries.iter().filter(think).count() as u32;
    run.counters.turn_thinks = entries[turn..].iter().filter(think).count() as u32;
    run.counters.turn_tool_calls = entries[turn..]
        .iter()
        .filter(|e| e.tool().is_some())
        .count() as u32;
    run.batch_start = entries
        .iter()
        .rposition(|e| matches!(e.body, EntryBody::Assistant { .. }))
        .map_or(0, |i| i as u64 + 1);
    run.next_seq = entries.len() as u64;
    // Follow-ups that waited at the fork point (a `queued` entry whose turn had not begun
    // by then) wait in the fork too: each gets its turn when the one before it ends.
    let begun: std::collections::HashSet<&str> = timeline[..=at]
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::User {
                message_id: Some(m),
                ..
            } => Some(m.as_str()),
            _ => None,
        })
        .collect();
    run.waits.queued = entries
        .iter()
        .filter(|e| {
            matches!(&e.body, EntryBody::Queued { message_id, .. } if !begun.contains(message_id.as_str()))
        })
        .map(|e| e.seq)
        .collect();
    Ok(Fork {
        run,
        entries,
        first,
    })
}

/// The answer a fork at the question `t` gives: the replacement, else the original's.
fn answer(t: &ToolEntry, at_seq: u64, r: Option<Replacement>) -> Result<CtaResponse, Refused> {
    let Some(snap) = &t.cta else {
        return Err(Refused::Mismatch(format!(
            "entry {at_seq} asks no question"
        )));
    };
    let response = match r {
        Some(Replacement::Response(r)) => r,
        Some(Replacement::Text(_)) => {
            return Err(Refused::Mismatch(format!(
                "entry {at_seq} is a question: its replacement is `{{\"response\": ...}}`, an \
                 answer to it"
            )));
        }
        None => match (&snap.status, &snap.response) {
            (CtaStatus::Answered, Some(r)) => r.clone(),
            _ => {
                return Err(Refused::Mismatch(format!(
                    "question {at_seq} was not answered: give the fork's answer as \
                     `replacement.response`"
                )));
            }
        },
    };
    response
        .validate_against(&snap.request)
        .map_err(|e| Refused::Mismatch(format!("`replacement.response`: {e}")))?;
    response
        .check_raise(snap.budget.is_some())
        .map_err(|e| Refused::Mismatch(format!("`replacement.response`: {e}")))?;
    Ok(response)
}

fn describe(body: &EntryBody) -> String {
    match body {
        EntryBody::Tool(t) if t.plan.is_some() => format!("the plan `{}`", t.id),
        EntryBody::Tool(t) => format!("the result of `{}` (a tool call)", t.name),
        EntryBody::Queued { .. } => "a queued follow-up (fork at the turn it started)".into(),
        EntryBody::Notice { .. } => "a notice".into(),
        EntryBody::Error { .. } => "an error".into(),
        EntryBody::Widget { .. } => "a widget".into(),
        EntryBody::File(_) => "a file".into(),
        EntryBody::Usage { .. } => "a turn's usage".into(),
        EntryBody::User { .. } | EntryBody::Assistant { .. } => "forkable".into(),
    }
}
