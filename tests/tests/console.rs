//! The console's server side: its assets, `GET /runs/{id}/stream` (Server-Sent Events)
//! followed over real HTTP, resumed with `Last-Event-ID` from any event with no gap and no
//! repeat, ended after the `run` event of a run at rest (unless `follow=true`), and refused
//! with a JSON 501 by a host that does not stream (the `api` function behind API Gateway);
//! and one-time answer links, on `baton dev` and on `baton dev --aws`, saying why a link to a
//! settled question opens no form.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_api::{AppState, BearerToken};
use baton_core::ports::ManualClock;
use baton_dev::{AwsDevOptions, AwsDevServer};
use common::aws::Emulator;
use common::sse::*;
use common::*;
use serde_json::{Value, json};

const SCRIPT: &str = r#"{"orchestrator": [
  {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Name?"}}]},
  {"text": "Hello, Ada."}]}"#;

/// Reads a stream to its end: it must end by itself within 20 s.
async fn read_to_end(mut resp: reqwest::Response) -> Vec<Sse> {
    let (mut buf, mut seen) = (String::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, resp.chunk())
            .await
            .unwrap_or_else(|_| panic!("the stream stayed open after {} events", seen.len()))
            .unwrap();
        let Some(chunk) = chunk else { break };
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        frames(&mut buf, &mut seen);
    }
    assert!(buf.trim().is_empty(), "a cut frame: {buf:?}");
    seen
}

