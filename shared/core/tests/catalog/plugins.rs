//! Plugins and what the model is shown: their tools, context and typed state; widgets and files.

use super::*;

/// A plugin that reads an index (async) for whether `echo` is on, counts its activations
/// in its state, and says the count in the system prompt. `flip` turns the index over after
/// each read, as a source that changes while the model thinks.
struct Skills {
    on: std::sync::Arc<std::sync::atomic::AtomicBool>,
    flip: bool,
}

#[derive(serde::Serialize, serde::Deserialize, Default)]
struct SkillState {
    activations: u32,
}

#[async_trait::async_trait]
impl baton_core::agent::Plugin for Skills {
    type State = SkillState;

    fn name(&self) -> &str {
        "skills"
    }

    async fn prepare(
        &self,
        _: baton_core::run::RunView<'_>,
        _: &[Entry],
        state: &mut SkillState,
    ) -> Result<baton_core::agent::Prepared, baton_core::agent::PluginError> {
        use std::sync::atomic::Ordering::SeqCst;
        let on = if self.flip {
            self.on.fetch_xor(true, SeqCst)
        } else {
            self.on.load(SeqCst)
        };
        state.activations += 1;
        let prepared = baton_core::agent::Prepared::new();
        let prepared = if on { prepared.tool("echo") } else { prepared };
        Ok(prepared.context(format!("activation {}", state.activations)))
    }
}

#[test]
fn a_plugin_adds_tools_and_context_and_keeps_typed_state_committed_with_each_think() {
    let on = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut s = sim();
    let skills = Skills {
        on: on.clone(),
        flip: false,
    };
    let catalog = use_catalog(
        &mut s,
        catalog_with(Limits::default()).with_plugin("deep", skills),
    );
    let echo = || calls(vec![call("echo", json!({"text": "x"}))]);
    s.script("deep", vec![echo(), text("ok")]);
    let id = s.create("deep", "go");
    s.run_all();
    // The index said no to echo: the call is refused; the state counted both thinks.
    assert!(
        matches!(&s.tools(&id)[0].result, ToolResult::Error { error } if error.contains("unknown tool"))
    );
    assert_eq!(s.run(&id).plugin_state["skills"], json!({"activations": 2}));
    on.store(true, std::sync::atomic::Ordering::SeqCst);
    let (run, timeline) = s.runs[&id].clone();
    let agent = catalog.agent("deep").expect("deep");
    let p = block_on(catalog.prepare("deep", &run, &timeline)).expect("prepares");
    assert_eq!(p.prepared.tools, ["echo"]);
    assert_eq!(
        p.states["skills"],
        json!({"activations": 3}),
        "from the committed state"
    );
    assert!(
        agent
            .system_prompt(&run, &p.prepared)
            .ends_with("activation 3")
    );
}

#[test]
fn what_the_plugins_answered_is_the_steps_input_however_their_source_moves() {
    // The index turns over right after it is read: the model was offered `echo`, and its
    // call is checked against that offer, not against a second reading.
    let on = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut s = sim();
    let skills = Skills {
        on: on.clone(),
        flip: true,
    };
    use_catalog(
        &mut s,
        catalog_with(Limits::default()).with_plugin("deep", skills),
    );
    let id = s.create("deep", "go");
    let (run, timeline) = s.runs[&id].clone();
    let world = Scripted {
        replies: vec![calls(vec![call("echo", json!({"text": "x"}))])],
        ..s.world(&run)
    };
    let decision = block_on(decide(
        s.now,
        &run,
        &timeline,
        &Input::Start,
        &world,
        &mut Io::new(world.book()),
    ))
    .expect("decides");
    assert!(
        !on.load(std::sync::atomic::Ordering::SeqCst),
        "the source moved"
    );
    // The call is accepted: committed with its reply, due to run before the next think.
    let Decision::Commit(t) = decision else {
        panic!("commits")
    };
    let echo = t.appended.iter().find_map(|e| e.tool()).expect("the call");
    assert!(echo.is_due(), "{echo:?}");
    assert!(world.executed.lock().expect("not poisoned").is_empty());
    assert_eq!(t.run.plugin_state["skills"], json!({"activations": 1}));
}

