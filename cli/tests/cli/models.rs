//! `baton dev` as users start it: each real model configuration of the README against mock
//! servers of each provider's wire format, and the examples' agents files and plan.

use super::*;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// `baton dev` started as a README recipe starts it: no `--script`, the model configured by
/// the environment alone (`envs`; every model variable not named is unset). Its stdout and
/// stderr go to files in `data`.
fn start_dev_as_users_do(data: &Path, args: &[&str], envs: &[(&str, String)]) -> Dev {
    let port = free_port();
    let mut cmd = Command::new(BIN);
    cmd.args(["dev", "--addr", &format!("127.0.0.1:{port}"), "--data"])
        .arg(data)
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .stdout(std::fs::File::create(data.join("stdout")).unwrap())
        .stderr(std::fs::File::create(data.join("stderr")).unwrap());
    for var in [
        "BATON_TOKEN",
        "BATON_MODEL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_BEDROCK_RUNTIME",
        "BATON_AGENTS_FILE",
        "BATON_AGENTS_JSON",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "baton dev exited ({status}): {}",
                std::fs::read_to_string(data.join("stderr")).unwrap()
            );
        }
        assert!(Instant::now() < deadline, "baton dev did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Dev {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    }
}

/// Starts a run of `agent` and waits until it finishes; returns the run.
fn run_to_the_end(dev: &Dev, data: &Path, agent: &str) -> Value {
    let out = baton(
        dev,
        data,
        &["run", "Say hello", "--agent", agent, "--wait", "--json"],
    );
    let run = json(&out);
    assert_eq!(run["status"], "completed", "{run:#}");
    run
}

/// An OpenAI-compatible chat completion that says `text`.
pub(super) fn openai_reply(text: &str) -> wiremock::ResponseTemplate {
    wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}))
}

/// An Anthropic Messages reply that says `text`.
fn anthropic_reply(text: &str) -> wiremock::ResponseTemplate {
    wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 12, "output_tokens": 3}}))
}

#[tokio::test]
async fn baton_dev_runs_with_each_real_model_configuration_of_the_readme() {
    use wiremock::matchers::{header, method, path, path_regex};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-test"))
        .respond_with(openai_reply("Hello from OpenAI."))
        .mount(&mock)
        .await;
    Mock::given(method("POST"))
        .and(path("/local/v1/chat/completions"))
        .respond_with(openai_reply("Hello from llama."))
        .mount(&mock)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", "sk-ant-test"))
        .respond_with(anthropic_reply("Hello from Claude."))
        .mount(&mock)
        .await;
    Mock::given(method("POST"))
        .and(path_regex("^/model/[^/]+/converse$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "output": {"message": {"role": "assistant", "content": [{"text": "Hello from Bedrock."}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": 12, "outputTokens": 3, "totalTokens": 15},
            "metrics": {"latencyMs": 4}})))
        .mount(&mock)
        .await;
    let uri = mock.uri();
    let aws = |k: &'static str, v: &str| (k, v.to_owned());
    // (name, environment, the run's answer, what start-up says)
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        // OPENAI_API_KEY=sk-... BATON_MODEL=gpt-4o-mini baton dev
        (
            "openai",
            vec![
                ("OPENAI_API_KEY", "sk-test".into()),
                ("OPENAI_BASE_URL", format!("{uri}/v1")),
                ("BATON_MODEL", "gpt-4o-mini".into()),
            ],
            "Hello from OpenAI.",
            "model openai:gpt-4o-mini at",
        ),
        // OPENAI_BASE_URL=http://127.0.0.1:11434/v1 BATON_MODEL=llama3.1 baton dev
        (
            "local server, no key",
            vec![
                ("OPENAI_BASE_URL", format!("{uri}/local/v1")),
                ("BATON_MODEL", "llama3.1".into()),
            ],
            "Hello from llama.",
            "model openai:llama3.1 at",
        ),
        (
            "anthropic",
            vec![
                ("ANTHROPIC_API_KEY", "sk-ant-test".into()),
                ("ANTHROPIC_BASE_URL", uri.clone()),
                ("BATON_MODEL", "anthropic:claude-sonnet-4-5".into()),
            ],
            "Hello from Claude.",
            "model anthropic:claude-sonnet-4-5 at",
        ),
        (
            "bedrock",
            vec![
                aws("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", &uri),
                aws("AWS_REGION", "us-east-1"),
                aws("AWS_ACCESS_KEY_ID", "AKIDTEST"),
                aws("AWS_SECRET_ACCESS_KEY", "secret"),
                (
                    "BATON_MODEL",
                    "bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0".into(),
                ),
            ],
            "Hello from Bedrock.",
            "model bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0 at Amazon Bedrock",
        ),
    ];
    for (name, envs, answer, says) in cases {
        let data = tempfile::tempdir().unwrap();
        let mut dev = start_dev_as_users_do(data.path(), &[], &envs);
        let run = run_to_the_end(&dev, data.path(), "orchestrator");
        assert_eq!(run["result"], answer, "{name}: {run:#}");
        assert_eq!(run["usage"]["totalTokens"], 15, "{name}: {run:#}");
        let status = terminate(&mut dev);
        assert!(status.success(), "{name}: {status:?}");
        let stdout = std::fs::read_to_string(data.path().join("stdout")).unwrap();
        assert!(stdout.contains(says), "{name}: {stdout}");
        let stderr = std::fs::read_to_string(data.path().join("stderr")).unwrap();
        let warned = stderr.contains("warning: OPENAI_API_KEY is not set");
        assert_eq!(warned, name == "local server, no key", "{name}: {stderr}");
    }
    // The local server was sent no key.
    let requests = mock.received_requests().await.unwrap();
    let local: Vec<_> = requests
        .iter()
        .filter(|r| r.url.path().starts_with("/local/"))
        .collect();
    assert!(!local.is_empty());
    assert!(
        local
            .iter()
            .all(|r| !r.headers.contains_key("authorization"))
    );
}

