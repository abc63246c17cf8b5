//! End-to-end through the HTTP API, on the embedded store with the scripted model.

use crate::common;

use std::sync::Arc;

use baton_core::ports::{ManualClock, SystemClock};
use common::*;
use serde_json::{Value, json};

#[tokio::test]
async fn the_example_script_runs_to_completed_with_its_full_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), &examples("orchestrator.json")).await;
    let run_id = h
        .create_run(json!({"prompt": "Ship it", "sandboxId": "sb-1"}))
        .await;

    // The two explorers fan out and back in, then the run parks on the approval.
    let ctas = h.wait_pending(1).await;
    let cta = &ctas[0];
    assert_eq!(cta["kind"], "approval");
    assert_eq!(cta["message"], "Proceed?");
    assert_eq!(cta["runId"], run_id.as_str());
    assert_eq!(cta["status"], "pending");
    assert!(cta["expiresAt"].is_string());
    let parked = h.wait_status(&run_id, &["waiting"]).await;
    assert_eq!(parked["state"], "waiting_on_user");

    let (code, v) = h
        .post(
            &format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap()),
            json!({"kind": "approval", "approved": true}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    assert_eq!(v["status"], "answered");

    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(run["result"], "All done.");
    assert_eq!(run["sandboxId"], "sb-1");
    let types: Vec<&str> = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "usage"
        ]
    );
    let seqs: Vec<u64> = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..8).collect::<Vec<_>>());
    let tools = of_type(&run, "tool");
    for t in &tools[..2] {
        assert_eq!(t["name"], "spawn_subagent");
        assert_eq!(t["input"]["agent"], "explore");
        assert_eq!(t["result"]["status"], "success");
        assert_eq!(t["result"]["output"]["text"], "found it");
        assert_eq!(t["result"]["output"]["stepCount"], 1);
        let child = t["childRunId"].as_str().unwrap();
        assert_eq!(t["result"]["output"]["subagentId"], child);
        // Each child is a run of its own, linked to its parent.
        let (code, c) = h.get(&format!("/runs/{child}")).await;
        assert_eq!(code, 200);
        assert_eq!(c["status"], "completed");
        assert_eq!(c["parent"]["runId"], run_id.as_str());
        assert_eq!(c["sandboxId"], "sb-1", "children inherit the sandbox");
        assert_eq!(c["timeline"][0]["text"], t["input"]["prompt"]);
    }
    assert_eq!(tools[0]["input"]["prompt"], "map the repo");
    assert_eq!(tools[1]["input"]["prompt"], "list the tests");
    let approval = tools[2];
    assert_eq!(approval["name"], "request_human_feedback");
    assert_eq!(
        approval["result"],
        json!({"status": "success", "output": {"kind": "approval", "approved": true}})
    );
    assert_eq!(approval["cta"]["ctaId"], cta["ctaId"]);
    assert_eq!(approval["cta"]["status"], "answered");
    assert!(h.pending_ctas().await.is_empty());

    // Events were published for UIs.
    let events: Vec<String> = h
        .server
        .store
        .events_after(0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.detail_type)
        .collect();
    for t in ["cta.request", "run.state", "run.completed"] {
        assert!(events.iter().any(|e| e == t), "{t} in {events:?}");
    }
    assert_eq!(
        events.iter().filter(|e| *e == "run.completed").count(),
        3,
        "two children and the parent"
    );

    // The local server serves the same events to pollers.
    let (code, page) = h.get("/events?after=0&limit=1000").await;
    assert_eq!(code, 200, "{page}");
    let listed: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["detailType"].as_str().unwrap())
        .collect();
    assert_eq!(listed, events);
    let request = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["detailType"] == "cta.request")
        .unwrap();
    assert_eq!(request["detail"]["ctaId"], cta["ctaId"]);
    assert_eq!(request["detail"]["message"], "Proceed?");
    let (code, later) = h.get(&format!("/events?after={}", page["next"])).await;
    assert_eq!((code, later["events"].as_array().unwrap().len()), (200, 0));
    assert_eq!(h.get("/events?after=x").await.0, 400);
    assert_eq!(
        h.http.get(h.url("/events")).send().await.unwrap().status(),
        401
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn the_full_flow_with_approval_and_choice_sums_usage() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), &examples("full-flow.json")).await;
    let run_id = h.create_run(json!({"prompt": "Fix and ship"})).await;

    let approval = h.wait_pending(1).await.remove(0);
    assert_eq!(approval["kind"], "approval");
    h.post(
        &format!("/ctas/{}/response", approval["ctaId"].as_str().unwrap()),
        json!({"kind": "approval", "approved": true, "reason": "looks right"}),
    )
    .await;

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let choice = loop {
        let ctas = h.pending_ctas().await;
        if let Some(c) = ctas.into_iter().find(|c| c["kind"] == "choice") {
            break c;
        }
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(
        choice["options"],
        json!([{"id": "staging", "label": "Staging"}, {"id": "prod", "label": "Production"}])
    );
    let (code, _) = h
        .post(
            &format!("/ctas/{}/response", choice["ctaId"].as_str().unwrap()),
            json!({"kind": "choice", "selectedId": "prod"}),
        )
        .await;
    assert_eq!(code, 202);

    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(
        run["usage"],
        json!({"inputTokens": 880, "outputTokens": 85, "totalTokens": 965})
    );
    assert_eq!(
        of_type(&run, "assistant")[0]["text"],
        "Two explorers first."
    );
    let tools = of_type(&run, "tool");
    assert_eq!(
        tools[2]["result"]["output"],
        json!({"kind": "approval", "approved": true, "reason": "looks right"})
    );
    assert_eq!(
        tools[3]["result"]["output"],
        json!({"kind": "choice", "selectedId": "prod"})
    );
    assert_eq!(
        tools[1]["result"]["output"]["totalUsage"]["totalTokens"],
        69
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_parked_run_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let script = examples("orchestrator.json");
    let h = start_scripted(dir.path(), &script).await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    let cta = h.wait_pending(1).await.remove(0);
    let before = h.wait_status(&run_id, &["waiting"]).await;
    h.server.shutdown().await;

    // A new process: nothing in memory, the same data dir.
    let h = start_scripted(dir.path(), &script).await;
    let (code, again) = h.get(&format!("/runs/{run_id}")).await;
    assert_eq!(code, 200);
    assert_eq!(again, before, "the parked run is exactly as it was");
    let (code, _) = h
        .post(
            &format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap()),
            json!({"kind": "approval", "approved": true}),
        )
        .await;
    assert_eq!(code, 202);
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(run["result"], "All done.");
    h.server.shutdown().await;
}

