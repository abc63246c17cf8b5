//! Files and widgets beside a tool's result, end to end on `baton dev` and over AWS APIs
//! (an emulator's S3): the timeline names the file and draws the widgets, the owner downloads the
//! bytes, nobody else can, and the model saw the file's summary alone.

use crate::common;

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
    let h = start(dir.path(), scripted(SCRIPT), catalog_with_report(agents())).await;
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
            "assistant",
            "usage"
        ]
    );
    h.server.shutdown().await;

    // On the emulator alone: this test is about files (S3 is where emulators differ),
    // the scenarios of the `aws_*.rs` suites are what meet the fault layer.
    let aws = Emulator::start_with(None).await;
    let s = AwsDevServer::start(AwsDevOptions {
        ..AwsDevOptions::new(
            aws.sdk().await,
            aws.names("files"),
            "arn:aws:iam::123456789012:role/files-scheduler",
            TOKEN,
            scripted(SCRIPT),
            catalog_with_report(agents()),
        )
    })
    .await
    .unwrap();
    assert_eq!(report(&s.url()).await, local);
    s.shutdown().await;
}

/// A file of the largest size a tool may return (5 MB) downloads whole on both hosts: in the
/// reply on `baton dev`, and over AWS APIs by a 302 to a presigned S3 URL, so that its bytes
/// never pass through the function's reply (Lambda's is at most 6 MB, base64 included). A
/// small file still comes in the reply.
#[tokio::test]
async fn a_5_mb_file_downloads_in_the_reply_locally_and_from_s3_by_a_redirect_on_aws() {
    let big = baton_core::tools::MAX_FILE_BYTES;
    let script = format!(
        r#"{{"reporter": [
        {{"tool_calls": [{{"name": "report", "arguments": {{"bytes": {big}}}}}]}},
        {{"text": "Attached."}}]}}"#
    );
    // The files of a run on the API at `base`: (name, its path).
    let files = async |base: &str| -> Vec<(String, String)> {
        let http = reqwest::Client::new();
        let r: Value = http
            .post(format!("{base}/runs"))
            .bearer_auth(TOKEN)
            .json(&json!({"prompt": "raw data?", "agent": "reporter"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let run_id = r["runId"].as_str().unwrap().to_owned();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let run: Value = http
                .get(format!("{base}/runs/{run_id}"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if run["status"] == "completed" {
                return of_type(&run, "file")
                    .iter()
                    .map(|f| {
                        let id = f["fileId"].as_str().unwrap();
                        (
                            f["name"].as_str().unwrap().to_owned(),
                            format!("{base}/runs/{run_id}/files/{id}"),
                        )
                    })
                    .collect();
            }
            assert!(std::time::Instant::now() < deadline, "{run:#}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    // Redirects are followed by hand, to see them.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path(), scripted(&script), catalog_with_report(agents())).await;
    for (name, url) in files(&h.url("")).await {
        // The embedded host's files are always in the reply, asked for a link or not.
        let r = http
            .get(format!("{url}?link=1"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{name} on baton dev");
        let want = if name == "sales.bin" {
            report_bytes(big)
        } else {
            REPORT_CSV.as_bytes().to_vec()
        };
        assert_eq!(r.bytes().await.unwrap().to_vec(), want, "{name}");
    }
    h.server.shutdown().await;

    let aws = Emulator::start_with(None).await;
    let s = AwsDevServer::start(AwsDevOptions {
        ..AwsDevOptions::new(
            aws.sdk().await,
            aws.names("bigfile"),
            "arn:aws:iam::123456789012:role/files-scheduler",
            TOKEN,
            scripted(&script),
            catalog_with_report(agents()),
        )
    })
    .await
    .unwrap();
    let files = files(&s.url()).await;
    assert_eq!(files.len(), 2);
    for (name, url) in files {
        let r = http.get(&url).bearer_auth(TOKEN).send().await.unwrap();
        if name == "sales.csv" {
            assert_eq!(r.status(), 200, "a small file comes in the reply");
            assert_eq!(r.text().await.unwrap(), REPORT_CSV);
            continue;
        }
        assert_eq!(r.status(), 302, "{name}");
        assert_eq!(r.headers()["cache-control"], "no-store");
        let location = r.headers()["location"].to_str().unwrap().to_owned();
        assert!(location.contains("X-Amz-Signature="), "{location}");
        assert!(location.contains("X-Amz-Expires=300"), "{location}");
        // S3 is asked to name it as a download (moto ignores this; S3 and LocalStack do not).
        assert!(
            location.contains("response-content-disposition=attachment"),
            "{location}"
        );
        // What the console asks for: the link itself, as JSON of its own media type.
        let asked = http
            .get(format!("{url}?link=1"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(asked.status(), 200);
        assert_eq!(
            asked.headers()["content-type"],
            baton_api::FILE_LINK_MEDIA_TYPE
        );
        let link: Value = asked.json().await.unwrap();
        assert!(link["url"].as_str().unwrap().contains("X-Amz-Signature="));
        let bad = http
            .get(format!("{url}?link=yes"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(bad.status(), 400);
        // The reply carried no bytes; the URL serves them, with no token.
        assert!(r.bytes().await.unwrap().is_empty());
        let r = http.get(&location).send().await.unwrap();
        assert_eq!(r.status(), 200, "{location}");
        assert_eq!(r.bytes().await.unwrap().to_vec(), report_bytes(big));
    }
    s.shutdown().await;
}
