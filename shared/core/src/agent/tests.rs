use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::*;
use crate::tools::{Tool, ToolError, ToolServer};

fn file(json: &str) -> AgentsFile {
    serde_json::from_str(json).expect("parses")
}

#[test]
fn builtins_have_the_seed_tools() {
    let c = Catalog::new(Limits::default(), vec![], None).expect("builds");
    let o = c.agent(ORCHESTRATOR).expect("orchestrator");
    assert_eq!(
        o.tools,
        vec![
            tools::SPAWN_SUBAGENT,
            tools::REQUEST_HUMAN_FEEDBACK,
            plan::AGENT_ORCHESTRATE
        ]
    );
    assert!(c.agent("explore").is_some() && c.agent("code").is_some());
    assert_eq!(c.specs(&c.listed(), o, &Prepared::default()).len(), 3);
    // The plan's helpers: no tools (the planner cannot call agent_orchestrate), their
    // calls recorded as `plan` and `review`, and the planner told which agents it has.
    let planner = c.agent(plan::PLANNER).expect("planner");
    assert!(planner.tools.is_empty());
    assert_eq!(planner.operation, Operation::Plan);
    assert!(
        planner.system.contains("- explore: investigates"),
        "{}",
        planner.system
    );
    assert!(!planner.system.contains("- planner"));
    assert_eq!(
        c.agent(plan::PLAN_REVIEWER).expect("reviewer").operation,
        Operation::Review
    );
    assert!(!c.is_subagent(plan::PLANNER) && !c.is_subagent(ORCHESTRATOR));
    assert!(c.is_subagent("explore"));
}

#[test]
fn the_plan_helpers_models_are_set_and_their_prompts_kept() {
    let plain = Catalog::new(Limits::default(), vec![], None).expect("builds");
    let f = file(
        r#"{"plans": {"plannerModel": "anthropic:claude-sonnet-4-5", "reviewerModel": "gpt-4o"}}"#,
    );
    let c = Catalog::new(Limits::default(), vec![], Some(f)).expect("builds");
    for (helper, model) in [
        ("planner", "anthropic:claude-sonnet-4-5"),
        ("plan_reviewer", "gpt-4o"),
    ] {
        let a = c.agent(helper).expect(helper);
        assert_eq!(a.model.as_deref(), Some(model));
        assert_eq!(
            a.system,
            plain.agent(helper).expect(helper).system,
            "{helper}"
        );
        assert!(!a.system.is_empty());
    }
    assert!(
        c.providers("gpt-4o-mini").contains("anthropic"),
        "the planner's provider is known: {:?}",
        c.providers("gpt-4o-mini")
    );
}

#[test]
fn plan_caps_come_from_the_agents_file_within_bounds() {
    let f = file(r#"{"plans": {"maxSteps": 3, "maxParallel": 2, "stepTimeoutSeconds": 30}}"#);
    let c = Catalog::new(Limits::default(), vec![], Some(f)).expect("builds");
    assert_eq!(c.limits.plan.max_steps, 3);
    assert_eq!(c.limits.plan.max_parallel, 2);
    assert_eq!(c.limits.plan.max_depth, 3);
    assert_eq!(c.limits.plan.step_timeout, Some(Duration::from_secs(30)));
    for (bad, want) in [
        (
            r#"{"plans": {"maxSteps": 0}}"#,
            "plans.maxSteps must be from 1 to 100",
        ),
        (
            r#"{"plans": {"maxParallel": 99}}"#,
            "plans.maxParallel must be from 1 to 32",
        ),
        (
            r#"{"agents": {"planner": {"tools": ["echo"]}}}"#,
            "agent `planner` writes or reviews plans; it cannot have tools",
        ),
    ] {
        let err = Catalog::new(Limits::default(), vec![], Some(file(bad)))
            .expect_err(bad)
            .to_string();
        assert_eq!(err, want);
    }
}

#[test]
fn an_agents_file_adds_agents_with_policies() {
    let f = file(
        r#"{"agents": {"ops": {"system": "s", "tools": ["echo"], "maxIterations": 3,
             "approval": {"echo": {"inputMatches": "rm -rf"}}},
            "careful": {"tools": ["echo"], "approval": {"echo": "always"}}}}"#,
    );
    let c = Catalog::new(Limits::default(), vec![], Some(f)).expect("builds");
    let ops = c.agent("ops").expect("ops");
    assert_eq!(ops.max_iterations, 3);
    let policy = &ops.approval["echo"];
    assert!(policy.requires(&serde_json::json!({"text": "rm -rf /"})));
    assert!(!policy.requires(&serde_json::json!({"text": "ls"})));
    assert!(c.agent("careful").expect("careful").approval["echo"].requires(&serde_json::json!({})));
    // New agents can be spawned as subagents.
    let spawn = c.tool(&c.listed(), tools::SPAWN_SUBAGENT).expect("spawn");
    assert!(
        spawn
            .validate(&serde_json::json!({"agent": "ops", "prompt": "x"}))
            .is_ok()
    );
}

