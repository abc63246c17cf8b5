//! An MCP server's tools as a step sees them: listed when it began, however the listing
//! moves meanwhile.

use super::*;

/// An MCP server that lists one tool, `calc__ping`, and counts how often it was asked.
struct Calc(std::sync::atomic::AtomicU32);

struct Ping;

#[async_trait::async_trait]
impl baton_core::tools::Tool for Ping {
    fn name(&self) -> &str {
        "calc__ping"
    }
    fn description(&self) -> &str {
        "ping"
    }
    fn schema(&self) -> Value {
        json!({"type": "object"})
    }
    async fn execute(
        &self,
        _: &baton_core::tools::ToolContext,
        _: Value,
    ) -> Result<Value, baton_core::tools::ToolError> {
        Ok(json!("pong"))
    }
}

#[async_trait::async_trait]
impl baton_core::tools::ToolServer for Calc {
    async fn list(&self) -> Result<Vec<std::sync::Arc<dyn baton_core::tools::Tool>>, String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(vec![std::sync::Arc::new(Ping)])
    }
}

/// The world of one step whose MCP server gets listed while the step is under way (as a
/// concurrent step of another run would list it).
struct ListedMidStep<'a> {
    catalog: &'a Catalog,
    listed: baton_core::agent::Listed,
}

impl StepIo for ListedMidStep<'_> {
    fn ledger(
        &self,
        _: &str,
    ) -> impl Future<
        Output = Result<Option<baton_core::budget::Ledger>, baton_core::error::PortError>,
    > + Send {
        std::future::ready(Ok(None))
    }

    fn book(&self) -> baton_core::agent::Book {
        self.catalog.book(&self.listed)
    }

    fn prepare(
        &self,
        run: &Run,
        timeline: &[Entry],
        changed: &[Entry],
    ) -> impl Future<Output = Result<baton_core::agent::Preparation, baton_core::agent::PluginError>>
    + Send {
        let seen = baton_core::timeline::overlay(timeline, changed);
        async move { self.catalog.prepare(&run.agent, run, &seen).await }
    }

    fn think(
        &self,
        think_index: u32,
        _: &[Entry],
        _: &baton_core::agent::Prepared,
    ) -> impl Future<Output = Result<LlmReply, LlmError>> + Send {
        let ops = self.catalog.agent("ops").expect("ops");
        block_on(
            self.catalog
                .list_servers(ops, &baton_core::agent::Prepared::default()),
        );
        std::future::ready(Ok(match think_index {
            0 => calls(vec![call("calc__ping", json!({}))]),
            _ => text("done"),
        }))
    }

    fn execute(
        &self,
        call: Execution,
    ) -> impl Future<Output = Result<ToolOutput, baton_core::error::PortError>> + Send {
        assert_eq!(call.tool, "calc__ping", "only the listed tool runs");
        std::future::ready(Ok(ToolOutput::from(Ok(json!("pong")))))
    }

    fn settle(
        &self,
        _: Vec<String>,
    ) -> impl Future<Output = Result<HashMap<String, Cta>, baton_core::error::PortError>> + Send
    {
        std::future::ready(Ok(HashMap::new()))
    }
}

#[test]
fn a_step_sees_the_tools_listed_when_it_began_and_the_next_step_sees_new_ones() {
    let server = std::sync::Arc::new(Calc(Default::default()));
    let file: AgentsFile = serde_json::from_value(
        json!({"mcpServers": {"calc": {"url": "http://127.0.0.1:9/mcp"}},
            "agents": {"ops": {"tools": ["mcp:calc"]}}}),
    )
    .unwrap();
    let toolbox = baton_core::agent::Toolbox {
        tools: vec![],
        servers: BTreeMap::from([(
            "calc".to_owned(),
            server.clone() as std::sync::Arc<dyn baton_core::tools::ToolServer>,
        )]),
    };
    let catalog = Catalog::build(Limits::default(), toolbox, Some(file)).unwrap();
    let start = |id: &str| {
        let mut run = Run::new(NewRun::top_level(id, "ops", "o", t0()));
        run.next_seq = 1;
        let first = Entry {
            seq: 0,
            at: t0(),
            body: EntryBody::user("ping it"),
        };
        (run, vec![first])
    };
    // The call's result once the step is done: an MCP tool's calls run once, so the reply
    // commits first (a checkpoint), and the call runs from there.
    let result_of = |world: &ListedMidStep, id: &str| {
        let (mut run, mut timeline) = start(id);
        let mut io = Io::new(world.book());
        loop {
            let decision = block_on(decide(t0(), &run, &timeline, &Input::Start, world, &mut io))
                .expect("decides");
            let (t, marked) = match decision {
                Decision::Commit(t) => (t, None),
                Decision::Checkpoint(t, marked) => (t, Some(marked)),
                Decision::Ignore { reason, .. } => panic!("commits: {reason}"),
            };
            t.apply(&mut timeline);
            run = t.run;
            match marked {
                Some(marked) => io.marked.extend(marked),
                None => break,
            }
        }
        timeline
            .iter()
            .find_map(|e| e.tool().cloned())
            .expect("a tool entry")
            .result
    };
    // Given a step that began before the server was listed, when the server is listed
    // during its think, then the step's call is checked against what it began with.
    let world = ListedMidStep {
        catalog: &catalog,
        listed: catalog.listed(),
    };
    let first = result_of(&world, "run_a");
    assert!(
        matches!(&first, ToolResult::Error { error } if error.contains("unknown tool `calc__ping`")),
        "{first:?}"
    );
    assert_eq!(server.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The next step takes the listing as it now is.
    let world = ListedMidStep {
        catalog: &catalog,
        listed: catalog.listed(),
    };
    let next = result_of(&world, "run_b");
    assert_eq!(
        next,
        ToolResult::Success {
            output: json!("pong")
        }
    );
}
