//! Scenarios written once and run on each host, through its HTTP API alone: `baton dev` on
//! its embedded store with the scripted model (`local`), and `baton dev --aws` over the
//! emulator, through the scenario's fault layer, thinking from a mock OpenAI server
//! (`aws`). Each scenario is a function of a [`TestHost`]; `on_both_hosts!` makes its two
//! tests.

use crate::common;

use std::sync::Arc;

use common::host::{LocalHost, TestHost};
use common::*;
use serde_json::{Value, json};

/// `baton dev` thinking from `script`, with the data directory it keeps.
async fn local_host(script: &str) -> (LocalHost, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let options = local_options(
        dir.path(),
        scripted(script),
        catalog(None),
        Arc::new(baton_core::ports::SystemClock),
    );
    (LocalHost::start(options).await, dir)
}

/// `baton dev --aws` thinking from `script`, under the scenario's faults.
async fn aws_host(script: &str) -> super::aws_flow::Env {
    super::aws_flow::start_env(
        script,
        false,
        super::aws_flow::named_agents(),
        common::aws::scenario_faults(),
    )
    .await
}

/// `baton dev` on its embedded store with `catalog`, thinking from `script`: the scripted
/// model, or, `over_the_wire`, a mock OpenAI server behind the provider router (kept with
/// the data directory).
async fn local_host_with(
    script: &str,
    catalog: Arc<baton_core::agent::Catalog>,
    over_the_wire: bool,
) -> (LocalHost, (tempfile::TempDir, Option<wiremock::MockServer>)) {
    let dir = tempfile::tempdir().unwrap();
    let (mock, llm): (_, Arc<dyn baton_core::llm::Llm>) = match over_the_wire {
        true => {
            let (mock, llm) = common::mock_openai::start(script).await;
            (
                Some(mock),
                Arc::new(baton_llm::Models::new("mock").openai(llm)),
            )
        }
        false => (None, scripted(script)),
    };
    let options = local_options(
        dir.path(),
        llm,
        catalog,
        Arc::new(baton_core::ports::SystemClock),
    );
    (LocalHost::start(options).await, (dir, mock))
}

/// Two tests of `scenario`, one on each host, with the catalog `catalog` makes, whose model
/// answers from `script`: on AWS, a mock OpenAI server behind the provider router; locally,
/// the scripted model, or the mock too with `over_the_wire` first (what is sent on the wire
/// is then checked on both).
macro_rules! on_both_hosts_with {
    (over_the_wire $scenario:ident, $script:expr, $catalog:expr) => {
        on_both_hosts_with!(@ $scenario, $script, $catalog, true);
    };
    ($scenario:ident, $script:expr, $catalog:expr) => {
        on_both_hosts_with!(@ $scenario, $script, $catalog, false);
    };
    (@ $scenario:ident, $script:expr, $catalog:expr, $wire:expr) => {
        mod $scenario {
            use super::*;

            #[tokio::test]
            async fn local() {
                let (mut host, _keep) = local_host_with(&$script, $catalog, $wire).await;
                super::$scenario(&mut host).await;
                host.stop().await;
            }

            #[tokio::test]
            async fn aws() {
                let mut env = super::super::aws_flow::start_routed_env(&$script, $catalog).await;
                super::$scenario(&mut env.host).await;
                env.host.stop().await;
            }
        }
    };
}

/// Two tests of `scenario` (an async function of a `&mut impl TestHost`), one on each host,
/// whose model answers from `script`.
macro_rules! on_both_hosts {
    ($scenario:ident, $script:expr) => {
        mod $scenario {
            use super::*;

            #[tokio::test]
            async fn local() {
                let (mut host, _dir) = local_host(&$script).await;
                super::$scenario(&mut host).await;
                host.stop().await;
            }

            #[tokio::test]
            async fn aws() {
                let mut env = aws_host(&$script).await;
                super::$scenario(&mut env.host).await;
                env.host.stop().await;
            }
        }
    };
}

on_both_hosts!(
    the_full_flow_with_approval_and_choice,
    examples("full-flow.json")
);

async fn the_full_flow_with_approval_and_choice(host: &mut impl TestHost) {
    full_flow(host).await;
}