/// The seqs of a stream's `entry` events, in order.
fn seqs(seen: &[Sse]) -> Vec<u64> {
    seen.iter()
        .filter(|e| e.event == "entry")
        .map(|e| e.data["seq"].as_u64().unwrap())
        .collect()
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
    let open = |query: &str, last: Option<&str>| {
        let mut rb = h
            .http
            .get(h.url(&format!("/runs/{run_id}/stream{query}")))
            .bearer_auth(TOKEN);
        if let Some(id) = last {
            rb = rb.header("Last-Event-ID", id);
        }
        rb.send()
    };
    // Without `follow`, the stream of a run waiting on an answer ends after its `run` event.
    let parked = read_to_end(open("", None).await.unwrap()).await;
    assert_eq!(seqs(&parked), [0, 1, 2]);
    let last = parked.last().unwrap();
    assert_eq!(
        (last.event.as_str(), &last.data["status"]),
        ("run", &json!("waiting"))
    );
    let mut resp = open("?follow=true", None).await.unwrap();
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
    // Each entry's id is its own seq, but the cursor stops before the entry that may still
    // change.
    let ids: Vec<&str> = seen.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["0", "1", "1", "1"]);
    // `follow=true` keeps the stream of the waiting run open: the answer comes down it.
    tokio::time::sleep(Duration::from_millis(600)).await;
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
    assert_eq!(
        entries(&seen, 4)[0]["type"],
        "usage",
        "the turn's usage, last"
    );
    assert_eq!(done.id, "4");

    // Resuming from a cursor sends only what comes after it, then the run, and ends.
    let again = read_to_end(open("", Some("2")).await.unwrap()).await;
    assert_eq!(seqs(&again), [3, 4]);
    assert_eq!(again.last().unwrap().event, "run");

    // Someone else's run, a bad cursor or a bad `follow` is refused with JSON.
    let (code, v) = h.get("/runs/run_nope/stream").await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let r = open("", Some("x")).await.unwrap();
    assert_eq!(r.status(), 400);
    let (code, v) = h.get(&format!("/runs/{run_id}/stream?follow=yes")).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );

    // A host behind API Gateway does not stream: a JSON 501 says to poll.
    let app = baton_api::router(AppState {
        service: h.server.service.clone(),
        auth: Arc::new(BearerToken::new(TOKEN, "local")),
        streams: false,
        stop: None,
        live: None,
        watchers: None,
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
    // The followed stream is still open on the completed run; stopping the server ends it
    // (a graceful stop does not wait for open streams).
    let still = tokio::time::timeout(Duration::from_millis(600), resp.chunk()).await;
    assert!(still.is_err(), "a followed stream stays open: {still:?}");
    tokio::time::timeout(Duration::from_secs(10), h.server.shutdown())
        .await
        .expect("the server stops with streams open");
    assert!(matches!(resp.chunk().await, Ok(None) | Err(_)));
}

/// Tool calls in one reply: their run has 1,203 entries, more than a poll's page (1,000).
const MANY: usize = 1200;

const LIVE_SCRIPT: &str = r#"{"watcher": [
  {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Look?"}}]},
  {"text": "Checking the logs first.", "tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]},
  {"text": "All clear: nothing failed overnight."}]}"#;

#[tokio::test]
async fn a_watched_run_streams_its_reply_and_its_tools_before_they_commit() {
    let dir = tempfile::tempdir().unwrap();
    let agents = json!({"agents": {"watcher": {"tools": ["request_human_feedback", "echo"]}}});
    let h = start(dir.path(), scripted(LIVE_SCRIPT), catalog(Some(agents))).await;
    let run_id = h
        .create_run(json!({"prompt": "anything overnight?", "agent": "watcher"}))
        .await;
    let cta = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    // Watched from here: the run is parked, so every think after the answer is watched.
    let mut resp = h.follow(&run_id).await;
    let (mut buf, mut seen) = (String::new(), Vec::new());
    read_until(&mut resp, &mut buf, &mut seen, |s| {
        s.iter()
            .any(|e| e.event == "run" && e.data["status"] == "waiting")
    })
    .await;
    assert!(seen.iter().all(|e| e.event == "entry" || e.event == "run"));
    h.post(
        &format!("/ctas/{cta}/response"),
        json!({"kind": "approval", "approved": true}),
    )
    .await;
    read_until(&mut resp, &mut buf, &mut seen, |s| {
        s.iter()
            .any(|e| e.event == "run" && e.data["status"] == "completed")
    })
    .await;
    let at = |pred: &dyn Fn(&Sse) -> bool| seen.iter().position(pred);
    let entry_at = |ty: &str, text: &str| {
        at(&|e: &Sse| e.event == "entry" && e.data["type"] == ty && e.data["text"] == text)
            .unwrap_or_else(|| panic!("no {ty} entry {text:?}: {seen:#?}"))
    };
    // Each reply came word by word, at the seq its entry took, before that entry was sent.
    for text in [
        "Checking the logs first.",
        "All clear: nothing failed overnight.",
    ] {
        let entry = entry_at("assistant", text);
        let seq = seen[entry].data["seq"].as_u64().unwrap();
        let (streamed, last) = streamed(&seen, seq);
        assert_eq!(streamed, text);
        assert!(last.unwrap() < entry, "deltas after their entry: {seen:#?}");
        let pieces = seen
            .iter()
            .filter(|e| e.event == "delta" && e.data["seq"] == seq);
        let attempts: std::collections::HashSet<&Value> =
            pieces.map(|e| &e.data["attempt"]).collect();
        assert_eq!(attempts.len(), 1, "one attempt");
        assert!(
            seen.iter().all(|e| e.event != "delta" || e.id.is_empty()),
            "live events carry no id"
        );
    }
    // The model's tool call, as it wrote it; the call starting, then finishing, before its
    // entry came with the result. (Its entry was committed with the reply first, due to
    // run; the stream reads commits every 250 ms, so it may show after the live events.)
    let call = at(&|e: &Sse| e.event == "tool_call_delta" && e.data["name"] == "echo").unwrap();
    let due = at(&|e: &Sse| {
        e.event == "entry"
            && e.data["name"] == "echo"
            && e.data["result"] == json!({"status": "pending", "reason": "executing"})
    })
    .unwrap_or_else(|| panic!("no due echo entry: {seen:#?}"));
    assert_eq!(seen[due].data["effects"], "none");
    let started = at(&|e: &Sse| e.event == "tool_started")
        .unwrap_or_else(|| panic!("no tool_started: {seen:#?}"));
    let finished = at(&|e: &Sse| e.event == "tool_finished").expect("tool_finished");
    let tool_entry = at(&|e: &Sse| {
        e.event == "entry" && e.data["name"] == "echo" && e.data["result"]["status"] == "success"
    })
    .unwrap_or_else(|| panic!("no echo entry: {seen:#?}"));
    assert!(
        call < started && started < finished && finished < tool_entry && due < tool_entry,
        "{seen:#?}"
    );
    assert_eq!(seen[started].data["tool"], "echo");
    assert_eq!(seen[started].data["inputPreview"], r#"{"text":"hi"}"#);
    assert_eq!(seen[finished].data["ok"], true);
    assert!(seen[finished].data["durationMs"].is_u64());
    assert_eq!(seen[started].data["callId"], seen[tool_entry].data["id"]);
    // The records: how long the tool ran; how long the model took, and (streamed) until
    // its first piece. The question's answer was no tool run: it has no duration.
    assert!(
        seen[tool_entry].data["durationMs"].is_u64(),
        "{:#?}",
        seen[tool_entry]
    );
    let reply = &seen[entry_at("assistant", "Checking the logs first.")].data;
    let (total, first) = (
        reply["latencyMs"].as_u64().unwrap(),
        reply["firstTokenMs"].as_u64().unwrap(),
    );
    assert!(
        first <= total && total >= 60,
        "3 words 20 ms apart: {reply}"
    );
    let asked = seen
        .iter()
        .rev()
        .find(|e| e.event == "entry" && e.data["name"] == "request_human_feedback")
        .unwrap();
    assert!(asked.data.get("durationMs").is_none(), "{:#?}", asked);
    // The run's first think came before anyone watched: timed, not streamed.
    let (_, run) = h.get(&format!("/runs/{run_id}")).await;
    let first_reply = &run["timeline"][1];
    assert_eq!(first_reply["type"], "assistant");
    assert!(
        first_reply["latencyMs"].is_u64() && first_reply.get("firstTokenMs").is_none(),
        "{first_reply}"
    );
    // What the step was doing, with its details.
    let thinking = at(&|e: &Sse| e.event == "state" && e.data["state"] == "thinking").unwrap();
    assert!(thinking < call);
    assert_eq!(seen[thinking].data["detail"]["iteration"], 1);
    assert_eq!(seen[thinking].data["runId"], run_id.as_str());
    let executing =
        at(&|e: &Sse| e.event == "state" && e.data["state"] == "executing_tools").unwrap();
    assert!(call < executing && executing < started);
    assert_eq!(seen[executing].data["detail"]["tools"], json!(["echo"]));
    // The run events carry what the run waits on: the question, by id.
    let waiting = seen
        .iter()
        .find(|e| e.event == "run" && e.data["status"] == "waiting")
        .unwrap();
    assert_eq!(waiting.data["stateDetail"]["ctaIds"], json!([cta]));
}

#[tokio::test]
async fn a_finished_runs_stream_resumes_from_any_event_with_no_gap_and_no_repeat() {
    let dir = tempfile::tempdir().unwrap();
    // One reply of 1,200 calls (each gets its tool entry), then the answer.
    let calls: Vec<Value> = (0..MANY)
        .map(|i| json!({"name": "nope", "arguments": {"i": i}}))
        .collect();
    let script = json!({"orchestrator": [{"tool_calls": calls}, {"text": "Done."}]});
    let h = start_scripted(dir.path(), &script.to_string()).await;
    let run_id = h.create_run(json!({"prompt": "call a lot"})).await;
    h.wait_status(&run_id, &["completed"]).await;
    // The timeline goes on past the first page of a poll.
    let (_, tail) = h.get(&format!("/runs/{run_id}/timeline?after=1000")).await;
    assert!(!tail["entries"].as_array().unwrap().is_empty(), "{tail}");
    let n = tail["next"].as_u64().unwrap() + 1;
    assert_eq!(
        n,
        MANY as u64 + 5,
        "the prompt, the reply, its calls, the tool-call cap's error, the answer, the turn's usage"
    );
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

    // The whole stream: every entry once, in order, each with its own seq as its id; then
    // the run, with the last seq; then the stream ends by itself.
    let all = read_to_end(open(None).await.unwrap()).await;
    assert_eq!(seqs(&all), (0..n).collect::<Vec<_>>());
    for e in all.iter().filter(|e| e.event == "entry") {
        assert_eq!(e.id, e.data["seq"].to_string());
    }
    let last = all.last().unwrap();
    assert_eq!(last.event, "run");
    assert_eq!(last.data["status"], "completed");
    assert_eq!(last.id, (n - 1).to_string());
    assert_eq!(all.iter().filter(|e| e.event == "run").count(), 1);

    // Cut after k events (the first; mid-page; at the page's edge; in the second page),
    // then resumed from the last id read: exactly the rest, no gap, no repeat.
    for k in [1, 2, 537, 999, 1000, 1001, 1150] {
        let mut resp = open(None).await.unwrap();
        let (mut buf, mut seen) = (String::new(), Vec::new());
        read_until(&mut resp, &mut buf, &mut seen, |s| s.len() >= k).await;
        drop(resp);
        let read = &seen[..k];
        let resumed = read_to_end(open(Some(&read[k - 1].id)).await.unwrap()).await;
        let mut got = seqs(read);
        got.extend(seqs(&resumed));
        assert_eq!(got, (0..n).collect::<Vec<_>>(), "cut after {k}");
        assert_eq!(resumed.last().unwrap().event, "run", "cut after {k}");
    }
    // Resumed from the run event's id: nothing more than the run.
    let resumed = read_to_end(open(Some(&last.id)).await.unwrap()).await;
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0].event, "run");
    h.server.shutdown().await;
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
        ("/console/runs.js", "text/javascript", "runsView"),
        ("/console/live.js", "text/javascript", "watchChannel"),
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
    // The cta.request event names the CTA and carries no link: a link answers for its owner,
    // and whoever may add a rule to the bus would read it there.
    let (_, events) = h.get("/events?limit=100").await;
    let request = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["detailType"] == "cta.request")
        .unwrap()
        .clone();
    assert_eq!(request["detail"]["ctaId"], cta.as_str());
    assert!(request["detail"].get("link").is_none(), "{request}");
    assert!(!request.to_string().contains(token), "{request}");
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
    // A link answers as the one it was minted for (here, the owner), through the link.
    assert_eq!(c["responder"], "local");
    // No link for a question already settled.
    let (code, v) = h.post(&format!("/ctas/{cta}/link"), json!({})).await;
    assert_eq!(code, 409, "{v}");
    h.server.shutdown().await;
}

