//! Configured tools, deadlines and cost through `baton dev`'s server: an HTTP tool gets
//! its input with the call's idempotency key, a tool that hangs past its timeout is
//! an error result and the run goes on, a run past `maxWallSeconds` ends failed with an
//! entry naming the limit, and what the model calls cost is on the run.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::agent::AgentsFile;
use common::{Harness, of_type, scripted};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

async fn start(dir: &std::path::Path, file: Value, script: Value) -> Harness {
    common::start(
        dir,
        scripted(&script.to_string()),
        common::tools_catalog(file),
    )
    .await
}

async fn tool_server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/lookup"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "shipped"})))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/hang"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/slow"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"ok": true}))
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(&server)
        .await;
    server
}

fn http_tool(server: &MockServer, route: &str, timeout: u64) -> Value {
    json!({"url": format!("{}{route}", server.uri()), "description": route,
           "schema": {"type": "object"}, "timeoutSeconds": timeout})
}

fn usage(input: u64, output: u64) -> Value {
    json!({"inputTokens": input, "outputTokens": output, "totalTokens": input + output})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tools_are_posted_once_per_call_a_hung_one_times_out_and_calls_are_priced() {
    let server = tool_server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = json!({
        "tools": {"lookup": http_tool(&server, "/lookup", 5), "hang": http_tool(&server, "/hang", 1)},
        "agents": {"ops": {"model": "openai:gpt-4o-mini", "tools": ["lookup", "hang"]}}
    });
    let script = json!({"ops": [
        {"tool_calls": [{"name": "lookup", "arguments": {"order": 42}},
                        {"name": "hang", "arguments": {}}],
         "usage": usage(1_000_000, 0)},
        {"text": "shipped; the other one hung", "usage": usage(0, 1_000_000)}
    ]});
    let h = start(dir.path(), file, script).await;
    let started = Instant::now();
    let run_id = h
        .create_run(json!({"prompt": "where is order 42?", "agent": "ops"}))
        .await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the hung tool was cut at 1 s"
    );

    let tools = of_type(&run, "tool");
    assert_eq!(tools[0]["result"]["output"], json!({"status": "shipped"}));
    let hung = &tools[1]["result"];
    assert_eq!(hung["status"], "error");
    assert!(
        hung["error"]
            .as_str()
            .unwrap_or("")
            .contains("did not finish within its 1 s timeout"),
        "{hung}"
    );
    // The receiver saw the input, with the call's idempotency key (the run's and the call's).
    let lookups: Vec<_> = server
        .received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.url.path() == "/lookup")
        .collect();
    assert_eq!(lookups.len(), 1);
    assert_eq!(
        lookups[0]
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok()),
        Some(
            baton_core::tools::idempotency_key(
                &run_id,
                tools[0]["seq"].as_u64().unwrap(),
                tools[0]["id"].as_str().unwrap(),
                &tools[0]["input"]
            )
            .as_str()
        )
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&lookups[0].body).ok(),
        Some(json!({"order": 42}))
    );

    // A million tokens in at $0.15, a million out at $0.60.
    let cost = run["costUsd"].as_f64().expect("costUsd");
    assert!((cost - 0.75).abs() < 1e-9, "{run:#}");
    assert!((run["total"]["costUsd"].as_f64().unwrap_or(0.0) - 0.75).abs() < 1e-9);
    let replies = of_type(&run, "assistant");
    assert_eq!(replies[0]["model"], "openai:gpt-4o-mini");
    assert_eq!(replies[0]["operation"], "think");
    assert!((replies[1]["costUsd"].as_f64().unwrap_or(0.0) - 0.60).abs() < 1e-9);
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_tool_reaches_the_calling_runs_sandbox_and_one_without_gets_an_error_naming_it() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/sandboxes/sb-9/exec"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"exit": 0})))
        .mount(&server)
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let exec = json!({"url": format!("{}/sandboxes/${{run.sandboxId}}/exec", server.uri()),
                      "description": "Runs a command in the run's sandbox.",
                      "schema": {"type": "object"}});
    let file = json!({"tools": {"exec": exec}, "agents": {"ops": {"tools": ["exec"]}}});
    let script = json!({"ops": [
        {"tool_calls": [{"name": "exec", "arguments": {"cmd": "ls"}}]},
        {"text": "done"},
        {"tool_calls": [{"name": "exec", "arguments": {"cmd": "ls"}}]},
        {"text": "done"}
    ]});
    let h = start(dir.path(), file, script).await;
    let with = h
        .create_run(json!({"prompt": "list", "agent": "ops", "sandboxId": "sb-9"}))
        .await;
    let run = h.wait_status(&with, &["completed"]).await;
    assert_eq!(
        of_type(&run, "tool")[0]["result"]["output"],
        json!({"exit": 0})
    );
    let without = h
        .create_run(json!({"prompt": "list", "agent": "ops"}))
        .await;
    let run = h.wait_status(&without, &["completed"]).await;
    let result = &of_type(&run, "tool")[0]["result"];
    assert_eq!(result["status"], "error", "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("${run.sandboxId}"), "{error}");
    // Only the run with a sandbox reached the receiver.
    let received = server.received_requests().await.unwrap_or_default();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].url.path(), "/sandboxes/sb-9/exec");
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_deadline_ends_failed_with_an_entry_naming_the_limit() {
    let server = tool_server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = json!({
        "tools": {"slow": http_tool(&server, "/slow", 5)},
        "agents": {"brief": {"tools": ["slow"], "maxWallSeconds": 1}}
    });
    let script = json!({"brief": [
        {"tool_calls": [{"name": "slow", "arguments": {}}]},
        {"tool_calls": [{"name": "slow", "arguments": {}}]},
        {"text": "never reached"}
    ]});
    let h = start(dir.path(), file, script).await;
    let run_id = h
        .create_run(json!({"prompt": "take your time", "agent": "brief"}))
        .await;
    let run = h.wait_status(&run_id, &["failed"]).await;
    assert_eq!(run["error"]["code"], "deadline_exceeded", "{run:#}");
    // The error, then what the failed turn spent.
    let types: Vec<&str> = run["timeline"]
        .as_array()
        .map(|t| t.iter().filter_map(|e| e["type"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(types[types.len().saturating_sub(2)..], ["error", "usage"]);
    let last = run["timeline"]
        .as_array()
        .and_then(|t| t.iter().rfind(|e| e["type"] == "error"))
        .cloned()
        .unwrap_or_default();
    assert!(
        last["message"]
            .as_str()
            .unwrap_or("")
            .contains("maxWallSeconds = 1"),
        "{last}"
    );
    assert_eq!(
        of_type(&run, "tool").len(),
        1,
        "no iteration after the deadline"
    );
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_context_reaches_the_agent_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = start(
        dir.path(),
        json!({"agents": {"reader": {"tools": [], "contextGuidance": {"document": "Cite it."}}}}),
        json!({"reader": [{"text": "read"}]}),
    )
    .await;
    let run_id = h
        .create_run(json!({"prompt": "summarise", "agent": "reader",
                           "context": {"type": "document", "id": "doc-7"}}))
        .await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(run["context"]["id"], "doc-7");
    for bad in [json!({"id": "x"}), json!("document"), json!({"type": ""})] {
        let (code, v) = h
            .post(
                "/runs",
                json!({"prompt": "p", "agent": "reader", "context": bad}),
            )
            .await;
        assert_eq!(code, 400, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("`context`"),
            "{v}"
        );
    }
    h.server.shutdown().await;
}

#[test]
fn the_readmes_example_agents_file_builds_and_lambda_refuses_its_stdio_server() {
    let text = common::examples("agents.json");
    let file = || AgentsFile::parse(&text, "examples/agents.json").expect("parses");
    let vars = |k: &str| matches!(k, "CALC_TOKEN" | "ORDERS_KEY").then(|| "x".to_owned());
    let catalog = baton_tools::catalog(
        Some(file()),
        baton_tools::Host::Dev,
        &vars,
        &Default::default(),
    )
    .expect("builds under baton dev");
    let explore = catalog.agent("explore").expect("explore");
    assert!(
        explore.tools.iter().any(|t| t == "http_fetch"),
        "{:?}",
        explore.tools
    );
    assert!(explore.tools.iter().any(|t| t == "mcp:clock"));
    assert_eq!(
        catalog.agent("ops").expect("ops").max_wall,
        Some(Duration::from_secs(600))
    );
    assert_eq!(catalog.limits.plan.max_steps, 8);
    assert_eq!(
        catalog.limits.plan.step_timeout,
        Some(Duration::from_secs(900))
    );
    let planner = catalog.agent("planner").expect("the planner");
    assert!(
        planner
            .system
            .contains("- ops: answers questions about orders"),
        "{}",
        planner.system
    );
    let err = baton_tools::catalog(
        Some(file()),
        baton_tools::Host::Lambda,
        &vars,
        &Default::default(),
    )
    .expect_err("stdio on Lambda");
    assert!(
        err.to_string().contains("mcpServers.clock")
            && err.to_string().contains("only `baton dev`"),
        "{err}"
    );
    let err = baton_tools::catalog(
        Some(file()),
        baton_tools::Host::Dev,
        &|_| None,
        &Default::default(),
    )
    .expect_err("unset variable");
    assert!(err.to_string().contains("is not set"), "{err}");
}

/// Polls the run until it is completed with `n` assistant replies (a follow-up's turn done).
async fn wait_replies(h: &Harness, run_id: &str, n: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, run) = h.get(&format!("/runs/{run_id}")).await;
        if run["status"] == "completed" && of_type(&run, "assistant").len() >= n {
            return run;
        }
        assert!(Instant::now() < deadline, "{run:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn models(run: &Value) -> Vec<String> {
    of_type(run, "assistant")
        .iter()
        .map(|e| e["model"].as_str().unwrap_or("-").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_picks_the_model_reaches_plans_and_subagents_and_costs_break_down_by_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = json!({
        "agents": {
            "ops": {"model": "openai:gpt-4o-mini",
                    "modelByContext": {"ticket": "openai:gpt-4.1-mini"},
                    "modelByTier": {"high": "openai:gpt-4o"},
                    "contextGuidance": {"ticket": "Close the ticket."},
                    "tools": ["spawn_subagent", "agent_orchestrate"]},
            "helper": {"description": "helps", "tools": [],
                       "modelByContext": {"ticket": "openai:gpt-4.1-nano"}}
        },
        "plans": {"plannerModel": "openai:gpt-4.1"}
    });
    let plan = json!({"steps": [{"id": "a", "agent": "helper", "prompt": "step a"}]});
    let script = json!({
        "ops": [
            {"tool_calls": [
                {"name": "spawn_subagent", "arguments": {"agent": "helper", "prompt": "look"}},
                {"name": "spawn_subagent", "arguments": {"agent": "helper", "prompt": "other",
                                                         "context": {"type": "doc", "id": "d1"}}},
                {"name": "agent_orchestrate", "arguments": {"prompt": "fix it"}}],
             "usage": usage(1000, 100)},
            {"text": "closed", "usage": usage(2000, 100)},
            {"text": "thought hard", "usage": usage(3000, 100)}
        ],
        "helper": [{"text": "found", "usage": usage(500, 50)}],
        "planner": [{"text": plan.to_string(), "usage": usage(700, 70)}]
    });
    let h = start(dir.path(), file, script).await;
    let run_id = h
        .create_run(json!({"prompt": "handle T-9", "agent": "ops",
                           "context": {"type": "ticket", "id": "T-9"}}))
        .await;
    let run = wait_replies(&h, &run_id, 2).await;
    assert_eq!(
        models(&run),
        ["openai:gpt-4.1-mini"; 2],
        "the ticket's model"
    );
    // A follow-up that asks for the high tier thinks with that tier's model.
    let (code, v) = h
        .post(
            &format!("/runs/{run_id}/messages"),
            json!({"text": "think harder", "tier": "high"}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    let run = wait_replies(&h, &run_id, 3).await;
    assert_eq!(models(&run)[2], "openai:gpt-4o");
    assert_eq!(of_type(&run, "user")[1]["tier"], "high");

    // The children: what they worked on, which model they used, under which plan mode.
    let tools = of_type(&run, "tool");
    let child = |i: usize| tools[i]["childRunId"].as_str().expect("child").to_owned();
    let (_, spawned) = h.get(&format!("/runs/{}", child(0))).await;
    assert_eq!(spawned["context"], json!({"type": "ticket", "id": "T-9"}));
    assert_eq!(models(&spawned), ["openai:gpt-4.1-nano"]);
    assert!(spawned.get("executionMode").is_none(), "{spawned}");
    let (_, other) = h.get(&format!("/runs/{}", child(1))).await;
    assert_eq!(
        other["context"],
        json!({"type": "doc", "id": "d1"}),
        "the call's own"
    );
    let plan_state = &tools[2]["plan"];
    let (_, planner) = h
        .get(&format!(
            "/runs/{}",
            plan_state["plannerRunId"].as_str().unwrap_or("")
        ))
        .await;
    let step = plan_state["steps"]["a"]["childRunId"]
        .as_str()
        .expect("step");
    let (_, step) = h.get(&format!("/runs/{step}")).await;
    for r in [&planner, &step] {
        assert_eq!(r["context"]["type"], "ticket", "{r}");
        assert_eq!(r["executionMode"], "auto_execute", "{r}");
    }
    assert_eq!(models(&planner), ["openai:gpt-4.1"]);
    let asked = of_type(&planner, "user")[0]["text"].as_str().unwrap_or("");
    assert!(
        asked.contains("Guidance for this context (ticket): Close the ticket."),
        "{asked}"
    );

    // The run's cost, by operation, model, context type and execution mode, sums to its total.
    let mut lines: Vec<String> = run["costBreakdown"]
        .as_array()
        .expect("costBreakdown")
        .iter()
        .map(|l| {
            format!(
                "{} {} {} {} x{}",
                l["operation"].as_str().unwrap_or("-"),
                l["model"].as_str().unwrap_or("-"),
                l["contextType"].as_str().unwrap_or("-"),
                l["executionMode"].as_str().unwrap_or("-"),
                l["calls"]
            )
        })
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "plan openai:gpt-4.1 ticket auto_execute x1",
            "think - doc - x1",
            "think openai:gpt-4.1-mini ticket - x2",
            "think openai:gpt-4.1-nano ticket - x1",
            "think openai:gpt-4.1-nano ticket auto_execute x1",
            "think openai:gpt-4o ticket - x1",
        ]
    );
    let sum: f64 = run["costBreakdown"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| l["costUsd"].as_f64().unwrap_or(0.0))
        .sum();
    let total = run["total"]["costUsd"].as_f64().expect("total");
    assert!(
        total > 0.0 && (sum - total).abs() < 1e-12,
        "{sum} vs {total}"
    );
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_starts_a_turn_no_one_wrote_and_a_hidden_one_is_kept_marked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = json!({"ops": [{"text": "one"}, {"text": "two"}, {"text": "three"}]});
    let h = start(
        dir.path(),
        json!({"agents": {"ops": {"tools": []}}}),
        script,
    )
    .await;
    let run_id = h
        .create_run(json!({"prompt": "start", "agent": "ops", "visible": false}))
        .await;
    wait_replies(&h, &run_id, 1).await;
    let messages = format!("/runs/{run_id}/messages");
    for (bad, says) in [
        (
            json!({"text": "x", "trigger": {"name": "nightly"}}),
            "exactly one",
        ),
        (json!({}), "exactly one"),
        (json!({"trigger": {"name": "no spaces"}}), "trigger.name"),
        (
            json!({"trigger": {"name": "n", "data": "x".repeat(17_000)}}),
            "trigger.data",
        ),
        (json!({"text": "x", "tier": "max"}), "`normal` or `high`"),
    ] {
        let (code, v) = h.post(&messages, bad.clone()).await;
        assert_eq!(code, 400, "{bad}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{bad}: {v}");
    }
    let (code, v) = h
        .post(
            &messages,
            json!({"trigger": {"name": "nightly-report", "data": {"day": "2026-11-26"}}}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    wait_replies(&h, &run_id, 2).await;
    let (code, v) = h
        .post(&messages, json!({"text": "quietly", "visible": false}))
        .await;
    assert_eq!(code, 202, "{v}");
    let run = wait_replies(&h, &run_id, 3).await;
    let users = of_type(&run, "user");
    assert_eq!(
        users.len(),
        3,
        "the refused messages changed nothing: {run:#}"
    );
    assert_eq!(users[0]["visible"], false, "the prompt, hidden");
    assert_eq!(users[1]["trigger"], "nightly-report");
    assert!(users[1].get("visible").is_none(), "shown by default");
    let said = users[1]["text"].as_str().unwrap_or("");
    assert!(
        said.contains("trigger `nightly-report`") && said.contains("2026-11-26"),
        "the model is told what started the turn: {said}"
    );
    assert_eq!(users[2]["visible"], false);
    assert_eq!(run["result"], "three");
    h.server.shutdown().await;
}

/// The scripted model's call of the starter's `github_read`, for the README.
fn read_readme() -> Value {
    json!({"tool_calls": [{"name": "github_read", "arguments": {"path": "README.md"}}]})
}

/// The scripted model's call turning the starter's `github` skill on.
fn activate_github() -> Value {
    json!({"tool_calls": [{"name": "activate_skill", "arguments": {"name": "github"}}]})
}

/// GitHub's contents API answering with acme/shop's README, `# Shop`.
fn readme_answer() -> ResponseTemplate {
    use base64::Engine;
    let readme = base64::engine::general_purpose::STANDARD.encode("# Shop\n");
    ResponseTemplate::new(200).set_body_json(json!({
        "type": "file", "encoding": "base64", "size": 7, "sha": "abc", "content": readme}))
}

/// A run of the starter's `repo_assistant` on acme/shop at main; its id.
async fn ask_about_the_readme(h: &Harness) -> String {
    h.create_run(
        json!({"prompt": "What is in the README?", "agent": "repo_assistant",
                        "github": {"repo": "acme/shop", "ref": "main"}}),
    )
    .await
}

/// A project's own extensions (the starter `baton new` writes, `baton-starter`) on `baton dev`, as every host builds
/// them: `repo_assistant` starts with `activate_skill` alone; `github_read` is refused until
/// it turns the `github` skill on; the tool then reads the skills plugin's state (a second
/// activation says so); the plugin's state is the run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_turned_on_by_a_tool_adds_its_tools_and_the_tool_reads_the_plugins_state() {
    let github = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/repos/acme/shop/contents/README.md"))
        .respond_with(readme_answer())
        .mount(&github)
        .await;
    let repo = baton_starter::github::RepoFiles::new(&github.uri(), None);
    let ext = baton_starter::extensions_with(repo);
    let catalog =
        baton_tools::catalog(None, baton_tools::Host::Dev, &|_| None, &ext).expect("catalog");
    let (read, activate) = (read_readme(), activate_github());
    let script = json!({"repo_assistant": [read, activate, activate, read, {"text": "done"}]});
    let dir = tempfile::tempdir().expect("tempdir");
    let h = common::start(dir.path(), scripted(&script.to_string()), Arc::new(catalog)).await;
    let run_id = ask_about_the_readme(&h).await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    let tools = of_type(&run, "tool");
    assert_eq!(tools.len(), 4, "{run:#}");
    // Before the skill: not offered, so refused.
    assert_eq!(tools[0]["result"]["status"], "error", "{run:#}");
    assert_eq!(
        tools[1]["result"]["output"]["activated"], "github",
        "{run:#}"
    );
    // The tool read the plugin's state: the skill was already on.
    assert_eq!(tools[2]["result"]["output"]["already"], "github", "{run:#}");
    assert_eq!(tools[3]["result"]["status"], "success", "{run:#}");
    assert_eq!(tools[3]["result"]["output"]["text"], "# Shop\n");
    assert_eq!(run["pluginState"]["skills"]["active"], json!(["github"]));
    h.server.shutdown().await;
}

/// A tool's error says who deals with it (`ToolError`): GitHub's 503 is `Retry` from
/// `github_read` (a read: safe to run again), so the step is tried again — the model's reply
/// kept, not paid for twice — until GitHub answers; the model never sees the 503. A `once`
/// tool's `Retry` is not tried again: the model is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_error_tries_the_step_again_and_a_once_tools_is_told() {
    use baton_core::tools::{Effects, Tool, ToolContext, ToolError};

    struct Charge;
    #[async_trait::async_trait]
    impl Tool for Charge {
        fn name(&self) -> &str {
            "charge"
        }
        fn description(&self) -> &str {
            "Charges a card."
        }
        fn schema(&self) -> Value {
            json!({"type": "object"})
        }
        fn effects(&self) -> Effects {
            Effects::Once
        }
        async fn execute(&self, _: &ToolContext, _: Value) -> Result<Value, ToolError> {
            Err(ToolError::retry("the card network timed out"))
        }
    }

    let github = MockServer::start().await;
    let at = "/repos/acme/shop/contents/README.md";
    Mock::given(method("GET"))
        .and(path(at))
        .respond_with(ResponseTemplate::new(503).set_body_json(json!({"message": "busy"})))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&github)
        .await;
    Mock::given(method("GET"))
        .and(path(at))
        .respond_with(readme_answer())
        .mount(&github)
        .await;
    let repo = baton_starter::github::RepoFiles::new(&github.uri(), None);
    let cashier =
        serde_json::from_value(json!({"system": "s", "tools": ["charge"]})).expect("an agent");
    let ext = baton_starter::extensions_with(repo)
        .tool(Charge)
        .agent("cashier", cashier);
    let catalog =
        baton_tools::catalog(None, baton_tools::Host::Dev, &|_| None, &ext).expect("catalog");
    let (read, activate) = (read_readme(), activate_github());
    let charge = json!({"tool_calls": [{"name": "charge", "arguments": {}}]});
    let script = json!({"repo_assistant": [activate, read, {"text": "done"}],
                        "cashier": [charge, {"text": "told"}]});
    let dir = tempfile::tempdir().expect("tempdir");
    let h = common::start(dir.path(), scripted(&script.to_string()), Arc::new(catalog)).await;
    let run_id = ask_about_the_readme(&h).await;
    // The scripted model answers each reply once: had a retried step asked it again, the
    // script would have run out and the run failed.
    let run = h.wait_status(&run_id, &["completed"]).await;
    let tools = of_type(&run, "tool");
    assert_eq!(tools.len(), 2, "{run:#}");
    assert_eq!(tools[1]["result"]["status"], "success", "{run:#}");
    assert_eq!(tools[1]["result"]["output"]["text"], "# Shop\n");
    assert!(
        !run.to_string().contains("busy"),
        "the model never saw the 503: {run:#}"
    );
    let asked = github.received_requests().await.unwrap_or_default();
    assert_eq!(asked.iter().filter(|r| r.url.path() == at).count(), 3);

    let run_id = h
        .create_run(json!({"prompt": "Charge it", "agent": "cashier"}))
        .await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    let tools = of_type(&run, "tool");
    assert_eq!(tools.len(), 1, "{run:#}");
    assert_eq!(tools[0]["result"]["status"], "error", "{run:#}");
    let said = tools[0]["result"]["error"].to_string();
    assert!(
        said.contains("the card network timed out") && said.contains("not tried again"),
        "{run:#}"
    );
    h.server.shutdown().await;
}
