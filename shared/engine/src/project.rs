//! How a timeline is projected into the chat a model sees, and how much of it fits a
//! context budget.

use std::borrow::Cow;

use serde_json::Value;

use crate::llm::{ChatMessage, ToolCall};
use crate::timeline::{Entry, EntryBody, ToolResult};

/// About how many bytes of text an entry puts in the chat a model sees (its projection):
/// what a context budget counts. A pure function of the entry, so that a step that read
/// part of a history and one that read all of it count the same.
pub fn model_bytes(entry: &Entry) -> usize {
    let json = |v: &Value| match v {
        Value::String(s) => s.len(),
        v => v.to_string().len(),
    };
    match &entry.body {
        EntryBody::User { text, .. } => text.len(),
        EntryBody::Assistant { text, .. } => text.as_ref().map_or(0, String::len),
        // A budget question is the owner's, not the model's.
        EntryBody::Tool(t) if t.name == crate::budget::ENTRY => 0,
        EntryBody::Tool(t) => {
            t.id.len()
                + t.name.len()
                + json(&t.input)
                + match &t.result {
                    ToolResult::Success { output } => json(output),
                    ToolResult::Error { error } => error.len() + 12,
                    ToolResult::Pending { .. } => 0,
                }
        }
        EntryBody::File(f) => f.name.len() + f.media_type.len() + f.summary.len() + 32,
        EntryBody::Notice { .. }
        | EntryBody::Error { .. }
        | EntryBody::Queued { .. }
        | EntryBody::Widget { .. }
        | EntryBody::Usage { .. } => 0,
    }
}

/// Whether an entry starts a group of the chat: a user message, or a reply with the tool
/// calls, results and files that follow it. A history is cut only where a group starts.
pub fn starts_group(entry: &Entry) -> bool {
    matches!(
        entry.body,
        EntryBody::User { .. } | EntryBody::Assistant { .. }
    )
}

/// What a model that reads history is given of a run's timeline, within `budget` bytes of
/// text ([`model_bytes`]): the run's first message, the newest group (the turn or batch
/// under way) whatever its size, and the groups before it, newest first, while they fit.
/// Where groups are left out, the first message says so (a note appended to its text).
///
/// `span` is a contiguous stretch of the timeline up to its end; `head` the run's first
/// entry when `span` starts after it. An older part of `span` that does not start a group
/// (a read that began inside one) is never given: the whole group would not fit either, as
/// long as the caller read until what it holds is over the budget and holds a group
/// start. So the result is the same for any such read as for the whole timeline, and a
/// step reads about `budget` bytes of a run's history, whatever the run's length.
pub fn fit<'a>(head: Option<&Entry>, span: &'a [Entry], budget: usize) -> Cow<'a, [Entry]> {
    let first_user = |e: &&Entry| e.seq == 0 && matches!(e.body, EntryBody::User { .. });
    // A head beside a span that holds it already is the same entry: taken from the span.
    let beside = |_: &&Entry| span.first().is_none_or(|e| e.seq > 0);
    let (head, rest, apart) = match head.filter(first_user).filter(beside) {
        Some(h) => (Some(h), span, true),
        None => match span.first().filter(first_user) {
            Some(h) => (Some(h), &span[1..], false),
            None => (None, span, false),
        },
    };
    let Some(first) = rest.first() else {
        return if apart {
            join(head, rest, 0, budget)
        } else {
            Cow::Borrowed(span)
        };
    };
    // Whether `rest` begins where the history does (or right after its first message).
    let from_start = first.seq == head.map_or(0, |h| h.seq + 1);
    let starts: Vec<usize> = (0..rest.len())
        .filter(|&i| starts_group(&rest[i]))
        .collect();
    let bytes = |from: usize, to: usize| rest[from..to].iter().map(model_bytes).sum::<usize>();
    // The newest group is always given; then older ones while they fit.
    let mut keep = starts.last().copied().unwrap_or(0);
    let mut total = bytes(keep, rest.len());
    for n in (0..starts.len().saturating_sub(1)).rev() {
        let size = bytes(starts[n], starts[n + 1]);
        if total + size > budget {
            break;
        }
        total += size;
        keep = starts[n];
    }
    // What comes before the first group start (notices, say) is whole only when the
    // history was read from its start.
    if keep > 0 && keep == starts[0] && from_start && total + bytes(0, keep) <= budget {
        keep = 0;
    }
    let left_out = rest[keep].seq - head.map_or(0, |h| h.seq + 1);
    if left_out == 0 && !apart {
        return Cow::Borrowed(span);
    }
    join(head, &rest[keep..], left_out, budget)
}

/// The run's first message (with a note when `left_out` entries follow it unseen), then
/// `kept`.
fn join<'a>(
    head: Option<&Entry>,
    kept: &'a [Entry],
    left_out: u64,
    budget: usize,
) -> Cow<'a, [Entry]> {
    let Some(head) = head else {
        return Cow::Borrowed(kept);
    };
    let mut head = head.clone();
    if let (EntryBody::User { text, .. }, true) = (&mut head.body, left_out > 0) {
        text.push_str(&format!(
            "\n\n[Baton: the {left_out} timeline entries after this message and before the \
             next are left out here, to keep the conversation within this agent's context \
             budget of {budget} bytes.]"
        ));
    }
    Cow::Owned(std::iter::once(head).chain(kept.iter().cloned()).collect())
}

