//! A hostile AWS: an HTTP proxy in front of an emulator (moto's server or LocalStack) that answers a share of the
//! requests as AWS answers when it throttles or fails, delays the rest, and fires one-time
//! schedules as EventBridge Scheduler does, anywhere within their minute, early second
//! included (neither emulator fires schedules: both store them). A share of firings can be
//! dropped as Scheduler drops one whose target it could not reach for its retry policy's
//! whole age (its `InvocationDroppedCount`): the event goes to the schedule's dead-letter
//! queue instead of the bus.
//!
//! Each service fails in its own words, as its documentation and its SDK's deserializers
//! have them: DynamoDB `ThrottlingException` / `ProvisionedThroughputExceededException`,
//! `TransactionCanceledException` with `ThrottlingError` or `TransactionConflict` reasons for
//! a transaction, and `InternalServerError`; SQS `RequestThrottled` (awsJson with the query-compatible error
//! header); EventBridge's per-entry `ThrottlingException` in a 200 `PutEvents` answer;
//! Scheduler's 429 `ThrottlingException`; S3's 503 `SlowDown`. A refused request is not
//! forwarded: like AWS, a throttled call changes nothing.
//!
//! It also gives moto's DynamoDB the isolation DynamoDB has: moto applies a transaction item
//! by item and, when one fails, puts back the whole table as it was when the transaction
//! began — undoing what any concurrent write did meanwhile (50 concurrent creates against a
//! conditional counter let 11 through), and checks a conditional `PutItem`'s condition apart
//! from its write, so two concurrent conditional answers to one CTA both succeeded (a
//! one-time link answered twice, 202 and 202). The layer forwards DynamoDB's writes one at a
//! time; every test's AWS host goes through it ([`Faults::isolation_only`] when the test
//! asks for no faults).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::{Value, json};

/// What goes wrong, per request (each a probability from 0 to 1).
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// Answered as the service's throttling error.
    pub throttle: f64,
    /// Answered as the service's 5xx.
    pub server_error: f64,
    /// Each request forwarded is delayed up to this much.
    pub latency: Duration,
    /// A schedule's first firing comes 59 s before its time (later ones, anywhere within
    /// their minute, early second included).
    pub early_first_firing: bool,
    /// A firing is dropped: its event goes to the schedule's dead-letter queue, never to
    /// the bus.
    pub drop_firings: f64,
    /// Schedules fire as Scheduler fires them (off: they are only stored, as by the
    /// emulators, and a test fires what it needs by hand).
    pub fire_schedules: bool,
    /// A DynamoDB write that succeeded is answered as a 500 all the same: applied, its
    /// answer lost on the way back (the SDK sends it again).
    pub lost_answers: f64,
    /// DynamoDB's transaction isolation: a write to an item that a transaction in flight
    /// also writes is cancelled (`TransactionConflict`) or refused
    /// (`TransactionConflictException`), as DynamoDB does. A transaction is in flight from
    /// its arrival for [`TRANSACTION_TIME`] (DynamoDB runs transactions side by side; the
    /// emulator behind this layer takes writes one at a time, so its queue is no measure),
    /// or until it is answered if that is sooner. Off, transactions only queue.
    pub transaction_conflicts: bool,
    pub seed: u64,
}

impl Faults {
    /// No faults and no firings: only what every test needs between the code and moto,
    /// DynamoDB's isolation of each item's writes (see the module's doc).
    pub fn isolation_only() -> Self {
        Self {
            fire_schedules: false,
            ..Self::default()
        }
    }
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            throttle: 0.0,
            server_error: 0.0,
            latency: Duration::ZERO,
            early_first_firing: false,
            drop_firings: 0.0,
            fire_schedules: true,
            lost_answers: 0.0,
            transaction_conflicts: false,
            seed: 7,
        }
    }
}

/// What the layer did.
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: AtomicU64,
    pub throttled: AtomicU64,
    pub server_errors: AtomicU64,
    pub fired: AtomicU64,
    pub fired_early: AtomicU64,
    /// Firings dropped (sent to the dead-letter queue instead).
    pub dropped: AtomicU64,
    /// DynamoDB writes applied whose answers were lost ([`Faults::lost_answers`]).
    pub lost: AtomicU64,
    /// Writes refused for a transaction in flight on one of their items
    /// ([`Faults::transaction_conflicts`]).
    pub conflicts: AtomicU64,
    /// Refusals by operation (`dynamodb.TransactWriteItems`…).
    pub refused: Mutex<HashMap<String, u64>>,
}

