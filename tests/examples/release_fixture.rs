//! Writes this release's fixture: the data a waiting deployment of it holds, for later
//! releases to read and finish (`tests/tests/releases.rs`). Run once per release:
//!
//! ```sh
//! cargo run -p baton-tests --example release_fixture -- tests/fixtures/releases/<version> <emulator URL>
//! ```
//!
//! with moto's server (or LocalStack) at the URL. Both stores get three runs: one parked on
//! a question (its expiry timer armed), one parked on an approval with a follow-up waiting
//! behind it, and one whose start was committed but never sent (its outbox not performed,
//! as when the API died right after the insert). The fixture is the SQLite data directory's
//! database, the DynamoDB table's items as DynamoDB JSON, the script and agents file they
//! run with, and `manifest.json` naming the runs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a one-shot tool: a panic says what failed

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use baton_core::agent::{AgentsFile, Catalog, Limits};
use baton_core::failpoint;
use baton_llm::scripted::ScriptedLlm;
use serde_json::{Value, json};

const TOKEN: &str = "fixture-token";

/// What the fixture's runs think: each agent's replies, by think.
pub const SCRIPT: &str = r#"{
  "asker": [{"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Name?"}}]},
            {"text": "Hello."}],
  "gated": [{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]},
            {"text": "one"}, {"text": "two"}],
  "idle": [{"text": "done"}]}"#;

pub fn agents() -> Value {
    json!({"agents": {
        "asker": {"tools": ["request_human_feedback"]},
        "gated": {"tools": ["echo"], "approval": {"echo": "always"}},
        "idle": {"tools": []}}})
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(out), Some(endpoint)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: release_fixture OUT_DIR EMULATOR_URL");
        std::process::exit(2);
    };
    let out = Path::new(out);
    std::fs::create_dir_all(out).unwrap();
    let file: AgentsFile = serde_json::from_value(agents()).unwrap();
    let catalog = Arc::new(Catalog::new(Limits::default(), vec![], Some(file)).unwrap());
    let llm = Arc::new(ScriptedLlm::from_json(SCRIPT, "fixture").unwrap());

    // The embedded store.
    let dir = tempfile::tempdir().unwrap();
    let server = baton_dev::LocalServer::start(baton_dev::LocalOptions {
        token: Some(TOKEN.into()),
        worker: Default::default(),
        ..baton_dev::LocalOptions::new(dir.path(), llm.clone(), catalog.clone())
    })
    .await
    .unwrap();
    let sqlite = waiting_runs(&server.url()).await;
    server.shutdown().await;
    std::fs::copy(dir.path().join("baton.db"), out.join("baton.db")).unwrap();

    // DynamoDB, through baton dev --aws.
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "test", "test", None, None, "moto",
        ))
        .load()
        .await;
    let names = baton_aws::provision::Names::new("fixture");
    let server = baton_dev::AwsDevServer::start(baton_dev::AwsDevOptions {
        ..baton_dev::AwsDevOptions::new(
            sdk.clone(),
            names,
            "arn:aws:iam::123456789012:role/fixture-scheduler",
            TOKEN,
            llm,
            catalog,
        )
    })
    .await
    .unwrap();
    let dynamo = waiting_runs(&server.url()).await;
    let table = server.provisioned.config.table.clone();
    server.shutdown().await;
    let items = scan(&aws_sdk_dynamodb::Client::new(&sdk), &table).await;
    std::fs::write(
        out.join("dynamodb.json"),
        serde_json::to_string_pretty(&items).unwrap() + "\n",
    )
    .unwrap();

    std::fs::write(out.join("script.json"), SCRIPT.to_owned() + "\n").unwrap();
    std::fs::write(
        out.join("agents.json"),
        serde_json::to_string_pretty(&agents()).unwrap() + "\n",
    )
    .unwrap();
    let manifest = json!({
        "release": env!("CARGO_PKG_VERSION"),
        "storeFormat": baton_core::ports::STORE_FORMAT,
        "token": TOKEN,
        "sqlite": sqlite,
        "dynamodb": dynamo,
    });
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap() + "\n",
    )
    .unwrap();
    println!("wrote {}", out.display());
}

/// The three waiting runs, made through the API of the host at `base`: their ids.
async fn waiting_runs(base: &str) -> Value {
    let http = reqwest::Client::new();
    let post = async |path: &str, body: Value| {
        let r = http
            .post(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let code = r.status().as_u16();
        (code, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    let get = async |path: &str| -> Value {
        let r = http
            .get(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        r.json().await.unwrap()
    };
    let until = async |what: &str, path: String, f: &dyn Fn(&Value) -> bool| -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = get(&path).await;
            if f(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (_, v) = post("/runs", json!({"prompt": "ask", "agent": "asker"})).await;
    let asks = v["runId"].as_str().unwrap().to_owned();
    until("the question", format!("/runs/{asks}"), &|r| {
        r["status"] == "waiting"
    })
    .await;

    let (_, v) = post("/runs", json!({"prompt": "go", "agent": "gated"})).await;
    let queued = v["runId"].as_str().unwrap().to_owned();
    until("the approval", format!("/runs/{queued}"), &|r| {
        r["status"] == "waiting"
    })
    .await;
    let (code, v) = post(
        &format!("/runs/{queued}/messages"),
        json!({"text": "and then?"}),
    )
    .await;
    assert_eq!(code, 202, "{v}");
    until("the queued follow-up", format!("/runs/{queued}"), &|r| {
        r["queued"].as_array().is_some_and(|q| q.len() == 1)
    })
    .await;

    // Committed, never sent: the API "dies" right after the insert.
    failpoint::arm("create.after_insert", 0);
    let (code, _) = post("/runs", json!({"prompt": "idle", "agent": "idle"})).await;
    assert!(code >= 500, "the create was cut short");
    failpoint::reset();
    let runs = get("/runs?agent=idle").await;
    let outbox = runs["runs"][0]["runId"].as_str().unwrap().to_owned();
    json!({"asks": asks, "queued": queued, "outbox": outbox})
}

/// Every item of `table`, as DynamoDB JSON, in key order.
async fn scan(ddb: &aws_sdk_dynamodb::Client, table: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let page = ddb
            .scan()
            .table_name(table)
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        items.extend(
            page.items()
                .iter()
                .map(|i| Value::Object(i.iter().map(|(k, v)| (k.clone(), to_json(v))).collect())),
        );
        match page.last_evaluated_key() {
            Some(k) => start = Some(k.clone()),
            None => break,
        }
    }
    items.sort_by_key(|i| (i["PK"].to_string(), i["SK"].to_string()));
    items
}

fn to_json(v: &AttributeValue) -> Value {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    match v {
        AttributeValue::S(s) => json!({"S": s}),
        AttributeValue::N(n) => json!({"N": n}),
        AttributeValue::B(b) => json!({"B": b64(b.as_ref())}),
        AttributeValue::Bool(b) => json!({"BOOL": b}),
        AttributeValue::Null(_) => json!({"NULL": true}),
        AttributeValue::Ss(s) => json!({"SS": s}),
        AttributeValue::Ns(n) => json!({"NS": n}),
        AttributeValue::Bs(b) => {
            json!({"BS": b.iter().map(|b| b64(b.as_ref())).collect::<Vec<_>>()})
        }
        AttributeValue::L(l) => json!({"L": l.iter().map(to_json).collect::<Vec<_>>()}),
        AttributeValue::M(m) => {
            json!({"M": m.iter().map(|(k, v)| (k.clone(), to_json(v))).collect::<BTreeMap<_, _>>()})
        }
        _ => panic!("an attribute type this tool does not know: {v:?}"),
    }
}
