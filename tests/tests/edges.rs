//! Exactly once at every edge, on both hosts (the dev host over SQLite, the AWS host over
//! moto): a tool call's idempotency key names one call of one run (three runs and a fork,
//! a receiver that records the keys); the cap of ten waiting follow-ups holds under 100
//! concurrent posts (one conditional write admits each); a fork gives a follow-up that
//! waited at its fork point its turn; a cancelled run takes no follow-up nor trigger.

use crate::common;

use std::sync::Arc;

use common::aws::Api;
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, ResponseTemplate, matchers};

/// The orchestrator's first reply pays (an approval gates it), its second says so.
const PAY: &str = r#"{"orchestrator": [
  {"tool_calls": [{"name": "pay", "arguments": {"cents": 500}}]},
  {"text": "Paid."}]}"#;

fn pay_agents(tool: &MockServer) -> Arc<baton_core::agent::Catalog> {
    common::tools_catalog(json!({
        "tools": {"pay": {"url": format!("{}/pay", tool.uri()), "description": "pays",
            "schema": {"type": "object", "properties": {"cents": {"type": "integer"}}}}},
        "agents": {"orchestrator": {"system": "agent:orchestrator", "tools": ["pay"],
            "approval": {"pay": "always"}}}
    }))
}

async fn pay_server() -> MockServer {
    let tool = MockServer::start().await;
    Mock::given(matchers::method("POST"))
        .and(matchers::path("/pay"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"paid": true})))
        .mount(&tool)
        .await;
    tool
}

/// The question waiting in run `run_id`, once there is one.
async fn question_of(api: &Api, run_id: &str) -> Value {
    let path = format!("/ctas?status=pending&rootRunId={run_id}");
    api.wait("the run's question", async |api: &Api| {
        let (_, v) = api.get(&path).await;
        v["ctas"].as_array().and_then(|c| c.first().cloned())
    })
    .await
}

