//! A scripted model: replays a JSON file of replies, for demos, tests and the benchmark.
//!
//! The file maps an agent name to the replies that agent gives; the i-th think of a run of
//! agent A (from 0, per run) returns `A[i]`. A reply is `{"text": "..."}` (a final answer)
//! or `{"tool_calls": [{"name": "...", "arguments": {...}}, ...]}`, optionally with `text`
//! (and, as extensions, `usage`, and `down`: the models that fail at that think as in an
//! outage). Thinking past the end of the list is a clear error.
//!
//! For a watched run (a request with deltas) it streams as a provider does: the text word by
//! word, [`ScriptedLlm::paced`] apart (by default [`STREAM_PACE`]), then each tool call.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use baton_core::llm::{ChatRequest, Llm, LlmError, LlmReply, ToolCall};
use baton_core::run::Usage;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedReply {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Models that are down at this think: a call to one fails as an outage does (a
    /// provider unavailable past its retries), so that an agent's `fallbackModels` answer.
    #[serde(default)]
    pub down: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

/// The scripted model.
#[derive(Debug, Clone, Default)]
pub struct ScriptedLlm {
    script: HashMap<String, Vec<ScriptedReply>>,
    /// The model replies are priced as when the agent names none (`BATON_MODEL` under
    /// `baton dev --script`), so a script shows what its run would cost.
    default_model: Option<String>,
    /// The pause between streamed pieces.
    pace: Duration,
}

/// The default pause between the pieces of a streamed scripted reply.
pub const STREAM_PACE: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read script {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("script {path} is not valid: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("script: reply {index} of agent `{agent}` has neither text nor tool_calls")]
    Empty { agent: String, index: usize },
}

impl ScriptedLlm {
    pub fn new(script: HashMap<String, Vec<ScriptedReply>>) -> Result<Self, ScriptError> {
        for (agent, replies) in &script {
            if let Some(index) = replies
                .iter()
                .position(|r| r.text.is_none() && r.tool_calls.is_empty())
            {
                return Err(ScriptError::Empty {
                    agent: agent.clone(),
                    index,
                });
            }
        }
        Ok(Self {
            script,
            default_model: None,
            pace: STREAM_PACE,
        })
    }

    /// Streams a watched run's replies with `pace` between pieces.
    pub fn paced(mut self, pace: Duration) -> Self {
        self.pace = pace;
        self
    }

    /// Prices replies of agents that name no model as `model`'s.
    pub fn priced_as(mut self, model: &str) -> Self {
        self.default_model = Some(model.to_owned());
        self
    }

    pub fn from_json(text: &str, path: &str) -> Result<Self, ScriptError> {
        let script = serde_json::from_str(text).map_err(|source| ScriptError::Parse {
            path: path.into(),
            source,
        })?;
        Self::new(script)
    }

    pub fn load(path: &std::path::Path) -> Result<Self, ScriptError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: p.clone(),
            source,
        })?;
        Self::from_json(&text, &p)
    }
}

#[async_trait::async_trait]
impl Llm for ScriptedLlm {
    /// Its replies are indexed by think, whatever was said before.
    fn reads_history(&self) -> bool {
        false
    }

    async fn complete(&self, request: &ChatRequest<'_>) -> Result<LlmReply, LlmError> {
        let index = request.think_index as usize;
        let replies = self
            .script
            .get(request.agent)
            .map_or(&[][..], Vec::as_slice);
        let Some(reply) = replies.get(index) else {
            return Err(LlmError::fatal(format!(
                "the script has no reply {index} for agent `{}` (it has {})",
                request.agent,
                replies.len()
            )));
        };
        let model = request.model.or(self.default_model.as_deref());
        if let Some(down) = model.filter(|m| reply.down.iter().any(|d| d == m)) {
            return Err(LlmError::Unavailable {
                message: format!("gave up after 3 attempts: `{down}` is down (scripted)"),
                source: None,
            });
        }
        let tool_calls: Vec<ToolCall> = reply
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                id: String::new(),
                name: c.name.clone(),
                arguments: match &c.arguments {
                    Value::Null => "{}".into(),
                    v => v.to_string(),
                },
            })
            .collect();
        if let Some(deltas) = request.deltas {
            deltas.start();
            for piece in reply.text.iter().flat_map(|t| t.split_inclusive(' ')) {
                deltas.text(piece);
                tokio::time::sleep(self.pace).await;
            }
            for (i, c) in tool_calls.iter().enumerate() {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                deltas.tool_call(index, None, Some(&c.name), &c.arguments);
                tokio::time::sleep(self.pace).await;
            }
        }
        Ok(LlmReply {
            text: reply.text.clone(),
            tool_calls,
            usage: reply.usage.unwrap_or_default(),
            // Priced as the agent's model would be, so a script can show what a run costs.
            model: request
                .model
                .map(str::to_owned)
                .or_else(|| self.default_model.clone()),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(agent: &'a str, think_index: u32) -> ChatRequest<'a> {
        ChatRequest {
            max_output_tokens: None,
            run_id: "r",
            agent,
            think_index,
            model: None,
            system: "",
            tools: &[],
            history: &[],
            deltas: None,
            controls: &baton_core::llm::Controls::NONE,
            images: &[],
        }
    }

    #[tokio::test]
    async fn a_watched_run_gets_its_reply_word_by_word_then_its_calls() {
        let llm = ScriptedLlm::from_json(
            r#"{"a": [{"text": "Let me look.", "tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}]}"#,
            "t",
        )
        .expect("valid")
        .paced(Duration::ZERO);
        let seen = crate::testkit::Recorder::default();
        let reply = llm
            .complete(&ChatRequest {
                deltas: Some(&seen),
                ..request("a", 0)
            })
            .await
            .expect("reply");
        assert_eq!(reply.text.as_deref(), Some("Let me look."));
        assert_eq!(
            seen.lines(),
            [
                "start",
                "text Let ",
                "text me ",
                "text look.",
                "call 0 - echo {\"text\":\"x\"}"
            ]
        );
    }

    #[tokio::test]
    async fn replays_per_agent_and_index_and_names_the_end() {
        let llm = ScriptedLlm::from_json(
            r#"{"a": [{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "done"}],
                "b": [{"text": "b0"}]}"#,
            "t",
        )
        .expect("valid");
        let r0 = llm.complete(&request("a", 0)).await.expect("reply 0");
        assert_eq!(r0.tool_calls[0].name, "echo");
        assert_eq!(r0.tool_calls[0].arguments, r#"{"text":"x"}"#);
        assert_eq!(
            llm.complete(&request("a", 1))
                .await
                .expect("reply 1")
                .text
                .as_deref(),
            Some("done")
        );
        assert_eq!(
            llm.complete(&request("b", 0))
                .await
                .expect("b")
                .text
                .as_deref(),
            Some("b0")
        );
        let err = llm
            .complete(&request("a", 2))
            .await
            .expect_err("past the end")
            .to_string();
        assert!(err.contains("`a`") && err.contains("reply 2"), "{err}");
        let err = llm
            .complete(&request("zzz", 0))
            .await
            .expect_err("unknown agent")
            .to_string();
        assert!(err.contains("`zzz`"), "{err}");
        assert!(ScriptedLlm::from_json(r#"{"a": [{}]}"#, "t").is_err());
        assert!(ScriptedLlm::from_json(r#"{"a": [{"txt": "x"}]}"#, "t").is_err());
    }
}
