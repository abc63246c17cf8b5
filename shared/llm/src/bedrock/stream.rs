//! Bedrock's `ConverseStream`: the reply as an event stream (`messageStart`,
//! `contentBlockStart` with a tool use's id and name, `contentBlockDelta` with text or a
//! piece of a tool's input, `contentBlockStop`, `messageStop` with the stop reason, and
//! `metadata` with the usage), decoded by the SDK; an exception in the stream
//! (`throttlingException`, `modelStreamErrorException`, ...) is classified as a failed call is.

use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::operation::converse_stream::ConverseStreamOutput as Output;
use aws_sdk_bedrockruntime::types::error::ConverseStreamOutputError;
use aws_sdk_bedrockruntime::types::{
    ContentBlockDelta, ContentBlockStart, ConverseStreamOutput, ReasoningContentBlockDelta,
    TokenUsage,
};
use aws_smithy_types::event_stream::RawMessage;

use baton_core::llm::{Deltas, LlmReply, ToolCall};

use super::{assemble, classify, verdict};
use crate::retry::Attempt;

/// One content block as it grows.
enum Block {
    Text(String),
    /// The tool call's place among the reply's calls, and the call.
    Tool(u32, ToolCall),
    /// Reasoning: its text and signature, or its redacted bytes (base64).
    Reasoning(String, String),
    Redacted(String),
}

/// Reads the stream to its end, each piece handed to `deltas`.
pub(super) async fn read(mut out: Output, deltas: &dyn Deltas, model: &str) -> Attempt<LlmReply> {
    let mut blocks: Vec<Option<Block>> = Vec::new();
    let (mut calls, mut stop_reason, mut usage) = (0u32, None::<String>, None::<TokenUsage>);
    let mut stopped = false;
    loop {
        let event = match out.stream.recv().await {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => return in_stream(e),
        };
        match event {
            ConverseStreamOutput::ContentBlockStart(e) => {
                if let Some(ContentBlockStart::ToolUse(t)) = e.start() {
                    deltas.tool_call(calls, Some(t.tool_use_id()), Some(t.name()), "");
                    let call = ToolCall {
                        id: t.tool_use_id().to_owned(),
                        name: t.name().to_owned(),
                        arguments: String::new(),
                    };
                    *slot(&mut blocks, e.content_block_index()) = Some(Block::Tool(calls, call));
                    calls += 1;
                }
            }
            ConverseStreamOutput::ContentBlockDelta(e) => {
                let block = slot(&mut blocks, e.content_block_index());
                match (e.delta(), block) {
                    (Some(ContentBlockDelta::Text(t)), b) => {
                        deltas.text(t);
                        match b {
                            Some(Block::Text(s)) => s.push_str(t),
                            b => *b = Some(Block::Text(t.clone())),
                        }
                    }
                    (Some(ContentBlockDelta::ToolUse(d)), Some(Block::Tool(i, call))) => {
                        deltas.tool_call(*i, None, None, d.input());
                        call.arguments.push_str(d.input());
                    }
                    (Some(ContentBlockDelta::ReasoningContent(r)), b) => match r {
                        ReasoningContentBlockDelta::RedactedContent(bytes) => {
                            let data = aws_smithy_types::base64::encode(bytes.as_ref());
                            *b = Some(Block::Redacted(data));
                        }
                        ReasoningContentBlockDelta::Text(t) => {
                            if let Some((text, _)) = reasoning(b) {
                                text.push_str(t);
                            }
                        }
                        ReasoningContentBlockDelta::Signature(sig) => {
                            if let Some((_, signature)) = reasoning(b) {
                                signature.push_str(sig);
                            }
                        }
                        _ => {}
                    },
                    _ => {}
                }
            }
            ConverseStreamOutput::MessageStop(e) => {
                stop_reason = Some(e.stop_reason().as_str().to_owned());
                stopped = true;
            }
            ConverseStreamOutput::Metadata(e) => usage = e.usage().cloned(),
            _ => {}
        }
    }
    if !stopped {
        return Attempt::Retry {
            why: "Bedrock's stream ended before `messageStop`".into(),
            wait: None,
            source: None,
        };
    }
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut thought = Vec::new();
    for block in blocks.into_iter().flatten() {
        match block {
            Block::Text(t) => text.push_str(&t),
            Block::Tool(_, mut call) => {
                // As a whole reply's `input` reads (an object, compact).
                call.arguments = crate::whole_arguments(&call.arguments);
                tool_calls.push(call);
            }
            Block::Reasoning(t, signature) => {
                thought.push(serde_json::json!({"text": t, "signature": signature}));
            }
            Block::Redacted(data) => thought.push(serde_json::json!({"redacted": data})),
        }
    }
    let stop = stop_reason.unwrap_or_default();
    match assemble(text, tool_calls, &stop, usage.as_ref(), model) {
        Ok(mut r) => {
            r.reasoning = (!thought.is_empty()).then_some(serde_json::Value::Array(thought));
            Attempt::Done(r)
        }
        Err(why) => Attempt::Fatal(why),
    }
}

