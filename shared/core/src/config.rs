//! Configuration: the environment variables every host reads, once at start-up, validated
//! with errors that name the variable. What only an AWS deployment reads (its resources,
//! the SDK's endpoint, the live channel) is `baton-aws`'s (`baton_aws::settings`), read the
//! same way ([`var`], [`number`]).
//!
//! The names match `template.yaml` exactly. Parsing takes a lookup function, so it is pure
//! and tested without touching the process environment; [`Config::from_env`] is the one
//! place that reads it.

use std::path::PathBuf;

/// A variable that is missing or does not parse. Start-up stops with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("environment variable {var} is not set ({hint})")]
    Missing {
        var: &'static str,
        hint: &'static str,
    },
    #[error("environment variable {var}={value:?} is not valid: expected {expected}")]
    Invalid {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// The model clients' settings. `BATON_MODEL` may name any provider (`openai:`,
/// `anthropic:`, `bedrock:`); the OpenAI-compatible endpoint is also where ids without a
/// provider go.
#[derive(Clone, PartialEq, Eq)]
pub struct ModelConfig {
    /// `OPENAI_BASE_URL`, up to and including `/v1` (default OpenAI's).
    pub base_url: String,
    /// `OPENAI_API_KEY` (optional: local servers need none).
    pub api_key: Option<String>,
    /// `BATON_LLM_SECRET_ARN`: on AWS, the Secrets Manager secret holding the key.
    pub secret_arn: Option<String>,
    /// `BATON_MODEL`: the model when the agent names none (default `gpt-4o-mini`).
    pub model: String,
    /// `BATON_LLM_MAX_RETRIES`: retries after the first attempt (default 4).
    pub max_retries: u32,
    /// `BATON_LLM_TIMEOUT_SECONDS`: one attempt's timeout (default 120).
    pub timeout_secs: u32,
    /// `ANTHROPIC_BASE_URL`: the Messages API's root (default `https://api.anthropic.com`).
    pub anthropic_base_url: String,
    /// `ANTHROPIC_API_KEY` (on AWS: the `ANTHROPIC_API_KEY` field of the model secret).
    pub anthropic_api_key: Option<String>,
    /// `BATON_MAX_OUTPUT_TOKENS`: the most a reply may use, for the providers that need a
    /// limit (Anthropic, Bedrock; default 4096).
    pub max_output_tokens: u32,
}

/// The client's backoff between attempts: 0.5 s doubling, at most 30 s (a `Retry-After`
/// is honoured up to the same cap).
pub const LLM_INITIAL_BACKOFF_MS: u64 = 500;
pub const LLM_MAX_BACKOFF_MS: u64 = 30_000;

impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("secret_arn", &self.secret_arn)
            .field("model", &self.model)
            .field("max_retries", &self.max_retries)
            .field("timeout_secs", &self.timeout_secs)
            .field("anthropic_base_url", &self.anthropic_base_url)
            .field(
                "anthropic_api_key",
                &self.anthropic_api_key.as_ref().map(|_| "<redacted>"),
            )
            .field("max_output_tokens", &self.max_output_tokens)
            .finish()
    }
}

