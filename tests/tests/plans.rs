//! Plans end to end, over HTTP, on `baton dev` and over AWS APIs (an emulator:
//! `common/aws.rs`): a scripted orchestrator drafts a two-stage plan (two parallel steps,
//! then one that binds both results); a human approves it through the API; the last step's
//! agent asks the human a question, which shows in the root run's timeline and in `GET /ctas?rootRunId=`; the run
//! finishes with the merged result.

use crate::common;

use std::time::{Duration, Instant};

use baton_dev::AwsDevServer;
use common::aws::{Api, Emulator};
use common::fault::Faults;
use common::*;
use serde_json::{Value, json};

const SCRIPT: &str = r#"{
  "orchestrator": [
    {"tool_calls": [{"name": "agent_orchestrate", "arguments": {
      "execution_mode": "draft_only",
      "plan": {"steps": [
        {"id": "research", "parallel": [
          {"id": "api", "agent": "explore", "prompt": "Read the API", "result_key": "api"},
          {"id": "tests", "agent": "code", "prompt": "Read the tests", "result_key": "tests"}
        ]},
        {"id": "report", "agent": "writer", "prompt": "Merge: {{result.api}} | {{result.tests}}",
         "result_key": "report"}
      ]}}}]},
    {"text": "Report written."}
  ],
  "explore": [{"text": "API ok"}],
  "code": [{"text": "tests ok"}],
  "writer": [
    {"tool_calls": [{"name": "request_human_feedback",
                     "arguments": {"kind": "text", "prompt": "Which format?"}}]},
    {"text": "Report (markdown): API ok + tests ok"}
  ]
}"#;

/// The writer, and an orchestrator whose drafts are approved on a question (not in the
/// conversation, the default).
fn agents() -> Value {
    json!({"agents": {
        "writer": {"tools": ["request_human_feedback"]},
        "orchestrator": {"planApproval": "question",
            "tools": ["spawn_subagent", "request_human_feedback", "agent_orchestrate"]}}})
}

/// `baton dev --aws` over `aws` (through its fault layer, if any, once the resources
/// exist), its resources named by `prefix`, thinking with `script`.
async fn aws_host(aws: &Emulator, prefix: &str, script: &str) -> AwsDevServer {
    aws.dev_host(prefix, scripted(script), catalog(Some(agents())))
        .await
}

/// A client of either host's API at `base`: under the scenario's faults a 503 is tried again
/// as a careful client does; a wait is long enough for a timer that keeps AWS's precision
/// (two minutes after its time).
fn client(base: String) -> Api {
    let mut api = Api::new(base);
    api.retry_busy = common::aws::scenario_faults().is_some();
    api.patience = Duration::from_secs(200);
    api.every = Duration::from_millis(50);
    api
}

/// The plan call's timeline entry.
fn plan_entry(run: &Value) -> Value {
    of_type(run, "tool")
        .into_iter()
        .find(|t| t["name"] == "agent_orchestrate")
        .cloned()
        .expect("the plan call")
}