/// The reasoning block at `b`, started if it is not one: its text and signature.
fn reasoning(b: &mut Option<Block>) -> Option<(&mut String, &mut String)> {
    if !matches!(b, Some(Block::Reasoning(..))) {
        *b = Some(Block::Reasoning(String::new(), String::new()));
    }
    match b {
        Some(Block::Reasoning(text, signature)) => Some((text, signature)),
        _ => None,
    }
}

/// An exception in the stream: its variant says whether it is worth another attempt (the
/// SDK names its code by variant only).
fn in_stream(e: SdkError<ConverseStreamOutputError, RawMessage>) -> Attempt<LlmReply> {
    let SdkError::ServiceError(se) = &e else {
        return classify(e);
    };
    let err = se.err();
    let kind = match err {
        ConverseStreamOutputError::ThrottlingException(_) => "ThrottlingException",
        ConverseStreamOutputError::ServiceUnavailableException(_) => "ServiceUnavailableException",
        ConverseStreamOutputError::InternalServerException(_) => "InternalServerException",
        ConverseStreamOutputError::ModelStreamErrorException(_) => "ModelStreamErrorException",
        ConverseStreamOutputError::ValidationException(_) => "ValidationException",
        _ => err.code().unwrap_or("error"),
    };
    verdict(kind, err.message())
}

/// The block at `index` (a negative or absurd index is the last slot).
fn slot(blocks: &mut Vec<Option<Block>>, index: i32) -> &mut Option<Block> {
    let i = usize::try_from(index).unwrap_or(0).min(1024);
    if blocks.len() <= i {
        blocks.resize_with(i + 1, || None);
    }
    &mut blocks[i]
}

#[cfg(test)]
mod tests {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    use baton_core::llm::{ChatRequest, Llm, LlmError};
    use serde_json::{Value, json};
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use crate::bedrock::BedrockLlm;
    use crate::bedrock::tests::llm_with as llm;
    use crate::testkit::{Recorder, history, request, tools};

    const MODEL: &str = "anthropic.claude-3-5-haiku-20241022-v1:0";

