//! `baton dev`'s API as a client meets it: authentication and clear 4xx answers for bad
//! input, idempotency keys, odd cursors, paths and methods, and a run's pages (of its
//! timeline, of the questions) within what Lambda can return.

use crate::common;
use baton_core::ports::RunWrites;

use common::*;
use serde_json::{Value, json};

#[tokio::test]
async fn requests_are_authenticated_and_bad_input_is_a_clear_4xx() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), r#"{"orchestrator": [{"text": "hi"}]}"#).await;
    let (code, v) = {
        let r = h.http.get(h.url("/health")).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!((code, v["status"].as_str()), (200, Some("ok")));
    for auth in [None, Some("Bearer wrong"), Some("Basic dGVzdA==")] {
        let mut rb = h.http.get(h.url("/ctas"));
        if let Some(a) = auth {
            rb = rb.header("authorization", a);
        }
        let r = rb.send().await.unwrap();
        assert_eq!(r.status(), 401);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "unauthorized");
    }
    let cases: Vec<(reqwest::Method, &str, Option<Value>, u16)> = vec![
        (reqwest::Method::POST, "/runs", Some(json!({})), 400),
        (
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": "x", "agent": "nobody"})),
            400,
        ),
        (
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": "x", "colour": "red"})),
            400,
        ),
        (
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": 7})),
            400,
        ),
        (
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": "x".repeat(300 * 1024)})),
            413,
        ),
        // `metadata` is at most 4 KB: it is rewritten with the run item at every step.
        (
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": "x", "metadata": {"note": "m".repeat(8 * 1024)}})),
            400,
        ),
        (reqwest::Method::GET, "/runs/run_missing", None, 404),
        (
            reqwest::Method::GET,
            "/runs/run_missing/timeline",
            None,
            404,
        ),
        (reqwest::Method::POST, "/runs/run_missing/cancel", None, 404),
        (
            reqwest::Method::POST,
            "/runs/run_missing/messages",
            Some(json!({"text": "hi"})),
            404,
        ),
        (reqwest::Method::GET, "/ctas?status=bogus", None, 400),
        (reqwest::Method::GET, "/ctas/cta_missing", None, 404),
        (reqwest::Method::GET, "/nowhere", None, 404),
        (reqwest::Method::DELETE, "/runs", None, 405),
    ];
    for (method, path, body, want) in cases {
        let (code, v) = h.call(method.clone(), path, body).await;
        assert_eq!(code, want, "{method} {path}: {v}");
        assert!(
            v["error"]["code"].is_string() && v["error"]["message"].is_string(),
            "{method} {path}: {v}"
        );
    }
    // None of that created anything.
    assert!(h.server.store.events_after(0, 10).await.unwrap().is_empty());
    assert_eq!(h.server.store.queue_depth().await.unwrap(), 0);
    // The refusal says which field and its bound; metadata within it is kept.
    let (code, v) = h
        .call(
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": "x", "metadata": {"note": "m".repeat(8 * 1024)}})),
        )
        .await;
    assert_eq!(code, 400);
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`metadata`") && message.contains("4096"),
        "{message}"
    );
    let (code, v) = h
        .call(
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": "x", "metadata": {"note": "m".repeat(3 * 1024)}})),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    h.server.shutdown().await;
}

#[tokio::test]
async fn idempotency_keys_return_the_first_run() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), r#"{"orchestrator": [{"text": "hi"}]}"#).await;
    let send = |key: &'static str| {
        h.http
            .post(h.url("/runs"))
            .bearer_auth(TOKEN)
            .header("idempotency-key", key)
            .json(&json!({"prompt": "once"}))
            .send()
    };
    let a: Value = send("k1").await.unwrap().json().await.unwrap();
    let b: Value = send("k1").await.unwrap().json().await.unwrap();
    let c: Value = send("k2").await.unwrap().json().await.unwrap();
    assert_eq!(a["runId"], b["runId"]);
    assert_ne!(a["runId"], c["runId"]);
    let run = h
        .wait_status(a["runId"].as_str().unwrap(), &["completed"])
        .await;
    assert_eq!(of_type(&run, "assistant").len(), 1, "the run ran once");
    h.server.shutdown().await;
}

