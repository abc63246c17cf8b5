//! A rotated model key does not fail runs: the OpenAI-compatible client re-reads the key
//! from Secrets Manager (an emulator's) when the provider answers 401, at most once a minute.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::llm::{ChatRequest, Llm, LlmError};
use baton_lambda::SecretKey;
use baton_llm::openai::{OpenAiConfig, OpenAiLlm};
use common::aws::Emulator;
use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A provider that accepts exactly one key.
async fn provider_accepting(server: &MockServer, key: &str) {
    server.reset().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", format!("Bearer {key}").as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"choices": [{"message": {"role": "assistant", "content": "hello"}}]}),
        ))
        .with_priority(1)
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(401).set_body_json(json!({"error": {"message": "bad key"}})),
        )
        .with_priority(2)
        .mount(server)
        .await;
}

#[tokio::test]
async fn a_rotated_secret_is_read_again_after_a_401_at_most_once_a_minute() {
    let aws = Emulator::start_with(None).await;
    let sdk = aws.sdk().await;
    let sm = aws_sdk_secretsmanager::Client::new(&sdk);
    let arn = sm
        .create_secret()
        .name(format!("baton/model-key-{}", uuid::Uuid::new_v4().simple()))
        .secret_string("sk-old")
        .send()
        .await
        .unwrap()
        .arn()
        .unwrap()
        .to_owned();
    let provider = MockServer::start().await;
    let source = SecretKey {
        client: sm.clone(),
        arn: arn.clone(),
    };
    let llm = OpenAiLlm::new(OpenAiConfig {
        max_tokens: None,
        base_url: format!("{}/v1", provider.uri()),
        api_key: Some("sk-old".into()),
        model: "m".into(),
        max_retries: 0,
        backoff: baton_llm::retry::Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(1),
        },
        timeout: Duration::from_secs(5),
    })
    .unwrap()
    .with_key_source(Some(Arc::new(source)));
    let request = ChatRequest {
        max_output_tokens: None,
        run_id: "run_1",
        agent: "explore",
        think_index: 0,
        model: None,
        system: "",
        tools: &[],
        history: &[],
        deltas: None,
        controls: &baton_core::llm::Controls::NONE,
        images: &[],
    };

    // The key is rotated: the provider now wants the new one, and the secret holds it.
    sm.put_secret_value()
        .secret_id(&arn)
        .secret_string("sk-new")
        .send()
        .await
        .unwrap();
    provider_accepting(&provider, "sk-new").await;
    let reply = llm.complete(&request).await.unwrap();
    assert_eq!(reply.text.as_deref(), Some("hello"));
    // And stays in use.
    assert!(llm.complete(&request).await.is_ok());

    // Rotated again within the minute: the secret is not read again yet, the call fails
    // with the provider's words, as a refused key must.
    sm.put_secret_value()
        .secret_id(&arn)
        .secret_string("sk-newer")
        .send()
        .await
        .unwrap();
    provider_accepting(&provider, "sk-newer").await;
    match llm.complete(&request).await {
        Err(LlmError::Fatal { message: m, .. }) => assert!(m.contains("401"), "{m}"),
        other => panic!("{other:?}"),
    }
}
