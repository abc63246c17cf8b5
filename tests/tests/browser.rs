//! The console in a real browser (`tests/browser/console.mjs`: Playwright's client driving
//! Debian's Chromium, headless): sign in to `baton dev`'s console, see the inbox, answer one
//! question of each kind through its form and watch each run finish in its live timeline
//! (a reply written word by word as the model streams it, before its entry commits),
//! a tool shown running then with how long it took, a plan shown under way, then answer
//! through a one-time link. Screenshots land in `target/browser-artifacts/`
//! (CI keeps them).

use crate::common;

use std::sync::Arc;

use common::*;
use serde_json::json;

/// The approver's reply, long enough to be seen being written (the scripted model streams a
/// watched run's reply a word every 20 ms).
const APPROVAL_REPLY: &str = "Shipped. Release v2 is live in every region: the canary held for ten minutes with no errors, the dashboards are green, the rollback plan is filed with the release notes, the on-call engineer has the runbook, and the customers who asked for the new export will hear from support this afternoon.";

const SCRIPT: &str = r#"{
  "approver": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Ship v2 to production?"}}]},
    {"text": "Shipped. Release v2 is live in every region: the canary held for ten minutes with no errors, the dashboards are green, the rollback plan is filed with the release notes, the on-call engineer has the runbook, and the customers who asked for the new export will hear from support this afternoon."}],
  "writer": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Which release name?", "placeholder": "e.g. Aurora", "required": true}}]},
    {"text": "Named it Aurora."}],
  "chooser": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "choice", "prompt": "Which region?", "options": [
      {"id": "eu", "label": "Europe", "description": "Frankfurt, eu-central-1"},
      {"id": "us", "label": "United States", "description": "Virginia, us-east-1"}]}}]},
    {"text": "Deployed to the chosen region."}],
  "quickie": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Quick: restart?"}}]}],
  "reporter": [
    {"tool_calls": [{"name": "report", "arguments": {}}]},
    {"text": "Sales are attached."}],
  "poller": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Roll back?"}}]},
    {"text": "Rolled back."}],
  "checker": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Run the slow report?"}}]},
    {"tool_calls": [{"name": "report", "arguments": {"waitMs": 1500}}]},
    {"text": "Report done."}],
  "planner_run": [
    {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"execution_mode": "agent_review",
      "plan": {"steps": [
      {"id": "check", "agent": "asker", "prompt": "check the release"},
      {"id": "ship", "agent": "shipper", "prompt": "ship it"}]}}}]},
    {"text": "The plan ran."}],
  "plan_reviewer": [{"text": "{\"approved\": true, \"notes\": \"Checks come first: good.\"}"}],
  "asker": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Checks look fine?"}}]},
    {"text": "Checked."}],
  "shipper": [{"text": "Shipped."}],
  "spender": [
    {"tool_calls": [{"name": "report", "arguments": {}}],
     "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}},
    {"text": "Within budget.", "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}}],
  "hotfix": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Deploy the hotfix now?"}}]},
    {"text": "Hotfix deployed."}]
}"#;

#[tokio::test]
async fn the_console_answers_each_kind_of_question_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let asks = json!({"tools": ["request_human_feedback"]});
    let quick = json!({"tools": ["request_human_feedback"], "ctaExpirySeconds": 1});
    let agents = json!({"agents": {"approver": asks, "writer": asks, "chooser": asks,
                                   "hotfix": asks, "quickie": quick, "poller": asks,
                                   "reporter": {"tools": ["report"]},
                                   "checker": {"tools": ["request_human_feedback", "report"]},
                                   "planner_run": {"tools": ["agent_orchestrate"]},
                                   "asker": asks, "shipper": {"tools": []},
                                   "spender": {"tools": ["report"], "model": "gpt-4o-mini",
                                               "maxCostUsd": 0.5}}});
    let h = start(dir.path(), scripted(SCRIPT), catalog_with_report(agents)).await;
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
    let reporter = h
        .create_run(json!({"prompt": "sales?", "agent": "reporter", "visible": false}))
        .await;
    h.wait_status(&reporter, &["completed"]).await;
    // A one-time link to the hotfix's question; a tampered one; one past its CTA's expiry.
    let hotfix = h
        .create_run(json!({"prompt": "hotfix", "agent": "hotfix"}))
        .await;
    let quick = h
        .create_run(json!({"prompt": "restart", "agent": "quickie"}))
        .await;
    let mut links = serde_json::Map::new();
    for run in [&hotfix, &quick] {
        let cta = loop {
            let (_, v) = h.get("/ctas?status=pending").await;
            let ctas = v["ctas"].as_array().unwrap();
            if let Some(c) = ctas.iter().find(|c| c["runId"] == run.as_str()) {
                break c["ctaId"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        let (code, v) = h.post(&format!("/ctas/{cta}/link"), json!({})).await;
        assert_eq!(code, 200, "{v}");
        links.insert(run.clone(), v["url"].clone());
    }
    let link = links[&hotfix].as_str().unwrap().to_owned();
    // The MAC's first character changed: the same length, another signature.
    let mac = link.rfind('.').unwrap() + 1;
    let swap = if &link[mac..=mac] == "A" { "B" } else { "A" };
    let tampered = format!("{}{swap}{}", &link[..mac], &link[mac + 1..]);
    let expired = links[&quick].as_str().unwrap().to_owned();
    // The quick question expires after a second (and its run with it).
    h.wait_status(&quick, &["expired"]).await;
    // The same API as the `api` function serves it behind API Gateway: no streaming, so the
    // page polls the timeline cursor.
    let poller = h
        .create_run(json!({"prompt": "roll back", "agent": "poller"}))
        .await;
    let app = baton_api::router(baton_api::AppState {
        service: h.server.service.clone(),
        auth: Arc::new(baton_api::BearerToken::new(TOKEN, "local")),
        streams: false,
        stop: None,
        live: None,
        watchers: None,
    });
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let (poll_addr, _poll_server) = baton_api::serve(app, "127.0.0.1:0".parse().unwrap(), rx)
        .await
        .unwrap();
    // A tool that takes a second and a half, after an approval (so the page watches it run);
    // a plan whose first step waits on a question (so it stays under way).
    let checker = h
        .create_run(json!({"prompt": "slow report", "agent": "checker"}))
        .await;
    let plan = h
        .create_run(json!({"prompt": "release plan", "agent": "planner_run"}))
        .await;
    // Its first reply ($0.60 of gpt-4o-mini) spends its $0.50: it asks before its second.
    let spender = h
        .create_run(json!({"prompt": "sales report", "agent": "spender"}))
        .await;
    let cfg = json!({
        "base": h.url(""),
        "token": TOKEN,
        "runs": runs,
        "report": {"run": reporter, "csv": REPORT_CSV},
        "approvalReply": APPROVAL_REPLY,
        "polling": {"base": format!("http://{poll_addr}"), "run": poller},
        "slow": {"run": checker},
        "plan": {"run": plan},
        "budget": {"run": spender},
        "link": link,
        "tampered": {"url": tampered, "says": "This link is not valid"},
        "expired": {"url": expired, "says": "This link has expired"},
    });
    browser::run_script("console.mjs", cfg).await;
    for shot in [
        "inbox.png",
        "run.png",
        "streaming.png",
        "run-phone.png",
        "link.png",
        "report.png",
        "tool-running.png",
        "plan.png",
    ] {
        let shots = common::target_dir().join("browser-artifacts");
        assert!(shots.join(shot).exists(), "{shot}");
    }
    // What the browser did, as the API sees it.
    for (kind, want) in [
        ("approval", APPROVAL_REPLY),
        ("text", "Named it Aurora."),
        ("choice", "Deployed to the chosen region."),
    ] {
        let (_, run) = h
            .get(&format!("/runs/{}", runs[kind].as_str().unwrap()))
            .await;
        assert_eq!(run["status"], "completed", "{kind}");
        assert_eq!(run["result"], want, "{kind}");
    }
    let (_, run) = h.get(&format!("/runs/{poller}")).await;
    assert_eq!(run["result"], "Rolled back.");
    let (_, run) = h.get(&format!("/runs/{plan}")).await;
    assert_eq!(run["result"], "The plan ran.");
    let (_, run) = h.get(&format!("/runs/{checker}")).await;
    assert_eq!(run["result"], "Report done.");
    let (_, run) = h.get(&format!("/runs/{spender}")).await;
    assert_eq!(run["result"], "Within budget.");
    let by = run["budget"]["raises"][0]["byUsd"]
        .as_f64()
        .unwrap_or_default();
    assert!(
        (by - 2.1).abs() < 1e-9,
        "the raise and the $0.10 spent past it: {run}"
    );
    let (_, timeline) = h.get(&format!("/runs/{checker}/timeline")).await;
    let report = timeline["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "report")
        .unwrap()
        .clone();
    assert!(report["durationMs"].as_u64().unwrap() >= 1500, "{report}");
    // The link answered, as the CTA records it.
    let (_, run) = h.get(&format!("/runs/{hotfix}")).await;
    assert_eq!(run["result"], "Hotfix deployed.");
    let (_, ctas) = h.get("/ctas?status=answered").await;
    let answered = ctas["ctas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["runId"] == hotfix.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        answered["responder"], "local",
        "a link answers as its minter"
    );
    assert!(
        answered.get("linkNonce").is_none(),
        "the API never shows it"
    );
    h.server.shutdown().await;
}

const OPERATORS_SCRIPT: &str = r#"{
  "boss": [
    {"tool_calls": [{"name": "spawn_subagent", "arguments": {"agent": "helper", "prompt": "map the repo"}}],
     "usage": {"inputTokens": 1000, "outputTokens": 100, "totalTokens": 1100}},
    {"text": "The helper mapped it.", "usage": {"inputTokens": 1200, "outputTokens": 50, "totalTokens": 1250}}],
  "release": [
    {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"plan": {"steps": [
      {"id": "check", "agent": "helper", "prompt": "check"},
      {"id": "ship", "agent": "helper", "prompt": "ship"}]}}}],
     "usage": {"inputTokens": 800, "outputTokens": 80, "totalTokens": 880}},
    {"text": "The plan ran."}],
  "asker": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Go?"}}],
     "usage": {"inputTokens": 300, "outputTokens": 30, "totalTokens": 330}}],
  "helper": [{"text": "Done.", "usage": {"inputTokens": 200, "outputTokens": 20, "totalTokens": 220}}],
  "greeter": [{"text": "Hello from the console."}, {"text": "Hello again."}]
}"#;