#[tokio::test]
async fn an_unanswered_cta_expires_and_ends_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let script = r#"{"orchestrator": [{"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Name?"}}]}]}"#;
    let h = start(dir.path(), scripted(script), catalog(None), clock.clone()).await;
    let run_id = h.create_run(json!({"prompt": "ask"})).await;
    let cta = h.wait_pending(1).await.remove(0);
    let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
    let created = chrono::DateTime::parse_from_rfc3339(cta["createdAt"].as_str().unwrap()).unwrap();
    let expires = chrono::DateTime::parse_from_rfc3339(cta["expiresAt"].as_str().unwrap()).unwrap();
    assert_eq!(expires - created, chrono::Duration::days(30));
    // Kept to the millisecond, rounded up.
    let set = h.server.store.timer(&cta_id).await.unwrap().expect("set");
    assert!(
        set >= expires && set - expires.to_utc() < chrono::Duration::milliseconds(1),
        "set for {set}, due {expires}"
    );

    // Thirty days and a second later, the timer fires.
    clock.advance(chrono::Duration::days(30) + chrono::Duration::seconds(1));
    let run = h.wait_status(&run_id, &["expired"]).await;
    assert_eq!(run["error"]["code"], "cta_expired");
    let tool = of_type(&run, "tool")[0];
    assert_eq!(tool["result"]["status"], "error");
    assert_eq!(tool["cta"]["status"], "expired");
    let (code, c) = h.get(&format!("/ctas/{cta_id}")).await;
    assert_eq!((code, c["status"].as_str()), (200, Some("expired")));
    // No default: its record has no answer.
    assert!(
        c.get("defaulted").is_none() && c.get("response").is_none(),
        "{c}"
    );
    assert_eq!(
        h.server.store.timer(&cta_id).await.unwrap(),
        None,
        "the timer is gone"
    );

    // A late answer is told so, and changes nothing.
    let (code, v) = h
        .post(
            &format!("/ctas/{cta_id}/response"),
            json!({"kind": "text", "text": "Ada"}),
        )
        .await;
    assert_eq!(code, 410, "{v}");
    assert_eq!(v["error"]["code"], "cta_expired");
    let (_, after) = h.get(&format!("/runs/{run_id}")).await;
    assert_eq!(after, run);
    h.server.shutdown().await;
}

