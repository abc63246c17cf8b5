//! A reply paid once, a call run once, on both hosts (`baton dev` over SQLite, `baton dev
//! --aws` over moto): a mock model that counts what it is asked, and two HTTP tools that
//! record each request's `Idempotency-Key` — `book` (`idempotent`, HTTP tools' default) and
//! `pay` (`"effects": "once"`). The model's first reply calls both; the host is crashed at
//! a failpoint (after the reply's commit, after a tool, between the two) and restarted.
//! Whatever the crash, the model is asked once per reply, `book` runs again only under its
//! first key, and `pay` runs at most once: cut off, the model is told its outcome is
//! unknown, or a person is asked whether to run it again.

use crate::common;

use std::sync::Arc;

use baton_core::failpoint;
use baton_core::ports::SystemClock;
use common::aws::Emulator;
use common::host::{AwsHost, Crash, LocalHost, TestHost};
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, ResponseTemplate, matchers};

use crate::FAILPOINTS as SERIAL;

/// Books, then pays, in one reply; then says so.
const SCRIPT: &str = r#"{"ops": [
    {"tool_calls": [{"name": "book", "arguments": {"what": "table"}},
                    {"name": "pay", "arguments": {"cents": 500}}]},
    {"text": "Booked and paid."}]}"#;

/// The two tools' stand-in: each request recorded, each answered `{"ok": true}`.
async fn tool_server() -> MockServer {
    let tools = MockServer::start().await;
    Mock::given(matchers::method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true})))
        .mount(&tools)
        .await;
    tools
}

/// `ops` with `book` and `pay`, doing with a cut-off `pay` what `on_unknown` says.
fn agents(tools: &MockServer, on_unknown: &str) -> Arc<baton_core::agent::Catalog> {
    let tool = |path: &str| {
        json!({"url": format!("{}/{path}", tools.uri()), "description": path,
               "schema": {"type": "object"}})
    };
    let mut pay = tool("pay");
    pay["effects"] = json!("once");
    common::tools_catalog(json!({
        "tools": {"book": tool("book"), "pay": pay},
        "agents": {"ops": {"system": "agent:ops", "tools": ["book", "pay"],
                           "onUnknownOutcome": on_unknown}}
    }))
}

/// What the world saw: the model's requests, and each tool's keys, in order.
#[derive(Debug)]
struct Seen {
    model: Vec<Value>,
    book: Vec<String>,
    pay: Vec<String>,
}

async fn seen(model: &MockServer, tools: &MockServer) -> Seen {
    let asked = model.received_requests().await.unwrap_or_default();
    let sent = tools.received_requests().await.unwrap_or_default();
    let keys = |path: &str| common::idempotency_keys(sent.iter().filter(|r| r.url.path() == path));
    Seen {
        model: asked
            .iter()
            .map(|r| serde_json::from_slice(&r.body).unwrap_or_default())
            .collect(),
        book: keys("/book"),
        pay: keys("/pay"),
    }
}

/// The result of the run's `name` call.
fn result<'a>(run: &'a Value, name: &str) -> &'a Value {
    &run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool" && e["name"] == name)
        .unwrap_or_else(|| panic!("no {name} call: {run}"))["result"]
}

/// The scenario on `host`, crashed at `fp` after `skip` passes (`""`: none); with
/// `approve`, a question about a cut-off call is answered so. The finished run.
async fn scenario<H: TestHost>(host: H, fp: &str, skip: u32, approve: Option<bool>) -> Value {
    failpoint::reset();
    let mut crash = Crash::arm(host, fp, skip);
    let run_id = crash.create(json!({"prompt": "go", "agent": "ops"})).await;
    let at_rest = |r: &Value| {
        r["status"] == "completed" || r["status"] == "failed" || r["state"] == "waiting_on_user"
    };
    let mut run = crash.until(&run_id, at_rest).await;
    if let Some(approved) = approve {
        assert_eq!(run["state"], "waiting_on_user", "{fp}#{skip}: {run:#}");
        let cta = crash.api().pending_cta().await;
        let asked = cta["message"].as_str().unwrap_or_default();
        assert!(
            asked.contains("may or may not have taken effect") && asked.contains("500"),
            "{asked}"
        );
        assert_eq!(cta["gated"]["tool"], "pay", "{cta}");
        let answer = json!({"kind": "approval", "approved": approved});
        let path = format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap());
        crash.request(&path, answer).await;
        run = crash.until(&run_id, |r| r["status"] == "completed").await;
    }
    assert_eq!(run["status"], "completed", "{fp}#{skip}: {run:#}");
    crash.host.stop().await;
    assert!(
        fp.is_empty() || crash.fired(),
        "{fp}#{skip} was never reached"
    );
    failpoint::reset();
    run
}

