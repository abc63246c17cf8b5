//! The live channel as on AWS: the step functions publish a watched run's live events to an
//! AppSync Events API (here its stand-in, `common/appsync.rs`, which checks their SigV4
//! signatures and authorizes watchers with the `live` function's code); the API grants
//! watches (`POST /runs/{id}/watch`); a watcher subscribes over the WebSocket protocol with
//! the grant (`baton_aws::channel`, what `baton watch` uses), catches up from the timeline,
//! then sees the reply stream before it commits. A run nobody watches publishes nothing.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_credential_types::provider::ProvideCredentials;
use baton_core::live::grant::{Grants, Watch, channel};
use common::appsync::StandIn;
use common::aws::Emulator;
use common::host::{AwsHost, TestHost};
use common::*;
use reqwest::Method;
// (`browser` is common's.)
use serde_json::{Value, json};

const SCRIPT: &str = r#"{"watcher": [
  {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Look?"}}]},
  {"text": "Checking the logs first.", "tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]},
  {"text": "All clear: nothing failed overnight, the nightly build is green, the backups ran, and the disk has room to spare for another week of logs."}],
 "greeter": [{"text": "Good morning: the build is green and nothing failed overnight."}],
 "ticker": [
  {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Go?"}}]},
  {"tool_calls": [{"name": "report", "arguments": {"waitMs": 2500}}]},
  {"tool_calls": [{"name": "report", "arguments": {"waitMs": 2500}}]},
  {"tool_calls": [{"name": "report", "arguments": {"waitMs": 2500}}]},
  {"text": "Three reports, all in."}],
 "slow": [
  {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Look?"}}]},
  {"tool_calls": [{"name": "report", "arguments": {"waitMs": 4000}}]},
  {"text": "All clear: nothing failed overnight, the nightly build is green, the backups ran, and the disk has room to spare for another week of logs."}]}"#;

/// `baton dev --aws` whose live channel is the AppSync stand-in.
struct Env {
    host: AwsHost,
    standin: StandIn,
    grants: Grants,
}

impl Env {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.host.api().call(method, path, body).await
    }

    async fn wait_for(&self, what: &str, mut f: impl AsyncFnMut(&Env) -> Option<Value>) -> Value {
        let (within, every) = (Duration::from_secs(60), Duration::from_millis(50));
        common::wait_for(what, within, every, async || f(self).await).await
    }

    /// A run of the watcher agent, parked on its approval: its id and the CTA's.
    async fn parked_run(&self) -> (String, String) {
        self.parked_run_of("watcher").await
    }

    /// A run of `agent`, parked on its approval: its id and the CTA's.
    async fn parked_run_of(&self, agent: &str) -> (String, String) {
        let (status, run) = self
            .call(
                Method::POST,
                "/runs",
                Some(json!({"prompt": "anything overnight?", "agent": agent})),
            )
            .await;
        assert_eq!(status, 202, "{run}");
        let run_id = run["runId"].as_str().unwrap().to_owned();
        let cta = self
            .wait_for("the approval", async |env: &Env| {
                let (_, v) = env
                    .call(
                        Method::GET,
                        &format!("/ctas?status=pending&rootRunId={run_id}"),
                        None,
                    )
                    .await;
                v["ctas"].as_array().and_then(|c| c.first().cloned())
            })
            .await;
        (run_id, cta["ctaId"].as_str().unwrap().to_owned())
    }

    async fn approve(&self, cta: &str) {
        let (status, body) = self
            .call(
                Method::POST,
                &format!("/ctas/{cta}/response"),
                Some(json!({"kind": "approval", "approved": true})),
            )
            .await;
        assert_eq!(status, 202, "{body}");
    }

    async fn completed(&self, run_id: &str) -> bool {
        let (_, run) = self
            .call(Method::GET, &format!("/runs/{run_id}"), None)
            .await;
        run["status"] == "completed"
    }

    /// The API as the `api` function serves it behind API Gateway: no stream, and grants of
    /// watches on the live channel. Its address, and what serves it.
    async fn as_api_function(
        &self,
    ) -> (
        std::net::SocketAddr,
        (
            tokio::sync::watch::Sender<bool>,
            tokio::task::JoinHandle<std::io::Result<()>>,
        ),
    ) {
        let (addr, _reads, served) = self.as_counted_api_function().await;
        (addr, served)
    }

    /// The API as the `api` function serves it, counting the reads of a timeline
    /// (`GET …/timeline`).
    async fn as_counted_api_function(
        &self,
    ) -> (
        std::net::SocketAddr,
        Arc<std::sync::atomic::AtomicU32>,
        (
            tokio::sync::watch::Sender<bool>,
            tokio::task::JoinHandle<std::io::Result<()>>,
        ),
    ) {
        let reads = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = reads.clone();
        let app = baton_api::router(baton_api::AppState {
            service: self.host.server().service.clone(),
            auth: Arc::new(baton_api::BearerToken::new(TOKEN, "local")),
            streams: false,
            stop: None,
            live: None,
            watchers: self.host.server().watchers.clone(),
        })
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                if req.uri().path().ends_with("/timeline") {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                next.run(req)
            },
        ));
        let (stop, rx) = tokio::sync::watch::channel(false);
        let (addr, served) = baton_api::serve(app, "127.0.0.1:0".parse().unwrap(), rx)
            .await
            .unwrap();
        (addr, reads, (stop, served))
    }

    async fn timeline(&self, run_id: &str) -> Vec<Value> {
        let (status, page) = self
            .call(Method::GET, &format!("/runs/{run_id}/timeline"), None)
            .await;
        assert_eq!(status, 200, "{page}");
        page["entries"].as_array().cloned().unwrap_or_default()
    }
}

