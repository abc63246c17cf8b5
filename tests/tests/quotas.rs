//! Quotas per owner, on both hosts: at most `BATON_MAX_ACTIVE_RUNS_PER_OWNER` top-level runs
//! not yet ended, held where the slots are written (one SQLite transaction; a DynamoDB
//! transaction with a conditional counter), so that a burst of requests cannot pass it.

use crate::common;

use std::sync::Arc;

use common::aws::{Api, Emulator};
use common::host::{AwsHost, LocalHost, TestHost};
use serde_json::{Value, json};

/// Every run asks a question first (and waits, active), then ends; a follow-up is answered.
const ASK: &str = r#"{"orchestrator": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "go?"}}]},
    {"text": "done"},
    {"text": "again"}]}"#;

const LIMIT: u32 = 10;

#[tokio::test]
async fn fifty_posts_against_a_quota_of_ten_start_ten_on_the_embedded_host() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = common::local_options(
        dir.path(),
        common::scripted(ASK),
        common::catalog(None),
        Arc::new(baton_core::ports::SystemClock),
    );
    options.quotas.active_runs = Some(LIMIT);
    let mut host = LocalHost::start(options).await;
    active_runs_are_bounded(&host).await;
    // `baton dev`'s token holder is its operator: it reads any owner's figures.
    let other = host.api().get_ok("/usage?owner=someone-else").await;
    assert_eq!(other["owner"], "someone-else");
    assert_eq!(
        other["activeRuns"],
        json!({"current": 0, "limit": LIMIT}),
        "{other}"
    );
    host.stop().await;
}

