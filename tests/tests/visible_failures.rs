//! Failures a user can see: a step that keeps failing shows its last error on the run while
//! it is retried, and the run it finally fails carries the root cause, not only a count.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::ports::SystemClock;
use baton_dev::worker::WorkerOptions;
use baton_dev::{LocalOptions, LocalServer};
use baton_llm::openai::{OpenAiConfig, OpenAiLlm};
use common::*;
use serde_json::json;

#[tokio::test]
async fn an_unreachable_model_shows_as_the_last_error_and_then_as_the_failure() {
    // A port with nothing listening: every model call is refused at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let llm = Arc::new(
        OpenAiLlm::new(OpenAiConfig {
            max_tokens: None,
            base_url: base_url.clone(),
            api_key: None,
            model: "m".into(),
            max_retries: 0,
            backoff: baton_llm::retry::Backoff {
                initial: Duration::from_millis(1),
                max: Duration::from_millis(1),
            },
            timeout: Duration::from_secs(2),
        })
        .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = LocalServer::start(LocalOptions {
        data_dir: dir.path().to_path_buf(),
        addr: "127.0.0.1:0".parse().unwrap(),
        token: Some(TOKEN.into()),
        llm,
        catalog: catalog(None),
        clock: Arc::new(SystemClock),
        worker: WorkerOptions {
            max_receives: 3,
            ..WorkerOptions::default()
        },
        link_key: None,
        public_url: None,
        cache_bytes: baton_core::service::DEFAULT_CACHE_BYTES,
        traces: None,
        quotas: Default::default(),
    })
    .await
    .unwrap();
    let h = Harness {
        server,
        http: reqwest::Client::new(),
    };
    let run_id = h.create_run(json!({"prompt": "hello"})).await;

    // While it retries: the run says what goes wrong, and how often it was tried.
    let deadline = Instant::now() + Duration::from_secs(20);
    let retrying = loop {
        let (_, run) = h.get(&format!("/runs/{run_id}")).await;
        if run.get("lastError").is_some() {
            break run;
        }
        assert!(Instant::now() < deadline, "no lastError: {run:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let last = &retrying["lastError"];
    let message = last["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("cannot reach {base_url}")) && message.contains("refused"),
        "{last:#}"
    );
    assert!(last["attempts"].as_u64().unwrap() >= 1, "{last:#}");
    assert_eq!(retrying["status"], "queued");

    // When the retries are spent, the failure names the cause.
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        let (_, run) = h.get(&format!("/runs/{run_id}")).await;
        if run["status"] == "failed" {
            break run;
        }
        assert!(Instant::now() < deadline, "never failed: {run:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let error = failed["error"]["message"].as_str().unwrap();
    assert_eq!(failed["error"]["code"], "dead_letter");
    assert!(
        error.contains(&format!("cannot reach {base_url}")) && error.contains("3 times"),
        "{error}"
    );
    assert!(
        failed.get("lastError").is_none(),
        "the failing commit clears it"
    );
    // Each failed delivery is counted by agent (`GET /metrics`); the step that failed the
    // run is a committed one.
    let (code, page) = h.get("/metrics").await;
    assert_eq!(code, 200);
    let page = page.as_str().unwrap();
    let agent = failed["agent"].as_str().unwrap();
    let count = |name: &str| {
        page.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{agent=\"{agent}\"")))
            .and_then(|rest| rest.rsplit(' ').next())
            .unwrap_or_else(|| panic!("no {name} for {agent}: {page}"))
            .to_owned()
    };
    // Three deliveries failed, then the dead letter went back to its queue once (three
    // failures of its own are fewer than the four it gives up after), and three more failed.
    assert_eq!(count("baton_step_failures_total"), "6", "{page}");
    assert_eq!(count("baton_runs_ended_total"), "1", "{page}");
    h.server.shutdown().await;
}