async fn start() -> Env {
    let aws = Emulator::start_with(None).await;
    let sdk = aws.host_sdk().await;
    let keys = sdk
        .credentials_provider()
        .expect("credentials")
        .provide_credentials()
        .await
        .expect("keys");
    let grants = Grants::new(&[5; 32]).unwrap();
    let standin = StandIn::start(grants.clone(), keys).await;
    let agents = json!({"agents": {"watcher": {"tools": ["request_human_feedback", "echo"]},
                                   "greeter": {"tools": []},
                                   "ticker": {"tools": ["request_human_feedback", "report"]},
                                   "slow": {"tools": ["request_human_feedback", "report"]}}});
    let aws = Arc::new(aws);
    let mut options = aws
        .dev_options(
            aws.names("live"),
            scripted(SCRIPT),
            catalog_with_report(agents),
            0,
        )
        .await;
    options.live = Some((standin.config(), grants.clone()));
    options.links = None;
    Env {
        host: AwsHost::start(aws, options).await,
        standin,
        grants,
    }
}

#[tokio::test]
async fn a_late_watcher_on_the_aws_channel_catches_up_then_sees_the_reply_stream() {
    let env = start().await;

    // Nobody watches this run: its steps publish nothing at all.
    let (quiet, quiet_cta) = env.parked_run().await;
    env.approve(&quiet_cta).await;
    env.wait_for("the quiet run to complete", async |env: &Env| {
        env.completed(&quiet).await.then_some(Value::Null)
    })
    .await;

    // Watched once it is parked: the grant names the channel, the realtime URL and the
    // host; the run is leased to its watchers until the grant ends.
    let (run_id, cta) = env.parked_run().await;
    let (status, grant) = env
        .call(Method::POST, &format!("/runs/{run_id}/watch"), None)
        .await;
    assert_eq!(status, 200, "{grant}");
    let watch: Watch = serde_json::from_value(grant.clone()).expect("a grant");
    assert_eq!(watch.transport, "appsync-events");
    assert_eq!(watch.channel, channel(&run_id));
    assert!(watch.realtime_url.ends_with("/event/realtime"), "{grant}");
    assert!(watch.renew_after_seconds > 0 && watch.renew_after_seconds < 300);
    // Someone else's run, or none: no grant.
    let (status, _) = env.call(Method::POST, "/runs/run_nope/watch", None).await;
    assert_eq!(status, 404);

    // A token lets its holder into its own run's channel alone, and a forged one nowhere.
    let other = Watch {
        channel: channel(&quiet),
        ..watch.clone()
    };
    let refused = baton_aws::channel::subscribe(&other)
        .await
        .err()
        .expect("refused");
    assert!(refused.to_string().contains("not authorized"), "{refused}");
    let forged = Watch {
        token: env.grants.token(&quiet, 0),
        ..watch.clone()
    };
    assert!(baton_aws::channel::subscribe(&forged).await.is_err());

    // Subscribed, then caught up from the timeline: the question it waits on.
    let mut sub = baton_aws::channel::subscribe(&watch)
        .await
        .expect("subscribed");
    let caught_up = env.timeline(&run_id).await;
    assert!(
        caught_up
            .iter()
            .any(|e| e["name"] == "request_human_feedback" && e["result"]["status"] == "pending"),
        "{caught_up:#?}"
    );
    let committed_before = caught_up.len();

    env.approve(&cta).await;
    let mut events: Vec<Value> = Vec::new();
    // For each reply, whether its entry was still to come when its first piece arrived.
    let mut uncommitted_at_first_delta = std::collections::BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "no end: {events:#?}");
        match tokio::time::timeout(Duration::from_millis(200), sub.next()).await {
            Ok(Some(e)) => {
                let seq = e["seq"].as_u64().unwrap();
                if e["type"] == "delta" && !uncommitted_at_first_delta.contains_key(&seq) {
                    let now = env.timeline(&run_id).await;
                    let committed = now
                        .iter()
                        .any(|x| x["type"] == "assistant" && x["seq"].as_u64() >= Some(seq));
                    uncommitted_at_first_delta.insert(seq, !committed);
                }
                events.push(e);
            }
            Ok(None) => panic!("the channel closed: {events:#?}"),
            Err(_) => {
                if env.completed(&run_id).await {
                    // What was published before completion has been delivered by now.
                    while let Ok(Some(e)) =
                        tokio::time::timeout(Duration::from_millis(500), sub.next()).await
                    {
                        events.push(e);
                    }
                    break;
                }
            }
        }
    }
    let timeline = env.timeline(&run_id).await;
    // The last reply (long enough to take a while to stream) streamed before it committed.
    let last = timeline
        .iter()
        .rfind(|e| e["type"] == "assistant")
        .and_then(|e| e["seq"].as_u64())
        .unwrap();
    assert_eq!(
        uncommitted_at_first_delta.get(&last),
        Some(&true),
        "{uncommitted_at_first_delta:?} {events:#?}"
    );
    assert!(timeline.len() > committed_before);
    // Each reply's pieces, joined, are its committed text.
    for entry in timeline
        .iter()
        .filter(|e| e["type"] == "assistant" && e["text"].is_string())
    {
        let streamed: String = events
            .iter()
            .filter(|e| e["type"] == "delta" && e["seq"] == entry["seq"])
            .map(|e| e["text"].as_str().unwrap())
            .collect();
        if entry["seq"].as_u64() >= Some(committed_before as u64) {
            assert_eq!(streamed, entry["text"].as_str().unwrap(), "{events:#?}");
        }
    }
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    for kind in [
        "state",
        "delta",
        "tool_call_delta",
        "tool_started",
        "tool_finished",
    ] {
        assert!(kinds.contains(&kind), "no {kind}: {kinds:?}");
    }
    assert!(events.iter().all(|e| e["runId"] == run_id.as_str()));
    // Text pieces that came within the publisher's window went as one event.
    let deltas = kinds.iter().filter(|k| **k == "delta").count();
    let words: usize = timeline
        .iter()
        .filter_map(|e| e["text"].as_str())
        .map(|t| t.split_whitespace().count())
        .sum();
    assert!(deltas < words, "{deltas} deltas for {words} words");

    assert!(env.standin.published(&channel(&quiet)).is_empty());
    assert!(!env.standin.published(&channel(&run_id)).is_empty());
    assert!(env.standin.asked("EVENT_CONNECT") >= 1);
    assert!(env.standin.asked("EVENT_SUBSCRIBE") >= 2);
}

