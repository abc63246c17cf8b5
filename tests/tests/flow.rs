//! End-to-end through the HTTP API, on the embedded store with the scripted model.

use crate::common;

use std::sync::Arc;

use baton_core::ports::ManualClock;
use common::*;
use serde_json::json;

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
    let types = entry_types(&run);
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
    let h = start_at(dir.path(), scripted(script), catalog(None), clock.clone()).await;
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
