//! Baton's model clients, each an implementation of the core's `Llm` port:
//! [`openai`] (any OpenAI-compatible chat-completions server: OpenAI, Azure, vLLM, Ollama,
//! llama.cpp, LiteLLM) and [`scripted`] (replays a JSON file of replies, for demos and tests).

pub mod openai;
pub mod scripted;

pub use openai::OpenAiLlm;
pub use scripted::ScriptedLlm;