#[tokio::test]
async fn the_console_watches_a_run_through_the_aws_channel_in_a_real_browser() {
    let env = start().await;
    let (run_id, _) = env.parked_run().await;
    let (addr, _served) = env.as_api_function().await;
    let reply = serde_json::from_str::<Value>(SCRIPT).unwrap()["watcher"][2]["text"].clone();
    let cfg = json!({
        "base": format!("http://{addr}"),
        "token": TOKEN,
        "run": run_id,
        "reply": reply,
        "standin": env.standin.url,
    });
    browser::run_script("aws_live.mjs", cfg).await;
    // The page connected and subscribed again after the channel closed its connection.
    assert!(env.standin.asked("EVENT_CONNECT") >= 2);
    assert!(env.standin.asked("EVENT_SUBSCRIBE") >= 2);
    assert!(env.completed(&run_id).await);
    assert!(env.standin.asked("EVENT_SUBSCRIBE") >= 1);
    let streamed = env.standin.published(&channel(&run_id));
    assert!(streamed.iter().any(|p| p.event["type"] == "delta"));
}

/// `baton watch RUN_ID` against the API at `addr`: the binary the workspace's tests built
/// (`cargo test --workspace` builds it for the CLI's own tests).
fn baton_watch(addr: std::net::SocketAddr, run_id: &str) -> tokio::process::Child {
    let bin = common::target_dir().join("debug/baton");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo test --workspace` (or `cargo build -p baton-cli`) first",
        bin.display()
    );
    tokio::process::Command::new(&bin)
        .args(["watch", run_id])
        .env("BATON_ENDPOINT", format!("http://{addr}"))
        .env("BATON_TOKEN", TOKEN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("baton watch starts")
}

#[tokio::test]
async fn baton_watch_takes_its_live_view_from_the_aws_channel() {
    let env = start().await;
    // A run whose tool takes 4 s after the answer: watch subscribes meanwhile, and the reply
    // after it streams to its channel.
    let (run_id, cta) = env.parked_run_of("slow").await;
    let (addr, _served) = env.as_api_function().await;
    // Answered, then watched: the run goes on, and watch follows it to its end (a parked
    // run would have it print the question and exit 5 at once).
    env.approve(&cta).await;
    let watch = baton_watch(addr, &run_id);
    // Subscribed while the tool runs: the channel then closes its connection (AppSync's
    // time limit), and watch connects and subscribes again before the reply streams.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while env.standin.asked("EVENT_SUBSCRIBE") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "watch never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered_before = env.standin.delivered();
    env.standin.close_connections();
    let out = tokio::time::timeout(Duration::from_secs(60), watch.wait_with_output())
        .await
        .expect("baton watch ends")
        .expect("its output");
    let text = String::from_utf8_lossy(&out.stdout);
    let said = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
    let reply = serde_json::from_str::<Value>(SCRIPT).unwrap()["slow"][2]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(out.status.code(), Some(0), "{said}");
    // It subscribed with its grant and was sent the run's live events over the channel
    // (the API it polls does not stream).
    assert!(env.standin.asked("EVENT_SUBSCRIBE") >= 2, "{said}");
    assert!(
        said.contains("the live channel closed; connecting again"),
        "{said}"
    );
    assert!(env.standin.delivered() > delivered_before, "{said}");
    // What committed before the streamed reply is shown before it.
    let report = text.find("  report = ").expect("the report's result");
    assert!(report < text.find(&reply).unwrap(), "{said}");
    // Each reply once, as it streamed (no correction), then the outcome.
    assert_eq!(text.matches(&reply).count(), 1, "{said}");
    assert!(!text.contains("[as committed]"), "{said}");
    assert!(text.contains("status completed"), "{said}");
}

/// A run started with `watch: true` is leased to its watchers in the request that creates
/// it, before its first step: that step publishes its reply's pieces on the channel, so a
/// watcher who subscribes as it starts sees the first reply stream (a run started without
/// it publishes nothing until someone asks to watch).
#[tokio::test]
async fn a_run_started_to_be_watched_publishes_its_first_reply_on_the_aws_channel() {
    let mut env = start().await;
    let mut ids = Vec::new();
    for watch in [true, false] {
        let body = json!({"prompt": "morning?", "agent": "greeter", "watch": watch});
        let (status, run) = env.call(Method::POST, "/runs", Some(body)).await;
        assert_eq!(status, 202, "{run}");
        ids.push(run["runId"].as_str().unwrap().to_owned());
    }
    let (watched, quiet) = (ids[0].clone(), ids[1].clone());
    for run_id in [&watched, &quiet] {
        env.wait_for("the run to complete", async |env: &Env| {
            env.completed(run_id).await.then_some(Value::Null)
        })
        .await;
    }
    let deltas: String = env
        .standin
        .published(&channel(&watched))
        .iter()
        .filter(|p| p.event["type"] == "delta" && p.event["seq"] == 1)
        .map(|p| p.event["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        deltas, "Good morning: the build is green and nothing failed overnight.",
        "the first reply, whole, on the channel"
    );
    assert!(env.standin.published(&channel(&quiet)).is_empty());
    env.host.stop().await;
}

/// Behind API Gateway nothing streams the timeline, so a watched run's steps publish what
/// they committed on the live channel (`committed`), entries and all, and `baton watch`
/// shows them, reading the timeline only until a step is heard from and to catch up.
#[tokio::test]
async fn committed_entries_reach_a_watcher_on_the_aws_channel() {
    let mut env = start().await;
    let (run_id, cta) = env.parked_run_of("ticker").await;
    let (addr, reads, _served) = env.as_counted_api_function().await;
    // The first step the watch hears commit is lost on its way: the next one's `from` shows
    // the gap, and the watcher reads the timeline then (not at its 30 s safety read).
    env.standin.lose_committed(1);
    env.approve(&cta).await;
    let began = std::time::Instant::now();
    let watch = baton_watch(addr, &run_id);
    let out = tokio::time::timeout(Duration::from_secs(60), watch.wait_with_output())
        .await
        .expect("baton watch ends")
        .expect("its output");
    let took = began.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let said = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{said}");
    // Every report's result shown, once, then the answer and the outcome.
    assert_eq!(text.matches("  report = ").count(), 3, "{said}");
    assert_eq!(text.matches("Three reports, all in.").count(), 1, "{said}");
    assert!(text.contains("status completed"), "{said}");
    assert!(took < Duration::from_secs(25), "{took:?}: {said}");

    // The steps published their commits, entries and all, on the run's channel.
    let committed: Vec<_> = env
        .standin
        .published(&channel(&run_id))
        .into_iter()
        .filter(|p| p.event["type"] == "committed")
        .collect();
    // (The step already under way when the watch began read the run before its lease.)
    assert!(committed.len() >= 2, "{} committed events", committed.len());
    for p in &committed {
        let entries = p.event["entries"].as_array().expect("its entries");
        assert!(!entries.is_empty(), "{}", p.event);
        assert!(p.event["version"].as_u64().is_some() && p.event["status"].is_string());
    }
    let tools = committed
        .iter()
        .flat_map(|p| p.event["entries"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["type"] == "tool" && e["result"]["status"] == "success")
        .count();
    assert!(
        tools >= 2,
        "the reports' results came on the channel: {committed:?}"
    );
    // Once a step was heard from, the channel carried the commits: the timeline was read
    // at the start, each second while the step under way at the start ran (up to 2.5 s),
    // once when the next step was heard from, and once for the gap. (Polling each second
    // reads it about 9 times over the 7.5 s run.)
    let reads = reads.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{reads} reads of the timeline over a 7.5 s run");
    assert!(reads <= 6, "{reads} reads of the timeline");
    env.host.stop().await;
}