struct Shared {
    faults: Faults,
    /// Off while the test sets up (provisioning is CloudFormation's job, not the code's).
    on: std::sync::atomic::AtomicBool,
    upstream: String,
    http: reqwest::Client,
    rng: Mutex<u64>,
    stats: Arc<Stats>,
    /// Each schedule's generation: a firing is dropped once its schedule changed or went.
    schedules: Mutex<HashMap<String, u64>>,
    /// The schedules that have fired (the first firing of any other may come early).
    fired: Mutex<std::collections::HashSet<String>>,
    sdk: aws_config::SdkConfig,
    /// `BATON_TEST_RECORD_CALLS`: where each function's calls are recorded ([`record`]).
    record: Option<std::path::PathBuf>,
    /// Held while a DynamoDB write is forwarded (see the module's doc).
    dynamo_writes: tokio::sync::Mutex<()>,
    /// Services in an outage: every request to them answered as their 5xx ([`FaultyAws::outage`]).
    down: Mutex<std::collections::HashSet<&'static str>>,
    /// The items of the DynamoDB transactions in flight: for each, the transactions that
    /// hold it (an id, and until when).
    in_flight: Mutex<HashMap<String, Vec<(u64, std::time::Instant)>>>,
    /// The last transaction's id.
    transactions: AtomicU64,
}

pub struct FaultyAws {
    pub url: String,
    pub stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
}

