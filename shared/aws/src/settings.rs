//! What a deployment on AWS reads from the environment, beside the core's `Config`: the
//! SDK's endpoint and credentials' presence, the deployment's resources (as `template.yaml`
//! passes them to every function) and the live channel (an AppSync Events API). Read once at
//! start-up, the core's way (`baton_core::config::{var, number}`): blank is unset, and a
//! value set but invalid is an error naming it.

use baton_core::config::{ConfigError, number, var};

/// The sweep indexes' partitions unless told (`BATON_SWEEP_SHARDS`, the template's
/// `SweepShards`): a few, so that no one partition takes every run.
pub const SWEEP_SHARDS: u32 = 4;
/// The most sweep shards a table may have.
pub const MAX_SWEEP_SHARDS: u32 = 64;

/// How the AWS SDK is pointed: `AWS_ENDPOINT_URL` (an emulator such as LocalStack or moto)
/// and whether credentials and a region are set, so an emulator gets defaults instead of an
/// instance-metadata lookup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SdkEnv {
    pub endpoint: Option<String>,
    pub credentials_set: bool,
    pub region_set: bool,
    /// `AWS_LAMBDA_FUNCTION_NAME`: said in every AWS call's user agent (`app/<name>`), so
    /// CloudTrail shows which function made it.
    pub function_name: Option<String>,
}

/// The AWS resources a deployment uses, as `template.yaml` passes them to every function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsConfig {
    pub table: String,
    pub steps_queue_url: String,
    pub subagent_queue_url: String,
    pub bus_name: String,
    pub bus_arn: String,
    pub schedule_group: String,
    pub scheduler_role_arn: String,
    /// `BATON_BUCKET`: where the files tools return are kept.
    pub bucket: String,
    /// How long finished runs and resolved CTAs are kept (DynamoDB TTL).
    pub retention_days: u32,
    /// `BATON_SWEEP_SHARDS`: how many partitions the sweep indexes are written over.
    pub sweep_shards: u32,
    /// The dead-letter queue the consuming function also reads (step functions only):
    /// records from it end their run as failed.
    pub dead_letter_queue_arn: Option<String>,
    /// `BATON_TIMERS_DLQ_ARN`: where Scheduler sends a timer's event it could not deliver
    /// (template.yaml's `TimersDeadLetterQueue`, alarmed).
    pub timers_dead_letter_arn: Option<String>,
}

impl AwsConfig {
    /// The step functions' dead-letter queue, which they must know to tell its records apart.
    pub fn dead_letter_queue_arn(&self) -> Result<&str, ConfigError> {
        self.dead_letter_queue_arn
            .as_deref()
            .ok_or(ConfigError::Missing {
                var: "BATON_DEAD_LETTER_QUEUE_ARN",
                hint: "the step functions' dead-letter queue, see template.yaml",
            })
    }
}

/// Where the live channel is: `BATON_LIVE_HTTP_DOMAIN` and `BATON_LIVE_REALTIME_DOMAIN` (the
/// template's `LiveApi.Dns.Http` and `.Dns.Realtime`). A domain alone means `https://` and
/// `wss://`; a value with a scheme is taken as the base URL (a local stand-in's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveConfig {
    /// Where events are published: `<base>/event`.
    pub publish_url: String,
    /// Where watchers connect: `<base>/event/realtime`.
    pub realtime_url: String,
    /// The HTTP domain (with its port, if any): the `host` a watcher's authorization names.
    pub http_host: String,
}

impl LiveConfig {
    fn parse(http: &str, realtime: &str) -> Self {
        let base = |v: &str, scheme: &str| {
            let v = v.trim_end_matches('/');
            if v.contains("://") {
                v.to_owned()
            } else {
                format!("{scheme}://{v}")
            }
        };
        let http_base = base(http, "https");
        let http_host = http_base
            .split_once("://")
            .map_or(http_base.as_str(), |(_, rest)| rest)
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        Self {
            publish_url: format!("{http_base}/event"),
            realtime_url: format!("{}/event/realtime", base(realtime, "wss")),
            http_host,
        }
    }
}