async fn approve(api: &Api, cta: &Value) {
    let (code, v) = api
        .post(
            &format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap()),
            json!({"kind": "approval", "approved": true}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
}

/// The key each run's `pay` call must have sent: derived from the run and its entry.
fn expected_key(run: &Value) -> String {
    let pay = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool" && e["name"] == "pay" && e["result"]["status"] == "success")
        .unwrap_or_else(|| panic!("a paid call: {run}"));
    baton_core::tools::idempotency_key(
        run["runId"].as_str().unwrap(),
        pay["seq"].as_u64().unwrap(),
        pay["id"].as_str().unwrap(),
        &pay["input"],
    )
}

/// Three runs of an agent whose first reply pays, and a fork of the first at its approval
/// that pays again: four calls, four keys, each the run's and the call's.
async fn keys_flow(api: &Api, tool: &MockServer) {
    let mut runs = Vec::new();
    for _ in 0..3 {
        let (code, v) = api.post("/runs", json!({"prompt": "pay"})).await;
        assert_eq!(code, 202, "{v}");
        let run_id = v["runId"].as_str().unwrap().to_owned();
        approve(api, &question_of(api, &run_id).await).await;
        runs.push(api.status(&run_id, "completed").await);
    }
    let at = runs[0]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["cta"].is_object())
        .and_then(|e| e["seq"].as_u64())
        .unwrap();
    let (code, v) = api
        .post(
            &format!("/runs/{}/fork", runs[0]["runId"].as_str().unwrap()),
            json!({"atSeq": at, "replacement": {"response": {"kind": "approval", "approved": true}}}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    runs.push(api.status(v["runId"].as_str().unwrap(), "completed").await);

    let sent = common::idempotency_keys(&tool.received_requests().await.unwrap_or_default());
    let mut want: Vec<String> = runs.iter().map(expected_key).collect();
    let mut got = sent.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want, "one call each, with its own key");
    let distinct: std::collections::HashSet<_> = sent.iter().collect();
    assert_eq!(distinct.len(), 4, "{sent:?}");
}

#[tokio::test]
async fn each_call_of_each_run_and_fork_has_its_own_idempotency_key_on_the_dev_host() {
    let tool = pay_server().await;
    let (_model, llm) = common::mock_openai::start(PAY).await;
    let dir = tempfile::tempdir().unwrap();
    let h = common::start(dir.path(), llm, pay_agents(&tool)).await;
    keys_flow(&Api::new(h.server.url()), &tool).await;
    h.server.shutdown().await;
}

#[tokio::test]
async fn each_call_of_each_run_and_fork_has_its_own_idempotency_key_on_the_aws_host() {
    let tool = pay_server().await;
    let (_model, llm) = common::mock_openai::start(PAY).await;
    let aws = common::aws::Emulator::start().await;
    let server = aws.dev_host("keys", llm, pay_agents(&tool)).await;
    keys_flow(&Api::new(server.url()), &tool).await;
    server.shutdown().await;
}

/// The orchestrator's first reply echoes (an approval gates it, so the run waits there);
/// each reply after it answers a turn.
fn gated_echo() -> (String, Arc<baton_core::agent::Catalog>) {
    let mut replies = vec![json!({"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]})];
    replies.extend((1..=12).map(|i| json!({"text": format!("reply {i}")})));
    let script = json!({ "orchestrator": replies }).to_string();
    let catalog = common::tools_catalog(json!({
        "agents": {"orchestrator": {"system": "agent:orchestrator", "tools": ["echo"],
            "approval": {"echo": "always"}}}
    }));
    (script, catalog)
}

/// A run parked on its echo's approval: its id and the question.
async fn parked(api: &Api) -> (String, Value) {
    let (code, v) = api.post("/runs", json!({"prompt": "go"})).await;
    assert_eq!(code, 202, "{v}");
    let run_id = v["runId"].as_str().unwrap().to_owned();
    let cta = question_of(api, &run_id).await;
    (run_id, cta)
}

/// 100 follow-ups posted at once to a waiting run: ten are admitted, the rest are 409
/// `queue_full`, and the ten wait as `queued` entries. An eleventh is still refused while
/// they wait; a cancel drops them, and then every follow-up is 409 `run_ended`.
async fn cap_flow(api: &Api) {
    let (run_id, _) = parked(api).await;
    let path = format!("/runs/{run_id}/messages");
    let mut posts = tokio::task::JoinSet::new();
    for i in 0..100 {
        let (api, path) = (Api::new(api.base.clone()), path.clone());
        posts.spawn(async move { api.post(&path, json!({"text": format!("more {i}")})).await });
    }
    let answers = posts.join_all().await;
    let admitted = answers.iter().filter(|(c, _)| *c == 202).count();
    let full = answers
        .iter()
        .filter(|(c, v)| *c == 409 && v["error"]["code"] == "queue_full")
        .count();
    assert_eq!((admitted, full), (10, 90), "{answers:?}");
    let run = api
        .wait("ten waiting follow-ups", async |api: &Api| {
            let (_, run) = api.get(&format!("/runs/{run_id}")).await;
            (run["queued"].as_array().map(Vec::len) == Some(10)).then_some(run)
        })
        .await;
    assert_eq!(run["status"], "waiting");
    let (code, v) = api.post(&path, json!({"text": "one more"})).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("queue_full"))
    );

    let (code, v) = api.post(&format!("/runs/{run_id}/cancel"), json!({})).await;
    assert_eq!(code, 202, "{v}");
    let run = api.status(&run_id, "cancelled").await;
    assert!(
        run["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["code"] == "queued_dropped"),
        "{run}"
    );
    for body in [
        json!({"text": "again"}),
        json!({"trigger": {"name": "nightly"}}),
    ] {
        let (code, v) = api.post(&path, body).await;
        assert_eq!(code, 409, "{v}");
        assert_eq!(v["error"]["code"], "run_ended", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("fork"),
            "{v}"
        );
    }
    let (code, v) = api.post(&format!("/runs/{run_id}/cancel"), json!({})).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("run_ended"))
    );
}

/// A follow-up posted while the run waits (a `queued` entry), then a fork at the reply
/// after it: the fork gives the follow-up its turn, as the original did.
async fn fork_keeps_queued_flow(api: &Api) {
    let (run_id, cta) = parked(api).await;
    let (code, v) = api
        .post(
            &format!("/runs/{run_id}/messages"),
            json!({"text": "and then?"}),
        )
        .await;
    assert_eq!((code, v["queued"].as_bool()), (202, Some(true)), "{v}");
    api.wait("the queued entry", async |api: &Api| {
        let (_, run) = api.get(&format!("/runs/{run_id}")).await;
        (run["queued"].as_array().map(Vec::len) == Some(1)).then_some(run)
    })
    .await;
    approve(api, &cta).await;
    let original = api
        .wait("both turns", async |api: &Api| {
            let (_, run) = api.get(&format!("/runs/{run_id}")).await;
            (run["status"] == "completed" && run["result"] == "reply 2").then_some(run)
        })
        .await;
    let timeline = original["timeline"].as_array().unwrap();
    let queued_at = timeline.iter().position(|e| e["type"] == "queued").unwrap();
    let at = timeline[queued_at..]
        .iter()
        .find(|e| e["type"] == "assistant")
        .and_then(|e| e["seq"].as_u64())
        .unwrap();
    let (code, v) = api
        .post(&format!("/runs/{run_id}/fork"), json!({"atSeq": at}))
        .await;
    assert_eq!(code, 202, "{v}");
    let fork_id = v["runId"].as_str().unwrap().to_owned();
    let fork = api
        .wait("the fork's follow-up turn", async |api: &Api| {
            let (_, run) = api.get(&format!("/runs/{fork_id}")).await;
            (run["status"] == "completed" && run["result"] == "reply 2").then_some(run)
        })
        .await;
    let users: Vec<_> = fork["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "user")
        .map(|e| e["text"].clone())
        .collect();
    assert_eq!(users, vec![json!("go"), json!("and then?")], "{fork}");
    assert_eq!(fork["queued"].as_array().map_or(0, Vec::len), 0, "{fork}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_are_capped_where_admitted_kept_by_forks_and_refused_once_ended_on_the_dev_host()
{
    let (script, catalog) = gated_echo();
    let (_model, llm) = common::mock_openai::start(&script).await;
    let dir = tempfile::tempdir().unwrap();
    let h = common::start(dir.path(), llm, catalog).await;
    let api = Api::new(h.server.url());
    cap_flow(&api).await;
    fork_keeps_queued_flow(&api).await;
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_are_capped_where_admitted_kept_by_forks_and_refused_once_ended_on_the_aws_host()
{
    let (script, catalog) = gated_echo();
    let (_model, llm) = common::mock_openai::start(&script).await;
    let aws = common::aws::Emulator::start().await;
    let server = aws.dev_host("cap", llm, catalog).await;
    let api = Api::new(server.url());
    cap_flow(&api).await;
    fork_keeps_queued_flow(&api).await;
    server.shutdown().await;
}

/// The documented contracts where they were loose: bodies are JSON objects, an
/// `Idempotency-Key` is visible ASCII and scoped to its route, and a one-time link's answer
/// under 20 concurrent posts is applied once: one post is a 202, the rest 409 `link_used`.
async fn contract_flow(api: &Api) {
    // Arrays are not objects, though serde reads a struct from one.
    let (_, before) = api.get("/runs").await;
    let (code, v) = api.post("/runs", json!(["go", "orchestrator"])).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
    let (_, after) = api.get("/runs").await;
    assert_eq!(before, after, "no run made");
    let (run_a, cta) = parked(api).await;
    let cta_id = cta["ctaId"].as_str().unwrap();
    let (code, v) = api
        .post(
            &format!("/ctas/{cta_id}/response"),
            json!(["approval", true]),
        )
        .await;
    assert_eq!(code, 400, "{v}");
    let (_, c) = api.get(&format!("/ctas/{cta_id}")).await;
    assert_eq!(c["status"], "pending");

    // Keys are visible ASCII.
    for bad in ["a b", "a\tb"] {
        let (code, v) = api.post_keyed("/runs", json!({"prompt": "go"}), bad).await;
        assert_eq!(code, 400, "{bad:?}: {v}");
    }
    // A key is scoped to its route: a run's, a fork's of run A, a fork's of run B.
    let key = format!("k-{}", uuid::Uuid::new_v4().simple());
    let (code, made) = api.post_keyed("/runs", json!({"prompt": "go"}), &key).await;
    assert_eq!(code, 202, "{made}");
    let fork_a = format!("/runs/{run_a}/fork");
    let (code, forked) = api.post_keyed(&fork_a, json!({"atSeq": 0}), &key).await;
    assert_eq!(code, 202, "{forked}");
    assert_ne!(forked["runId"], made["runId"], "a fork of its own");
    assert_eq!(forked["forkedFrom"]["runId"], run_a.as_str());
    let (_, again) = api.post_keyed("/runs", json!({"prompt": "go"}), &key).await;
    assert_eq!(again["runId"], made["runId"], "the same run");
    let (_, again) = api.post_keyed(&fork_a, json!({"atSeq": 0}), &key).await;
    assert_eq!(again["runId"], forked["runId"], "the same fork");
    let run_b = made["runId"].as_str().unwrap();
    let (code, fork_b) = api
        .post_keyed(&format!("/runs/{run_b}/fork"), json!({"atSeq": 0}), &key)
        .await;
    assert_eq!(code, 202, "{fork_b}");
    assert_eq!(fork_b["forkedFrom"]["runId"], run_b, "{fork_b}");

    // One link, 20 answers at once, half of them different: one answer is applied.
    let (code, link) = api.post(&format!("/ctas/{cta_id}/link"), json!({})).await;
    assert_eq!(code, 200, "{link}");
    let token = link["url"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let mut posts = tokio::task::JoinSet::new();
    for i in 0..20 {
        let url = format!("{}/links/{token}/response", api.base);
        posts.spawn(async move {
            let approved = i % 2 == 0;
            let r = reqwest::Client::new()
                .post(url)
                .json(&json!({"kind": "approval", "approved": approved}))
                .send()
                .await
                .unwrap();
            let code = r.status().as_u16();
            (
                approved,
                code,
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        });
    }
    let answers = posts.join_all().await;
    let (_, c) = api.get(&format!("/ctas/{cta_id}")).await;
    assert_eq!(
        (c["status"].as_str(), c["responder"].as_str()),
        (Some("answered"), Some("local"))
    );
    let won = c["response"]["approved"].as_bool().unwrap();
    let accepted: Vec<_> = answers.iter().filter(|(_, code, _)| *code == 202).collect();
    assert_eq!(accepted.len(), 1, "202 once: {answers:?}");
    assert_eq!(accepted[0].0, won, "the accepted answer is the one applied");
    for (_, code, v) in answers.iter().filter(|(_, code, _)| *code != 202) {
        assert_eq!(
            (*code, v["error"]["code"].as_str()),
            (409, Some("link_used")),
            "{v}"
        );
    }
    let run = api
        .wait("the answer taken", async |api: &Api| {
            let (_, run) = api.get(&format!("/runs/{run_a}")).await;
            (run["status"] == "completed").then_some(run)
        })
        .await;
    let echoes = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool" && e["name"] == "echo")
        .count();
    assert_eq!(echoes, 1, "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_keys_and_link_answers_keep_their_documented_contracts_on_the_dev_host() {
    let (script, catalog) = gated_echo();
    let (_model, llm) = common::mock_openai::start(&script).await;
    let dir = tempfile::tempdir().unwrap();
    let h = common::start(dir.path(), llm, catalog).await;
    contract_flow(&Api::new(h.server.url())).await;
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_keys_and_link_answers_keep_their_documented_contracts_on_the_aws_host() {
    let (script, catalog) = gated_echo();
    let (_model, llm) = common::mock_openai::start(&script).await;
    let aws = common::aws::Emulator::start().await;
    let server = aws.dev_host("contract", llm, catalog).await;
    contract_flow(&Api::new(server.url())).await;
    server.shutdown().await;
}

/// Asks for a link to `cta_id` on `port` from before the server is there until it answers:
/// the first answer the port gives.
async fn first_link_answer(port: u16, cta_id: String) -> (u16, Value) {
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/ctas/{cta_id}/link");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        match http
            .post(&url)
            .bearer_auth(common::TOKEN)
            .json(&json!({}))
            .send()
            .await
        {
            Ok(r) => {
                let code = r.status().as_u16();
                return (code, r.json().await.unwrap_or(Value::Null));
            }
            Err(_) => {
                assert!(std::time::Instant::now() < deadline, "never served");
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    }
}

/// Ready before serving: a request at the first instant the port opens finds links (and
/// everything else) set up, across 20 restarts of the dev host and 5 of the AWS host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_host_serves_its_first_request_with_everything_set_up() {
    let (script, catalog) = gated_echo();
    let (_model, llm) = common::mock_openai::start(&script).await;
    let dir = tempfile::tempdir().unwrap();
    let h = common::start(dir.path(), llm.clone(), catalog.clone()).await;
    let (_, cta) = parked(&Api::new(h.server.url())).await;
    let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
    h.server.shutdown().await;
    for restart in 0..20 {
        let port = common::python::free_port();
        let asking = tokio::spawn(first_link_answer(port, cta_id.clone()));
        let server = baton_dev::LocalServer::start(baton_dev::LocalOptions {
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            token: Some(common::TOKEN.into()),
            worker: Default::default(),
            ..baton_dev::LocalOptions::new(dir.path(), llm.clone(), catalog.clone())
        })
        .await
        .unwrap();
        let (code, v) = asking.await.unwrap();
        assert_eq!(code, 200, "restart {restart}: {v}");
        server.shutdown().await;
    }

    let aws = common::aws::Emulator::start().await;
    let names = aws.names("ready");
    let server = aws
        .dev_host_named(names.clone(), llm.clone(), catalog.clone())
        .await;
    let (_, cta) = parked(&Api::new(server.url())).await;
    let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
    server.shutdown().await;
    for restart in 0..5 {
        let port = common::python::free_port();
        let asking = tokio::spawn(first_link_answer(port, cta_id.clone()));
        let server = aws
            .dev_host_at(names.clone(), llm.clone(), catalog.clone(), port)
            .await;
        let (code, v) = asking.await.unwrap();
        assert_eq!(code, 200, "AWS restart {restart}: {v}");
        server.shutdown().await;
    }
}

/// Two agents whose first replies call an approved `echo` and, deferred behind it, an HTTP
/// tool: `orchestrator` pays, `ops` ships.
const WAITERS: &str = r#"{
  "orchestrator": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}, {"name": "pay", "arguments": {"cents": 5}}]},
    {"text": "done"}],
  "ops": [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}, {"name": "ship", "arguments": {"to": "x"}}]},
    {"text": "ops done"}]}"#;

/// The agents file before (`changed: false`) and after a change made while runs waited:
/// `pay` now needs an approval too; `ops` loses its tools, and `ship` is gone.
fn waiters_agents(tool: &MockServer, changed: bool) -> Arc<baton_core::agent::Catalog> {
    let http = |route: &str| {
        json!({"url": format!("{}/{route}", tool.uri()), "description": route,
               "schema": {"type": "object"}})
    };
    let file = if changed {
        json!({"tools": {"pay": http("pay")},
            "agents": {
                "orchestrator": {"system": "agent:orchestrator", "tools": ["echo", "pay"],
                    "approval": {"echo": "always", "pay": "always"}},
                "ops": {"system": "agent:ops", "tools": []}}})
    } else {
        json!({"tools": {"pay": http("pay"), "ship": http("ship")},
            "agents": {
                "orchestrator": {"system": "agent:orchestrator", "tools": ["echo", "pay"],
                    "approval": {"echo": "always"}},
                "ops": {"system": "agent:ops", "tools": ["echo", "ship"],
                    "approval": {"echo": "always"}}}})
    };
    let file = serde_json::from_value(file).unwrap();
    let catalog = baton_tools::catalog(
        Some(file),
        baton_tools::Host::Dev,
        &|_| None,
        &Default::default(),
    );
    Arc::new(catalog.unwrap())
}

async fn waiters_server() -> MockServer {
    let tool = MockServer::start().await;
    for route in ["/pay", "/ship"] {
        Mock::given(matchers::method("POST"))
            .and(matchers::path(route))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true})))
            .mount(&tool)
            .await;
    }
    tool
}

