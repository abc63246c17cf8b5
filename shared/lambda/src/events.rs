//! The `events` function: answers, expiries, plan timers and the sweep's tick, from the inbox
//! queue and the sweep's.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use baton_core::service::{Service, ServiceError};
use futures_util::{StreamExt, stream};
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;
use tracing::{Instrument, error, info_span, warn};

use crate::{Startup, failure};

/// The `events` function: answers, expiries and timers from the inbox queue and the sweep's
/// ticks from its own, until Lambda stops it.
pub async fn run_events(startup: Startup) -> Result<(), lambda_runtime::Error> {
    let service = startup.request_service().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let service = service.clone();
        async move { Ok::<_, lambda_runtime::Error>(handle_events(&service, event.payload).await) }
    }))
    .await
}

/// How old a parking outbox must be before the sweep performs it: older than any step that
/// may still be performing it (a step's effects take milliseconds; its retries, minutes).
pub const SWEEP_AFTER: chrono::Duration = chrono::Duration::minutes(5);

/// The `events` function: the inbox queue's events — `cta.response` and `cta.expired` from the
/// bus, plan steps' `timer.fired`, the sweep's tick — each handed to
/// [`Steps::inbox_event`](baton_core::service::Steps::inbox_event). An invalid or late one is refused (and published as
/// `cta.rejected`) and dropped, never blocking the queue; backend errors are retried.
///
/// The records of a batch are handled at once: the queue is a standard one, which keeps no
/// order, and a sweep tick (which may take its whole budget) must not hold back the answers
/// delivered beside it.
pub async fn handle_events(service: &Service, event: SqsEvent) -> SqsBatchResponse {
    let mut resp = SqsBatchResponse::default();
    resp.batch_item_failures = stream::iter(event.records)
        .map(|rec| handle_record(service, rec))
        .buffer_unordered(INBOX_AT_ONCE)
        .filter_map(std::future::ready)
        .collect()
        .await;
    resp
}

/// The most records of a batch handled at once: the mapping's `BatchSize`.
const INBOX_AT_ONCE: usize = 10;

/// One inbox record: the failure to report if it is to be retried.
async fn handle_record(service: &Service, rec: SqsMessage) -> Option<BatchItemFailure> {
    let id = rec.message_id.clone().unwrap_or_default();
    let envelope: Value = match rec.body.as_deref().map(serde_json::from_str) {
        Some(Ok(v)) => v,
        _ => {
            error!(message_id = %id, "undecodable inbox message dropped");
            return None;
        }
    };
    let detail_type = envelope["detail-type"].as_str().unwrap_or_default();
    let detail = &envelope["detail"];
    let span = info_span!("event", message_id = %id, cta_id = %detail["ctaId"].as_str().unwrap_or_default(), detail_type = %detail_type);
    let outcome = service
        .steps()
        .inbox_event(&id, detail_type, detail, SWEEP_AFTER)
        .instrument(span)
        .await;
    match outcome {
        Err(ServiceError::Port(e)) if e.is_retryable() => {
            warn!(message_id = %id, error = %e, "inbox message will be retried");
            Some(failure(id))
        }
        // Refused (and published as `cta.rejected`), or done.
        _ => None,
    }
}