async fn plan_flow(c: &Api) -> Value {
    let run_id = c
        .post_ok("/runs", json!({"prompt": "Write the report"}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();

    // Drafted: an approval CTA that carries the plan, and nothing runs yet.
    let approval = c.pending("approval").await;
    assert_eq!(approval["runId"], run_id.as_str());
    assert_eq!(approval["gated"]["tool"], "agent_orchestrate");
    assert_eq!(
        approval["gated"]["input"]["plan"]["steps"][1]["id"],
        "report"
    );
    let run = c.get_ok(&format!("/runs/{run_id}")).await;
    assert_eq!(run["state"], "waiting_on_user", "{run:#}");
    assert_eq!(plan_entry(&run)["plan"]["phase"], "awaiting_approval");
    assert!(plan_entry(&run)["plan"]["steps"]["api"]["childRunId"].is_null());
    c.post_ok(
        &format!("/ctas/{}/response", approval["ctaId"].as_str().unwrap()),
        json!({"kind": "approval", "approved": true}),
    )
    .await;

    // The last step's agent asks; the root hears it, and lists it.
    let question = c.pending("text").await;
    assert_eq!(question["prompt"], "Which format?");
    assert_eq!(question["rootRunId"], run_id.as_str());
    let under = c
        .get_ok(&format!("/ctas?status=pending&rootRunId={run_id}"))
        .await;
    assert_eq!(under["ctas"][0]["ctaId"], question["ctaId"]);
    let run = c
        .wait("the root to hear the question", async |c: &Api| {
            let run = c.get_ok(&format!("/runs/{run_id}")).await;
            (run["waitingCtas"][0]["ctaId"] == question["ctaId"]).then_some(run)
        })
        .await;
    // A plan under way, its details: which call, how many of its steps are done.
    assert_eq!(run["state"], "executing_plan");
    assert_eq!(run["stateDetail"]["done"], 2, "{}", run["stateDetail"]);
    assert_eq!(run["stateDetail"]["total"], 3, "{}", run["stateDetail"]);
    assert!(run["stateDetail"]["callId"].is_string());
    assert!(
        of_type(&run, "notice")
            .iter()
            .any(|n| n["code"] == "subagent_waiting"
                && n["message"].as_str().unwrap().contains("Which format?")),
        "{run:#}"
    );
    c.post_ok(
        &format!("/ctas/{}/response", question["ctaId"].as_str().unwrap()),
        json!({"kind": "text", "text": "markdown"}),
    )
    .await;

    let run = c
        .wait("the run to complete", async |c: &Api| {
            let run = c.get_ok(&format!("/runs/{run_id}")).await;
            (run["status"] == "completed").then_some(run)
        })
        .await;
    assert_eq!(run["result"], "Report written.");
    // A fork cannot start at a plan's approval: 409 `not_forkable`, as documented.
    let at = plan_entry(&run)["seq"].as_u64().unwrap();
    let (code, v) = c
        .call(
            reqwest::Method::POST,
            &format!("/runs/{run_id}/fork"),
            Some(json!({"atSeq": at})),
        )
        .await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("not_forkable")),
        "{v}"
    );
    let out = plan_entry(&run)["result"]["output"].clone();
    assert_eq!(out["success"], true, "{out:#}");
    assert_eq!(out["steps"][0]["type"], "parallel");
    assert_eq!(
        out["steps"][0]["outputs"],
        json!({"api": "API ok", "tests": "tests ok"})
    );
    assert_eq!(
        out["bindings"]["report"],
        "Report (markdown): API ok + tests ok"
    );
    // The last step's child run started from both results, and every step's child is a run
    // of its own, finished, under the root.
    let report = out["steps"][1]["exec_id"].as_str().unwrap();
    let child = c.get_ok(&format!("/runs/{report}")).await;
    assert_eq!(
        child["timeline"][0]["text"], "Merge: API ok | tests ok",
        "{child:#}"
    );
    for exec in [
        out["steps"][0]["children"][0]["exec_id"].as_str().unwrap(),
        out["steps"][0]["children"][1]["exec_id"].as_str().unwrap(),
        report,
    ] {
        let child = c.get_ok(&format!("/runs/{exec}")).await;
        assert_eq!(child["status"], "completed", "{child:#}");
        assert_eq!(child["rootRunId"], run_id.as_str());
    }
    // Ids quoted in text (the notice names the child and the CTA) differ from run to run.
    let ids = regex::Regex::new(r"(run|sub|cta)_[0-9a-f]{32}").unwrap();
    let text = normalize(&run["timeline"], &run_id).to_string();
    serde_json::from_str(&ids.replace_all(&text, "${1}_X")).unwrap()
}

