//! A question with a default, written once and run on both hosts: an agent (or a run) whose
//! questions expire into their defaults takes the default at expiry and goes on, and says so
//! in its timeline and on the question; a run that says otherwise ends at its expiry.

use crate::aws_flow::start_env;
use crate::common;

use std::sync::Arc;

use baton_core::ports::ManualClock;
use common::host::{LocalHost, TestHost};
use common::*;
use serde_json::{Value, json};

/// The model asks one approval with a default, then answers once it has one.
const SCRIPT: &str = r#"{"orchestrator": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval",
        "message": "Ship it?", "default": {"approved": true, "reason": "ship by default"}}}]},
    {"text": "Shipped."}]}"#;

/// The agents file: the orchestrator's questions expire after `secs` seconds, into their
/// defaults unless a run says otherwise.
fn agents(secs: u64) -> Value {
    let mut agents = common::mock_openai::named_agents();
    agents["agents"]["orchestrator"]["ctaExpirySeconds"] = json!(secs);
    agents["agents"]["orchestrator"]["onExpiry"] = json!("default");
    agents
}

/// The scenario: one run takes its question's default at expiry and completes; one that
/// asks `onExpiry: "end"` ends `expired` at its own, default or not.
async fn a_question_with_a_default_expires_into_it(host: &impl TestHost) {
    let api = host.api();
    let run_id = api.post_ok("/runs", json!({"prompt": "ship"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = api.get_ok(&format!("/runs/{run_id}")).await;
    assert_eq!(run["onExpiry"], "default", "the agent's policy: {run}");
    let cta = api.pending("approval").await;
    let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
    assert_eq!(
        cta["default"],
        json!({"kind": "approval", "approved": true, "reason": "ship by default"})
    );

    host.expire(&run_id, &cta).await;
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "Shipped.");
    let timeline = api.get_ok(&format!("/runs/{run_id}/timeline")).await;
    let tool = timeline["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool")
        .expect("the question's entry");
    assert_eq!(tool["result"]["status"], "success", "{tool}");
    assert_eq!(tool["result"]["output"]["approved"], true);
    assert_eq!(tool["result"]["output"]["default"], true);
    assert_eq!(tool["cta"]["status"], "expired");
    assert_eq!(tool["cta"]["defaulted"], true);
    // The question's record says what its timeline's copy says.
    let c = api.get_ok(&format!("/ctas/{cta_id}")).await;
    assert_eq!(c["status"], "expired");
    assert_eq!(c["defaulted"], true, "{c}");
    assert_eq!(c["response"], tool["cta"]["response"], "{c}");
    let listed = api.get_ok("/ctas?status=expired").await;
    assert_eq!(listed["ctas"][0]["defaulted"], true, "{listed}");

    // A run may say otherwise: this one ends at its question's expiry, default or not.
    let run_id = api
        .post_ok("/runs", json!({"prompt": "ship", "onExpiry": "end"}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cta = api.pending("approval").await;
    host.expire(&run_id, &cta).await;
    let run = api.status(&run_id, "expired").await;
    assert_eq!(run["error"]["code"], "cta_expired");
    let c = api
        .get_ok(&format!("/ctas/{}", cta["ctaId"].as_str().unwrap()))
        .await;
    assert_eq!(c["status"], "expired");
    assert!(
        c.get("defaulted").is_none() && c.get("response").is_none(),
        "{c}"
    );
}

/// On `baton dev`: its worker expires the question once its clock passes the expiry (30
/// days, the clock moved there).
#[tokio::test]
async fn a_question_with_a_default_expires_into_it_on_baton_dev() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let options = local_options(
        dir.path(),
        scripted(SCRIPT),
        catalog(Some(agents(30 * 24 * 3600))),
        clock.clone(),
    );
    let mut host = LocalHost::with_clock(options, clock).await;
    a_question_with_a_default_expires_into_it(&host).await;
    host.stop().await;
}

/// Over AWS's APIs (DynamoDB, SQS, EventBridge, Scheduler), under the fault layer: the 5 s
/// question's schedule fires its event on the bus (`cta.defaulted` is published: the calls
/// it made are checked against the bus's policy in CI).
#[tokio::test]
async fn a_question_with_a_default_expires_into_it_over_aws_apis() {
    let faults = common::aws::scenario_faults();
    let mut env = start_env(SCRIPT, false, catalog(Some(agents(5))), faults).await;
    a_question_with_a_default_expires_into_it(&env.host).await;
    env.host.inbox_drained().await;
    env.host.stop().await;
}