/// 50 concurrent `POST /runs` against a quota of 10: exactly 10 start, the rest are 429s
/// that say the limit and the figure and create nothing. A run that ends gives its slot
/// back; a follow-up that would start an ended run again takes one, or is refused.
async fn active_runs_are_bounded(host: &impl TestHost) {
    let api = host.api();
    let mut posts = tokio::task::JoinSet::new();
    for i in 0..50 {
        let api = api.clone();
        posts.spawn(async move {
            api.post("/runs", json!({"prompt": format!("run {i}")}))
                .await
        });
    }
    let answers = posts.join_all().await;
    let started: Vec<String> = answers
        .iter()
        .filter(|(code, _)| *code == 202)
        .map(|(_, v)| v["runId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(started.len(), LIMIT as usize, "{answers:?}");
    for (code, v) in answers.iter().filter(|(code, _)| *code != 202) {
        assert_eq!(*code, 429, "{v}");
        assert_eq!(v["error"]["code"], "quota_exceeded", "{v}");
        assert_eq!(v["error"]["limit"], LIMIT, "{v}");
        assert_eq!(v["error"]["current"], LIMIT, "{v}");
    }
    assert_eq!(
        listed(api).await,
        LIMIT as usize,
        "only the accepted runs exist"
    );

    // Each parks on its question: still active, so one more is refused.
    for _ in 0..LIMIT {
        pending(api, None).await;
    }
    let (code, v) = api.post("/runs", json!({"prompt": "one more"})).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{v}"
    );

    // One ends (its question answered): its slot is free again, and taken.
    let first = &started[0];
    answer(api, first).await;
    api.status(first, "completed").await;
    let next = api
        .post_ok("/runs", json!({"prompt": "the freed slot"}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();

    // A follow-up would start the ended run again: refused while ten are active, and it
    // changes nothing.
    let before = api.get_ok(&format!("/runs/{first}")).await;
    let (code, v) = api
        .post(
            &format!("/runs/{first}/messages"),
            json!({"text": "once more"}),
        )
        .await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{v}"
    );
    let after = api.get_ok(&format!("/runs/{first}")).await;
    assert_eq!(after["status"], "completed");
    assert_eq!(after["timeline"], before["timeline"], "nothing was queued");

    // Once another ends (cancelled), the follow-up starts its turn.
    api.post_ok(&format!("/runs/{next}/cancel"), json!({}))
        .await;
    api.status(&next, "cancelled").await;
    let path = format!("/runs/{first}/messages");
    let (code, v, _) = post_with_headers(api, &path, json!({"text": "once more"}), "more-1").await;
    assert_eq!(code, 202, "{v}");
    let again = api
        .wait("the follow-up's turn", async |api: &Api| {
            let run = api.get_ok(&format!("/runs/{first}")).await;
            (run["status"] == "completed" && run["result"] == "again").then_some(run)
        })
        .await;
    assert_eq!(again["result"], "again");
    // Its turn ended: its slot is back. Nine remain (the nine still asking).
    active_is(api, LIMIT - 1).await;

    // The same follow-up again (a client's retry, same key) starts nothing: the slot taken
    // for it is given back when the retry reaches the run. (On AWS the step queue drops a
    // message id it saw in the last five minutes; the retry's names the run's version it
    // was posted at, so it is not dropped: LocalStack's SQS deduplicates as AWS does.)
    let (code, v, _) = post_with_headers(api, &path, json!({"text": "once more"}), "more-1").await;
    assert_eq!(code, 202, "{v}");
    active_is(api, LIMIT - 1).await;
    let run = api.get_ok(&format!("/runs/{first}")).await;
    assert_eq!(
        (run["status"].as_str(), run["result"].as_str()),
        (Some("completed"), Some("again"))
    );
}

/// Waits until the owner's active-run figure is `n`, and checks it stays so a moment.
async fn active_is(api: &Api, n: u32) {
    api.wait(&format!("{n} active runs"), async |api: &Api| {
        let usage = api.get_ok("/usage").await;
        (usage["activeRuns"]["current"] == n).then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let usage = api.get_ok("/usage").await;
    assert_eq!(usage["activeRuns"]["current"], n, "{usage}");
}

/// How many top-level runs the owner has.
async fn listed(api: &Api) -> usize {
    let page = api.get_ok("/runs?limit=100").await;
    page["runs"].as_array().map_or(0, Vec::len)
}

/// A pending question (of `run_id`, if given), once there is one.
async fn pending(api: &Api, run_id: Option<&str>) -> Value {
    api.wait("a pending question", async |api: &Api| {
        let page = api.get_ok("/ctas?status=pending&limit=100").await;
        page["ctas"].as_array().and_then(|c| {
            c.iter()
                .find(|c| run_id.is_none_or(|r| c["runId"] == r))
                .cloned()
        })
    })
    .await
}

/// Approves `run_id`'s question.
async fn answer(api: &Api, run_id: &str) {
    let cta = pending(api, Some(run_id)).await;
    let path = format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap());
    api.post_ok(&path, json!({"kind": "approval", "approved": true}))
        .await;
}

/// The priced model: gpt-4o-mini, at $0.60 a million output tokens.
fn priced_agents() -> Value {
    json!({"agents": {"orchestrator": {"system": "agent:orchestrator",
        "model": "gpt-4o-mini", "tools": []}}})
}

/// Each run's one reply costs $0.60 (a million output tokens of gpt-4o-mini).
const PRICED: &str = r#"{"orchestrator": [
    {"text": "done", "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}},
    {"text": "again", "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}}]}"#;

#[tokio::test]
async fn a_day_s_allowance_spent_refuses_new_runs_until_midnight_on_the_embedded_host() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = common::local_options(
        dir.path(),
        common::scripted(PRICED),
        common::catalog(Some(priced_agents())),
        Arc::new(baton_core::ports::SystemClock),
    );
    options.quotas.daily_cost_usd = Some(1.0);
    let mut host = LocalHost::start(options).await;
    daily_cost_is_bounded(host.api()).await;
    host.stop().await;
}

/// $1.00 a day: two runs of $0.60 start (the first left $0.40), the third does not — a
/// 429 with the allowance, the day's spending and `Retry-After` until midnight UTC — nor a
/// follow-up that would start an ended run; and nothing is written.
async fn daily_cost_is_bounded(api: &Api) {
    let first = api.post_ok("/runs", json!({"prompt": "one"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    api.status(&first, "completed").await;
    let second = api.post_ok("/runs", json!({"prompt": "two"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    api.status(&second, "completed").await;

    let (code, v, retry_after) =
        post_with_headers(api, "/runs", json!({"prompt": "three"}), "quota-three").await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{v}"
    );
    assert_eq!(v["error"]["limit"], 1.0, "{v}");
    let spent = v["error"]["current"].as_f64().unwrap();
    assert!((spent - 1.2).abs() < 1e-9, "{v}");
    let wait: i64 = retry_after.expect("Retry-After").parse().unwrap();
    let now = chrono::Utc::now();
    let midnight = now
        .date_naive()
        .succ_opt()
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc();
    assert!(
        (wait - (midnight - now).num_seconds()).abs() <= 5,
        "Retry-After {wait}"
    );
    assert_eq!(listed(api).await, 2, "nothing was created");
    let usage = api.get_ok("/usage").await;
    assert_eq!(usage["dailyCostUsd"]["limit"], 1.0, "{usage}");
    assert!(
        (usage["dailyCostUsd"]["current"].as_f64().unwrap() - 1.2).abs() < 1e-9,
        "{usage}"
    );
    assert!(
        usage.get("activeRuns").is_none(),
        "no active-runs quota is set: {usage}"
    );

    let (code, v) = api
        .post(&format!("/runs/{first}/messages"), json!({"text": "more"}))
        .await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{v}"
    );
    let run = api.get_ok(&format!("/runs/{first}")).await;
    assert_eq!(run["status"], "completed");
    assert_eq!(run["result"], "done", "no turn started");
}

/// A run of three thinks of $0.60 each, with `echo` between them.
const LOOPING: &str = r#"{"orchestrator": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}],
     "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}},
    {"tool_calls": [{"name": "echo", "arguments": {"text": "b"}}],
     "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}},
    {"text": "done", "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}}]}"#;

fn looping_agents() -> Value {
    json!({"agents": {"orchestrator": {"system": "agent:orchestrator",
        "model": "gpt-4o-mini", "tools": ["echo"]}}})
}

#[tokio::test]
async fn a_run_under_way_stops_at_the_think_past_the_day_s_allowance_on_the_embedded_host() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = common::local_options(
        dir.path(),
        common::scripted(LOOPING),
        common::catalog(Some(looping_agents())),
        Arc::new(baton_core::ports::SystemClock),
    );
    options.quotas.daily_cost_usd = Some(1.0);
    let mut host = LocalHost::start(options).await;
    spending_is_bounded(host.api()).await;
    host.stop().await;
}

/// $1.00 a day, and a run admitted with nothing spent that would spend $1.80: its first
/// two thinks ($1.20) pass, its third does not start — the run ends `failed`,
/// `quota_exceeded` — so the day's spending stops at the calls that were under way.
async fn spending_is_bounded(api: &Api) {
    let run = api.post_ok("/runs", json!({"prompt": "loop"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = api.status(&run, "failed").await;
    assert_eq!(failed["error"]["code"], "quota_exceeded", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("of the $1.0000 a day allows")),
        "{failed}"
    );
    assert_eq!(
        failed["thinks"], 2,
        "the third think never started: {failed}"
    );
    let usage = api.get_ok("/usage").await;
    let spent = usage["dailyCostUsd"]["current"].as_f64().unwrap();
    assert!((spent - 1.2).abs() < 1e-9, "{usage}");
}

/// A POST with `key` as its `Idempotency-Key`: its status, body and `Retry-After` (a 503
/// of the fault layer tried again).
async fn post_with_headers(
    api: &Api,
    path: &str,
    body: Value,
    key: &str,
) -> (u16, Value, Option<String>) {
    let mut tries = 0;
    let r = loop {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", api.base))
            .bearer_auth(&api.token)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
            .await
            .unwrap();
        tries += 1;
        if r.status().as_u16() != 503 || tries == 5 {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let code = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (code, r.json().await.unwrap_or(Value::Null), retry)
}

/// Over AWS's APIs: `baton dev --aws` on moto (or LocalStack's DynamoDB Local, in CI).
mod aws {
    use super::*;

    /// Over the fault layer even when calm: it gives moto's DynamoDB the write isolation
    /// DynamoDB has (`common::fault`); on LocalStack, DynamoDB Local has its own.
    #[tokio::test]
    async fn fifty_posts_against_a_quota_of_ten_start_ten() {
        let faults = common::aws::scenario_faults().unwrap_or_default();
        let aws = Arc::new(Emulator::start_with(Some(faults)).await);
        let (_mock, llm) = common::mock_openai::start(ASK).await;
        let catalog = common::catalog(Some(common::mock_openai::named_agents()));
        let mut options = aws.dev_options(aws.names("quota"), llm, catalog, 0).await;
        options.quotas.active_runs = Some(LIMIT);
        let mut host = AwsHost::start(aws, options).await;
        active_runs_are_bounded(&host).await;
        host.stop().await;
    }

    #[tokio::test]
    async fn a_day_s_allowance_spent_refuses_new_runs_until_midnight() {
        let aws = Arc::new(Emulator::start_with(common::aws::scenario_faults()).await);
        let (_mock, llm) = common::mock_openai::start(PRICED).await;
        let catalog = common::catalog(Some(priced_agents()));
        let mut options = aws.dev_options(aws.names("spend"), llm, catalog, 0).await;
        options.quotas.daily_cost_usd = Some(1.0);
        let mut host = AwsHost::start(aws, options).await;
        daily_cost_is_bounded(host.api()).await;
        host.stop().await;
    }

    #[tokio::test]
    async fn a_run_under_way_stops_at_the_think_past_the_day_s_allowance() {
        let aws = Arc::new(Emulator::start_with(common::aws::scenario_faults()).await);
        let (_mock, llm) = common::mock_openai::start(LOOPING).await;
        let catalog = common::catalog(Some(looping_agents()));
        let mut options = aws
            .dev_options(aws.names("spending"), llm, catalog, 0)
            .await;
        options.quotas.daily_cost_usd = Some(1.0);
        let mut host = AwsHost::start(aws, options).await;
        spending_is_bounded(host.api()).await;
        host.stop().await;
    }
}
