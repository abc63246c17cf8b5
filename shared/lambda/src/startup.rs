//! A function's start-up, once per container: the configuration, one SDK config, the model
//! secret's fields, the model clients and the service over AWS.

use std::collections::HashMap;
use std::sync::Arc;

use baton_aws::dynamo::DynamoStore;
use baton_aws::sdk::{Meter, StaticKeys, lambda_sdk_config, map_sdk_err};
use baton_aws::settings::AwsSettings;
use baton_aws::watch::AppSyncWatchers;
use baton_core::agent::{Catalog, CatalogError, Extensions, FileError};
use baton_core::config::{Config, ConfigError, ModelConfig};
use baton_core::error::PortError;
use baton_core::links::{Links, ShortKey};
use baton_core::live::grant::{Grants, Watchers};
use baton_core::llm::{KeySource, Llm, LlmError, NoModel};
use baton_core::ports::SystemClock;
use baton_core::service::{Service, ServiceBuilder};
use serde_json::Value;

/// Why a function could not start. Each names what to fix.
#[derive(thiserror::Error)]
pub enum InitError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("AWS: {0}")]
    Aws(String),
    #[error("cannot read a secret from Secrets Manager ({arn})")]
    Secret {
        arn: String,
        #[source]
        source: PortError,
    },
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    AgentsFile(#[from] FileError),
    #[error("cannot read the agents file from {uri} (BATON_AGENTS_S3_URI)")]
    AgentsS3 {
        uri: String,
        #[source]
        source: PortError,
    },
    #[error("the link key (it signs one-time answer links and watch tokens)")]
    Links(#[from] ShortKey),
    #[error(
        "the live channel needs the link key (it signs watch tokens): set \
         BATON_LINK_KEY_SECRET_ARN (the template's LinkKeySecret), or BATON_LINK_KEY (at \
         least 32 characters)"
    )]
    NoGrantKey,
    #[error(
        "BATON_PUBLIC_URL is set but no link key is: set BATON_LINK_KEY_SECRET_ARN (the \
         template's LinkKeySecret), or BATON_LINK_KEY (at least 32 characters)"
    )]
    NoLinkKey,
}

/// As Lambda's log shows it (a function's `main` returns it): what to fix, and why.
impl std::fmt::Debug for InitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

/// What every function starts from, once per container: the configuration and one SDK
/// config that every client is built from.
pub struct Startup {
    pub config: Config,
    /// What only an AWS host reads: the deployment's resources, the SDK's endpoint, the
    /// live channel.
    pub settings: AwsSettings,
    pub sdk: aws_config::SdkConfig,
    /// The model secret's fields, read once per container (the models and the tools'
    /// headers both need them at start-up).
    secrets: tokio::sync::OnceCell<HashMap<String, String>>,
    /// The link key, read once per container (links and watch grants both need it).
    link_key: tokio::sync::OnceCell<Option<String>>,
    /// The agents file's text from S3 (`BATON_AGENTS_S3_URI`), read once per container by
    /// the functions that need it (not the live channel's authorizer).
    agents_text: tokio::sync::OnceCell<Option<String>>,
    /// The deployment's own Rust tools, plugins and agents (a `baton new` project's tools
    /// crate's `extensions()`; none for Baton's own functions), added to every catalog this
    /// startup builds.
    extensions: Extensions,
}

impl Startup {
    /// This startup with the deployment's own tools, plugins and agents: [`crate::main`]
    /// gives it the function's.
    pub fn with_extensions(mut self, extensions: Extensions) -> Self {
        self.extensions = extensions;
        self
    }

