//! The OpenAI-compatible API's streamed completions (`stream: true`): Server-Sent Events of
//! chunks, each a piece of the reply's text or of a tool call, the usage in a last chunk of
//! its own, then `data: [DONE]`.

use baton_core::llm::{Deltas, LlmError, LlmReply, ToolCall};
use serde::Deserialize;
use serde_json::Value;

use super::{ApiUsage, reply};

/// One chunk of a streamed completion.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<ApiUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: ChunkDelta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct ChunkDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ChunkCall>,
}

#[derive(Deserialize)]
struct ChunkCall {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<ChunkFunction>,
}

#[derive(Deserialize)]
struct ChunkFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

/// A streamed completion (`stream: true`), each piece handed to `deltas` as it comes, put
/// together into the reply a whole completion would have been. `Err`: the stream broke
/// (worth trying again); `Ok(Err)`: a reply that will not get better.
pub(super) async fn read_stream(
    mut resp: reqwest::Response,
    deltas: &dyn Deltas,
    model: &str,
) -> Result<Result<LlmReply, LlmError>, String> {
    let mut reader = crate::sse::SseReader::default();
    let (mut text, mut calls, mut usage) = (String::new(), Vec::<ToolCall>::new(), None);
    let mut finish = None::<String>;
    let mut done = false;
    loop {
        let (events, ended) = match resp.chunk().await {
            Ok(Some(bytes)) => (reader.push(&bytes), false),
            Ok(None) => (reader.finish().into_iter().collect(), true),
            Err(e) => return Err(format!("reading the streamed reply failed: {e}")),
        };
        for e in events {
            if e.data.trim() == "[DONE]" {
                done = true;
                continue;
            }
            let chunk: Chunk = match serde_json::from_str(&e.data) {
                Ok(c) => c,
                Err(err) => {
                    return Ok(Err(LlmError::fatal_from(
                        format!("malformed chunk from the model provider: {err}"),
                        err,
                    )));
                }
            };
            if let Some(error) = chunk.error {
                return Err(format!("the provider's stream ended in an error: {error}"));
            }
            if let Some(u) = chunk.usage {
                usage = Some(u.into_usage());
            }
            for choice in chunk.choices {
                if choice.finish_reason.is_some() {
                    finish = choice.finish_reason;
                }
                if let Some(piece) = choice.delta.content.filter(|p| !p.is_empty()) {
                    deltas.text(&piece);
                    text.push_str(&piece);
                }
                for c in choice.delta.tool_calls {
                    let Ok(i) = usize::try_from(c.index) else {
                        continue;
                    };
                    if calls.len() <= i {
                        calls.resize_with(i + 1, || ToolCall {
                            id: String::new(),
                            name: String::new(),
                            arguments: String::new(),
                        });
                    }
                    let (name, arguments) = c
                        .function
                        .map(|f| (f.name, f.arguments.unwrap_or_default()))
                        .unwrap_or_default();
                    deltas.tool_call(c.index, c.id.as_deref(), name.as_deref(), &arguments);
                    let call = &mut calls[i];
                    if let Some(id) = c.id {
                        call.id = id;
                    }
                    if let Some(name) = name {
                        call.name.push_str(&name);
                    }
                    call.arguments.push_str(&arguments);
                }
            }
        }
        if done {
            break;
        }
        if ended {
            return Err("the streamed reply ended before `[DONE]`".into());
        }
    }
    let text = (!text.is_empty()).then_some(text);
    Ok(reply(
        text,
        calls,
        usage.unwrap_or_default(),
        finish.as_deref(),
        model,
    ))
}

