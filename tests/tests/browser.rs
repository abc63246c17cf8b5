//! The console in a real browser (`tests/browser/console.mjs`: Playwright's client driving
//! Debian's Chromium, headless): sign in to `baton dev`'s console, see the inbox, answer one
//! question of each kind through its form and watch each run finish in its live timeline,
//! then answer through a one-time link. Screenshots land in `target/browser-artifacts/`
//! (CI keeps them).

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use baton_core::ports::SystemClock;
use common::*;
use serde_json::json;

const SCRIPT: &str = r#"{
  "approver": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Ship v2 to production?"}}]},
    {"text": "Shipped."}],
  "writer": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Which release name?", "placeholder": "e.g. Aurora", "required": true}}]},
    {"text": "Named it Aurora."}],
  "chooser": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "choice", "prompt": "Which region?", "options": [
      {"id": "eu", "label": "Europe", "description": "Frankfurt, eu-central-1"},
      {"id": "us", "label": "United States", "description": "Virginia, us-east-1"}]}}]},
    {"text": "Deployed to the chosen region."}],
  "hotfix": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Deploy the hotfix now?"}}]},
    {"text": "Hotfix deployed."}]
}"#;

#[tokio::test]
async fn the_console_answers_each_kind_of_question_in_a_real_browser() {
    let chromium = browser::chromium();
    let modules = browser::node_modules();
    let dir = tempfile::tempdir().unwrap();
    let asks = json!({"tools": ["request_human_feedback"]});
    let agents =
        json!({"agents": {"approver": asks, "writer": asks, "chooser": asks, "hotfix": asks}});
    let h = start(
        dir.path(),
        scripted(SCRIPT),
        catalog(Some(agents)),
        Arc::new(SystemClock),
    )
    .await;
    let mut runs = serde_json::Map::new();
    for (kind, agent, prompt) in [
        ("approval", "approver", "release v2"),
        ("text", "writer", "name the release"),
        ("choice", "chooser", "pick a region"),
    ] {
        let id = h
            .create_run(json!({"prompt": prompt, "agent": agent}))
            .await;
        runs.insert(kind.into(), json!(id));
    }
    h.wait_pending(3).await;
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/browser-artifacts");
    let cfg = json!({
        "base": h.url(""),
        "token": TOKEN,
        "runs": runs,
        "chromium": chromium,
        "nodeModules": modules,
        "shots": shots,
        "link": null,
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("browser/console.mjs");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .env("BATON_BROWSER", cfg.to_string())
            .output()
            .expect("node runs")
    })
    .await
    .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{said}");
    assert!(out.status.success(), "the browser test failed:\n{said}");
    assert!(said.contains("browser: all passed"));
    for shot in ["inbox.png", "run.png", "run-phone.png"] {
        assert!(shots.join(shot).exists(), "{shot}");
    }
    // What the browser did, as the API sees it.
    for (kind, want) in [
        ("approval", "Shipped."),
        ("text", "Named it Aurora."),
        ("choice", "Deployed to the chosen region."),
    ] {
        let (_, run) = h
            .get(&format!("/runs/{}", runs[kind].as_str().unwrap()))
            .await;
        assert_eq!(run["status"], "completed", "{kind}");
        assert_eq!(run["result"], want, "{kind}");
    }
    h.server.shutdown().await;
}
