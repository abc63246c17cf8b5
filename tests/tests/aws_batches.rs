//! Steps in Lambda's batches over AWS wire protocols: deadlines, deferrals and backoff, many
//! runs in one batch with a slow model, steps in a row, and the recursive-loop rule.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::ports::SystemClock;
use baton_dev::{AwsDevOptions, AwsDevServer};
use common::aws::Emulator;
use common::*;
use serde_json::{Value, json};

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
        runs.push(
            service
                .requests()
                .create_run("o", req, None)
                .await
                .unwrap()
                .run_id,
        );
    }
    // Two follow-ups behind the first run's start: three records of its FIFO group.
    for text in ["and then?", "and after that?"] {
        service
            .requests()
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
        let rec = service.requests().get_run("o", r, 100).await.unwrap();
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
    let run_id = service
        .requests()
        .create_run("o", req, None)
        .await
        .unwrap()
        .run_id;

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
        runs.push(
            api.requests()
                .create_run("o", req, None)
                .await
                .unwrap()
                .run_id,
        );
    }
    let server = AwsDevServer::start(AwsDevOptions {
        function_timeout: Some(timeout),
        // Two at once, the fewest a function steps (a 128 MB one's, or BATON_STEPS_AT_ONCE):
        // ten runs take five rounds of a model call each.
        steps_at_once: Some(2),
        ..AwsDevOptions::new(sdk.clone(), names, role, TOKEN, llm, catalog)
    })
    .await
    .unwrap();

    let started = Instant::now();
    for r in &runs {
        loop {
            let rec = api.requests().get_run("o", r, 100).await.unwrap();
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
