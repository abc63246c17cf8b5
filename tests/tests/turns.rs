//! A run's turns on `baton dev`: follow-up messages (one turn per idempotency key, waiting
//! for the turn under way), cancellation of a parked run with its questions and children,
//! runs that do not hold each other up, and a subagent's question and deadline.

use crate::common;

use std::sync::Arc;

use common::*;
use serde_json::json;

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
    let texts = texts(&run);
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
        .post(&format!("/runs/{run_id}/messages"), json!({"text": 7}))
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
    let h = start(dir.path(), scripted(script), catalog(Some(agents))).await;
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
    let h = start(dir.path(), llm, catalog(None)).await;
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
    let texts = texts(&run);
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
    let h = start(dir.path(), scripted(&script), catalog_with_report(agents)).await;
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

/// Each entry of `run`'s timeline by its text, or its type where it has none.
fn texts(run: &serde_json::Value) -> Vec<&str> {
    run["timeline"]
        .as_array()
        .expect("a timeline")
        .iter()
        .map(|e| {
            e["text"]
                .as_str()
                .or(e["type"].as_str())
                .unwrap_or_default()
        })
        .collect()
}