/// `examples/full-flow.json`'s run: two subagents, an approval and a choice answered through
/// the API, usage summed over the tree; a second answer is refused. Its timeline and
/// version, their times left out (for a comparison of two runs of it, `aws_flow.rs`).
pub(super) async fn full_flow(host: &mut impl TestHost) -> Value {
    let api = host.api();
    let run_id = api
        .post_ok("/runs", json!({"prompt": "Fix and ship"}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();

    let approval = api.pending("approval").await;
    let answer = json!({"kind": "approval", "approved": true, "reason": "looks right"});
    api.post_ok(&answer_path(&approval), answer.clone()).await;

    let choice = api.pending("choice").await;
    assert_eq!(
        choice["options"],
        json!([{"id": "staging", "label": "Staging"}, {"id": "prod", "label": "Production"}])
    );
    let picked = json!({"kind": "choice", "selectedId": "prod"});
    api.post_ok(&answer_path(&choice), picked.clone()).await;

    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "Shipped to the chosen target.");
    assert_eq!(
        entry_types(&run),
        [
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "usage"
        ]
    );
    assert_eq!(
        of_type(&run, "assistant")[0]["text"],
        "Two explorers first."
    );
    let tools = of_type(&run, "tool");
    assert_eq!(
        tools[0]["result"]["output"]["text"],
        "The repo has 3 crates."
    );
    assert_eq!(tools[1]["result"]["output"]["text"], "Patch drafted.");
    assert!(tools[0]["childRunId"].as_str().unwrap().starts_with("sub_"));
    assert_eq!(
        tools[1]["result"]["output"]["totalUsage"]["totalTokens"],
        69
    );
    assert_eq!(tools[2]["result"]["output"], answer);
    assert_eq!(tools[3]["result"]["output"], picked);
    assert_eq!(
        run["usage"],
        json!({"inputTokens": 880, "outputTokens": 85, "totalTokens": 965})
    );
    // The answered question is settled: another answer is refused.
    let (code, v) = api
        .post(
            &answer_path(&choice),
            json!({"kind": "choice", "selectedId": "staging"}),
        )
        .await;
    assert_eq!(code, 409, "{v}");
    let mut shape: Vec<Value> = run["timeline"].as_array().unwrap().clone();
    for e in &mut shape {
        e.as_object_mut().unwrap().remove("at");
    }
    json!({"timeline": shape, "version": run["version"]})
}

fn answer_path(cta: &Value) -> String {
    format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap())
}

on_both_hosts!(
    a_parked_run_survives_a_restart,
    examples("orchestrator.json")
);