#[test]
fn bad_agent_files_are_clear_start_up_errors() {
    let cases = [
        (
            r#"{"agents": {"a": {"tools": [], "actions": {"a b": {"prompt": "p"}}}}}"#,
            "action `a b`: a name is 1 to 64 letters",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "actions": {"go": {"prompt": " "}}}}}"#,
            "action `go` needs a `prompt`",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "actions": {"go": {"prompt": "p", "inputSchema": {"type": "array"}}}}}}"#,
            "action `go`: `inputSchema` must be a JSON schema of",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "actions": {"go": {"prompt": "p", "outputSchema": {"type": "object", "properties": {"x": {"type": 1}}}}}}}}"#,
            "action `go`: `outputSchema` is not a valid JSON schema",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "planRequirements": {"*": [{"agent": "nobody"}]}}}}"#,
            "`planRequirements` names `nobody`, which is not an agent a plan step may start",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "planRequirements": {"x": [{"agent": "planner"}]}}}}"#,
            "names `planner`",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "fallbackModels": ["openai:x", "openai:x"]}}}"#,
            "`fallbackModels[1]` must be a model id, once",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "fallbackModels": ["a", "b", "c", "d", "e"]}}}"#,
            "at most 4",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "toolChoice": "required"}}}"#,
            "`required` and the agent has no tools",
        ),
        (
            r#"{"agents": {"a": {"tools": ["echo"], "toolChoice": {"tool": "ls"}}}}"#,
            "names `ls`, which is not one of its tools",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "reasoning": {}}}}"#,
            "needs an `effort` or a `budgetTokens`",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "reasoning": {"budgetTokens": 100}}}}"#,
            "from 1024 to 128000",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "outputSchema": {"type": "string"}}}}"#,
            "`outputSchema` must be a JSON schema of `\"type\": \"object\"`",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "outputSchema": {"type": "object", "properties": {"n": {"type": 5}}}}}}"#,
            "`outputSchema` is not a valid JSON schema",
        ),
        (
            r#"{"agents": {"a": {"tools": ["nope"]}}}"#,
            "unknown tool `nope`",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "approval": {"echo": "always"}}}}"#,
            "not one of its tools",
        ),
        (
            r#"{"agents": {"a": {"tools": ["echo"], "approval": {"echo": {"inputMatches": "("}}}}}"#,
            "regex",
        ),
        (r#"{"agents": {"a b": {"tools": []}}}"#, "not valid"),
        (
            r#"{"agents": {"a": {"tools": [], "questions": {"assignees": ["ops"]}}}}"#,
            "neither `user:<id>` nor `group:<name>`",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "questions": {"assignees": ["user:x"], "required": 2}}}}"#,
            "more than the 1 who may answer",
        ),
        (
            r#"{"agents": {"a": {"tools": ["echo"], "approval": {"echo": {"assignees": ["user:x", "user:y"], "required": 3}}}}}"#,
            "the approval of `echo`",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "maxIterations": 0}}}"#,
            "at least 1",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "ctaExpirySeconds": 0}}}"#,
            "ctaExpirySeconds is 0",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "ctaExpirySeconds": 31536001}}}"#,
            "one year",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "contextBytes": 999}}}"#,
            "contextBytes is 999; it must be from 1000 to 4000000",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "contextBytes": 4000001}}}"#,
            "contextBytes is 4000001",
        ),
        // Money is bounded where it enters: a negative price once made a run "cost"
        // -$31,000, and an agent's budget past a million dollars is a typo or an attack.
        (
            r#"{"prices": {"openai:m": {"input": -1000, "output": 1}}}"#,
            "price of `openai:m`: `input` must be US dollars per million tokens, 0 or from 0.000001",
        ),
        (
            r#"{"prices": {"openai:m": {"input": 1, "output": 1, "cachedInput": 1e9}}}"#,
            "`cachedInput` must be",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "maxCostUsd": 1e300}}}"#,
            "from 0.000001 to 1000000",
        ),
        // And too small for DynamoDB's numbers (from 1e-130): costs under such a price, or
        // such a budget, could not be written.
        (
            r#"{"prices": {"openai:m": {"input": 1e-200, "output": 1}}}"#,
            "`input` must be",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "maxCostUsd": 1e-200}}}"#,
            "from 0.000001 to 1000000",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "clarifyingReply": "  "}}}"#,
            "`clarifyingReply` must be 1 to 4000 bytes of text",
        ),
        // An e-mail channel: a sender, an address for everyone it tells, and nothing else.
        (
            r#"{"notifiers": {"m": {"type": "email", "to": {"user:x": "x@example.com"}}}}"#,
            "notifier `m`: an e-mail channel needs a `from` address",
        ),
        (
            r#"{"notifiers": {"m": {"type": "email", "from": "Baton <b@example.com>", "to": {"user:x": "x@example.com"}}}}"#,
            "`from`: `Baton <b@example.com>` is not an e-mail address",
        ),
        (
            r#"{"notifiers": {"m": {"type": "email", "from": "b@example.com", "to": {"x": "x@example.com"}}}}"#,
            "neither `user:<id>` nor `group:<name>`",
        ),
        (
            r#"{"notifiers": {"m": {"type": "email", "from": "b@example.com", "url": "https://x.example.com", "to": {"user:x": "x@example.com"}}}}"#,
            "no `url` or `secret`",
        ),
        (
            r#"{"notifiers": {"h": {"type": "slack", "url": "https://x.example.com", "from": "b@example.com"}}}"#,
            "`from` and `to` are an e-mail channel's",
        ),
        (
            r#"{"notifiers": {"m": {"type": "email", "from": "b@example.com", "to": {"user:x": "x@example.com"}}},
                "agents": {"a": {"tools": [], "questions": {"assignees": ["user:x"], "notify": ["m"],
                    "escalateAfterSeconds": 60, "escalateTo": ["user:lead", "group:ops"]}}}}"#,
            "e-mail channel `m` has no address in `to` for user:lead, group:ops",
        ),
        (
            r#"{"notifiers": {"m": {"type": "email", "from": "b@example.com", "to": {"user:x": "x@example.com"}}},
                "agents": {"a": {"tools": [], "questions": {"notify": ["m"]}}}}"#,
            "these questions have none",
        ),
    ];
    for (json, expected) in cases {
        let err = Catalog::new(Limits::default(), vec![], Some(file(json))).expect_err(json);
        assert!(err.to_string().contains(expected), "{json}: {err}");
    }
    assert!(serde_json::from_str::<AgentsFile>(r#"{"agents": {"a": {"tool": []}}}"#).is_err());
    assert!(
        serde_json::from_str::<AgentsFile>(
            r#"{"agents": {"a": {"tools": [], "approval": {"echo": "sometimes"}}}}"#
        )
        .is_err()
    );
}

/// A server with one tool, `<name>__ping`, that can be made to fail listing.
struct FakeServer {
    name: &'static str,
    up: std::sync::atomic::AtomicBool,
    lists: std::sync::atomic::AtomicU32,
}

struct Ping(String);

#[async_trait::async_trait]
impl Tool for Ping {
    fn name(&self) -> &str {
        &self.0
    }
    fn description(&self) -> &str {
        "ping"
    }
    fn schema(&self) -> Value {
        serde_json::json!({"type": "object"})
    }
    async fn execute(&self, _: &tools::ToolContext, _: Value) -> Result<Value, ToolError> {
        Ok("pong".into())
    }
}

#[async_trait::async_trait]
impl ToolServer for FakeServer {
    async fn list(&self) -> Result<Vec<Arc<dyn Tool>>, String> {
        use std::sync::atomic::Ordering;
        self.lists.fetch_add(1, Ordering::SeqCst);
        if self.up.load(Ordering::SeqCst) {
            Ok(vec![Arc::new(Ping(format!("{}__ping", self.name)))])
        } else {
            Err("down".into())
        }
    }
}

fn with_server(json: &str, up: bool) -> (Result<Catalog, CatalogError>, Arc<FakeServer>) {
    let server = Arc::new(FakeServer {
        name: "calc",
        up: std::sync::atomic::AtomicBool::new(up),
        lists: Default::default(),
    });
    let toolbox = Toolbox {
        tools: vec![],
        servers: BTreeMap::from([("calc".to_owned(), server.clone() as Arc<dyn ToolServer>)]),
    };
    (
        Catalog::build(Limits::default(), toolbox, Some(file(json))),
        server,
    )
}

#[test]
fn mcp_grants_are_checked_and_listed_once() {
    let ok = r#"{"mcpServers": {"calc": {"url": "http://x", "agents": ["explore"]}},
                 "agents": {"ops": {"tools": ["calc__ping"], "approval": {"calc__ping": "always"}},
                            "all": {"tools": ["mcp:calc"], "approval": {"calc__other": "always"}}}}"#;
    let (c, server) = with_server(ok, true);
    let c = c.expect("builds");
    let explore = c.agent("explore").expect("explore");
    assert!(
        explore.tools.contains(&"mcp:calc".to_owned()),
        "granted by the server spec"
    );
    let none = Prepared::default();
    // Not listed yet: the model is offered nothing of it, and a call finds no tool.
    assert!(c.specs(&c.listed(), explore, &none).is_empty());
    assert!(
        c.tool_for(&c.listed(), explore, &none, "calc__ping")
            .is_none()
    );
    let block = |f| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    };
    block(c.list_servers(explore, &none));
    block(c.list_servers(c.agent("ops").expect("ops"), &none));
    assert_eq!(
        server.lists.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "listed once"
    );
    assert_eq!(c.specs(&c.listed(), explore, &none)[0].name, "calc__ping");
    assert!(
        c.tool_for(
            &c.listed(),
            c.agent("ops").expect("ops"),
            &none,
            "calc__ping"
        )
        .is_some()
    );
    assert!(
        c.tool_for(
            &c.listed(),
            c.agent("code").expect("code"),
            &none,
            "calc__ping"
        )
        .is_none()
    );

    // A server that is down is asked again only after a while.
    let (c, server) = with_server(ok, false);
    let c = c.expect("builds");
    block(c.list_servers(explore_of(&c), &none));
    block(c.list_servers(explore_of(&c), &none));
    assert_eq!(server.lists.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(c.specs(&c.listed(), explore_of(&c), &none).is_empty());

    for (json, expected) in [
        (
            r#"{"mcpServers": {"calc": {"url": "http://x"}}, "agents": {"a": {"tools": ["mcp:nope"]}}}"#,
            "unknown tool `mcp:nope`",
        ),
        (
            r#"{"mcpServers": {"calc": {"url": "http://x"}}, "agents": {"a": {"tools": ["nope__x"]}}}"#,
            "unknown tool `nope__x`",
        ),
        (
            r#"{"mcpServers": {"calc": {"url": "http://x", "agents": ["ghost"]}}}"#,
            "`ghost`, which is not an agent",
        ),
        (
            r#"{"mcpServers": {"calc": {"url": "http://x"}}, "agents": {"a": {"tools": ["mcp:calc"], "approval": {"echo": "always"}}}}"#,
            "not one of its tools",
        ),
    ] {
        let err = with_server(json, true).0.expect_err(json);
        assert!(err.to_string().contains(expected), "{json}: {err}");
    }
}

