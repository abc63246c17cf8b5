//! Each provider's wire format for a call's controls — tool choice, reasoning, output
//! schema — against a mock of its API: what is sent, and what comes back of it.

use baton_core::llm::{
    ChatRequest, Controls, Effort, Llm, OUTPUT_TOOL, Reasoning, ToolChoice, ToolSpec,
};
use baton_core::timeline::{Entry, EntryBody};
use serde_json::{Value, json};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::testkit::{history, last_body, replying, request, tools};

fn verdict() -> ToolSpec {
    ToolSpec {
        name: OUTPUT_TOOL.into(),
        description: "the answer".into(),
        parameters: json!({"type": "object", "required": ["verdict"],
                           "properties": {"verdict": {"type": "string"}}}),
    }
}

/// The history with its reply's reasoning recorded, as a provider gave it.
fn history_with_reasoning(reasoning: Value) -> Vec<Entry> {
    let mut h = history();
    if let EntryBody::Assistant { reasoning: r, .. } = &mut h[1].body {
        *r = Some(reasoning);
    }
    h
}

mod openai {
    use super::*;
    use crate::openai::OpenAiLlm;

    fn client(server: &MockServer) -> OpenAiLlm {
        crate::openai::tests::client(server, 0)
    }

    /// `tool_choice` by name, `reasoning_effort` (from a budget), `response_format` with the
    /// schema; the reasoning tokens of the usage are read, as part of the output.
    #[tokio::test]
    async fn controls_are_sent_as_chat_completions_takes_them() {
        let server = replying(json!({
            "choices": [{"message": {"role": "assistant", "content": "{\"verdict\":\"ship\"}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 50, "total_tokens": 60,
                      "completion_tokens_details": {"reasoning_tokens": 42}}
        }))
        .await;
        let (h, t) = (history(), tools());
        let controls = Controls {
            tool_choice: Some(ToolChoice::Tool {
                tool: "echo".into(),
            }),
            reasoning: Some(Reasoning {
                effort: None,
                budget_tokens: Some(2048),
            }),
            output: Some(verdict()),
        };
        let mut req = request(&h, &t, None);
        req.controls = &controls;
        let reply = client(&server).complete(&req).await.expect("reply");
        let body = last_body(&server).await;
        assert_eq!(
            body["tool_choice"],
            json!({"type": "function", "function": {"name": "echo"}})
        );
        assert_eq!(body["reasoning_effort"], "low");
        assert_eq!(body["response_format"]["type"], "json_schema");
        assert_eq!(
            body["response_format"]["json_schema"]["schema"],
            verdict().parameters
        );
        assert_eq!(reply.text.as_deref(), Some("{\"verdict\":\"ship\"}"));
        assert_eq!(reply.usage.reasoning_tokens, 42);
        assert_eq!(reply.usage.output_tokens, 50, "reasoning is output");
    }

    /// `required` and `none` are sent as words; no tools, no choice.
    #[tokio::test]
    async fn a_choice_is_a_word_and_is_not_sent_without_tools() {
        let server = replying(json!({
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        }))
        .await;
        let (h, t) = (history(), tools());
        for (choice, word) in [
            (ToolChoice::Required, "required"),
            (ToolChoice::None, "none"),
        ] {
            let controls = Controls {
                tool_choice: Some(choice),
                ..Controls::default()
            };
            let mut req = request(&h, &t, None);
            req.controls = &controls;
            client(&server).complete(&req).await.expect("reply");
            assert_eq!(last_body(&server).await["tool_choice"], word);
            req.tools = &[];
            client(&server).complete(&req).await.expect("reply");
            assert!(last_body(&server).await.get("tool_choice").is_none());
        }
    }
}

mod anthropic {
    use super::*;
    use crate::anthropic::AnthropicLlm;

    fn client(server: &MockServer) -> AnthropicLlm {
        crate::anthropic::tests::client_with(server, 0)
    }

    fn message(content: Value) -> Value {
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
               "content": content, "stop_reason": "tool_use",
               "usage": {"input_tokens": 20, "output_tokens": 9}})
    }

