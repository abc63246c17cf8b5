//! OpenAI-compatible chat-completions client (written next).
