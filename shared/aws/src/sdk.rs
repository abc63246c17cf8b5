//! What the AWS adapters share: one SDK config for every client, error mapping (retryable vs
//! terminal), and a meter that counts requests and DynamoDB capacity units (for the cost
//! benchmark). Resource names come from the core's `Config`; nothing here reads the
//! environment.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

use crate::settings::SdkEnv;
use baton_core::error::PortError;

/// Loads the one SDK config every client is built from. `AWS_ENDPOINT_URL` (honoured by the
/// SDK itself) points every client at LocalStack or moto; then, unless set, credentials and
/// region default to an emulator's (`test`, `us-east-1`), so nothing falls back to instance
/// metadata. Without it, the SDK's standard chain applies (the function's role on Lambda).
/// On Lambda, each call's user agent names the function (`app/<name>`; CloudTrail shows it).
pub async fn sdk_config(env: &SdkEnv) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(app) = env
        .function_name
        .as_ref()
        .and_then(|n| aws_config::AppName::new(n.clone()).ok())
    {
        loader = loader.app_name(app);
    }
    if env.endpoint.is_some() {
        if !env.credentials_set {
            loader = loader.credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                "test", "test", None, None, "emulator",
            ));
        }
        if !env.region_set {
            loader = loader.region(aws_config::Region::new("us-east-1"));
        }
    }
    loader.load().await
}

/// Keys a process is given in its environment, as Lambda gives a function its role's
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).
pub struct StaticKeys {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

/// The SDK config of a Lambda function, built from what Lambda puts in its environment,
/// without the SDK's provider chain (profiles, SSO, web identity, container and instance
/// metadata): on Lambda the chain's first link, the environment, always answers, and the
/// rest is code and start-up the functions do not need (`aws-config`'s loader and the STS
/// client it links). `keys` are the function's role's (Lambda sets them for the life of the
/// execution environment); `region` is `AWS_REGION`. With an emulator endpoint, missing keys
/// and region default as in [`sdk_config`]. Retries (standard, 3 attempts), timeouts and
/// the HTTPS client are the SDK clients' own defaults, the same the loader gives.
pub fn lambda_sdk_config(
    env: &SdkEnv,
    keys: Option<StaticKeys>,
    region: Option<String>,
) -> Result<aws_config::SdkConfig, String> {
    use aws_sdk_dynamodb::config::{Credentials, SharedCredentialsProvider};
    let emulator = env.endpoint.is_some();
    let keys = match keys {
        Some(k) => k,
        None if emulator => StaticKeys {
            access_key_id: "test".into(),
            secret_access_key: "test".into(),
            session_token: None,
        },
        None => {
            return Err("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set: Lambda sets                         them from the function's role (outside Lambda, set them, or                         AWS_ENDPOINT_URL for an emulator)"
                .into());
        }
    };
    let region = match region {
        Some(r) => r,
        None if emulator => "us-east-1".into(),
        None => return Err("AWS_REGION is not set (Lambda sets it)".into()),
    };
    let credentials = Credentials::new(
        keys.access_key_id,
        keys.secret_access_key,
        keys.session_token,
        None,
        "lambda-environment",
    );
    let mut config = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region))
        .credentials_provider(SharedCredentialsProvider::new(credentials));
    if let Some(endpoint) = &env.endpoint {
        config = config.endpoint_url(endpoint);
    }
    if let Some(app) = env
        .function_name
        .as_ref()
        .and_then(|n| aws_config::AppName::new(n.clone()).ok())
    {
        config = config.app_name(app);
    }
    Ok(config.build())
}

/// Requests and DynamoDB capacity units, counted by the adapters.
#[derive(Debug, Default)]
pub struct Meter {
    pub dynamodb: AtomicU64,
    pub sqs: AtomicU64,
    pub eventbridge: AtomicU64,
    pub scheduler: AtomicU64,
    /// Read request units, in halves (eventually consistent reads cost half a unit):
    /// estimated from item sizes by DynamoDB's rules.
    pub read_half_units: AtomicU64,
    pub write_units: AtomicU64,
    /// What DynamoDB's answers say they consumed (`ReturnConsumedCapacity=TOTAL`, indexes
    /// included), in thousandths of a unit.
    pub consumed_read_milli: AtomicU64,
    pub consumed_write_milli: AtomicU64,
    /// The share of [`Meter::consumed_write_milli`] that `TransactWriteItems` answers named.
    pub consumed_transact_write_milli: AtomicU64,
}

/// A snapshot of a [`Meter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Usage {
    pub dynamodb_requests: u64,
    pub sqs_requests: u64,
    pub eventbridge_requests: u64,
    pub scheduler_requests: u64,
    pub read_units: f64,
    pub write_units: u64,
    /// As DynamoDB reported them ([`Meter::consumed_read_milli`]).
    pub consumed_read_units: f64,
    pub consumed_write_units: f64,
    /// Of those, the units transactions' answers named.
    pub consumed_transact_write_units: f64,
}