const AWS_HINT: &str = "template.yaml sets it on every function";

/// Everything an AWS host reads from the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct AwsSettings {
    pub sdk: SdkEnv,
    /// The live channel on AWS (an AppSync Events API), when its domains are set.
    pub live: Option<LiveConfig>,
    /// `BATON_RETENTION_DAYS`: how long finished runs and resolved CTAs are kept.
    pub retention_days: u32,
    deployment: Result<AwsConfig, ConfigError>,
}

impl AwsSettings {
    /// Reads the process environment. Call once, in `main`.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Parses the settings from `get` (a variable's value, if set). The deployment's
    /// resources may be missing (a host that provisions its own needs none of them): that
    /// is an error only when [`AwsSettings::aws`] is asked for them.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let var = |k: &str| var(&get, k);
        let retention_days = number(&get, "BATON_RETENTION_DAYS", 90, 1)?;
        let sweep_shards = number(&get, "BATON_SWEEP_SHARDS", SWEEP_SHARDS, 1)?;
        if sweep_shards > MAX_SWEEP_SHARDS {
            return Err(ConfigError::Invalid {
                var: "BATON_SWEEP_SHARDS",
                value: sweep_shards.to_string(),
                expected: "a whole number from 1 to 64",
            });
        }
        let required = |k: &'static str| {
            var(k).ok_or(ConfigError::Missing {
                var: k,
                hint: AWS_HINT,
            })
        };
        let deployment = (|| {
            Ok(AwsConfig {
                table: required("BATON_TABLE")?,
                steps_queue_url: required("BATON_STEPS_QUEUE_URL")?,
                subagent_queue_url: required("BATON_SUBAGENT_QUEUE_URL")?,
                bus_name: required("BATON_BUS_NAME")?,
                bus_arn: required("BATON_BUS_ARN")?,
                schedule_group: required("BATON_SCHEDULE_GROUP")?,
                scheduler_role_arn: required("BATON_SCHEDULER_ROLE_ARN")?,
                bucket: required("BATON_BUCKET")?,
                retention_days,
                sweep_shards,
                dead_letter_queue_arn: var("BATON_DEAD_LETTER_QUEUE_ARN"),
                timers_dead_letter_arn: var("BATON_TIMERS_DLQ_ARN"),
            })
        })();
        let live = match (
            var("BATON_LIVE_HTTP_DOMAIN"),
            var("BATON_LIVE_REALTIME_DOMAIN"),
        ) {
            (Some(http), Some(realtime)) => Some(LiveConfig::parse(&http, &realtime)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Missing {
                    var: "BATON_LIVE_REALTIME_DOMAIN",
                    hint: "BATON_LIVE_HTTP_DOMAIN is set: the live channel needs both",
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::Missing {
                    var: "BATON_LIVE_HTTP_DOMAIN",
                    hint: "BATON_LIVE_REALTIME_DOMAIN is set: the live channel needs both",
                });
            }
        };
        Ok(Self {
            sdk: SdkEnv {
                endpoint: var("AWS_ENDPOINT_URL"),
                credentials_set: var("AWS_ACCESS_KEY_ID").is_some() || var("AWS_PROFILE").is_some(),
                region_set: var("AWS_REGION").is_some() || var("AWS_DEFAULT_REGION").is_some(),
                function_name: var("AWS_LAMBDA_FUNCTION_NAME"),
            },
            live,
            retention_days,
            deployment,
        })
    }

    /// The deployment's AWS resources; an error names the first missing variable. Required
    /// by the Lambda functions, unused by `baton dev --aws` (which provisions its own).
    pub fn aws(&self) -> Result<&AwsConfig, ConfigError> {
        self.deployment.as_ref().map_err(Clone::clone)
    }
}

#[cfg(test)]
mod tests;
