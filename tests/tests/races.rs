//! Races, as tests: requests that meet the same run or CTA at the same time must leave the
//! CTA record, the run and its timeline in agreement, and the API's replies true.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::ports::ManualClock;
use common::*;
use serde_json::{Value, json};

const ASK: &str = r#"{"orchestrator": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "?"}}]},
    {"text": "done"}]}"#;

/// The CTA snapshot the run's timeline holds for `cta_id`.
fn snapshot<'a>(run: &'a Value, cta_id: &str) -> &'a Value {
    of_type(run, "tool")
        .into_iter()
        .find_map(|e| e.get("cta").filter(|c| c["ctaId"] == cta_id))
        .unwrap_or_else(|| panic!("no CTA {cta_id} in {run:#}"))
}

fn notices(run: &Value, code: &str) -> usize {
    of_type(run, "notice")
        .iter()
        .filter(|e| e["code"] == code)
        .count()
}

/// Waits until the run is at rest: ended, or parked with nothing queued.
async fn settled(h: &Harness, run_id: &str) -> Value {
    let run = h
        .wait_status(run_id, &["completed", "cancelled", "expired", "failed"])
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.server.store.queue_depth().await.unwrap() > 0 {
        assert!(std::time::Instant::now() < deadline, "queue never drained");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, run2) = h.get(&format!("/runs/{run_id}")).await;
    assert_eq!(run["status"], run2["status"]);
    run2
}

#[tokio::test]
async fn a_hundred_concurrent_answers_have_one_winner_and_one_effect() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), ASK).await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    let cta = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut answers = tokio::task::JoinSet::new();
    for i in 0..100 {
        let (http, url) = (h.http.clone(), h.url(&format!("/ctas/{cta}/response")));
        answers.spawn(async move {
            let r = http
                .post(url)
                .bearer_auth(TOKEN)
                .json(
                    &json!({"kind": "approval", "approved": i % 2 == 0, "reason": format!("#{i}")}),
                )
                .send()
                .await
                .expect("request");
            let code = r.status().as_u16();
            (code, r.json::<Value>().await.expect("JSON"))
        });
    }
    let replies = answers.join_all().await;
    let won: Vec<&(u16, Value)> = replies.iter().filter(|(c, _)| *c == 202).collect();
    assert_eq!(won.len(), 1, "{replies:?}");
    assert!(
        replies
            .iter()
            .all(|(c, v)| *c == 202 || (*c == 409 && v["error"]["code"] == "cta_answered")),
        "{replies:?}"
    );
    let run = settled(&h, &run_id).await;
    let (_, record) = h.get(&format!("/ctas/{cta}")).await;
    assert_eq!(snapshot(&run, &cta)["response"], record["response"]);
    assert_eq!(of_type(&run, "assistant").len(), 2, "the run resumed once");
    h.server.shutdown().await;
}

#[tokio::test]
async fn answer_and_cancel_at_once_agree_on_the_cta() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), ASK).await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let run_id = h.create_run(json!({"prompt": "go"})).await;
        h.wait_status(&run_id, &["waiting"]).await;
        let cta = h
            .pending_ctas()
            .await
            .into_iter()
            .find(|c| c["runId"] == run_id.as_str())
            .unwrap()["ctaId"]
            .as_str()
            .unwrap()
            .to_owned();
        let (cancel_path, answer_path) = (
            format!("/runs/{run_id}/cancel"),
            format!("/ctas/{cta}/response"),
        );
        let (cancel, answer) = tokio::join!(
            h.post(&cancel_path, json!({})),
            h.post(&answer_path, json!({"kind": "approval", "approved": true})),
        );
        assert_eq!(cancel.0, 202, "{cancel:?}");
        assert!(
            answer.0 == 202 || (answer.0 == 409 && answer.1["error"]["code"] == "cta_cancelled"),
            "{answer:?}"
        );
        let run = settled(&h, &run_id).await;
        let (_, record) = h.get(&format!("/ctas/{cta}")).await;
        let snap = snapshot(&run, &cta);
        assert_eq!(snap["status"], record["status"], "{run:#}\n{record:#}");
        assert_eq!(snap["response"], record["response"]);
        match run["status"].as_str().unwrap() {
            // The answer resumed the run and it finished before the cancel's turn.
            "completed" => assert_eq!(notices(&run, "cancel_too_late"), 1, "{run:#}"),
            "cancelled" => {}
            other => panic!("run ended {other}: {run:#}"),
        }
        if answer.0 == 202 {
            assert_eq!(record["status"], "answered");
        } else {
            assert_eq!(record["status"], "cancelled");
        }
        seen.insert((
            record["status"].as_str().unwrap().to_owned(),
            run["status"].as_str().unwrap().to_owned(),
        ));
    }
    eprintln!("outcomes seen: {seen:?}");
    h.server.shutdown().await;
}

