//! The console's server side: its assets, and `GET /runs/{id}/stream` (Server-Sent Events)
//! followed over real HTTP, resumed with `Last-Event-ID`, and refused with a JSON 501 by a
//! host that does not stream (the `api` function behind API Gateway).

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_api::{AppState, BearerToken};
use common::*;
use serde_json::{Value, json};

const SCRIPT: &str = r#"{"orchestrator": [
  {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Name?"}}]},
  {"text": "Hello, Ada."}]}"#;

/// One SSE event.
#[derive(Debug)]
struct Sse {
    event: String,
    id: String,
    data: Value,
}

/// Reads a stream's events until `done` says stop (or 20 s pass).
async fn read_until(
    resp: &mut reqwest::Response,
    buf: &mut String,
    seen: &mut Vec<Sse>,
    done: impl Fn(&[Sse]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(seen) {
        assert!(Instant::now() < deadline, "stream stalled: {seen:#?}");
        let chunk = tokio::time::timeout(Duration::from_secs(20), resp.chunk())
            .await
            .unwrap()
            .unwrap()
            .expect("the stream stays open");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(cut) = buf.find("\n\n") {
            let frame: String = buf.drain(..cut + 2).collect();
            let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().into();
                } else if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().into();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            if !data.is_empty() {
                let data = serde_json::from_str(&data).unwrap();
                seen.push(Sse { event, id, data });
            }
        }
    }
}

fn entries(seen: &[Sse], seq: u64) -> Vec<&Value> {
    seen.iter()
        .filter(|e| e.event == "entry" && e.data["seq"] == seq)
        .map(|e| &e.data)
        .collect()
}

