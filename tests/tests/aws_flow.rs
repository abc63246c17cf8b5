//! The full flow over AWS wire protocols: an emulator for DynamoDB, SQS FIFO, EventBridge
//! and Scheduler (moto's server, or LocalStack, with or without the fault layer: see
//! `common/aws.rs`), in-process event source mappings standing in for Lambda's, and a mock
//! OpenAI-compatible server on loopback.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::ports::SystemClock;
use baton_dev::{AwsDevOptions, AwsDevServer};
use common::aws::Emulator;
use common::fault::Faults;
use common::host::{AwsHost, TestHost};
use common::*;
use serde_json::{Value, json};

/// `baton dev --aws` over its own emulator, thinking from a mock OpenAI server.
struct Env {
    host: AwsHost,
    _mock: wiremock::MockServer,
}

/// `baton dev --aws` over a fresh emulator, thinking from `script` (a mock OpenAI server),
/// its AWS clients going through the fault layer with `faults` (none: straight to the
/// emulator), turned on once the resources exist; every message delivered twice when
/// `duplicate`.
async fn start_env(
    script: &str,
    duplicate: bool,
    catalog: Arc<baton_core::agent::Catalog>,
    faults: Option<Faults>,
) -> Env {
    let aws = Arc::new(Emulator::start_with(faults).await);
    let (mock, llm) = common::mock_openai::start(script).await;
    let mut options = aws.dev_options(aws.names("flow"), llm, catalog, 0).await;
    options.duplicate = duplicate;
    options.links = None;
    Env {
        host: AwsHost::start(aws, options).await,
        _mock: mock,
    }
}

/// The scenarios' agents, as the mock model's scripts name them.
fn named_agents() -> Arc<baton_core::agent::Catalog> {
    catalog(Some(common::mock_openai::named_agents()))
}

/// Runs the full flow: approval answered through the API, choice answered on the bus.
async fn full_flow(duplicate: bool) -> Value {
    full_flow_in(
        start_env(
            &examples("full-flow.json"),
            duplicate,
            named_agents(),
            common::aws::scenario_faults(),
        )
        .await,
    )
    .await
}