#[tokio::test]
async fn an_answer_and_its_expiry_at_once_have_one_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let script = ASK.replace(
        r#""message": "?""#,
        r#""message": "?", "expiresInSeconds": 60"#,
    );
    let h = start_at(dir.path(), scripted(&script), catalog(None), clock.clone()).await;
    for _ in 0..10 {
        let run_id = h.create_run(json!({"prompt": "go"})).await;
        h.wait_status(&run_id, &["waiting"]).await;
        let (_, ctas) = h.get("/ctas?status=pending").await;
        let cta = ctas["ctas"].as_array().unwrap()[0]["ctaId"]
            .as_str()
            .unwrap()
            .to_owned();
        // The expiry is due: the worker's timer and a late answer race.
        clock.advance(chrono::Duration::seconds(3600));
        let answer = h
            .post(
                &format!("/ctas/{cta}/response"),
                json!({"kind": "approval", "approved": true}),
            )
            .await;
        assert!(
            answer.0 == 410 || (answer.0 == 409 && answer.1["error"]["code"] == "cta_expired"),
            "an answer after expiresAt is refused: {answer:?}"
        );
        let run = settled(&h, &run_id).await;
        let (_, record) = h.get(&format!("/ctas/{cta}")).await;
        assert_eq!(record["status"], "expired");
        assert_eq!(snapshot(&run, &cta)["status"], "expired");
        assert_eq!(run["status"], "expired");
    }
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_cancel_racing_completion_is_applied_or_said_to_be_too_late() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), r#"{"orchestrator": [{"text": "quick"}]}"#).await;
    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..20 {
        let run_id = h.create_run(json!({"prompt": "go"})).await;
        let (code, v) = h.post(&format!("/runs/{run_id}/cancel"), json!({})).await;
        let run = settled(&h, &run_id).await;
        let status = run["status"].as_str().unwrap().to_owned();
        match (code, status.as_str()) {
            (202, "cancelled") => assert_eq!(notices(&run, "cancel_too_late"), 0),
            (202, "completed") => assert_eq!(notices(&run, "cancel_too_late"), 1, "{run:#}"),
            (409, "completed") => assert_eq!(v["error"]["code"], "run_ended"),
            other => panic!("{other:?}: {v} {run:#}"),
        }
        *outcomes.entry((code, status)).or_insert(0) += 1;
    }
    eprintln!("cancel vs completion: {outcomes:?}");
    h.server.shutdown().await;
}

#[tokio::test]
async fn concurrent_follow_ups_each_get_a_turn() {
    let dir = tempfile::tempdir().unwrap();
    let replies: Vec<Value> = (0..60)
        .map(|i| json!({"text": format!("reply {i}")}))
        .collect();
    let script = json!({"orchestrator": replies}).to_string();
    let h = start_scripted(dir.path(), &script).await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    h.wait_status(&run_id, &["completed"]).await;
    let mut sent = vec!["go".to_owned()];
    for pair in 0..20 {
        let (a, b) = (format!("a{pair}"), format!("b{pair}"));
        let path = format!("/runs/{run_id}/messages");
        let (ra, rb) = tokio::join!(
            h.post(&path, json!({"text": a})),
            h.post(&path, json!({"text": b})),
        );
        assert_eq!((ra.0, rb.0), (202, 202), "{ra:?} {rb:?}");
        sent.extend([a, b]);
        // Every other pair goes while the run is busy with the one before.
        if pair % 2 == 1 {
            settled(&h, &run_id).await;
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let run = loop {
        settled(&h, &run_id).await;
        let run = h.whole(&run_id).await;
        if of_type(&run, "user").len() == sent.len() {
            break run;
        }
        assert!(std::time::Instant::now() < deadline, "{run:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut got: Vec<String> = of_type(&run, "user")
        .iter()
        .map(|e| e["text"].as_str().unwrap().to_owned())
        .collect();
    got.sort();
    sent.sort();
    assert_eq!(got, sent, "every message had its turn, once");
    assert_eq!(of_type(&run, "assistant").len(), sent.len());
    h.server.shutdown().await;
}

#[tokio::test]
async fn two_children_finishing_at_once_both_reach_their_parent() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"orchestrator": [
        {"tool_calls": [{"name": "spawn_subagent", "arguments": {"agent": "explore", "prompt": "x"}},
                        {"name": "spawn_subagent", "arguments": {"agent": "code", "prompt": "y"}}]},
        {"text": "both back"}],
      "explore": [{"text": "explored"}], "code": [{"text": "coded"}]}"#;
    let h = start(dir.path(), scripted(script), catalog(None)).await;
    let run_id = h.create_run(json!({"prompt": "go"})).await;
    let run = settled(&h, &run_id).await;
    assert_eq!(run["status"], "completed");
    let outputs: Vec<&Value> = of_type(&run, "tool")
        .iter()
        .map(|e| &e["result"]["output"]["text"])
        .collect();
    assert_eq!(outputs, [&json!("explored"), &json!("coded")]);
    h.server.shutdown().await;
}
