//! Budgets that ask a human, on both hosts: a run tree that has spent its budget parks on
//! a question to its owner before its next model call; approved, its budget is raised and
//! it goes on; refused, it ends `failed`, `budget_exhausted`. A subagent's spending counts
//! toward its root's budget at once.

use crate::common;

use std::sync::Arc;

use common::aws::{Api, Emulator};
use common::host::{AwsHost, LocalHost, TestHost};
use serde_json::{Value, json};

/// gpt-4o-mini, priced; the orchestrator may spend $1.00 a run unless told less.
fn agents() -> Value {
    json!({"agents": {
        "orchestrator": {"system": "agent:orchestrator", "model": "gpt-4o-mini",
                         "tools": ["spawn_subagent"], "maxCostUsd": 1.0},
        "explore": {"system": "agent:explore", "model": "gpt-4o-mini", "tools": []}
    }})
}

/// Every reply costs $0.60 (a million output tokens of gpt-4o-mini). Two runs, in turn:
/// each spawns a subagent (the parent's think and the child's spend $1.20 of $1.00), then
/// thinks again only if its owner allows.
const SCRIPT: &str = r#"{
  "orchestrator": [
    {"tool_calls": [{"name": "spawn_subagent", "arguments": {"agent": "explore", "prompt": "look"}}],
     "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}},
    {"text": "done", "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}},
    {"tool_calls": [{"name": "spawn_subagent", "arguments": {"agent": "explore", "prompt": "look"}}],
     "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}}],
  "explore": [
    {"text": "seen", "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}},
    {"text": "seen", "usage": {"inputTokens": 0, "outputTokens": 1000000, "totalTokens": 1000000}}]
}"#;

fn near(v: &Value, x: f64) -> bool {
    v.as_f64().is_some_and(|f| (f - x).abs() < 1e-9)
}

/// `baton dev`'s host on `dir`, with the scripted model and the priced agents.
async fn embedded(dir: &std::path::Path) -> LocalHost {
    let options = common::local_options(
        dir,
        common::scripted(SCRIPT),
        common::catalog(Some(agents())),
        Arc::new(baton_core::ports::SystemClock),
    );
    LocalHost::start(options).await
}

#[tokio::test]
async fn a_run_past_its_budget_asks_is_raised_and_completes_or_ends_on_the_embedded_host() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = embedded(dir.path()).await;
    budgets_ask(host.api()).await;
    host.stop().await;
}

#[tokio::test]
async fn a_ledger_that_does_not_read_back_leaves_the_run_readable() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = embedded(dir.path()).await;
    let api = host.api();
    let run = asked(api).await;
    // A ledger as an infinite budget was once stored: JSON's `null` for the number.
    let sql = r#"UPDATE budgets SET ledger = '{"budgetUsd": null, "spentUsd": 1.2}'"#;
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1], timeout=10); \
             c.execute(sys.argv[2]); c.commit()",
        ])
        .arg(dir.path().join("baton.db"))
        .arg(sql)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (code, v) = api.get(&format!("/runs/{run}")).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "waiting", "{v}");
    assert!(
        v["timeline"].as_array().is_some_and(|t| !t.is_empty()),
        "{v}"
    );
    assert!(v.get("budget").is_none(), "{v}");
    assert!(
        v["budgetError"]
            .as_str()
            .is_some_and(|e| e.contains("budget ledger of")),
        "{v}"
    );
    host.stop().await;
}

/// The budget question of the tree under `run_id` (its own, or a subagent's), once it is
/// asked.
async fn question(api: &Api, run_id: &str) -> Value {
    api.wait("a budget question", async |api: &Api| {
        let page = api.get_ok("/ctas?status=pending&limit=100").await;
        page["ctas"].as_array().and_then(|c| {
            c.iter()
                .find(|c| c["runId"] == run_id || c["rootRunId"] == run_id)
                .cloned()
        })
    })
    .await
}

/// A run of the orchestrator, once its budget question is asked: its id.
async fn asked(api: &Api) -> String {
    let run = api.post_ok("/runs", json!({"prompt": "go"})).await["runId"]
        .as_str()
        .expect("a run id")
        .to_owned();
    question(api, &run).await;
    run
}

