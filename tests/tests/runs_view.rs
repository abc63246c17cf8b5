//! What the operators' console reads, on both hosts (the dev host on SQLite; the AWS host on
//! DynamoDB, SQS, EventBridge and Scheduler on moto): `GET /runs` filtered by status, agent
//! and span of creation, paged through a filter; `GET /runs/{id}/tree` with a subagent and
//! a plan's steps' runs; bad filters refused.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::aws::Api;
use common::*;
use serde_json::{Value, json};

const SCRIPT: &str = r#"{
  "boss": [
    {"tool_calls": [{"name": "spawn_subagent", "arguments": {"agent": "helper", "prompt": "map the repo"}}]},
    {"text": "The helper mapped it."}],
  "asker": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Go?"}}]},
    {"text": "Went."}],
  "release": [
    {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"plan": {"steps": [
      {"id": "check", "agent": "helper", "prompt": "check"},
      {"id": "ship", "agent": "helper", "prompt": "ship"}]}}}]},
    {"text": "The plan ran."}],
  "helper": [{"text": "Done."}]
}"#;

fn agents() -> Arc<baton_core::agent::Catalog> {
    catalog(Some(json!({"agents": {
        "boss": {"tools": ["spawn_subagent"]},
        "asker": {"tools": ["request_human_feedback"]},
        "release": {"tools": ["agent_orchestrate"]},
        "helper": {"tools": []}
    }})))
}

/// What these tests ask of either host's API beside [`Api`]'s calls.
trait RunsApi {
    async fn start(&self, agent: &str) -> String;
    async fn page(&self, query: &str) -> (Vec<String>, Option<String>);
}

impl RunsApi for Api {
    async fn start(&self, agent: &str) -> String {
        let (code, v) = self
            .post(
                "/runs",
                json!({"agent": agent, "prompt": format!("{agent}, go")}),
            )
            .await;
        assert_eq!(code, 202, "{v}");
        v["runId"].as_str().unwrap().to_owned()
    }

    /// The run ids of a page of `GET /runs?{query}`, and its next cursor.
    async fn page(&self, query: &str) -> (Vec<String>, Option<String>) {
        let (code, v) = self.get(&format!("/runs?{query}")).await;
        assert_eq!(code, 200, "{query}: {v}");
        let ids = v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["runId"].as_str().unwrap().to_owned())
            .collect();
        (ids, v["nextCursor"].as_str().map(str::to_owned))
    }
}

/// A time for a query string (RFC 3339's `+` would read as a space).
fn enc(s: &str) -> String {
    s.replace('+', "%2B")
}

