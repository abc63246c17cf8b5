//! A waiting run and a new Baton: each release's fixture (`tests/fixtures/releases/<version>`,
//! written by that release's `release_fixture` example: a SQLite database and a DynamoDB
//! table's items, each holding a run parked on a question, one parked on an approval with a
//! follow-up waiting behind it, and one whose start was committed but never sent) is loaded
//! into this release's hosts, which finish every run. And a store that a newer release wrote
//! is refused at start, saying so.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use baton_core::agent::{AgentsFile, Catalog, Limits};
use baton_core::ports::SystemClock;
use common::aws::Api;
use serde_json::{Value, json};

/// Every release's fixture, oldest first.
fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/releases");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|d| d.unwrap().path())
        .filter(|p| p.join("manifest.json").exists())
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no release fixtures in {}",
        root.display()
    );
    dirs
}

struct Fixture {
    dir: PathBuf,
    manifest: Value,
    llm: Arc<dyn baton_core::llm::Llm>,
    catalog: Arc<Catalog>,
}

fn load(dir: &Path) -> Fixture {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let file: AgentsFile = serde_json::from_str(&read("agents.json")).unwrap();
    Fixture {
        dir: dir.to_path_buf(),
        manifest: serde_json::from_str(&read("manifest.json")).unwrap(),
        llm: common::scripted(&read("script.json")),
        catalog: Arc::new(Catalog::new(Limits::default(), vec![], Some(file)).unwrap()),
    }
}

/// A client with the fixture's token.
fn client(base: String, f: &Fixture) -> Api {
    let mut api = Api::new(base);
    api.token = f.manifest["token"].as_str().unwrap().to_owned();
    api
}

/// Finishes the fixture's three runs through the API: answers the question and the
/// approval; the run whose start was never sent was started by the host's sweep.
async fn finish(api: &Api, runs: &Value) {
    let asks = runs["asks"].as_str().unwrap();
    let queued = runs["queued"].as_str().unwrap();
    let outbox = runs["outbox"].as_str().unwrap();
    let done = api.status(outbox, "completed").await;
    assert_eq!(done["result"], "done", "{done}");
    for (run, answer) in [
        (asks, json!({"kind": "text", "text": "Ada"})),
        (queued, json!({"kind": "approval", "approved": true})),
    ] {
        let path = format!("/ctas?status=pending&rootRunId={run}");
        let cta = api
            .wait("the fixture's question", async |api: &Api| {
                let (_, v) = api.get(&path).await;
                v["ctas"].as_array().and_then(|c| c.first().cloned())
            })
            .await;
        let (code, v) = api
            .post(
                &format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap()),
                answer,
            )
            .await;
        assert_eq!(code, 202, "{v}");
    }
    let run = api.status(asks, "completed").await;
    assert_eq!(run["result"], "Hello.", "{run}");
    // The approved turn ends, then the follow-up that waited behind it takes its own.
    let run = api
        .wait("the follow-up's turn", async |api: &Api| {
            let (_, run) = api.get(&format!("/runs/{queued}")).await;
            (run["status"] == "completed" && run["result"] == "two").then_some(run)
        })
        .await;
    let users = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "user")
        .count();
    assert_eq!(users, 2, "{run}");
}

fn local_options(dir: &Path, f: &Fixture) -> baton_dev::LocalOptions {
    baton_dev::LocalOptions {
        data_dir: dir.to_path_buf(),
        addr: "127.0.0.1:0".parse().unwrap(),
        token: Some(f.manifest["token"].as_str().unwrap().to_owned()),
        llm: f.llm.clone(),
        catalog: f.catalog.clone(),
        clock: Arc::new(SystemClock),
        worker: Default::default(),
        link_key: None,
        public_url: None,
        cache_bytes: baton_core::service::DEFAULT_CACHE_BYTES,
        traces: None,
        quotas: Default::default(),
        users: Vec::new(),
        smtp_url: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_releases_sqlite_data_is_read_and_its_waiting_runs_finish() {
    for dir in fixtures() {
        let f = load(&dir);
        let data = tempfile::tempdir().unwrap();
        std::fs::copy(f.dir.join("baton.db"), data.path().join("baton.db")).unwrap();
        let server = baton_dev::LocalServer::start(local_options(data.path(), &f))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        finish(&client(server.url(), &f), &f.manifest["sqlite"]).await;
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_store_a_newer_release_wrote_is_refused_at_start() {
    let f = load(&fixtures()[0]);
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("baton.db");
    std::fs::copy(f.dir.join("baton.db"), &db).unwrap();
    let run_sql = |sql: &str| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); r=c.execute(sys.argv[2]).fetchall(); c.commit(); print(r)"])
            .arg(&db)
            .arg(sql)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let set_format = |value: &str| {
        run_sql(&format!(
            "UPDATE meta SET value = '{value}' WHERE key = 'format'"
        ));
    };
    let newer = baton_core::ports::STORE_FORMAT + 1;
    set_format(&newer.to_string());
    let Err(e) = baton_dev::LocalServer::start(local_options(data.path(), &f)).await else {
        panic!("a store of format {newer} was opened");
    };
    let e = e.to_string();
    assert!(
        e.contains(&format!("newer Baton (store format {newer})")),
        "{e}"
    );
    // A format that is no number is said as found, not read as a newer one.
    set_format("3.x");
    let Err(e) = baton_dev::LocalServer::start(local_options(data.path(), &f)).await else {
        panic!("a store of format 3.x was opened");
    };
    let e = e.to_string();
    assert!(
        e.contains("records its store format as \"3.x\", which is not a format number")
            && !e.contains("newer"),
        "{e}"
    );
    // No format recorded (a store written before formats were): read as format 1, brought
    // up to this release's, and its format recorded.
    run_sql("DELETE FROM meta WHERE key = 'format'");
    let server = baton_dev::LocalServer::start(local_options(data.path(), &f))
        .await
        .expect("a store of format 1 opens");
    server.shutdown().await;
    assert_eq!(
        run_sql("SELECT value FROM meta WHERE key = 'format'"),
        format!("[('{}',)]", baton_core::ports::STORE_FORMAT)
    );
}

/// DynamoDB JSON (`{"S": ...}`) as the SDK's attribute value.
fn attribute(v: &Value) -> AttributeValue {
    use base64::Engine as _;
    let b64 = |s: &Value| {
        aws_sdk_dynamodb::primitives::Blob::new(
            base64::engine::general_purpose::STANDARD
                .decode(s.as_str().unwrap())
                .unwrap(),
        )
    };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    let (kind, v) = v.as_object().unwrap().iter().next().unwrap();
    match kind.as_str() {
        "S" => AttributeValue::S(v.as_str().unwrap().to_owned()),
        "N" => AttributeValue::N(v.as_str().unwrap().to_owned()),
        "B" => AttributeValue::B(b64(v)),
        "BOOL" => AttributeValue::Bool(v.as_bool().unwrap()),
        "NULL" => AttributeValue::Null(true),
        "SS" => AttributeValue::Ss(strings(v)),
        "NS" => AttributeValue::Ns(strings(v)),
        "BS" => AttributeValue::Bs(v.as_array().unwrap().iter().map(b64).collect()),
        "L" => AttributeValue::L(v.as_array().unwrap().iter().map(attribute).collect()),
        "M" => AttributeValue::M(
            v.as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), attribute(v)))
                .collect(),
        ),
        other => panic!("unknown DynamoDB type {other}"),
    }
}

