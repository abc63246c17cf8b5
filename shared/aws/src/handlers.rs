//! What the Lambda functions share: their start-up (config, SDK, model key, catalog, the
//! service over AWS, each built once per container), the SQS batch handlers, and logging.
//!
//! The event source mapping stand-in of `baton dev --aws` ([`crate::event_source`]) calls
//! these same handlers in-process with real `SqsEvent`s, so the local flow over an emulator
//! runs exactly the code Lambda runs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use baton_core::agent::{Catalog, CatalogError};
use baton_core::config::{AwsConfig, Config, ConfigError, ModelConfig};
use baton_core::links::Links;
use baton_core::llm::{KeySource, Llm, LlmError, NoModel};
use baton_core::message::StepMessage;
use baton_core::ports::{Clock, SystemClock};
pub use baton_core::service::SWEEP_EVENT;
use baton_core::service::{Delivery, Deps, Service, ServiceError, Verdict};
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;
use tracing::{Instrument, error, info, info_span, warn};

#[cfg(feature = "steps")]
use baton_llm::{
    Models,
    anthropic::{AnthropicConfig, AnthropicLlm},
    bedrock::{self, BedrockConfig, BedrockLlm},
    openai::{OpenAiConfig, OpenAiLlm},
};
#[cfg(feature = "steps")]
use baton_tools::Host;

use crate::dynamo::DynamoStore;
use crate::eventbridge::EventBridgeBus;
use crate::scheduler::SchedulerTimers;
use crate::sdk::{Meter, sdk_config};
use crate::sqs::SqsQueue;

/// Builds the service over DynamoDB, SQS, EventBridge and Scheduler from one SDK config.
pub fn aws_service(
    cfg: &AwsConfig,
    sdk: &aws_config::SdkConfig,
    llm: Arc<dyn Llm>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
    meter: Arc<Meter>,
) -> Arc<Service> {
    let deps = Deps {
        store: Arc::new(DynamoStore::new(
            aws_sdk_dynamodb::Client::new(sdk),
            &cfg.table,
            cfg.retention_days,
            meter.clone(),
        )),
        queue: Arc::new(SqsQueue::new(
            aws_sdk_sqs::Client::new(sdk),
            &cfg.steps_queue_url,
            &cfg.subagent_queue_url,
            meter.clone(),
        )),
        bus: Arc::new(EventBridgeBus::new(
            aws_sdk_eventbridge::Client::new(sdk),
            &cfg.bus_name,
            meter.clone(),
        )),
        blobs: Arc::new(crate::s3::S3Blobs::new(
            aws_sdk_s3::Client::new(sdk),
            &cfg.bucket,
        )),
        scheduler: Arc::new(SchedulerTimers::new(
            aws_sdk_scheduler::Client::new(sdk),
            &cfg.schedule_group,
            &cfg.bus_arn,
            &cfg.scheduler_role_arn,
            meter,
        )),
        llm,
        clock,
        queue_in_store: false,
    };
    Arc::new(Service::new(deps, catalog))
}

/// Why a function could not start. Each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read the model API key from Secrets Manager ({arn}): {message}")]
    Secret { arn: String, message: String },
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("one-time answer links: {0}")]
    Links(String),
}

/// What every function starts from, once per container: the configuration and one SDK
/// config that every client is built from.
pub struct Runtime {
    pub config: Config,
    pub sdk: aws_config::SdkConfig,
    /// The model secret's fields, read once per container (the models and the tools'
    /// headers both need them at start-up).
    secrets: tokio::sync::OnceCell<HashMap<String, String>>,
}

impl Runtime {
    /// Reads the environment (see `template.yaml`) and loads the SDK config.
    pub async fn from_env() -> Result<Self, InitError> {
        let config = Config::from_env()?;
        config.aws()?;
        let sdk = sdk_config(&config.sdk).await;
        Ok(Self {
            config,
            sdk,
            secrets: tokio::sync::OnceCell::new(),
        })
    }

