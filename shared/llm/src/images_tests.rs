//! A tool's image reaches a model that sees, in each provider's format: after the tool
//! results in a user message (OpenAI), in the tool result (Anthropic, Bedrock); an image the
//! request does not hold is known by its summary alone.

use baton_core::llm::{Image, Llm};
use baton_core::timeline::{Entry, EntryBody, FileRef};
use serde_json::json;

use crate::testkit::{history, last_body, replying, request, tools};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\nnot really";

/// The test history, its tool call having returned an image file.
fn with_image() -> Vec<Entry> {
    let mut h = history();
    let at = h[0].at;
    h.push(Entry {
        seq: 3,
        at,
        body: EntryBody::File(FileRef {
            call_id: "call_a".into(),
            file_id: "file_1".into(),
            name: "chart.png".into(),
            media_type: "image/png".into(),
            size: PNG.len() as u64,
            summary: "a rising line".into(),
        }),
    });
    h
}

fn image() -> Image {
    Image {
        file_id: "file_1".into(),
        media_type: "image/png".into(),
        bytes: PNG.to_vec(),
    }
}

fn b64() -> String {
    aws_smithy_types::base64::encode(PNG)
}

#[tokio::test]
async fn openai_is_given_the_image_after_the_tool_results() {
    let server = replying(
        json!({"choices": [{"message": {"role": "assistant", "content": "A line."}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
    )
    .await;
    let llm = crate::openai::tests::client(&server, 0);
    let (h, t, images) = (with_image(), tools(), [image()]);
    let mut req = request(&h, &t, None);
    req.images = &images;
    llm.complete(&req).await.expect("reply");
    let body = last_body(&server).await;
    let messages = body["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    let tool = messages[3]["content"].as_str().unwrap();
    assert!(
        tool.contains("[file `chart.png` (image/png, 18 bytes): a rising line]"),
        "{tool}"
    );
    assert_eq!(
        messages[4]["content"][1],
        json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64())}})
    );
    // Not held: the summary alone.
    req.images = &[];
    llm.complete(&req).await.expect("reply");
    let body = last_body(&server).await;
    assert_eq!(body["messages"].as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn anthropic_is_given_the_image_in_the_tool_result() {
    let server = replying(
        json!({"id": "m", "type": "message", "role": "assistant", "model": "c",
        "content": [{"type": "text", "text": "A line."}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1}}),
    )
    .await;
    let llm = crate::anthropic::tests::client_with(&server, 0);
    let (h, t, images) = (with_image(), tools(), [image()]);
    let mut req = request(&h, &t, Some("claude-sonnet-4-5"));
    req.images = &images;
    llm.complete(&req).await.expect("reply");
    let body = last_body(&server).await;
    let result = &body["messages"][2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["content"][0]["type"], "text");
    assert_eq!(
        result["content"][1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64()}})
    );
}

#[tokio::test]
async fn bedrock_is_given_the_image_in_the_tool_result() {
    let server = replying(json!({"output": {"message": {"role": "assistant",
        "content": [{"text": "A line."}]}}, "stopReason": "end_turn",
        "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}}))
    .await;
    let llm = crate::bedrock::tests::llm_with(&server, 0);
    let (h, t, images) = (with_image(), tools(), [image()]);
    let mut req = request(&h, &t, Some("amazon.nova-pro-v1:0"));
    req.images = &images;
    llm.complete(&req).await.expect("reply");
    let body = last_body(&server).await;
    let result = &body["messages"][2]["content"][0]["toolResult"];
    assert_eq!(
        result["content"][1],
        json!({"image": {"format": "png", "source": {"bytes": b64()}}})
    );
}