async fn runs_view(api: &Api) {
    // Created one after another: boss, then asker, then the release plan (newest).
    let boss = api.start("boss").await;
    api.status(&boss, "completed").await;
    let asker = api.start("asker").await;
    let asked = api.status(&asker, "waiting").await;
    let planner = api.start("release").await;
    api.status(&planner, "completed").await;

    let (all, next) = api.page("").await;
    assert_eq!(all, [planner.as_str(), &asker, &boss]);
    assert_eq!(next, None);
    let (code, v) = api.get("/runs").await;
    assert_eq!(code, 200);
    let listed = &v["runs"][2];
    assert_eq!(listed["agent"], "boss");
    assert_eq!(listed["status"], "completed");
    assert!(listed["total"]["usage"].is_object(), "{listed}");

    // By status, by agent, both, and a span of creation times.
    assert_eq!(
        api.page("status=waiting").await,
        (vec![asker.clone()], None)
    );
    assert_eq!(api.page("agent=boss").await, (vec![boss.clone()], None));
    assert_eq!(
        api.page("status=completed&agent=asker").await.0,
        Vec::<String>::new()
    );
    assert_eq!(api.page("status=all").await.0.len(), 3);
    let at = asked["createdAt"].as_str().unwrap();
    assert_eq!(
        api.page(&format!("since={}", enc(at))).await.0,
        [planner.as_str(), &asker]
    );
    assert_eq!(
        api.page(&format!("until={}", enc(at))).await.0,
        [boss.as_str()]
    );
    assert_eq!(
        api.page(&format!("since={0}&until={0}", enc(at))).await.0,
        Vec::<String>::new()
    );
    // Ends reversed: an empty span too, not an error.
    assert_eq!(
        api.page("since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z")
            .await,
        (Vec::<String>::new(), None)
    );

    // Paged through a filter: a page reads `limit` runs and keeps those that match, so a
    // page may be empty and still say more may follow.
    let mut kept = Vec::new();
    let mut empty_with_more = false;
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let q = match &cursor {
            Some(c) => format!("status=completed&limit=1&cursor={c}"),
            None => "status=completed&limit=1".to_owned(),
        };
        let (ids, next) = api.page(&q).await;
        empty_with_more |= ids.is_empty() && next.is_some();
        kept.extend(ids);
        cursor = next;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(kept, [planner.as_str(), &boss]);
    assert!(empty_with_more, "the asker's page is empty, with a cursor");
    assert_eq!(cursor, None);

    // Trees: the boss's subagent; the plan's two steps' runs, under the plan's call.
    let (code, tree) = api.get(&format!("/runs/{boss}/tree")).await;
    assert_eq!(code, 200, "{tree}");
    assert_eq!(tree["run"]["runId"], boss.as_str());
    assert_eq!(tree["truncated"], false);
    let under = tree["descendants"].as_array().unwrap();
    assert_eq!(under.len(), 1, "{tree}");
    assert_eq!(under[0]["agent"], "helper");
    assert_eq!(under[0]["status"], "completed");
    assert_eq!(under[0]["parent"]["runId"], boss.as_str());
    assert_eq!(under[0]["prompt"], "map the repo");
    let (_, tree) = api.get(&format!("/runs/{planner}/tree")).await;
    let steps = tree["descendants"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{tree}");
    let (_, timeline) = api.get(&format!("/runs/{planner}/timeline")).await;
    let plan = timeline["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "agent_orchestrate")
        .unwrap()
        .clone();
    for (step, id) in steps.iter().zip(["check", "ship"]) {
        assert_eq!(step["parent"]["runId"], planner.as_str());
        assert_eq!(step["parent"]["toolCallId"], plan["id"]);
        assert_eq!(
            step["runId"], plan["plan"]["steps"][id]["childRunId"],
            "{id}"
        );
        assert_eq!(step["status"], "completed");
    }
    // A subagent's own tree: itself, nothing under it.
    let child = under[0]["runId"].as_str().unwrap();
    let (code, tree) = api.get(&format!("/runs/{child}/tree")).await;
    assert_eq!(code, 200);
    assert_eq!(tree["run"]["parent"]["runId"], boss.as_str());
    assert_eq!(tree["descendants"], json!([]));
    // The asker's, though it waits: the run alone.
    let (_, tree) = api.get(&format!("/runs/{asker}/tree")).await;
    assert_eq!(tree["run"]["status"], "waiting");
    assert_eq!(tree["descendants"], json!([]));

    // Bad filters: 400 with a JSON body; an unknown run's tree: 404.
    for q in [
        "status=paused",
        "since=yesterday",
        "until=2026-13-01T00:00:00Z",
        "limit=0",
    ] {
        let (code, v) = api.get(&format!("/runs?{q}")).await;
        assert_eq!(code, 400, "{q}: {v}");
        assert_eq!(v["error"]["code"], "invalid_request", "{q}");
    }
    let (code, v) = api.get("/runs/run_nope/tree").await;
    assert_eq!(code, 404, "{v}");
}

#[tokio::test]
async fn runs_filter_page_and_show_their_tree_on_the_dev_host() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path(), scripted(SCRIPT), agents()).await;
    let api = Api::new(h.server.url());
    runs_view(&api).await;
    h.server.shutdown().await;
}

#[tokio::test]
async fn runs_filter_page_and_show_their_tree_on_the_aws_host() {
    let aws = common::aws::Emulator::start().await;
    let server = aws.dev_host("runsview", scripted(SCRIPT), agents()).await;
    let api = Api::new(server.url());
    runs_view(&api).await;
    server.shutdown().await;
}

/// Callers by token: `alice` and `bob` own runs; `ops` is an operator.
struct Tokens;

