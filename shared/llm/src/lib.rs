//! Baton's model clients, each an implementation of the core's `Llm` port:
//! [`openai`] (any OpenAI-compatible chat-completions server: OpenAI, Azure, vLLM, Ollama,
//! llama.cpp, LiteLLM), [`anthropic`] (the Anthropic Messages API), [`bedrock`] (Amazon
//! Bedrock's Converse API, with the function's IAM role) and [`scripted`] (replays a JSON
//! file of replies, for demos and tests). [`router::Models`] picks one per call from the
//! agent's `provider:model-id`.

pub mod anthropic;
pub mod bedrock;
pub mod openai;
pub mod retry;
pub mod router;
pub mod scripted;
pub mod sse;
#[cfg(test)]
mod testkit;

pub use openai::OpenAiLlm;

/// A streamed tool call's arguments as a whole reply's read: the JSON object, compact (`{}`
/// when none came; kept as they are when they are not JSON).
pub(crate) fn whole_arguments(streamed: &str) -> String {
    match streamed.trim() {
        "" => "{}".into(),
        args => serde_json::from_str::<serde_json::Value>(args)
            .map_or_else(|_| args.to_owned(), |v| v.to_string()),
    }
}
pub use router::Models;
pub use scripted::ScriptedLlm;