#[test]
fn a_snapshot_keeps_the_listings_it_was_taken_with() {
    let ok = r#"{"mcpServers": {"calc": {"url": "http://x"}},
                 "agents": {"ops": {"tools": ["mcp:calc"]}}}"#;
    let (c, _) = with_server(ok, true);
    let c = c.expect("builds");
    let before = c.listed();
    assert!(c.tool(&before, "calc__ping").is_none());
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(c.list_servers(c.agent("ops").expect("ops"), &Prepared::default()));
    assert!(c.tool(&before, "calc__ping").is_none(), "frozen");
    assert!(c.tool(&c.listed(), "calc__ping").is_some());
}

fn explore_of(c: &Catalog) -> &AgentDef {
    c.agent("explore").expect("explore")
}

#[test]
fn a_host_that_runs_no_tools_knows_them_by_name() {
    let f = file(
        r#"{"mcpServers": {"calc": {"url": "http://x"}},
            "tools": {"lookup": {"url": "http://x", "description": "d", "schema": {"type": "object"}}},
            "httpFetch": {"allowHosts": ["docs.rs"]},
            "agents": {"ops": {"tools": ["lookup", "mcp:calc", "calc__add"]}}}"#,
    );
    let c = Catalog::declared(Some(f), &Extensions::default()).expect("builds without clients");
    assert!(c.agent("ops").is_some());
    assert!(
        c.agent("explore")
            .expect("explore")
            .tools
            .contains(&HTTP_FETCH.to_owned())
    );
    let def = c.tool(&c.listed(), "lookup").expect("declared");
    let Some(tool) = &def.exec else {
        panic!("an executable tool")
    };
    let ctx = tools::ToolContext::builder("r")
        .owner("o")
        .agent("ops")
        .call_id("c")
        .build();
    let out = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(tool.execute(&ctx, serde_json::json!({})));
    assert!(out.is_err_and(|e| e.message().contains("runs only where steps run")));
}

