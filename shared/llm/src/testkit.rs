//! What the clients' tests share: a short history with one tool round trip, and a tool.

use baton_core::llm::ToolSpec;
use baton_core::timeline::{Entry, EntryBody, ToolEntry, ToolResult};
use serde_json::json;

pub fn history() -> Vec<Entry> {
    let at = chrono::DateTime::from_timestamp(0, 0).unwrap_or_default();
    vec![
        Entry {
            seq: 0,
            at,
            body: EntryBody::user("hi"),
        },
        Entry {
            seq: 1,
            at,
            body: EntryBody::reply(None),
        },
        Entry {
            seq: 2,
            at,
            body: EntryBody::Tool(ToolEntry::new(
                "call_a",
                "echo",
                json!({"text": "x"}),
                ToolResult::Success { output: json!("x") },
                1,
            )),
        },
    ]
}

pub fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "echo".into(),
        description: "d".into(),
        parameters: json!({"type": "object"}),
    }]
}

/// A think over `history` with `tools`, the system prompt "be brief".
pub fn request<'a>(
    history: &'a [Entry],
    tools: &'a [ToolSpec],
    model: Option<&'a str>,
) -> baton_core::llm::ChatRequest<'a> {
    baton_core::llm::ChatRequest {
        run_id: "r",
        agent: "a",
        think_index: 1,
        model,
        system: "be brief",
        tools,
        history,
        deltas: None,
        max_output_tokens: None,
        controls: &baton_core::llm::Controls::NONE,
        images: &[],
    }
}

/// Records what a streamed reply hands its [`baton_core::llm::Deltas`], one line a call.
#[derive(Default)]
pub struct Recorder(pub std::sync::Mutex<Vec<String>>);

impl Recorder {
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().expect("recorder").clone()
    }
}

impl baton_core::llm::Deltas for Recorder {
    fn start(&self) {
        self.0.lock().expect("recorder").push("start".into());
    }
    fn text(&self, piece: &str) {
        self.0
            .lock()
            .expect("recorder")
            .push(format!("text {piece}"));
    }
    fn tool_call(&self, index: u32, id: Option<&str>, name: Option<&str>, arguments: &str) {
        self.0.lock().expect("recorder").push(format!(
            "call {index} {} {} {arguments}",
            id.unwrap_or("-"),
            name.unwrap_or("-")
        ));
    }
}

/// A mock server that answers every POST with `reply`.
pub async fn replying(reply: serde_json::Value) -> wiremock::MockServer {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(reply))
        .mount(&server)
        .await;
    server
}

/// The body of the last request `server` was sent.
pub async fn last_body(server: &wiremock::MockServer) -> serde_json::Value {
    let requests = server.received_requests().await.expect("recorded");
    serde_json::from_slice(&requests.last().expect("a request").body).expect("JSON body")
}