/// An agent whose runs expire questions into their defaults (`onExpiry: "default"` in the
/// agents file): the question the model asked with a default takes it at expiry, the run
/// goes on, and what it was given, and why, is in its timeline and on the question.
#[tokio::test]
async fn a_question_with_a_default_expires_into_it_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let script = r#"{"orchestrator": [
        {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "choice",
            "prompt": "Which region?", "options": [{"id": "eu", "label": "EU"},
            {"id": "us", "label": "US"}], "default": {"selectedId": "eu"}}}]},
        {"text": "Deployed to the EU."}]}"#;
    let agents = json!({"agents": {"orchestrator": {"tools": ["request_human_feedback"],
        "onExpiry": "default"}}});
    let h = start(
        dir.path(),
        scripted(script),
        catalog(Some(agents)),
        clock.clone(),
    )
    .await;
    let run_id = h.create_run(json!({"prompt": "deploy"})).await;
    let (_, run) = h.get(&format!("/runs/{run_id}")).await;
    assert_eq!(run["onExpiry"], "default", "the agent's policy: {run}");
    let cta = h.wait_pending(1).await.remove(0);
    let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
    assert_eq!(
        cta["default"],
        json!({"kind": "choice", "selectedId": "eu"})
    );

    clock.advance(chrono::Duration::days(30) + chrono::Duration::seconds(1));
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(run["result"], "Deployed to the EU.");
    let tool = of_type(&run, "tool")[0];
    assert_eq!(tool["result"]["status"], "success", "{tool}");
    assert_eq!(tool["result"]["output"]["selectedId"], "eu");
    assert_eq!(tool["result"]["output"]["default"], true);
    assert_eq!(tool["cta"]["status"], "expired");
    assert_eq!(tool["cta"]["defaulted"], true);
    assert_eq!(tool["cta"]["response"]["selectedId"], "eu");
    let (code, c) = h.get(&format!("/ctas/{cta_id}")).await;
    assert_eq!((code, c["status"].as_str()), (200, Some("expired")));
    // The question's record says what its timeline's copy says.
    assert_eq!(c["defaulted"], true, "{c}");
    assert_eq!(c["response"], tool["cta"]["response"], "{c}");
    let (_, listed) = h.get("/ctas?status=expired").await;
    assert_eq!(listed["ctas"][0]["defaulted"], true, "{listed}");

    // A run may say otherwise: this one ends at its question's expiry, default or not.
    let run_id = h
        .create_run(json!({"prompt": "deploy", "onExpiry": "end"}))
        .await;
    let cta_id = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    clock.advance(chrono::Duration::days(30) + chrono::Duration::seconds(1));
    let run = h.wait_status(&run_id, &["expired"]).await;
    assert_eq!(run["error"]["code"], "cta_expired");
    let (_, c) = h.get(&format!("/ctas/{cta_id}")).await;
    assert_eq!(c["status"], "expired");
    assert!(
        c.get("defaulted").is_none() && c.get("response").is_none(),
        "{c}"
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn answers_are_validated_and_only_the_first_wins() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"orchestrator": [
        {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "choice", "prompt": "Which?", "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]}}]},
        {"text": "ok"}]}"#;
    let h = start_scripted(dir.path(), script).await;
    let run_id = h.create_run(json!({"prompt": "pick"})).await;
    let cta_id = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/ctas/{cta_id}/response");

    // An answer that does not fit this CTA is a 409 (the CTA is of another kind, or offers
    // no such option); a malformed one a 400; each with a JSON error, the CTA still pending.
    for body in [
        json!({"kind": "approval", "approved": true}),
        json!({"kind": "choice", "selectedId": "z"}),
    ] {
        let (code, v) = h.post(&path, body.clone()).await;
        assert_eq!(code, 409, "{body} → {v}");
        assert_eq!(v["error"]["code"], "answer_mismatch", "{v}");
    }
    let bad = [
        json!({"kind": "choice"}),
        json!({"kind": "vote", "selectedId": "a"}),
        json!({"kind": "choice", "selectedId": "a", "extra": 1}),
        json!("a"),
    ];
    for body in bad {
        let (code, v) = h.post(&path, body.clone()).await;
        assert_eq!(code, 400, "{body} → {v}");
        assert_eq!(v["error"]["code"], "invalid_request", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().len() > 5);
    }
    let raw = h
        .http
        .post(h.url(&path))
        .bearer_auth(TOKEN)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let (_, c) = h.get(&format!("/ctas/{cta_id}")).await;
    assert_eq!(c["status"], "pending");
    assert_eq!(
        h.get(&format!("/runs/{run_id}")).await.1["status"],
        "waiting"
    );

    // Unknown id: 404.
    let (code, v) = h
        .post(
            "/ctas/cta_nope/response",
            json!({"kind": "choice", "selectedId": "a"}),
        )
        .await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (404, Some("not_found"))
    );

    // The first valid answer wins; the second is told so at once.
    let (code, _) = h
        .post(&path, json!({"kind": "choice", "selectedId": "b"}))
        .await;
    assert_eq!(code, 202);
    let (code, v) = h
        .post(&path, json!({"kind": "choice", "selectedId": "a"}))
        .await;
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["error"]["code"], "cta_answered");
    // The answer that won, posted again (a client retrying after a lost reply), is
    // accepted again and changes nothing.
    let (code, v) = h
        .post(&path, json!({"kind": "choice", "selectedId": "b"}))
        .await;
    assert_eq!(code, 202, "{v}");
    assert_eq!(v["status"], "answered", "{v}");
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(
        of_type(&run, "tool")[0]["result"]["output"]["selectedId"],
        "b"
    );
    assert_eq!(of_type(&run, "tool").len(), 1, "one resolution: {run:#}");
    h.server.shutdown().await;
}

