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