#[tokio::test]
async fn baton_dev_runs_the_examples_agents_file_and_names_the_variables_it_needs() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer};
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(anthropic_reply("Order 7 shipped."))
        .mount(&mock)
        .await;
    let data = tempfile::tempdir().unwrap();
    // Without the variables its headers use, it does not start, and says which.
    let out = Command::new(BIN)
        .args(["dev", "--addr", "127.0.0.1:0", "--data"])
        .arg(data.path())
        .args(["--agents", "examples/agents.json"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .env_remove("ORDERS_KEY")
        .env_remove("CALC_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CALC_TOKEN") || err.contains("ORDERS_KEY"),
        "{err}"
    );
    // With them (and a model for its `ops` agent) a run of `ops` completes.
    let envs = [
        ("ORDERS_KEY", "k".to_owned()),
        ("CALC_TOKEN", "t".to_owned()),
        ("ANTHROPIC_API_KEY", "sk-ant-test".to_owned()),
        ("ANTHROPIC_BASE_URL", mock.uri()),
        ("AWS_REGION", "us-east-1".to_owned()),
    ];
    let mut dev = start_dev_as_users_do(data.path(), &["--agents", "examples/agents.json"], &envs);
    let run = run_to_the_end(&dev, data.path(), "ops");
    assert_eq!(run["result"], "Order 7 shipped.", "{run:#}");
    assert!(terminate(&mut dev).success());
    let stdout = std::fs::read_to_string(data.path().join("stdout")).unwrap();
    for says in [
        "model anthropic:claude-sonnet-4-5 at",
        "for ops",
        "model bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0",
        "for researcher",
    ] {
        assert!(stdout.contains(says), "{says}: {stdout}");
    }
}

#[test]
fn baton_dev_starts_with_the_repo_agents_example_once_its_sandboxes_are_named() {
    // As docs/agents.md starts it: without BATON_SANDBOXES it names the variable and stops.
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["dev", "--addr", "127.0.0.1:0", "--data"])
        .arg(data.path())
        .args(["--agents", "examples/repo-agents.json"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .env_remove("BATON_SANDBOXES")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("BATON_SANDBOXES"),
        "{out:?}"
    );
    // With it, it serves: a run whose subagents have no sandbox starts no MCP server (each
    // is started per sandbox) and parks on its question as the script says.
    let sandboxes = tempfile::tempdir().unwrap();
    let envs = [("BATON_SANDBOXES", sandboxes.path().display().to_string())];
    let args = [
        "--agents",
        "examples/repo-agents.json",
        "--script",
        "examples/orchestrator.json",
    ];
    let dev = start_dev_as_users_do(data.path(), &args, &envs);
    let run = json(&baton(
        &dev,
        data.path(),
        &["run", "Ship it", "--wait", "--json"],
    ));
    assert_eq!(run["status"], "waiting", "{run:#}");
}

#[test]
fn baton_dev_runs_the_plan_example_through_its_approval() {
    let data = tempfile::tempdir().unwrap();
    let dev = start_dev_as_users_do(data.path(), &["--script", "examples/plan.json"], &[]);
    let run = json(&baton(
        &dev,
        data.path(),
        &["run", "Fix billing", "--wait", "--json"],
    ));
    assert_eq!(run["status"], "waiting", "{run:#}");
    let ctas = json(&baton(&dev, data.path(), &["ctas", "--json"]));
    let cta = ctas["ctas"][0]["ctaId"].as_str().unwrap().to_owned();
    assert!(
        baton(&dev, data.path(), &["answer", &cta, "--approve"])
            .status
            .success()
    );
    let run_id = run["runId"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = json(&baton(&dev, data.path(), &["show", run_id, "--json"]));
        if run["status"] == "completed" {
            let tool = run["timeline"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "agent_orchestrate")
                .cloned()
                .unwrap();
            assert_eq!(tool["result"]["output"]["success"], true, "{tool:#}");
            break;
        }
        assert!(Instant::now() < deadline, "{run:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
