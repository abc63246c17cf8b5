//! The OpenAI-compatible client against a mock server (wiremock).

use super::*;
use crate::testkit::{history, tools};
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

pub(crate) fn client(server: &MockServer, retries: u32) -> OpenAiLlm {
    OpenAiLlm::new(OpenAiConfig {
        max_tokens: None,
        base_url: format!("{}/v1", server.uri()),
        api_key: Some("sk-test".into()),
        model: "test-model".into(),
        max_retries: retries,
        backoff: Backoff::fast(),
        timeout: Duration::from_secs(5),
    })
    .expect("client")
}

fn ok_body() -> Value {
    json!({
        "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_b", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"y\"}"}}
        ]}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    })
}

async fn call(llm: &OpenAiLlm) -> Result<LlmReply, LlmError> {
    let (h, t) = (history(), tools());
    llm.complete(&ChatRequest {
        max_output_tokens: None,
        run_id: "r",
        agent: "a",
        think_index: 1,
        model: None,
        system: "be brief",
        tools: &t,
        history: &h,
        deltas: None,
        controls: &baton_core::llm::Controls::NONE,
        images: &[],
    })
    .await
}

#[tokio::test]
async fn tool_calls_round_trip_with_usage() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-test"))
        .and(body_partial_json(json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"x\"}"}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "x"}
            ],
            "tools": [{"type": "function", "function": {"name": "echo"}}]
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(ok_body()))
        .expect(1)
        .mount(&server)
        .await;
    let reply = call(&client(&server, 0)).await.expect("reply");
    assert_eq!(
        reply.tool_calls,
        vec![ToolCall {
            id: "call_b".into(),
            name: "echo".into(),
            arguments: r#"{"text":"y"}"#.into()
        }]
    );
    assert_eq!(
        reply.usage,
        Usage {
            input_tokens: 11,
            output_tokens: 7,
            total_tokens: 18,
            cached_input_tokens: 0,
            reasoning_tokens: 0,
        }
    );
    assert_eq!(reply.model.as_deref(), Some("openai:test-model"));
    assert_eq!(reply.text, None);
}

/// The output limit the request gives, under `max_tokens` (a compatible server's name);
/// a reply that stopped there is marked cut.
#[tokio::test]
async fn the_output_limit_is_sent_and_a_reply_cut_there_is_marked() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(body_partial_json(json!({"max_tokens": 77})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"role": "assistant", "content": "The answer is"},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 77}
        })))
        .expect(1)
        .mount(&server)
        .await;
    let (h, t) = (history(), tools());
    let mut req = crate::testkit::request(&h, &t, None);
    req.max_output_tokens = Some(77);
    let reply = client(&server, 0).complete(&req).await.expect("reply");
    assert_eq!(reply.cut.as_deref(), Some("length"));
    assert_eq!(reply.text.as_deref(), Some("The answer is"));
    // A whole reply is not.
    assert_eq!(call_default_limit(&server).await, None);
}

/// With no limit in the request, the configured one (`BATON_MAX_OUTPUT_TOKENS`).
async fn call_default_limit(server: &MockServer) -> Option<String> {
    server.reset().await;
    Mock::given(method("POST"))
        .and(body_partial_json(json!({"max_tokens": 4096})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"role": "assistant", "content": "Whole."},
                         "finish_reason": "stop"}]
        })))
        .expect(1)
        .mount(server)
        .await;
    let mut llm = client(server, 0);
    llm.cfg.max_tokens = Some(4096);
    call(&llm).await.expect("reply").cut
}

/// An endpoint that refuses `max_tokens` and names `max_completion_tokens` (OpenAI's
/// newer models) gets the limit by that name, in the same call and the next.
#[tokio::test]
async fn an_endpoint_that_refuses_max_tokens_gets_max_completion_tokens() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(body_partial_json(json!({"max_tokens": 50})))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({"error": {
            "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
            "type": "invalid_request_error", "param": "max_tokens",
            "code": "unsupported_parameter"}})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(body_partial_json(json!({"max_completion_tokens": 50})))
        .respond_with(ResponseTemplate::new(200).set_body_json(ok_body()))
        .expect(2)
        .mount(&server)
        .await;
    let llm = client(&server, 0);
    let (h, t) = (history(), tools());
    let mut req = crate::testkit::request(&h, &t, None);
    req.max_output_tokens = Some(50);
    for _ in 0..2 {
        let reply = llm.complete(&req).await.expect("reply");
        assert_eq!(reply.tool_calls.len(), 1);
    }
    // OpenAI's own API is asked by that name from the start.
    let openai = OpenAiLlm::new(OpenAiConfig {
        base_url: "https://api.openai.com/v1".into(),
        ..llm.cfg.clone()
    })
    .expect("client");
    assert_eq!(openai.limit_param(), "max_completion_tokens");
    // An older API version that does not know that name gets `max_tokens` back.
    assert!(
        openai.switch_limit_param("Unrecognized request argument supplied: max_completion_tokens")
    );
    assert_eq!(openai.limit_param(), "max_tokens");
    // A 400 about something else switches nothing.
    assert!(!openai.switch_limit_param("messages: too long"));
    assert_eq!(openai.limit_param(), "max_tokens");
}

#[tokio::test]
async fn rate_limit_then_success_honours_retry_after() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "0"))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(ok_body()))
        .expect(1)
        .mount(&server)
        .await;
    let reply = call(&client(&server, 3))
        .await
        .expect("second attempt succeeds");
    assert_eq!(reply.usage.total_tokens, 18);
}

#[tokio::test]
async fn server_errors_exhaust_the_retries() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_string("upstream down"))
        .expect(3)
        .mount(&server)
        .await;
    match call(&client(&server, 2)).await {
        Err(LlmError::Unavailable { message, .. }) => {
            assert!(
                message.contains("3 attempts") && message.contains("upstream down"),
                "{message}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn client_errors_and_malformed_replies_are_fatal() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_string("{\"choices\": 42}"))
        .expect(1)
        .mount(&server)
        .await;
    match call(&client(&server, 3)).await {
        Err(LlmError::Fatal { message: m, .. }) => assert!(m.contains("malformed"), "{m}"),
        other => panic!("expected Fatal, got {other:?}"),
    }
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(401).set_body_string("bad key"))
        .expect(1)
        .mount(&server)
        .await;
    match call(&client(&server, 3)).await {
        Err(LlmError::Fatal { message: m, .. }) => {
            assert!(m.contains("401") && m.contains("bad key"), "{m}")
        }
        other => panic!("expected Fatal, got {other:?}"),
    }
    assert!(matches!(
        parse(br#"{"choices": []}"#, "m"),
        Err(LlmError::Fatal { .. })
    ));
    assert!(matches!(
        parse(br#"{"choices": [{"message": {"content": ""}}]}"#, "m"),
        Err(LlmError::Fatal { .. })
    ));
}