/// Everything read from the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub model: ModelConfig,
    /// `BATON_AGENTS_FILE`: extra agents (JSON), if any.
    pub agents_file: Option<PathBuf>,
    /// `BATON_AGENTS_JSON`: the agents file's JSON itself (on Lambda, from the template's
    /// `AgentsJson`); used when `BATON_AGENTS_FILE` is not set.
    pub agents_json: Option<String>,
    /// `BATON_AGENTS_S3_URI`: `s3://bucket/key` of the agents file, on Lambda (the template's
    /// `AgentsS3Uri`), for one past Lambda's 4 KB environment: read once per container at
    /// start-up, in place of `BATON_AGENTS_JSON`.
    pub agents_s3_uri: Option<String>,
    /// `BATON_PREFIX`: the name prefix of resources `baton bootstrap` and `baton dev --aws`
    /// create (default `baton`).
    pub prefix: String,
    /// `BATON_SCHEDULER_ROLE_ARN` alone, for hosts that provision their own resources.
    pub scheduler_role_arn: Option<String>,
    /// `BATON_LINK_KEY`: the key one-time answer links are signed with (at least 32
    /// characters). On Lambda it comes from its own secret instead
    /// (`BATON_LINK_KEY_SECRET_ARN`, which the template creates), or the model secret's field
    /// of that name.
    pub link_key: Option<String>,
    /// `BATON_LINK_KEY_SECRET_ARN`: the Secrets Manager secret whose text is the link key.
    pub link_key_secret_arn: Option<String>,
    /// `BATON_PUBLIC_URL`: where people reach the console (`https://…`, no trailing slash);
    /// links point there.
    pub public_url: Option<String>,
    /// `BATON_SMTP_URL`: the SMTP server `baton dev` sends questions' e-mail through
    /// (`smtp://host:port`, `smtps://user:password@host`; see lettre's `from_url`). On AWS,
    /// e-mail goes through SES instead.
    pub smtp_url: Option<String>,
    /// `BATON_CACHE_MB`: how much of recently stepped timelines a host keeps in memory
    /// (default: see [`Config::cache_bytes`]).
    pub cache_mb: Option<u64>,
    /// `AWS_LAMBDA_FUNCTION_MEMORY_SIZE`: the memory Lambda gives the function, in MB.
    pub function_memory_mb: Option<u64>,
    /// `BATON_STEPS_AT_ONCE`: how many runs of a batch a step function steps at once (1 to
    /// 10), in place of what its memory allows (`steps_at_once`): for measuring, or for a
    /// deployment whose own tools hold more, or less, than the budget assumes.
    pub steps_at_once: Option<u32>,
    /// `BATON_STEPS_IN_A_ROW`: how many steps of one run a step function takes in a row in
    /// one invocation, the next message of each handed to the next in-process rather than
    /// sent through the queue (1 to 100; 1: every step through the queue). Unset: 10.
    pub steps_in_a_row: Option<u32>,
    /// `BATON_DEV_FUNCTION_TIMEOUT_S`: `baton dev --aws` ends every function's invocations
    /// at most this many seconds in (each function's own timeout from `template.yaml`
    /// otherwise), to see what Lambda does to a step that runs out of time.
    pub dev_function_timeout_s: Option<u32>,
    /// `BATON_METRICS_NAMESPACE`: the CloudWatch namespace of the step functions' metrics
    /// (default `Baton`; the template gives each stack its own, `Baton/<stack>`).
    pub metrics_namespace: String,
    /// `BATON_MAX_ACTIVE_RUNS_PER_OWNER`: how many top-level runs not yet ended an owner
    /// may have (unset or 0: no limit).
    pub max_active_runs_per_owner: Option<u32>,
    /// `BATON_MAX_DAILY_COST_USD_PER_OWNER`: what an owner's runs may spend on model calls
    /// in a UTC day before it may start no more that day (unset or 0: no limit).
    pub max_daily_cost_usd_per_owner: Option<f64>,
}

/// `BATON_AGENTS_S3_URI`, checked: `s3://bucket/key`.
fn agents_s3_uri(v: Option<String>) -> Result<Option<String>, ConfigError> {
    match v {
        Some(uri) => {
            let ok = uri
                .strip_prefix("s3://")
                .and_then(|r| r.split_once('/'))
                .is_some_and(|(b, k)| !b.is_empty() && !k.is_empty());
            if ok {
                Ok(Some(uri))
            } else {
                Err(ConfigError::Invalid {
                    var: "BATON_AGENTS_S3_URI",
                    value: uri,
                    expected: "s3://<bucket>/<key> of the agents file",
                })
            }
        }
        None => Ok(None),
    }
}

/// A variable as Baton reads it from `get`: trimmed, and unset when blank.
pub fn var(get: &impl Fn(&str) -> Option<String>, k: &str) -> Option<String> {
    get(k)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A whole-number variable of at least `min`, `default` when unset; set but not such a
/// number, an error naming it.
pub fn number(
    get: &impl Fn(&str) -> Option<String>,
    k: &'static str,
    default: u32,
    min: u32,
) -> Result<u32, ConfigError> {
    match var(get, k) {
        None => Ok(default),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| *n >= min)
            .ok_or(ConfigError::Invalid {
                var: k,
                value: v,
                expected: if min == 0 {
                    "a whole number"
                } else {
                    "a whole number of at least 1"
                },
            }),
    }
}

