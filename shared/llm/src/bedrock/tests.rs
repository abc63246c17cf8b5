//! The bedrock client against a mock of its API (wiremock).
use super::*;
use crate::testkit::{history, request, tools};
use aws_sdk_bedrockruntime::config::{BehaviorVersion, Credentials, Region};
use serde_json::json;
use wiremock::matchers::{body_partial_json, header_exists, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const MODEL: &str = "anthropic.claude-3-5-haiku-20241022-v1:0";

fn llm(server: &MockServer) -> BedrockLlm {
    llm_with(server, 3)
}

pub(crate) fn llm_with(server: &MockServer, max_retries: u32) -> BedrockLlm {
    let sdk = aws_sdk_bedrockruntime::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(server.uri())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("AKID", "secret", None, None, "test"));
    BedrockLlm::new(
        client(&sdk, std::time::Duration::from_secs(5)),
        BedrockConfig {
            max_tokens: 512,
            max_retries,
            backoff: Backoff::fast(),
            timeout: std::time::Duration::from_secs(5),
        },
    )
}

async fn call(llm: &BedrockLlm) -> Result<LlmReply, LlmError> {
    let (h, t) = (history(), tools());
    llm.complete(&request(&h, &t, Some(MODEL))).await
}

fn converse_path() -> wiremock::matchers::PathExactMatcher {
    // The SDK sends the model id percent-encoded in the path.
    path(format!("/model/{}/converse", MODEL.replace(':', "%3A")))
}

fn reply_body() -> Value {
    json!({
        "output": {"message": {"role": "assistant", "content": [
            {"text": "Echoing."},
            {"toolUse": {"toolUseId": "tooluse_1", "name": "echo", "input": {"text": "y"}}}
        ]}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 30, "outputTokens": 8, "totalTokens": 38,
                  "cacheReadInputTokens": 12},
        "metrics": {"latencyMs": 4}
    })
}

fn error(status: u16, kind: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("x-amzn-errortype", kind)
        .set_body_json(json!({"message": message}))
}

#[tokio::test]
async fn tool_use_round_trips_with_usage_over_converse() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(converse_path())
        .and(header_exists("authorization"))
        .and(body_partial_json(json!({
            "system": [{"text": "be brief"}],
            "messages": [
                {"role": "user", "content": [{"text": "hi"}]},
                {"role": "assistant", "content": [
                    {"toolUse": {"toolUseId": "call_a", "name": "echo", "input": {"text": "x"}}}]},
                {"role": "user", "content": [
                    {"toolResult": {"toolUseId": "call_a", "content": [{"text": "x"}],
                                    "status": "success"}}]}
            ],
            "toolConfig": {"tools": [{"toolSpec": {"name": "echo", "description": "d",
                "inputSchema": {"json": {"type": "object"}}}}]},
            "inferenceConfig": {"maxTokens": 512}
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(reply_body()))
        .expect(1)
        .mount(&server)
        .await;
    let reply = call(&llm(&server)).await.expect("reply");
    assert_eq!(reply.text.as_deref(), Some("Echoing."));
    assert_eq!(
        reply.tool_calls,
        vec![ToolCall {
            id: "tooluse_1".into(),
            name: "echo".into(),
            arguments: r#"{"text":"y"}"#.into()
        }]
    );
    assert_eq!(
        reply.usage,
        Usage {
            input_tokens: 42,
            output_tokens: 8,
            total_tokens: 50,
            cached_input_tokens: 12,
            reasoning_tokens: 0,
        }
    );
    assert_eq!(reply.model, Some(format!("bedrock:{MODEL}")));
}

#[tokio::test]
async fn throttling_is_retried_until_success() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(error(429, "ThrottlingException", "Too many requests"))
        .up_to_n_times(2)
        .expect(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(reply_body()))
        .expect(1)
        .mount(&server)
        .await;
    let reply = call(&llm(&server)).await.expect("third attempt");
    assert_eq!(reply.tool_calls.len(), 1);
}

#[tokio::test]
async fn access_and_validation_errors_are_terminal_in_bedrocks_words() {
    for (status, kind, words) in [
        (
            400,
            "ValidationException",
            "The provided model identifier is invalid.",
        ),
        (
            403,
            "AccessDeniedException",
            "You don't have access to the model",
        ),
    ] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(error(status, kind, words))
            .expect(1)
            .mount(&server)
            .await;
        match call(&llm(&server)).await {
            Err(LlmError::Fatal { message: m, .. }) => {
                assert!(m.contains(kind) && m.contains(words), "{m}")
            }
            other => panic!("expected a fatal error, got {other:?}"),
        }
    }
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(error(503, "ServiceUnavailableException", "try later"))
        .expect(4)
        .mount(&server)
        .await;
    match call(&llm(&server)).await {
        Err(LlmError::Unavailable { message, .. }) => {
            assert!(
                message.contains("4 attempts") && message.contains("try later"),
                "{message}"
            )
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}

#[test]
fn json_and_documents_convert_both_ways() {
    let v = json!({"a": [1, -2, 2.5, "s", true, null], "b": {"c": {}}});
    assert_eq!(to_json(&to_document(&v)), v);
}