#[tokio::test]
async fn concurrent_answers_have_exactly_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"orchestrator": [{"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "?"}}]}, {"text": "ok"}]}"#;
    let h = start_scripted(dir.path(), script).await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    let cta_id = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/ctas/{cta_id}/response");
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (http, url) = (h.http.clone(), h.url(&path));
        set.spawn(async move {
            // Each answer its own (the same answer again would be that answer, accepted).
            let body =
                json!({"kind": "approval", "approved": i % 2 == 0, "reason": format!("#{i}")});
            http.post(url)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        });
    }
    let codes: Vec<u16> = set.join_all().await;
    assert_eq!(codes.iter().filter(|c| **c == 202).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 409).count(), 7, "{codes:?}");
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(
        of_type(&run, "assistant").len(),
        2,
        "the run resumed exactly once"
    );
    h.server.shutdown().await;
}

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
            Some(json!({"prompt": ""})),
            400,
        ),
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
async fn a_follow_up_message_starts_a_new_turn_and_timeline_paging_works() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(
        dir.path(),
        r#"{"explore": [{"text": "first"}, {"text": "second"}]}"#,
    )
    .await;
    let run_id = h
        .create_run(json!({"prompt": "one", "agent": "explore"}))
        .await;
    h.wait_status(&run_id, &["completed"]).await;
    let (code, v) = h
        .post(&format!("/runs/{run_id}/messages"), json!({"text": "two"}))
        .await;
    assert_eq!(code, 202, "{v}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let run = loop {
        let (_, run) = h.get(&format!("/runs/{run_id}")).await;
        if run["result"] == "second" {
            break run;
        }
        assert!(std::time::Instant::now() < deadline, "{run:#}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let texts: Vec<&str> = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["text"].as_str().or(e["type"].as_str()).unwrap())
        .collect();
    // Each turn ends with what it spent.
    assert_eq!(texts, ["one", "first", "usage", "two", "second", "usage"]);

    let (code, page) = h.get(&format!("/runs/{run_id}/timeline?after=1")).await;
    assert_eq!(code, 200);
    let seqs: Vec<u64> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [2, 3, 4, 5]);
    assert_eq!(page["next"], 5);
    let (_, page) = h.get(&format!("/runs/{run_id}/timeline?after=5")).await;
    assert!(page["entries"].as_array().unwrap().is_empty());
    let (code, _) = h.get(&format!("/runs/{run_id}/timeline?after=-1")).await;
    assert_eq!(code, 400);
    let (code, _) = h
        .post(&format!("/runs/{run_id}/messages"), json!({"text": ""}))
        .await;
    assert_eq!(code, 400);
    h.server.shutdown().await;
}