impl Config {
    /// The agents file: `BATON_AGENTS_FILE`, else `BATON_AGENTS_JSON`, else none.
    pub fn agents(
        &self,
    ) -> Result<Option<crate::agents_file::AgentsFile>, crate::agents_file::FileError> {
        if let Some(path) = &self.agents_file {
            return crate::agents_file::AgentsFile::load(path).map(Some);
        }
        self.agents_json
            .as_deref()
            .map(|text| crate::agents_file::AgentsFile::parse(text, "BATON_AGENTS_JSON"))
            .transpose()
    }

    /// Reads the process environment. Call once, in `main`.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Parses configuration from `get` (a variable's value, if set). Empty values count as
    /// unset. A value that is set but invalid is an error even where a default exists.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let var = |k: &str| var(&get, k);
        let number = |k: &'static str, default: u32, min: u32| number(&get, k, default, min);
        let base_url = var("OPENAI_BASE_URL").unwrap_or_else(|| "https://api.openai.com/v1".into());
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(ConfigError::Invalid {
                var: "OPENAI_BASE_URL",
                value: base_url,
                expected: "an http:// or https:// URL",
            });
        }
        let anthropic_base_url =
            var("ANTHROPIC_BASE_URL").unwrap_or_else(|| "https://api.anthropic.com".into());
        if !(anthropic_base_url.starts_with("http://")
            || anthropic_base_url.starts_with("https://"))
        {
            return Err(ConfigError::Invalid {
                var: "ANTHROPIC_BASE_URL",
                value: anthropic_base_url,
                expected: "an http:// or https:// URL",
            });
        }
        let model = ModelConfig {
            base_url,
            api_key: var("OPENAI_API_KEY"),
            secret_arn: var("BATON_LLM_SECRET_ARN"),
            model: var("BATON_MODEL").unwrap_or_else(|| "gpt-4o-mini".into()),
            max_retries: number("BATON_LLM_MAX_RETRIES", 4, 0)?,
            timeout_secs: number("BATON_LLM_TIMEOUT_SECONDS", 120, 1)?,
            anthropic_base_url,
            anthropic_api_key: var("ANTHROPIC_API_KEY"),
            max_output_tokens: number("BATON_MAX_OUTPUT_TOKENS", 4096, 1)?,
        };
        let link_key = var("BATON_LINK_KEY");
        if let Some(k) = &link_key
            && k.len() < crate::links::MIN_KEY_BYTES
        {
            return Err(ConfigError::Invalid {
                var: "BATON_LINK_KEY",
                value: "(hidden)".into(),
                expected: "at least 32 characters",
            });
        }
        let public_url = var("BATON_PUBLIC_URL").map(|u| u.trim_end_matches('/').to_owned());
        if let Some(u) = &public_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return Err(ConfigError::Invalid {
                var: "BATON_PUBLIC_URL",
                value: u.clone(),
                expected: "an http:// or https:// URL",
            });
        }
        let smtp_url = var("BATON_SMTP_URL");
        if let Some(u) = &smtp_url
            && !(u.starts_with("smtp://") || u.starts_with("smtps://"))
        {
            return Err(ConfigError::Invalid {
                var: "BATON_SMTP_URL",
                // It may hold a password.
                value: "(hidden)".into(),
                expected: "an smtp:// or smtps:// URL",
            });
        }
        let metrics_namespace = var("BATON_METRICS_NAMESPACE").unwrap_or_else(|| "Baton".into());
        if !valid_namespace(&metrics_namespace) {
            return Err(ConfigError::Invalid {
                var: "BATON_METRICS_NAMESPACE",
                value: metrics_namespace,
                expected: "a CloudWatch namespace: 1 to 255 of letters, digits and `. - _ / # : `, \
                           not starting with `AWS/`",
            });
        }
        Ok(Self {
            model,
            agents_file: var("BATON_AGENTS_FILE").map(PathBuf::from),
            agents_json: var("BATON_AGENTS_JSON"),
            agents_s3_uri: agents_s3_uri(var("BATON_AGENTS_S3_URI"))?,
            prefix: var("BATON_PREFIX").unwrap_or_else(|| "baton".into()),
            scheduler_role_arn: var("BATON_SCHEDULER_ROLE_ARN"),
            link_key,
            link_key_secret_arn: var("BATON_LINK_KEY_SECRET_ARN"),
            public_url,
            smtp_url,
            metrics_namespace,
            cache_mb: match var("BATON_CACHE_MB") {
                Some(_) => Some(u64::from(number("BATON_CACHE_MB", 64, 0)?)),
                None => None,
            },
            function_memory_mb: var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE").and_then(|m| m.parse().ok()),
            steps_at_once: match var("BATON_STEPS_AT_ONCE") {
                Some(v) => match v.parse::<u32>() {
                    Ok(n @ 1..=10) => Some(n),
                    _ => {
                        return Err(ConfigError::Invalid {
                            var: "BATON_STEPS_AT_ONCE",
                            value: v,
                            expected: "a whole number from 1 to 10",
                        });
                    }
                },
                None => None,
            },
            steps_in_a_row: match var("BATON_STEPS_IN_A_ROW") {
                Some(v) => match v.parse::<u32>() {
                    Ok(n @ 1..=100) => Some(n),
                    _ => {
                        return Err(ConfigError::Invalid {
                            var: "BATON_STEPS_IN_A_ROW",
                            value: v,
                            expected: "a whole number from 1 to 100",
                        });
                    }
                },
                None => None,
            },
            dev_function_timeout_s: match var("BATON_DEV_FUNCTION_TIMEOUT_S") {
                Some(_) => Some(number("BATON_DEV_FUNCTION_TIMEOUT_S", 900, 1)?),
                None => None,
            },
            max_active_runs_per_owner: Some(number("BATON_MAX_ACTIVE_RUNS_PER_OWNER", 0, 0)?)
                .filter(|n| *n > 0),
            max_daily_cost_usd_per_owner: match var("BATON_MAX_DAILY_COST_USD_PER_OWNER") {
                Some(v) => match v.parse::<f64>() {
                    Ok(0.0) => None,
                    Ok(usd) if crate::budget::check_amount("", usd).is_ok() => Some(usd),
                    _ => {
                        return Err(ConfigError::Invalid {
                            var: "BATON_MAX_DAILY_COST_USD_PER_OWNER",
                            value: v,
                            expected: "an amount of US dollars, 0 (no limit) or from 0.000001 to 1000000",
                        });
                    }
                },
                None => None,
            },
        })
    }

    /// The timeline cache's budget: `BATON_CACHE_MB` if set (0 keeps none), else a quarter
    /// of the memory the host is given ([`budget_for`]): a Lambda
    /// function's, else `host_memory_mb` (the machine's), else 64 MiB.
    pub fn cache_bytes(&self, host_memory_mb: Option<u64>) -> usize {
        match (self.cache_mb, self.function_memory_mb.or(host_memory_mb)) {
            (Some(mb), _) => usize::try_from(mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX),
            (None, Some(memory)) => budget_for(memory),
            (None, None) => DEFAULT_CACHE_BYTES,
        }
    }
}

/// CloudWatch's rule for a namespace (`PutMetricData`, and so EMF): 1 to 255 of
/// alphanumerics and `. - _ / # : ` and space, not `AWS/`, which is AWS's own.
fn valid_namespace(ns: &str) -> bool {
    (1..=255).contains(&ns.len())
        && !ns.starts_with("AWS/")
        && ns
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_/#: ".contains(c))
}

#[cfg(test)]
mod tests;

/// The timeline cache's default budget: a quarter of a 256 MB function.
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

const MIB: u64 = 1024 * 1024;

/// The budget for a host given `memory_mb` of memory: a quarter of it (the rest is the
/// host's own and its requests'), at least 16 MiB and at most 1 GiB. A Lambda function of
/// 256 MB keeps 64 MiB; a laptop of 16 GB, 1 GiB.
pub fn budget_for(memory_mb: u64) -> usize {
    let bytes = (memory_mb.saturating_mul(MIB) / 4).clamp(16 * MIB, 1024 * MIB);
    usize::try_from(bytes).unwrap_or(DEFAULT_CACHE_BYTES)
}
