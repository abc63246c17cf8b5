//! The Messages API's streamed replies (`stream: true`): Server-Sent Events named by type —
//! `message_start` (the input usage), `content_block_start` (a text block, or a `tool_use`
//! with its id and name), `content_block_delta` (`text_delta`, or `input_json_delta` pieces
//! of a tool's input), `content_block_stop`, `message_delta` (the stop reason and the output
//! usage so far), `message_stop`, `ping`, and `error` mid-stream.

use serde::Deserialize;
use serde_json::{Value, json};

use baton_core::llm::{Deltas, LlmReply, ToolCall};

use super::{ApiUsage, reply};
use crate::retry::Attempt;
use crate::sse::SseReader;

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: Start,
    },
    ContentBlockStart {
        index: usize,
        content_block: BlockStart,
    },
    ContentBlockDelta {
        index: usize,
        delta: Delta,
    },
    MessageDelta {
        #[serde(default)]
        delta: MessageDelta,
        #[serde(default)]
        usage: Option<OutputUsage>,
    },
    MessageStop,
    Error {
        error: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct Start {
    #[serde(default)]
    usage: ApiUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockStart {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Delta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "signature_delta")]
    Signature { signature: String },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct MessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct OutputUsage {
    #[serde(default)]
    output_tokens: u64,
}

/// One content block as it grows.
enum Block {
    Text(String),
    /// The tool call's place among the reply's calls, and the call.
    Tool(u32, ToolCall),
    /// Extended thinking: its text and its signature (given back with the reply).
    Thinking(String, String),
    Redacted(String),
    Other,
}

/// Reads a streamed reply to its `message_stop`, each piece handed to `deltas`.
pub(super) async fn read(
    mut resp: reqwest::Response,
    deltas: &dyn Deltas,
    model: &str,
) -> Attempt<LlmReply> {
    let retry = |why: String| Attempt::Retry {
        why,
        wait: None,
        source: None,
    };
    let mut reader = SseReader::default();
    let (mut blocks, mut usage, mut stop_reason, mut calls) =
        (Vec::new(), ApiUsage::default(), None, 0);
    loop {
        let (events, ended) = match resp.chunk().await {
            Ok(Some(bytes)) => (reader.push(&bytes), false),
            Ok(None) => (reader.finish().into_iter().collect(), true),
            Err(e) => return retry(format!("reading the streamed reply failed: {e}")),
        };
        for e in events {
            let event: Event = match serde_json::from_str(&e.data) {
                Ok(ev) => ev,
                Err(err) => {
                    return Attempt::Fatal(format!("malformed event from Anthropic: {err}"));
                }
            };
            match event {
                Event::MessageStart { message } => usage = message.usage,
                Event::ContentBlockStart {
                    index,
                    content_block,
                } => {
                    let block = match content_block {
                        BlockStart::Text { text } => {
                            if !text.is_empty() {
                                deltas.text(&text);
                            }
                            Block::Text(text)
                        }
                        BlockStart::ToolUse { id, name } => {
                            deltas.tool_call(calls, Some(&id), Some(&name), "");
                            calls += 1;
                            let call = ToolCall {
                                id,
                                name,
                                arguments: String::new(),
                            };
                            Block::Tool(calls - 1, call)
                        }
                        BlockStart::Thinking { thinking } => {
                            Block::Thinking(thinking, String::new())
                        }
                        BlockStart::RedactedThinking { data } => Block::Redacted(data),
                        BlockStart::Other => Block::Other,
                    };
                    if blocks.len() <= index {
                        blocks.resize_with(index + 1, || Block::Other);
                    }
                    blocks[index] = block;
                }
                Event::ContentBlockDelta { index, delta } => match (blocks.get_mut(index), delta) {
                    (Some(Block::Text(t)), Delta::Text { text }) => {
                        deltas.text(&text);
                        t.push_str(&text);
                    }
                    (Some(Block::Tool(i, call)), Delta::InputJson { partial_json }) => {
                        deltas.tool_call(*i, None, None, &partial_json);
                        call.arguments.push_str(&partial_json);
                    }
                    (Some(Block::Thinking(t, _)), Delta::Thinking { thinking }) => {
                        t.push_str(&thinking);
                    }
                    (Some(Block::Thinking(_, sig)), Delta::Signature { signature }) => {
                        sig.push_str(&signature);
                    }
                    _ => {}
                },
                Event::MessageDelta { delta, usage: out } => {
                    stop_reason = delta.stop_reason.or(stop_reason);
                    if let Some(out) = out {
                        usage.output_tokens = out.output_tokens;
                    }
                }
                Event::MessageStop => {
                    let mut text = String::new();
                    let mut tool_calls = Vec::new();
                    let mut thinking = Vec::new();
                    for b in blocks {
                        match b {
                            Block::Text(t) => text.push_str(&t),
                            Block::Tool(_, mut call) => {
                                // As a whole reply's `input` reads (an object, compact).
                                call.arguments = crate::whole_arguments(&call.arguments);
                                tool_calls.push(call);
                            }
                            Block::Thinking(t, signature) => thinking.push(json!(
                                {"type": "thinking", "thinking": t, "signature": signature}
                            )),
                            Block::Redacted(data) => {
                                thinking.push(json!({"type": "redacted_thinking", "data": data}));
                            }
                            Block::Other => {}
                        }
                    }
                    return match reply(text, tool_calls, usage, stop_reason.as_deref(), model) {
                        Ok(mut r) => {
                            r.reasoning = (!thinking.is_empty()).then_some(Value::Array(thinking));
                            Attempt::Done(r)
                        }
                        Err(why) => Attempt::Fatal(why),
                    };
                }
                // `overloaded_error` and the like, mid-stream: worth another attempt.
                Event::Error { error } => {
                    return retry(format!("Anthropic's stream ended in an error: {error}"));
                }
                Event::Other => {}
            }
        }
        if ended {
            return retry("the streamed reply ended before `message_stop`".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use baton_core::llm::{ChatRequest, Llm, LlmError};
    use serde_json::{Value, json};
    use wiremock::matchers::{body_partial_json, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use crate::anthropic::AnthropicLlm;
    use crate::anthropic::tests::client_with as client;
    use crate::testkit::{Recorder, history, request, tools};

    /// The events Anthropic documents for "Let me echo." and `echo({"text": "y"})`.
    fn events() -> Vec<(&'static str, Value)> {
        vec![
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5", "stop_reason": null, "usage": {"input_tokens": 20, "output_tokens": 1, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 0}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            ("ping", json!({"type": "ping"})),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "echo."}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"text\": "}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"y\"}"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 9}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ]
    }

    fn sse(events: &[(&str, Value)]) -> ResponseTemplate {
        let body: String = events
            .iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect();
        ResponseTemplate::new(200)
            .insert_header("content-type", "text/event-stream")
            .set_body_string(body)
    }

    fn whole() -> Value {
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

    async fn call(
        llm: &AnthropicLlm,
        deltas: Option<&Recorder>,
    ) -> Result<baton_core::llm::LlmReply, LlmError> {
        let (h, t) = (history(), tools());
        llm.complete(&ChatRequest {
            deltas: deltas.map(|d| d as &dyn baton_core::llm::Deltas),
            ..request(&h, &t, Some("claude-sonnet-4-5"))
        })
        .await
    }

    #[tokio::test]
    async fn a_streamed_reply_equals_the_whole_one_usage_included() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/messages"))
            .and(body_partial_json(json!({"stream": true})))
            .respond_with(sse(&events()))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/v1/messages"))
            .respond_with(ResponseTemplate::new(200).set_body_json(whole()))
            .expect(1)
            .mount(&server)
            .await;
        let llm = client(&server, 0);
        let seen = Recorder::default();
        let streamed = call(&llm, Some(&seen)).await.expect("streamed");
        let whole = call(&llm, None).await.expect("whole");
        assert_eq!(streamed, whole);
        assert_eq!(streamed.usage.input_tokens, 120);
        assert_eq!(streamed.tool_calls[0].arguments, r#"{"text":"y"}"#);
        assert_eq!(
            seen.lines(),
            [
                "start",
                "text Let me ",
                "text echo.",
                "call 0 toolu_1 echo ",
                "call 0 - - ",
                "call 0 - - {\"text\": ",
                "call 0 - - \"y\"}",
            ]
        );
    }

    #[tokio::test]
    async fn an_overloaded_stream_is_tried_again_and_a_cut_one_too() {
        let server = MockServer::start().await;
        let overloaded = [(
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        )];
        Mock::given(method("POST"))
            .respond_with(sse(&overloaded))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .respond_with(sse(&events()[..5]))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .respond_with(sse(&events()))
            .mount(&server)
            .await;
        let seen = Recorder::default();
        let reply = call(&client(&server, 2), Some(&seen))
            .await
            .expect("third attempt");
        assert_eq!(reply.text.as_deref(), Some("Let me echo."));
        assert_eq!(seen.lines().iter().filter(|l| *l == "start").count(), 3);

        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(sse(&overloaded))
            .mount(&server)
            .await;
        match call(&client(&server, 0), Some(&Recorder::default())).await {
            Err(LlmError::Unavailable { message, .. }) => {
                assert!(message.contains("overloaded_error"), "{message}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}