/// A tool that answers what it was given.
struct Mirror;

#[async_trait::async_trait]
impl crate::tools::Tool for Mirror {
    fn name(&self) -> &str {
        "mirror"
    }
    fn description(&self) -> &str {
        "Answers its input."
    }
    fn schema(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
    async fn execute(
        &self,
        _: &crate::tools::ToolContext,
        input: serde_json::Value,
    ) -> Result<serde_json::Value, ToolError> {
        Ok(input)
    }
}

#[test]
fn a_deployments_extensions_reach_every_hosts_catalog_and_the_file_wins_a_name() {
    let ext = Extensions::new().tool(Mirror).agent(
        "mirror_agent",
        serde_json::from_str(r#"{"system": "code's", "tools": ["mirror"]}"#).expect("spec"),
    );
    let listing = r#"{"agents": {"ops": {"tools": ["mirror"]},
                                 "mirror_agent": {"system": "the file's", "tools": ["mirror"]}}}"#;
    // The functions that never run a tool know the extension's tool, so the file's agent
    // that lists it checks out; without the extensions it is a start-up error naming it.
    let declared = Catalog::declared(Some(file(listing)), &ext).expect("declared");
    assert!(declared.tool(&declared.listed(), "mirror").is_some());
    assert_eq!(
        declared.agent("mirror_agent").expect("agent").system,
        "the file's"
    );
    let err = Catalog::declared(Some(file(listing)), &Extensions::default()).unwrap_err();
    assert!(err.to_string().contains("mirror"), "{err}");
    // With no file, the code's own agent is there.
    let alone = Catalog::declared(None, &ext).expect("declared");
    assert_eq!(alone.agent("mirror_agent").expect("agent").system, "code's");
    assert_eq!(
        alone.agent("mirror_agent").expect("agent").tools,
        ["mirror"]
    );
}