/// A run parked on its question is exactly as it was after the host restarts (nothing in
/// memory), and goes on once answered.
async fn a_parked_run_survives_a_restart(host: &mut impl TestHost) {
    let run_id = host.api().post_ok("/runs", json!({"prompt": "go"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cta = host.api().pending("approval").await;
    let before = host.api().status(&run_id, "waiting").await;
    host.restart().await;
    let again = host.api().get_ok(&format!("/runs/{run_id}")).await;
    assert_eq!(again, before, "the parked run is exactly as it was");
    let answer = json!({"kind": "approval", "approved": true});
    host.api().post_ok(&answer_path(&cta), answer).await;
    let run = host.api().status(&run_id, "completed").await;
    assert_eq!(run["result"], "All done.");
}

const PICK: &str = r#"{"orchestrator": [
    {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "choice", "prompt": "Which?", "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]}}]},
    {"text": "ok"}]}"#;

on_both_hosts!(answers_are_validated_and_only_the_first_wins, PICK);

/// An answer that does not fit its question is a 409, a malformed one a 400, an unknown
/// question a 404, each with a JSON error and nothing changed; the first valid answer wins,
/// a second is refused, and the winner posted again is accepted again.
async fn answers_are_validated_and_only_the_first_wins(host: &mut impl TestHost) {
    let api = host.api();
    let run_id = api.post_ok("/runs", json!({"prompt": "pick"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = answer_path(&api.pending("choice").await);
    for body in [
        json!({"kind": "approval", "approved": true}),
        json!({"kind": "choice", "selectedId": "z"}),
    ] {
        let (code, v) = api.post(&path, body.clone()).await;
        assert_eq!(code, 409, "{body} → {v}");
        assert_eq!(v["error"]["code"], "answer_mismatch", "{v}");
    }
    for body in [
        json!({"kind": "choice"}),
        json!({"kind": "vote", "selectedId": "a"}),
        json!({"kind": "choice", "selectedId": "a", "extra": 1}),
        json!("a"),
    ] {
        let (code, v) = api.post(&path, body.clone()).await;
        assert_eq!(code, 400, "{body} → {v}");
        assert_eq!(v["error"]["code"], "invalid_request", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().len() > 5);
    }
    let raw = api
        .http
        .post(format!("{}{path}", api.base))
        .bearer_auth(&api.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    assert_eq!(
        api.get_ok(&path.replace("/response", "")).await["status"],
        "pending"
    );
    assert_eq!(
        api.get_ok(&format!("/runs/{run_id}")).await["status"],
        "waiting"
    );
    let (code, v) = api
        .post(
            "/ctas/cta_nope/response",
            json!({"kind": "choice", "selectedId": "a"}),
        )
        .await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (404, Some("not_found"))
    );

    api.post_ok(&path, json!({"kind": "choice", "selectedId": "b"}))
        .await;
    let (code, v) = api
        .post(&path, json!({"kind": "choice", "selectedId": "a"}))
        .await;
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["error"]["code"], "cta_answered");
    // The answer that won, posted again (a client retrying after a lost reply), is
    // accepted again and changes nothing.
    let v = api
        .post_ok(&path, json!({"kind": "choice", "selectedId": "b"}))
        .await;
    assert_eq!(v["status"], "answered", "{v}");
    let run = api.status(&run_id, "completed").await;
    assert_eq!(
        of_type(&run, "tool")[0]["result"]["output"]["selectedId"],
        "b"
    );
    assert_eq!(of_type(&run, "tool").len(), 1, "one resolution: {run:#}");
}

const APPROVE: &str = r#"{"orchestrator": [{"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "?"}}]}, {"text": "ok"}]}"#;

on_both_hosts!(concurrent_answers_have_exactly_one_winner, APPROVE);

/// Eight different answers posted at once: one is accepted, seven refused, and the run
/// goes on once.
async fn concurrent_answers_have_exactly_one_winner(host: &mut impl TestHost) {
    let api = host.api();
    let run_id = api.post_ok("/runs", json!({"prompt": "go"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = answer_path(&api.pending("approval").await);
    let mut answers = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (api, path) = (api.clone(), path.clone());
        // Each answer its own (the same answer again would be that answer, accepted).
        let body = json!({"kind": "approval", "approved": i % 2 == 0, "reason": format!("#{i}")});
        answers.spawn(async move { api.post(&path, body).await.0 });
    }
    let codes: Vec<u16> = answers.join_all().await;
    assert_eq!(codes.iter().filter(|c| **c == 202).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 409).count(), 7, "{codes:?}");
    let run = api.status(&run_id, "completed").await;
    assert_eq!(
        of_type(&run, "assistant").len(),
        2,
        "the run resumed exactly once"
    );
}

// The model says "Shipped." to whatever it is asked (the mock OpenAI server picks its reply
// by the conversation's replies so far, the scripted model by the run's thinks).
on_both_hosts!(
    a_blank_turn_gets_the_clarifying_reply_without_a_model_call,
    r#"{"orchestrator": [{"text": "Shipped."}, {"text": "Shipped."}, {"text": "Shipped."}]}"#
);

/// A blank prompt, and a blank follow-up, are each answered with the agent's clarifying
/// reply, as a reply of its own and without a model call (the model would have said
/// "Shipped."); a follow-up with words is the model's; a message with neither text nor
/// trigger is still refused.
async fn a_blank_turn_gets_the_clarifying_reply_without_a_model_call(host: &mut impl TestHost) {
    let api = host.api();
    let clarifying = baton_core::agent::DEFAULT_CLARIFYING_REPLY;
    let run_id = api.post_ok("/runs", json!({"prompt": "  \n "})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], clarifying);
    assert_eq!(entry_types(&run), ["user", "assistant", "usage"]);
    let reply = &of_type(&run, "assistant")[0];
    assert_eq!(reply["usage"]["totalTokens"], 0, "{reply}");
    assert!(reply.get("model").is_none(), "{reply}");
    assert_eq!(run["usage"]["totalTokens"], 0);

    let messages = format!("/runs/{run_id}/messages");
    let turns = async |n: usize| {
        api.wait("the turn", async |api: &common::aws::Api| {
            let run = api.get_ok(&format!("/runs/{run_id}")).await;
            (of_type(&run, "usage").len() >= n && run["status"] == "completed").then_some(run)
        })
        .await
    };
    api.post_ok(&messages, json!({"text": ""})).await;
    let run = turns(2).await;
    assert_eq!(run["result"], clarifying);
    api.post_ok(&messages, json!({"text": "Ship v2"})).await;
    let run = turns(3).await;
    assert_eq!(run["result"], "Shipped.");
    let (code, v) = api.post(&messages, json!({})).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
}

// The agent's model and first fallback are down (503s past the client's retries on AWS,
// an outage in the script locally): the second fallback answers.
on_both_hosts_with!(
    a_model_outage_falls_back_to_the_next_model,
    r#"{"orchestrator": [{"down": ["openai:primary", "openai:backup"], "text": "Answered by the spare.",
        "usage": {"inputTokens": 1000000, "outputTokens": 1000000, "totalTokens": 2000000}}]}"#,
    catalog(Some(json!({
        "agents": {"orchestrator": {"system": "agent:orchestrator", "tools": [],
            "model": "openai:primary", "fallbackModels": ["openai:backup", "openai:spare"]}},
        "prices": {"openai:primary": {"input": 1.0, "output": 1.0},
                   "openai:backup": {"input": 2.0, "output": 2.0},
                   "openai:spare": {"input": 3.0, "output": 5.0}}
    })))
);

/// The reply is the last fallback's, priced by its model, and its entry names the models
/// that failed before it, in order, with why.
async fn a_model_outage_falls_back_to_the_next_model(host: &mut impl TestHost) {
    let api = host.api();
    let run_id = api.post_ok("/runs", json!({"prompt": "Ship it"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "Answered by the spare.");
    let reply = &of_type(&run, "assistant")[0];
    assert_eq!(reply["model"], "openai:spare", "{reply}");
    assert_eq!(reply["costUsd"], 8.0, "$3 + $5 for a million each: {reply}");
    let failed: Vec<&str> = reply["fallbacks"]
        .as_array()
        .expect("fallbacks")
        .iter()
        .map(|f| f["model"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["openai:primary", "openai:backup"], "{reply}");
    for f in reply["fallbacks"].as_array().unwrap() {
        let why = f["error"].as_str().unwrap();
        assert!(why.contains("gave up after 3 attempts"), "{why}");
    }
    assert_eq!(run["total"]["costUsd"], 8.0, "{}", run["total"]);
}

// The model first answers in words, then in the schema's shape (in a fence, as models do).
on_both_hosts_with!(
    a_final_answer_of_the_wrong_shape_is_asked_again,
    r#"{"orchestrator": [{"text": "We should ship: the tests pass."},
        {"text": "```json\n{\"verdict\": \"ship\", \"reasons\": [\"the tests pass\"]}\n```"}]}"#,
    catalog(Some(
        json!({"agents": {"orchestrator": {"system": "agent:orchestrator", "tools": [],
        "outputSchema": {"type": "object", "required": ["verdict", "reasons"],
            "properties": {"verdict": {"enum": ["ship", "hold"]},
                           "reasons": {"type": "array", "items": {"type": "string"}}}}}}})
    ))
);

/// An answer that is not the schema's JSON is sent back to the model, told why; the one
/// that matches is the run's result, and its `output` as JSON.
async fn a_final_answer_of_the_wrong_shape_is_asked_again(host: &mut impl TestHost) {
    let api = host.api();
    let run_id = api
        .post_ok("/runs", json!({"prompt": "Ship or hold?"}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = api.status(&run_id, "completed").await;
    assert_eq!(
        run["output"],
        json!({"verdict": "ship", "reasons": ["the tests pass"]}),
        "{run}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(run["result"].as_str().unwrap()).unwrap(),
        run["output"]
    );
    assert_eq!(of_type(&run, "assistant").len(), 2);
    let told = of_type(&run, "user");
    let note = told.last().unwrap()["text"].as_str().unwrap();
    assert!(note.contains("it is not JSON"), "{note}");
}

// The first reply must be a call (`required`), the next may answer; both reason hard.
on_both_hosts_with!(
    over_the_wire tool_choice_holds_for_a_turns_first_reply_and_reasoning_is_priced_as_output,
    r#"{"orchestrator": [
        {"expect": {"tool_choice": "required", "reasoning_effort": "high"},
         "tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}],
         "usage": {"inputTokens": 0, "outputTokens": 1000000, "reasoningTokens": 600000, "totalTokens": 1000000}},
        {"expect": {"tool_choice": null, "reasoning_effort": "high"}, "text": "Echoed.",
         "usage": {"inputTokens": 0, "outputTokens": 1000000, "reasoningTokens": 900000, "totalTokens": 1000000}}
    ]}"#,
    catalog(Some(json!({
        "agents": {"orchestrator": {"system": "agent:orchestrator", "tools": ["echo"],
            "model": "openai:thinker", "toolChoice": "required",
            "reasoning": {"effort": "high"}}},
        "prices": {"openai:thinker": {"input": 1.0, "output": 10.0}}
    })))
);

/// The agent's `required` goes with the turn's first call, and no choice (the provider's
/// `auto`) with the next, or the turn could not end; its reasoning effort with both. Reasoning tokens are shown, and
/// priced in the output: $10 a reply.
async fn tool_choice_holds_for_a_turns_first_reply_and_reasoning_is_priced_as_output(
    host: &mut impl TestHost,
) {
    let api = host.api();
    let run_id = api.post_ok("/runs", json!({"prompt": "Echo hi"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "Echoed.", "{run}");
    let replies = of_type(&run, "assistant");
    assert_eq!(replies[0]["usage"]["reasoningTokens"], 600000);
    assert_eq!(replies[1]["usage"]["reasoningTokens"], 900000);
    assert_eq!(replies[1]["costUsd"], 10.0, "{}", replies[1]);
    assert_eq!(run["total"]["costUsd"], 20.0, "{}", run["total"]);
    assert_eq!(run["total"]["usage"]["reasoningTokens"], 1500000);
}

/// A plugin that keeps notes, and counts the iterations it prepared.
struct Notes;

#[derive(serde::Serialize, serde::Deserialize, Default)]
struct NotesState {
    notes: Vec<String>,
    prepared: u32,
}

#[async_trait::async_trait]
impl baton_core::agent::Plugin for Notes {
    type State = NotesState;

    fn name(&self) -> &str {
        "notes"
    }

    async fn prepare(
        &self,
        _: baton_core::run::RunView<'_>,
        _: &[baton_core::timeline::Entry],
        state: &mut NotesState,
    ) -> Result<baton_core::agent::Prepared, baton_core::agent::PluginError> {
        state.prepared += 1;
        Ok(baton_core::agent::Prepared::new()
            .context(format!("Notes so far: {}", state.notes.join("; "))))
    }
}

/// A tool that adds a note to the `notes` plugin's state, and shows it as a widget with a
/// fallback line. It changes nothing outside the run: it runs in the delivery that thinks
/// next, before the plugin prepares that think.
struct Remember;

#[async_trait::async_trait]
impl baton_core::tools::Tool for Remember {
    fn name(&self) -> &str {
        "remember"
    }
    fn description(&self) -> &str {
        "Remember a note."
    }
    fn schema(&self) -> Value {
        json!({"type": "object", "required": ["note"], "properties": {"note": {"type": "string"}}})
    }
    fn effects(&self) -> baton_core::tools::Effects {
        baton_core::tools::Effects::None
    }
    async fn execute(
        &self,
        ctx: &baton_core::tools::ToolContext,
        input: Value,
    ) -> Result<Value, baton_core::tools::ToolError> {
        let note = input["note"].as_str().unwrap_or_default().to_owned();
        let mut state: NotesState = ctx.plugin_state("notes")?;
        state.notes.push(note.clone());
        ctx.set_plugin_state("notes", &state)?;
        ctx.widget_with_fallback("note", json!({"note": note}), &format!("Noted: {note}"))?;
        Ok(json!({"notes": state.notes.len()}))
    }
}

fn notes_catalog() -> Arc<baton_core::agent::Catalog> {
    let file: baton_core::agent::AgentsFile = serde_json::from_value(json!({"agents": {
        "orchestrator": {"system": "agent:orchestrator", "tools": ["remember"]}}}))
    .unwrap();
    let tools: Vec<Arc<dyn baton_core::tools::Tool>> = vec![Arc::new(Remember)];
    Arc::new(
        baton_core::agent::Catalog::new(baton_core::agent::Limits::default(), tools, Some(file))
            .unwrap()
            .with_plugin("orchestrator", Notes),
    )
}

on_both_hosts_with!(
    a_tools_plugin_state_commits_with_its_output_and_the_next_prepare_reads_it,
    r#"{"orchestrator": [
        {"tool_calls": [{"name": "remember", "arguments": {"note": "deploy friday"}}]},
        {"tool_calls": [{"name": "remember", "arguments": {"note": "tell ops"}}]},
        {"text": "Noted."}]}"#,
    notes_catalog()
);

/// Each call's note is in the plugin's state after it, and the plugin's next `prepare`
/// reads it (had it read the state before the call, it would have written it back without
/// the note); the widgets carry their fallback lines.
async fn a_tools_plugin_state_commits_with_its_output_and_the_next_prepare_reads_it(
    host: &mut impl TestHost,
) {
    let api = host.api();
    let run_id = api
        .post_ok("/runs", json!({"prompt": "Remember two things"}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = api.status(&run_id, "completed").await;
    assert_eq!(
        run["pluginState"]["notes"],
        json!({"notes": ["deploy friday", "tell ops"], "prepared": 3}),
        "{run}"
    );
    let widgets: Vec<&Value> = of_type(&run, "widget")
        .into_iter()
        .map(|w| &w["fallback"])
        .collect();
    assert_eq!(
        widgets,
        [&json!("Noted: deploy friday"), &json!("Noted: tell ops")]
    );
}

// The planner's first plan leaves out the project's creation; its second has every step.
on_both_hosts_with!(
    a_plan_without_its_contexts_required_steps_goes_back_to_the_planner,
    r#"{"orchestrator": [
          {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"prompt": "Create the project"}}]},
          {"text": "Project created."}],
        "planner": [
          {"text": "{\"steps\": [{\"id\": \"find\", \"agent\": \"template_finder\", \"prompt\": \"find\"}, {\"id\": \"doc\", \"agent\": \"context_writer\", \"prompt\": \"write\"}]}"},
          {"text": "{\"steps\": [{\"id\": \"find\", \"agent\": \"template_finder\", \"prompt\": \"find\"}, {\"id\": \"create\", \"agent\": \"project_creator\", \"prompt\": \"create\"}, {\"id\": \"doc\", \"agent\": \"context_writer\", \"prompt\": \"write\"}]}"}],
        "template_finder": [{"text": "template T1"}],
        "project_creator": [{"text": "project P1"}],
        "context_writer": [{"text": "the context document"}]}"#,
    catalog(Some(json!({"agents": {
        "orchestrator": {"system": "agent:orchestrator", "tools": ["agent_orchestrate"],
            "planRequirements": {"project_create": [
                {"agent": "template_finder", "purpose": "template discovery"},
                {"agent": "template_maker", "optional": true, "purpose": "a new template"},
                {"agent": "project_creator", "purpose": "create_onto_project"},
                {"agent": "context_writer", "purpose": "the context document"}]}},
        "planner": {"system": "agent:planner", "tools": []},
        "template_finder": {"system": "agent:template_finder", "tools": []},
        "template_maker": {"system": "agent:template_maker", "tools": []},
        "project_creator": {"system": "agent:project_creator", "tools": []},
        "context_writer": {"system": "agent:context_writer", "tools": []}}})))
);

