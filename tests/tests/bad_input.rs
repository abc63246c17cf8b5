//! Bad input, generated: property-based requests against `baton dev`'s API (methods, paths,
//! query strings, headers, bodies) and events on the bus consumer. However hostile, nothing
//! is a 5xx; every error is JSON with a code and a sentence; a refused request changes
//! nothing; no event panics the consumer or is retried for ever.

use crate::common;
use baton_core::ports::{Ctas, RunReads};

use aws_lambda_events::event::sqs::SqsEvent;
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

const ASK: &str = r#"{"asker": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "choice", "prompt": "Which?",
        "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]}}]},
    {"text": "thanks"}]}"#;

/// What a refused request must leave as it was.
async fn digest(h: &Harness, run_id: &str) -> String {
    let store = &h.server.store;
    let run = store
        .load(run_id)
        .await
        .unwrap()
        .map(|(r, t)| (r.run.version, t.len()));
    let ctas = store.list_ctas("local", &every_cta(None)).await.unwrap();
    let events = store.events_after(0, 10_000).await.unwrap().len();
    format!(
        "{run:?} {ctas:?} {events} {}",
        store.queue_depth().await.unwrap()
    )
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::from),
        prop::sample::select(vec![
            "approval", "text", "choice", "a", "", "prompt", "kind"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "prompt",
                    "agent",
                    "text",
                    "kind",
                    "approved",
                    "selectedId",
                    "reason",
                    "onExpiry",
                    "metadata",
                    "sandboxId",
                    "x",
                ])
                .prop_map(str::to_owned),
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[derive(Debug, Clone)]
struct Request {
    method: &'static str,
    path: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
}