#[test]
fn two_tools_of_one_name_are_a_start_up_error_naming_it() {
    let twice = Extensions::new().tool(Mirror).tool(Mirror);
    let err = Catalog::declared(None, &twice).unwrap_err();
    assert!(
        matches!(&err, CatalogError::DuplicateTool(name) if name == "mirror"),
        "{err}"
    );
    let http = file(
        r#"{"tools": {"mirror": {"url": "http://x", "description": "d", "schema": {"type": "object"}}}}"#,
    );
    let err = Catalog::declared(Some(http), &Extensions::new().tool(Mirror)).unwrap_err();
    assert!(
        err.to_string().contains("two tools are named `mirror`"),
        "{err}"
    );
}

/// A tool choice or a reasoning setting that is not one is refused when the file is read,
/// in words that say what is.
#[test]
fn bad_controls_are_refused_when_the_file_is_read() {
    for (json, words) in [
        (
            r#"{"agents": {"a": {"tools": [], "toolChoice": "sometimes"}}}"#,
            "toolChoice must be \"auto\", \"required\", \"none\" or {\"tool\": \"<name>\"}",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "toolChoice": {"tool": "x", "why": 1}}}}"#,
            "toolChoice must be",
        ),
        (
            r#"{"agents": {"a": {"tools": [], "reasoning": {"effort": "max"}}}}"#,
            "unknown variant `max`, expected one of `low`, `medium`, `high`",
        ),
    ] {
        let err = serde_json::from_str::<AgentsFile>(json).expect_err(json);
        assert!(err.to_string().contains(words), "{json}: {err}");
    }
}