    /// With no tools of its own, the agent's output schema is a tool the reply is forced to
    /// call; that call is the answer, as text.
    #[tokio::test]
    async fn an_output_schema_is_a_forced_tool_whose_input_is_the_answer() {
        let server = replying(message(json!([{"type": "tool_use", "id": "toolu_1",
            "name": OUTPUT_TOOL, "input": {"verdict": "ship"}}])))
        .await;
        let h = history();
        let controls = Controls {
            output: Some(verdict()),
            ..Controls::default()
        };
        let mut req = request(&h, &[], Some("claude-sonnet-4-5"));
        req.controls = &controls;
        let reply = client(&server).complete(&req).await.expect("reply");
        assert_eq!(reply.text.as_deref(), Some(r#"{"verdict":"ship"}"#));
        assert!(reply.tool_calls.is_empty(), "{:?}", reply.tool_calls);
        let body = last_body(&server).await;
        assert_eq!(
            body["tool_choice"],
            json!({"type": "tool", "name": OUTPUT_TOOL})
        );
        assert_eq!(body["tools"][0]["input_schema"], verdict().parameters);
        // With tools of its own, any tool: the agent's calls, or the answer.
        let t = tools();
        req.tools = &t;
        client(&server).complete(&req).await.expect("reply");
        let body = last_body(&server).await;
        assert_eq!(body["tool_choice"], json!({"type": "any"}));
        let names: Vec<&str> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["echo", OUTPUT_TOOL]);
    }

    /// Thinking is asked for with its budget (`max_tokens` above it), takes no forced tool,
    /// and the signed thinking blocks of a reply are given back before its text and calls.
    #[tokio::test]
    async fn thinking_has_its_budget_and_its_blocks_are_given_back() {
        let thinking = json!([{"type": "thinking", "thinking": "Echo it.", "signature": "sig=="},
                              {"type": "redacted_thinking", "data": "xyz"}]);
        let mut content = thinking.as_array().unwrap().clone();
        content.push(json!({"type": "text", "text": "Done."}));
        let server = replying(message(Value::Array(content))).await;
        let h = history_with_reasoning(thinking.clone());
        let t = tools();
        let controls = Controls {
            tool_choice: Some(ToolChoice::Required),
            reasoning: Some(Reasoning {
                effort: Some(Effort::High),
                budget_tokens: None,
            }),
            output: None,
        };
        let mut req = request(&h, &t, Some("claude-sonnet-4-5"));
        req.controls = &controls;
        let reply = client(&server).complete(&req).await.expect("reply");
        assert_eq!(reply.reasoning, Some(thinking.clone()));
        let body = last_body(&server).await;
        assert_eq!(
            body["thinking"],
            json!({"type": "enabled", "budget_tokens": 24576})
        );
        assert_eq!(body["max_tokens"], 1024 + 24576);
        assert_eq!(body["tool_choice"], json!({"type": "auto"}));
        let assistant = &body["messages"][1];
        assert_eq!(assistant["role"], "assistant");
        assert_eq!(assistant["content"][0], thinking[0]);
        assert_eq!(assistant["content"][1], thinking[1]);
        assert_eq!(assistant["content"][2]["type"], "tool_use");
    }

    /// A streamed reply's thinking is kept, with the signature its deltas spell.
    #[tokio::test]
    async fn a_streamed_replys_thinking_is_kept_with_its_signature() {
        let events = [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 5}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Think"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "ing."}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig=="}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi."}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 30}}),
            json!({"type": "message_stop"}),
        ];
        let body: String = events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect();
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("content-type", "text/event-stream")
                    .set_body_string(body),
            )
            .mount(&server)
            .await;
        let (h, t) = (history(), tools());
        let recorder = crate::testkit::Recorder::default();
        let controls = Controls {
            reasoning: Some(Reasoning {
                effort: None,
                budget_tokens: Some(4000),
            }),
            ..Controls::default()
        };
        let mut req = request(&h, &t, Some("claude-sonnet-4-5"));
        req.controls = &controls;
        req.deltas = Some(&recorder);
        let reply = client(&server).complete(&req).await.expect("reply");
        assert_eq!(reply.text.as_deref(), Some("Hi."));
        assert_eq!(
            reply.reasoning,
            Some(json!([{"type": "thinking", "thinking": "Thinking.", "signature": "sig=="}]))
        );
        assert_eq!(reply.usage.output_tokens, 30);
    }
}

