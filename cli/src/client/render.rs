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
        let line = match e["type"].as_str().unwrap_or("") {
            "user" => format!("user: {}", short(&e["text"], 100)),
            "assistant" => match &e["text"] {
                Value::String(t) => format!("assistant: {}", short(&json!(t), 100)),
                _ => "assistant: (tool calls)".into(),
            },
            "tool" => {
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
            "widget" => format!(
                "widget {}: {}",
                e["kind"].as_str().unwrap_or(""),
                short(&e["data"], 80)
            ),
            "file" => format!(
                "file {} ({}, {} bytes): {}",
                e["name"].as_str().unwrap_or(""),
                e["mediaType"].as_str().unwrap_or(""),
                e["size"],
                short(&e["summary"], 80)
            ),
            t => format!(
                "{t}: {} {}",
                e["code"].as_str().unwrap_or(""),
                short(&e["message"], 100)
            ),
        };
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
