//! [`Models`]: the model port of a host, which sends each call to the provider its model id
//! names — `openai:`, `anthropic:` or `bedrock:` — or, for an id without a known prefix,
//! to the OpenAI-compatible endpoint (as before providers had names). The agent's `model`
//! wins; `BATON_MODEL` is the default.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use baton_core::config::ModelConfig;
use baton_core::cost::split_model;
use baton_core::llm::{ChatRequest, KeySource, Llm, LlmError, LlmReply};

use crate::anthropic::{AnthropicConfig, AnthropicLlm};
use crate::bedrock::{self, BedrockConfig, BedrockLlm};
use crate::openai::{OpenAiConfig, OpenAiLlm};

pub struct Models {
    /// The model of agents that name none.
    default: String,
    openai: Option<Arc<dyn Llm>>,
    anthropic: Option<Arc<dyn Llm>>,
    bedrock: Option<Arc<dyn Llm>>,
}

impl Models {
    pub fn new(default: impl Into<String>) -> Self {
        Self {
            default: default.into(),
            openai: None,
            anthropic: None,
            bedrock: None,
        }
    }

    pub fn openai(mut self, llm: Arc<dyn Llm>) -> Self {
        self.openai = Some(llm);
        self
    }

    pub fn anthropic(mut self, llm: Arc<dyn Llm>) -> Self {
        self.anthropic = Some(llm);
        self
    }

    pub fn bedrock(mut self, llm: Arc<dyn Llm>) -> Self {
        self.bedrock = Some(llm);
        self
    }

    /// The model port of a host, with a client for each of `providers` (see
    /// `Catalog::providers`) and no other: Bedrock's is built from `bedrock` (the host's SDK
    /// settings), which only a host whose runs call Bedrock needs to load. A call routed to a
    /// provider without a client fails with an error that names it.
    pub fn for_providers(
        model: &ModelConfig,
        providers: &BTreeSet<String>,
        bedrock: Option<&aws_sdk_bedrockruntime::config::Builder>,
        key_source: Option<Arc<dyn KeySource>>,
    ) -> Result<Self, LlmError> {
        let mut models = Models::new(model.model.clone());
        if providers.contains("openai") {
            let openai =
                OpenAiLlm::new(OpenAiConfig::from_model(model))?.with_key_source(key_source);
            models = models.openai(Arc::new(openai));
        }
        if providers.contains("anthropic") {
            let anthropic = AnthropicLlm::new(AnthropicConfig::from_model(model))?;
            models = models.anthropic(Arc::new(anthropic));
        }
        if let Some(sdk) = bedrock.filter(|_| providers.contains("bedrock")) {
            let cfg = BedrockConfig::from_model(model);
            models = models.bedrock(Arc::new(BedrockLlm::new(
                bedrock::client(sdk, cfg.timeout),
                cfg,
            )));
        }
        Ok(models)
    }

    /// The provider and model id a call with `model` (the agent's, if any) goes to.
    pub fn route<'a>(&'a self, model: Option<&'a str>) -> (&'a str, &'a str) {
        split_model(model.unwrap_or(&self.default))
    }
}

#[async_trait::async_trait]
impl Llm for Models {
    /// The longest of its clients': a step may call any of them.
    fn longest_call(&self) -> Option<Duration> {
        [&self.openai, &self.anthropic, &self.bedrock]
            .into_iter()
            .flatten()
            .filter_map(|c| c.longest_call())
            .max()
    }

    async fn complete(&self, request: &ChatRequest<'_>) -> Result<LlmReply, LlmError> {
        let (provider, id) = self.route(request.model);
        let client = match provider {
            "anthropic" => &self.anthropic,
            "bedrock" => &self.bedrock,
            _ => &self.openai,
        };
        let Some(client) = client else {
            return Err(LlmError::fatal(format!(
                "model `{provider}:{id}` needs the {provider} client, which this host does not have"
            )));
        };
        let routed = ChatRequest {
            model: Some(id),
            ..*request
        };
        client.complete(&routed).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records the model ids it is asked for.
    struct Seen(&'static str, Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl Llm for Seen {
        async fn complete(&self, r: &ChatRequest<'_>) -> Result<LlmReply, LlmError> {
            let id = r.model.unwrap_or_default().to_owned();
            self.1.lock().unwrap().push(id.clone());
            Ok(LlmReply {
                text: Some(self.0.into()),
                model: Some(format!("{}:{id}", self.0)),
                ..Default::default()
            })
        }
    }

    #[tokio::test]
    async fn each_call_goes_to_the_provider_its_model_names() {
        let (o, a) = (
            Arc::new(Seen("openai", Mutex::default())),
            Arc::new(Seen("anthropic", Mutex::default())),
        );
        let models = Models::new("gpt-4o-mini")
            .openai(o.clone())
            .anthropic(a.clone());
        let ask = |model: Option<&'static str>| {
            let models = &models;
            async move {
                let req = ChatRequest {
                    max_output_tokens: None,
                    run_id: "r",
                    agent: "a",
                    think_index: 0,
                    model,
                    system: "",
                    tools: &[],
                    history: &[],
                    deltas: None,
                    controls: &baton_core::llm::Controls::NONE,
                    images: &[],
                };
                models.complete(&req).await
            }
        };
        let r = ask(None).await.expect("default");
        assert_eq!(r.model.as_deref(), Some("openai:gpt-4o-mini"));
        ask(Some("anthropic:claude-sonnet-4-5"))
            .await
            .expect("anthropic");
        ask(Some("llama3:8b")).await.expect("bare id");
        ask(Some("openai:gpt-4o")).await.expect("openai");
        assert_eq!(*o.1.lock().unwrap(), ["gpt-4o-mini", "llama3:8b", "gpt-4o"]);
        assert_eq!(*a.1.lock().unwrap(), ["claude-sonnet-4-5"]);
        let err = ask(Some("bedrock:amazon.nova-lite-v1:0"))
            .await
            .expect_err("no bedrock client");
        assert!(err.to_string().contains("bedrock"), "{err}");
    }
}
