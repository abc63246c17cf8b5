//! MCP tools end to end, against MCP servers no one here wrote: the MCP Python SDK's own
//! FastMCP server over streamable HTTP (`tests/mcp/calc_server.py`: a few tools on the
//! SDK), and `mcp-server-time` from PyPI over stdio. A scripted model calls their tools
//! through `baton dev`'s server; the results are in the timeline, approval gates an MCP
//! tool, and a server killed mid-run gives an error result while the run goes on.

use crate::common;

use std::sync::Arc;

use baton_core::agent::{AgentsFile, Prepared};
use common::python::{McpHttpServer, free_port, venv_bin};
use common::{Harness, of_type, scripted};
use serde_json::{Value, json};

fn catalog(
    file: Value,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Arc<baton_core::agent::Catalog> {
    let file: AgentsFile = serde_json::from_value(file).expect("agents file");
    Arc::new(
        baton_tools::catalog(
            Some(file),
            baton_tools::Host::Dev,
            lookup,
            &Default::default(),
        )
        .expect("catalog"),
    )
}

/// The tool entries of a run, by the tool's name, in order.
fn results<'a>(run: &'a Value, name: &str) -> Vec<&'a Value> {
    of_type(run, "tool")
        .into_iter()
        .filter(|e| e["name"] == name)
        .map(|e| &e["result"])
        .collect()
}