async fn budgets_ask(api: &Api) {
    // Bad budgets are refused, and create nothing.
    for (body, why) in [
        (json!({"prompt": "x", "budgetUsd": -1}), "from 0.000001"),
        (json!({"prompt": "x", "budgetUsd": 0}), "from 0.000001"),
        // Below a millionth of a dollar: DynamoDB's numbers start at 1e-130.
        (json!({"prompt": "x", "budgetUsd": 1e-200}), "from 0.000001"),
        (json!({"prompt": "x", "budgetUsd": 5}), "at most 1"),
        (json!({"prompt": "x", "budgetUsd": "lots"}), "budgetUsd"),
    ] {
        let (code, v) = api.post("/runs", body.clone()).await;
        assert_eq!(code, 400, "{body}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{body}: {v}");
    }
    let page = api.get_ok("/runs").await;
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(0), "{page}");

    // The agent's maxCostUsd is the run's budget. Its think and its subagent's spent
    // $1.20: before it thinks again, its owner is asked.
    let run = api.post_ok("/runs", json!({"prompt": "go"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cta = question(api, &run).await;
    assert_eq!(cta["kind"], "approval", "{cta}");
    assert!(near(&cta["budget"]["spentUsd"], 1.2), "{cta}");
    assert!(near(&cta["budget"]["budgetUsd"], 1.0), "{cta}");
    assert!(near(&cta["budget"]["askUsd"], 1.0), "{cta}");
    let waiting = api.get_ok(&format!("/runs/{run}")).await;
    assert_eq!(waiting["status"], "waiting", "{waiting}");
    assert!(near(&waiting["budget"]["spentUsd"], 1.2), "{waiting}");
    assert!(near(&waiting["total"]["costUsd"], 1.2), "{waiting}");
    // A raise goes with a budget question's approval only.
    let path = format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap());
    let (code, v) = api
        .post(
            &path,
            json!({"kind": "approval", "approved": false, "raiseUsd": 1}),
        )
        .await;
    assert_eq!(code, 409, "{v}");
    // A raise past a million dollars is refused (two of 1.7e308 once made a budget
    // infinite, and every read of the tree fail), as is one below a millionth of a dollar,
    // and changes nothing.
    for raise in [
        json!(1.7e308),
        json!(2_000_000),
        json!(1e300),
        json!(1e-200),
    ] {
        let answer = json!({"kind": "approval", "approved": true, "raiseUsd": raise});
        let (code, v) = api.post(&path, answer).await;
        assert_eq!(code, 400, "{raise}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("from 0.000001 to 1000000")),
            "{v}"
        );
    }
    let still = api
        .get_ok(&format!("/ctas/{}", cta["ctaId"].as_str().unwrap()))
        .await;
    assert_eq!(still["status"], "pending", "{still}");
    // Approved with the ask, it thinks again and completes.
    api.post_ok(&path, json!({"kind": "approval", "approved": true}))
        .await;
    let done = api.status(&run, "completed").await;
    assert_eq!(done["result"], "done", "{done}");
    // The approval covers the $0.20 spent past the budget and the ask.
    assert!(near(&done["budget"]["budgetUsd"], 2.2), "{done}");
    assert!(near(&done["budget"]["spentUsd"], 1.8), "{done}");
    assert!(near(&done["budget"]["stepUsd"], 1.0), "{done}");
    let raises = done["budget"]["raises"].as_array().unwrap();
    assert_eq!(raises.len(), 1, "{done}");
    assert!(near(&raises[0]["byUsd"], 1.2), "{done}");
    assert_eq!(raises[0]["ctaId"], cta["ctaId"], "{done}");
    let timeline = done["timeline"].as_array().unwrap();
    let asked = timeline
        .iter()
        .find(|e| e["name"] == "baton_budget")
        .unwrap_or_else(|| panic!("the question is in the timeline: {done}"));
    assert_eq!(asked["cta"]["status"], "answered", "{asked}");
    assert!(
        timeline
            .iter()
            .any(|e| e["type"] == "notice" && e["code"] == "budget_raised"),
        "{done}"
    );

    // A run's own budget, below its agent's: its first think spent it, so its subagent
    // waits before its own first think (the parent's spending counts at once) and the
    // tree's one question is the top-level run's. Refused, the whole tree ends.
    let run = api
        .post_ok("/runs", json!({"prompt": "go", "budgetUsd": 0.5}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cta = question(api, &run).await;
    assert_eq!(cta["rootRunId"], run.as_str(), "{cta}");
    assert_eq!(cta["runId"], run.as_str(), "the top-level run asks: {cta}");
    let kid_id = api.get_ok(&format!("/runs/{run}")).await["budgetWaiters"][0]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("the subagent waits on the question"));
    let kid = api.get_ok(&format!("/runs/{kid_id}")).await;
    assert_eq!(kid["state"], "waiting_on_user", "{kid}");
    assert_eq!(kid["budgetParked"], true, "{kid}");
    assert!(near(&cta["budget"]["budgetUsd"], 0.5), "{cta}");
    assert!(near(&cta["budget"]["spentUsd"], 0.6), "{cta}");
    let path = format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap());
    api.post_ok(
        &path,
        json!({"kind": "approval", "approved": false, "reason": "too dear"}),
    )
    .await;
    let failed = api.status(&run, "failed").await;
    assert_eq!(failed["error"]["code"], "budget_exhausted", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("too dear")),
        "{failed}"
    );
    assert!(near(&failed["budget"]["spentUsd"], 0.6), "{failed}");
    let kid = api.status(&kid_id, "cancelled").await;
    assert_eq!(
        kid["thinks"], 0,
        "the subagent never called its model: {kid}"
    );
}

