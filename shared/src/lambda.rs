//! What the Lambda functions share: building the service over AWS once per container, the
//! SQS batch handlers, and the caller's identity from API Gateway's JWT authorizer.
//!
//! The `queue pump` of `baton dev --aws` calls these same handlers in-process with real
//! `SqsEvent`s, so the local flow over an emulator runs exactly the code Lambda runs.

use std::collections::HashSet;
use std::sync::Arc;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use serde_json::Value;
use tracing::{Instrument, error, info_span, warn};

use crate::adapters::aws::{AwsConfig, Meter};
use crate::adapters::dynamo::DynamoStore;
use crate::adapters::eventbridge::EventBridgeBus;
use crate::adapters::scheduler::SchedulerTimers;
use crate::adapters::sqs::SqsQueue;
use crate::agent::Catalog;
use crate::api::{ApiError, Authenticator, Caller};
use crate::cta::CtaResponse;
use crate::engine::{Event, StepMessage};
use crate::llm::Llm;
use crate::ports::{Clock, SystemClock};
use crate::service::{Deps, Service, ServiceError};

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
        scheduler: Arc::new(SchedulerTimers::new(
            aws_sdk_scheduler::Client::new(sdk),
            &cfg.schedule_group,
            &cfg.bus_arn,
            &cfg.scheduler_role_arn,
            meter,
        )),
        llm,
        clock,
    };
    Arc::new(Service::new(deps, catalog))
}