    /// The fields of the model secret (`BATON_LLM_SECRET_ARN`), if one is named: a JSON
    /// object of names to values (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, and any `${VAR}`
    /// the agents file's headers use), or a plain string, the OpenAI-compatible key.
    pub async fn secrets(&self) -> Result<HashMap<String, String>, InitError> {
        let fields = self
            .secrets
            .get_or_try_init(|| async {
                let Some(source) = self.key_source() else {
                    return Ok::<_, InitError>(HashMap::new());
                };
                let text = source.read().await.map_err(|message| InitError::Secret {
                    arn: source.arn.clone(),
                    message,
                })?;
                Ok(text.map(|t| secret_fields(&t)).unwrap_or_default())
            })
            .await?;
        Ok(fields.clone())
    }

    /// The model settings, with the keys the model secret holds.
    pub async fn model(&self) -> Result<ModelConfig, InitError> {
        let mut model = self.config.model.clone();
        let mut secrets = self.secrets().await?;
        if self.config.model.secret_arn.is_some() {
            model.api_key = secrets.remove("OPENAI_API_KEY");
        }
        if let Some(key) = secrets.remove("ANTHROPIC_API_KEY") {
            model.anthropic_api_key = Some(key);
        }
        Ok(model)
    }

    /// Every model provider, routed by the agent's `provider:model-id`: the
    /// OpenAI-compatible endpoint (its key re-read from the secret after a 401), Anthropic,
    /// and Bedrock with the function's role.
    #[cfg(feature = "steps")]
    pub async fn models(&self) -> Result<Models, InitError> {
        let model = self.model().await?;
        let catalog = Catalog::declared(self.config.agents()?)?;
        Ok(models(
            &model,
            &providers(&catalog, &model.model),
            Some(&self.sdk),
            self.key_source().map(|k| k as _),
        )?)
    }

    /// The secret the model keys are read from again when a provider refuses them.
    pub fn key_source(&self) -> Option<Arc<SecretKey>> {
        let arn = self.config.model.secret_arn.clone()?;
        Some(Arc::new(SecretKey {
            client: aws_sdk_secretsmanager::Client::new(&self.sdk),
            arn,
        }))
    }

    /// The service of the step functions, thinking with `llm`: its catalog runs tools, so
    /// `${VAR}` in the agents file's headers is read from the model secret's fields, then the
    /// environment.
    #[cfg(feature = "steps")]
    pub async fn step_service(&self, llm: Arc<dyn Llm>) -> Result<Arc<Service>, InitError> {
        let secrets = self.secrets().await?;
        let lookup = |k: &str| secrets.get(k).cloned().or_else(|| std::env::var(k).ok());
        let catalog = baton_tools::catalog(self.config.agents()?, Host::Lambda, &lookup, vec![])?;
        let service = self.service(llm, catalog)?;
        if let Some(links) = self.links().await? {
            service.set_links(links);
        }
        Ok(service)
    }

    /// One-time answer links, when `BATON_PUBLIC_URL` is set (the template's `PublicUrl`)
    /// and a key is given: the model secret's `BATON_LINK_KEY` field, else the variable.
    pub async fn links(&self) -> Result<Option<Links>, InitError> {
        let Some(base) = &self.config.public_url else {
            return Ok(None);
        };
        let secrets = self.secrets().await?;
        let key = secrets
            .get("BATON_LINK_KEY")
            .cloned()
            .or_else(|| self.config.link_key.clone());
        let Some(key) = key else {
            return Err(InitError::Links(
                "BATON_PUBLIC_URL is set but no key is: add a BATON_LINK_KEY field (at least 32 \
                 characters) to the model secret"
                    .into(),
            ));
        };
        Links::new(key.as_bytes(), base)
            .map(Some)
            .map_err(InitError::Links)
    }

    /// The service of the `api` and `cta` functions, which never think nor run a tool: the
    /// agents file's tools are known by name only (`Catalog::declared`).
    pub async fn request_service(&self) -> Result<Arc<Service>, InitError> {
        let catalog = Catalog::declared(self.config.agents()?)?;
        let service = self.service(Arc::new(NoModel), catalog)?;
        if let Some(links) = self.links().await? {
            service.set_links(links);
        }
        Ok(service)
    }

    fn service(&self, llm: Arc<dyn Llm>, catalog: Catalog) -> Result<Arc<Service>, InitError> {
        Ok(aws_service(
            self.config.aws()?,
            &self.sdk,
            llm,
            Arc::new(catalog),
            Arc::new(SystemClock),
            Meter::shared(),
        ))
    }
}