#[test]
fn context_guidance_joins_the_system_prompt_by_the_contexts_type() {
    let file: AgentsFile = serde_json::from_value(json!({"agents": {"reader": {
        "system": "You read.", "tools": [],
        "contextGuidance": {"document": "Quote the document."}
    }}}))
    .unwrap();
    let catalog = Catalog::new(Limits::default(), vec![], Some(file)).unwrap();
    let agent = catalog.agent("reader").unwrap();
    let mut run = Run::new(NewRun {
        context: Some(json!({"type": "document", "id": "doc-7"})),
        ..NewRun::top_level("r", "reader", "o", t0())
    });
    let none = baton_core::agent::Prepared::default();
    let system = agent.system_prompt(&run, &none);
    assert!(system.starts_with("You read.\n\nQuote the document.\n\nContext (document):"));
    assert!(system.contains("doc-7"));
    run.origin.context = Some(json!({"type": "ticket"}));
    assert!(!agent.system_prompt(&run, &none).contains("Quote"));
    run.origin.context = None;
    assert_eq!(agent.system_prompt(&run, &none), "You read.");
}

#[test]
fn widgets_are_timeline_entries_the_model_never_sees() {
    let mut s = sim();
    s.script(
        "worker",
        vec![
            calls(vec![call("echo", json!({"text": "chart"}))]),
            text("drawn"),
        ],
    );
    let id = s.create("worker", "draw");
    s.run_all();
    let timeline = s.runs[&id].1.clone();
    let widget = timeline
        .iter()
        .find_map(|e| match &e.body {
            EntryBody::Widget {
                call_id,
                kind,
                data,
                ..
            } => Some((call_id.clone(), kind.clone(), data.clone())),
            _ => None,
        })
        .expect("a widget entry");
    assert_eq!(widget.0, s.tools(&id)[0].id);
    assert_eq!(widget.1, "table");
    assert_eq!(widget.2["rows"][1][0], 2);
    let seen = baton_core::llm::project("", &timeline);
    assert!(
        !seen.iter().any(|m| format!("{m:?}").contains("rows")),
        "the model's projection leaves widgets out: {seen:?}"
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_files_summary_is_all_the_model_sees_of_it() {
    let mut s = sim();
    s.script(
        "worker",
        vec![
            calls(vec![call("echo", json!({"text": "report"}))]),
            text("sent"),
        ],
    );
    let id = s.create("worker", "report");
    s.run_all();
    let timeline = s.runs[&id].1.clone();
    let file = timeline
        .iter()
        .find_map(|e| match &e.body {
            EntryBody::File(f) => Some(f.clone()),
            _ => None,
        })
        .expect("a file entry");
    assert_eq!(file.call_id, s.tools(&id)[0].id);
    assert_eq!(
        (file.name.as_str(), file.size, file.file_id.as_str()),
        ("report.csv", 2048, "file_1")
    );
    let seen = baton_core::llm::project("", &timeline);
    let result = seen
        .iter()
        .find_map(|m| match m {
            baton_core::llm::ChatMessage::Tool { content, .. } => Some(content.clone()),
            _ => None,
        })
        .expect("the call's result");
    assert_eq!(
        result,
        "report\n[file `report.csv` (text/csv, 2048 bytes): 12 rows of sales by region]"
    );
    assert!(!format!("{seen:?}").contains("file_1"), "no id, no bytes");
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

/// A plugin whose source fails: retryably (a lookup that timed out) or not.
struct Failing {
    retryable: bool,
}

#[async_trait::async_trait]
impl baton_core::agent::Plugin for Failing {
    type State = SkillState;

    fn name(&self) -> &str {
        "index"
    }

    async fn prepare(
        &self,
        _: baton_core::run::RunView<'_>,
        _: &[Entry],
        _: &mut SkillState,
    ) -> Result<baton_core::agent::Prepared, baton_core::agent::PluginError> {
        Err(if self.retryable {
            baton_core::agent::PluginError::retry("the index timed out")
        } else {
            baton_core::agent::PluginError::fatal("the index is not configured")
        })
    }
}

#[test]
fn a_plugins_error_is_its_own_named_and_retried_only_when_it_says_so() {
    for retryable in [true, false] {
        let mut s = sim();
        use_catalog(
            &mut s,
            catalog_with(Limits::default()).with_plugin("deep", Failing { retryable }),
        );
        s.script("deep", vec![text("never asked")]);
        let id = s.create("deep", "go");
        let msg = s.queue.pop_front().expect("the run's start");
        let (run, timeline) = s.runs[&id].clone();
        let world = s.world(&run);
        let got = block_on(decide(
            s.now,
            &run,
            &timeline,
            &msg.input,
            &world,
            &mut Io::new(world.book()),
        ));
        let Err(StepError::Plugin(e)) = got else {
            panic!("a plugin's failure is not a model outage: {got:?}");
        };
        assert_eq!(e.retryable, retryable);
        assert_eq!((e.plugin.as_str(), e.agent.as_str()), ("index", "deep"));
        assert!(
            e.to_string()
                .starts_with("plugin `index` of agent `deep`: the index")
        );
    }
}

/// A tool that always asks a human first.
struct Guarded;

#[async_trait::async_trait]
impl baton_core::tools::Tool for Guarded {
    fn name(&self) -> &str {
        "guarded"
    }
    fn description(&self) -> &str {
        "Does something a human approves first."
    }
    fn schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn needs_approval(&self, _: &Value) -> bool {
        true
    }
    async fn execute(
        &self,
        _: &baton_core::tools::ToolContext,
        _: Value,
    ) -> Result<Value, baton_core::tools::ToolError> {
        Ok(json!("done"))
    }
}

/// A plugin that offers one tool, always.
struct Offers(&'static str);

#[async_trait::async_trait]
impl baton_core::agent::Plugin for Offers {
    type State = ();
    fn name(&self) -> &str {
        "offers"
    }
    async fn prepare(
        &self,
        _: baton_core::run::RunView<'_>,
        _: &[Entry],
        _: &mut (),
    ) -> Result<baton_core::agent::Prepared, baton_core::agent::PluginError> {
        Ok(baton_core::agent::Prepared::new().tool(self.0))
    }
}

#[test]
fn a_call_of_a_tool_a_plugin_offered_runs_once_a_human_approves_it() {
    // The tool is the plugin's offer alone (the agent lists none): the approval is answered
    // in a later step, which thinks no more, and the call is checked against the offer the
    // model had.
    let file: AgentsFile =
        serde_json::from_value(json!({"agents": {"skilled": {"tools": []}}})).unwrap();
    let tools: Vec<std::sync::Arc<dyn baton_core::tools::Tool>> =
        vec![std::sync::Arc::new(Guarded)];
    let mut s = sim();
    use_catalog(
        &mut s,
        Catalog::new(Limits::default(), tools, Some(file))
            .unwrap()
            .with_plugin("skilled", Offers("guarded")),
    );
    s.script(
        "skilled",
        vec![
            calls(vec![call("guarded", json!({"text": "done"}))]),
            text("ok"),
        ],
    );
    let id = s.create("skilled", "go");
    s.run_all();
    let ctas = s.pending_ctas(&id);
    assert_eq!(ctas.len(), 1, "the call waits for a human");
    s.answer(&ctas[0].cta_id, CtaResponse::approval(true));
    s.run_all();
    assert_eq!(
        s.tools(&id)[0].result,
        ToolResult::Success {
            output: json!("done")
        }
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}