#[tokio::test]
async fn a_drafted_plan_is_approved_runs_in_two_stages_and_its_question_reaches_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path(), scripted(SCRIPT), catalog(Some(agents()))).await;
    let c = client(h.url(""));
    let local = plan_flow(&c).await;
    // The plan's events, in the order a UI would show them.
    let (_, events) = h.get("/events?limit=1000").await;
    let all = events["events"].as_array().unwrap();
    let types: Vec<&str> = all
        .iter()
        .filter_map(|e| e["detailType"].as_str())
        .filter(|t| t.starts_with("plan.") && *t != "plan.phase")
        .collect();
    // Each move of the plan's state machine, on the bus (and so in traces and metrics).
    let phases: Vec<String> = all
        .iter()
        .filter(|e| e["detailType"] == "plan.phase")
        .map(|e| {
            format!(
                "{} -> {}",
                e["detail"]["from"].as_str().unwrap_or("-"),
                e["detail"]["to"]
            )
        })
        .collect();
    assert_eq!(
        phases,
        [
            "- -> \"awaiting_approval\"",
            "awaiting_approval -> \"dispatching\"",
            "dispatching -> \"awaiting_results\"",
            "awaiting_results -> \"dispatching\"",
            "dispatching -> \"awaiting_results\"",
            "awaiting_results -> \"merging\"",
            "merging -> \"done\""
        ]
    );
    assert_eq!(
        types.iter().filter(|t| **t == "plan.step.started").count(),
        3
    );
    assert_eq!(types.first(), Some(&"plan.created"));
    assert_eq!(types.get(1), Some(&"plan.ready_for_review"));
    assert_eq!(types.last(), Some(&"plan.completed"));
    h.server.shutdown().await;

    // The same flow over AWS APIs ends with the same timeline.
    let aws = Emulator::scenario().await;
    let s = aws_host(&aws, "plans", SCRIPT).await;
    let c = client(s.url());
    let aws = plan_flow(&c).await;
    assert_eq!(aws, local);
    s.shutdown().await;
}

/// A drafted plan confirmed in the conversation (seed 001): the person writes "looks good,
/// run it" instead of answering the plan's question; the question is withdrawn, the model
/// reads its plan back with the follow-up, and runs it. On both hosts.
const CONFIRM_SCRIPT: &str = r#"{
  "orchestrator": [
    {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"execution_mode": "draft_only",
      "plan": {"steps": [{"id": "api", "agent": "explore", "prompt": "Read the API"}]}}}]},
    {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"execution_mode": "auto_execute",
      "plan": {"steps": [{"id": "api", "agent": "explore", "prompt": "Read the API"}]}}}]},
    {"text": "Ran it."}
  ],
  "explore": [{"text": "API ok"}]
}"#;

async fn confirmed_in_conversation(c: &Api) -> Value {
    let run_id = c
        .post_ok("/runs", json!({"prompt": "Look at the API"}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cta = c.pending("approval").await;
    let waiting = c.get_ok(&format!("/runs/{run_id}")).await;
    assert_eq!(waiting["stateDetail"]["draftPlans"], true, "{waiting}");
    let posted = c
        .post_ok(
            &format!("/runs/{run_id}/messages"),
            json!({"text": "looks good, run it"}),
        )
        .await;
    assert_eq!(posted["queued"], false, "taken at once: {posted}");
    let done = c.status(&run_id, "completed").await;
    assert_eq!(done["result"], "Ran it.");
    let cta = c
        .get_ok(&format!("/ctas/{}", cta["ctaId"].as_str().unwrap()))
        .await;
    assert_eq!(
        cta["status"], "cancelled",
        "the question was withdrawn: {cta}"
    );
    let plans: Vec<Value> = of_type(&done, "tool")
        .into_iter()
        .filter(|t| t["name"] == "agent_orchestrate")
        .cloned()
        .collect();
    assert_eq!(plans.len(), 2, "{done}");
    assert_eq!(plans[0]["result"]["output"]["status"], "held_for_review");
    assert_eq!(plans[0]["plan"]["review"]["by"], "conversation");
    assert_eq!(
        plans[1]["result"]["output"]["steps"][0]["outputs"],
        "API ok"
    );
    assert!(
        of_type(&done, "user")
            .iter()
            .any(|u| u["text"] == "looks good, run it"),
        "{done}"
    );
    assert!(of_type(&done, "queued").is_empty(), "{done}");
    normalize(&done["timeline"], &run_id)
}

#[tokio::test]
async fn a_drafted_plan_confirmed_in_the_conversation_runs_on_both_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(
        dir.path(),
        scripted(CONFIRM_SCRIPT),
        catalog(Some(agents())),
    )
    .await;
    let local = confirmed_in_conversation(&client(h.url(""))).await;
    h.server.shutdown().await;
    let aws = Emulator::scenario().await;
    let s = aws_host(&aws, "confirm", CONFIRM_SCRIPT).await;
    let on_aws = confirmed_in_conversation(&client(s.url())).await;
    assert_eq!(on_aws, local);
    s.shutdown().await;
}

/// A plan whose one step asks a human and times out after three seconds.
const TIMEOUT_SCRIPT: &str = r#"{
  "orchestrator": [
    {"tool_calls": [{"name": "agent_orchestrate", "arguments": {"timeout_ms": 3000,
      "plan": [{"id": "ask", "agent": "writer", "prompt": "Ask which format"}]}}]},
    {"text": "No answer in time; moving on."}
  ],
  "writer": [{"tool_calls": [{"name": "request_human_feedback",
                              "arguments": {"kind": "text", "prompt": "Which format?"}}]}]
}"#;