/// Every case, on the host `start` makes (a fresh one each time, with its mock model).
async fn cases<H: TestHost, F, Fut>(start: F)
where
    F: Fn(Arc<dyn baton_core::llm::Llm>, Arc<baton_core::agent::Catalog>) -> Fut,
    Fut: std::future::Future<Output = H>,
{
    let unknown = |r: &Value| {
        r["status"] == "error"
            && r["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("outcome_unknown: `pay` was started"))
    };
    let ok = |r: &Value| r["status"] == "success";
    // (failpoint, pass, book's runs, pay's runs, pay's result is ...)
    type Check = fn(&Value) -> bool;
    let table: [(&str, u32, usize, usize, Check); 5] = [
        ("", 0, 1, 1, |r| r["status"] == "success"),
        // The reply committed, no call run: both run after the restart, the model is not
        // asked again.
        ("step.after_think", 0, 1, 1, |r| r["status"] == "success"),
        // `book` ran and its output was lost: it runs again, under the same key.
        ("step.after_tool", 0, 2, 1, |r| r["status"] == "success"),
        // `pay` ran and its output was lost: it does not run again; the model is told.
        ("step.after_tool", 1, 1, 1, |r| {
            r["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("outcome_unknown"))
        }),
        // Between the two: `book`'s output was kept (committed with `pay`'s start), and
        // `pay`, marked started, is not run blindly.
        ("step.before_tool", 1, 1, 0, |r| {
            r["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("outcome_unknown"))
        }),
    ];
    for (fp, skip, books, pays, pay_result) in table {
        let tools = tool_server().await;
        let (model, llm) = common::mock_openai::start(SCRIPT).await;
        let host = start(llm, agents(&tools, "error")).await;
        let run = scenario(host, fp, skip, None).await;
        let seen = seen(&model, &tools).await;
        let case = format!("{fp}#{skip}");
        assert_eq!(seen.model.len(), 2, "{case}: one request per reply");
        assert_eq!(seen.book.len(), books, "{case}: book");
        assert_eq!(seen.pay.len(), pays, "{case}: pay");
        assert!(
            seen.book.iter().all(|k| *k == seen.book[0]),
            "{case}: {seen:?}"
        );
        assert!(ok(result(&run, "book")), "{case}: {run:#}");
        assert!(pay_result(result(&run, "pay")), "{case}: {run:#}");
        if unknown(result(&run, "pay")) {
            // What the model was told, in its second request.
            let told = seen.model[1]["messages"].to_string();
            assert!(told.contains("outcome_unknown"), "{case}: {told}");
        }
    }
    // Cut off, and the agent asks: approved, `pay` runs again under its first key (a
    // receiver that deduplicates on it answers as it did); rejected, the model is told.
    for approved in [true, false] {
        let tools = tool_server().await;
        let (model, llm) = common::mock_openai::start(SCRIPT).await;
        let host = start(llm, agents(&tools, "ask")).await;
        let run = scenario(host, "step.after_tool", 1, Some(approved)).await;
        let seen = seen(&model, &tools).await;
        assert_eq!(seen.model.len(), 2, "approved {approved}");
        let pays = if approved { 2 } else { 1 };
        assert_eq!(seen.pay.len(), pays, "approved {approved}");
        assert!(seen.pay.iter().all(|k| *k == seen.pay[0]));
        let pay = result(&run, "pay");
        if approved {
            assert!(ok(pay), "{pay}");
        } else {
            let error = pay["error"].as_str().unwrap_or_default();
            assert!(
                error.starts_with("outcome_unknown") && error.contains("rejected"),
                "{pay}"
            );
        }
    }
}

#[tokio::test]
async fn a_reply_is_asked_for_once_and_a_once_call_runs_at_most_once_on_the_dev_host() {
    let _serial = SERIAL.lock().await;
    let dirs = std::sync::Mutex::new(Vec::new());
    cases(|llm, catalog| {
        let dir = tempfile::tempdir().unwrap();
        let options = common::local_options(dir.path(), llm, catalog, Arc::new(SystemClock));
        dirs.lock().unwrap().push(dir);
        LocalHost::start(options)
    })
    .await;
}

#[tokio::test]
async fn a_reply_is_asked_for_once_and_a_once_call_runs_at_most_once_on_the_aws_host() {
    let _serial = SERIAL.lock().await;
    // No fault layer: a throttled commit after a call repeats an `idempotent` one (as it
    // may), and the counts here are the failpoints' alone.
    let aws = Arc::new(Emulator::start_with(None).await);
    let made = std::sync::atomic::AtomicU32::new(0);
    cases(|llm, catalog| {
        let aws = aws.clone();
        let n = made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            let mut names = aws.names(&format!("once{n}"));
            // A message a crash leaves in flight comes back after this, not after 30 s.
            names.visibility_timeout = 2;
            let mut options = aws.dev_options(names, llm, catalog, 0).await;
            options.links = None;
            AwsHost::start(aws.clone(), options).await
        }
    })
    .await;
}

/// The model's stand-in for the timeout test: it thinks for `.0`, then calls `slow`, then
/// (its call answered) says it is done.
struct Thinking(std::time::Duration);

impl wiremock::Respond for Thinking {
    fn respond(&self, req: &wiremock::Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
        let answered = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        let message = if answered {
            json!({"role": "assistant", "content": "done"})
        } else {
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_slow",
                "type": "function", "function": {"name": "slow", "arguments": "{}"}}]})
        };
        ResponseTemplate::new(200)
            .set_body_json(json!({"choices": [{"message": message}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}))
            .set_delay(self.0)
    }
}