/// What a function needs to start.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(transparent)]
    Config(#[from] crate::adapters::aws::MissingVar),
    #[error("cannot read the model API key from Secrets Manager ({arn}): {message}")]
    Secret { arn: String, message: String },
    #[error(transparent)]
    Llm(#[from] crate::llm::LlmError),
    #[error(transparent)]
    Catalog(#[from] crate::agent::CatalogError),
}

/// The service a Lambda function runs, built once per container: config from the
/// environment, the model key from Secrets Manager (`BATON_LLM_SECRET_ARN`), the agents
/// from `BATON_AGENTS_FILE` if set.
pub async fn service_from_env() -> Result<Arc<Service>, InitError> {
    let cfg = AwsConfig::from_env()?;
    let sdk = crate::adapters::aws::sdk_config().await;
    let mut llm_cfg = crate::llm::openai::OpenAiConfig::from_env();
    if let Ok(arn) = std::env::var("BATON_LLM_SECRET_ARN")
        && !arn.is_empty()
    {
        let secret = aws_sdk_secretsmanager::Client::new(&sdk)
            .get_secret_value()
            .secret_id(&arn)
            .send()
            .await
            .map_err(|e| InitError::Secret {
                arn: arn.clone(),
                message: e.to_string(),
            })?;
        llm_cfg.api_key = secret.secret_string().map(|s| s.trim().to_owned());
    }
    let llm = Arc::new(crate::llm::openai::OpenAiLlm::new(llm_cfg)?);
    let file = match std::env::var("BATON_AGENTS_FILE") {
        Ok(p) if !p.is_empty() => Some(crate::agent::AgentsFile::load(std::path::Path::new(&p))?),
        _ => None,
    };
    let catalog = Arc::new(Catalog::new(crate::agent::Limits::default(), vec![], file)?);
    Ok(aws_service(
        &cfg,
        &sdk,
        llm,
        catalog,
        Arc::new(SystemClock),
        Meter::shared(),
    ))
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

/// The `orchestrator` and `subagent` functions: one step per message, in order.
///
/// With SQS FIFO and `ReportBatchItemFailures`, once a message of a group fails, every later
/// message of that group in the batch is reported failed too, or SQS would deliver them out
/// of order. Records from a dead-letter queue end their run as failed.
pub async fn handle_steps(service: &Service, event: SqsEvent) -> SqsBatchResponse {
    let mut failed_groups: HashSet<String> = HashSet::new();
    let mut resp = SqsBatchResponse::default();
    for rec in event.records {
        let id = rec.message_id.clone().unwrap_or_default();
        let group = rec
            .attributes
            .get("MessageGroupId")
            .cloned()
            .unwrap_or_default();
        if failed_groups.contains(&group) {
            resp.batch_item_failures.push(failure(id));
            continue;
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
            .as_deref()
            .is_some_and(|a| a.contains("-dlq"));
        let span = info_span!("step", message_id = %id, run_id = %msg.run_id, dead);
        let result = async {
            if dead {
                service
                    .dead_letter(&msg, "its retries were exhausted")
                    .await
            } else {
                service.handle(&msg).await
            }
        }
        .instrument(span)
        .await;
        if let Err(e) = result {
            warn!(message_id = %id, run_id = %msg.run_id, error = %e, "step failed; SQS will redeliver");
            failed_groups.insert(group);
            resp.batch_item_failures.push(failure(id));
        }
    }
    resp
}

/// The `cta` function: `cta.response` and `cta.expired` events from the bus, via the inbox
/// queue. A response is validated and accepted with the CTA's conditional write (the first
/// valid answer wins); an invalid or late one is logged, published as `cta.rejected`, and
/// dropped, never blocking the queue. Backend errors are retried.
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
        let detail_type = envelope["detail-type"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let detail = envelope["detail"].clone();
        let cta_id = detail["ctaId"].as_str().unwrap_or_default().to_owned();
        let span =
            info_span!("cta", message_id = %id, cta_id = %cta_id, detail_type = %detail_type);
        let outcome: Result<(), ServiceError> = async {
            match detail_type.as_str() {
                "cta.response" => {
                    let mut fields = detail.clone();
                    if let Value::Object(m) = &mut fields {
                        m.remove("ctaId");
                        m.remove("eventId");
                    }
                    let response: CtaResponse = serde_json::from_value(fields)
                        .map_err(|e| ServiceError::Invalid(format!("invalid CTA response: {e}")))?;
                    service
                        .answer_cta(None, &cta_id, response)
                        .await
                        .map(|_| ())
                }
                "cta.expired" => Ok(service.expire_cta(&cta_id).await?),
                other => Err(ServiceError::Invalid(format!("unexpected event `{other}`"))),
            }
        }
        .instrument(span)
        .await;
        match outcome {
            Ok(()) => {}
            Err(ServiceError::Port(e)) if e.is_retryable() => {
                warn!(message_id = %id, error = %e, "inbox message will be retried");
                resp.batch_item_failures.push(failure(id));
            }
            Err(e) => {
                warn!(message_id = %id, cta_id = %cta_id, error = %e, "CTA event rejected");
                let event = Event {
                    id: format!("{id}:rejected"),
                    detail_type: "cta.rejected".into(),
                    detail: serde_json::json!({"ctaId": cta_id, "eventType": detail_type, "reason": e.to_string()}),
                    time: chrono::Utc::now(),
                };
                if let Err(e) = service.deps().bus.publish(&[event]).await {
                    warn!(error = %e, "publishing cta.rejected failed");
                }
            }
        }
    }
    resp
}

/// The caller is the JWT's subject, as API Gateway's JWT authorizer verified it.
pub struct ApiGatewayJwt;

impl Authenticator for ApiGatewayJwt {
    fn authenticate(
        &self,
        _: &axum::http::HeaderMap,
        ext: &axum::http::Extensions,
    ) -> Result<Caller, ApiError> {
        use lambda_http::request::RequestContext;
        let claims = match ext.get::<RequestContext>() {
            Some(RequestContext::ApiGatewayV2(ctx)) => ctx
                .authorizer
                .as_ref()
                .and_then(|a| a.jwt.as_ref())
                .map(|j| &j.claims),
            _ => None,
        };
        let sub = claims.and_then(|c| c.get("sub")).filter(|s| !s.is_empty());
        match (sub, claims.and_then(|c| c.get("iss"))) {
            (Some(sub), Some(iss)) => Ok(Caller(format!("{iss}#{sub}"))),
            (Some(sub), None) => Ok(Caller(sub.clone())),
            _ => Err(ApiError::unauthorized(
                "no verified identity on the request",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lambda_events::event::apigw::{
        ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerJwtDescription,
        ApiGatewayV2httpRequestContext,
    };
    use lambda_http::request::RequestContext;

    fn ext(claims: &[(&str, &str)]) -> axum::http::Extensions {
        let mut jwt = ApiGatewayRequestAuthorizerJwtDescription::default();
        jwt.claims = claims
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut auth = ApiGatewayRequestAuthorizer::default();
        auth.jwt = Some(jwt);
        let mut ctx = ApiGatewayV2httpRequestContext::default();
        ctx.authorizer = Some(auth);
        let mut e = axum::http::Extensions::new();
        e.insert(RequestContext::ApiGatewayV2(ctx));
        e
    }

    #[test]
    fn the_caller_is_the_verified_jwt_subject() {
        let h = axum::http::HeaderMap::new();
        let a = ApiGatewayJwt;
        let c = a
            .authenticate(&h, &ext(&[("sub", "u1"), ("iss", "https://idp")]))
            .expect("identified");
        assert_eq!(c.0, "https://idp#u1");
        assert!(
            a.authenticate(&h, &ext(&[("iss", "https://idp")])).is_err(),
            "no subject"
        );
        assert!(
            a.authenticate(&h, &axum::http::Extensions::new()).is_err(),
            "no authorizer"
        );
        // A bearer header alone proves nothing here: API Gateway verifies tokens.
        let mut forged = axum::http::HeaderMap::new();
        forged.insert("authorization", "Bearer x".parse().expect("header"));
        assert!(
            a.authenticate(&forged, &axum::http::Extensions::new())
                .is_err()
        );
    }
}
