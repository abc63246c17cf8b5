//! How the client commands print what the API answers: a run, its timeline, a question.

use serde_json::{Value, json};

pub(super) fn short(v: &Value, max: usize) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max).collect::<String>())
    } else {
        s
    }
}

pub(super) fn render_cta(c: &Value) -> String {
    let kind = c["kind"].as_str().unwrap_or("?");
    let ask = match kind {
        "approval" => short(&c["message"], 80),
        "choice" => {
            let opts: Vec<String> = c["options"]
                .as_array()
                .map(|o| {
                    o.iter()
                        .map(|o| format!("{}={}", short(&o["id"], 20), short(&o["label"], 30)))
                        .collect()
                })
                .unwrap_or_default();
            format!("{} [{}]", short(&c["prompt"], 60), opts.join(", "))
        }
        _ => short(&c["prompt"], 80),
    };
    format!(
        "{}  {:<8} {:<9} run {}  expires {}  {}",
        c["ctaId"].as_str().unwrap_or(""),
        kind,
        c["status"].as_str().unwrap_or(""),
        c["runId"].as_str().unwrap_or(""),
        c["expiresAt"].as_str().unwrap_or(""),
        ask
    )
}

/// A run's state in a few words: its status, what it waits for, and the last error of a
/// step being retried.
pub(super) fn progress(r: &Value) -> String {
    let mut out = r["status"].as_str().unwrap_or("").to_owned();
    if let Some(state) = r["state"].as_str() {
        out.push_str(&format!(" ({state})"));
    }
    if let Some(e) = r.get("lastError") {
        out.push_str(&format!(
            " - retrying after attempt {}: {}",
            e["attempts"],
            e["message"].as_str().unwrap_or("")
        ));
    }
    out
}