/// Before the change: a run of each agent, parked on its `echo` approval.
async fn park_waiters(api: &Api) -> [(String, Value); 2] {
    let mut out = Vec::new();
    for agent in ["orchestrator", "ops"] {
        let (code, v) = api
            .post("/runs", json!({"prompt": "go", "agent": agent}))
            .await;
        assert_eq!(code, 202, "{v}");
        let run_id = v["runId"].as_str().unwrap().to_owned();
        let cta = question_of(api, &run_id).await;
        out.push((run_id, cta));
    }
    out.try_into().unwrap()
}

fn tool_entry<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool" && e["name"] == name)
        .unwrap_or_else(|| panic!("no `{name}` call: {run}"))
}

/// After the change: the deferred `pay` is asked about before it runs (and a fork at the
/// earlier question asks too); `ops`'s approved `echo` and deferred `ship` are error
/// results naming why, and nothing is sent to `ship`.
async fn after_change(api: &Api, tool: &MockServer, waiters: [(String, Value); 2]) {
    let [(pays, echo_q), (ships, ops_q)] = waiters;
    approve(api, &echo_q).await;
    let pay_q = api
        .wait("the question `pay` now needs", async |api: &Api| {
            let (_, v) = api
                .get(&format!("/ctas?status=pending&rootRunId={pays}"))
                .await;
            v["ctas"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["gated"]["tool"] == "pay").cloned())
        })
        .await;
    assert_eq!(paid(tool).await, 0, "not paid before it was approved");
    approve(api, &pay_q).await;
    let run = api.status(&pays, "completed").await;
    assert_eq!(
        tool_entry(&run, "pay")["result"]["status"],
        "success",
        "{run}"
    );
    assert_eq!(paid(tool).await, 1);

    // A fork at the echo question, answered again: its `pay` runs again, so it asks.
    let at = tool_entry(&run, "echo")["seq"].as_u64().unwrap();
    let (code, v) = api
        .post(
            &format!("/runs/{pays}/fork"),
            json!({"atSeq": at, "replacement": {"response": {"kind": "approval", "approved": true}}}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    let fork = v["runId"].as_str().unwrap().to_owned();
    let asked = question_of(api, &fork).await;
    assert_eq!(asked["gated"]["tool"], "pay", "{asked}");
    assert_eq!(paid(tool).await, 1, "the fork did not pay unasked");

    approve(api, &ops_q).await;
    let run = api.status(&ships, "completed").await;
    let echo = &tool_entry(&run, "echo")["result"];
    assert_eq!(echo["status"], "error", "{run}");
    assert!(
        echo["error"]
            .as_str()
            .unwrap()
            .contains("no longer granted to agent `ops`"),
        "{echo}"
    );
    let ship = &tool_entry(&run, "ship")["result"];
    assert_eq!(ship["status"], "error", "{run}");
    assert!(
        ship["error"]
            .as_str()
            .unwrap()
            .contains("`ship` is no longer a tool in the agents file"),
        "{ship}"
    );
    let shipped = tool.received_requests().await.unwrap_or_default();
    assert!(!shipped.iter().any(|r| r.url.path() == "/ship"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_waited_follows_the_agents_file_as_it_is_when_a_call_runs_on_the_dev_host() {
    let tool = waiters_server().await;
    let (_model, llm) = common::mock_openai::start(WAITERS).await;
    let dir = tempfile::tempdir().unwrap();
    let before = waiters_agents(&tool, false);
    let h = common::start(dir.path(), llm.clone(), before).await;
    let waiters = park_waiters(&Api::new(h.server.url())).await;
    h.server.shutdown().await;
    // Restarted with the changed file.
    let after = waiters_agents(&tool, true);
    let h = common::start(dir.path(), llm, after).await;
    after_change(&Api::new(h.server.url()), &tool, waiters).await;
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_waited_follows_the_agents_file_as_it_is_when_a_call_runs_on_the_aws_host() {
    let tool = waiters_server().await;
    let (_model, llm) = common::mock_openai::start(WAITERS).await;
    let aws = common::aws::Emulator::start().await;
    let names = aws.names("redeploy");
    let before = waiters_agents(&tool, false);
    let server = aws.dev_host_named(names.clone(), llm.clone(), before).await;
    let waiters = park_waiters(&Api::new(server.url())).await;
    server.shutdown().await;
    // Redeployed: the functions start again with the changed file.
    let after = waiters_agents(&tool, true);
    let server = aws.dev_host_named(names, llm, after).await;
    after_change(&Api::new(server.url()), &tool, waiters).await;
    server.shutdown().await;
}

/// How many times `pay` was called.
async fn paid(tool: &MockServer) -> usize {
    let r = tool.received_requests().await.unwrap_or_default();
    r.iter().filter(|r| r.url.path() == "/pay").count()
}