impl Meter {
    pub fn shared() -> Arc<Self> {
        Arc::new(Self::default())
    }
    pub fn snapshot(&self) -> Usage {
        Usage {
            dynamodb_requests: self.dynamodb.load(Ordering::Relaxed),
            sqs_requests: self.sqs.load(Ordering::Relaxed),
            eventbridge_requests: self.eventbridge.load(Ordering::Relaxed),
            scheduler_requests: self.scheduler.load(Ordering::Relaxed),
            read_units: self.read_half_units.load(Ordering::Relaxed) as f64 / 2.0,
            write_units: self.write_units.load(Ordering::Relaxed),
            consumed_read_units: self.consumed_read_milli.load(Ordering::Relaxed) as f64 / 1e3,
            consumed_write_units: self.consumed_write_milli.load(Ordering::Relaxed) as f64 / 1e3,
            consumed_transact_write_units: self
                .consumed_transact_write_milli
                .load(Ordering::Relaxed) as f64
                / 1e3,
        }
    }
    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Error codes that mean "try again later": throttling, conflicts of the moment and server
/// faults, as the services name them (DynamoDB, SQS, EventBridge, Scheduler, S3, Secrets
/// Manager).
const RETRYABLE: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "ThrottledException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "TransactionConflictException",
    "TransactionInProgressException",
    "InternalServerError",
    "InternalServerException",
    "InternalFailure",
    "InternalError",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "RequestThrottled",
    "TooManyRequestsException",
    "SlowDown",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// Whether an error code, of a call or of one entry of a batch call, means "try again later".
pub fn is_retryable_code(code: &str) -> bool {
    RETRYABLE.contains(&code)
}

/// The reasons a cancelled DynamoDB transaction gives per item that mean "try again later":
/// throttling, a conflict of the moment, and any reason DynamoDB does not document as final
/// (`None`, `ConditionalCheckFailed`, `ValidationError` and the size limit are; an emulator
/// under load has cancelled with the name of its own internal error, which a second try
/// got past: a step tried again is bounded, a run failed at once is not undone).
pub fn is_retryable_cancellation(code: &str) -> bool {
    !matches!(
        code,
        "None" | "ConditionalCheckFailed" | "ValidationError" | "ItemCollectionSizeLimitExceeded"
    )
}

/// Maps an SDK error: transport failures, timeouts, throttling and 5xx are retryable;
/// everything else is terminal. The source is kept.
pub fn map_sdk_err<E, R>(what: &str, e: SdkError<E, R>) -> PortError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let retryable = match &e {
        SdkError::ServiceError(se) => se.err().code().is_some_and(is_retryable_code),
        SdkError::ConstructionFailure(_) => false,
        _ => true,
    };
    let message = match e.code() {
        Some(code) => format!("{what}: {code}: {}", e.message().unwrap_or_default()),
        None => format!("{what}: {e}"),
    };
    if retryable {
        PortError::unavailable(message, e)
    } else {
        PortError::broken(message, e)
    }
}

/// How many times a batch call is made for the entries it left undone.
const ENTRY_ATTEMPTS: u32 = 4;

/// A batch call that may do part of its work (`SendMessageBatch`'s failed entries,
/// `PutEvents`' failed entries, `BatchWriteItem`'s unprocessed items): `send` is called with
/// the entries still to do and returns those it left undone; they are sent again after a
/// backoff (100, 200, 400 ms), at most `ENTRY_ATTEMPTS` calls in all. An error of `send`
/// (a refused entry, a failed call) ends it.
pub async fn retry_failed_entries<T, F, Fut>(
    what: &str,
    mut pending: Vec<T>,
    mut send: F,
) -> Result<(), PortError>
where
    F: FnMut(Vec<T>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, PortError>>,
{
    for attempt in 0..ENTRY_ATTEMPTS {
        if pending.is_empty() {
            return Ok(());
        }
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50 << attempt)).await;
        }
        pending = send(pending).await?;
    }
    match pending.len() {
        0 => Ok(()),
        n => Err(PortError::Unavailable {
            message: format!("{what} left {n} entries undone {ENTRY_ATTEMPTS} times"),
            source: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::is_retryable_cancellation;

    #[test]
    fn a_transaction_is_tried_again_unless_a_reason_is_final() {
        for final_reason in [
            "None",
            "ConditionalCheckFailed",
            "ValidationError",
            "ItemCollectionSizeLimitExceeded",
        ] {
            assert!(!is_retryable_cancellation(final_reason), "{final_reason}");
        }
        for passing in ["TransactionConflict", "ThrottlingError", "RuntimeError"] {
            assert!(is_retryable_cancellation(passing), "{passing}");
        }
    }
}