/// A turn's first reply is steered by the agent's tool choice; the next ones by none (the
/// provider's `auto`), except `none`, which holds; with no tools, no choice is sent. Its
/// reasoning and output schema go with every reply.
#[test]
fn an_agents_controls_hold_for_a_turns_first_reply() {
    let c = Catalog::new(
        Limits::default(),
        vec![],
        Some(file(
            r#"{"agents": {"a": {"tools": ["echo"], "toolChoice": {"tool": "echo"},
                "reasoning": {"effort": "low"},
                "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}},
              "b": {"tools": ["echo"], "toolChoice": "none"}}}"#,
        )),
    )
    .expect("catalog");
    let a = c.agent("a").expect("a");
    let first = a.controls(0, true, None);
    assert_eq!(
        first.tool_choice,
        Some(crate::llm::ToolChoice::Tool {
            tool: "echo".into()
        })
    );
    assert_eq!(
        first.reasoning.map(|r| r.effort()),
        Some(crate::llm::Effort::Low)
    );
    let output = first.output.expect("output");
    assert_eq!(output.name, crate::llm::OUTPUT_TOOL);
    let next = a.controls(1, true, None);
    assert_eq!(next.tool_choice, None);
    assert!(next.reasoning.is_some() && next.output.is_some());
    assert_eq!(a.controls(0, false, None).tool_choice, None);
    let b = c.agent("b").expect("b");
    assert_eq!(
        b.controls(3, true, None).tool_choice,
        Some(crate::llm::ToolChoice::None)
    );
    let checked = a.output.as_ref().expect("compiled");
    assert!(checked.validate(&serde_json::json!({"n": 3})).is_ok());
    assert!(checked.validate(&serde_json::json!({"n": "3"})).is_err());
}