/// The model providers a host's runs call: each agent's model's, and `default`'s
/// (`BATON_MODEL`) for the agents that name none.
pub fn providers(catalog: &Catalog, default: &str) -> std::collections::BTreeSet<String> {
    catalog
        .models(default)
        .into_iter()
        .map(|(model, _)| baton_core::cost::split_model(&model).0.to_owned())
        .chain([baton_core::cost::split_model(default).0.to_owned()])
        .collect()
}

/// The model port of a host, routed by `provider:model-id` (see [`Models`]), with a client
/// for each of `providers` and no other: Bedrock's is built from `sdk`, which only a host
/// whose runs call Bedrock needs to load (a call routed to a provider without a client
/// fails with an error that names it).
#[cfg(feature = "steps")]
pub fn models(
    model: &ModelConfig,
    providers: &std::collections::BTreeSet<String>,
    sdk: Option<&aws_config::SdkConfig>,
    key_source: Option<Arc<dyn KeySource>>,
) -> Result<Models, LlmError> {
    let mut models = Models::new(model.model.clone());
    if providers.contains("openai") {
        let openai = OpenAiLlm::new(OpenAiConfig::from_model(model))?.with_key_source(key_source);
        models = models.openai(Arc::new(openai));
    }
    if providers.contains("anthropic") {
        models = models.anthropic(Arc::new(AnthropicLlm::new(AnthropicConfig::from_model(
            model,
        ))?));
    }
    if let Some(sdk) = sdk.filter(|_| providers.contains("bedrock")) {
        let timeout = Duration::from_secs(u64::from(model.timeout_secs));
        models = models.bedrock(Arc::new(BedrockLlm::new(
            bedrock::client(&aws_sdk_bedrockruntime::config::Builder::from(sdk), timeout),
            BedrockConfig::from_model(model),
        )));
    }
    Ok(models)
}

/// A secret's fields: a JSON object's string members, or a plain string as the
/// OpenAI-compatible key.
pub fn secret_fields(text: &str) -> HashMap<String, String> {
    let text = text.trim();
    match serde_json::from_str::<serde_json::Map<String, Value>>(text) {
        Ok(map) => map
            .into_iter()
            .filter_map(|(k, v)| v.as_str().map(|s| (k, s.trim().to_owned())))
            .collect(),
        Err(_) => HashMap::from([("OPENAI_API_KEY".to_owned(), text.to_owned())]),
    }
}

#[cfg(feature = "steps")]
/// The `orchestrator` and `subagent` functions: steps from their queue (and its dead-letter
/// queue, `BATON_DEAD_LETTER_QUEUE_ARN`), thinking with `llm`, until Lambda stops them.
pub async fn run_steps(runtime: Runtime, llm: Arc<dyn Llm>) -> Result<(), lambda_runtime::Error> {
    let aws = runtime.config.aws()?;
    let dead_letters = vec![aws.dead_letter_queue_arn()?.to_owned()];
    let queues = [aws.steps_queue_url.clone(), aws.subagent_queue_url.clone()];
    let step_budget = runtime.config.model.step_budget();
    let sqs = aws_sdk_sqs::Client::new(&runtime.sdk);
    let service = runtime.step_service(llm).await?;
    let handler = Arc::new((service, dead_letters, queues, sqs));
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let handler = handler.clone();
        async move {
            let (service, dead_letters, queues, sqs) = &*handler;
            let at = std::time::UNIX_EPOCH + Duration::from_millis(event.context.deadline);
            // A deadline already past as the batch starts is no real invocation's (an
            // emulator's such as `cargo lambda watch`, or a broken clock): ignore it.
            let deadline = (at > SystemTime::now()).then_some(Deadline { at, step_budget });
            let out = handle_steps_until(service, dead_letters, event.payload, deadline).await;
            let urls = [queues[0].as_str(), queues[1].as_str()];
            release(sqs, &urls, &out.deferred).await;
            Ok::<_, lambda_runtime::Error>(out.response)
        }
    }))
    .await
}

