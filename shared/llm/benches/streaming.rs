//! What streaming a model's reply costs the step that asks for it, when nobody watches.
//!
//! Baton streams a reply only while someone watches its run. The alternative is to stream
//! every reply and publish its pieces only while someone watches (so a watcher who comes
//! mid-reply gets the rest). This bench measures what that would cost every run nobody
//! watches: the OpenAI-compatible client, side by side, against one server on loopback that
//! answers the same reply either whole (`stream` unset) or as Server-Sent Events, one token a
//! chunk written on its own (as real servers do), with usage at the end. It counts the CPU
//! time of the client's thread alone (`/proc/thread-self/schedstat`: the server runs in a
//! thread of its own), in rounds that alternate the two shapes.
//!
//! `cargo bench -p baton-llm --bench streaming [-- ROUNDS CALLS TOKENS]` (default 10 rounds
//! of 40 calls each way, a 300-token reply) prints the median CPU per call of each shape and
//! their ratio.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use baton_core::llm::{ChatRequest, Deltas, Llm, ToolSpec};
use baton_core::timeline::{Entry, EntryBody};
use baton_llm::openai::{OpenAiConfig, OpenAiLlm};
use baton_llm::retry::Backoff;
use serde_json::json;

/// A live view nobody holds: what every piece would go to while the run is unwatched.
struct Unwatched;

impl Deltas for Unwatched {
    fn start(&self) {}
    fn text(&self, _: &str) {}
    fn tool_call(&self, _: u32, _: Option<&str>, _: Option<&str>, _: &str) {}
}

/// The calling thread's CPU time so far, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("/proc/thread-self/schedstat (Linux) gives a thread's CPU time")
}

/// The server's two answers to the same reply of `tokens` tokens.
struct Replies {
    whole: Vec<u8>,
    /// The chunks of the streamed answer, each written on its own.
    chunks: Vec<Vec<u8>>,
}

impl Replies {
    fn new(tokens: usize) -> Self {
        let words: Vec<String> = (0..tokens).map(|i| format!("word{} ", i % 97)).collect();
        let usage = json!({"prompt_tokens": 250, "completion_tokens": tokens, "total_tokens": 250 + tokens});
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": words.concat()}}],
            "usage": usage,
        })
        .to_string();
        let whole = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes();
        let event = |v: serde_json::Value| format!("data: {v}\n\n");
        let chunk = |delta: serde_json::Value, finish: Option<&str>| {
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                   "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let mut events = vec![event(chunk(
            json!({"role": "assistant", "content": ""}),
            None,
        ))];
        events.extend(
            words
                .iter()
                .map(|w| event(chunk(json!({"content": w}), None))),
        );
        events.push(event(chunk(json!({}), Some("stop"))));
        events.push(event(
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                 "created": 0, "model": "m", "choices": [], "usage": usage}),
        ));
        events.push("data: [DONE]\n\n".to_owned());
        let mut chunks = vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_vec(),
        ];
        chunks.extend(
            events
                .iter()
                .map(|e| format!("{:x}\r\n{e}\r\n", e.len()).into_bytes()),
        );
        chunks.push(b"0\r\n\r\n".to_vec());
        Self { whole, chunks }
    }
}

/// Answers each request on `conn` (kept alive) whole or streamed, as it asks.
fn serve(conn: TcpStream, replies: &Replies) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    loop {
        let mut length = 0;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        if body.windows(13).any(|w| w == b"\"stream\":true") {
            for c in &replies.chunks {
                out.write_all(c)?;
                // A token at a time, as a model writes them: each its own read.
                std::thread::sleep(Duration::from_micros(50));
            }
        } else {
            out.write_all(&replies.whole)?;
        }
    }
}

fn history() -> Vec<Entry> {
    let at = chrono::DateTime::from_timestamp(0, 0).unwrap_or_default();
    vec![Entry {
        seq: 0,
        at,
        body: EntryBody::User {
            text: "Summarise what changed overnight in the build, the backups and the disks."
                .repeat(10),
            message_id: None,
            options: Default::default(),
        },
    }]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rounds, calls, tokens) = match args[..] {
        [r, c, t, ..] => (r, c, t),
        _ => (10, 40, 300),
    };
    let replies: &'static Replies = Box::leak(Box::new(Replies::new(tokens)));
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || serve(conn, replies));
        }
    });
    let llm = OpenAiLlm::new(OpenAiConfig {
        base_url: format!("http://{addr}/v1"),
        api_key: Some("sk-bench".into()),
        model: "m".into(),
        max_retries: 0,
        backoff: Backoff::fast(),
        timeout: Duration::from_secs(10),
        max_tokens: Some(1024),
    })
    .expect("a client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let history = history();
    let tools: Vec<ToolSpec> = Vec::new();
    let one = |deltas: Option<&dyn Deltas>| {
        let request = ChatRequest {
            run_id: "run_bench",
            agent: "bench",
            think_index: 0,
            model: None,
            system: "Be brief.",
            tools: &tools,
            history: &history,
            deltas,
            max_output_tokens: None,
            controls: &baton_core::llm::Controls::NONE,
            images: &[],
        };
        let reply = rt.block_on(llm.complete(&request)).expect("a reply");
        assert_eq!(reply.usage.output_tokens, tokens as u64, "the whole reply");
    };
    // Warm up: connections, allocator.
    for _ in 0..5 {
        one(None);
        one(Some(&Unwatched));
    }
    let per_call = |deltas: Option<&dyn Deltas>| {
        let before = thread_cpu_ns();
        for _ in 0..calls {
            one(deltas);
        }
        (thread_cpu_ns() - before) as f64 / calls as f64 / 1000.0
    };
    let (mut whole, mut streamed) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so neither always follows the other.
        if round % 2 == 0 {
            whole.push(per_call(None));
            streamed.push(per_call(Some(&Unwatched)));
        } else {
            streamed.push(per_call(Some(&Unwatched)));
            whole.push(per_call(None));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let spread = |v: &[f64]| v[v.len() - 1] / v[0];
    let (w, s) = (median(&mut whole), median(&mut streamed));
    println!(
        "a {tokens}-token reply, {rounds} rounds × {calls} calls each way, the client's thread CPU:"
    );
    println!(
        "  whole (stream unset):       {w:8.1} µs a call (rounds' spread {:.2}×)",
        spread(&whole)
    );
    println!(
        "  streamed, nobody watching:  {s:8.1} µs a call (rounds' spread {:.2}×)",
        spread(&streamed)
    );
    println!("  streamed / whole: {:.2}×, +{:.1} µs a call", s / w, s - w);
}