#[tokio::test]
async fn cancelling_a_parked_run_cancels_its_ctas_and_children() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"orchestrator": [{"tool_calls": [
            {"name": "spawn_subagent", "arguments": {"agent": "helper", "prompt": "ask them"}},
            {"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "?"}}]}],
        "helper": [{"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "?"}}]}]}"#;
    let agents = json!({"agents": {"helper": {"tools": ["request_human_feedback"]}}});
    let h = start(
        dir.path(),
        scripted(script),
        catalog(Some(agents)),
        Arc::new(SystemClock),
    )
    .await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    h.wait_pending(2).await;
    let (code, v) = h.post(&format!("/runs/{run_id}/cancel"), json!(null)).await;
    assert_eq!(code, 202, "{v}");
    let run = h.wait_status(&run_id, &["cancelled"]).await;
    let child = of_type(&run, "tool")[0]["childRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    h.wait_status(&child, &["cancelled"]).await;
    h.wait_pending(0).await;
    let (_, all) = h.get("/ctas?status=cancelled").await;
    assert_eq!(all["ctas"].as_array().unwrap().len(), 2);
    let (code, v) = h.post(&format!("/runs/{run_id}/cancel"), json!(null)).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("run_ended"))
    );
    // A cancel is final: a follow-up is refused, saying how to go on.
    let (code, v) = h
        .post(
            &format!("/runs/{run_id}/messages"),
            json!({"text": "again"}),
        )
        .await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("run_ended"))
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_message_to_an_active_run_waits_for_its_turn() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"orchestrator": [
        {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "?"}}]},
        {"text": "first turn done"},
        {"text": "second turn done"},
        {"text": "third turn done"}]}"#;
    let h = start_scripted(dir.path(), script).await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    h.wait_status(&run_id, &["waiting"]).await;
    for text in ["hurry", "and then this"] {
        let (code, v) = h
            .post(&format!("/runs/{run_id}/messages"), json!({"text": text}))
            .await;
        assert_eq!((code, &v["queued"]), (202, &json!(true)), "{v}");
    }
    // The run holds them as queued entries; the model has not seen them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, run) = h.get(&format!("/runs/{run_id}")).await;
        if of_type(&run, "queued").len() == 2 {
            assert_eq!(run["status"], "waiting");
            assert_eq!(run["queued"].as_array().map(Vec::len), Some(2));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{run:#}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let cta = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (code, _) = h
        .post(
            &format!("/ctas/{cta}/response"),
            json!({"kind": "approval", "approved": true}),
        )
        .await;
    assert_eq!(code, 202);
    // Each waiting message then had a turn of its own, in order.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let run = loop {
        let run = h.wait_status(&run_id, &["completed"]).await;
        if run["result"] == "third turn done" {
            break run;
        }
        assert!(std::time::Instant::now() < deadline, "{run:#}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let users: Vec<&str> = of_type(&run, "user")
        .iter()
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["go", "hurry", "and then this"]);
    assert!(run.get("queued").is_none(), "{run:#}");
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_script_that_runs_out_fails_the_run_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), r#"{"orchestrator": [{"tool_calls": [{"name": "spawn_subagent", "arguments": {"agent": "explore", "prompt": "x"}}]}]}"#).await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    let run = h.wait_status(&run_id, &["failed"]).await;
    // The child failed first (no script for explore); the parent then ran out at reply 1.
    assert_eq!(run["error"]["code"], "model_error");
    assert!(
        run["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no reply 1 for agent `orchestrator`"),
        "{run:#}"
    );
    let tool = of_type(&run, "tool")[0];
    assert!(
        tool["result"]["error"]
            .as_str()
            .unwrap()
            .contains("no reply 0 for agent `explore`"),
        "{tool}"
    );
    h.server.shutdown().await;
}

/// A model that takes its time for agent `code` and answers at once for the others.
struct SlowForCode(Arc<dyn baton_core::llm::Llm>);