/// A run whose context is a `project_create`: the planner is told the steps its plan must
/// include; its plan without one is sent back saying which, and the corrected plan runs.
async fn a_plan_without_its_contexts_required_steps_goes_back_to_the_planner(
    host: &mut impl TestHost,
) {
    let api = host.api();
    let body =
        json!({"prompt": "Create project P", "context": {"type": "project_create", "id": "P"}});
    let run_id = api.post_ok("/runs", body).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = api.status(&run_id, "completed").await;
    let call = &of_type(&run, "tool")[0];
    let out = &call["result"]["output"];
    assert_eq!(out["success"], true, "{call}");
    let ran: Vec<&str> = out["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ran, ["find", "create", "doc"]);
    let planner_id = call["plan"]["plannerRunId"].as_str().expect("planner run");
    let planner = api.get_ok(&format!("/runs/{planner_id}")).await;
    let told: Vec<&str> = of_type(&planner, "user")
        .iter()
        .map(|u| u["text"].as_str().unwrap())
        .collect();
    assert_eq!(told.len(), 2, "{planner}");
    assert!(
        told[0].contains("2. a step of agent `template_maker` (optional): a new template"),
        "{}",
        told[0]
    );
    assert!(
        told[1].contains(
            "it has no step of agent `project_creator` after its step of `template_finder`"
        ),
        "{}",
        told[1]
    );
}

// The model drafts, asks in its own words, and runs the draft once the person says so.
on_both_hosts_with!(
    a_draft_is_told_to_the_model_and_run_when_the_person_confirms,
    r#"{"orchestrator": [
          {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"execution_mode": "draft_only",
              "plan": {"steps": [{"id": "map", "agent": "explore", "prompt": "Map the API"}]}}}]},
          {"text": "I would have explore map the API. Shall I run it?"},
          {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"execution_mode": "auto_execute",
              "plan": {"steps": [{"id": "map", "agent": "explore", "prompt": "Map the API"}]}}}]},
          {"text": "Mapped: 4 endpoints."}],
        "explore": [{"text": "4 endpoints"}]}"#,
    catalog(Some(json!({"agents": {
        "orchestrator": {"system": "agent:orchestrator", "tools": ["agent_orchestrate"]},
        "explore": {"system": "agent:explore", "tools": []}}})))
);