#[tokio::test]
async fn odd_cursors_paths_and_methods_get_json_errors_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), r#"{"explore": [{"text": "done"}]}"#).await;
    let run_id = h
        .create_run(json!({"prompt": "go", "agent": "explore"}))
        .await;
    h.wait_status(&run_id, &["completed"]).await;
    // A cursor past every seq is past every entry (it used to wrap to -1: everything).
    for after in [
        "18446744073709551615",
        "9223372036854775807",
        "9223372036854775808",
    ] {
        let (code, page) = h
            .get(&format!("/runs/{run_id}/timeline?after={after}"))
            .await;
        assert_eq!(code, 200, "{page}");
        assert_eq!(page["entries"], json!([]), "after={after}");
    }
    // A path segment that is not UTF-8: a JSON 400.
    let r = h
        .http
        .get(h.url("/runs/%FF%FE"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_request", "{v}");
    // A wrong method on the local-only /events route: a JSON 405.
    let r = h
        .http
        .put(h.url("/events"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_long_run_shows_its_first_hundred_entries_and_pages_on_from_there() {
    let dir = tempfile::tempdir().unwrap();
    // 60 echo calls, then an answer and the turn's usage: 3 + 2 × 60 = 123 entries.
    let mut replies: Vec<Value> = (0..60)
        .map(|i| json!({"tool_calls": [{"name": "echo", "arguments": {"text": format!("call {i}")}}]}))
        .collect();
    replies.push(json!({"text": "all done"}));
    let script = json!({"long": replies, "short": [{"text": "hi"}]}).to_string();
    let catalog = catalog(Some(json!({"agents": {
        "long": {"system": "Echo.", "tools": ["echo"], "maxIterations": 61,
                 "maxToolCallsPerTurn": 61},
        "short": {"system": "Greet.", "tools": []}}})));
    let h = start(dir.path(), scripted(&script), catalog).await;
    let run_id = h.create_run(json!({"prompt": "go", "agent": "long"})).await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    let first = run["timeline"].as_array().unwrap();
    assert_eq!(
        first.len(),
        100,
        "GET /runs/{{id}} reads 100 entries at most"
    );
    assert_eq!(first[99]["seq"], 99);
    assert_eq!(run["timelineNext"], 99);
    assert_eq!(run["result"], "all done");

    let (code, rest) = h
        .get(&format!("/runs/{run_id}/timeline?after=99&limit=100"))
        .await;
    assert_eq!(code, 200, "{rest}");
    let rest = rest["entries"].as_array().unwrap();
    assert_eq!(rest.len(), 23);
    assert_eq!(rest[0]["seq"], 100);
    assert_eq!(rest[22]["seq"], 122);

    // A short run has no cursor: its whole timeline is there.
    let short = h
        .create_run(json!({"prompt": "hi", "agent": "short"}))
        .await;
    let short = h.wait_status(&short, &["completed"]).await;
    assert!(short.get("timelineNext").is_none(), "{short:#}");
    h.server.shutdown().await;
}

/// `GET /ctas` comes in pages (`limit`, then `cursor` from `nextCursor`), oldest first, each
/// CTA with what an inbox shows of its run (agent, prompt): no request per CTA. A `limit`
/// out of range or a cursor the API did not give is a 400 that says so.
#[tokio::test]
async fn the_ctas_come_in_pages_with_their_runs_agent_and_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let asks = r#"{"ops": [{"tool_calls": [{"name": "request_human_feedback",
        "arguments": {"kind": "approval", "message": "ok?"}}]}]}"#;
    let h = start(
        dir.path(),
        scripted(asks),
        catalog(Some(
            json!({"agents": {"ops": {"tools": ["request_human_feedback"]}}}),
        )),
    )
    .await;
    let mut runs = Vec::new();
    for (n, prompt) in ["first", "second", "third"].into_iter().enumerate() {
        runs.push(
            h.create_run(json!({"prompt": prompt, "agent": "ops"}))
                .await,
        );
        h.wait_pending(n + 1).await;
    }
    let (code, page) = h.get("/ctas?status=pending&limit=2").await;
    assert_eq!(code, 200, "{page}");
    let ctas = page["ctas"].as_array().unwrap();
    assert_eq!(ctas.len(), 2);
    assert_eq!(ctas[0]["runId"], runs[0].as_str());
    assert_eq!(ctas[0]["agent"], "ops");
    assert_eq!(ctas[0]["runPrompt"], "first");
    assert_eq!(ctas[1]["runPrompt"], "second");
    let cursor = page["nextCursor"].as_str().expect("a next page").to_owned();
    let (code, page) = h
        .get(&format!("/ctas?status=pending&limit=2&cursor={cursor}"))
        .await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(page["ctas"].as_array().unwrap().len(), 1);
    assert_eq!(page["ctas"][0]["runPrompt"], "third");
    assert!(page.get("nextCursor").is_none(), "{page}");
    // Under one top-level run.
    let (_, page) = h
        .get(&format!("/ctas?status=pending&rootRunId={}", runs[1]))
        .await;
    assert_eq!(page["ctas"].as_array().unwrap().len(), 1);
    assert_eq!(page["ctas"][0]["runId"], runs[1].as_str());

    for (query, code, says) in [
        ("limit=0", 400, "`limit` must be between 1 and 100"),
        ("limit=101", 400, "`limit` must be between 1 and 100"),
        ("limit=x", 400, "`limit` must be a non-negative integer"),
        (
            "cursor=nope",
            404,
            "`cursor` names no page of CTAs: pass a page's `nextCursor`",
        ),
    ] {
        let (got, v) = h.get(&format!("/ctas?{query}")).await;
        assert_eq!(got, code, "{query}: {v}");
        assert_eq!(v["error"]["message"], says, "{query}");
    }
    // A position among pending CTAs is after every answered one and before every
    // pending one: the pages of another status are empty, or whole.
    let (_, page) = h
        .get(&format!("/ctas?status=answered&cursor={cursor}"))
        .await;
    assert_eq!(page["ctas"], json!([]));
    let (_, page) = h
        .get(&format!("/ctas?status=pending&cursor={cursor}"))
        .await;
    assert_eq!(page["ctas"].as_array().unwrap().len(), 1);

    // The runs come in pages too, newest first, each with its prompt and where it stands.
    let (code, page) = h.get("/runs?limit=2").await;
    assert_eq!(code, 200, "{page}");
    let listed: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [runs[2].as_str(), runs[1].as_str()]);
    assert_eq!(page["runs"][0]["prompt"], "third");
    assert_eq!(page["runs"][0]["status"], "waiting");
    assert_eq!(page["runs"][0]["agent"], "ops");
    let cursor = page["nextCursor"].as_str().expect("a next page of runs");
    let (code, page) = h.get(&format!("/runs?limit=2&cursor={cursor}")).await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(page["runs"].as_array().unwrap().len(), 1);
    assert_eq!(page["runs"][0]["runId"], runs[0].as_str());
    assert!(page.get("nextCursor").is_none(), "{page}");
    for (query, code, says) in [
        ("limit=0", 400, "`limit` must be between 1 and 100"),
        ("limit=101", 400, "`limit` must be between 1 and 100"),
        (
            "cursor=nope",
            404,
            "`cursor` names no page of runs: pass a page's `nextCursor`",
        ),
    ] {
        let (got, v) = h.get(&format!("/runs?{query}")).await;
        assert_eq!(got, code, "{query}: {v}");
        assert_eq!(v["error"]["message"], says, "{query}");
    }
    h.server.shutdown().await;
}