#[cfg(test)]
mod tests {
    use baton_core::llm::{ChatRequest, Llm, LlmError, ToolCall};
    use baton_core::run::Usage;
    use serde_json::{Value, json};
    use wiremock::matchers::{body_partial_json, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use crate::openai::OpenAiLlm;
    use crate::openai::tests::client;
    use crate::testkit::{Recorder, history, tools};

    /// The chunks OpenAI streams for "Let me check." and `echo({"text":"y"})`, as documented
    /// (a role chunk, content pieces, a tool call's id and name, then its arguments in
    /// pieces, a finish chunk, the usage alone, `[DONE]`).
    fn chunks() -> Vec<Value> {
        let delta = |d: Value| json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": null}]});
        vec![
            delta(json!({"role": "assistant", "content": ""})),
            delta(json!({"content": "Let me "})),
            delta(json!({"content": "check."})),
            delta(
                json!({"tool_calls": [{"index": 0, "id": "call_b", "type": "function", "function": {"name": "echo", "arguments": ""}}]}),
            ),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"te"}}]})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "xt\":\"y\"}"}}]})),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"id": "c1", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}),
        ]
    }

    fn sse(chunks: &[Value], done: bool) -> ResponseTemplate {
        let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        if done {
            body.push_str("data: [DONE]\n\n");
        }
        ResponseTemplate::new(200)
            .insert_header("content-type", "text/event-stream")
            .set_body_string(body)
    }

    async fn call(
        llm: &OpenAiLlm,
        deltas: &Recorder,
    ) -> Result<baton_core::llm::LlmReply, LlmError> {
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
            deltas: Some(deltas),
            controls: &baton_core::llm::Controls::NONE,
            images: &[],
        })
        .await
    }

    /// A streamed reply that stopped at its limit is marked cut, as a whole one is.
    #[tokio::test]
    async fn a_streamed_reply_cut_at_its_limit_is_marked() {
        let server = MockServer::start().await;
        let delta = |d: Value, f: Value| json!({"id": "c1", "choices": [{"index": 0, "delta": d, "finish_reason": f}]});
        let chunks = [
            delta(
                json!({"role": "assistant", "content": "The answer"}),
                Value::Null,
            ),
            delta(json!({"content": " is"}), Value::Null),
            delta(json!({}), json!("length")),
            json!({"id": "c1", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}),
        ];
        Mock::given(method("POST"))
            .respond_with(sse(&chunks, true))
            .expect(1)
            .mount(&server)
            .await;
        let seen = Recorder::default();
        let reply = call(&client(&server, 0), &seen).await.expect("reply");
        assert_eq!(reply.text.as_deref(), Some("The answer is"));
        assert_eq!(reply.cut.as_deref(), Some("length"));
    }

    #[tokio::test]
    async fn a_streamed_reply_is_the_reply_a_whole_one_would_be() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .and(body_partial_json(
                json!({"stream": true, "stream_options": {"include_usage": true}}),
            ))
            .respond_with(sse(&chunks(), true))
            .expect(1)
            .mount(&server)
            .await;
        let seen = Recorder::default();
        let reply = call(&client(&server, 0), &seen).await.expect("reply");
        assert_eq!(reply.text.as_deref(), Some("Let me check."));
        assert_eq!(
            reply.tool_calls,
            vec![ToolCall {
                id: "call_b".into(),
                name: "echo".into(),
                arguments: r#"{"text":"y"}"#.into()
            }]
        );
        // The usage a whole reply gives (the non-streamed test's `ok_body`).
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
        assert_eq!(
            seen.lines(),
            [
                "start",
                "text Let me ",
                "text check.",
                "call 0 call_b echo ",
                "call 0 - - {\"te",
                "call 0 - - xt\":\"y\"}",
            ]
        );
    }

    #[tokio::test]
    async fn a_stream_cut_short_is_tried_again_as_a_new_attempt() {
        let server = MockServer::start().await;
        // The connection ends after two chunks, without `[DONE]`.
        Mock::given(method("POST"))
            .respond_with(sse(&chunks()[..2], false))
            .up_to_n_times(1)
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .respond_with(sse(&chunks(), true))
            .expect(1)
            .mount(&server)
            .await;
        let seen = Recorder::default();
        let reply = call(&client(&server, 1), &seen)
            .await
            .expect("second attempt");
        assert_eq!(reply.text.as_deref(), Some("Let me check."));
        let lines = seen.lines();
        let starts: Vec<usize> = (0..lines.len()).filter(|&i| lines[i] == "start").collect();
        assert_eq!(starts, [0, 2], "{lines:?}");
        assert_eq!(lines[1], "text Let me ");

        // Without retries left, a cut stream is the provider being unavailable.
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(sse(&chunks()[..2], false))
            .mount(&server)
            .await;
        match call(&client(&server, 0), &Recorder::default()).await {
            Err(LlmError::Unavailable { message, .. }) => {
                assert!(message.contains("before `[DONE]`"), "{message}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_error_chunk_is_worth_trying_again_and_a_garbled_one_is_not() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(sse(&[json!({"error": {"message": "overloaded"}})], false))
            .mount(&server)
            .await;
        match call(&client(&server, 0), &Recorder::default()).await {
            Err(LlmError::Unavailable { message, .. }) => {
                assert!(message.contains("overloaded"), "{message}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(200).set_body_string("data: {not json\n\ndata: [DONE]\n\n"),
            )
            .mount(&server)
            .await;
        match call(&client(&server, 3), &Recorder::default()).await {
            Err(LlmError::Fatal { message, .. }) => {
                assert!(message.contains("malformed"), "{message}")
            }
            other => panic!("expected Fatal, got {other:?}"),
        }
    }
}
