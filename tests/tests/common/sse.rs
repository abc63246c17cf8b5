//! Server-Sent Events as `GET /runs/{id}/stream` sends them, read by the tests: frames
//! parsed into events, a stream read until a condition holds, a reply's streamed text.

use std::time::{Duration, Instant};

use serde_json::Value;

/// One SSE event.
#[derive(Debug)]
pub struct Sse {
    pub event: String,
    pub id: String,
    pub data: Value,
}

/// Moves the whole frames in `buf` to `seen`.
pub fn frames(buf: &mut String, seen: &mut Vec<Sse>) {
    while let Some(cut) = buf.find("\n\n") {
        let frame: String = buf.drain(..cut + 2).collect();
        let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
        for line in frame.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event = v.trim().into();
            } else if let Some(v) = line.strip_prefix("id:") {
                id = v.trim().into();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.trim());
            }
        }
        if !data.is_empty() {
            let data = serde_json::from_str(&data).unwrap();
            seen.push(Sse { event, id, data });
        }
    }
}

/// Reads a stream's events until `done` says stop (or 20 s pass).
pub async fn read_until(
    resp: &mut reqwest::Response,
    buf: &mut String,
    seen: &mut Vec<Sse>,
    done: impl Fn(&[Sse]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(seen) {
        assert!(Instant::now() < deadline, "stream stalled: {seen:#?}");
        let chunk = tokio::time::timeout(Duration::from_secs(20), resp.chunk())
            .await
            .unwrap()
            .unwrap()
            .expect("the stream stays open");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        frames(buf, seen);
    }
}

/// The text of the `delta` events of `seq`, joined, and where the last of them came.
pub fn streamed(seen: &[Sse], seq: u64) -> (String, Option<usize>) {
    let mut text = String::new();
    let mut last = None;
    for (i, e) in seen.iter().enumerate() {
        if e.event == "delta" && e.data["seq"] == seq {
            text.push_str(e.data["text"].as_str().unwrap());
            last = Some(i);
        }
    }
    (text, last)
}