/// No question is raised for the draft: its call's result is the plan, the turn ends with
/// the model's question, and "run it" runs it.
async fn a_draft_is_told_to_the_model_and_run_when_the_person_confirms(host: &mut impl TestHost) {
    let api = host.api();
    let run_id = api.post_ok("/runs", json!({"prompt": "Map the API"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = api.status(&run_id, "completed").await;
    assert_eq!(
        run["result"],
        "I would have explore map the API. Shall I run it?"
    );
    let draft = &of_type(&run, "tool")[0];
    assert_eq!(draft["result"]["output"]["status"], "draft", "{draft}");
    assert!(draft.get("cta").is_none(), "{draft}");
    let ctas = api.get_ok("/ctas?status=all").await;
    assert_eq!(ctas["ctas"].as_array().map(Vec::len), Some(0), "{ctas}");
    api.post_ok(
        &format!("/runs/{run_id}/messages"),
        json!({"text": "run it"}),
    )
    .await;
    let run = api
        .wait("the plan to run", async |api: &common::aws::Api| {
            let run = api.get_ok(&format!("/runs/{run_id}")).await;
            (run["result"] == "Mapped: 4 endpoints.").then_some(run)
        })
        .await;
    let ran = &of_type(&run, "tool")[1]["result"]["output"];
    assert_eq!(ran["steps"][0]["outputs"], "4 endpoints", "{ran}");
}

// The orchestrator asks the triager's `classify` action with a bad input, then a good one,
// then in a plan; the triager answers in words first, then in the output's shape.
on_both_hosts_with!(
    an_actions_input_and_output_are_checked_on_both_sides_of_the_child,
    r#"{"orchestrator": [
          {"tool_calls": [{"name": "spawn_subagent", "arguments": {"agent": "triager", "action": "classify", "input": {}}}]},
          {"tool_calls": [{"name": "spawn_subagent", "arguments": {"agent": "triager", "action": "classify", "input": {"ticket": "DB down"}}}]},
          {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"plan": {"steps": [
              {"id": "c", "agent": "triager", "action": "classify", "with": {"ticket": "disk full"}, "result_key": "c"},
              {"id": "r", "agent": "reporter", "prompt": "Report a {{result.c.severity}} ticket"}]}}}]},
          {"text": "Triaged."}],
        "triager": [{"text": "It is serious."}, {"text": "{\"severity\": \"high\"}"}],
        "reporter": [{"text": "Reported."}]}"#,
    catalog(Some(json!({"agents": {
        "orchestrator": {"system": "agent:orchestrator", "tools": ["spawn_subagent", "agent_orchestrate"]},
        "reporter": {"system": "agent:reporter", "tools": []},
        "triager": {"system": "agent:triager", "tools": [], "actions": {"classify": {
            "prompt": "Classify the ticket.",
            "inputSchema": {"type": "object", "required": ["ticket"],
                            "properties": {"ticket": {"type": "string"}}},
            "outputSchema": {"type": "object", "required": ["severity"],
                             "properties": {"severity": {"enum": ["low", "high"]}}}}}}}})))
);