/// Lambda's timeout after a reply (the stand-in ends an invocation at its function's
/// timeout, as Lambda does): a model that takes 4 s and a tool that takes 6.5 s (its timeout
/// 8 s) in a function of 10 s. The reply leaves 5 s, too little for the call: the reply is
/// committed, the call deferred to a fresh invocation, which runs it without thinking. The
/// model is asked once per reply, the tool runs once, whole, and no invocation is ended.
/// (Before, the call ran with the 5 s left and was cut off: the model was told it failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_whose_call_does_not_fit_its_invocation_is_not_asked_for_again() {
    let _serial = SERIAL.lock().await;
    use std::time::Duration;
    let timeout = Duration::from_secs(10);
    let provider = MockServer::start().await;
    Mock::given(matchers::method("POST"))
        .and(matchers::path("/v1/chat/completions"))
        .respond_with(Thinking(Duration::from_secs(4)))
        .mount(&provider)
        .await;
    let tool = MockServer::start().await;
    Mock::given(matchers::method("POST"))
        .and(matchers::path("/slow"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"done": true}))
                .set_delay(Duration::from_millis(6500)),
        )
        .mount(&tool)
        .await;
    let llm = Arc::new(
        baton_llm::openai::OpenAiLlm::new(baton_llm::openai::OpenAiConfig {
            max_tokens: None,
            base_url: format!("{}/v1", provider.uri()),
            api_key: Some("sk-mock".into()),
            model: "mock".into(),
            max_retries: 0,
            backoff: baton_llm::retry::Backoff::fast(),
            timeout: Duration::from_secs(5),
        })
        .unwrap(),
    );
    let file = serde_json::from_value(json!({
        "tools": {"slow": {"url": format!("{}/slow", tool.uri()), "description": "slow",
                           "schema": {"type": "object"}, "timeoutSeconds": 8}},
        "agents": {"ops": {"tools": ["slow"]}}}))
    .unwrap();
    let catalog = Arc::new(
        baton_tools::catalog(
            Some(file),
            baton_tools::Host::Dev,
            &|_| None,
            &Default::default(),
        )
        .unwrap(),
    );
    let aws = Arc::new(Emulator::start_with(None).await);
    let mut options = aws.dev_options(aws.names("late"), llm, catalog, 0).await;
    options.function_timeout = Some(timeout);
    options.links = None;
    let host = AwsHost::start(aws.clone(), options).await;
    let api = host.api();
    let v = api
        .post_ok("/runs", json!({"prompt": "go", "agent": "ops"}))
        .await;
    let run_id = v["runId"].as_str().unwrap();
    let run = api.status(run_id, "completed").await;
    assert_eq!(
        result(&run, "slow")["output"],
        json!({"done": true}),
        "{run:#}"
    );
    let asked = provider.received_requests().await.unwrap_or_default();
    assert_eq!(asked.len(), 2, "one request per reply");
    let called = tool.received_requests().await.unwrap_or_default();
    assert_eq!(called.len(), 1, "the call ran once");
    assert_eq!(
        host.server().invocations_ended(),
        0,
        "no invocation was ended"
    );
    let mut host = host;
    host.stop().await;
}
