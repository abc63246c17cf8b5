//! What a model is told and answers, as data: the chat it sees (projected from a timeline
//! by `project`), the tools it is offered, its reply and how a call can fail. The model port itself (the
//! `Llm` trait a provider implements) is `baton-core`'s.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of the chat a model sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum ChatMessage {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        content: Option<String>,
        tool_calls: Vec<ToolCall>,
        /// What the provider needs given back of the model's reasoning (Anthropic's signed
        /// thinking blocks), as it gave it ([`LlmReply::reasoning`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<Value>,
    },
    Tool {
        tool_call_id: String,
        content: String,
        /// The tool failed (providers that can say so are told).
        #[serde(default)]
        is_error: bool,
        /// The images it returned, by file id: a provider gives a model that sees those whose
        /// bytes the request holds ([`Image`]); the content names each one either way.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<String>,
    },
}

/// An image a tool returned, as a model that sees is given it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub file_id: String,
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp` ([`is_image`]).
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// The media types every provider takes as an image.
pub fn is_image(media_type: &str) -> bool {
    matches!(
        media_type,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
    )
}

/// The most images a request gives a model, the newest first.
pub const MAX_IMAGES: usize = 8;

/// The largest image a model is given (Bedrock's limit; Anthropic's is 5 MB, OpenAI's 20).
pub const MAX_IMAGE_BYTES: usize = 3_750_000;

/// The most bytes of images one request gives a model.
pub const MAX_IMAGES_BYTES: usize = 15_000_000;

/// A tool call as the model made it: the arguments are the model's raw JSON string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A tool as the model is told about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LlmReply {
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    /// The model that answered, `provider:model-id` (for its price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The reply stopped at its output limit: the provider's reason (`length`,
    /// `max_tokens`). Its text is cut, and so may be its last tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<String>,
    /// The provider's record of the model's reasoning that a later call must give back
    /// (Anthropic's and Bedrock's signed thinking blocks; OpenAI keeps its own), opaque.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Value>,
    /// The models tried before the one that answered, each with why it failed
    /// (`fallbackModels`; set by the service, not by providers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<Fallback>,
    /// How long the call took, and until its first streamed piece (set by the service, not
    /// by providers).
    #[serde(skip)]
    pub latency_ms: Option<u64>,
    #[serde(skip)]
    pub first_token_ms: Option<u64>,
}

/// A model that was tried and did not answer, before a fallback did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
pub struct Fallback {
    /// `provider:model-id` (or the deployment's model, as configured).
    pub model: String,
    /// Why it did not answer (its provider failed past its retries).
    pub error: String,
}

/// Which tool, if any, a reply must call (`toolChoice`): `auto` (the model decides),
/// `required` (some tool), `none` (no tool: an answer), or `{"tool": name}` (that one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    Auto,
    Required,
    None,
    #[serde(untagged)]
    Tool {
        tool: String,
    },
}

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Named {
            tool: String,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            Tool(Named),
        }
        let bad = || {
            serde::de::Error::custom(
                "toolChoice must be \"auto\", \"required\", \"none\" or {\"tool\": \"<name>\"}",
            )
        };
        match Raw::deserialize(d).map_err(|_| bad())? {
            Raw::Word(w) => match w.as_str() {
                "auto" => Ok(Self::Auto),
                "required" => Ok(Self::Required),
                "none" => Ok(Self::None),
                _ => Err(bad()),
            },
            Raw::Tool(Named { tool }) => Ok(Self::Tool { tool }),
        }
    }
}

/// How hard a model reasons before it answers, where its provider lets it be told: an
/// `effort` (OpenAI's `reasoning_effort`), a `budgetTokens` (Anthropic's and Bedrock's
/// extended thinking), or both; each provider is sent what it takes, the other mapped to it
/// ([`Reasoning::budget`], [`Reasoning::effort`]). Reasoning tokens are output tokens, and
/// priced as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reasoning {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<Effort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    Low,
    Medium,
    High,
}

impl Effort {
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
        }
    }
}

/// The least thinking budget Anthropic takes.
pub const MIN_REASONING_BUDGET: u32 = 1024;

impl Reasoning {
    /// The thinking budget in tokens: the one given, else the effort's (low 2,048, medium
    /// 8,192, high 24,576).
    pub fn budget(&self) -> u32 {
        self.budget_tokens.unwrap_or(match self.effort {
            Some(Effort::Low) => 2048,
            Some(Effort::High) => 24_576,
            _ => 8192,
        })
    }

    /// The effort: the one given, else the budget's (under 4,096 low, under 16,384 medium).
    pub fn effort(&self) -> Effort {
        self.effort.unwrap_or(match self.budget_tokens {
            Some(b) if b < 4096 => Effort::Low,
            Some(b) if b < 16_384 => Effort::Medium,
            Some(_) => Effort::High,
            None => Effort::Medium,
        })
    }
}

/// How one model call is steered, beyond its messages and tools.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Controls {
    /// Which tool the reply must call (none: the provider's default, `auto`).
    pub tool_choice: Option<ToolChoice>,
    pub reasoning: Option<Reasoning>,
    /// The final answer's shape: a JSON schema as the parameters of a tool named
    /// [`OUTPUT_TOOL`], sent as each provider takes it (OpenAI's `response_format`,
    /// Anthropic's and Bedrock's tool forced when the model answers).
    pub output: Option<ToolSpec>,
}

impl Controls {
    /// A call steered by nothing but its messages and tools.
    pub const NONE: Controls = Controls {
        tool_choice: None,
        reasoning: None,
        output: None,
    };
}

/// The name of the tool a provider that has no JSON mode of its own (Anthropic, Bedrock) is
/// made to answer with when an agent declares an `outputSchema`: its input is the answer.
pub const OUTPUT_TOOL: &str = "final_answer";

/// A JSON answer without the Markdown fence models put around it (```` ```json … ``` ````).
pub fn unfenced(text: &str) -> &str {
    let t = text.trim();
    t.strip_prefix("```")
        .and_then(|rest| rest.strip_suffix("```"))
        .map_or(t, |inner| inner.trim_start_matches("json").trim())
}

/// A model call that did not give a reply.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Worth trying again later (rate limits, 5xx, timeouts), after the client's own retries.
    #[error("model provider unavailable: {message}")]
    Unavailable {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Trying again will not help (bad request, auth, a malformed reply, a script run out).
    /// `message` is what the run's timeline says.
    #[error("{message}")]
    Fatal {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl LlmError {
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::Fatal {
            message: message.into(),
            source: None,
        }
    }

    /// A fatal error caused by `source` (its text is in `message` too, for the timeline).
    pub fn fatal_from(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Fatal {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// Token usage, per model call and summed per run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Every input token, read from the provider's prompt cache or not.
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    /// The part of `input_tokens` read from the prompt cache (billed at a lower price).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// The part of `output_tokens` the model spent reasoning (billed as output).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
