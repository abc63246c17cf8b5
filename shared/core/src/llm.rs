//! The model port: what a think sends, what comes back, and how a timeline is projected
//! into the chat a model sees.
//!
//! Providers are in the `baton-llm` crate (OpenAI-compatible, scripted); this module knows
//! none of them. The projection lives here, on the model's side: the timeline is the
//! record, and knows nothing of chat formats.

pub use baton_engine::llm::*;
pub use baton_engine::project::{fit, model_bytes, project, starts_group};

use crate::timeline::Entry;

/// One think: the engine's request, with the history the provider projects if it needs to.
///
/// The history is borrowed, not projected up front: projecting costs O(history), and a
/// provider that doesn't need it (the scripted model) shouldn't pay for it.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    pub run_id: &'a str,
    pub agent: &'a str,
    /// How many thinks this run has had before this one (from 0).
    pub think_index: u32,
    pub model: Option<&'a str>,
    pub system: &'a str,
    pub tools: &'a [ToolSpec],
    /// The run's timeline: for a model that [`Llm::reads_history`], as much of it as the
    /// agent's context budget holds ([`fit`]), else the step's window.
    pub history: &'a [Entry],
    /// Where the reply goes as it streams, when someone watches the run: a provider that
    /// can stream does, and still returns the whole reply. `None`: no one watches.
    pub deltas: Option<&'a dyn Deltas>,
    /// The most tokens the reply may have (the agent's `maxOutputTokens`); none: the
    /// provider's configured `BATON_MAX_OUTPUT_TOKENS`.
    pub max_output_tokens: Option<u32>,
    /// The call's tool choice, reasoning and output schema ([`Controls::NONE`]: none).
    pub controls: &'a Controls,
    /// The bytes of the images the history's tools returned that the model is given (an
    /// agent whose model sees, within [`MAX_IMAGES`] and [`MAX_IMAGES_BYTES`]); the others
    /// it knows by their summaries.
    pub images: &'a [Image],
}

/// The receiver of a reply as it streams ([`ChatRequest::deltas`]). What it is given is a
/// live view only: the reply `complete` returns is the record.
pub trait Deltas: Send + Sync {
    /// A new attempt at the call begins (the first, or a retry after a failed one): what
    /// was streamed before belongs to an attempt that will not be the reply.
    fn start(&self);
    /// A piece of the reply's text.
    fn text(&self, piece: &str);
    /// A piece of the `index`th tool call: its id and name when they come, then its
    /// arguments' JSON text piece by piece.
    fn tool_call(&self, index: u32, id: Option<&str>, name: Option<&str>, arguments: &str);
}

impl std::fmt::Debug for dyn Deltas + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deltas")
    }
}

impl ChatRequest<'_> {
    /// The chat messages: the system prompt and the projected timeline.
    pub fn messages(&self) -> Vec<ChatMessage> {
        project(self.system, self.history)
    }

    /// The bytes of the image `file_id`, if the model is given it.
    pub fn image(&self, file_id: &str) -> Option<&Image> {
        self.images.iter().find(|i| i.file_id == file_id)
    }
}

/// One chat completion with tools.
#[async_trait::async_trait]
pub trait Llm: Send + Sync {
    async fn complete(&self, request: &ChatRequest<'_>) -> Result<LlmReply, LlmError>;

    /// Whether the model reads the conversation ([`ChatRequest::history`]). A step reads
    /// back through a run's history (as far as the agent's context budget holds) only for a
    /// model that does; one that does not (the scripted model) is handed the step's window.
    fn reads_history(&self) -> bool {
        true
    }

    /// The longest one [`Llm::complete`] can take, retries and their waits included: every
    /// attempt timing out, each wait at its cap. A step function starts a step only while
    /// this much time is left in its invocation. `None`: the client bounds nothing (taken as
    /// instant, so such a model must answer well within a function's timeout).
    fn longest_call(&self) -> Option<std::time::Duration> {
        None
    }
}

/// A model API key that can change while a process runs (a rotated secret): read again
/// when the provider refuses the key in hand.
#[async_trait::async_trait]
pub trait KeySource: Send + Sync {
    /// The current key, read afresh.
    async fn fetch(&self) -> Result<Option<String>, crate::error::PortError>;
}

/// The model of a host that never thinks (the `api` and `events` functions): every call is a
/// fatal error, so a misrouted step fails loudly instead of hanging.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoModel;

#[async_trait::async_trait]
impl Llm for NoModel {
    async fn complete(&self, _: &ChatRequest<'_>) -> Result<LlmReply, LlmError> {
        Err(LlmError::fatal(
            "this host does not call models; steps run in the orchestrator and subagent functions",
        ))
    }
}
