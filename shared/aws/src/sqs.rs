//! `SqsQueue`: step messages on SQS FIFO queues, one message group per run.
//!
//! A subagent run (id `sub_…`) goes to the subagent-steps queue, every other run to the
//! steps queue; a run's messages always go to the same queue, so FIFO order per run holds.
//! The deduplication id is derived from the message id, so an effect performed twice within
//! SQS's five-minute window is dropped by SQS (and after it, by the engine).

use std::sync::Arc;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use tracing::instrument;

use crate::sdk::{Meter, map_sdk_err, retry_failed_entries};
use baton_core::error::PortError;
use baton_core::message::StepMessage;
use baton_core::ports::Queue;

pub struct SqsQueue {
    client: Client,
    steps_url: String,
    subagent_url: String,
    meter: Arc<Meter>,
}

/// The queue a run's messages go to.
pub fn is_subagent(run_id: &str) -> bool {
    run_id.starts_with("sub_")
}

/// SQS allows 128 characters from a limited set: a hash of the message id fits always.
pub fn dedup_id(message_id: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, message_id.as_bytes())
        .simple()
        .to_string()
}

impl SqsQueue {
    pub fn new(
        client: Client,
        steps_url: impl Into<String>,
        subagent_url: impl Into<String>,
        meter: Arc<Meter>,
    ) -> Self {
        Self {
            client,
            steps_url: steps_url.into(),
            subagent_url: subagent_url.into(),
            meter,
        }
    }

    async fn send_batch(&self, url: &str, messages: &[&StepMessage]) -> Result<(), PortError> {
        let mut pending: Vec<SendMessageBatchRequestEntry> = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let body =
                serde_json::to_string(m).map_err(|e| PortError::broken("encode message", e))?;
            pending.push(
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body)
                    .message_group_id(&m.run_id)
                    .message_deduplication_id(dedup_id(&m.id))
                    .build()
                    .map_err(|e| PortError::broken("build SQS entry", e))?,
            );
        }
        retry_failed_entries("SendMessageBatch", pending, |entries| async move {
            Meter::count(&self.meter.sqs);
            let out = self
                .client
                .send_message_batch()
                .queue_url(url)
                .set_entries(Some(entries.clone()))
                .send()
                .await
                .map_err(|e| map_sdk_err("SendMessageBatch", e))?;
            if let Some(f) = out.failed().iter().find(|f| f.sender_fault()) {
                return Err(PortError::Broken {
                    message: format!(
                        "SQS refused a message: {} {}",
                        f.code(),
                        f.message().unwrap_or_default()
                    ),
                    source: None,
                });
            }
            let failed: Vec<&str> = out.failed().iter().map(|f| f.id()).collect();
            Ok(entries
                .into_iter()
                .filter(|e| failed.contains(&e.id()))
                .collect())
        })
        .await
    }
}

#[async_trait::async_trait]
impl Queue for SqsQueue {
    #[instrument(skip_all, fields(n = messages.len()))]
    async fn send(&self, messages: &[StepMessage]) -> Result<(), PortError> {
        // Keep the caller's order within each queue (the run's own continuation goes last).
        let (sub, steps): (Vec<&StepMessage>, Vec<&StepMessage>) =
            messages.iter().partition(|m| is_subagent(&m.run_id));
        for (url, list) in [(&self.subagent_url, sub), (&self.steps_url, steps)] {
            for chunk in list.chunks(10) {
                self.send_batch(url, chunk).await?;
            }
        }
        Ok(())
    }
}