/// Projects the timeline to the chat messages a model sees.
///
/// Notices and errors are display-only. Tool calls are grouped under the reply that made
/// them, each followed by its result. A result still pending is never projected (the engine
/// does not think while one is pending).
pub fn project(system: &str, timeline: &[Entry]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(timeline.len() + 1);
    if !system.is_empty() {
        out.push(ChatMessage::System {
            content: system.to_owned(),
        });
    }
    let mut results: Vec<ChatMessage> = Vec::new();
    let flush = |out: &mut Vec<ChatMessage>, results: &mut Vec<ChatMessage>| out.append(results);
    for e in timeline {
        match &e.body {
            EntryBody::User { text, .. } => {
                flush(&mut out, &mut results);
                out.push(ChatMessage::User {
                    content: text.clone(),
                });
            }
            EntryBody::Assistant {
                text, reasoning, ..
            } => {
                flush(&mut out, &mut results);
                out.push(ChatMessage::Assistant {
                    content: text.clone(),
                    tool_calls: Vec::new(),
                    reasoning: reasoning.clone(),
                });
            }
            EntryBody::Tool(t) if t.name == crate::budget::ENTRY => {}
            EntryBody::Tool(t) => {
                if let Some(ChatMessage::Assistant { tool_calls, .. }) = out.last_mut() {
                    tool_calls.push(ToolCall {
                        id: t.id.clone(),
                        name: t.name.clone(),
                        arguments: match &t.input {
                            Value::String(raw) => raw.clone(),
                            v => v.to_string(),
                        },
                    });
                }
                let is_error = matches!(t.result, ToolResult::Error { .. });
                let content = match &t.result {
                    ToolResult::Success {
                        output: Value::String(s),
                    } => s.clone(),
                    ToolResult::Success { output } => output.to_string(),
                    ToolResult::Error { error } => {
                        serde_json::json!({ "error": error }).to_string()
                    }
                    ToolResult::Pending { .. } => continue,
                };
                results.push(ChatMessage::Tool {
                    tool_call_id: t.id.clone(),
                    content,
                    is_error,
                    images: Vec::new(),
                });
            }
            // A file's summary is what the model reads of it, with its call's result; an
            // image is named there too, for a model that sees (its bytes are the request's).
            EntryBody::File(f) => {
                let call = |m: &&mut ChatMessage| matches!(m, ChatMessage::Tool { tool_call_id, .. } if *tool_call_id == f.call_id);
                if let Some(ChatMessage::Tool {
                    content, images, ..
                }) = results.iter_mut().rev().find(call)
                {
                    content.push_str(&format!(
                        "\n[file `{}` ({}, {} bytes): {}]",
                        f.name, f.media_type, f.size, f.summary
                    ));
                    if crate::llm::is_image(&f.media_type) {
                        images.push(f.file_id.clone());
                    }
                }
            }
            EntryBody::Notice { .. }
            | EntryBody::Error { .. }
            | EntryBody::Queued { .. }
            | EntryBody::Widget { .. }
            | EntryBody::Usage { .. } => {}
        }
    }
    flush(&mut out, &mut results);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Entry;
    use crate::timeline::{EntryBody, ToolEntry, ToolResult, current_batch};
    use chrono::{DateTime, Utc};
    use serde_json::json;
    use std::borrow::Cow;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(0, 0).unwrap_or_default()
    }

    #[test]
    fn projection_groups_calls_under_their_reply_and_skips_notices() {
        let tool = |seq, id: &str, result| Entry {
            seq,
            at: at(),
            body: EntryBody::Tool(ToolEntry::new(id, "echo", json!({"text": id}), result, 1)),
        };
        let timeline = vec![
            Entry {
                seq: 0,
                at: at(),
                body: EntryBody::user("go"),
            },
            Entry {
                seq: 1,
                at: at(),
                body: EntryBody::reply(None),
            },
            tool(2, "a", ToolResult::Success { output: json!("a") }),
            tool(3, "b", ToolResult::error("boom")),
            Entry {
                seq: 4,
                at: at(),
                body: EntryBody::Notice {
                    code: "x".into(),
                    message: "y".into(),
                },
            },
            Entry {
                seq: 5,
                at: at(),
                body: EntryBody::reply(Some("done".into())),
            },
        ];
        let msgs = project("sys", &timeline);
        assert_eq!(msgs.len(), 6, "{msgs:?}");
        assert!(matches!(&msgs[0], ChatMessage::System { content } if content == "sys"));
        match &msgs[2] {
            ChatMessage::Assistant { tool_calls, .. } => {
                assert_eq!(tool_calls.len(), 2);
                assert_eq!(tool_calls[1].arguments, r#"{"text":"b"}"#);
            }
            m => panic!("expected assistant, got {m:?}"),
        }
        assert!(matches!(&msgs[4], ChatMessage::Tool { content, .. } if content.contains("boom")));
        assert!(matches!(&msgs[5], ChatMessage::Assistant { content: Some(t), .. } if t == "done"));
        assert_eq!(current_batch(&timeline).len(), 0);
        assert_eq!(current_batch(&timeline[..5]).len(), 3);
    }

    /// A run of `turns` tool rounds: the prompt, then per round a reply calling `echo` with
    /// `size` bytes and its result, a notice now and then, and a follow-up every fifth round.
    fn long_run(turns: u64, size: usize) -> Vec<Entry> {
        let mut t = vec![Entry {
            seq: 0,
            at: at(),
            body: EntryBody::user("go"),
        }];
        let mut push = |body| {
            let seq = t.len() as u64;
            t.push(Entry {
                seq,
                at: at(),
                body,
            });
        };
        for n in 0..turns {
            push(EntryBody::reply(Some(format!("round {n}"))));
            let reply_seq = n; // not read by the projection
            push(EntryBody::Tool(ToolEntry::new(
                format!("c{n}"),
                "echo",
                json!({"text": "x".repeat(size)}),
                ToolResult::Success {
                    output: json!("y".repeat(size)),
                },
                reply_seq,
            )));
            if n % 3 == 0 {
                push(EntryBody::Notice {
                    code: "n".into(),
                    message: "m".into(),
                });
            }
            if n % 5 == 4 {
                push(EntryBody::user(format!("and then {n}")));
            }
        }
        t
    }

    #[test]
    fn a_history_within_its_budget_is_given_whole_and_borrowed() {
        let t = long_run(10, 50);
        let given = fit(None, &t, 1_000_000);
        assert!(matches!(given, Cow::Borrowed(_)));
        assert_eq!(given.as_ref(), t.as_slice());
    }

    #[test]
    fn past_its_budget_a_model_gets_the_first_message_a_note_and_the_newest_groups() {
        let t = long_run(40, 100);
        let budget = 2_000;
        let given = fit(None, &t, budget);
        assert!(given.len() < t.len());
        assert_eq!(given[0].seq, 0);
        let EntryBody::User { text, .. } = &given[0].body else {
            panic!("the first message first: {:?}", given[0]);
        };
        let left_out = given[1].seq - 1;
        assert!(text.starts_with("go\n\n[Baton: the "), "{text}");
        assert!(
            text.contains(&format!("the {left_out} timeline entries")),
            "{text}"
        );
        // After it, a stretch of the timeline up to its end, starting at a group.
        assert!(starts_group(&given[1]));
        let tail = &t[given[1].seq as usize..];
        assert_eq!(&given[1..], tail);
        let size: usize = tail.iter().map(model_bytes).sum();
        assert!(size <= budget, "{size} bytes given, budget {budget}");
        // One more group would not have fitted.
        let before = t[..given[1].seq as usize]
            .iter()
            .rposition(starts_group)
            .expect("a group before");
        let more: usize = t[before..].iter().map(model_bytes).sum();
        assert!(more > budget);
        // The projection pairs every result with its call.
        let msgs = project("", &given);
        let calls: usize = msgs
            .iter()
            .map(|m| match m {
                ChatMessage::Assistant { tool_calls, .. } => tool_calls.len(),
                _ => 0,
            })
            .sum();
        let results = msgs
            .iter()
            .filter(|m| matches!(m, ChatMessage::Tool { .. }))
            .count();
        assert_eq!(calls, results);
    }

    #[test]
    fn the_newest_group_is_given_whatever_its_size() {
        let t = long_run(6, 5_000);
        let given = fit(None, &t, 1_000);
        let last = t.iter().rposition(starts_group).expect("a group");
        assert_eq!(given[0].seq, 0);
        assert_eq!(&given[1..], &t[last..]);
    }

    /// The projection is derived from the timeline alone: any read backwards from the end
    /// that is over the budget and holds a group start, with the first message beside it,
    /// gives exactly what the whole timeline gives.
    #[test]
    fn any_read_over_the_budget_gives_what_the_whole_timeline_gives() {
        for (turns, size, budget) in [(30, 40, 1_000), (25, 300, 2_500), (12, 10, 100_000)] {
            let t = long_run(turns, size);
            let whole = fit(None, &t, budget).into_owned();
            for lo in 1..t.len() {
                let span = &t[lo..];
                let over = span.iter().map(model_bytes).sum::<usize>() > budget;
                if !over || !span.iter().any(starts_group) {
                    continue;
                }
                let read = fit(Some(&t[0]), span, budget);
                assert_eq!(
                    read.as_ref(),
                    whole.as_slice(),
                    "read from {lo}, budget {budget}"
                );
            }
            // Read from the start, the first message inside the span, beside it, or both.
            assert_eq!(fit(Some(&t[0]), &t[1..], budget).as_ref(), whole.as_slice());
            assert_eq!(fit(Some(&t[0]), &t, budget).as_ref(), whole.as_slice());
        }
    }
}
