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
