//! The full flow over AWS wire protocols: an emulator for DynamoDB, SQS FIFO, EventBridge
//! and Scheduler (moto's server, or LocalStack, with or without the fault layer: see
//! `common/aws.rs`), in-process event source mappings standing in for Lambda's, and a mock
//! OpenAI-compatible server on loopback.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::aws::Emulator;
use common::fault::Faults;
use common::host::{AwsHost, TestHost};
use common::*;
use serde_json::{Value, json};

/// `baton dev --aws` over its own emulator, thinking from a mock OpenAI server.
pub(super) struct Env {
    pub(super) host: AwsHost,
    _mock: wiremock::MockServer,
}

/// `baton dev --aws` over a fresh emulator, thinking from `script` (a mock OpenAI server),
/// its AWS clients going through the fault layer with `faults` (none: straight to the
/// emulator), turned on once the resources exist; every message delivered twice when
/// `duplicate`.
pub(super) async fn start_env(
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

/// [`start_env`] with `catalog`, its model calls routed by provider as a deployment's are
/// (`openai:backup` reaches the mock as `backup`), under the scenario's faults.
pub(super) async fn start_routed_env(
    script: &str,
    catalog: Arc<baton_core::agent::Catalog>,
) -> Env {
    let aws = Arc::new(Emulator::start_with(common::aws::scenario_faults()).await);
    let (mock, llm) = common::mock_openai::start(script).await;
    let models = Arc::new(baton_llm::Models::new("mock").openai(llm));
    let mut options = aws.dev_options(aws.names("flow"), models, catalog, 0).await;
    options.links = None;
    Env {
        host: AwsHost::start(aws, options).await,
        _mock: mock,
    }
}

/// The scenarios' agents, as the mock model's scripts name them.
pub(super) fn named_agents() -> Arc<baton_core::agent::Catalog> {
    catalog(Some(common::mock_openai::named_agents()))
}

/// Runs the full flow, every message delivered twice when `duplicate`.
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

/// The full flow in `env` (started with `examples/full-flow.json`), written once for both
/// hosts.
async fn full_flow_in(mut env: Env) -> Value {
    let shape = super::both_hosts::full_flow(&mut env.host).await;
    env.host.stop().await;
    shape
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

impl Env {
    /// A run that asks the 5 s question: its id, and the question once it is pending.
    pub(super) async fn ask(&self) -> (String, Value) {
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
    ) -> Result<Value, baton_core::tools::ToolError> {
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