impl baton_api::Authenticator for Tokens {
    fn authenticate(
        &self,
        headers: &axum::http::HeaderMap,
        _: &axum::http::Extensions,
    ) -> Result<baton_api::Caller, baton_api::ApiError> {
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match token {
            Some(t @ ("alice" | "bob" | "ops")) => Ok(baton_api::Caller::new(t)),
            _ => Err(baton_api::ApiError::unauthorized("who?")),
        }
    }

    fn is_operator(&self, caller: &baton_api::Caller) -> bool {
        caller.id == "ops"
    }
}

#[tokio::test]
async fn an_operator_reads_every_owners_runs_and_steers_none() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path(), scripted(SCRIPT), agents()).await;
    let app = baton_api::router(baton_api::AppState {
        service: h.server.service.clone(),
        auth: Arc::new(Tokens),
        streams: true,
        stop: None,
        live: None,
        watchers: None,
    });
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let (addr, _server) = baton_api::serve(app, "127.0.0.1:0".parse().unwrap(), rx)
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let call = async |who: &str, method: reqwest::Method, path: &str| -> (u16, Value) {
        let mut req = http
            .request(method.clone(), format!("http://{addr}{path}"))
            .bearer_auth(who);
        if path == "/runs" && method == reqwest::Method::POST {
            req = req.json(&json!({"agent": "boss", "prompt": "go"}));
        } else if path.ends_with("/messages") {
            req = req.json(&json!({"text": "again"}));
        }
        let r = req.send().await.unwrap();
        let code = r.status().as_u16();
        (code, r.json().await.unwrap_or(Value::Null))
    };
    let (code, v) = call("alice", reqwest::Method::POST, "/runs").await;
    assert_eq!(code, 202, "{v}");
    let run = v["runId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while call("alice", reqwest::Method::GET, &format!("/runs/{run}"))
        .await
        .1["status"]
        != "completed"
    {
        assert!(Instant::now() < deadline, "alice's run never completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Bob is no operator: another owner's runs are not his to list or read.
    let (code, v) = call("bob", reqwest::Method::GET, "/runs?owner=alice").await;
    assert_eq!(code, 403, "{v}");
    assert_eq!(v["error"]["code"], "forbidden");
    for path in [
        format!("/runs/{run}"),
        format!("/runs/{run}/tree"),
        format!("/runs/{run}/stream"),
    ] {
        assert_eq!(
            call("bob", reqwest::Method::GET, &path).await.0,
            404,
            "{path}"
        );
    }
    assert_eq!(
        call("bob", reqwest::Method::GET, "/runs?owner=bob").await.0,
        200
    );
    // The operator lists Alice's runs, and reads one, its timeline and its tree.
    let (code, v) = call("ops", reqwest::Method::GET, "/runs?owner=alice").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["runs"][0]["runId"], run.as_str());
    let (_, v) = call("ops", reqwest::Method::GET, "/runs").await;
    assert_eq!(v["runs"], json!([]), "the operator's own runs: none");
    let (code, v) = call("ops", reqwest::Method::GET, &format!("/runs/{run}")).await;
    assert_eq!((code, &v["result"]), (200, &json!("The helper mapped it.")));
    let (code, v) = call(
        "ops",
        reqwest::Method::GET,
        &format!("/runs/{run}/timeline"),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let (code, _) = call("ops", reqwest::Method::GET, &format!("/runs/{run}/stream")).await;
    assert_eq!(code, 200, "the operator follows it too");
    let (code, v) = call("ops", reqwest::Method::GET, &format!("/runs/{run}/tree")).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["descendants"].as_array().unwrap().len(), 1);
    // Steering stays the owner's: the operator's cancel and follow-up find no run.
    for path in [
        format!("/runs/{run}/cancel"),
        format!("/runs/{run}/messages"),
    ] {
        let (code, v) = call("ops", reqwest::Method::POST, &path).await;
        assert_eq!(code, 404, "{path}: {v}");
    }
    let (_, v) = call("alice", reqwest::Method::GET, &format!("/runs/{run}")).await;
    assert_eq!(v["status"], "completed", "nothing changed");
    h.server.shutdown().await;
}