/// The sentences the console's link page says for each refusal code (`LINK_REFUSED`).
fn link_page_sentences(js: &str) -> std::collections::HashMap<String, String> {
    let start = js
        .find("const LINK_REFUSED = new Map([")
        .expect("LINK_REFUSED");
    let table = &js[start..start + js[start..].find("]);").unwrap()];
    let row = regex::Regex::new(r#"\["(\w+)", "([^"]+)"\]"#).unwrap();
    row.captures_iter(table)
        .map(|c| (c[1].to_owned(), c[2].to_owned()))
        .collect()
}

#[tokio::test]
async fn a_link_to_a_settled_question_says_how_it_was_settled() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let h = start_at(dir.path(), scripted(SCRIPT), catalog(None), clock.clone()).await;
    // Four runs, each waiting on its question, each question with its link.
    let mut runs = Vec::new();
    for i in 0..4 {
        runs.push(h.create_run(json!({"prompt": format!("greet {i}")})).await);
    }
    let ctas = h.wait_pending(4).await;
    let mut tokens = Vec::new();
    let prefix = format!("{}/console#/link/", h.url(""));
    for run in &runs {
        let cta = ctas.iter().find(|c| c["runId"] == run.as_str()).unwrap();
        let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
        let (code, v) = h.post(&format!("/ctas/{cta_id}/link"), json!({})).await;
        assert_eq!(code, 200, "{v}");
        let token = v["url"].as_str().unwrap().strip_prefix(&prefix).unwrap();
        tokens.push((cta_id, token.to_owned()));
    }
    let guest = reqwest::Client::new();
    // What the link page reads, and what an answer through the link gets.
    let refusal = async |token: &str| {
        let mut out = Vec::new();
        for body in [None, Some(json!({"kind": "text", "text": "Eve"}))] {
            let r = match &body {
                None => guest.get(h.url(&format!("/links/{token}"))),
                Some(b) => guest
                    .post(h.url(&format!("/links/{token}/response")))
                    .json(b),
            };
            let r = r.send().await.unwrap();
            let code = r.status().as_u16();
            let v: Value = r.json().await.unwrap();
            out.push((code, v["error"]["code"].as_str().unwrap_or("").to_owned()));
        }
        assert_eq!(out[0], out[1], "the page and the answer say the same");
        out.remove(0)
    };
    let [answered, cancelled, expired, used] = &tokens[..] else {
        unreachable!()
    };
    // Answered through the API (not through the link): "already answered".
    let (code, v) = h
        .post(
            &format!("/ctas/{}/response", answered.0),
            json!({"kind": "text", "text": "Ada"}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    assert_eq!(refusal(&answered.1).await, (409, "cta_answered".into()));
    // Cancelled with its run: "cancelled".
    let (code, v) = h
        .post(&format!("/runs/{}/cancel", runs[1]), json!({}))
        .await;
    assert_eq!(code, 202, "{v}");
    h.wait_status(&runs[1], &["cancelled"]).await;
    assert_eq!(refusal(&cancelled.1).await, (409, "cta_cancelled".into()));
    // Answered through the link: "used".
    let r = guest
        .post(h.url(&format!("/links/{}/response", used.1)))
        .json(&json!({"kind": "text", "text": "Ada"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(refusal(&used.1).await, (409, "link_used".into()));
    // Thirty days later the last question expires: "expired". The others still say how
    // they were settled, past their expiry too.
    clock.advance(chrono::Duration::days(30) + chrono::Duration::seconds(1));
    h.wait_status(&runs[2], &["expired"]).await;
    assert_eq!(refusal(&expired.1).await, (410, "link_expired".into()));
    assert_eq!(refusal(&answered.1).await, (409, "cta_answered".into()));
    assert_eq!(refusal(&cancelled.1).await, (409, "cta_cancelled".into()));
    assert_eq!(refusal(&used.1).await, (409, "link_used".into()));
    // A tampered token is still not valid.
    let t = &expired.1;
    let mac = t.rfind('.').unwrap() + 1;
    let swap = if &t[mac..=mac] == "A" { "B" } else { "A" };
    let tampered = format!("{}{swap}{}", &t[..mac], &t[mac + 1..]);
    assert_eq!(refusal(&tampered).await, (403, "link_invalid".into()));

    // The console's link page has its own sentence for each of these codes; none says
    // the link is not valid, and no two say the same.
    let js = guest
        .get(h.url("/console/console.js"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let says = link_page_sentences(&js);
    for (code, has) in [
        ("cta_answered", "already answered"),
        ("cta_cancelled", "cancelled"),
        ("link_expired", "expired"),
        ("link_used", "already used"),
    ] {
        let words = says
            .get(code)
            .unwrap_or_else(|| panic!("no words for {code}"));
        assert!(words.contains(has), "{code}: {words}");
        assert!(!words.contains("not valid"), "{code}: {words}");
    }
    let distinct: std::collections::HashSet<_> = says.values().collect();
    assert_eq!(distinct.len(), says.len(), "{says:?}");
    h.server.shutdown().await;
}

#[tokio::test]
async fn baton_dev_aws_makes_one_time_links_when_given_a_key() {
    let aws = Emulator::start_with(None).await;
    let sdk = aws.sdk().await;
    // The same deployment (its table, queues and bus) on one port, started with a link
    // key or without one.
    let options = |addr: &str, links: Option<&str>| AwsDevOptions {
        addr: addr.parse().unwrap(),
        links: links.map(|key| (key.to_owned(), None)),
        ..AwsDevOptions::new(
            sdk.clone(),
            aws.names("links"),
            "arn:aws:iam::123456789012:role/links-scheduler",
            TOKEN,
            scripted(SCRIPT),
            catalog(None),
        )
    };
    let server = AwsDevServer::start(options("127.0.0.1:0", None))
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let base = server.url();
    let call = async |method: reqwest::Method, path: &str, body: Option<Value>, auth: bool| {
        let mut rb = http.request(method, format!("{base}{path}"));
        if auth {
            rb = rb.bearer_auth(TOKEN);
        }
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let code = r.status().as_u16();
        (code, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    let wait = async |what: &str, path: &str, ok: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, v) = call(reqwest::Method::GET, path, None, true).await;
            if ok(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let (code, v) = call(
        reqwest::Method::POST,
        "/runs",
        Some(json!({"prompt": "greet me"})),
        true,
    )
    .await;
    assert_eq!(code, 202, "{v}");
    let run_id = v["runId"].as_str().unwrap().to_owned();
    let ctas = wait("the question", "/ctas?status=pending", &|v| {
        v["ctas"].as_array().is_some_and(|c| !c.is_empty())
    })
    .await;
    let cta = ctas["ctas"][0]["ctaId"].as_str().unwrap().to_owned();
    let mint = format!("/ctas/{cta}/link");

    // Without BATON_LINK_KEY, links are off, and the refusal names what is missing.
    let (code, v) = call(reqwest::Method::POST, &mint, None, true).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("links_off"))
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("BATON_LINK_KEY"), "{message}");

    // Started again with a key too short, it refuses to start, naming the key; with one,
    // links point at this server (no public URL).
    let addr = server.addr.to_string();
    server.shutdown().await;
    let Err(refused) = AwsDevServer::start(options(&addr, Some("short"))).await else {
        panic!("a link key of 5 bytes is refused")
    };
    assert!(refused.to_string().contains("BATON_LINK_KEY"), "{refused}");
    let key = "a-link-key-of-at-least-thirty-two-bytes";
    let server = AwsDevServer::start(options(&addr, Some(key)))
        .await
        .unwrap();
    let (code, v) = call(reqwest::Method::POST, &mint, None, true).await;
    assert_eq!(code, 200, "{v}");
    let url = v["url"].as_str().unwrap();
    let token = url
        .strip_prefix(&format!("{base}/console#/link/"))
        .unwrap_or_else(|| panic!("{url}"))
        .to_owned();
    // The link works as on `baton dev`: it opens the question, answers once, then says so.
    let (code, v) = call(
        reqwest::Method::GET,
        &format!("/links/{token}"),
        None,
        false,
    )
    .await;
    assert_eq!((code, &v["prompt"]), (200, &json!("Name?")), "{v}");
    let answer = Some(json!({"kind": "text", "text": "Ada"}));
    let path = format!("/links/{token}/response");
    let (code, v) = call(reqwest::Method::POST, &path, answer.clone(), false).await;
    assert_eq!(code, 202, "{v}");
    let run = wait("the run's end", &format!("/runs/{run_id}"), &|v| {
        v["status"] == "completed"
    })
    .await;
    assert_eq!(run["result"], "Hello, Ada.");
    let (code, v) = call(reqwest::Method::POST, &path, answer, false).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("link_used"))
    );
    server.shutdown().await;
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
    // Money is bounded where it enters, and the document says so (a fuzzer holds the
    // server to it): from a millionth of a dollar to a million.
    let budget = &schemas["CreateRunBody"]["properties"]["budgetUsd"];
    assert_eq!(
        (&budget["minimum"], &budget["maximum"]),
        (&json!(0.000_001), &json!(1_000_000)),
        "{budget}"
    );
    let raise = &schemas["CtaResponse"]["oneOf"][0]["properties"]["raiseUsd"];
    assert_eq!(
        (&raise["minimum"], &raise["maximum"]),
        (&json!(0.000_001), &json!(1_000_000)),
        "{raise}"
    );
    // Generated from the types: the timeline's entry kinds are all there.
    let entry = schemas["Entry"].to_string();
    for kind in ["user", "assistant", "tool", "widget", "file", "notice"] {
        assert!(entry.contains(&format!("\"{kind}\"")), "{kind}");
    }
    h.server.shutdown().await;
}

/// `POST /runs` with `watch: true` (as `baton run --follow` and the console's "start a
/// run" send it): the run counts as watched from its creation, so the first reply of the
/// run streams to the stream opened right after — not only the replies after it.
#[tokio::test]
async fn a_run_started_to_be_watched_streams_its_first_reply() {
    const FIRST: &str = "Good morning: the build is green, the queue is empty, the canary held all night and nothing failed.";
    let dir = tempfile::tempdir().unwrap();
    let script = json!({"greeter": [{"text": FIRST}]}).to_string();
    let agents = json!({"agents": {"greeter": {"tools": []}}});
    let h = start(dir.path(), scripted(&script), catalog(Some(agents))).await;
    let run_id = h
        .create_run(json!({"prompt": "morning?", "agent": "greeter", "watch": true}))
        .await;
    let mut resp = h.follow(&run_id).await;
    let (mut buf, mut seen) = (String::new(), Vec::new());
    read_until(&mut resp, &mut buf, &mut seen, |s| {
        s.iter()
            .any(|e| e.event == "run" && e.data["status"] == "completed")
    })
    .await;
    let entry = seen
        .iter()
        .position(|e| e.event == "entry" && e.data["type"] == "assistant")
        .unwrap_or_else(|| panic!("no reply entry: {seen:#?}"));
    let seq = seen[entry].data["seq"].as_u64().unwrap();
    let (streamed, last) = streamed(&seen, seq);
    // Streamed from its first piece on, less what came before the stream opened.
    assert!(!streamed.is_empty(), "the first reply streamed: {seen:#?}");
    assert!(FIRST.ends_with(&streamed), "{streamed:?}");
    assert!(
        last.unwrap() < entry,
        "deltas before their entry: {seen:#?}"
    );
    h.server.shutdown().await;
}