    /// Reads the environment (see `template.yaml`) and loads the SDK config.
    pub async fn from_env() -> Result<Self, InitError> {
        let config = Config::from_env()?;
        let settings = AwsSettings::from_env()?;
        settings.aws()?;
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let keys = match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(access_key_id), Some(secret_access_key)) => Some(StaticKeys {
                access_key_id,
                secret_access_key,
                session_token: var("AWS_SESSION_TOKEN"),
            }),
            _ => None,
        };
        let region = var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION"));
        let sdk = lambda_sdk_config(&settings.sdk, keys, region).map_err(InitError::Aws)?;
        Ok(Self {
            config,
            settings,
            sdk,
            secrets: tokio::sync::OnceCell::new(),
            link_key: tokio::sync::OnceCell::new(),
            agents_text: tokio::sync::OnceCell::new(),
            extensions: Extensions::default(),
        })
    }

    /// The agents file: `BATON_AGENTS_S3_URI`'s object (one past Lambda's 4 KB environment,
    /// read once per container), else what [`Config::agents`] reads.
    pub async fn agents(&self) -> Result<Option<baton_core::agent::AgentsFile>, InitError> {
        let Some(uri) = &self.config.agents_s3_uri else {
            return Ok(self.config.agents()?);
        };
        let text = self
            .agents_text
            .get_or_try_init(|| async {
                baton_aws::s3::read_text(&self.sdk, uri)
                    .await
                    .map(Some)
                    .map_err(|source| InitError::AgentsS3 {
                        uri: uri.clone(),
                        source,
                    })
            })
            .await?;
        Ok(text
            .as_deref()
            .map(|t| baton_core::agent::AgentsFile::parse(t, "BATON_AGENTS_S3_URI"))
            .transpose()?)
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
                let text = source.read().await.map_err(|e| InitError::Secret {
                    arn: source.arn.clone(),
                    source: e,
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

    /// Every model provider the agents' models name, routed by `provider:model-id`: the
    /// OpenAI-compatible endpoint (its key re-read from the secret after a 401), Anthropic,
    /// and Bedrock with the function's role.
    #[cfg(feature = "steps")]
    pub async fn models(&self) -> Result<baton_llm::Models, InitError> {
        let model = self.model().await?;
        let catalog = Catalog::declared(self.agents().await?, &self.extensions)?;
        let bedrock = aws_sdk_bedrockruntime::config::Builder::from(&self.sdk);
        Ok(baton_llm::Models::for_providers(
            &model,
            &catalog.providers(&model.model),
            Some(&bedrock),
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

    /// The service of the step functions, thinking with `llm`, sending what steps do to
    /// `live` and reporting committed steps to `observers`: its catalog runs tools, so
    /// `${VAR}` in the agents file's headers is read from the model secret's fields, then the
    /// environment.
    #[cfg(feature = "steps")]
    pub async fn step_service(
        &self,
        llm: Arc<dyn Llm>,
        live: Option<Arc<dyn baton_core::live::Live>>,
        observers: Vec<Arc<dyn baton_core::observe::Observer>>,
    ) -> Result<Arc<Service>, InitError> {
        let secrets = self.secrets().await?;
        let lookup = |k: &str| secrets.get(k).cloned().or_else(|| std::env::var(k).ok());
        let catalog = baton_tools::catalog(
            self.agents().await?,
            baton_tools::Host::Lambda,
            &lookup,
            &self.extensions,
        )?;
        self.claim_format().await?;
        let service = observers
            .into_iter()
            .fold(self.service(llm, catalog).await?, |b, o| b.observer(o))
            .live(live);
        Ok(Arc::new(service.build()))
    }

    /// One-time answer links, when `BATON_PUBLIC_URL` is set (the template's `PublicUrl`),
    /// signed with the link key ([`Self::link_key`]).
    pub async fn links(&self) -> Result<Option<Links>, InitError> {
        let Some(base) = &self.config.public_url else {
            return Ok(None);
        };
        let Some(key) = self.link_key().await? else {
            return Err(InitError::NoLinkKey);
        };
        Ok(Some(Links::new(key.as_bytes(), base)?))
    }

    /// The link key, which signs one-time answer links and watch tokens: its own secret's
    /// text (`BATON_LINK_KEY_SECRET_ARN`, which the template generates and lets the
    /// functions read, and nothing else), else the model secret's `BATON_LINK_KEY` field,
    /// else the variable.
    pub async fn link_key(&self) -> Result<Option<String>, InitError> {
        let key = self
            .link_key
            .get_or_try_init(|| async {
                let key = match &self.config.link_key_secret_arn {
                    Some(arn) => {
                        let secret = SecretKey {
                            client: aws_sdk_secretsmanager::Client::new(&self.sdk),
                            arn: arn.clone(),
                        };
                        let text = secret.read().await.map_err(|e| InitError::Secret {
                            arn: arn.clone(),
                            source: e,
                        })?;
                        text.map(|t| t.trim().to_owned())
                    }
                    None => self.secrets().await?.get("BATON_LINK_KEY").cloned(),
                };
                Ok::<_, InitError>(key.or_else(|| self.config.link_key.clone()))
            })
            .await?;
        Ok(key.clone())
    }

    /// The signer of watch tokens (the `live` function checks them; the `api` function
    /// grants them).
    pub async fn grants(&self) -> Result<Grants, InitError> {
        let key = self.link_key().await?.ok_or(InitError::NoGrantKey)?;
        Ok(Grants::new(key.as_bytes())?)
    }

    /// Grants of watches on the live channel, when it is configured (the `api` function).
    pub async fn watchers(&self) -> Result<Option<Arc<dyn Watchers>>, InitError> {
        let Some(live) = &self.settings.live else {
            return Ok(None);
        };
        let aws = self.settings.aws()?;
        Ok(Some(Arc::new(AppSyncWatchers {
            store: DynamoStore::new(
                aws_sdk_dynamodb::Client::new(&self.sdk),
                &aws.table,
                aws.retention_days,
                Meter::shared(),
            ),
            grants: self.grants().await?,
            live: live.clone(),
        })))
    }

    /// The live channel's publisher, when it is configured (the step functions).
    #[cfg(feature = "steps")]
    pub fn live(&self) -> Result<Option<Arc<baton_aws::appsync::AppSyncLive>>, InitError> {
        let Some(live) = &self.settings.live else {
            return Ok(None);
        };
        let credentials = self
            .sdk
            .credentials_provider()
            .ok_or_else(|| InitError::Aws("no credentials to publish live events with".into()))?;
        let region = self
            .sdk
            .region()
            .ok_or_else(|| InitError::Aws("no region to publish live events in".into()))?;
        Ok(Some(baton_aws::appsync::AppSyncLive::start(
            baton_aws::appsync::Publisher {
                url: live.publish_url.clone(),
                region: region.to_string(),
                credentials,
            },
        )))
    }

    /// The service of the `api` and `events` functions, which never think nor run a tool: the
    /// agents file's tools are known by name only (`Catalog::declared`).
    pub async fn request_service(&self) -> Result<Arc<Service>, InitError> {
        let catalog = Catalog::declared(self.agents().await?, &self.extensions)?;
        self.claim_format().await?;
        let service = self.service(Arc::new(NoModel), catalog).await?;
        Ok(Arc::new(service.build()))
    }

    /// The table's store format is this release's, or older: a table a newer release
    /// wrote fails the cold start, saying so, rather than being misread.
    async fn claim_format(&self) -> Result<(), InitError> {
        let cfg = self.settings.aws()?;
        baton_aws::dynamo::DynamoStore::new(
            aws_sdk_dynamodb::Client::new(&self.sdk),
            &cfg.table,
            cfg.retention_days,
            Meter::shared(),
        )
        .claim_format()
        .await
        .map_err(|e| InitError::Aws(e.to_string()))
    }

    /// What every function's service is built with: the AWS ports, the catalog, links (if
    /// `BATON_PUBLIC_URL` is set) and the timeline cache's budget.
    async fn service(
        &self,
        llm: Arc<dyn Llm>,
        catalog: Catalog,
    ) -> Result<ServiceBuilder, InitError> {
        let deps = baton_aws::aws_deps(
            self.settings.aws()?,
            &self.sdk,
            llm,
            Arc::new(SystemClock),
            Meter::shared(),
        );
        let outbox = crate::outbox_metrics::OutboxMetrics::new(&self.config.metrics_namespace);
        let notifier = crate::notifier::HttpNotifier::new()
            .map_err(|e| InitError::Aws(format!("the notifications' HTTP client: {e}")))?;
        let builder = Service::builder(deps, Arc::new(catalog));
        // Questions' e-mail goes out where their timers fire: the `events` function.
        #[cfg(feature = "events")]
        let builder = builder.mailer(Arc::new(baton_aws::ses::SesMailer::new(&self.sdk)));
        Ok(builder
            .notifier(Arc::new(notifier))
            .observer(Arc::new(outbox))
            .quotas(baton_core::service::Quotas::of(&self.config))
            .links(self.links().await?)
            // A quarter of the function's memory (`MemorySize`), unless BATON_CACHE_MB says.
            .cache_bytes(self.config.cache_bytes(None)))
    }
}

/// A model API key kept in Secrets Manager (`BATON_LLM_SECRET_ARN`): read at start-up, and
/// again when the provider answers 401, so a rotated key does not fail runs.
pub struct SecretKey {
    pub client: aws_sdk_secretsmanager::Client,
    pub arn: String,
}

impl SecretKey {
    /// The secret's text.
    pub async fn read(&self) -> Result<Option<String>, PortError> {
        let secret = self
            .client
            .get_secret_value()
            .secret_id(&self.arn)
            .send()
            .await
            .map_err(|e| map_sdk_err("GetSecretValue", e))?;
        Ok(secret.secret_string().map(str::to_owned))
    }
}

#[async_trait::async_trait]
impl KeySource for SecretKey {
    /// The OpenAI-compatible key: the secret, or its `OPENAI_API_KEY` field.
    async fn fetch(&self) -> Result<Option<String>, PortError> {
        Ok(self
            .read()
            .await?
            .and_then(|t| secret_fields(&t).remove("OPENAI_API_KEY")))
    }
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