/// A bad input starts no child (the model is told why); a good one starts the child with the
/// action's prompt and the input; the child's answer in words is sent back to it, and its
/// answer in the schema's shape is the parent's `output` — in a plan, bound as JSON.
async fn an_actions_input_and_output_are_checked_on_both_sides_of_the_child(
    host: &mut impl TestHost,
) {
    let api = host.api();
    let run_id = api.post_ok("/runs", json!({"prompt": "Triage"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = api.status(&run_id, "completed").await;
    let tools = of_type(&run, "tool");
    let refused = &tools[0]["result"];
    assert_eq!(refused["status"], "error", "{refused}");
    let why = refused["error"].as_str().unwrap();
    assert!(
        why.contains("the input of action `classify` does not match its schema"),
        "{why}"
    );
    assert!(
        tools[0].get("childRunId").is_none(),
        "no child: {}",
        tools[0]
    );
    let asked = &tools[1]["result"]["output"];
    assert_eq!(asked["output"], json!({"severity": "high"}), "{asked}");
    let child = api
        .get_ok(&format!("/runs/{}", asked["subagentId"].as_str().unwrap()))
        .await;
    let told = of_type(&child, "user");
    let first = told[0]["text"].as_str().unwrap();
    assert!(first.starts_with("Classify the ticket."), "{first}");
    assert!(first.contains("\"ticket\": \"DB down\""), "{first}");
    assert!(
        told[1]["text"].as_str().unwrap().contains("it is not JSON"),
        "{child}"
    );
    assert_eq!(child["output"], json!({"severity": "high"}));
    let plan = &tools[2]["result"]["output"];
    assert_eq!(
        plan["steps"][0]["outputs"],
        json!({"severity": "high"}),
        "{plan}"
    );
    let reporter = api
        .get_ok(&format!(
            "/runs/{}",
            plan["steps"][1]["exec_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        of_type(&reporter, "user")[0]["text"],
        "Report a high ticket"
    );
}

/// A tool that returns a chart as a PNG file.
struct Snapshot;

#[async_trait::async_trait]
impl baton_core::tools::Tool for Snapshot {
    fn name(&self) -> &str {
        "snapshot"
    }
    fn description(&self) -> &str {
        "Draw the chart."
    }
    fn schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn effects(&self) -> baton_core::tools::Effects {
        baton_core::tools::Effects::None
    }
    async fn execute(
        &self,
        ctx: &baton_core::tools::ToolContext,
        _: Value,
    ) -> Result<Value, baton_core::tools::ToolError> {
        let png = b"\x89PNG\r\n\x1a\n a chart".to_vec();
        ctx.file("chart.png", "image/png", png, "a line rising from 1 to 3")?;
        Ok(json!({"drawn": true}))
    }
}

fn snapshot_catalog() -> Arc<baton_core::agent::Catalog> {
    let file: baton_core::agent::AgentsFile = serde_json::from_value(json!({"agents": {
        "orchestrator": {"system": "agent:orchestrator", "tools": ["snapshot"], "vision": true},
        "reader": {"system": "agent:reader", "tools": ["snapshot"]}}}))
    .unwrap();
    let tools: Vec<Arc<dyn baton_core::tools::Tool>> = vec![Arc::new(Snapshot)];
    Arc::new(
        baton_core::agent::Catalog::new(baton_core::agent::Limits::default(), tools, Some(file))
            .unwrap(),
    )
}

// Each agent draws the chart, then answers: the mock refuses a request without the image it
// expects (one for the agent that sees, none for the other).
on_both_hosts_with!(
    over_the_wire a_tools_image_reaches_a_model_that_sees_and_only_its_summary_one_that_does_not,
    r#"{"orchestrator": [{"tool_calls": [{"name": "snapshot", "arguments": {}}]},
                         {"expectImages": 1, "text": "The line rises."}],
        "reader": [{"tool_calls": [{"name": "snapshot", "arguments": {}}]},
                   {"expectImages": 0, "text": "A chart was drawn."}]}"#,
    snapshot_catalog()
);

async fn a_tools_image_reaches_a_model_that_sees_and_only_its_summary_one_that_does_not(
    host: &mut impl TestHost,
) {
    let api = host.api();
    for (agent, said) in [
        ("orchestrator", "The line rises."),
        ("reader", "A chart was drawn."),
    ] {
        let body = json!({"prompt": "How does the chart go?", "agent": agent});
        let run_id = api.post_ok("/runs", body).await["runId"]
            .as_str()
            .unwrap()
            .to_owned();
        let run = api.status(&run_id, "completed").await;
        assert_eq!(run["result"], said, "{run}");
        assert_eq!(of_type(&run, "file")[0]["mediaType"], "image/png");
    }
}