/// The console for operators (`tests/browser/operators.mjs`): the runs view lists and
/// filters runs, the chart draws, a run started from the console completes and takes a
/// follow-up, "fork here" makes a fork that completes, the trees show a subagent and a
/// plan's steps, and a waiting run is cancelled; then the API says the same.
#[tokio::test]
async fn the_operators_console_lists_filters_charts_starts_forks_and_cancels_runs() {
    let dir = tempfile::tempdir().unwrap();
    let agents = json!({"agents": {
        "boss": {"tools": ["spawn_subagent"], "model": "openai:gpt-4o-mini"},
        "release": {"tools": ["agent_orchestrate"], "model": "openai:gpt-4o-mini"},
        "asker": {"tools": ["request_human_feedback"], "model": "openai:gpt-4o-mini"},
        "helper": {"tools": [], "model": "openai:gpt-4o-mini"},
        "greeter": {"tools": []}}});
    let h = start(
        dir.path(),
        scripted(OPERATORS_SCRIPT),
        catalog(Some(agents)),
    )
    .await;
    let boss = h
        .create_run(json!({"prompt": "map it", "agent": "boss"}))
        .await;
    h.wait_status(&boss, &["completed"]).await;
    let release = h
        .create_run(json!({"prompt": "release", "agent": "release"}))
        .await;
    h.wait_status(&release, &["completed"]).await;
    let asker = h
        .create_run(json!({"prompt": "ask", "agent": "asker"}))
        .await;
    h.wait_status(&asker, &["waiting"]).await;
    let cfg = json!({"base": h.url(""), "token": TOKEN, "boss": boss, "release": release, "asker": asker});
    browser::run_script("operators.mjs", cfg).await;
    for shot in ["runs.png", "tree.png"] {
        let shots = common::target_dir().join("browser-artifacts");
        assert!(shots.join(shot).exists(), "{shot}");
    }
    // What the browser did, as the API sees it: the started run answered twice, its fork
    // came from its first turn with the new words, the waiting run cancelled.
    let (_, v) = h.get("/runs?agent=greeter").await;
    let greeters: Vec<String> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(greeters.len(), 2, "{v}");
    let (_, fork) = h.get(&format!("/runs/{}", greeters[0])).await;
    let started = &greeters[1];
    assert_eq!(fork["forkedFrom"]["runId"], started.as_str(), "{fork}");
    assert_eq!(fork["forkedFrom"]["atSeq"], 0);
    assert_eq!(fork["timeline"][0]["text"], "say hi");
    assert_eq!(fork["status"], "completed");
    let (_, run) = h.get(&format!("/runs/{started}")).await;
    assert_eq!(run["status"], "completed");
    assert_eq!(run["result"], "Hello again.");
    let (_, run) = h.get(&format!("/runs/{asker}")).await;
    assert_eq!(run["status"], "cancelled");
    h.server.shutdown().await;
}