#[tokio::test]
async fn a_run_streams_its_timeline_live_and_resumes_from_its_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), SCRIPT).await;
    let run_id = h.create_run(json!({"prompt": "greet me"})).await;
    let cta = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let open = |last: Option<&str>| {
        let mut rb = h
            .http
            .get(h.url(&format!("/runs/{run_id}/stream")))
            .bearer_auth(TOKEN);
        if let Some(id) = last {
            rb = rb.header("Last-Event-ID", id);
        }
        rb.send()
    };
    let mut resp = open(None).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let (mut buf, mut seen) = (String::new(), Vec::new());
    // The timeline so far, the question pending, and the run waiting.
    read_until(&mut resp, &mut buf, &mut seen, |s| {
        s.iter()
            .any(|e| e.event == "run" && e.data["status"] == "waiting")
    })
    .await;
    assert_eq!(entries(&seen, 0)[0]["text"], "greet me");
    assert_eq!(entries(&seen, 2)[0]["result"]["status"], "pending");
    // The cursor stops before the entry that may still change.
    assert_eq!(seen.last().unwrap().id, "1");
    h.post(
        &format!("/ctas/{cta}/response"),
        json!({"kind": "text", "text": "Ada"}),
    )
    .await;
    // The answered question comes again, changed; then the answer and the run's end.
    read_until(&mut resp, &mut buf, &mut seen, |s| {
        s.iter()
            .any(|e| e.event == "run" && e.data["status"] == "completed")
    })
    .await;
    let q = entries(&seen, 2);
    assert_eq!(q.len(), 2, "sent when new and when it changed");
    assert_eq!(
        q[1]["result"]["output"],
        json!({"kind": "text", "text": "Ada"})
    );
    assert_eq!(entries(&seen, 3)[0]["text"], "Hello, Ada.");
    let done = seen.iter().rev().find(|e| e.event == "run").unwrap();
    assert_eq!(done.data["result"], "Hello, Ada.");
    assert_eq!(done.id, "3");

    // Resuming from a cursor sends only what comes after it.
    let mut resp = open(Some("2")).await.unwrap();
    let (mut buf, mut again) = (String::new(), Vec::new());
    read_until(&mut resp, &mut buf, &mut again, |s| {
        s.iter().any(|e| e.event == "run")
    })
    .await;
    let seqs: Vec<u64> = again
        .iter()
        .filter(|e| e.event == "entry")
        .map(|e| e.data["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [3]);

    // Someone else's run, or a bad cursor, is refused with JSON.
    let (code, v) = h.get("/runs/run_nope/stream").await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let r = open(Some("x")).await.unwrap();
    assert_eq!(r.status(), 400);

    // A host behind API Gateway does not stream: a JSON 501 says to poll.
    let app = baton_api::router(AppState {
        service: h.server.service.clone(),
        auth: Arc::new(BearerToken::new(TOKEN, "local")),
        streams: false,
        stop: None,
    });
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let (addr, _server) = baton_api::serve(app, "127.0.0.1:0".parse().unwrap(), rx)
        .await
        .unwrap();
    let r = h
        .http
        .get(format!("http://{addr}/runs/{run_id}/stream"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 501);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_streamed");
    // Stopping the server ends its open streams (a graceful stop does not wait for them).
    tokio::time::timeout(Duration::from_secs(10), h.server.shutdown())
        .await
        .expect("the server stops with streams open");
    assert!(matches!(resp.chunk().await, Ok(None) | Err(_)));
}

#[tokio::test]
async fn the_console_is_served_from_the_binary_without_sign_in() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), SCRIPT).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = http.get(h.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/console");
    for (path, kind, has) in [
        ("/console", "text/html", "console.js"),
        ("/console/console.js", "text/javascript", "answerForm"),
        ("/console/console.css", "text/css", "--accent"),
    ] {
        let r = http.get(h.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let headers = r.headers().clone();
        assert!(
            headers["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        assert!(
            headers["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("script-src 'self'"),
            "{path}"
        );
        assert!(r.text().await.unwrap().contains(has), "{path}");
    }
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_one_time_link_answers_its_cta_once_without_sign_in() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), SCRIPT).await;
    let run_id = h.create_run(json!({"prompt": "greet me"})).await;
    let cta = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The owner mints it; its URL opens the console's link page on this server.
    let (code, v) = h.post(&format!("/ctas/{cta}/link"), json!({})).await;
    assert_eq!(code, 200, "{v}");
    let url = v["url"].as_str().unwrap();
    let prefix = format!("{}/console#/link/", h.url(""));
    let token = url.strip_prefix(&prefix).expect("the console's link page");
    // The cta.request event carries a link for the same CTA.
    let (_, events) = h.get("/events?limit=100").await;
    let request = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["detailType"] == "cta.request")
        .unwrap()
        .clone();
    assert!(
        request["detail"]["link"]
            .as_str()
            .unwrap()
            .starts_with(&prefix)
    );
    let guest = reqwest::Client::new();
    let call = async |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut rb = guest.request(method, h.url(path));
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let code = r.status().as_u16();
        (code, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    // Opened without a token: the question, not whose it is.
    let (code, v) = call(reqwest::Method::GET, &format!("/links/{token}"), None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["prompt"], "Name?");
    for private in ["owner", "runId", "linkNonce", "toolCallId"] {
        assert!(v.get(private).is_none(), "{private}: {v}");
    }
    // A tampered token, or one cut short, answers nothing.
    let mac = token.rfind('.').unwrap() + 1;
    let swap = if &token[mac..=mac] == "A" { "B" } else { "A" };
    let tampered = format!("{}{swap}{}", &token[..mac], &token[mac + 1..]);
    for bad in [tampered.as_str(), &token[..token.len() / 2], "x"] {
        let (code, v) = call(
            reqwest::Method::POST,
            &format!("/links/{bad}/response"),
            Some(json!({"kind": "text", "text": "Mallory"})),
        )
        .await;
        assert_eq!(
            (code, v["error"]["code"].as_str()),
            (403, Some("link_invalid"))
        );
    }
    // An answer of another kind is refused (409) and the link still works; then it answers,
    // once.
    let answer = |text: &str| Some(json!({"kind": "text", "text": text}));
    let path = format!("/links/{token}/response");
    let (code, _) = call(
        reqwest::Method::POST,
        &path,
        Some(json!({"kind": "approval", "approved": true})),
    )
    .await;
    assert_eq!(code, 409);
    let (code, v) = call(reqwest::Method::POST, &path, answer("Ada")).await;
    assert_eq!(code, 202, "{v}");
    for method in [reqwest::Method::POST, reqwest::Method::GET] {
        let body =
            (method == reqwest::Method::POST).then(|| json!({"kind": "text", "text": "Eve"}));
        let p = if body.is_some() {
            path.clone()
        } else {
            format!("/links/{token}")
        };
        let (code, v) = call(method, &p, body).await;
        assert_eq!(
            (code, v["error"]["code"].as_str()),
            (409, Some("link_used")),
            "{v}"
        );
    }
    let done = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(done["result"], "Hello, Ada.");
    let (_, c) = h.get(&format!("/ctas/{cta}")).await;
    assert_eq!(c["responder"], "link");
    // No link for a question already settled.
    let (code, v) = h.post(&format!("/ctas/{cta}/link"), json!({})).await;
    assert_eq!(code, 409, "{v}");
    h.server.shutdown().await;
}

#[tokio::test]
async fn the_openapi_document_is_served_and_names_this_deployments_agents() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), SCRIPT).await;
    // No sign-in needed.
    let r = reqwest::get(h.url("/openapi.json")).await.unwrap();
    assert_eq!(r.status(), 200);
    let doc: Value = r.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/runs",
        "/runs/{runId}",
        "/runs/{runId}/timeline",
        "/runs/{runId}/stream",
        "/runs/{runId}/files/{fileId}",
        "/ctas",
        "/ctas/{ctaId}/response",
        "/ctas/{ctaId}/link",
        "/links/{token}/response",
    ] {
        assert!(doc["paths"][path].is_object(), "{path}");
    }
    let schemas = &doc["components"]["schemas"];
    let agents = &schemas["CreateRunBody"]["properties"]["agent"]["anyOf"][0]["enum"];
    assert!(
        agents.as_array().unwrap().contains(&json!("orchestrator")),
        "{agents}"
    );
    // Generated from the types: the timeline's entry kinds are all there.
    let entry = schemas["Entry"].to_string();
    for kind in ["user", "assistant", "tool", "widget", "file", "notice"] {
        assert!(entry.contains(&format!("\"{kind}\"")), "{kind}");
    }
    h.server.shutdown().await;
}