pub(super) fn render_run(r: &Value) -> String {
    let u = &r["usage"];
    let mut out = format!(
        "run {}  agent {}  status {}  tokens {} in / {} out  cost ${:.6}",
        r["runId"].as_str().unwrap_or(""),
        r["agent"].as_str().unwrap_or(""),
        r["status"].as_str().unwrap_or(""),
        u["inputTokens"],
        u["outputTokens"],
        r["costUsd"].as_f64().unwrap_or(0.0),
    );
    let total = &r["total"];
    if total["usage"]["totalTokens"] != u["totalTokens"] {
        out.push_str(&format!(
            " (with subagents: {} tokens, ${:.6})",
            total["usage"]["totalTokens"],
            total["costUsd"].as_f64().unwrap_or(0.0)
        ));
    }
    for e in r["timeline"].as_array().into_iter().flatten() {
        let line = entry_line(e);
        out.push_str(&format!("\n  [{}] {}", e["seq"], line));
    }
    if let Some(res) = r["result"].as_str() {
        out.push_str(&format!("\nresult: {res}"));
    }
    if let Some(e) = r.get("error") {
        out.push_str(&format!(
            "\nerror: {}: {}",
            e["code"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        ));
    }
    if let Some(e) = r.get("lastError") {
        out.push_str(&format!(
            "\nlast error (attempt {}, at {}): {}",
            e["attempts"],
            e["at"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        ));
    }
    out
}

/// One line for a timeline entry, whatever its type (`baton show`; `baton watch` for those
/// it does not stream).
pub(super) fn entry_line(e: &Value) -> String {
    let text = |k: &str| e[k].as_str().unwrap_or("");
    match text("type") {
        "user" => format!("user: {}", short(&e["text"], 100)),
        "queued" => format!("queued follow-up: {}", short(&e["text"], 100)),
        "assistant" => {
            let what = match &e["text"] {
                Value::String(t) => format!("assistant: {}", short(&json!(t), 100)),
                _ => "assistant: (tool calls)".into(),
            };
            let model = e["model"]
                .as_str()
                .map(|m| format!(", {m}"))
                .unwrap_or_default();
            // The models of its fallback chain that failed before this one answered.
            let failed: Vec<&str> = e["fallbacks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["model"].as_str())
                .collect();
            let after = match failed.is_empty() {
                true => String::new(),
                false => format!(" after {} failed", failed.join(", ")),
            };
            format!(
                "{what} ({} tokens{model}{after})",
                e["usage"]["totalTokens"].as_u64().unwrap_or(0)
            )
        }
        "tool" => tool_line(e),
        "notice" | "error" => format!(
            "{}: {} {}",
            text("type"),
            text("code"),
            short(&e["message"], 100)
        ),
        "widget" => match e["fallback"].as_str() {
            Some(words) => format!("widget {}: {}", text("kind"), short(&json!(words), 80)),
            None => format!("widget {}: {}", text("kind"), short(&e["data"], 80)),
        },
        "file" => format!(
            "file {} ({}, {} bytes): {}",
            text("name"),
            text("mediaType"),
            e["size"],
            short(&e["summary"], 80)
        ),
        "usage" => {
            let u = &e["usage"];
            format!(
                "turn [{}] used {} tokens ({} in, {} out), ${:.6}",
                e["turnSeq"],
                u["totalTokens"].as_u64().unwrap_or(0),
                u["inputTokens"].as_u64().unwrap_or(0),
                u["outputTokens"].as_u64().unwrap_or(0),
                e["costUsd"].as_f64().unwrap_or(0.0)
            )
        }
        // A type newer than this client: its name and its fields, as they are.
        t => {
            let mut rest = e.clone();
            if let Value::Object(m) = &mut rest {
                m.remove("type");
                m.remove("seq");
            }
            format!("{t}: {}", short(&rest, 100))
        }
    }
}

/// A tool call's line: its name, child run, input and outcome.
fn tool_line(e: &Value) -> String {
    let res = &e["result"];
    let outcome = match res["status"].as_str().unwrap_or("") {
        "success" => match res["output"].get("text") {
            // A subagent's answer: its text, not the whole envelope.
            Some(text) if e["name"] == "spawn_subagent" => format!(
                "success: {} ({} steps)",
                short(text, 80),
                res["output"]["stepCount"]
            ),
            _ => format!("success: {}", short(&res["output"], 80)),
        },
        "error" => format!("error: {}", short(&res["error"], 80)),
        _ => {
            let mut p = format!("pending ({})", res["reason"].as_str().unwrap_or(""));
            if let Some(cta) = e.get("cta") {
                p.push_str(&format!(
                    " CTA {} {}",
                    cta["ctaId"].as_str().unwrap_or(""),
                    cta["kind"].as_str().unwrap_or("")
                ));
            }
            p
        }
    };
    let child = e
        .get("childRunId")
        .and_then(Value::as_str)
        .map(|c| format!(" [{c}]"))
        .unwrap_or_default();
    format!(
        "tool {}{} {} -> {}",
        e["name"].as_str().unwrap_or(""),
        child,
        short(&e["input"], 60),
        outcome
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::llm::Usage;
    use baton_core::timeline::{EntryBody, FileRef, ToolEntry, ToolResult, TurnOptions};

    /// One entry of each type, as the API serves it. The match is exhaustive: a new type
    /// of entry does not compile here until it is given one, and a line.
    fn one_of_each() -> Vec<(EntryBody, &'static str)> {
        let usage = Usage {
            input_tokens: 1200,
            output_tokens: 34,
            total_tokens: 1234,
            cached_input_tokens: 0,
            reasoning_tokens: 0,
        };
        let all = vec![
            EntryBody::User {
                text: "Ship v2".into(),
                message_id: None,
                options: TurnOptions::default(),
            },
            EntryBody::Queued {
                text: "and tag it".into(),
                message_id: "m1".into(),
                options: TurnOptions::default(),
            },
            EntryBody::Assistant {
                text: Some("Deployed.".into()),
                usage,
                model: Some("openai:gpt-5".into()),
                cost_usd: None,
                operation: Default::default(),
                latency_ms: None,
                first_token_ms: None,
                truncated: false,
                stop_reason: None,
                fallbacks: vec![baton_core::llm::Fallback {
                    model: "openai:gpt-5-pro".into(),
                    error: "HTTP 503".into(),
                }],
                reasoning: None,
            },
            EntryBody::Tool(ToolEntry::new(
                "c1",
                "echo",
                json!({"text": "hi"}),
                ToolResult::Success {
                    output: json!("hi"),
                },
                3,
            )),
            EntryBody::Notice {
                code: "cta_expired".into(),
                message: "the question expired".into(),
            },
            EntryBody::Error {
                code: "tool_call_limit".into(),
                message: "2 calls not run".into(),
            },
            EntryBody::Widget {
                call_id: "c1".into(),
                kind: "table".into(),
                data: json!({"rows": 2}),
                fallback: Some("Two rows: a and b.".into()),
            },
            EntryBody::File(FileRef {
                call_id: "c1".into(),
                file_id: "f1".into(),
                name: "chart.png".into(),
                media_type: "image/png".into(),
                size: 2048,
                summary: "a chart".into(),
            }),
            EntryBody::Usage {
                turn_seq: 1,
                usage,
                cost_usd: 0.0123,
            },
        ];
        all.into_iter()
            .map(|body| {
                let says = match &body {
                    EntryBody::User { .. } => "user: Ship v2",
                    EntryBody::Queued { .. } => "queued follow-up: and tag it",
                    EntryBody::Assistant { .. } => {
                        "assistant: Deployed. (1234 tokens, openai:gpt-5 after openai:gpt-5-pro failed)"
                    }
                    EntryBody::Tool(_) => "tool echo {\"text\":\"hi\"} -> success: hi",
                    EntryBody::Notice { .. } => "notice: cta_expired the question expired",
                    EntryBody::Error { .. } => "error: tool_call_limit 2 calls not run",
                    EntryBody::Widget { .. } => "widget table: Two rows: a and b.",
                    EntryBody::File(_) => "file chart.png (image/png, 2048 bytes): a chart",
                    EntryBody::Usage { .. } => {
                        "turn [1] used 1234 tokens (1200 in, 34 out), $0.012300"
                    }
                };
                (body, says)
            })
            .collect()
    }

    #[test]
    fn every_type_of_entry_has_a_line_of_its_own() {
        for (seq, (body, says)) in one_of_each().into_iter().enumerate() {
            let mut e = serde_json::to_value(&body).unwrap();
            e["seq"] = json!(seq);
            assert_eq!(entry_line(&e), says, "{e}");
        }
        // A type newer than this client: its name and what it holds, never `null`.
        let e = json!({"seq": 9, "type": "handoff", "to": "ops"});
        assert_eq!(entry_line(&e), "handoff: {\"to\":\"ops\"}");
    }

    #[test]
    fn a_run_shows_its_turns_usage() {
        let usage = one_of_each().pop().unwrap().0;
        let mut e = serde_json::to_value(&usage).unwrap();
        e["seq"] = json!(7);
        let run = json!({"runId": "r1", "agent": "orchestrator", "status": "completed",
            "usage": {"inputTokens": 1200, "outputTokens": 34, "totalTokens": 1234},
            "costUsd": 0.0123, "total": {"usage": {"totalTokens": 1234}}, "timeline": [e]});
        let text = render_run(&run);
        assert!(
            text.ends_with("\n  [7] turn [1] used 1234 tokens (1200 in, 34 out), $0.012300"),
            "{text}"
        );
        assert!(!text.contains("null"), "{text}");
    }
}