async fn answer(h: &Harness, cta: &Value, approved: bool) {
    let (code, v) = h
        .post(
            &format!("/ctas/{}/response", cta["ctaId"].as_str().expect("ctaId")),
            json!({"kind": "approval", "approved": approved}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_tools_run_are_gated_and_a_killed_server_is_an_error_result() {
    let mut server = McpHttpServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = json!({
        "mcpServers": {"calc": {"url": server.url, "headers": {"Authorization": "Bearer ${CALC_TOKEN}"}}},
        "agents": {"ops": {
            "tools": ["mcp:calc", "request_human_feedback"],
            "approval": {"calc__whoami": "always"}
        }}
    });
    let lookup = |k: &str| (k == "CALC_TOKEN").then(|| "s3cret".to_owned());
    let catalog = catalog(file, &lookup);
    let script = json!({"ops": [
        {"tool_calls": [
            {"name": "calc__add", "arguments": {"a": 2, "b": 3}},
            {"name": "calc__stats", "arguments": {"values": [1, 2, 3]}},
            {"name": "calc__divide", "arguments": {"a": 1, "b": 0}},
            {"name": "calc__whoami", "arguments": {}},
            {"name": "calc__charge", "arguments": {"cents": 5}},
            {"name": "calc__chart", "arguments": {}}
        ]},
        {"tool_calls": [{"name": "request_human_feedback",
                         "arguments": {"kind": "approval", "message": "Go on?"}}]},
        {"tool_calls": [{"name": "calc__add", "arguments": {"a": 1, "b": 1}}]},
        {"text": "done"}
    ]});
    let h = common::start(dir.path(), scripted(&script.to_string()), catalog.clone()).await;
    let run_id = h
        .create_run(json!({"prompt": "compute", "agent": "ops"}))
        .await;

    // The approval policy gates the MCP tool like any other.
    let gate = h.wait_pending(1).await;
    assert!(
        gate[0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("calc__whoami"),
        "{gate:?}"
    );
    answer(&h, &gate[0], true).await;

    // The run asks a human next: kill the server while it waits.
    let ask = loop {
        let pending = h.wait_pending(1).await;
        if pending[0]["message"] == "Go on?" {
            break pending;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    server.kill();
    answer(&h, &ask[0], true).await;

    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(run["result"], "done");
    let add = results(&run, "calc__add");
    assert_eq!(add[0]["status"], "success", "{run:#}");
    assert!(add[0]["output"].to_string().contains('5'), "{}", add[0]);
    let stats = results(&run, "calc__stats");
    assert_eq!(
        stats[0]["output"]["count"], 3,
        "structured content: {}",
        stats[0]
    );
    assert_eq!(stats[0]["output"]["mean"], 2.0);
    let divide = results(&run, "calc__divide");
    assert_eq!(divide[0]["status"], "error", "isError: {}", divide[0]);
    assert!(
        divide[0]["error"]
            .as_str()
            .unwrap_or("")
            .contains("division by zero")
    );
    let whoami = results(&run, "calc__whoami");
    assert_eq!(whoami[0]["status"], "success", "{}", whoami[0]);
    assert!(
        whoami[0]["output"].to_string().contains("Bearer s3cret"),
        "{}",
        whoami[0]
    );
    // The call's idempotency key reached the server in the request's `_meta`.
    let charge = of_type(&run, "tool")
        .into_iter()
        .find(|e| e["name"] == "calc__charge")
        .expect("the charge call");
    let key = baton_core::tools::idempotency_key(
        &run_id,
        charge["seq"].as_u64().unwrap(),
        charge["id"].as_str().unwrap(),
        &charge["input"],
    );
    assert_eq!(charge["result"]["output"]["result"], json!(key), "{charge}");
    // The image the tool returned is a file of the run; the model read its summary.
    let chart = &results(&run, "calc__chart")[0];
    assert!(
        chart["output"]
            .as_str()
            .unwrap_or("")
            .contains("kept as the file `chart-image-1.png`"),
        "{chart}"
    );
    let file = of_type(&run, "file")
        .into_iter()
        .find(|f| f["name"] == "chart-image-1.png")
        .expect("the image kept as a file");
    assert_eq!(file["mediaType"], "image/png");
    let (code, bytes) = h
        .get(&format!(
            "/runs/{run_id}/files/{}",
            file["fileId"].as_str().expect("fileId")
        ))
        .await;
    assert_eq!(code, 200);
    assert!(bytes.to_string().contains("baton-test-chart"), "{bytes}");
    // The server was killed: the call is an error result the model sees, and the run went on.
    assert_eq!(add[1]["status"], "error", "{}", add[1]);
    assert!(
        add[1]["error"]
            .as_str()
            .unwrap_or("")
            .contains("MCP server `calc`"),
        "{}",
        add[1]
    );
    h.server.shutdown().await;
}

/// A published server over stdio lists and answers; its tools' effects are as the agents
/// file declares them: `once` unless it says (so its call is marked started, in a commit of
/// its own, before it runs), the server's `effects` for all its tools, and `toolEffects`
/// over that for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_stdio_server_lists_and_answers() {
    let bin = venv_bin();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = json!({"command": bin.join("mcp-server-time"),
                        "args": ["--local-timezone", "UTC"]});
    let mut declared = server.clone();
    declared["effects"] = json!("idempotent");
    declared["toolEffects"] = json!({"convert_time": "none"});
    let file = json!({
        "mcpServers": {"clock": server, "declared": declared},
        "agents": {"timekeeper": {"tools": ["clock__get_current_time", "mcp:declared"]}}
    });
    let catalog = catalog(file, &|_| None);
    let convert = json!({"source_timezone": "UTC", "time": "12:00",
                         "target_timezone": "Europe/London"});
    let script = json!({"timekeeper": [
        {"tool_calls": [{"name": "clock__get_current_time", "arguments": {"timezone": "UTC"}},
                        {"name": "declared__get_current_time", "arguments": {"timezone": "UTC"}},
                        {"name": "declared__convert_time", "arguments": convert}]},
        {"text": "it is now"}
    ]});
    let h = common::start(dir.path(), scripted(&script.to_string()), catalog.clone()).await;
    let run_id = h
        .create_run(json!({"prompt": "what time is it?", "agent": "timekeeper"}))
        .await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    let now = results(&run, "clock__get_current_time");
    assert_eq!(now[0]["status"], "success", "{run:#}");
    let text = now[0]["output"].to_string();
    assert!(text.contains("UTC") && text.contains("datetime"), "{text}");
    let calls = of_type(&run, "tool");
    let declared: Vec<(&str, &Value, &Value)> = calls
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or(""),
                &e["effects"],
                &e["started"],
            )
        })
        .collect();
    assert_eq!(
        declared,
        [
            ("clock__get_current_time", &json!("once"), &json!(1)),
            (
                "declared__get_current_time",
                &json!("idempotent"),
                &Value::Null
            ),
            ("declared__convert_time", &json!("none"), &Value::Null),
        ],
        "{run:#}"
    );
    assert!(
        calls.iter().all(|e| e["result"]["status"] == "success"),
        "{run:#}"
    );

    // The model is told the tool by its server-qualified name, with the server's own
    // description and schema; `clock`'s other tool is not this agent's.
    let agent = catalog.agent("timekeeper").expect("agent");
    let specs = catalog.specs(&catalog.listed(), agent, &Prepared::default());
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "clock__get_current_time",
            "declared__convert_time",
            "declared__get_current_time"
        ]
    );
    assert!(!specs[0].description.is_empty());
    assert!(
        specs[0].parameters["properties"]["timezone"].is_object(),
        "{:?}",
        specs[0]
    );
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_leaves_its_tools_unavailable_not_the_run_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://127.0.0.1:{}/mcp", free_port());
    let file = json!({
        "mcpServers": {"gone": {"url": url}},
        "agents": {"ops": {"tools": ["mcp:gone", "echo"]}}
    });
    let script = json!({"ops": [
        {"tool_calls": [{"name": "gone__anything", "arguments": {}},
                        {"name": "echo", "arguments": {"text": "still here"}}]},
        {"text": "carried on"}
    ]});
    let h = common::start(
        dir.path(),
        scripted(&script.to_string()),
        catalog(file, &|_| None),
    )
    .await;
    let run_id = h.create_run(json!({"prompt": "try", "agent": "ops"})).await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(run["result"], "carried on");
    let gone = results(&run, "gone__anything");
    assert_eq!(gone[0]["status"], "error", "{run:#}");
    assert_eq!(results(&run, "echo")[0]["output"], "still here");
    h.server.shutdown().await;
}