#[async_trait::async_trait]
impl baton_core::llm::Llm for SlowForCode {
    async fn complete(
        &self,
        req: &baton_core::llm::ChatRequest<'_>,
    ) -> Result<baton_core::llm::LlmReply, baton_core::llm::LlmError> {
        if req.agent == "code" {
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        }
        self.0.complete(req).await
    }
}

#[tokio::test]
async fn a_slow_think_in_one_run_does_not_hold_up_another() {
    let dir = tempfile::tempdir().unwrap();
    let llm = Arc::new(SlowForCode(scripted(
        r#"{"code": [{"text": "slow"}], "explore": [{"text": "fast"}]}"#,
    )));
    let h = start(dir.path(), llm, catalog(None), Arc::new(SystemClock)).await;
    let slow = h
        .create_run(json!({"prompt": "take your time", "agent": "code"}))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let fast = h
        .create_run(json!({"prompt": "quick", "agent": "explore"}))
        .await;
    h.wait_status(&fast, &["completed"]).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "the fast run waited {:?}",
        started.elapsed()
    );
    let status = h.get(&format!("/runs/{slow}")).await.1["status"].clone();
    assert!(
        status == "queued" || status == "running",
        "the slow run is still in its first step: {status}"
    );
    h.wait_status(&slow, &["completed"]).await;
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_retried_follow_up_with_an_idempotency_key_is_one_turn() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(
        dir.path(),
        r#"{"explore": [{"text": "first"}, {"text": "second"}, {"text": "third"}]}"#,
    )
    .await;
    let run_id = h
        .create_run(json!({"prompt": "one", "agent": "explore"}))
        .await;
    h.wait_status(&run_id, &["completed"]).await;
    let say = |key: &'static str| {
        h.http
            .post(h.url(&format!("/runs/{run_id}/messages")))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", key)
            .json(&json!({"text": "two"}))
            .send()
    };
    // The first attempt, a retry while its turn may still run, and one after it ended.
    assert_eq!(say("k-1").await.unwrap().status(), 202);
    assert_eq!(say("k-1").await.unwrap().status(), 202);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while h.get(&format!("/runs/{run_id}")).await.1["result"] != "second" {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(say("k-1").await.unwrap().status(), 202);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, run) = h.get(&format!("/runs/{run_id}")).await;
    let texts: Vec<&str> = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["text"].as_str().or(e["type"].as_str()).unwrap())
        .collect();
    assert_eq!(
        texts,
        ["one", "first", "usage", "two", "second", "usage"],
        "one turn, not three"
    );
    assert_eq!(run["status"], "completed");
    // A key that is not visible ASCII is refused.
    let bad = h
        .http
        .post(h.url(&format!("/runs/{run_id}/messages")))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "")
        .json(&json!({"text": "two"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
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
    let h = start(
        dir.path(),
        scripted(&script),
        catalog,
        Arc::new(SystemClock),
    )
    .await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagents_question_shows_in_its_parents_timeline_and_under_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let script = json!({
        "orchestrator": [
            {"tool_calls": [{"name": "spawn_subagent", "arguments": {"agent": "asker", "prompt": "ask"}}]},
            {"text": "done"}
        ],
        "asker": [
            {"tool_calls": [{"name": "request_human_feedback",
                             "arguments": {"kind": "text", "prompt": "Which branch?"}}]},
            {"text": "on main"}
        ]
    });
    let agents = json!({"agents": {"asker": {"tools": ["request_human_feedback"]}}});
    let h = start(
        dir.path(),
        scripted(&script.to_string()),
        catalog(Some(agents)),
        Arc::new(SystemClock),
    )
    .await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    let other = h.create_run(json!({"prompt": "go"})).await;
    h.wait_pending(2).await;
    let parent = loop {
        let (_, run) = h.get(&format!("/runs/{run_id}")).await;
        if run["waitingCtas"].as_array().is_some_and(|w| !w.is_empty()) {
            break run;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(parent["state"], "waiting_on_subagents");
    let cta_id = parent["waitingCtas"][0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let notice = of_type(&parent, "notice")
        .into_iter()
        .find(|n| n["code"] == "subagent_waiting")
        .cloned()
        .expect("a notice");
    assert!(
        notice["message"]
            .as_str()
            .unwrap()
            .contains("Which branch?")
            && notice["message"].as_str().unwrap().contains(&cta_id),
        "{notice}"
    );

    // Every CTA pending under the run, and only those.
    let (code, v) = h
        .get(&format!("/ctas?status=pending&rootRunId={run_id}"))
        .await;
    assert_eq!(code, 200, "{v}");
    let ctas = v["ctas"].as_array().unwrap();
    assert_eq!(ctas.len(), 1, "{v}");
    assert_eq!(ctas[0]["ctaId"], cta_id.as_str());
    assert_eq!(ctas[0]["rootRunId"], run_id.as_str());
    let (code, v) = h.get("/ctas?rootRunId=run_nope").await;
    assert_eq!(code, 404, "{v}");

    h.post(
        &format!("/ctas/{cta_id}/response"),
        json!({"kind": "text", "text": "main"}),
    )
    .await;
    let done = h.wait_status(&run_id, &["completed"]).await;
    assert!(done.get("waitingCtas").is_none(), "{done:#}");
    let (_, v) = h
        .get(&format!("/ctas?status=pending&rootRunId={other}"))
        .await;
    assert_eq!(
        v["ctas"].as_array().map(Vec::len),
        Some(1),
        "the other run's CTA is its own"
    );
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
        Arc::new(SystemClock),
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
    use baton_core::ports::Store;
    use baton_core::run::{NewRun, Run};
    use baton_core::timeline::{Entry, EntryBody};
    let dir = tempfile::tempdir().unwrap();
    {
        let store = baton_local::store::LocalStore::open(dir.path()).unwrap();
        let mut run = Run::new(NewRun {
            run_id: "run_quotes".into(),
            agent: "orchestrator".into(),
            owner: "local".into(),
            parent: None,
            depth: 0,
            on_expiry: Default::default(),
            sandbox_id: None,
            metadata: None,
            context: None,
            root_run_id: None,
            now: chrono::Utc::now(),
        });
        run.status = baton_core::run::RunStatus::Completed;
        // 150 entries of 60 KB of quotes and backslashes: 18 MB as the envelope counts them.
        let text = "\"\\".repeat(30 * 1024);
        let entries: Vec<Entry> = (0..150)
            .map(|seq| Entry {
                seq,
                at: chrono::Utc::now(),
                body: EntryBody::User {
                    text: text.clone(),
                    message_id: None,
                    options: Default::default(),
                },
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

/// `maxWallSeconds` on `baton dev`, with its real timers: a run waiting on a subagent whose
/// tool (8 s) takes longer than the parent may work (1 s) is stopped at its deadline (not at its next
/// think, which would come only when the subagent is done), and the subagent with it.
#[tokio::test]
async fn a_run_waiting_on_a_slow_subagent_is_stopped_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let script = json!({
        "patient": [{"tool_calls": [{"name": "spawn_subagent",
            "arguments": {"agent": "slowpoke", "prompt": "take your time"}}]},
            {"text": "never"}],
        "slowpoke": [{"tool_calls": [{"name": "report", "arguments": {"waitMs": 8000}}]},
            {"text": "too late"}]
    })
    .to_string();
    let agents = json!({"agents": {
        "patient": {"tools": ["spawn_subagent"], "maxWallSeconds": 1},
        "slowpoke": {"tools": ["report"]}}});
    let h = start(
        dir.path(),
        scripted(&script),
        catalog_with_report(agents),
        Arc::new(SystemClock),
    )
    .await;
    let started = std::time::Instant::now();
    let id = h
        .create_run(json!({"prompt": "go", "agent": "patient"}))
        .await;
    let run = h.wait_status(&id, &["failed"]).await;
    let took = started.elapsed();
    assert_eq!(run["error"]["code"], "deadline_exceeded", "{run}");
    assert!(
        took < std::time::Duration::from_millis(7500),
        "stopped at its deadline, not after the subagent's 8 s tool: {took:?}"
    );
    let (_, timeline) = h.get(&format!("/runs/{id}/timeline")).await;
    let child = timeline["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e["childRunId"].as_str())
        .expect("a subagent")
        .to_owned();
    let child = h.wait_status(&child, &["cancelled"]).await;
    assert_eq!(child["status"], "cancelled");
    h.server.shutdown().await;
}