async fn put_items(sdk: &aws_config::SdkConfig, table: &str, items: &[Value]) {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    for item in items {
        let item = item
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), attribute(v)))
            .collect();
        ddb.put_item()
            .table_name(table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_releases_dynamodb_data_is_read_and_its_waiting_runs_finish_and_a_newer_table_is_refused()
 {
    for dir in fixtures() {
        let f = load(&dir);
        let aws = common::aws::Emulator::start().await;
        let names = aws.names("release");
        let server = aws
            .dev_host_named(names.clone(), f.llm.clone(), f.catalog.clone())
            .await;
        let table = server.provisioned.config.table.clone();
        let items: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("dynamodb.json")).unwrap())
                .unwrap();
        put_items(&aws.sdk().await, &table, &items).await;
        // The sweep's tick sends the start the old release committed and never sent.
        let swept = server.sweep(chrono::Duration::zero()).await.unwrap();
        assert!(swept >= 1, "the unsent start was sent");
        // (A token is no data of the store's: the runs' owner is the dev hosts' one.)
        finish(&Api::new(server.url()), &f.manifest["dynamodb"]).await;
        server.shutdown().await;

        // A newer release's mark on the table: this one will not start on it.
        let newer = baton_core::ports::STORE_FORMAT + 1;
        let mark =
            json!({"PK": {"S": "BATON"}, "SK": {"S": "FORMAT"}, "fmt": {"N": newer.to_string()}});
        put_items(&aws.sdk().await, &table, &[mark]).await;
        let sdk = aws.host_sdk().await;
        let started = baton_dev::AwsDevServer::start(baton_dev::AwsDevOptions {
            ..baton_dev::AwsDevOptions::new(
                sdk.clone(),
                names.clone(),
                "arn:aws:iam::123456789012:role/release-scheduler",
                "t",
                f.llm.clone(),
                f.catalog.clone(),
            )
        })
        .await;
        let Err(e) = started else {
            panic!("a table of format {newer} was used");
        };
        let e = e.to_string();
        assert!(
            e.contains(&format!("newer Baton (store format {newer})")),
            "{e}"
        );
        // A format that is no number (a string here) is said as found.
        let mark = json!({"PK": {"S": "BATON"}, "SK": {"S": "FORMAT"}, "fmt": {"S": "3.x"}});
        put_items(&aws.sdk().await, &table, &[mark]).await;
        let options = |names| baton_dev::AwsDevOptions {
            ..baton_dev::AwsDevOptions::new(
                sdk.clone(),
                names,
                "arn:aws:iam::123456789012:role/release-scheduler",
                "t",
                f.llm.clone(),
                f.catalog.clone(),
            )
        };
        let Err(e) = baton_dev::AwsDevServer::start(options(names.clone())).await else {
            panic!("a table of format \"3.x\" was used");
        };
        let e = e.to_string();
        assert!(
            e.contains("records its store format as \"3.x\", which is not a format number"),
            "{e}"
        );
        // No format recorded (a table written before formats were, format 1): used, and
        // this release's recorded.
        let dynamo = aws_sdk_dynamodb::Client::new(&aws.sdk().await);
        let key = std::collections::HashMap::from(
            [("PK", "BATON"), ("SK", "FORMAT")]
                .map(|(k, v)| (k.into(), AttributeValue::S(v.into()))),
        );
        let delete = dynamo
            .delete_item()
            .table_name(&table)
            .set_key(Some(key.clone()));
        delete.send().await.unwrap();
        let server = baton_dev::AwsDevServer::start(options(names))
            .await
            .expect("a table of format 1 is used");
        server.shutdown().await;
        let get = dynamo.get_item().table_name(&table).set_key(Some(key));
        let item = get.send().await.unwrap();
        let recorded = item.item().and_then(|i| i.get("fmt")?.as_n().ok().cloned());
        assert_eq!(recorded, Some(baton_core::ports::STORE_FORMAT.to_string()));
    }
}