/// `git` in `dir`, which must succeed; its stdout.
fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=Test", "-c", "user.email=test@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explore_reads_and_code_changes_a_repository_through_published_mcp_servers() {
    // `examples/repo-agents.json` as a user runs it, its servers from npm and PyPI: the
    // reference filesystem server and mcp-server-git, each started per sandbox.
    let node = common::browser::npm_ci(
        "mcp/node",
        "mcp-node",
        "@modelcontextprotocol/server-filesystem",
    );
    let bin = venv_bin();
    let sandboxes = tempfile::tempdir().expect("sandboxes");
    let repo = sandboxes.path().join("sb-1");
    std::fs::create_dir_all(&repo).expect("repo dir");
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README.md"), "hello\n").expect("readme");
    git(&repo, &["add", "README.md"]);
    git(&repo, &["commit", "-q", "-m", "First commit"]);
    std::fs::create_dir_all(sandboxes.path().join("sb-2")).expect("other");
    std::fs::write(sandboxes.path().join("sb-2/secret.txt"), "not yours").expect("secret");

    let mut file = AgentsFile::parse(
        &common::examples("repo-agents.json"),
        "examples/repo-agents.json",
    )
    .expect("parses");
    let fs = file.mcp_servers.get_mut("fs").expect("fs");
    fs.command = Some(
        node.join(".bin/mcp-server-filesystem")
            .display()
            .to_string(),
    );
    let git_server = file.mcp_servers.get_mut("git").expect("git");
    git_server.command = Some(bin.join("mcp-server-git").display().to_string());
    let root = sandboxes.path().display().to_string();
    let lookup = |k: &str| (k == "BATON_SANDBOXES").then(|| root.clone());
    let catalog = Arc::new(
        baton_tools::catalog(
            Some(file),
            baton_tools::Host::Dev,
            &lookup,
            &Default::default(),
        )
        .expect("catalog"),
    );
    let repo_path = repo.display().to_string();
    let readme = repo.join("README.md").display().to_string();
    let secret = sandboxes
        .path()
        .join("sb-2/secret.txt")
        .display()
        .to_string();
    let script = json!({
        "orchestrator": [
            {"tool_calls": [{"name": "spawn_subagent", "arguments":
                {"agent": "explore", "prompt": "What does the README say?", "sandboxId": "sb-1"}}]},
            {"tool_calls": [{"name": "spawn_subagent", "arguments":
                {"agent": "code", "prompt": "Change the README.", "sandboxId": "sb-1",
                 "github": {"repo": "acme/demo", "ref": "main"}}}]},
            {"text": "read and changed"}
        ],
        "explore": [
            {"tool_calls": [
                {"name": "fs__read_text_file", "arguments": {"path": readme}},
                {"name": "fs__read_text_file", "arguments": {"path": secret}},
                {"name": "git__git_log", "arguments": {"repo_path": repo_path}}]},
            {"text": "it says hello"}
        ],
        "code": [
            {"tool_calls": [{"name": "fs__write_file",
                             "arguments": {"path": readme, "content": "hello, changed\n"}}]},
            {"tool_calls": [{"name": "git__git_add",
                             "arguments": {"repo_path": repo_path, "files": ["README.md"]}}]},
            {"tool_calls": [{"name": "git__git_commit",
                             "arguments": {"repo_path": repo_path, "message": "Change the README"}}]},
            {"text": "committed"}
        ]
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let h = common::start(dir.path(), scripted(&script.to_string()), catalog).await;
    let run_id = h.create_run(json!({"prompt": "update the README"})).await;
    // The write waits for a human: nothing is written until they approve.
    let ctas = h.wait_pending(1).await;
    assert_eq!(ctas[0]["gated"]["tool"], "fs__write_file", "{:#}", ctas[0]);
    assert_eq!(
        ctas[0]["gated"]["reason"],
        "writes a file in the repository"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).expect("readme"),
        "hello\n"
    );
    answer(&h, &ctas[0], true).await;
    let run = h.wait_status(&run_id, &["completed"]).await;
    assert_eq!(run["result"], "read and changed", "{run:#}");

    let tools = of_type(&run, "tool");
    let child = |i: usize| tools[i]["childRunId"].as_str().expect("child").to_owned();
    let (_, explore) = h.get(&format!("/runs/{}", child(0))).await;
    assert_eq!(explore["sandboxId"], "sb-1");
    let read = results(&explore, "fs__read_text_file");
    assert_eq!(read[0]["status"], "success", "{explore:#}");
    assert!(
        read[0]["output"].to_string().contains("hello"),
        "{}",
        read[0]
    );
    // Scoped to its sandbox: another sandbox's file is refused by the server itself.
    assert_eq!(read[1]["status"], "error", "{}", read[1]);
    assert!(!read[1].to_string().contains("not yours"), "{}", read[1]);
    let log = results(&explore, "git__git_log");
    assert!(
        log[0]["output"].to_string().contains("First commit"),
        "{}",
        log[0]
    );

    let (_, code) = h.get(&format!("/runs/{}", child(1))).await;
    assert_eq!(code["github"], json!({"repo": "acme/demo", "ref": "main"}));
    for name in ["fs__write_file", "git__git_add", "git__git_commit"] {
        let r = results(&code, name);
        assert_eq!(r[0]["status"], "success", "{name}: {code:#}");
    }
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).expect("readme"),
        "hello, changed\n"
    );
    let history = git(&repo, &["log", "--format=%s"]);
    assert_eq!(
        history.lines().collect::<Vec<_>>(),
        ["Change the README", "First commit"]
    );
    h.server.shutdown().await;
}

