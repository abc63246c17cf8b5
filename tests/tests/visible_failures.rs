//! Failures a user can see: a step that keeps failing shows its last error on the run while
//! it is retried; a model provider that is down holds its runs until it answers again, and
//! fails none of them.

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
async fn an_unreachable_model_shows_as_the_last_error_and_the_run_waits_for_it() {
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
        users: Vec::new(),
        smtp_url: None,
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

    // Past its retries the run is not failed: the model provider is down, not the run. Its
    // message goes back to its queue, round after round, and the run waits, saying why.
    let count = |page: &str, name: &str| -> u64 {
        page.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{")))
            .and_then(|rest| rest.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, page) = h.get("/metrics").await;
        // Three rounds of three failed deliveries: more than the four a run's own failures
        // end it after.
        if count(page.as_str().unwrap(), "baton_step_failures_total") >= 7 {
            break;
        }
        assert!(Instant::now() < deadline, "fewer than 7 failures");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, waiting) = h.get(&format!("/runs/{run_id}")).await;
    assert_eq!(waiting["status"], "queued", "{waiting:#}");
    assert_eq!(waiting["lastError"]["provider"], true, "{waiting:#}");
    // The provider answers again (on the address the client calls): the run goes on by
    // itself, and completes.
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let mock = wiremock::MockServer::builder()
        .listener(listener)
        .start()
        .await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"role": "assistant", "content": "back"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})))
        .mount(&mock)
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let (_, run) = h.get(&format!("/runs/{run_id}")).await;
        if run["status"] == "completed" {
            break run;
        }
        assert_ne!(run["status"], "failed", "{run:#}");
        assert!(Instant::now() < deadline, "never completed: {run:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["result"], "back");
    assert!(done.get("lastError").is_none(), "the commit clears it");
    h.server.shutdown().await;
}