impl Drop for FaultyAws {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultyAws {
    /// The layer on a free loopback port, in front of the emulator at `upstream_url`.
    pub async fn start(upstream_url: &str, faults: Faults) -> FaultyAws {
        let sdk = super::aws::sdk_for(upstream_url).await;
        let stats = Arc::new(Stats::default());
        let shared = Arc::new(Shared {
            faults,
            on: Default::default(),
            upstream: upstream_url.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            rng: Mutex::new(faults.seed.max(1)),
            stats: stats.clone(),
            schedules: Mutex::new(HashMap::new()),
            fired: Mutex::new(Default::default()),
            sdk,
            record: std::env::var_os("BATON_TEST_RECORD_CALLS").map(Into::into),
            dynamo_writes: tokio::sync::Mutex::new(()),
            down: Mutex::new(Default::default()),
            in_flight: Mutex::new(HashMap::new()),
            transactions: AtomicU64::new(0),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FaultyAws {
            url,
            stats,
            task,
            shared,
        }
    }

    /// Turns the faults on (the scheduler fires either way).
    pub fn turn_on(&self) {
        self.shared.on.store(true, Ordering::SeqCst);
    }

    /// Starts (`true`) or ends an outage of `service` (`scheduler`, `events`, `sqs`,
    /// `dynamodb`): while it lasts, each of its requests is answered as its 5xx, whether
    /// or not the faults are on.
    pub fn outage(&self, service: &'static str, down: bool) {
        let mut set = self.shared.down.lock().unwrap();
        if down {
            set.insert(service);
        } else {
            set.remove(service);
        }
    }

    /// Turns them off, while a test sets up again (a restarted host's resources).
    pub fn turn_off(&self) {
        self.shared.on.store(false, Ordering::SeqCst);
    }

    /// An SDK config whose every client goes through this layer.
    pub async fn sdk(&self) -> aws_config::SdkConfig {
        super::aws::sdk_for(&self.url).await
    }
}

impl Shared {
    /// A uniform draw in [0, 1) (xorshift: reproducible from the seed, no dependency).
    fn draw(&self) -> f64 {
        let mut s = self.rng.lock().unwrap();
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 11) as f64 / (1u64 << 53) as f64
    }

    fn refused(&self, op: &str) {
        *self
            .stats
            .refused
            .lock()
            .unwrap()
            .entry(op.to_owned())
            .or_default() += 1;
    }
}

/// The service and operation a request is for.
fn operation(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> (&'static str, String) {
    if let Some(target) = headers.get("x-amz-target").and_then(|v| v.to_str().ok()) {
        let (prefix, op) = target.split_once('.').unwrap_or((target, ""));
        let service = match prefix {
            p if p.starts_with("DynamoDB") => "dynamodb",
            "AmazonSQS" => "sqs",
            "AWSEvents" => "events",
            "secretsmanager" => "secretsmanager",
            _ => "other",
        };
        return (service, op.to_owned());
    }
    // SES speaks the query protocol: the service is its signature's, the operation its
    // form's `Action`.
    let scope = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if scope.contains("/ses/aws4_request") {
        let op = form_field(body, "Action").unwrap_or_else(|| "?".into());
        return ("ses", op);
    }
    if path.starts_with("/schedules") || path.starts_with("/schedule-groups") {
        let op = match *method {
            Method::POST => "CreateSchedule",
            Method::PUT => "UpdateSchedule",
            Method::DELETE => "DeleteSchedule",
            _ => "GetSchedule",
        };
        return ("scheduler", op.to_owned());
    }
    ("s3", method.to_string())
}

/// How long DynamoDB takes over a transaction, as [`Faults::transaction_conflicts`] holds
/// its items.
pub const TRANSACTION_TIME: Duration = Duration::from_millis(20);

/// A transaction's items, held in flight until the guard drops (its answer sent back), if
/// that comes before its [`TRANSACTION_TIME`] is over.
struct Held(Arc<Shared>, u64, Vec<String>);

impl Drop for Held {
    fn drop(&mut self) {
        let mut flight = self.0.in_flight.lock().unwrap();
        for k in &self.2 {
            if let Some(holders) = flight.get_mut(k) {
                holders.retain(|(id, _)| *id != self.1);
                if holders.is_empty() {
                    flight.remove(k);
                }
            }
        }
    }
}

/// The items (table, PK, SK) a DynamoDB write names: each of a transaction's, or a single
/// write's.
fn written_items(op: &str, body: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let key = |table: &Value, k: &Value| -> String {
        format!(
            "{}|{}|{}",
            table.as_str().unwrap_or(""),
            k["PK"]["S"].as_str().unwrap_or(""),
            k["SK"]["S"].as_str().unwrap_or("")
        )
    };
    match op {
        "TransactWriteItems" => v["TransactItems"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| {
                        let (kind, body) = i.as_object()?.iter().next()?;
                        let k = if kind == "Put" {
                            &body["Item"]
                        } else {
                            &body["Key"]
                        };
                        Some(key(&body["TableName"], k))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        "PutItem" => vec![key(&v["TableName"], &v["Item"])],
        "UpdateItem" | "DeleteItem" => vec![key(&v["TableName"], &v["Key"])],
        _ => Vec::new(),
    }
}

/// DynamoDB's answer to a write that met a transaction in flight on one of its items.
fn transaction_conflict(op: &str, busy: &[bool]) -> Response {
    let ctype = "application/x-amz-json-1.0";
    if op == "TransactWriteItems" {
        let reasons: Vec<Value> = busy
            .iter()
            .map(|b| match b {
                true => json!({"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}),
                false => json!({"Code": "None"}),
            })
            .collect();
        let codes: Vec<&str> = busy
            .iter()
            .map(|b| if *b { "TransactionConflict" } else { "None" })
            .collect();
        return json_error(
            StatusCode::BAD_REQUEST,
            ctype,
            json!({"__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                   "Message": format!("Transaction cancelled, please refer cancellation reasons for specific reasons [{}]", codes.join(", ")),
                   "CancellationReasons": reasons}),
            &[],
        );
    }
    json_error(
        StatusCode::BAD_REQUEST,
        ctype,
        json!({"__type": "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
               "message": "Transaction is ongoing for the item"}),
        &[],
    )
}

fn json_error(
    status: StatusCode,
    content_type: &str,
    body: Value,
    extra: &[(&'static str, &str)],
) -> Response {
    let mut r = (status, body.to_string()).into_response();
    let h = r.headers_mut();
    h.insert("content-type", content_type.parse().unwrap());
    for (k, v) in extra {
        h.insert(*k, v.parse().unwrap());
    }
    r
}

/// The service's own throttling answer to `op` (whose request body is `body`).
fn throttled(service: &str, op: &str, body: &[u8]) -> Response {
    let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match service {
        "dynamodb" if op == "TransactWriteItems" => {
            let n = req["TransactItems"].as_array().map_or(1, Vec::len);
            // Half of them as a conflict with another transaction on the same item (what an
            // owner's shared counters meet), which the store sends again itself.
            let conflict = body.len().is_multiple_of(2);
            let mut reasons = vec![json!({"Code": "None"}); n];
            reasons[0] = if conflict {
                json!({"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"})
            } else {
                json!({"Code": "ThrottlingError", "Message": "Throughput exceeds the current capacity of your table or index."})
            };
            let why = if conflict {
                "TransactionConflict"
            } else {
                "ThrottlingError"
            };
            json_error(
                StatusCode::BAD_REQUEST,
                "application/x-amz-json-1.0",
                json!({
                "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                "message": format!("Transaction cancelled, please refer cancellation reasons for specific reasons [{why}]"),
                "CancellationReasons": reasons}),
                &[],
            )
        }
        "dynamodb" => {
            let code = if op.starts_with("Query") || op == "GetItem" {
                "ProvisionedThroughputExceededException"
            } else {
                "ThrottlingException"
            };
            json_error(
                StatusCode::BAD_REQUEST,
                "application/x-amz-json-1.0",
                json!({
                "__type": format!("com.amazonaws.dynamodb.v20120810#{code}"),
                "message": "Rate of requests exceeds the allowed throughput."}),
                &[],
            )
        }
        "sqs" => json_error(
            StatusCode::BAD_REQUEST,
            "application/x-amz-json-1.0",
            json!({"__type": "com.amazonaws.sqs#RequestThrottled", "message": "Request is throttled."}),
            &[("x-amzn-query-error", "RequestThrottled;Sender")],
        ),
        "events" if op == "PutEvents" => {
            let n = req["Entries"].as_array().map_or(1, Vec::len);
            let entries = vec![
                json!({"ErrorCode": "ThrottlingException", "ErrorMessage": "Rate exceeded"});
                n
            ];
            json_error(
                StatusCode::OK,
                "application/x-amz-json-1.1",
                json!({"FailedEntryCount": n, "Entries": entries}),
                &[],
            )
        }
        "events" | "secretsmanager" => json_error(
            StatusCode::BAD_REQUEST,
            "application/x-amz-json-1.1",
            json!({"__type": "ThrottlingException", "message": "Rate exceeded"}),
            &[],
        ),
        "ses" => query_error(
            StatusCode::BAD_REQUEST,
            "Throttling",
            "Maximum sending rate exceeded.",
        ),
        "scheduler" => json_error(
            StatusCode::TOO_MANY_REQUESTS,
            "application/json",
            json!({"Message": "Rate exceeded"}),
            &[("x-amzn-errortype", "ThrottlingException")],
        ),
        _ => s3_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "SlowDown",
            "Please reduce your request rate.",
        ),
    }
}

/// The service's own 5xx.
fn server_error(service: &str) -> Response {
    match service {
        "dynamodb" => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/x-amz-json-1.0",
            json!({"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError", "message": "Internal server error"}),
            &[],
        ),
        "sqs" => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/x-amz-json-1.0",
            json!({"__type": "com.amazonaws.sqs#InternalError", "message": "We encountered an internal error."}),
            &[("x-amzn-query-error", "InternalError;Receiver")],
        ),
        "events" | "secretsmanager" => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/x-amz-json-1.1",
            json!({"__type": "InternalException", "message": "Internal error"}),
            &[],
        ),
        "ses" => query_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalFailure",
            "Internal failure.",
        ),
        "scheduler" => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/json",
            json!({"Message": "Internal error"}),
            &[("x-amzn-errortype", "InternalServerException")],
        ),
        _ => s3_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "We encountered an internal error.",
        ),
    }
}

/// Field `name` of a query-protocol request's form.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// A query-protocol service's error (SES's).
fn query_error(status: StatusCode, code: &str, message: &str) -> Response {
    let kind = if status.is_server_error() {
        "Receiver"
    } else {
        "Sender"
    };
    let body = format!(
        "<ErrorResponse><Error><Type>{kind}</Type><Code>{code}</Code><Message>{message}</Message></Error><RequestId>fault-layer</RequestId></ErrorResponse>"
    );
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert("content-type", "text/xml".parse().unwrap());
    r
}

fn s3_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert("content-type", "application/xml".parse().unwrap());
    r
}

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let (service, op) = operation(&parts.method, parts.uri.path(), &parts.headers, &body);
    s.stats.requests.fetch_add(1, Ordering::Relaxed);
    if let Some(file) = &s.record {
        record(file, &parts.method, &parts.uri, &parts.headers, &body);
    }
    let roll = if s.on.load(Ordering::SeqCst) {
        s.draw()
    } else {
        1.0
    };
    if s.down.lock().unwrap().contains(service) {
        s.stats.server_errors.fetch_add(1, Ordering::Relaxed);
        s.refused(&format!("{service}.{op}"));
        return server_error(service);
    }
    // DynamoDB's isolation: checked as the request arrives, held until it is answered.
    let _held = if service == "dynamodb" && s.faults.transaction_conflicts {
        let keys = written_items(&op, &body);
        let now = std::time::Instant::now();
        let mut flight = s.in_flight.lock().unwrap();
        flight.retain(|_, holders| {
            holders.retain(|(_, until)| *until > now);
            !holders.is_empty()
        });
        let busy: Vec<bool> = keys.iter().map(|k| flight.contains_key(k)).collect();
        if busy.contains(&true) {
            drop(flight);
            s.stats.conflicts.fetch_add(1, Ordering::Relaxed);
            s.refused(&format!("{service}.{op}"));
            return transaction_conflict(&op, &busy);
        }
        if op == "TransactWriteItems" {
            let id = s.transactions.fetch_add(1, Ordering::Relaxed);
            for k in &keys {
                flight
                    .entry(k.clone())
                    .or_default()
                    .push((id, now + TRANSACTION_TIME));
            }
            Some(Held(s.clone(), id, keys))
        } else {
            None
        }
    } else {
        None
    };
    if roll < s.faults.throttle {
        s.stats.throttled.fetch_add(1, Ordering::Relaxed);
        s.refused(&format!("{service}.{op}"));
        return throttled(service, &op, &body);
    }
    if roll < s.faults.throttle + s.faults.server_error {
        s.stats.server_errors.fetch_add(1, Ordering::Relaxed);
        s.refused(&format!("{service}.{op}"));
        return server_error(service);
    }
    if roll < 1.0 && !s.faults.latency.is_zero() {
        tokio::time::sleep(s.faults.latency.mul_f64(s.draw())).await;
    }
    let mut fwd = s
        .http
        .request(parts.method.clone(), format!("{}{path}", s.upstream))
        .body(body.clone());
    for (k, v) in &parts.headers {
        if k != "host" && k != "content-length" {
            fwd = fwd.header(k, v);
        }
    }
    let writes = matches!(
        op.as_str(),
        "TransactWriteItems" | "PutItem" | "UpdateItem" | "DeleteItem" | "BatchWriteItem"
    );
    let one_at_a_time = match service == "dynamodb" && writes {
        true => Some(s.dynamo_writes.lock().await),
        false => None,
    };
    let answer = match fwd.send().await {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = answer.bytes().await.unwrap_or_default();
    drop(one_at_a_time);
    if service == "dynamodb"
        && writes
        && status.is_success()
        && s.on.load(Ordering::SeqCst)
        && s.faults.lost_answers > 0.0
        && s.draw() < s.faults.lost_answers
    {
        s.stats.lost.fetch_add(1, Ordering::Relaxed);
        return server_error(service);
    }
    if service == "scheduler" && status.is_success() {
        let name = parts
            .uri
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        match op.as_str() {
            "CreateSchedule" | "UpdateSchedule" if s.faults.fire_schedules => arm(&s, name, &body),
            "DeleteSchedule" => {
                *s.schedules.lock().unwrap().entry(name).or_default() += 1;
            }
            _ => {}
        }
    }
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    for (k, v) in &headers {
        if k != "content-length" && k != "transfer-encoding" {
            r.headers_mut().insert(k, v.clone());
        }
    }
    r
}

/// Fires the schedule `name` (its request `body`) as Scheduler would: its target's event
/// on the bus, anywhere within the minute of its `at()` (early second included), then the
/// schedule deletes itself.
fn arm(s: &Arc<Shared>, name: String, body: &Bytes) {
    let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let Some(at) = req["ScheduleExpression"]
        .as_str()
        .and_then(|e| e.strip_prefix("at(")?.strip_suffix(')'))
        .and_then(|t| NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S").ok())
        .map(|t| t.and_utc())
    else {
        return;
    };
    let generation = {
        let mut all = s.schedules.lock().unwrap();
        let g = all.entry(name.clone()).or_default();
        *g += 1;
        *g
    };
    // Not fired yet, though maybe set again (an outbox performed twice updates it).
    let first = !s.fired.lock().unwrap().contains(&name);
    let target = req["Target"].clone();
    let due: Option<DateTime<Utc>> = target["Input"]
        .as_str()
        .and_then(|i| serde_json::from_str::<Value>(i).ok())
        .and_then(|v| v["due"].as_str()?.parse().ok());
    let fire_at = if first && s.faults.early_first_firing {
        // As early as the minute allows, and in any case before the timer is due (by two
        // seconds, which a loaded machine's late wake-up does not eat): a due time in the
        // first second of its minute would otherwise see the early firing land after it.
        let early = at - chrono::Duration::seconds(59);
        due.map_or(early, |d| early.min(d - chrono::Duration::seconds(2)))
    } else {
        at + chrono::Duration::milliseconds(((s.draw() * 118.0 - 59.0) * 1000.0) as i64)
    };
    // A dropped firing is dropped once its retries are spent: never before the timer's time
    // (Scheduler retries for up to a day; a second past it stands for that here).
    let dropped = s.faults.drop_firings > 0.0 && s.draw() < s.faults.drop_firings;
    let fire_at = match due {
        Some(d) if dropped => fire_at.max(d + chrono::Duration::seconds(1)),
        _ => fire_at,
    };
    let group = req["GroupName"].as_str().unwrap_or("default").to_owned();
    let s = s.clone();
    tokio::spawn(async move {
        let wait = (fire_at - Utc::now()).to_std().unwrap_or_default();
        tokio::time::sleep(wait).await;
        if s.schedules.lock().unwrap().get(&name) != Some(&generation) {
            return; // updated or deleted since
        }
        let input = target["Input"].as_str().unwrap_or("{}").to_owned();
        if dropped {
            drop_firing(&s, &target, &input).await;
        } else {
            fire(&s, &target, &name, input, due).await;
        }
        // ActionAfterCompletion: DELETE.
        if s.schedules.lock().unwrap().get(&name) == Some(&generation) {
            let _ = aws_sdk_scheduler::Client::new(&s.sdk)
                .delete_schedule()
                .name(&name)
                .group_name(&group)
                .send()
                .await;
        }
    });
}

/// Puts a schedule's event on its bus, as its target.
async fn fire(s: &Shared, target: &Value, name: &str, input: String, due: Option<DateTime<Utc>>) {
    let eb = aws_sdk_eventbridge::Client::new(&s.sdk);
    let params = &target["EventBridgeParameters"];
    let put = eb
        .put_events()
        .entries(
            aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                .event_bus_name(target["Arn"].as_str().unwrap_or_default())
                .source(params["Source"].as_str().unwrap_or_default())
                .detail_type(params["DetailType"].as_str().unwrap_or_default())
                .detail(input)
                .build(),
        )
        .send()
        .await;
    if put.is_ok() {
        s.fired.lock().unwrap().insert(name.to_owned());
        s.stats.fired.fetch_add(1, Ordering::Relaxed);
        if due.is_some_and(|d| Utc::now() < d) {
            s.stats.fired_early.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Drops a firing as Scheduler does once its retries are spent: the event to the
/// schedule's dead-letter queue (the queue named by the ARN's last part), never the bus.
async fn drop_firing(s: &Shared, target: &Value, input: &str) {
    let queue = target["DeadLetterConfig"]["Arn"]
        .as_str()
        .and_then(|a| a.rsplit(':').next());
    // Without a dead-letter queue the event is simply gone.
    if let Some(queue) = queue {
        let sqs = aws_sdk_sqs::Client::new(&s.sdk);
        if let Ok(url) = sqs.get_queue_url().queue_name(queue).send().await {
            let _ = sqs
                .send_message()
                .queue_url(url.queue_url().unwrap_or_default())
                .message_body(input)
                .send()
                .await;
        }
    }
    s.stats.dropped.fetch_add(1, Ordering::Relaxed);
}

/// Appends, when `BATON_TEST_RECORD_CALLS` names a file, one JSON line per IAM action each
/// request asks of a function's role: `{"function", "action", "resource"}`, the resource
/// as the tail of its ARN (`table/<name>/index/<index>`, `queue/<name>`,
/// `schedule/<group>/<name>`, `object/<bucket>/<key>`…; `event-bus/<name>/<detail-type>`). The function is the one the
/// user agent names (`app/OrchestratorFunction`); a request that names none (creating the
/// resources, the test's own reads) is not the functions' and is not recorded.
/// `tests/policy/calls_granted.py` checks each line against the function's policies.
pub(super) fn record(
    path: &std::path::Path,
    method: &Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: &[u8],
) {
    let Some(function) = headers
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split(' ').find_map(|p| p.strip_prefix("app/")))
    else {
        return;
    };
    let lines: Vec<String> = actions(method, uri, headers, body)
        .into_iter()
        .map(|(action, resource)| {
            json!({"function": function, "action": action, "resource": resource}).to_string() + "\n"
        })
        .collect();
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        // One write per request: appends from concurrent tests do not interleave.
        let _ = f.write_all(lines.concat().as_bytes());
    }
}

/// The IAM actions a request needs, each with its resource (see [`record`]).
fn actions(
    method: &Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Vec<(String, String)> {
    let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (service, op) = operation(method, uri.path(), headers, body);
    let last = |s: &str| s.rsplit('/').next().unwrap_or(s).to_owned();
    match service {
        "dynamodb" => {
            let table = |t: &Value| format!("table/{}", t.as_str().unwrap_or("?"));
            match op.as_str() {
                "TransactWriteItems" | "TransactGetItems" => req["TransactItems"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|item| {
                        let (kind, inner) = item.as_object()?.iter().next()?;
                        let action = match kind.as_str() {
                            "Put" => "PutItem",
                            "Update" => "UpdateItem",
                            "Delete" => "DeleteItem",
                            "ConditionCheck" => "ConditionCheckItem",
                            _ => "GetItem",
                        };
                        Some((format!("dynamodb:{action}"), table(&inner["TableName"])))
                    })
                    .collect(),
                "BatchWriteItem" | "BatchGetItem" => req["RequestItems"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(t, _)| (format!("dynamodb:{op}"), format!("table/{t}")))
                    .collect(),
                _ => {
                    let mut r = table(&req["TableName"]);
                    if let Some(index) = req["IndexName"].as_str() {
                        r = format!("{r}/index/{index}");
                    }
                    vec![(format!("dynamodb:{op}"), r)]
                }
            }
        }
        "sqs" => {
            let action = op.strip_suffix("Batch").unwrap_or(&op);
            let queue = last(req["QueueUrl"].as_str().unwrap_or("?"));
            vec![(format!("sqs:{action}"), format!("queue/{queue}"))]
        }
        "events" => req["Entries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                // With the entry's detail-type: the bus's own policy decides some by it.
                let bus = last(e["EventBusName"].as_str().unwrap_or("default"));
                let detail_type = e["DetailType"].as_str().unwrap_or("?");
                (
                    format!("events:{op}"),
                    format!("event-bus/{bus}/{detail_type}"),
                )
            })
            .collect(),
        "secretsmanager" => vec![(
            format!("secretsmanager:{op}"),
            format!("secret/{}", req["SecretId"].as_str().unwrap_or("?")),
        )],
        "ses" => {
            // Sending is authorized on the sender's identity: its address, or its domain.
            let from = form_field(body, "Source").unwrap_or_else(|| "?".into());
            vec![(format!("ses:{op}"), format!("identity/{from}"))]
        }
        "scheduler" => {
            let name = last(uri.path());
            let group = uri
                .query()
                .and_then(|q| {
                    q.split('&')
                        .find_map(|kv| kv.strip_prefix("groupName=").map(str::to_owned))
                })
                .or_else(|| req["GroupName"].as_str().map(str::to_owned))
                .unwrap_or_else(|| "default".into());
            let mut out = vec![(
                format!("scheduler:{op}"),
                format!("schedule/{group}/{name}"),
            )];
            if let Some(role) = req["Target"]["RoleArn"].as_str() {
                out.push(("iam:PassRole".into(), format!("role/{}", last(role))));
            }
            out
        }
        _ => {
            // S3, path-style: /<bucket>[/<key>].
            let path = uri.path().trim_start_matches('/');
            let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
            let action = match (method, key.is_empty()) {
                (&Method::PUT, false) => "PutObject",
                (&Method::DELETE, false) => "DeleteObject",
                (_, false) => "GetObject",
                (&Method::GET, true) => "ListBucket",
                _ => "CreateBucket",
            };
            let resource = if key.is_empty() {
                format!("bucket/{bucket}")
            } else {
                format!("object/{bucket}/{key}")
            };
            vec![(format!("s3:{action}"), resource)]
        }
    }
}