    /// An event-stream frame as Bedrock sends it (`vnd.amazon.eventstream`, with its CRCs).
    fn frame(kind: &str, name: &str, payload: Value) -> Vec<u8> {
        let (type_header, message_type) = match kind {
            "event" => (":event-type", "event"),
            _ => (":exception-type", "exception"),
        };
        let message = Message::new(payload.to_string().into_bytes())
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String(message_type.into()),
            ))
            .add_header(Header::new(
                type_header,
                HeaderValue::String(name.to_owned().into()),
            ))
            .add_header(Header::new(
                ":content-type",
                HeaderValue::String("application/json".into()),
            ));
        let mut out = Vec::new();
        aws_smithy_eventstream::frame::write_message_to(&message, &mut out).expect("frame");
        out
    }

    /// The events of "Echoing." and `echo({"text": "y"})`, the reply the whole-reply test
    /// of `Converse` gets.
    fn events() -> Vec<Vec<u8>> {
        vec![
            frame("event", "messageStart", json!({"role": "assistant"})),
            frame(
                "event",
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "Echo"}}),
            ),
            frame(
                "event",
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "ing."}}),
            ),
            frame("event", "contentBlockStop", json!({"contentBlockIndex": 0})),
            frame(
                "event",
                "contentBlockStart",
                json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "echo"}}}),
            ),
            frame(
                "event",
                "contentBlockDelta",
                json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"text\": "}}}),
            ),
            frame(
                "event",
                "contentBlockDelta",
                json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "\"y\"}"}}}),
            ),
            frame("event", "contentBlockStop", json!({"contentBlockIndex": 1})),
            frame("event", "messageStop", json!({"stopReason": "tool_use"})),
            frame(
                "event",
                "metadata",
                json!({"usage": {"inputTokens": 30, "outputTokens": 8, "totalTokens": 38, "cacheReadInputTokens": 12}, "metrics": {"latencyMs": 4}}),
            ),
        ]
    }

    fn stream(frames: &[Vec<u8>]) -> ResponseTemplate {
        ResponseTemplate::new(200)
            .insert_header("content-type", "application/vnd.amazon.eventstream")
            .set_body_bytes(frames.concat())
    }

    fn stream_path() -> wiremock::matchers::PathExactMatcher {
        path(format!(
            "/model/{}/converse-stream",
            MODEL.replace(':', "%3A")
        ))
    }

    async fn call(
        llm: &BedrockLlm,
        deltas: Option<&Recorder>,
    ) -> Result<baton_core::llm::LlmReply, LlmError> {
        let (h, t) = (history(), tools());
        llm.complete(&ChatRequest {
            deltas: deltas.map(|d| d as &dyn baton_core::llm::Deltas),
            ..request(&h, &t, Some(MODEL))
        })
        .await
    }

    #[tokio::test]
    async fn converse_stream_gives_the_reply_converse_does_usage_included() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(stream_path())
            .respond_with(stream(&events()))
            .expect(1)
            .mount(&server)
            .await;
        let whole = json!({
            "output": {"message": {"role": "assistant", "content": [
                {"text": "Echoing."},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "echo", "input": {"text": "y"}}}
            ]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 30, "outputTokens": 8, "totalTokens": 38, "cacheReadInputTokens": 12},
            "metrics": {"latencyMs": 4}
        });
        Mock::given(method("POST"))
            .and(path(format!(
                "/model/{}/converse",
                MODEL.replace(':', "%3A")
            )))
            .respond_with(ResponseTemplate::new(200).set_body_json(whole))
            .expect(1)
            .mount(&server)
            .await;
        let llm = llm(&server, 0);
        let seen = Recorder::default();
        let streamed = call(&llm, Some(&seen)).await.expect("streamed");
        let whole = call(&llm, None).await.expect("whole");
        assert_eq!(streamed, whole);
        assert_eq!(streamed.usage.cached_input_tokens, 12);
        assert_eq!(
            seen.lines(),
            [
                "start",
                "text Echo",
                "text ing.",
                "call 0 tooluse_1 echo ",
                "call 0 - - {\"text\": ",
                "call 0 - - \"y\"}",
            ]
        );
    }

    #[tokio::test]
    async fn a_throttled_stream_is_tried_again_and_a_refused_one_is_not() {
        let server = MockServer::start().await;
        let mut throttled = events()[..3].to_vec();
        throttled.push(frame(
            "exception",
            "throttlingException",
            json!({"message": "Too many tokens"}),
        ));
        Mock::given(method("POST"))
            .and(stream_path())
            .respond_with(stream(&throttled))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(stream_path())
            .respond_with(stream(&events()))
            .mount(&server)
            .await;
        let seen = Recorder::default();
        let reply = call(&llm(&server, 1), Some(&seen))
            .await
            .expect("second attempt");
        assert_eq!(reply.text.as_deref(), Some("Echoing."));
        let lines = seen.lines();
        assert_eq!(
            lines.iter().filter(|l| *l == "start").count(),
            2,
            "{lines:?}"
        );

        let server = MockServer::start().await;
        let refused = vec![frame(
            "exception",
            "validationException",
            json!({"message": "bad input"}),
        )];
        Mock::given(method("POST"))
            .and(stream_path())
            .respond_with(stream(&refused))
            .mount(&server)
            .await;
        match call(&llm(&server, 3), Some(&Recorder::default())).await {
            Err(LlmError::Fatal { message, .. }) => {
                assert!(message.contains("bad input"), "{message}")
            }
            other => panic!("expected Fatal, got {other:?}"),
        }
    }
}