/// `examples/sandbox-agents.json` on the AWS host (`baton dev --aws`: the step functions' own
/// handlers over an emulator, with the catalog a Lambda function builds, which refuses stdio
/// servers): explore and code reach their sandbox over the network — the reference
/// filesystem server (npm) and mcp-server-git (PyPI) behind `mcp-proxy` (PyPI), one named
/// server per sandbox — explore reads a throwaway repository and code changes it after an
/// approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_aws_host_explore_and_code_work_in_a_sandbox_reached_over_http() {
    use common::host::{AwsHost, TestHost};
    let node = common::browser::npm_ci(
        "mcp/node",
        "mcp-node",
        "@modelcontextprotocol/server-filesystem",
    );
    let sandboxes = tempfile::tempdir().expect("sandboxes");
    let repo = sandboxes.path().join("sb-1");
    std::fs::create_dir_all(&repo).expect("repo dir");
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README.md"), "hello\n").expect("readme");
    git(&repo, &["add", "README.md"]);
    git(&repo, &["commit", "-q", "-m", "First commit"]);
    // The sandbox host: the servers of sandbox sb-1, each rooted in its repository.
    let repo_path = repo.display().to_string();
    let fs = node
        .join(".bin/mcp-server-filesystem")
        .display()
        .to_string();
    let git_server = venv_bin().join("mcp-server-git").display().to_string();
    let proxy = common::python::McpProxy::start(&[
        ("sb-1-fs".into(), format!("{fs} {repo_path}")),
        (
            "sb-1-git".into(),
            format!("{git_server} --repository {repo_path}"),
        ),
    ]);

    let file = AgentsFile::parse(
        &common::examples("sandbox-agents.json"),
        "examples/sandbox-agents.json",
    )
    .expect("parses");
    let vars = |k: &str| match k {
        "BATON_SANDBOX_URL" => Some(proxy.url.clone()),
        "BATON_SANDBOX_TOKEN" => Some("sandbox-t0k".into()),
        _ => None,
    };
    let catalog = Arc::new(
        baton_tools::catalog(
            Some(file),
            baton_tools::Host::Lambda,
            &vars,
            &Default::default(),
        )
        .expect("a catalog a Lambda function builds"),
    );
    let readme = repo.join("README.md").display().to_string();
    let script = json!({
        "orchestrator": [
            {"tool_calls": [{"name": "spawn_subagent", "arguments":
                {"agent": "explore", "prompt": "What does the README say?", "sandboxId": "sb-1"}}]},
            {"tool_calls": [{"name": "spawn_subagent", "arguments":
                {"agent": "code", "prompt": "Change the README.", "sandboxId": "sb-1"}}]},
            {"text": "read and changed"}
        ],
        "explore": [
            {"tool_calls": [
                {"name": "fs__read_text_file", "arguments": {"path": readme}},
                {"name": "git__git_log", "arguments": {"repo_path": repo_path}}]},
            {"text": "it says hello"}
        ],
        "code": [
            {"tool_calls": [{"name": "fs__write_file",
                             "arguments": {"path": readme, "content": "hello, changed\n"}}]},
            {"tool_calls": [{"name": "git__git_add",
                             "arguments": {"repo_path": repo_path, "files": ["README.md"]}}]},
            {"tool_calls": [{"name": "git__git_commit",
                             "arguments": {"repo_path": repo_path, "message": "Change the README"}}]},
            {"text": "committed"}
        ]
    });
    let aws = Arc::new(common::aws::Emulator::start().await);
    let options = aws
        .dev_options(
            aws.names("sandbox"),
            scripted(&script.to_string()),
            catalog,
            0,
        )
        .await;
    let mut host = AwsHost::start(aws.clone(), options).await;
    let api = host.api().clone();
    let v = api
        .post_ok("/runs", json!({"prompt": "update the README"}))
        .await;
    let run_id = v["runId"].as_str().expect("runId").to_owned();
    // The write waits for a human: nothing is written until they approve.
    let cta = api.pending("approval").await;
    assert_eq!(cta["gated"]["tool"], "fs__write_file", "{cta:#}");
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).expect("readme"),
        "hello\n"
    );
    let path = format!("/ctas/{}/response", cta["ctaId"].as_str().expect("ctaId"));
    api.post_ok(&path, json!({"kind": "approval", "approved": true}))
        .await;
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "read and changed", "{run:#}");

    let tools = of_type(&run, "tool");
    let child = |i: usize| tools[i]["childRunId"].as_str().expect("child").to_owned();
    let explore = api.get_ok(&format!("/runs/{}", child(0))).await;
    let read = results(&explore, "fs__read_text_file");
    assert_eq!(read[0]["status"], "success", "{explore:#}");
    assert!(
        read[0]["output"].to_string().contains("hello"),
        "{}",
        read[0]
    );
    let log = results(&explore, "git__git_log");
    assert!(
        log[0]["output"].to_string().contains("First commit"),
        "{}",
        log[0]
    );
    let code = api.get_ok(&format!("/runs/{}", child(1))).await;
    for name in ["fs__write_file", "git__git_add", "git__git_commit"] {
        assert_eq!(
            results(&code, name)[0]["status"],
            "success",
            "{name}: {code:#}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).expect("readme"),
        "hello, changed\n"
    );
    let history = git(&repo, &["log", "--format=%s"]);
    assert_eq!(
        history.lines().collect::<Vec<_>>(),
        ["Change the README", "First commit"]
    );
    host.stop().await;
}
