//! Files and widgets beside a tool's result, end to end on `baton dev` and over AWS APIs
//! (an emulator's S3): the timeline names the file and draws the widgets, the owner downloads the
//! bytes, nobody else can, and the model saw the file's summary alone.

use crate::common;

use std::sync::Arc;

use baton_core::ports::SystemClock;
use baton_dev::{AwsDevOptions, AwsDevServer};
use common::aws::Emulator;
use common::*;
use serde_json::{Value, json};

const SCRIPT: &str = r#"{"reporter": [
  {"tool_calls": [{"name": "report", "arguments": {}}]},
  {"text": "Sales are attached."}]}"#;

fn agents() -> Value {
    json!({"agents": {"reporter": {"tools": ["report"]}}})
}

/// Runs the reporter on the API at `base`; checks what a user sees; returns the timeline's
/// entry types.
async fn report(base: &str) -> Vec<String> {
    let http = reqwest::Client::new();
    let call = async |method: reqwest::Method, path: &str, token: &str, body: Option<Value>| {
        let mut rb = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(token);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        rb.send().await.unwrap()
    };
    let r = call(
        reqwest::Method::POST,
        "/runs",
        TOKEN,
        Some(json!({"prompt": "sales?", "agent": "reporter"})),
    )
    .await;
    let run_id = r.json::<Value>().await.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let run = loop {
        let run: Value = call(
            reqwest::Method::GET,
            &format!("/runs/{run_id}"),
            TOKEN,
            None,
        )
        .await
        .json()
        .await
        .unwrap();
        if run["status"] == "completed" {
            break run;
        }
        assert!(std::time::Instant::now() < deadline, "{run:#}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let widgets = of_type(&run, "widget");
    assert_eq!(widgets[0]["kind"], "table");
    assert_eq!(widgets[1]["data"], json!({"total": 42, "regions": 2}));
    let file = of_type(&run, "file")[0].clone();
    assert_eq!(file["name"], "sales.csv");
    assert_eq!(file["mediaType"], "text/csv");
    assert_eq!(file["size"], REPORT_CSV.len());
    assert_eq!(file["summary"], "2 regions, 42 sales in all");
    // The owner downloads it, as a download.
    let path = format!("/runs/{run_id}/files/{}", file["fileId"].as_str().unwrap());
    let r = call(reqwest::Method::GET, &path, TOKEN, None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/csv");
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=\"sales.csv\""
    );
    assert_eq!(r.text().await.unwrap(), REPORT_CSV);
    // No one else; no other file; no path games.
    let r = call(reqwest::Method::GET, &path, "someone-else", None).await;
    assert_eq!(r.status(), 401);
    for bad in [
        format!("/runs/{run_id}/files/file_00000000000000000000000000000000"),
        format!("/runs/{run_id}/files/..%2F..%2Fbaton.db"),
        format!("/runs/run_nope/files/{}", file["fileId"].as_str().unwrap()),
    ] {
        let r = call(reqwest::Method::GET, &bad, TOKEN, None).await;
        assert_eq!(r.status(), 404, "{bad}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "not_found");
    }
    run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_tools_files_and_widgets_reach_the_timeline_and_the_owner_on_both_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(
        dir.path(),
        scripted(SCRIPT),
        catalog_with_report(agents()),
        Arc::new(SystemClock),
    )
    .await;
    let local = report(&h.url("")).await;
    assert_eq!(
        local,
        [
            "user",
            "assistant",
            "tool",
            "widget",
            "widget",
            "file",
            "assistant"
        ]
    );
    h.server.shutdown().await;

    // On the emulator alone: this test is about files (S3 is where emulators differ),
    // the scenarios of `aws_flow.rs` are what meet the fault layer.
    let aws = Emulator::start_with(None).await;
    let s = AwsDevServer::start(AwsDevOptions {
        sdk: aws.sdk().await,
        names: aws.names("files"),
        scheduler_role_arn: "arn:aws:iam::123456789012:role/files-scheduler".into(),
        addr: "127.0.0.1:0".parse().unwrap(),
        token: TOKEN.into(),
        llm: scripted(SCRIPT),
        catalog: catalog_with_report(agents()),
        clock: Arc::new(SystemClock),
        duplicate: false,
    })
    .await
    .unwrap();
    assert_eq!(report(&s.url()).await, local);
    s.shutdown().await;
}