/// `GET /runs/{id}` and its timeline's pages fit Lambda's 6 MB reply as Lambda counts it:
/// the body is a string inside the reply's JSON, where every quote and backslash is escaped
/// again. Entries made of quotes (a tool's JSON output) take twice their JSON there; pages of
/// them stay under 6 MB, and page on to the last entry.
#[tokio::test]
async fn every_page_of_a_run_fits_lambdas_6_mb_reply_however_its_text_escapes() {
    use baton_core::run::{NewRun, Run};
    use baton_core::timeline::{Entry, EntryBody};
    let dir = tempfile::tempdir().unwrap();
    {
        let store = baton_local::store::LocalStore::open(dir.path()).unwrap();
        let mut run = Run::new(NewRun::top_level(
            "run_quotes",
            "orchestrator",
            "local",
            chrono::Utc::now(),
        ));
        run.status = baton_core::run::RunStatus::Completed;
        // 150 entries of 60 KB of quotes and backslashes: 18 MB as the envelope counts them.
        let text = "\"\\".repeat(30 * 1024);
        let entries: Vec<Entry> = (0..150)
            .map(|seq| Entry {
                seq,
                at: chrono::Utc::now(),
                body: EntryBody::user(text.clone()),
            })
            .collect();
        run.next_seq = entries.len() as u64;
        store
            .create_run(&run, &entries, &[], None, None)
            .await
            .unwrap();
    }
    let h = start_scripted(dir.path(), r#"{"orchestrator": []}"#).await;
    let enveloped = |body: &str| serde_json::to_string(body).unwrap().len();
    let r = h
        .http
        .get(h.url("/runs/run_quotes"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert!(
        enveloped(&body) < 6 * 1024 * 1024,
        "{} bytes",
        enveloped(&body)
    );
    let run: Value = serde_json::from_str(&body).unwrap();
    let mut seen = run["timeline"].as_array().unwrap().len();
    assert!(seen > 0 && seen < 150, "{seen} entries in the first page");
    let mut next = run["timelineNext"].as_u64().expect("more to page");
    let mut pages = 1;
    while seen < 150 {
        let r = h
            .http
            .get(h.url(&format!("/runs/run_quotes/timeline?after={next}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        let body = r.text().await.unwrap();
        assert!(
            enveloped(&body) < 6 * 1024 * 1024,
            "{} bytes",
            enveloped(&body)
        );
        let page: Value = serde_json::from_str(&body).unwrap();
        let entries = page["entries"].as_array().unwrap();
        assert!(!entries.is_empty());
        assert_eq!(entries[0]["seq"], next + 1);
        seen += entries.len();
        next = page["next"].as_u64().unwrap();
        pages += 1;
    }
    assert_eq!(next, 149);
    assert!(pages >= 4, "{pages} pages for 18 MB");
    h.server.shutdown().await;
}
