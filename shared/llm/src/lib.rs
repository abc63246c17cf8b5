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
pub use router::Models;
pub use scripted::ScriptedLlm;
