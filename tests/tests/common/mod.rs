//! Shared harness: a local server on a temporary data dir, and a small HTTP client.
#![allow(dead_code)]

pub mod appsync;
pub mod aws;
pub mod browser;
pub mod fault;
pub mod host;
pub mod mock_openai;
pub mod moto;
pub mod python;
pub mod sse;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::agent::{AgentsFile, Catalog, Limits};
use baton_core::llm::Llm;
use baton_core::ports::{Clock, SystemClock};
use baton_dev::worker::WorkerOptions;
use baton_dev::{LocalOptions, LocalServer};
use baton_llm::scripted::ScriptedLlm;
use serde_json::{Value, json};

pub const TOKEN: &str = "test-token";

/// The people both test hosts know besides their owner (`--users`): `alice` and `bob` in
/// `ops`, `carol` in none, `dave` in `support`. Each one's token is `<name>-token-0123456789`.
pub fn test_users() -> Vec<baton_api::TokenUser> {
    [
        ("alice", &["ops"][..]),
        ("bob", &["ops"][..]),
        ("carol", &[][..]),
        ("dave", &["support"][..]),
    ]
    .into_iter()
    .map(|(user, groups)| baton_api::TokenUser {
        token: user_token(user),
        user: user.into(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
    })
    .collect()
}

/// The token of test user `user` ([`test_users`]).
pub fn user_token(user: &str) -> String {
    format!("{user}-token-0123456789")
}

/// Asks `f` every `every` until it answers, for up to `within`; a test that waits longer
/// fails, naming `what` it waited for. Every harness waits through this one loop.
pub async fn wait_for<T>(
    what: &str,
    within: std::time::Duration,
    every: std::time::Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}

/// A query for every CTA of an owner (of one status, or all): one page as large as any test.
pub fn every_cta(status: Option<baton_core::cta::CtaStatus>) -> baton_core::ports::CtaQuery {
    baton_core::ports::CtaQuery {
        status,
        limit: 100_000,
        ..Default::default()
    }
}

/// The target directory these tests were built in (`target/`, or `CARGO_TARGET_DIR`, or
/// whatever cargo was told): the test binary is `<target>/<profile>/deps/<name>`. The
/// helpers' installs (a Python virtualenv, Node packages) and artifacts live under it.
pub fn target_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

pub fn examples(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn scripted(json: &str) -> Arc<dyn Llm> {
    Arc::new(ScriptedLlm::from_json(json, "test").expect("valid script"))
}

pub fn catalog(agents: Option<Value>) -> Arc<Catalog> {
    let file: Option<AgentsFile> = agents.map(|a| serde_json::from_value(a).expect("valid agents"));
    Arc::new(Catalog::new(Limits::default(), vec![], file).expect("catalog"))
}

pub struct Harness {
    pub server: LocalServer,
    pub http: reqwest::Client,
}

pub async fn start(dir: &Path, llm: Arc<dyn Llm>, catalog: Arc<Catalog>) -> Harness {
    start_with(dir, llm, catalog, Arc::new(SystemClock), false).await
}

/// [`start`], on `clock`.
pub async fn start_at(
    dir: &Path,
    llm: Arc<dyn Llm>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
) -> Harness {
    start_with(dir, llm, catalog, clock, false).await
}

/// [`start`], with every message handled twice when `duplicate`.
pub async fn start_with(
    dir: &Path,
    llm: Arc<dyn Llm>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
    duplicate: bool,
) -> Harness {
    let mut options = local_options(dir, llm, catalog, clock);
    options.worker.duplicate = duplicate;
    start_from(options).await
}

/// A [`Harness`] over `baton dev` started with `options`.
pub async fn start_from(options: LocalOptions) -> Harness {
    let server = LocalServer::start(options).await.expect("server starts");
    Harness {
        server,
        http: reqwest::Client::new(),
    }
}

/// How the tests start `baton dev`: in `dir`, on any free port, with the test token and a
/// worker whose timers tick every 50 ms.
pub fn local_options(
    dir: &Path,
    llm: Arc<dyn Llm>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
) -> LocalOptions {
    LocalOptions {
        token: Some(TOKEN.into()),
        clock,
        worker: WorkerOptions {
            timer_interval: Duration::from_millis(50),
            ..WorkerOptions::default()
        },
        users: test_users(),
        ..LocalOptions::new(dir, llm, catalog)
    }
}

pub async fn start_scripted(dir: &Path, script: &str) -> Harness {
    start(dir, scripted(script), catalog(None)).await
}

impl Harness {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.url())
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut rb = self.http.request(method, self.url(path)).bearer_auth(TOKEN);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb.send().await.expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// The run's event stream, kept open while the run rests (`?follow=true`).
    pub async fn follow(&self, run_id: &str) -> reqwest::Response {
        self.http
            .get(self.url(&format!("/runs/{run_id}/stream?follow=true")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
    }

    pub async fn create_run(&self, body: Value) -> String {
        let (status, v) = self.post("/runs", body).await;
        assert_eq!(status, 202, "{v}");
        assert_eq!(v["status"], "queued");
        v["runId"].as_str().expect("runId").to_owned()
    }

    /// Polls the run until its status is one of `want`.
    pub async fn wait_status(&self, run_id: &str, want: &[&str]) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (code, run) = self.get(&format!("/runs/{run_id}")).await;
            assert_eq!(code, 200, "{run}");
            if want.contains(&run["status"].as_str().unwrap_or("")) {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "run {run_id} stayed {} (wanted {want:?}): {run:#}",
                run["status"]
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The run with its whole timeline, paged past the 100 entries `GET /runs/{id}` holds.
    pub async fn whole(&self, run_id: &str) -> Value {
        let (code, mut run) = self.get(&format!("/runs/{run_id}")).await;
        assert_eq!(code, 200, "{run}");
        let mut next = run["timelineNext"].as_u64();
        while let Some(after) = next {
            let (code, page) = self
                .get(&format!("/runs/{run_id}/timeline?after={after}&limit=100"))
                .await;
            assert_eq!(code, 200, "{page}");
            let entries = page["entries"].as_array().cloned().expect("entries");
            next = page["next"].as_u64().filter(|_| !entries.is_empty());
            run["timeline"]
                .as_array_mut()
                .expect("timeline")
                .extend(entries);
        }
        run
    }

    pub async fn pending_ctas(&self) -> Vec<Value> {
        let (code, v) = self.get("/ctas?status=pending").await;
        assert_eq!(code, 200, "{v}");
        v["ctas"].as_array().cloned().expect("ctas array")
    }

    /// Waits until `n` CTAs are pending and returns them.
    pub async fn wait_pending(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ctas = self.pending_ctas().await;
            if ctas.len() == n {
                return ctas;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} pending CTAs, have {ctas:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The timeline entries of a run of one type.
/// The type of each entry of `run`'s timeline, in order.
pub fn entry_types(run: &Value) -> Vec<&str> {
    run["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default())
        .collect()
}

pub fn of_type<'a>(run: &'a Value, ty: &str) -> Vec<&'a Value> {
    run["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .filter(|e| e["type"] == ty)
        .collect()
}

/// Replaces ids and times, which differ from run to run, by placeholders.
pub fn normalize(v: &Value, run_id: &str) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "at" | "createdAt"
                            | "resolvedAt"
                            | "expiresAt"
                            | "updatedAt"
                            | "lastError"
                            // How long things took: never the same twice.
                            | "latencyMs"
                            | "firstTokenMs"
                            | "durationMs"
                            | "startedAt"
                            | "phaseSince"
                    )
                })
                .map(|(k, v)| (k.clone(), normalize(v, run_id)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|v| normalize(v, run_id)).collect()),
        Value::String(s) if s == run_id => json!("RUN"),
        Value::String(s) if s.starts_with("cta_") => json!("CTA"),
        Value::String(s) if s.starts_with("msg_") => json!("MSG"),
        Value::String(s) if s.starts_with("run_") || s.starts_with("sub_") => json!("CHILD"),
        v => v.clone(),
    }
}

/// A Rust tool that returns, beside its result, a table widget, a key/value card and a CSV
/// file (what a reporting tool would).
pub struct ReportTool;

/// `n` bytes that do not compress, the same for the same `n`.
pub fn report_bytes(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The CSV `ReportTool` returns.
pub const REPORT_CSV: &str = "region,sales\neu,12\nus,30\n";

#[async_trait::async_trait]
impl baton_core::tools::Tool for ReportTool {
    fn name(&self) -> &str {
        "report"
    }
    fn description(&self) -> &str {
        "Sales by region, as a table, a summary card and a CSV file."
    }
    fn schema(&self) -> Value {
        json!({"type": "object", "properties": {"bytes": {"type": "integer", "minimum": 1},
            "waitMs": {"type": "integer", "minimum": 1}},
            "additionalProperties": false})
    }
    async fn execute(
        &self,
        ctx: &baton_core::tools::ToolContext,
        input: Value,
    ) -> Result<Value, baton_core::tools::ToolError> {
        // A report that takes its time, when asked (a tool seen running).
        if let Some(ms) = input["waitMs"].as_u64() {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        if let Some(n) = input["bytes"].as_u64() {
            // The raw data too, when asked: `n` bytes of `report_bytes`.
            ctx.file(
                "sales.bin",
                "application/octet-stream",
                report_bytes(n as usize),
                "the raw data",
            )?;
        }
        ctx.widget(
            "table",
            json!({"columns": ["region", "sales"], "rows": [["eu", 12], ["us", 30]]}),
        )?;
        ctx.widget("card", json!({"total": 42, "regions": 2}))?;
        ctx.file(
            "sales.csv",
            "text/csv",
            REPORT_CSV.as_bytes().to_vec(),
            "2 regions, 42 sales in all",
        )?;
        Ok(json!({"total": 42}))
    }
}

/// The catalog of `agents`, with [`ReportTool`] among its tools.
/// The deployment's catalog as `baton dev` builds it from an agents file (HTTP tools, MCP
/// servers and all), with nothing from the environment.
pub fn tools_catalog(agents: Value) -> Arc<Catalog> {
    let file: AgentsFile = serde_json::from_value(agents).expect("valid agents");
    let catalog = baton_tools::catalog(
        Some(file),
        baton_tools::Host::Dev,
        &|_| None,
        &Default::default(),
    );
    Arc::new(catalog.expect("catalog"))
}

pub fn catalog_with_report(agents: Value) -> Arc<Catalog> {
    let file: AgentsFile = serde_json::from_value(agents).expect("valid agents");
    let tools: Vec<Arc<dyn baton_core::tools::Tool>> = vec![Arc::new(ReportTool)];
    Arc::new(Catalog::new(Limits::default(), tools, Some(file)).expect("catalog"))
}

/// `len` bytes of text that no codec shrinks much (26 letters, a xorshift's), different for
/// each `seed`.
pub fn noise(seed: u64, len: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// A service over the embedded store, as `baton dev` builds one (without its links, live
/// channel or observers).
pub fn local_service(
    store: &baton_local::LocalStore,
    llm: Arc<dyn Llm>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
) -> Arc<baton_core::service::Service> {
    let deps = baton_local::local_deps(store, llm, clock);
    Arc::new(baton_core::service::Service::builder(deps, catalog).build())
}

/// Creates a run of `agent` (prompt "go") for the dev host's owner through `svc`'s requests.
pub async fn create_run_of(svc: &baton_core::service::Service, agent: &str) -> String {
    let req = baton_core::service::CreateRun {
        prompt: "go".into(),
        agent: Some(agent.into()),
        ..Default::default()
    };
    svc.requests()
        .create_run(baton_dev::LOCAL_OWNER, req, None)
        .await
        .expect("created")
        .run_id
}

/// The `Idempotency-Key` of each request `requests` holds, in order (empty where none).
pub fn idempotency_keys<'a>(
    requests: impl IntoIterator<Item = &'a wiremock::Request>,
) -> Vec<String> {
    requests
        .into_iter()
        .map(|r| {
            r.headers
                .get("idempotency-key")
                .and_then(|k| k.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// The seq of the first entry of `run`'s timeline (as the API shows it) that holds a question.
pub fn question_seq(run: &Value) -> u64 {
    run["timeline"]
        .as_array()
        .and_then(|t| t.iter().find(|e| e["cta"].is_object()))
        .and_then(|e| e["seq"].as_u64())
        .expect("a question's entry")
}