/// Over AWS's APIs: `baton dev --aws` on moto (or LocalStack's DynamoDB Local, in CI).
mod aws {
    use super::*;

    #[tokio::test]
    async fn a_run_past_its_budget_asks_is_raised_and_completes_or_ends() {
        let aws = Arc::new(Emulator::start_with(common::aws::scenario_faults()).await);
        let (_mock, llm) = common::mock_openai::start(SCRIPT).await;
        let catalog = common::catalog(Some(agents()));
        let options = aws.dev_options(aws.names("budget"), llm, catalog, 0).await;
        let mut host = AwsHost::start(aws, options).await;
        budgets_ask(host.api()).await;
        host.stop().await;
    }

    /// A ledger item whose budget is no number (as an infinite one, or a damaged item,
    /// would be) is not read as 0: the run reads all the same, saying why its budget does
    /// not.
    #[tokio::test]
    async fn a_ledger_that_does_not_read_back_leaves_the_run_readable() {
        use aws_sdk_dynamodb::types::AttributeValue;
        let aws = Arc::new(Emulator::start_with(None).await);
        let (_mock, llm) = common::mock_openai::start(SCRIPT).await;
        let names = aws.names("badledger");
        let table = names.table();
        let options = aws
            .dev_options(names, llm, common::catalog(Some(agents())), 0)
            .await;
        let mut host = AwsHost::start(aws.clone(), options).await;
        let api = host.api();
        let run = asked(api).await;
        aws_sdk_dynamodb::Client::new(&aws.sdk().await)
            .update_item()
            .table_name(&table)
            .key("PK", AttributeValue::S(format!("RUN#{run}")))
            .key("SK", AttributeValue::S("BUDGET".into()))
            .update_expression("SET budgetUsd = :b")
            .expression_attribute_values(":b", AttributeValue::S("infinite".into()))
            .send()
            .await
            .unwrap();
        let (code, v) = api.get(&format!("/runs/{run}")).await;
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["status"], "waiting", "{v}");
        assert!(v.get("budget").is_none(), "{v}");
        assert!(
            v["budgetError"]
                .as_str()
                .is_some_and(|e| e.contains("budget ledger of")
                    && e.contains("`budgetUsd` is S(\"infinite\"), not a number")),
            "{v}"
        );
        host.stop().await;
    }
}
