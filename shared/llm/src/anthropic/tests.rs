//! The anthropic client against a mock of its API (wiremock).
use super::*;
use crate::testkit::{history, request, tools};
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

pub(crate) fn client(server: &MockServer) -> AnthropicLlm {
    client_with(server, 3)
}

pub(crate) fn client_with(server: &MockServer, max_retries: u32) -> AnthropicLlm {
    AnthropicLlm::new(AnthropicConfig {
        base_url: server.uri(),
        api_key: Some("sk-ant-test".into()),
        max_tokens: 1024,
        max_retries,
        backoff: Backoff::fast(),
        timeout: Duration::from_secs(5),
    })
    .expect("client")
}

async fn call(llm: &AnthropicLlm) -> Result<LlmReply, LlmError> {
    let (h, t) = (history(), tools());
    llm.complete(&request(&h, &t, Some("claude-sonnet-4-5")))
        .await
}

fn reply_body() -> Value {
    json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [
            {"type": "text", "text": "Let me echo."},
            {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "y"}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 20, "output_tokens": 9,
                  "cache_read_input_tokens": 100, "cache_creation_input_tokens": 0}
    })
}

/// The request's limit is sent as `max_tokens`; `stop_reason: max_tokens` marks the
/// reply cut.
#[tokio::test]
async fn the_output_limit_is_sent_and_a_reply_cut_there_is_marked() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(body_partial_json(json!({"max_tokens": 64})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "The answer is"}],
            "stop_reason": "max_tokens",
            "usage": {"input_tokens": 20, "output_tokens": 64}
        })))
        .expect(1)
        .mount(&server)
        .await;
    let (h, t) = (history(), tools());
    let mut req = request(&h, &t, Some("claude-sonnet-4-5"));
    req.max_output_tokens = Some(64);
    let reply = client(&server).complete(&req).await.expect("reply");
    assert_eq!(reply.cut.as_deref(), Some("max_tokens"));
    assert_eq!(reply.text.as_deref(), Some("The answer is"));
}

#[tokio::test]
async fn tool_use_round_trips_with_usage() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", "sk-ant-test"))
        .and(header("anthropic-version", API_VERSION))
        .and(body_partial_json(json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": "be brief",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_a", "name": "echo", "input": {"text": "x"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_a", "content": "x"}]}
            ],
            "tools": [{"name": "echo", "description": "d", "input_schema": {"type": "object"}}]
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(reply_body()))
        .expect(1)
        .mount(&server)
        .await;
    let reply = call(&client(&server)).await.expect("reply");
    assert_eq!(reply.text.as_deref(), Some("Let me echo."));
    assert_eq!(
        reply.tool_calls,
        vec![ToolCall {
            id: "toolu_1".into(),
            name: "echo".into(),
            arguments: r#"{"text":"y"}"#.into()
        }]
    );
    assert_eq!(
        reply.usage,
        Usage {
            input_tokens: 120,
            output_tokens: 9,
            total_tokens: 129,
            cached_input_tokens: 100,
            reasoning_tokens: 0,
        }
    );
    assert_eq!(reply.model.as_deref(), Some("anthropic:claude-sonnet-4-5"));
}

#[tokio::test]
async fn rate_limits_and_overload_are_retried_until_success() {
    let server = MockServer::start().await;
    let error =
        |kind: &str| json!({"type": "error", "error": {"type": kind, "message": "slow down"}});
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("retry-after", "0")
                .set_body_json(error("rate_limit_error")),
        )
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(529).set_body_json(error("overloaded_error")))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(reply_body()))
        .expect(1)
        .mount(&server)
        .await;
    let reply = call(&client(&server)).await.expect("third attempt");
    assert_eq!(reply.tool_calls.len(), 1);
}

#[tokio::test]
async fn auth_and_validation_errors_are_terminal_in_the_apis_words() {
    for (status, kind, words) in [
        (
            400,
            "invalid_request_error",
            "messages: roles must alternate",
        ),
        (401, "authentication_error", "invalid x-api-key"),
    ] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(status).set_body_json(
                    json!({"type": "error", "error": {"type": kind, "message": words}}),
                ),
            )
            .expect(1)
            .mount(&server)
            .await;
        match call(&client(&server)).await {
            Err(LlmError::Fatal { message: m, .. }) => {
                assert!(m.contains(kind) && m.contains(words), "{m}")
            }
            other => panic!("expected a fatal error, got {other:?}"),
        }
    }
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("down"))
        .expect(4)
        .mount(&server)
        .await;
    match call(&client(&server)).await {
        Err(LlmError::Unavailable { message, .. }) => {
            assert!(message.contains("4 attempts"), "{message}")
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}

#[test]
fn consecutive_results_and_a_following_message_share_one_user_turn() {
    let llm = AnthropicLlm::new(AnthropicConfig {
        base_url: "http://127.0.0.1:1".into(),
        api_key: None,
        max_tokens: 10,
        max_retries: 0,
        backoff: Backoff::fast(),
        timeout: Duration::from_secs(1),
    })
    .expect("client");
    let mut h = history();
    let mut second = h[2].clone();
    second.seq = 3;
    if let baton_core::timeline::EntryBody::Tool(t) = &mut second.body {
        t.id = "call_b".into();
        t.result = baton_core::timeline::ToolResult::error("boom");
    }
    h.push(second);
    h.push(baton_core::timeline::Entry {
        seq: 4,
        at: h[0].at,
        body: baton_core::timeline::EntryBody::user("and then?"),
    });
    let body = llm.body(&request(&h, &[], None), "m");
    let messages = body["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 3, "{body:#}");
    let last = messages[2]["content"].as_array().expect("blocks");
    assert_eq!(last.len(), 3);
    assert_eq!(last[1]["is_error"], true);
    assert_eq!(last[2]["text"], "and then?");
    assert!(body.get("tools").is_none());
}