mod bedrock {
    use super::*;
    use crate::bedrock::BedrockLlm;

    const CLAUDE: &str = "anthropic.claude-sonnet-4-5-v1:0";
    const NOVA: &str = "amazon.nova-2-lite-v1:0";

    fn llm(server: &MockServer) -> BedrockLlm {
        crate::bedrock::tests::llm_with(server, 0)
    }

    fn converse(content: Value) -> Value {
        json!({"output": {"message": {"role": "assistant", "content": content}},
               "stopReason": "tool_use",
               "usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}})
    }

    /// The output schema is a forced tool (`toolChoice.tool`), its call the answer; a
    /// required choice is `any`.
    #[tokio::test]
    async fn an_output_schema_is_a_forced_tool_and_required_is_any() {
        let server = replying(converse(json!([{"toolUse": {"toolUseId": "t1",
            "name": OUTPUT_TOOL, "input": {"verdict": "hold"}}}])))
        .await;
        let h = history();
        let controls = Controls {
            output: Some(verdict()),
            ..Controls::default()
        };
        let mut req = request(&h, &[], Some(NOVA));
        req.controls = &controls;
        let reply = llm(&server).complete(&req).await.expect("reply");
        assert_eq!(reply.text.as_deref(), Some(r#"{"verdict":"hold"}"#));
        assert!(reply.tool_calls.is_empty());
        let body = last_body(&server).await;
        assert_eq!(
            body["toolConfig"]["toolChoice"],
            json!({"tool": {"name": OUTPUT_TOOL}})
        );
        let t = tools();
        let controls = Controls {
            tool_choice: Some(ToolChoice::Required),
            ..Controls::default()
        };
        let mut req = request(&h, &t, Some(NOVA));
        req.controls = &controls;
        llm(&server).complete(&req).await.expect("reply");
        assert_eq!(
            last_body(&server).await["toolConfig"]["toolChoice"],
            json!({"any": {}})
        );
    }

    /// Claude thinks with a budget (`maxTokens` above it), Amazon's models with an effort;
    /// reasoning content comes back, and is given back signed.
    #[tokio::test]
    async fn reasoning_goes_in_the_models_own_fields_and_comes_back() {
        let reasoning = json!([{"text": "Echo it.", "signature": "sig=="}]);
        let server = replying(converse(json!([
            {"reasoningContent": {"reasoningText": {"text": "Echo it.", "signature": "sig=="}}},
            {"text": "Done."}
        ])))
        .await;
        let h = history_with_reasoning(reasoning.clone());
        let t = tools();
        let controls = Controls {
            reasoning: Some(Reasoning {
                effort: Some(Effort::Medium),
                budget_tokens: None,
            }),
            ..Controls::default()
        };
        let mut req = request(&h, &t, Some(CLAUDE));
        req.controls = &controls;
        let reply = llm(&server).complete(&req).await.expect("reply");
        assert_eq!(reply.reasoning, Some(reasoning));
        let body = last_body(&server).await;
        assert_eq!(
            body["additionalModelRequestFields"],
            json!({"thinking": {"type": "enabled", "budget_tokens": 8192}})
        );
        assert_eq!(body["inferenceConfig"]["maxTokens"], 512 + 8192);
        assert_eq!(
            body["messages"][1]["content"][0],
            json!({"reasoningContent": {"reasoningText": {"text": "Echo it.", "signature": "sig=="}}})
        );
        let mut req = request(&h, &t, Some(NOVA));
        req.controls = &controls;
        llm(&server).complete(&req).await.expect("reply");
        let body = last_body(&server).await;
        assert_eq!(
            body["additionalModelRequestFields"],
            json!({"reasoningConfig": {"type": "enabled", "maxReasoningEffort": "medium"}})
        );
        assert_eq!(body["inferenceConfig"]["maxTokens"], 512);
    }
}

/// A request's controls are its own: the default sends none of them.
#[test]
fn no_controls_by_default() {
    let (h, t) = (history(), tools());
    let req: ChatRequest<'_> = request(&h, &t, None);
    assert_eq!(*req.controls, Controls::NONE);
    assert_eq!(Controls::default(), Controls::NONE);
}