/// Checks the end of the timed-out plan: the step failed as timed out, its child cancelled
/// (its question with it), and the orchestrator went on.
async fn timed_out(c: &Api, run_id: &str) {
    let run = c
        .wait("the run to complete", async |c: &Api| {
            let run = c.get_ok(&format!("/runs/{run_id}")).await;
            (run["status"] == "completed").then_some(run)
        })
        .await;
    assert_eq!(run["result"], "No answer in time; moving on.");
    let step = &plan_entry(&run)["result"]["output"]["steps"][0];
    assert_eq!(step["status"], "failed", "{step:#}");
    assert!(step["error"].as_str().unwrap().starts_with("timed out"));
    let child = step["exec_id"].as_str().unwrap().to_owned();
    let child = c
        .wait("the step's child to be cancelled", async |c: &Api| {
            let run = c.get_ok(&format!("/runs/{child}")).await;
            (run["status"] == "cancelled").then_some(run)
        })
        .await;
    let question = &of_type(&child, "tool")[0]["cta"];
    assert_eq!(question["status"], "cancelled", "{child:#}");
}

#[tokio::test]
async fn a_step_past_its_timeout_is_stopped_by_a_real_timer_on_both_hosts() {
    // baton dev: the worker's timer loop fires it.
    let dir = tempfile::tempdir().unwrap();
    let h = start(
        dir.path(),
        scripted(TIMEOUT_SCRIPT),
        catalog(Some(agents())),
    )
    .await;
    let c = client(h.url(""));
    let run_id = c.post_ok("/runs", json!({"prompt": "go"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    timed_out(&c, &run_id).await;
    h.server.shutdown().await;

    // AWS: the step's one-time schedule puts `timer.fired` on the bus (the emulator keeps
    // the schedule but never fires it, so the test puts the event as the schedule would,
    // with no fault layer firing it too).
    let aws = Emulator::start_with(None).await;
    let sdk = aws.sdk().await;
    let s = aws_host(&aws, "plantimer", TIMEOUT_SCRIPT).await;
    let c = client(s.url());
    let run_id = c.post_ok("/runs", json!({"prompt": "go"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    c.pending("text").await;
    let run = c.get_ok(&format!("/runs/{run_id}")).await;
    let timer = plan_entry(&run)["plan"]["steps"]["ask"]["timerId"]
        .as_str()
        .unwrap()
        .to_owned();
    let sch = aws_sdk_scheduler::Client::new(&sdk);
    let schedule = sch
        .get_schedule()
        .name(&timer)
        .group_name(&s.provisioned.config.schedule_group)
        .send()
        .await
        .unwrap();
    let target = schedule.target().unwrap();
    assert_eq!(
        target.event_bridge_parameters().unwrap().detail_type(),
        "timer.fired"
    );
    let detail: Value = serde_json::from_str(target.input().unwrap()).unwrap();
    assert_eq!(detail["timerId"], timer);
    assert_eq!(detail["runId"], run_id.as_str());
    let due: chrono::DateTime<chrono::Utc> = detail["due"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        schedule.schedule_expression(),
        Some(baton_aws::scheduler::at_expression(due).as_str())
    );
    // An early firing (the schedule deletes itself once fired) changes nothing but sets the
    // timer again; one at the deadline stops the step.
    sch.delete_schedule()
        .name(&timer)
        .group_name(&s.provisioned.config.schedule_group)
        .send()
        .await
        .unwrap();
    let fire = async || {
        let eb = aws_sdk_eventbridge::Client::new(&sdk);
        eb.put_events()
            .entries(
                aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                    .event_bus_name(&s.provisioned.config.bus_name)
                    .source("baton")
                    .detail_type("timer.fired")
                    .detail(detail.to_string())
                    .build(),
            )
            .send()
            .await
            .unwrap();
    };
    fire().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let again = loop {
        match sch
            .get_schedule()
            .name(&timer)
            .group_name(&s.provisioned.config.schedule_group)
            .send()
            .await
        {
            Ok(again) => break again,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the early timer was not set again: {e:?}"),
        }
    };
    assert_eq!(again.schedule_expression(), schedule.schedule_expression());
    let run = c.get_ok(&format!("/runs/{run_id}")).await;
    assert_eq!(run["status"], "waiting", "an early timer changed nothing");
    tokio::time::sleep(Duration::from_millis(3000)).await;
    fire().await;
    timed_out(&c, &run_id).await;
    s.shutdown().await;
}

/// A plan step's timer whose schedule fires 59 s early (the fault layer's scheduler, as
/// EventBridge Scheduler keeps time to the minute) is set again, and still stops the step,
/// between its deadline and two minutes after.
#[tokio::test]
async fn a_plan_step_timer_fired_59_s_early_still_stops_the_step_within_two_minutes() {
    let aws = Emulator::start_with(Some(Faults {
        early_first_firing: true,
        ..Faults::default()
    }))
    .await;
    let s = aws_host(&aws, "earlytimer", TIMEOUT_SCRIPT).await;
    let c = client(s.url());
    let started = Instant::now();
    let run_id = c.post_ok("/runs", json!({"prompt": "go"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    timed_out(&c, &run_id).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took <= Duration::from_secs(3 + 120 + 10),
        "the step stopped {took:?} after the run started (its timeout: 3 s)"
    );
    assert!(
        aws.faulty
            .as_ref()
            .unwrap()
            .stats
            .fired_early
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1,
        "the scheduler fired early at least once"
    );
    s.shutdown().await;
}

/// A plan step's timer whose schedule Scheduler dropped (deleted here; the emulator fires
/// none) is fired by the sweep once past its time: the run holds its armed timers, indexed
/// by the soonest, and the step is stopped as its schedule would have stopped it.
#[tokio::test]
async fn a_plan_step_timer_whose_schedule_was_lost_is_fired_by_the_sweep() {
    let aws = Emulator::start_with(None).await;
    let sdk = aws.sdk().await;
    let s = aws_host(&aws, "losttimer", TIMEOUT_SCRIPT).await;
    let c = client(s.url());
    let run_id = c.post_ok("/runs", json!({"prompt": "go"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    c.pending("text").await;
    let run = c.get_ok(&format!("/runs/{run_id}")).await;
    let step = &plan_entry(&run)["plan"]["steps"]["ask"];
    let timer = step["timerId"].as_str().unwrap().to_owned();
    let due: chrono::DateTime<chrono::Utc> = step["deadline"].as_str().unwrap().parse().unwrap();
    aws_sdk_scheduler::Client::new(&sdk)
        .delete_schedule()
        .name(&timer)
        .group_name(&s.provisioned.config.schedule_group)
        .send()
        .await
        .expect("the step's schedule was made");
    // Before its time the sweep leaves it; after, it fires it.
    s.sweep(chrono::Duration::zero()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let run = c.get_ok(&format!("/runs/{run_id}")).await;
    assert_eq!(run["status"], "waiting", "not yet due: {run}");
    let wait = (due - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
    assert!(s.sweep(chrono::Duration::zero()).await.unwrap() >= 1);
    timed_out(&c, &run_id).await;
    s.shutdown().await;
}