fn request(run_id: String, cta_id: String) -> impl Strategy<Value = Request> {
    let id = prop_oneof![
        Just(run_id),
        Just(cta_id),
        "[a-z_0-9]{0,12}",
        "(%[0-9A-F]{2}|[a-zA-Z./~]){1,10}",
    ];
    let route = prop::sample::select(vec![
        "/runs",
        "/runs/{}",
        "/runs/{}/timeline",
        "/runs/{}/messages",
        "/runs/{}/cancel",
        "/ctas",
        "/ctas/{}",
        "/ctas/{}/response",
        "/events",
        "/health",
        "/{}",
        "/runs/{}/{}",
    ]);
    let query = prop::collection::vec(
        (
            prop::sample::select(vec!["after", "limit", "status", "x", ""]),
            prop_oneof![
                "-?[0-9]{1,25}".boxed(),
                "[a-z%0-9]{0,8}".boxed(),
                Just("pending".to_owned()).boxed()
            ],
        ),
        0..3,
    );
    let header = prop_oneof![
        Just(("authorization".to_owned(), format!("Bearer {TOKEN}"))),
        "[ -~]{0,30}".prop_map(|v| ("authorization".to_owned(), v)),
        "[ -~]{0,30}".prop_map(|v| ("content-type".to_owned(), v)),
        Just(("content-type".to_owned(), "application/json".to_owned())),
        "[ -~]{0,300}".prop_map(|v| ("idempotency-key".to_owned(), v)),
    ];
    let body = prop_oneof![
        Just(None),
        json_value().prop_map(|v| Some(v.to_string().into_bytes())),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Some),
    ];
    (
        prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH"]),
        route,
        id.clone(),
        id,
        query,
        prop::collection::vec(header, 0..4),
        body,
    )
        .prop_map(|(method, route, a, b, query, headers, body)| {
            let mut path = route.replacen("{}", &a, 1).replacen("{}", &b, 1);
            if !query.is_empty() {
                let q: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
                path = format!("{path}?{}", q.join("&"));
            }
            Request {
                method,
                path,
                headers,
                body,
            }
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_generated_requests_and_events_get_clear_refusals_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let agents = json!({"agents": {"asker": {"tools": ["request_human_feedback"]}}});
    let h = start(dir.path(), scripted(ASK), catalog(Some(agents))).await;
    let run_id = h
        .create_run(json!({"prompt": "go", "agent": "asker"}))
        .await;
    let cta_id = h.wait_pending(1).await[0]["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let base = h.server.url();
    let handle = tokio::runtime::Handle::current();

    let mut runner = TestRunner::new(Config {
        cases: 8_000,
        failure_persistence: None,
        ..Config::default()
    });
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    let (refused, accepted) = (AtomicU32::new(0), AtomicU32::new(0));
    let strategy = request(run_id.clone(), cta_id.clone());
    let result = tokio::task::block_in_place(|| {
        runner
            .run(&strategy, |req| {
                let (code, ctype, body, changed) = handle.block_on(async {
                    let before = digest(&h, &run_id).await;
                    let method = reqwest::Method::from_bytes(req.method.as_bytes()).unwrap();
                    let mut rb = h.http.request(method, format!("{base}{}", req.path));
                    for (k, v) in &req.headers {
                        rb = rb.header(k.as_str(), v.as_str());
                    }
                    if let Some(b) = &req.body {
                        rb = rb.body(b.clone());
                    }
                    let Ok(resp) = rb.send().await else {
                        // reqwest refused to build it (an invalid URL or header): nothing was sent.
                        return (0, String::new(), Vec::new(), None);
                    };
                    let code = resp.status().as_u16();
                    let ctype = resp
                        .headers()
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let body = resp.bytes().await.unwrap().to_vec();
                    let after = digest(&h, &run_id).await;
                    let changed = (after != before).then(|| format!("{before} → {after}"));
                    if code < 400 {
                        // Let what it queued be handled, so the next request starts from rest
                        // (a loaded machine may take seconds; not waiting long enough would
                        // blame the next request for this one's step).
                        let deadline =
                            std::time::Instant::now() + std::time::Duration::from_secs(60);
                        // At rest: nothing queued, and the last commit's effects performed
                        // (they follow its message's acknowledgement).
                        let busy = async || {
                            let store = &h.server.store;
                            store.queue_depth().await.unwrap() > 0
                                || store
                                    .load(&run_id)
                                    .await
                                    .unwrap()
                                    .is_some_and(|(r, _)| !r.outbox.is_empty())
                        };
                        while busy().await {
                            assert!(
                                std::time::Instant::now() < deadline,
                                "what {req:?} queued was not handled within a minute"
                            );
                            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        }
                    }
                    (code, ctype, body, changed)
                });
                if code == 0 {
                    return Ok(());
                }
                prop_assert!(
                    code < 500,
                    "{req:?} → {code}: {}",
                    String::from_utf8_lossy(&body)
                );
                if code >= 400 {
                    refused.fetch_add(1, Relaxed);
                    prop_assert!(
                        ctype.starts_with("application/json"),
                        "{req:?} → {code} {ctype}"
                    );
                    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let (c, m) = (&v["error"]["code"], &v["error"]["message"]);
                    prop_assert!(
                        c.as_str().is_some_and(|c| !c.is_empty())
                            && m.as_str().is_some_and(|m| m.len() > 3),
                        "{req:?} → {code}: {v}"
                    );
                    prop_assert!(
                        changed.is_none(),
                        "a refused request changed state ({}): {req:?} → {code} {v}",
                        changed.unwrap_or_default()
                    );
                } else {
                    accepted.fetch_add(1, Relaxed);
                }
                Ok(())
            })
            .map_err(|e| e.to_string())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (refused, accepted) = (refused.into_inner(), accepted.into_inner());
    eprintln!("HTTP: {refused} refused, {accepted} accepted");
    assert!(
        refused > 4_000,
        "the generator mostly makes bad requests: {refused}"
    );

    // Bus events on the CTA consumer: garbage, wrong kinds, unknown CTAs, early expiries.
    let service = h.server.service.clone();
    let mut runner = TestRunner::new(Config {
        cases: 2_500,
        failure_persistence: None,
        ..Config::default()
    });
    let event = (
        prop::sample::select(vec!["cta.response", "cta.expired", "baton.sweep", "x", ""]),
        prop_oneof![Just(cta_id.clone()), "[a-z_0-9]{0,12}"],
        json_value(),
        prop::collection::vec(any::<u8>(), 0..40),
        0..4u8,
    );
    let result = tokio::task::block_in_place(|| {
        runner
            .run(&event, |(detail_type, id, detail, bytes, shape)| {
                let body = match shape {
                0 => String::from_utf8_lossy(&bytes).into_owned(),
                1 => json!({"detail-type": detail_type, "detail": detail}).to_string(),
                2 => {
                    json!({"detail-type": detail_type, "detail": {"ctaId": id, "response": detail}})
                        .to_string()
                }
                _ => json!({"detail-type": detail_type, "detail": {"ctaId": id}}).to_string(),
            };
                let ev: SqsEvent = serde_json::from_value(json!({"Records": [{
                "messageId": "m", "receiptHandle": "r", "body": body, "attributes": {},
                "messageAttributes": {}, "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:x-cta-inbox",
                "awsRegion": "us-east-1"}]}))
                .unwrap();
                let resp = handle.block_on(baton_lambda::handle_events(&service, ev));
                prop_assert!(
                    resp.batch_item_failures.is_empty(),
                    "retried for ever: {body}"
                );
                Ok(())
            })
            .map_err(|e| e.to_string())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Whatever the bus said, the CTA is pending or validly settled, never broken.
    let cta = h.server.store.get_cta(&cta_id).await.unwrap().unwrap();
    if let Some(r) = &cta.response {
        r.validate_against(&cta.request).unwrap();
    }
    h.server.shutdown().await;
}

/// Sends raw bytes on a fresh connection and reads the whole answer.
async fn raw(h: &Harness, request: &[u8]) -> (u16, String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(h.server.addr).await.unwrap();
    // The server may answer and close before it has read everything: a failed write is fine.
    let _ = tcp.write_all(request).await;
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = serde_json::from_str(body).unwrap_or(Value::Null);
    (status, head.to_ascii_lowercase(), body)
}

#[tokio::test]
async fn requests_hyper_cannot_parse_get_json_errors_too() {
    let dir = tempfile::tempdir().unwrap();
    let h = start_scripted(dir.path(), "{}").await;
    let before = digest(&h, "none").await;
    let long_uri = format!(
        "GET /runs/{} HTTP/1.1\r\nhost: x\r\n\r\n",
        "a".repeat(70_000)
    );
    let huge_header = format!(
        "GET /health HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "b".repeat(500_000)
    );
    let cases: [(&[u8], u16, &str); 5] = [
        (b"GARBAGE\r\n\r\n", 400, "malformed_request"),
        (
            b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n",
            400,
            "malformed_request",
        ),
        (
            b"POST /runs HTTP/1.1\r\nhost: x\r\ncontent-length: nope\r\n\r\n",
            400,
            "malformed_request",
        ),
        (long_uri.as_bytes(), 414, "uri_too_long"),
        (huge_header.as_bytes(), 431, "headers_too_large"),
    ];
    for (request, status, code) in cases {
        let (got, head, body) = raw(&h, request).await;
        let shown = String::from_utf8_lossy(&request[..request.len().min(60)]).into_owned();
        assert_eq!(got, status, "{shown}: {head}");
        assert!(
            head.contains("content-type: application/json"),
            "{shown}: {head}"
        );
        assert_eq!(body["error"]["code"], code, "{shown}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.ends_with('.'))
        );
    }
    // A well-formed request on the same server is served as before.
    let (status, body) = h.get("/health").await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));
    assert_eq!(digest(&h, "none").await, before, "nothing changed");
    h.server.shutdown().await;
}
