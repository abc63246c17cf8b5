//! Baton's model clients, each an implementation of the core's `Llm` port:
//! [`openai`] (any OpenAI-compatible chat-completions server: OpenAI, Azure, vLLM, Ollama,
//! llama.cpp, LiteLLM), [`anthropic`] (the Anthropic Messages API), [`bedrock`] (Amazon
//! Bedrock's Converse API, with the function's IAM role) and [`scripted`] (replays a JSON
//! file of replies, for demos and tests). [`router::Models`] picks one per call from the
//! agent's `provider:model-id`.

pub mod anthropic;
pub mod bedrock;
#[cfg(test)]
mod controls_tests;
#[cfg(test)]
mod images_tests;
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

/// How a provider that has a forced tool but no JSON mode (Anthropic, Bedrock) is asked
/// for a call's tool choice and output schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice<'a> {
    /// The model chooses (sent as such, or left to the provider's default).
    Auto,
    /// Some tool.
    Any,
    /// No tool (Anthropic's `none`).
    No,
    /// This tool.
    Tool(&'a str),
}

/// The tools a provider with a forced tool but no JSON mode is sent (the output tool
/// last, when an output schema is asked for) and the choice, if any: with an output schema,
/// the reply must call a tool (the output tool, with no other tools), since its answer is
/// that call's input. `can_force`: the provider takes a forced choice with the call's other
/// settings (Anthropic's extended thinking does not: then `auto`, and the engine checks
/// the answer's shape all the same).
pub(crate) fn tool_mode<'a>(
    req: &'a baton_core::llm::ChatRequest<'_>,
    can_force: bool,
) -> (Vec<&'a baton_core::llm::ToolSpec>, Option<Choice<'a>>) {
    use baton_core::llm::{OUTPUT_TOOL, ToolChoice};
    let controls = req.controls;
    let output = controls.output.as_ref();
    let mut tools: Vec<_> = req.tools.iter().collect();
    let choice = match (&controls.tool_choice, output) {
        (None | Some(ToolChoice::Auto), None) => None,
        (Some(ToolChoice::None), None) => Some(Choice::No),
        (Some(ToolChoice::Required), _) => Some(Choice::Any),
        (Some(ToolChoice::Tool { tool }), _) => Some(Choice::Tool(tool)),
        (Some(ToolChoice::None), Some(_)) => {
            tools.clear();
            Some(Choice::Tool(OUTPUT_TOOL))
        }
        (None | Some(ToolChoice::Auto), Some(_)) if tools.is_empty() => {
            Some(Choice::Tool(OUTPUT_TOOL))
        }
        (None | Some(ToolChoice::Auto), Some(_)) => Some(Choice::Any),
    };
    tools.extend(output);
    let choice = match choice {
        Some(Choice::Any | Choice::Tool(_)) if !can_force => Some(Choice::Auto),
        c => c,
    };
    (tools, choice)
}

/// A reply to a call that asked for an output schema through [`tool_mode`]: a call of the
/// output tool is the answer, as text (alone; beside other calls, it is dropped: the model
/// answers when they are done).
pub(crate) fn answered(
    req: &baton_core::llm::ChatRequest<'_>,
    mut reply: baton_core::llm::LlmReply,
) -> baton_core::llm::LlmReply {
    use baton_core::llm::OUTPUT_TOOL;
    if req.controls.output.is_none() {
        return reply;
    }
    let Some(i) = reply.tool_calls.iter().position(|c| c.name == OUTPUT_TOOL) else {
        return reply;
    };
    let call = reply.tool_calls.remove(i);
    if reply.tool_calls.is_empty() {
        reply.text = Some(call.arguments);
    }
    reply
}