/// The `cta` function: answers and expiries from the inbox queue, until Lambda stops it.
pub async fn run_cta_inbox(runtime: Runtime) -> Result<(), lambda_runtime::Error> {
    let service = runtime.request_service().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let service = service.clone();
        async move { Ok::<_, lambda_runtime::Error>(handle_cta_inbox(&service, event.payload).await) }
    }))
    .await
}

/// A model API key kept in Secrets Manager (`BATON_LLM_SECRET_ARN`): read at start-up, and
/// again when the provider answers 401, so a rotated key does not fail runs.
pub struct SecretKey {
    pub client: aws_sdk_secretsmanager::Client,
    pub arn: String,
}

impl SecretKey {
    /// The secret's text.
    pub async fn read(&self) -> Result<Option<String>, String> {
        let secret = self
            .client
            .get_secret_value()
            .secret_id(&self.arn)
            .send()
            .await
            .map_err(|e| crate::sdk::map_sdk_err("GetSecretValue", e).to_string())?;
        Ok(secret.secret_string().map(str::to_owned))
    }
}

#[async_trait::async_trait]
impl KeySource for SecretKey {
    /// The OpenAI-compatible key: the secret, or its `OPENAI_API_KEY` field.
    async fn fetch(&self) -> Result<Option<String>, String> {
        Ok(self
            .read()
            .await?
            .and_then(|t| secret_fields(&t).remove("OPENAI_API_KEY")))
    }
}

/// JSON logs, as `LoggingConfig: {LogFormat: JSON}` expects.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .without_time()
        .try_init();
}

fn failure(id: String) -> BatchItemFailure {
    let mut f = BatchItemFailure::default();
    f.item_identifier = id;
    f
}

/// When the invocation ends, and how long a step may take at most.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    pub at: SystemTime,
    /// `ModelConfig::step_budget`: a step is started only with this much time left.
    pub step_budget: Duration,
}

/// What a steps batch did: the response for Lambda, and the records deferred because the
/// invocation's time ran out (already in the response's failures), for [`release`].
#[derive(Debug, Default)]
pub struct StepsOutcome {
    pub response: SqsBatchResponse,
    pub deferred: Vec<SqsMessage>,
}

/// The `orchestrator` and `subagent` functions: one step per message, in order, without a
/// deadline (the in-process event source mappings and tests).
pub async fn handle_steps(
    service: &Service,
    dead_letters: &[String],
    event: SqsEvent,
) -> SqsBatchResponse {
    handle_steps_until(service, dead_letters, event, None)
        .await
        .response
}

/// One step per message, in order, while the invocation has time for one more.
///
/// With SQS FIFO and `ReportBatchItemFailures`, once a message of a group fails, every later
/// message of that group in the batch is reported failed too, or SQS would deliver them out
/// of order. Only retryable errors are reported: a terminal one has already failed its run
/// (see `Service::handle`), so redelivering it could not help. Records from one of
/// `dead_letters` (queue ARNs) end their run as failed. With a [`Deadline`], a record is
/// started only if a whole step fits before it (the first always is); the rest are
/// deferred: reported as failures, in order, and returned so the caller can make them
/// visible again at once ([`release`]) rather than after the visibility timeout.
pub async fn handle_steps_until(
    service: &Service,
    dead_letters: &[String],
    event: SqsEvent,
    deadline: Option<Deadline>,
) -> StepsOutcome {
    let mut failed_groups: HashSet<String> = HashSet::new();
    let mut out = StepsOutcome::default();
    for (i, rec) in event.records.into_iter().enumerate() {
        let id = rec.message_id.clone().unwrap_or_default();
        let group = rec
            .attributes
            .get("MessageGroupId")
            .cloned()
            .unwrap_or_default();
        if failed_groups.contains(&group) {
            out.response.batch_item_failures.push(failure(id));
            continue;
        }
        if let Some(d) = deadline {
            let left = d.at.duration_since(SystemTime::now()).unwrap_or_default();
            if i > 0 && left < d.step_budget {
                info!(message_id = %id, left_ms = left.as_millis() as u64, "deferred: no time for another step");
                failed_groups.insert(group);
                out.response.batch_item_failures.push(failure(id));
                out.deferred.push(rec);
                continue;
            }
            if i == 0 && left < d.step_budget {
                warn!(
                    left_ms = left.as_millis() as u64,
                    budget_ms = d.step_budget.as_millis() as u64,
                    "the function timeout is shorter than one step's budget (model timeout x attempts)"
                );
            }
        }
        let msg: StepMessage = match rec.body.as_deref().map(serde_json::from_str) {
            Some(Ok(m)) => m,
            other => {
                // A poison message can never succeed: log it and let it go.
                error!(message_id = %id, error = ?other.map(|r| r.err().map(|e| e.to_string())), "undecodable step message dropped");
                continue;
            }
        };
        let dead = rec
            .event_source_arn
            .as_ref()
            .is_some_and(|a| dead_letters.contains(a));
        let receives = rec
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        let delivery = Delivery {
            message: &msg,
            receives,
            dead: dead.then_some("its retries were exhausted"),
        };
        let span = info_span!("step", message_id = %id, run_id = %msg.run_id, dead);
        match service.consume(delivery, false).instrument(span).await {
            Verdict::Ack => {}
            // Back to the queue, with the rest of its FIFO group behind it.
            Verdict::Retry { .. } | Verdict::Crashed => {
                failed_groups.insert(group);
                out.response.batch_item_failures.push(failure(id));
            }
        }
    }
    out
}