/// The full flow in `env` (started with `examples/full-flow.json`).
async fn full_flow_in(mut env: Env) -> Value {
    let (code, v) = env
        .host
        .api()
        .call(
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": "Fix and ship"})),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    let run_id = v["runId"].as_str().unwrap().to_owned();

    let approval = env.host.api().pending("approval").await;
    let (code, v) = env
        .host
        .api()
        .call(
            reqwest::Method::POST,
            &format!("/ctas/{}/response", approval["ctaId"].as_str().unwrap()),
            Some(json!({"kind": "approval", "approved": true})),
        )
        .await;
    assert_eq!(code, 202, "{v}");

    let choice = env.host.api().pending("choice").await;
    env.host
        .put_event(
            "cta.response",
            json!({"ctaId": choice["ctaId"], "kind": "choice", "selectedId": "prod"}),
        )
        .await;

    let run = env.host.api().status(&run_id, "completed").await;
    assert_eq!(run["result"], "Shipped to the chosen target.");
    let types: Vec<&str> = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
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
    let tools = of_type(&run, "tool");
    assert_eq!(
        tools[0]["result"]["output"]["text"],
        "The repo has 3 crates."
    );
    assert_eq!(tools[1]["result"]["output"]["text"], "Patch drafted.");
    assert!(tools[0]["childRunId"].as_str().unwrap().starts_with("sub_"));
    assert_eq!(
        tools[2]["result"]["output"],
        json!({"kind": "approval", "approved": true})
    );
    assert_eq!(
        tools[3]["result"]["output"],
        json!({"kind": "choice", "selectedId": "prod"})
    );
    assert_eq!(
        run["usage"],
        json!({"inputTokens": 880, "outputTokens": 85, "totalTokens": 965})
    );
    // The answered CTAs are settled; a second answer on the bus is dropped, on the API a 409.
    let (code, _) = env
        .host
        .api()
        .call(
            reqwest::Method::POST,
            &format!("/ctas/{}/response", choice["ctaId"].as_str().unwrap()),
            Some(json!({"kind": "choice", "selectedId": "staging"})),
        )
        .await;
    assert_eq!(code, 409);
    let mut shape: Vec<Value> = run["timeline"].as_array().unwrap().clone();
    for e in &mut shape {
        e.as_object_mut().unwrap().remove("at");
    }
    env.host.stop().await;
    json!({"timeline": shape, "version": run["version"]})
}

/// A flow's outcome with what differs between two runs of it masked (ids, expiry times,
/// durations).
fn mask(v: &Value) -> String {
    let s = v.to_string();
    let ids = regex::Regex::new(r"(run|sub|cta)_[0-9a-f]{32}").unwrap();
    let times = regex::Regex::new(r#""(expiresAt|startedAt)":"[^"]+""#).unwrap();
    // How long things took: never the same twice.
    let took = regex::Regex::new(r#""(latencyMs|firstTokenMs|durationMs)":\d+"#).unwrap();
    let s = ids.replace_all(&s, "${1}_X");
    let s = times.replace_all(&s, r#""$1":"T""#);
    took.replace_all(&s, r#""$1":0"#).into_owned()
}

#[tokio::test]
async fn the_full_flow_runs_over_aws_apis_and_duplicates_change_nothing() {
    let once = full_flow(false).await;
    let twice = full_flow(true).await;
    assert_eq!(
        mask(&once),
        mask(&twice),
        "every message delivered twice gives the same timeline"
    );
}

/// The full flow again, every AWS call of the server going through the fault layer: 10% of
/// them throttled, 2% answered 5xx, each delayed up to 20 ms. It ends as without faults:
/// nothing lost, nothing twice, nothing stuck (each wait bounded).
#[tokio::test]
async fn the_full_flow_completes_alike_under_throttling_and_server_errors() {
    let calm = full_flow(false).await;
    let faults = Faults {
        throttle: 0.10,
        server_error: 0.02,
        latency: Duration::from_millis(20),
        ..Faults::default()
    };
    let env = start_env(
        &examples("full-flow.json"),
        false,
        named_agents(),
        Some(faults),
    )
    .await;
    let stats = env.host.aws.faulty.as_ref().unwrap().stats.clone();
    let started = Instant::now();
    let stormy = full_flow_in(env).await;
    assert_eq!(mask(&calm), mask(&stormy), "the same timeline under faults");
    let requests = stats.requests.load(std::sync::atomic::Ordering::Relaxed);
    let refused = stats.throttled.load(std::sync::atomic::Ordering::Relaxed)
        + stats
            .server_errors
            .load(std::sync::atomic::Ordering::Relaxed);
    let by_op = stats.refused.lock().unwrap().clone();
    eprintln!(
        "fault layer: {requests} requests, {refused} refused, in {:?}: {by_op:?}",
        started.elapsed()
    );
    assert!(refused > 0 && requests > 0, "the layer refused some calls");
    for service in ["dynamodb.", "sqs."] {
        assert!(
            by_op.keys().any(|op| op.starts_with(service)),
            "{service} met refusals: {by_op:?}"
        );
    }
}

/// A run whose orchestrator asks a text question that expires after 5 s (the server's AWS
/// calls through the fault layer, if `faults`; with none, the test fires the expiry by
/// hand): the environment, the run's id and the question.
async fn five_second_question(faults: Option<Faults>) -> (Env, String, Value) {
    question_expiring_in(5, faults).await
}

/// A run asking a text question that expires in `secs` seconds, and the question.
async fn question_expiring_in(secs: u64, faults: Option<Faults>) -> (Env, String, Value) {
    let script = r#"{"orchestrator": [{"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Name?"}}]}]}"#;
    let mut agents = common::mock_openai::named_agents();
    agents["agents"]["orchestrator"]["ctaExpirySeconds"] = json!(secs);
    let env = start_env(script, false, catalog(Some(agents)), faults).await;
    let (run_id, cta) = env.ask().await;
    (env, run_id, cta)
}

/// Over AWS's APIs (DynamoDB, SQS, EventBridge, Scheduler): a run that expires questions
/// into their defaults (`onExpiry: "default"` on `POST /runs`) asks a 5 s approval with one,
/// hears nothing, is given its default by the schedule's expiry and completes; the bus is
/// told (`cta.defaulted`: the calls it made are checked against the bus's policy in CI).
#[tokio::test]
async fn a_question_with_a_default_expires_into_it_over_aws_apis() {
    let script = r#"{"orchestrator": [
        {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval",
            "message": "Ship it?", "default": {"approved": true, "reason": "ship by default"}}}]},
        {"text": "Shipped."}]}"#;
    let mut agents = common::mock_openai::named_agents();
    agents["agents"]["orchestrator"]["ctaExpirySeconds"] = json!(5);
    let faults = common::aws::scenario_faults();
    let mut env = start_env(script, false, catalog(Some(agents)), faults).await;
    let api = env.host.api();
    let (code, v) = api
        .call(
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": "ship", "onExpiry": "default"})),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    let run_id = v["runId"].as_str().unwrap().to_owned();
    let cta = api.pending("approval").await;
    assert_eq!(cta["default"]["approved"], true);

    // The emulator does not fire schedules: at the question's time, its schedule's event
    // is put on the bus as the schedule would put it.
    let expires = chrono::DateTime::parse_from_rfc3339(cta["expiresAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let wait = (expires - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(50)).await;
    let due = expires.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let fire = json!({"ctaId": cta["ctaId"], "runId": run_id, "due": due});
    env.host.put_event("cta.expired", fire).await;
    let path = format!("/runs/{run_id}");
    let run = api
        .wait("the run to end", async |api: &common::aws::Api| {
            let (_, run) = api.get(&path).await;
            let ended = ["completed", "expired", "failed"].contains(&run["status"].as_str()?);
            ended.then_some(run)
        })
        .await;
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(run["result"], "Shipped.");
    let (_, timeline) = api
        .call(
            reqwest::Method::GET,
            &format!("/runs/{run_id}/timeline"),
            None,
        )
        .await;
    let tool = timeline["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool")
        .expect("the question's entry");
    assert_eq!(tool["cta"]["status"], "expired", "{tool}");
    assert_eq!(tool["cta"]["defaulted"], true);
    assert_eq!(tool["result"]["output"]["approved"], true);
    assert_eq!(tool["result"]["output"]["default"], true);
    let (_, c) = api
        .call(
            reqwest::Method::GET,
            &format!("/ctas/{}", cta["ctaId"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(c["status"], "expired");
    assert_eq!(c["defaulted"], true, "{c}");
    assert_eq!(c["response"], tool["cta"]["response"], "{c}");
    env.host.inbox_drained().await;
    let run = env.host.api().get_ok(&path).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    env.host.stop().await;
}

impl Env {
    /// A run that asks the 5 s question: its id, and the question once it is pending.
    async fn ask(&self) -> (String, Value) {
        let (_, v) = self
            .host
            .api()
            .call(
                reqwest::Method::POST,
                "/runs",
                Some(json!({"prompt": "ask"})),
            )
            .await;
        let run_id = v["runId"].as_str().unwrap().to_owned();
        let cta = self.host.api().pending("text").await;
        (run_id, cta)
    }
}

/// A CTA whose schedule fires 59 s before its time (EventBridge Scheduler keeps time to the
/// minute; the fault layer fires a schedule's first firing that early) is not lost: it is
/// set again, and the question expires between its `expiresAt` and two minutes after.
#[tokio::test]
async fn a_cta_whose_schedule_fires_59_s_early_still_expires_within_two_minutes() {
    let faults = Faults {
        early_first_firing: true,
        ..Faults::default()
    };
    let (mut env, run_id, cta) = five_second_question(Some(faults)).await;
    let run = env.host.api().status(&run_id, "expired").await;
    assert_eq!(run["error"]["code"], "cta_expired");
    let (_, c) = env
        .host
        .api()
        .call(
            reqwest::Method::GET,
            &format!("/ctas/{}", cta["ctaId"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(c["status"], "expired");
    let time = |k: &str| {
        chrono::DateTime::parse_from_rfc3339(c[k].as_str().unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc)
    };
    let late = time("resolvedAt") - time("expiresAt");
    assert!(
        late >= chrono::Duration::zero() && late <= chrono::Duration::seconds(120),
        "expired {late} after its time"
    );
    let stats = &env.host.aws.faulty.as_ref().unwrap().stats;
    assert!(
        stats.fired_early.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "the scheduler fired early at least once"
    );
    env.host.stop().await;
}

#[tokio::test]
async fn a_five_second_cta_is_scheduled_on_the_minute_re_arms_an_early_expiry_and_expires_on_time()
{
    let (mut env, run_id, cta) = five_second_question(None).await;
    let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
    let expires = chrono::DateTime::parse_from_rfc3339(cta["expiresAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);

    // The stored schedule: named by the CTA, at() the whole minute at or after its expiry
    // (Scheduler fires anywhere in that minute), onto the bus, deleting itself.
    let c = &env.host.server().provisioned.config;
    let sch = aws_sdk_scheduler::Client::new(&env.host.sdk);
    // The CTA is stored with the step's commit; its schedule is an effect performed after
    // it, so a loaded machine can show the one before the other.
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        match sch
            .get_schedule()
            .name(&cta_id)
            .group_name(&c.schedule_group)
            .send()
            .await
        {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let missing = e
                    .as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception());
                assert!(missing, "GetSchedule: {e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the CTA's schedule never appeared: {e:?}"),
        }
    };
    let created = chrono::DateTime::parse_from_rfc3339(cta["createdAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    assert_eq!(expires - created, chrono::Duration::seconds(5));
    let expected_at = baton_aws::scheduler::at_expression(created + chrono::Duration::seconds(5));
    assert_eq!(s.schedule_expression(), Some(expected_at.as_str()));
    assert_eq!(s.schedule_expression_timezone(), Some("UTC"));
    assert_eq!(s.flexible_time_window().unwrap().mode().as_str(), "OFF");
    let target = s.target().unwrap();
    assert_eq!(target.arn(), c.bus_arn);
    assert_eq!(target.role_arn(), c.scheduler_role_arn);
    assert_eq!(
        target.event_bridge_parameters().unwrap().detail_type(),
        "cta.expired"
    );
    let input: Value = serde_json::from_str(target.input().unwrap()).unwrap();
    let due = (created + chrono::Duration::seconds(5))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    assert_eq!(input, json!({"ctaId": cta_id, "runId": run_id, "due": due}));
    assert_eq!(
        s.action_after_completion().map(|a| a.as_str()),
        Some("DELETE")
    );

    // The emulator does not fire schedules: deliver the schedule's input ourselves, early,
    // as a scheduler keeping its time to the minute may, and as the schedule deletes itself
    // once fired. The question stays open, and its schedule is set again: not lost.
    sch.delete_schedule()
        .name(&cta_id)
        .group_name(&c.schedule_group)
        .send()
        .await
        .unwrap();
    env.host.put_event("cta.expired", input.clone()).await;
    env.host.inbox_drained().await;
    let (_, c) = env
        .host
        .api()
        .call(reqwest::Method::GET, &format!("/ctas/{cta_id}"), None)
        .await;
    assert_eq!(c["status"], "pending", "{c}");
    assert!(chrono::Utc::now() < expires, "the early event was early");
    let again = sch
        .get_schedule()
        .name(&cta_id)
        .group_name(&env.host.server().provisioned.config.schedule_group)
        .send()
        .await
        .expect("the expiry is scheduled again");
    assert_eq!(again.schedule_expression(), Some(expected_at.as_str()));

    // At its time, as the schedule would fire it, it ends the run.
    let wait = (expires - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
    env.host.put_event("cta.expired", input).await;
    let run = env.host.api().status(&run_id, "expired").await;
    assert_eq!(run["error"]["code"], "cta_expired");

    // Too late: 410 through the API, dropped from the bus.
    let (code, v) = env
        .host
        .api()
        .call(
            reqwest::Method::POST,
            &format!("/ctas/{cta_id}/response"),
            Some(json!({"kind": "text", "text": "Ada"})),
        )
        .await;
    assert_eq!(code, 410, "{v}");
    env.host
        .put_event(
            "cta.response",
            json!({"ctaId": cta_id, "kind": "text", "text": "Ada"}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, c2) = env
        .host
        .api()
        .call(reqwest::Method::GET, &format!("/ctas/{cta_id}"), None)
        .await;
    assert_eq!(c2["status"], "expired");
    let (_, after) = env
        .host
        .api()
        .call(reqwest::Method::GET, &format!("/runs/{run_id}"), None)
        .await;
    assert_eq!(after["status"], "expired");
    env.host.stop().await;
}

/// A tool whose output is as large as it is asked to be.
struct Big;

#[async_trait::async_trait]
impl baton_core::tools::Tool for Big {
    fn name(&self) -> &str {
        "big"
    }
    fn description(&self) -> &str {
        "Returns `bytes` bytes of text."
    }
    /// It computes and changes nothing (the default, `Once`, is for tools that must not run
    /// twice: a fault of the scenario's fault layer after it started would leave its
    /// outcome unknown instead of its output, which is what this test reads).
    fn effects(&self) -> baton_core::tools::Effects {
        baton_core::tools::Effects::None
    }
    fn schema(&self) -> Value {
        json!({"type": "object", "properties": {"bytes": {"type": "integer"}}, "required": ["bytes"]})
    }
    async fn execute(
        &self,
        _: &baton_core::tools::ToolContext,
        input: Value,
    ) -> Result<Value, String> {
        let n = input["bytes"].as_u64().unwrap_or(0) as usize;
        Ok(Value::String(noise(0, n)))
    }
}

#[tokio::test]
async fn a_1_mb_tool_output_and_a_300_kb_answer_complete_and_read_back_whole() {
    let answer = noise(0, 300_000);
    let script = json!({"orchestrator": [
        {"tool_calls": [{"name": "big", "arguments": {"bytes": 1_000_000}}]},
        {"text": answer}
    ]})
    .to_string();
    let file: baton_core::agent::AgentsFile = serde_json::from_value(
        json!({"agents": {"orchestrator": {"system": "agent:orchestrator", "tools": ["big"]}}}),
    )
    .unwrap();
    let catalog = Arc::new(
        baton_core::agent::Catalog::new(
            baton_core::agent::Limits::default(),
            vec![Arc::new(Big)],
            Some(file),
        )
        .unwrap(),
    );
    let mut env = start_env(&script, false, catalog, common::aws::scenario_faults()).await;
    let (_, v) = env
        .host
        .api()
        .call(
            reqwest::Method::POST,
            "/runs",
            Some(json!({"prompt": "go big"})),
        )
        .await;
    let run_id = v["runId"].as_str().unwrap().to_owned();
    let run = env.host.api().status(&run_id, "completed").await;

    // The whole answer, read back through the API; the tool output capped with a marker.
    assert_eq!(run["result"].as_str().map(str::len), Some(300_000));
    assert!(
        run["result"] == json!(answer),
        "the whole answer comes back"
    );
    let tool = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool")
        .unwrap();
    assert_eq!(tool["result"]["output"]["truncated"], true);
    assert_eq!(tool["result"]["output"]["originalBytes"], 1_000_000);
    let last = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|e| e["type"] == "assistant")
        .unwrap();
    assert_eq!(last["text"].as_str().map(str::len), Some(300_000));

    // The run item holds a preview, far under DynamoDB's 400 KB.
    let ddb = aws_sdk_dynamodb::Client::new(&env.host.sdk);
    let item = ddb
        .get_item()
        .table_name(&env.host.server().provisioned.config.table)
        .key(
            "PK",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("RUN#{run_id}")),
        )
        .key(
            "SK",
            aws_sdk_dynamodb::types::AttributeValue::S("META".into()),
        )
        .send()
        .await
        .unwrap();
    // Its body is packed (store format 2): under 16 KB as stored, and as JSON.
    let packed = item.item().unwrap()["body"].as_b().unwrap().as_ref();
    let json: serde_json::Value = baton_codec::decode(packed).unwrap();
    let json_len = json.to_string().len();
    assert!(
        packed.len() < 16 * 1024 && json_len < 16 * 1024,
        "run item body is {} bytes packed, {json_len} as JSON",
        packed.len()
    );

    // Nothing was dead-lettered.
    let sqs = aws_sdk_sqs::Client::new(&env.host.sdk);
    for dlq in &env.host.server().provisioned.dead_letters {
        let attrs = sqs
            .get_queue_attributes()
            .queue_url(&dlq.url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .unwrap();
        let n = attrs.attributes().unwrap()
            [&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages]
            .clone();
        assert_eq!(n, "0", "{}", dlq.url);
    }
    env.host.stop().await;
}

/// The scripted model, slowed down: each think takes `delay`, and says it may take up to
/// `longest`.
struct Slow {
    inner: Arc<dyn baton_core::llm::Llm>,
    delay: Duration,
    longest: Duration,
}

#[async_trait::async_trait]
impl baton_core::llm::Llm for Slow {
    fn longest_call(&self) -> Option<Duration> {
        Some(self.longest)
    }

    async fn complete(
        &self,
        request: &baton_core::llm::ChatRequest<'_>,
    ) -> Result<baton_core::llm::LlmReply, baton_core::llm::LlmError> {
        tokio::time::sleep(self.delay).await;
        self.inner.complete(request).await
    }
}

#[tokio::test]
async fn a_batch_whose_deadline_runs_out_defers_the_rest_and_releases_them_at_once() {
    use baton_core::service::CreateRun;
    use baton_core::service::StepDeadline;
    use baton_lambda::{MAX_BATCH, Pace, handle_steps, release};

    let llm = Arc::new(Slow {
        inner: scripted(r#"{"explore": [{"text": "done"}]}"#),
        delay: Duration::from_millis(300),
        longest: Duration::from_millis(500),
    });
    let q = StepsQueue::start("deadline", llm).await;
    let service = &q.service;
    let mut runs = Vec::new();
    for i in 0..2 {
        let req = CreateRun {
            prompt: format!("look {i}"),
            agent: Some("explore".into()),
            ..Default::default()
        };
        runs.push(service.create_run("o", req, None).await.unwrap().run_id);
    }
    // Two follow-ups behind the first run's start: three records of its FIFO group.
    for text in ["and then?", "and after that?"] {
        service
            .post_message(
                "o",
                &runs[0],
                baton_core::service::FollowUp::text(text),
                None,
            )
            .await
            .unwrap();
    }
    // Receive the four as one batch, as the event source mapping would.
    let (messages, event) = q.receive().await;
    assert_eq!(messages.len(), 4);
    let run_of = |m: &aws_sdk_sqs::types::Message| {
        serde_json::from_str::<Value>(m.body().unwrap()).unwrap()["runId"]
            .as_str()
            .unwrap()
            .to_owned()
    };

    // Time for one 300 ms step, not for two: each run's first record runs (the two runs at
    // once), the first run's others are deferred.
    let deadline = StepDeadline {
        work_by: Instant::now() + Duration::from_millis(700),
        window: Duration::from_millis(700),
    };
    let out = handle_steps(
        service,
        &[],
        event,
        Some(deadline),
        Pace::step_by_step(MAX_BATCH),
    )
    .await;
    let failed: Vec<&str> = out
        .response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    let first_runs: Vec<&str> = messages
        .iter()
        .filter(|m| run_of(m) == runs[0])
        .map(|m| m.message_id().unwrap())
        .collect();
    assert_eq!(first_runs.len(), 3);
    let ids = &first_runs;
    assert_eq!(
        failed,
        ids[1..],
        "the rest of the first run's group, in order"
    );
    let delays: Vec<Duration> = out.again.iter().map(|(_, d)| *d).collect();
    assert_eq!(delays, [Duration::ZERO; 2], "deferred: due again at once");
    for r in &runs {
        let rec = service.get_run("o", r, 100).await.unwrap();
        assert_eq!(rec.run.status, baton_core::run::RunStatus::Completed, "{r}");
        if *r == runs[0] {
            let users = rec
                .entries
                .iter()
                .filter(|e| matches!(e.body, baton_core::timeline::EntryBody::User { .. }))
                .count();
            assert_eq!(users, 1, "the follow-ups untouched");
        }
    }

    // Released, they are visible again now, not after the 1800 s visibility timeout.
    for m in messages
        .iter()
        .filter(|m| !ids[1..].contains(&m.message_id().unwrap()))
    {
        q.sqs
            .delete_message()
            .queue_url(&q.url)
            .receipt_handle(m.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }
    release(&q.sqs, &[q.url.as_str()], &out.again).await;
    let (again, _) = q.receive().await;
    let mut back: Vec<&str> = again.iter().map(|m| m.message_id().unwrap()).collect();
    back.sort_unstable();
    let mut want = ids[1..].to_vec();
    want.sort_unstable();
    assert_eq!(back, want);
}

/// The scripted model, throttled on its first call (after the client's own retries).
struct ThrottledOnce {
    inner: Arc<dyn baton_core::llm::Llm>,
    throttled: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl baton_core::llm::Llm for ThrottledOnce {
    async fn complete(
        &self,
        request: &baton_core::llm::ChatRequest<'_>,
    ) -> Result<baton_core::llm::LlmReply, baton_core::llm::LlmError> {
        if !self
            .throttled
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(baton_core::llm::LlmError::Unavailable {
                message: "429 Too Many Requests".into(),
                source: None,
            });
        }
        self.inner.complete(request).await
    }
}

/// A steps queue on the emulator (no faults: the tests using it are about one) with a
/// service over it, fed by hand as Lambda's event source
/// mapping would feed the step function.
struct StepsQueue {
    service: Arc<baton_core::service::Service>,
    sqs: aws_sdk_sqs::Client,
    url: String,
    arn: String,
    _aws: Emulator,
}

impl StepsQueue {
    async fn start(prefix: &str, llm: Arc<dyn baton_core::llm::Llm>) -> StepsQueue {
        let aws = Emulator::start_with(None).await;
        let sdk = aws.sdk().await;
        let p = baton_aws::provision::ensure(
            &sdk,
            &aws.names(prefix),
            "arn:aws:iam::123456789012:role/s",
        )
        .await
        .unwrap();
        let service = common::aws::aws_service(
            &p.config,
            &sdk,
            llm,
            catalog(None),
            Arc::new(SystemClock),
            baton_aws::sdk::Meter::shared(),
        );
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let url = p.config.steps_queue_url.clone();
        let orchestrator = baton_dev::functions::Functions::deployed()
            .unwrap()
            .fed_by("StepsQueue")
            .unwrap();
        let arn = baton_dev::event_source::EventSources::queue(
            &sqs,
            &url,
            baton_dev::event_source::Feeds::Steps,
            orchestrator,
        )
        .await
        .unwrap()
        .arn;
        StepsQueue {
            service,
            sqs,
            url,
            arn,
            _aws: aws,
        }
    }

    /// Up to ten messages, as the event source mapping hands them to Lambda.
    async fn receive(
        &self,
    ) -> (
        Vec<aws_sdk_sqs::types::Message>,
        aws_lambda_events::event::sqs::SqsEvent,
    ) {
        let messages = self
            .sqs
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(10)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .send()
            .await
            .unwrap()
            .messages()
            .to_vec();
        let records: Vec<Value> = messages
            .iter()
            .map(|m| {
                let attrs = m.attributes().unwrap();
                let attr = |a| attrs[&a].clone();
                json!({"messageId": m.message_id(), "receiptHandle": m.receipt_handle(),
                    "body": m.body(), "attributes": {
                        "MessageGroupId": attr(aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId),
                        "ApproximateReceiveCount": attr(aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)},
                    "messageAttributes": {}, "eventSource": "aws:sqs", "eventSourceARN": self.arn,
                    "awsRegion": "us-east-1"})
            })
            .collect();
        let event = serde_json::from_value(json!({ "Records": records })).unwrap();
        (messages, event)
    }
}

#[tokio::test]
async fn a_step_that_fails_retryably_is_due_again_after_its_backoff_not_the_visibility_timeout() {
    use baton_core::service::CreateRun;
    use baton_lambda::{MAX_BATCH, Pace, handle_steps, release, retry_delay};

    let llm = Arc::new(ThrottledOnce {
        inner: scripted(r#"{"explore": [{"text": "done"}]}"#),
        throttled: Default::default(),
    });
    let q = StepsQueue::start("backoff", llm).await;
    let service = &q.service;
    let req = CreateRun {
        prompt: "look".into(),
        agent: Some("explore".into()),
        ..Default::default()
    };
    let run_id = service.create_run("o", req, None).await.unwrap().run_id;

    let (messages, event) = q.receive().await;
    assert_eq!(messages.len(), 1);
    let out = handle_steps(service, &[], event, None, Pace::step_by_step(MAX_BATCH)).await;
    assert_eq!(out.response.batch_item_failures.len(), 1, "reported failed");
    let delays: Vec<Duration> = out.again.iter().map(|(_, d)| *d).collect();
    assert_eq!(
        delays,
        [Duration::from_secs(30)],
        "the first receive's backoff"
    );
    assert_eq!(retry_delay(1), Duration::from_secs(30));
    // Released with its backoff: not visible now; made visible at once, it is delivered
    // again (not after the queue's visibility timeout) and the run completes.
    release(&q.sqs, &[q.url.as_str()], &out.again).await;
    assert!(q.receive().await.0.is_empty(), "waits its backoff");
    let now: Vec<_> = out
        .again
        .iter()
        .map(|(r, _)| (r.clone(), Duration::ZERO))
        .collect();
    release(&q.sqs, &[q.url.as_str()], &now).await;
    let (again, event) = q.receive().await;
    assert_eq!(again.len(), 1);
    let out = handle_steps(service, &[], event, None, Pace::step_by_step(MAX_BATCH)).await;
    assert!(out.response.batch_item_failures.is_empty());
    let run = service
        .deps()
        .store
        .get_run(&run_id)
        .await
        .unwrap()
        .unwrap()
        .run;
    assert_eq!(run.status, baton_core::run::RunStatus::Completed);
}

/// `baton dev --aws` with agent `ops` thinking from `script` with `tool`, `service` in an
/// outage (the fault layer answers its every request with a 500) once the host is up, and
/// a run of `ops` started.
async fn run_in_outage(
    service: &'static str,
    script: &str,
    tool: &str,
) -> (Arc<Emulator>, AwsHost, String) {
    let aws = Arc::new(Emulator::start_with(None).await);
    let agents = json!({"agents": {"ops": {"tools": [tool]}}});
    let options = aws
        .dev_options(
            aws.names(service),
            scripted(script),
            catalog(Some(agents)),
            0,
        )
        .await;
    let host = AwsHost::start(aws.clone(), options).await;
    aws.outage(service, true);
    let run_id = host
        .api()
        .post_ok("/runs", json!({"prompt": "go", "agent": "ops"}))
        .await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    (aws, host, run_id)
}

/// A Scheduler outage (the fault layer answers its every request with a 500) holds back
/// neither a question nor its run: the question reaches its inbox and is answered, and the
/// run completes; the expiry timer and its removal are owed, kept in the run's outbox for
/// the sweep. A tick during the outage repairs nothing and says so (the alarm's metric);
/// the first tick after it performs them, in their order, and the outbox is done.
#[tokio::test]
async fn a_scheduler_outage_holds_back_neither_a_question_nor_its_run() {
    let script = r#"{"ops": [
        {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "ship?"}}]},
        {"text": "shipped"}]}"#;
    let (aws, host, run_id) = run_in_outage("scheduler", script, "request_human_feedback").await;
    let api = host.api().clone();
    api.status(&run_id, "waiting").await;
    let cta = api.pending_cta().await["ctaId"]
        .as_str()
        .unwrap()
        .to_owned();
    let approve = json!({"kind": "approval", "approved": true});
    api.post_ok(&format!("/ctas/{cta}/response"), approve).await;
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "shipped");

    // The run reads as completed as its last commit lands; its effects follow: the
    // outbox is narrowed to what failed once they are tried.
    let store = host.server().events_service().deps().store.clone();
    let kinds = |outbox: &[baton_core::message::Effect]| -> Vec<Value> {
        outbox
            .iter()
            .map(|e| serde_json::to_value(e).unwrap()["type"].clone())
            .collect()
    };
    let owed = api
        .wait("the outbox narrowed to what failed", async |_| {
            let outbox = store.get_run(&run_id).await.unwrap().unwrap().outbox;
            (kinds(&outbox) == [json!("schedule"), json!("unschedule")]).then_some(outbox)
        })
        .await;
    let metrics = async || {
        let page = api
            .http
            .get(format!("{}/metrics", api.base))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200);
        page.text().await.unwrap()
    };
    let page = metrics().await;
    assert!(
        page.contains(r#"baton_effect_failures_total{kind="schedule"}"#),
        "{page}"
    );

    // A tick during the outage: nothing repaired, and the failure counted.
    host.sweep().await;
    assert_eq!(store.get_run(&run_id).await.unwrap().unwrap().outbox, owed);
    assert!(
        metrics()
            .await
            .contains("baton_outbox_repair_failures_total 1"),
        "a tick that repaired nothing says so"
    );

    // Scheduler back: the next tick performs what is owed; no timer is left.
    aws.outage("scheduler", false);
    host.sweep().await;
    let rec = store.get_run(&run_id).await.unwrap().unwrap();
    assert!(rec.outbox.is_empty(), "{:?}", rec.outbox);
    let sch = aws_sdk_scheduler::Client::new(&aws.sdk().await);
    let left = sch
        .get_schedule()
        .name(&cta)
        .group_name(host.names().schedule_group())
        .send()
        .await;
    assert!(left.is_err(), "the answered question's timer is gone");
    assert!(
        metrics()
            .await
            .contains("baton_outbox_repair_failures_total 1"),
        "the repair that worked counts no failure"
    );
}

/// A bus outage holds back no step of a run that goes on: each step's `run.state` event
/// fails, its run's next message goes all the same (marked owed), and that step publishes
/// them again before it thinks, carrying what still fails into its own commit. The run
/// completes during the outage owing only events, which the first tick after it publishes.
#[tokio::test]
async fn a_bus_outage_holds_back_no_step_and_its_events_are_published_after() {
    let script = r#"{"ops": [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]},
        {"tool_calls": [{"name": "echo", "arguments": {"text": "b"}}]},
        {"tool_calls": [{"name": "echo", "arguments": {"text": "c"}}]},
        {"text": "done"}]}"#;
    let (aws, host, run_id) = run_in_outage("events", script, "echo").await;
    let api = host.api().clone();
    let run = api.status(&run_id, "completed").await;
    assert_eq!(run["result"], "done");
    let store = host.server().events_service().deps().store.clone();
    let owed = api
        .wait("the last outbox narrowed to what failed", async |_| {
            let outbox = store.get_run(&run_id).await.unwrap().unwrap().outbox;
            let types: Vec<Value> = outbox
                .iter()
                .map(|e| serde_json::to_value(e).unwrap()["type"].clone())
                .collect();
            let only_events = types.iter().all(|t| t == "publish");
            let completed = outbox.iter().any(|e| {
                matches!(e, baton_core::message::Effect::Publish(ev) if ev.detail_type == "run.completed")
            });
            (only_events && completed).then_some(outbox)
        })
        .await;
    // The first step's `thinking` event is owed still: carried by each step after it, none
    // of which it held back.
    let first = format!("{run_id}:1:0");
    assert!(
        owed.iter().any(|e| matches!(e, baton_core::message::Effect::Publish(ev) if ev.id == first && ev.detail_type == "run.state")),
        "{owed:?}"
    );

    aws.outage("events", false);
    host.sweep().await;
    let rec = store.get_run(&run_id).await.unwrap().unwrap();
    assert!(rec.outbox.is_empty(), "{:?}", rec.outbox);
}

/// A provider as slow as a busy one: each call takes `delay`. A conversation without a tool
/// result gets a call of `count`; one with it, the final answer.
struct SlowProvider(Duration);

impl wiremock::Respond for SlowProvider {
    fn respond(&self, req: &wiremock::Request) -> wiremock::ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
        let answered = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        let message = if answered {
            json!({"role": "assistant", "content": "counted"})
        } else {
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_count",
                "type": "function", "function": {"name": "count", "arguments": "{}"}}]})
        };
        wiremock::ResponseTemplate::new(200)
            .set_body_json(json!({"choices": [{"message": message}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}))
            .set_delay(self.0)
    }
}

/// Lambda's contract, held by the stand-in: ten runs in one batch of a function with a 20 s
/// timeout stepping two runs at once, a model taking a quarter of
/// the timeout per call. Before, each run's first record always started, so the batch's last
/// round began 15 s in and was ended at 20 s mid-step (its batch back after the visibility
/// timeout, its step's tool calls run again). Now a step starts only while its model call
/// fits, and the rest are deferred to a fresh invocation: every run completes, no invocation
/// is ended, and the tool sees each run's call once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_runs_in_one_batch_with_a_slow_model_never_outrun_their_invocation() {
    use baton_core::service::CreateRun;
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers};

    let timeout = Duration::from_secs(20);
    let provider = MockServer::start().await;
    Mock::given(matchers::method("POST"))
        .and(matchers::path("/v1/chat/completions"))
        .respond_with(SlowProvider(timeout / 4))
        .mount(&provider)
        .await;
    let tool = MockServer::start().await;
    Mock::given(matchers::method("POST"))
        .and(matchers::path("/count"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"counted": true})))
        .mount(&tool)
        .await;
    let llm = Arc::new(
        baton_llm::openai::OpenAiLlm::new(baton_llm::openai::OpenAiConfig {
            max_tokens: None,
            base_url: format!("{}/v1", provider.uri()),
            api_key: Some("sk-mock".into()),
            model: "mock".into(),
            max_retries: 0,
            backoff: baton_llm::retry::Backoff::fast(),
            timeout: timeout / 4 + Duration::from_secs(1),
        })
        .unwrap(),
    );
    let file = json!({
        "tools": {"count": {"url": format!("{}/count", tool.uri()), "description": "counts",
                            "schema": {"type": "object"}, "timeoutSeconds": 2}},
        "agents": {"ops": {"tools": ["count"]}}});
    let file: baton_core::agent::AgentsFile = serde_json::from_value(file).unwrap();
    let catalog = Arc::new(
        baton_tools::catalog(
            Some(file),
            baton_tools::Host::Dev,
            &|_| None,
            &Default::default(),
        )
        .unwrap(),
    );

    // The ten runs' first steps wait in the queue before the mappings start: one batch.
    let aws = Emulator::start_with(None).await;
    let sdk = aws.sdk().await;
    let names = aws.names("batch");
    let role = "arn:aws:iam::123456789012:role/batch-scheduler";
    let p = baton_aws::provision::ensure(&sdk, &names, role)
        .await
        .unwrap();
    let api = common::aws::aws_service(
        &p.config,
        &sdk,
        llm.clone(),
        catalog.clone(),
        Arc::new(SystemClock),
        baton_aws::sdk::Meter::shared(),
    );
    let mut runs = Vec::new();
    for i in 0..10 {
        let req = CreateRun {
            prompt: format!("count {i}"),
            agent: Some("ops".into()),
            ..Default::default()
        };
        runs.push(api.create_run("o", req, None).await.unwrap().run_id);
    }
    let server = AwsDevServer::start(AwsDevOptions {
        sdk: sdk.clone(),
        names,
        scheduler_role_arn: role.into(),
        addr: "127.0.0.1:0".parse().unwrap(),
        token: TOKEN.into(),
        llm,
        catalog,
        clock: Arc::new(SystemClock),
        duplicate: false,
        functions: None,
        function_timeout: Some(timeout),
        // Two at once, the fewest a function steps (a 128 MB one's, or BATON_STEPS_AT_ONCE):
        // ten runs take five rounds of a model call each.
        steps_at_once: Some(2),
        steps_in_a_row: None,
        live: None,
        links: None,
        traces: None,
        quotas: Default::default(),
    })
    .await
    .unwrap();

    let started = Instant::now();
    for r in &runs {
        loop {
            let rec = api.get_run("o", r, 100).await.unwrap();
            if rec.run.status == baton_core::run::RunStatus::Completed {
                break;
            }
            assert_eq!(server.invocations_ended(), 0, "an invocation was ended");
            assert!(
                started.elapsed() < Duration::from_secs(240),
                "{r} is {:?}",
                rec.run.status
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    assert_eq!(server.invocations_ended(), 0, "no invocation was ended");
    // One call a run, none repeated: a key of its own each.
    let calls = tool.received_requests().await.unwrap_or_default();
    assert_eq!(calls.len(), runs.len(), "each run's call exactly once");
    let keys: std::collections::HashSet<_> = calls
        .iter()
        .filter_map(|r| r.headers.get("idempotency-key")?.to_str().ok())
        .collect();
    assert_eq!(keys.len(), runs.len(), "a key per call");
    server.shutdown().await;
}

/// The schedule of `cta_id`, once the step's effects have made it; then deleted, as an
/// outbox not yet performed has made none.
async fn dropped_schedule(
    env: &Env,
    cta_id: &str,
) -> aws_sdk_scheduler::operation::get_schedule::GetScheduleOutput {
    let made = made_schedule(env, cta_id).await;
    aws_sdk_scheduler::Client::new(&env.host.sdk)
        .delete_schedule()
        .name(cta_id)
        .group_name(&env.host.server().provisioned.config.schedule_group)
        .send()
        .await
        .unwrap();
    made
}

/// The schedule of `cta_id`, once the step's effects have made it.
async fn made_schedule(
    env: &Env,
    cta_id: &str,
) -> aws_sdk_scheduler::operation::get_schedule::GetScheduleOutput {
    let sch = aws_sdk_scheduler::Client::new(&env.host.sdk);
    let group = &env.host.server().provisioned.config.schedule_group;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match sch
            .get_schedule()
            .name(cta_id)
            .group_name(group)
            .send()
            .await
        {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the CTA's schedule never appeared: {e:?}"),
        }
    }
}

/// Sleeps until just past the question's `expiresAt`; returns it.
async fn past_expiry(cta: &Value) -> chrono::DateTime<chrono::Utc> {
    let expires = chrono::DateTime::parse_from_rfc3339(cta["expiresAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let wait = (expires - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
    expires
}

/// Timers that cannot be lost. Each schedule retries for a day and then dead-letters; a
/// question whose schedule's firing Scheduler dropped (the fault layer drops every one here,
/// to the timers' dead-letter queue) is expired by the sweep's next tick; and an expiry
/// whose effect is performed after its time (an outbox performed late) is never scheduled in
/// the past, where it could not fire: its event goes on the bus at once.
///
/// The questions expire in 30 s, not 5: a schedule is made only while its time is ahead
/// (else the event goes on the bus at once), and on a loaded machine a step can perform its
/// effects seconds after the commit that dated its question (CI, four tests at a time on two
/// cores, failed this test once with 5 s questions).
#[tokio::test]
async fn a_dropped_expiry_and_one_performed_late_still_expire_their_questions() {
    let faults = Faults {
        drop_firings: 1.0,
        ..Faults::default()
    };
    let (mut env, run_id, cta) = question_expiring_in(30, Some(faults)).await;
    let c = env.host.server().provisioned.config.clone();
    let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
    let s = made_schedule(&env, &cta_id).await;
    let target = s.target().unwrap();
    let retry = target.retry_policy().expect("a retry policy");
    assert_eq!(retry.maximum_event_age_in_seconds(), Some(86_400));
    assert_eq!(retry.maximum_retry_attempts(), Some(185));
    let dlq = target.dead_letter_config().and_then(|d| d.arn());
    assert!(
        dlq.is_some() && dlq == c.timers_dead_letter_arn.as_deref(),
        "{dlq:?}"
    );

    // Dropped: at its time (within the minute after `expiresAt`) the firing goes to the
    // dead-letter queue, and the question is still open. The sweep's tick expires it.
    let stats = env.host.aws.faulty.as_ref().unwrap().stats.clone();
    let deadline = Instant::now() + Duration::from_secs(210);
    while stats.dropped.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the firing was never dropped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sqs = aws_sdk_sqs::Client::new(&env.host.sdk);
    let dlq_name = dlq.unwrap().rsplit(':').next().unwrap();
    let url = sqs
        .get_queue_url()
        .queue_name(dlq_name)
        .send()
        .await
        .unwrap();
    let dead = sqs
        .receive_message()
        .queue_url(url.queue_url().unwrap())
        .wait_time_seconds(10)
        .send()
        .await
        .unwrap();
    let dead = dead
        .messages()
        .first()
        .expect("the dead-letter queue holds it");
    let body: Value = serde_json::from_str(dead.body().unwrap()).unwrap();
    assert_eq!(
        body["ctaId"],
        cta_id.as_str(),
        "the dropped expiry, dead-lettered"
    );
    let (_, pending) = env
        .host
        .api()
        .call(reqwest::Method::GET, &format!("/ctas/{cta_id}"), None)
        .await;
    assert_eq!(pending["status"], "pending", "nothing expired it yet");
    let repaired = env
        .host
        .server()
        .sweep(chrono::Duration::zero())
        .await
        .unwrap();
    assert!(repaired >= 1, "the sweep expired it");
    let run = env.host.api().status(&run_id, "expired").await;
    assert_eq!(run["error"]["code"], "cta_expired");

    env.host.stop().await;

    // Late: a question whose expiry is performed only once it is due (on a host whose
    // firings are not dropped: its schedule is deleted, as an outbox not yet performed has
    // made none), by the function that performs outboxes late. Its timer is scheduled a
    // little ahead, never in the past, and never put on the bus by the function: the bus's
    // policy refuses a `cta.expired` from any role but the scheduler's.
    let (mut env, late_run, cta) = question_expiring_in(30, Some(Faults::default())).await;
    let c = env.host.server().provisioned.config.clone();
    let late_cta = cta["ctaId"].as_str().unwrap().to_owned();
    dropped_schedule(&env, &late_cta).await;
    let expires = past_expiry(&cta).await;
    let performed = chrono::Utc::now();
    env.host
        .server()
        .events_service()
        .deps()
        .scheduler
        .schedule(&late_cta, &late_run, expires)
        .await
        .unwrap();
    let made = aws_sdk_scheduler::Client::new(&env.host.sdk)
        .get_schedule()
        .name(&late_cta)
        .group_name(&c.schedule_group)
        .send()
        .await
        .expect("a late timer is scheduled");
    let expression = made.schedule_expression().unwrap_or_default();
    let at = chrono::NaiveDateTime::parse_from_str(expression, "at(%Y-%m-%dT%H:%M:%S)")
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
        .and_utc();
    assert!(
        at >= performed + baton_aws::scheduler::LATE_LEAD
            && at <= performed + chrono::Duration::seconds(75),
        "scheduled at {at}, performed at {performed}: ahead of now, within a minute"
    );
    // It fires (the fault layer fires it as Scheduler would, in its minute) and expires the
    // question.
    let mut api = common::aws::Api::new(env.host.api().base.clone());
    api.patience = Duration::from_secs(150);
    let run = api.status(&late_run, "expired").await;
    assert_eq!(run["error"]["code"], "cta_expired");
    env.host.stop().await;
}

/// Lambda stops a chain of invocations through SQS past about 16 hops, unless the function
/// may loop (`RecursiveLoop: Allow`), and a run's steps are such a chain: each sends its
/// run's next message to the queue that invoked it. The stand-in counts the hops as Lambda
/// does (`baton_dev::loops`): a run of 40 tool steps completes with the functions as the
/// template deploys them, and stops partway, not completed, when they may not loop. (Two
/// steps in a row, as `BATON_STEPS_IN_A_ROW=2` sets: the default's ten would take the run's
/// forty steps in four hops.)
#[tokio::test]
async fn a_forty_step_run_goes_on_only_where_its_functions_may_loop() {
    let aws = Arc::new(Emulator::start().await);
    let mut replies: Vec<Value> = (0..39)
        .map(|i| json!({"tool_calls": [{"name": "echo", "arguments": {"text": format!("step {i}")}}]}))
        .collect();
    replies.push(json!({"text": "forty"}));
    let script = json!({"ops": replies}).to_string();
    let agents = json!({"agents": {"ops": {"tools": ["echo"], "maxIterations": 60, "maxToolCallsPerTurn": 60}}});
    let terminate =
        baton_dev::functions::TEMPLATE.replace("RecursiveLoop: Allow", "RecursiveLoop: Terminate");
    assert_ne!(terminate, baton_dev::functions::TEMPLATE);
    for (prefix, template, allowed) in [
        ("loops", baton_dev::functions::TEMPLATE.to_owned(), true),
        ("noloops", terminate, false),
    ] {
        let mut options = aws
            .dev_options(
                aws.names(prefix),
                scripted(&script),
                catalog(Some(agents.clone())),
                0,
            )
            .await;
        options.functions = Some(baton_dev::functions::Functions::parse(&template).unwrap());
        options.steps_in_a_row = Some(2);
        let server = aws.dev_host_from(options).await;
        let mut api = common::aws::Api::new(server.url());
        api.patience = Duration::from_secs(240);
        let run = api
            .post_ok("/runs", json!({"prompt": "go", "agent": "ops"}))
            .await["runId"]
            .as_str()
            .unwrap()
            .to_owned();
        let path = format!("/runs/{run}");
        if allowed {
            let done = api.status(&run, "completed").await;
            assert_eq!(done["result"], "forty");
            assert_eq!(server.loops_stopped(), 0);
        } else {
            api.wait("Lambda to stop the loop", async |_: &common::aws::Api| {
                (server.loops_stopped() > 0).then_some(())
            })
            .await;
            let stopped = api.get_ok(&path).await;
            assert_ne!(stopped["status"], "completed", "{stopped}");
            let tools = stopped["timeline"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["type"] == "tool")
                .count();
            assert!(
                (1..39).contains(&tools),
                "{tools} tool steps before the stop"
            );
        }
        server.shutdown().await;
    }
}

/// A run whose step leaves it going on takes its next steps in the same invocation
/// (`BATON_STEPS_IN_A_ROW`, 10 by default), each handing its run's next message to the next
/// in-process: a run of twelve tool steps takes a few invocations and sends a few messages,
/// against one of each a step when every step goes through the queue, and ends the same.
#[tokio::test]
async fn a_run_takes_its_steps_in_a_row_in_one_invocation() {
    let aws = Arc::new(Emulator::start().await);
    let mut replies: Vec<Value> = (0..11)
        .map(|i| json!({"tool_calls": [{"name": "echo", "arguments": {"text": format!("step {i}")}}]}))
        .collect();
    replies.push(json!({"text": "twelve"}));
    let script = json!({"ops": replies}).to_string();
    let agents = json!({"agents": {"ops": {"tools": ["echo"], "maxIterations": 30, "maxToolCallsPerTurn": 30}}});
    let mut seen = Vec::new();
    for (prefix, in_a_row) in [("row", None), ("single", Some(1))] {
        let mut options = aws
            .dev_options(
                aws.names(prefix),
                scripted(&script),
                catalog(Some(agents.clone())),
                0,
            )
            .await;
        options.steps_in_a_row = in_a_row;
        let server = aws.dev_host_from(options).await;
        let mut api = common::aws::Api::new(server.url());
        api.patience = Duration::from_secs(120);
        let run = api
            .post_ok("/runs", json!({"prompt": "go", "agent": "ops"}))
            .await["runId"]
            .as_str()
            .unwrap()
            .to_owned();
        let done = api.status(&run, "completed").await;
        assert_eq!(done["result"], "twelve");
        let tools = done["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "tool")
            .count();
        assert_eq!(tools, 11);
        let (warm, cold) = server.steps_taken();
        seen.push((server.billed().invocations, warm + cold));
        server.shutdown().await;
    }
    let [
        (row_invocations, row_steps),
        (single_invocations, single_steps),
    ] = seen[..]
    else {
        unreachable!()
    };
    // Every step through the queue: an invocation a step (the fault layer's throttles may
    // fail one and take another).
    assert!(single_invocations >= 12, "{seen:?}");
    // In a row: the start's invocation takes ten steps, the next the rest (one more for a
    // step the fault layer failed and the queue delivered again).
    assert!(row_invocations <= 4, "{seen:?}");
    assert!(row_steps >= 12 && single_steps >= 12, "{seen:?}");
}
