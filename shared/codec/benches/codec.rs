//! What each way of packing an entry costs, on realistic entries: `cargo bench -p
//! baton-codec`. For each payload it prints the stored size and the CPU time to encode and
//! to decode one entry, plain JSON, deflated (the DynamoDB store's packing) and LZ4.
//! docs/performance.md ("Bytes") holds the table and the choice it led to.

use std::hint::black_box;
use std::time::{Duration, Instant};

use baton_codec::{Packing, decode, encode_with};
use serde_json::{Value, json};

/// The `baton bench` workload's 1 KB argument: 37 symbols at random, so it packs only by
/// entropy coding (deflate's Huffman stage), not by repeats.
fn bench_payload(i: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789 ";
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// A tool's JSON answer: twenty issues of a tracker's API, ~6 KB.
fn json_tool_output() -> Value {
    let labels = ["bug", "enhancement", "docs", "aws", "p1", "needs-triage"];
    let issues: Vec<Value> = (0..20)
        .map(|i| {
            json!({
                "id": 1_900_000_000u64 + i * 7919,
                "number": 400 + i,
                "title": format!("Run {i} stalls after a follow-up between two steps"),
                "state": if i % 3 == 0 { "closed" } else { "open" },
                "user": {"login": format!("user{}", i % 5), "id": 10_000 + i % 5, "type": "User"},
                "labels": [labels[(i % 6) as usize], labels[((i + 2) % 6) as usize]],
                "comments": i * 3 % 11,
                "created_at": format!("2026-10-{:02}T{:02}:14:03Z", 1 + i % 28, i % 24),
                "html_url": format!("https://github.com/example/baton/issues/{}", 400 + i),
            })
        })
        .collect();
    json!({"status": 200, "body": issues})
}

/// Bytes a tool returned (a file, an image), base64 in the entry: packs by ~1/4 at most.
fn incompressible(len: usize) -> String {
    use std::fmt::Write;
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut s = String::with_capacity(len);
    while s.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let _ = write!(s, "{}", B64[(x >> 58) as usize] as char);
    }
    s
}

/// Entries shaped as the timeline stores them.
fn payloads() -> Vec<(&'static str, Value)> {
    let arg = bench_payload(7);
    vec![
        (
            "bench step (call + echo of 1 KB)",
            json!([
                {"seq": 41, "at": "2026-11-24T09:00:00.000Z", "kind": "assistant",
                 "text": null, "toolCalls": [{"id": "call_41", "name": "echo", "arguments": {"text": arg}}]},
                {"seq": 42, "at": "2026-11-24T09:00:00.001Z", "kind": "tool",
                 "callId": "call_41", "name": "echo", "result": {"ok": true, "output": {"text": arg}}},
            ]),
        ),
        (
            "JSON tool output (20 issues)",
            json!({"seq": 9, "at": "2026-11-24T09:00:00.000Z", "kind": "tool", "callId": "call_9",
                   "name": "github_issues", "result": {"ok": true, "output": json_tool_output()}}),
        ),
        (
            "model text (prose reply)",
            json!({"seq": 12, "at": "2026-11-24T09:00:00.000Z", "kind": "assistant",
                   "text": include_str!("model_text.txt"), "toolCalls": []}),
        ),
        (
            "incompressible (4 KB base64)",
            json!({"seq": 3, "at": "2026-11-24T09:00:00.000Z", "kind": "tool", "callId": "call_3",
                   "name": "read_file", "result": {"ok": true, "output": {"base64": incompressible(4096)}}}),
        ),
    ]
}

/// Mean time of `f` over enough calls to fill `budget`.
fn time(budget: Duration, mut f: impl FnMut()) -> Duration {
    for _ in 0..50 {
        f();
    }
    let (start, mut n) = (Instant::now(), 0u32);
    while start.elapsed() < budget {
        for _ in 0..100 {
            f();
        }
        n += 100;
    }
    start.elapsed() / n
}

fn main() {
    // `cargo bench` passes `--bench`; a test run (`cargo test --benches`) passes nothing
    // and gets a quick pass that only checks everything round-trips.
    let full = std::env::args().any(|a| a == "--bench");
    let budget = Duration::from_millis(if full { 400 } else { 5 });
    println!("| payload | JSON bytes | packing | stored bytes | ratio | encode µs | decode µs |");
    println!("|---|---:|---|---:|---:|---:|---:|");
    for (name, value) in payloads() {
        let json_len = serde_json::to_vec(&value).map(|v| v.len()).unwrap_or(0);
        for (label, packing) in [
            ("plain JSON", None),
            ("deflate (fast)", Some(Packing::Deflate)),
            ("LZ4", Some(Packing::Lz4)),
        ] {
            let encode = |v: &Value| match packing {
                Some(p) => encode_with(v, p),
                None => serde_json::to_vec(v).map_err(Into::into),
            };
            let stored = encode(&value).expect("a JSON value encodes");
            let back: Value = decode(&stored).expect("what was encoded decodes");
            assert_eq!(back, value, "{name}: {label} did not round-trip");
            let enc = time(budget, || {
                black_box(encode(black_box(&value)).ok());
            });
            let dec = time(budget, || {
                black_box(decode::<Value>(black_box(&stored)).ok());
            });
            println!(
                "| {name} | {json_len} | {label} | {} | {:.2} | {:.1} | {:.1} |",
                stored.len(),
                stored.len() as f64 / json_len as f64,
                enc.as_secs_f64() * 1e6,
                dec.as_secs_f64() * 1e6,
            );
        }
    }
}