/// Makes deferred records visible again at once (visibility timeout 0), so their runs wait
/// for the next invocation, not for the queue's visibility timeout. `queue_urls` are the
/// queues the records may come from; a record of another queue waits its timeout out.
pub async fn release(sqs: &aws_sdk_sqs::Client, queue_urls: &[&str], deferred: &[SqsMessage]) {
    for rec in deferred {
        let name = rec
            .event_source_arn
            .as_deref()
            .and_then(|a| a.rsplit(':').next())
            .unwrap_or_default();
        let url = queue_urls
            .iter()
            .find(|u| !name.is_empty() && u.rsplit('/').next() == Some(name));
        let (Some(url), Some(receipt)) = (url, rec.receipt_handle.as_deref()) else {
            continue;
        };
        if let Err(e) = sqs
            .change_message_visibility()
            .queue_url(*url)
            .receipt_handle(receipt)
            .visibility_timeout(0)
            .send()
            .await
        {
            warn!(error = %crate::sdk::map_sdk_err("ChangeMessageVisibility", e), "a deferred record waits its visibility timeout");
        }
    }
}

/// How old a parking outbox must be before the sweep performs it: older than any step that
/// may still be performing it (a step's effects take milliseconds; its retries, minutes).
pub const SWEEP_AFTER: chrono::Duration = chrono::Duration::minutes(5);

/// The `cta` function: the inbox queue's events — `cta.response` and `cta.expired` from the
/// bus, plan steps' `timer.fired`, the sweep's tick — each handed to
/// [`Service::inbox_event`]. An invalid or late one is refused (and published as
/// `cta.rejected`) and dropped, never blocking the queue; backend errors are retried.
pub async fn handle_cta_inbox(service: &Service, event: SqsEvent) -> SqsBatchResponse {
    let mut resp = SqsBatchResponse::default();
    for rec in event.records {
        let id = rec.message_id.clone().unwrap_or_default();
        let envelope: Value = match rec.body.as_deref().map(serde_json::from_str) {
            Some(Ok(v)) => v,
            _ => {
                error!(message_id = %id, "undecodable inbox message dropped");
                continue;
            }
        };
        let detail_type = envelope["detail-type"].as_str().unwrap_or_default();
        let detail = &envelope["detail"];
        let span = info_span!("cta", message_id = %id, cta_id = %detail["ctaId"].as_str().unwrap_or_default(), detail_type = %detail_type);
        let outcome = service
            .inbox_event(&id, detail_type, detail, SWEEP_AFTER)
            .instrument(span)
            .await;
        match outcome {
            Err(ServiceError::Port(e)) if e.is_retryable() => {
                warn!(message_id = %id, error = %e, "inbox message will be retried");
                resp.batch_item_failures.push(failure(id));
            }
            // Refused (and published as `cta.rejected`), or done.
            _ => {}
        }
    }
    resp
}
