//! `EventBridgeBus`: `PutEvents` on the Baton bus, source `baton`. A partially failed call
//! (FailedEntryCount > 0) is retried for the failed entries, not ignored.

use std::sync::Arc;

use aws_sdk_eventbridge::Client;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use tracing::instrument;

use crate::sdk::{Meter, is_retryable_code, map_sdk_err, retry_failed_entries};
use baton_core::error::PortError;
use baton_core::message::Event;
use baton_core::ports::Bus;

pub const SOURCE: &str = "baton";

pub struct EventBridgeBus {
    client: Client,
    bus_name: String,
    meter: Arc<Meter>,
}

impl EventBridgeBus {
    pub fn new(client: Client, bus_name: impl Into<String>, meter: Arc<Meter>) -> Self {
        Self {
            client,
            bus_name: bus_name.into(),
            meter,
        }
    }
}

#[async_trait::async_trait]
impl Bus for EventBridgeBus {
    #[instrument(skip_all, fields(n = events.len()))]
    async fn publish(&self, events: &[Event]) -> Result<(), PortError> {
        for chunk in events.chunks(10) {
            let mut pending: Vec<PutEventsRequestEntry> = Vec::with_capacity(chunk.len());
            for e in chunk {
                // The event id travels in the detail: consumers deduplicate on it.
                let mut detail = e.detail.clone();
                if let serde_json::Value::Object(d) = &mut detail {
                    d.insert("eventId".into(), serde_json::Value::String(e.id.clone()));
                }
                pending.push(
                    PutEventsRequestEntry::builder()
                        .event_bus_name(&self.bus_name)
                        .source(SOURCE)
                        .detail_type(&e.detail_type)
                        .detail(detail.to_string())
                        .time(aws_sdk_eventbridge::primitives::DateTime::from_millis(
                            e.time.timestamp_millis(),
                        ))
                        .build(),
                );
            }
            retry_failed_entries("PutEvents", pending, |entries| async move {
                Meter::count(&self.meter.eventbridge);
                let out = self
                    .client
                    .put_events()
                    .set_entries(Some(entries.clone()))
                    .send()
                    .await
                    .map_err(|e| map_sdk_err("PutEvents", e))?;
                // An entry refused for good (`AccessDeniedException`, `MalformedDetail`…)
                // will be refused again: say so rather than retry it.
                if let Some(r) = out.entries().iter().find(|r| {
                    r.error_code()
                        .is_some_and(|c| !is_retryable_code(c) && c != "InternalException")
                }) {
                    return Err(PortError::broken(
                        format!(
                            "PutEvents refused an event: {} {}",
                            r.error_code().unwrap_or_default(),
                            r.error_message().unwrap_or_default()
                        ),
                        "PutEvents entry refused",
                    ));
                }
                // Results are positional: keep the entries whose result has an error.
                Ok(entries
                    .into_iter()
                    .zip(out.entries())
                    .filter(|(_, r)| r.error_code().is_some())
                    .map(|(e, _)| e)
                    .collect())
            })
            .await?;
        }
        Ok(())
    }
}
