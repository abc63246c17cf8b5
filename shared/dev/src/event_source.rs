//! Event source mappings, in-process: stands in for Lambda's SQS event source mappings when
//! the functions run inside one process (`baton dev --aws`, the tests over an emulator). It
//! polls each queue, hands the handler a real `SqsEvent` (the JSON Lambda would send),
//! deletes what succeeded and leaves failures to the visibility timeout. It can deliver
//! every message twice, to prove that duplicates change nothing.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use serde_json::json;
use tokio::sync::watch;
use tracing::{error, warn};

use baton_core::error::PortError;
use baton_core::service::Service;

use baton_aws::sdk::map_sdk_err;
use baton_lambda::{handle_cta_inbox, handle_steps_until, release};

/// Records to make visible again, each after its delay.
type Later = Vec<(aws_lambda_events::event::sqs::SqsMessage, Duration)>;

/// Which handler a queue feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feeds {
    /// `orchestrator` / `subagent`.
    Steps,
    /// `orchestrator` / `subagent`, reading their dead-letter queues.
    DeadLetters,
    /// `cta`.
    CtaInbox,
}

#[derive(Debug, Clone)]
pub struct EventSource {
    pub url: String,
    pub arn: String,
    pub feeds: Feeds,
    /// The queue's visibility timeout, when known: a failed record is never held longer
    /// than the queue itself would hold it (an emulator's queues may have short ones).
    pub visibility: Option<Duration>,
}

#[derive(Clone)]
pub struct EventSources {
    /// Each queue with the function it feeds: that function's SQS client (Lambda's event
    /// source mapping reads with the function's role) and its service.
    queues: Vec<(EventSource, Consumer)>,
    /// The ARNs of the queues that feed [`Feeds::DeadLetters`].
    dead_letters: Vec<String>,
    duplicate: bool,
    /// How long a receive waits for a message (SQS long polling): 0, then a short sleep
    /// when every queue is empty, for one poller over several queues; more for a poller of
    /// one queue among many ([`EventSources::pollers_of`]).
    wait_seconds: i32,
}

/// The function a queue feeds.
#[derive(Clone)]
pub struct Consumer {
    pub sqs: aws_sdk_sqs::Client,
    pub service: Arc<Service>,
}

impl EventSources {
    /// Every queue feeding one function.
    pub fn new(sqs: aws_sdk_sqs::Client, service: Arc<Service>, queues: Vec<EventSource>) -> Self {
        let consumer = Consumer { sqs, service };
        Self::each(queues.into_iter().map(|q| (q, consumer.clone())).collect())
    }

    /// Each queue feeding its own function.
    pub fn each(queues: Vec<(EventSource, Consumer)>) -> Self {
        let dead_letters = queues
            .iter()
            .filter(|(q, _)| q.feeds == Feeds::DeadLetters)
            .map(|(q, _)| q.arn.clone())
            .collect();
        Self {
            queues,
            dead_letters,
            duplicate: false,
            wait_seconds: 0,
        }
    }

    /// `n` pollers of each step queue (not the dead-letter queues nor the CTA inbox), each
    /// long-polling its one queue, as Lambda's event source mapping scales out its pollers
    /// when many message groups wait.
    pub fn pollers_of_steps(&self, n: usize) -> Vec<Self> {
        let mut out = Vec::new();
        for q in self.queues.iter().filter(|(q, _)| q.feeds == Feeds::Steps) {
            for _ in 0..n {
                out.push(Self {
                    queues: vec![q.clone()],
                    dead_letters: self.dead_letters.clone(),
                    duplicate: self.duplicate,
                    wait_seconds: 1,
                });
            }
        }
        out
    }

    /// Deliver every batch twice.
    pub fn duplicating(mut self, on: bool) -> Self {
        self.duplicate = on;
        self
    }

    /// The queue's ARN (for the `eventSourceARN` Lambda reports).
    pub async fn queue(
        sqs: &aws_sdk_sqs::Client,
        url: &str,
        feeds: Feeds,
    ) -> Result<EventSource, PortError> {
        use aws_sdk_sqs::types::QueueAttributeName as Q;
        let attrs = sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(Q::QueueArn)
            .attribute_names(Q::VisibilityTimeout)
            .send()
            .await
            .map_err(|e| map_sdk_err("GetQueueAttributes", e))?;
        let attr = |k: Q| attrs.attributes().and_then(|a| a.get(&k)).cloned();
        Ok(EventSource {
            url: url.into(),
            arn: attr(Q::QueueArn).unwrap_or_default(),
            feeds,
            visibility: attr(Q::VisibilityTimeout)
                .and_then(|v| v.parse().ok())
                .map(Duration::from_secs),
        })
    }

    /// One receive per queue; returns how many messages were handed to handlers.
    pub async fn pump_once(&self) -> Result<usize, PortError> {
        self.pump(None).await
    }

    /// One receive per queue. What failed is left to the visibility timeout, as Lambda
    /// does; once `stop` is set, it is released at once instead, so a graceful stop leaves
    /// no message in flight to hold up its run's group.
    async fn pump(&self, stop: Option<&watch::Receiver<bool>>) -> Result<usize, PortError> {
        let mut handled = 0;
        for (q, Consumer { sqs, service }) in &self.queues {
            let out = sqs
                .receive_message()
                .queue_url(&q.url)
                .max_number_of_messages(10)
                .wait_time_seconds(self.wait_seconds)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await
                .map_err(|e| map_sdk_err("ReceiveMessage", e))?;
            let messages = out.messages();
            if messages.is_empty() {
                continue;
            }
            handled += messages.len();
            let records: Vec<serde_json::Value> = messages
                .iter()
                .map(|m| {
                    let attributes: serde_json::Map<String, serde_json::Value> = m
                        .attributes()
                        .map(|a| {
                            a.iter()
                                .map(|(k, v)| (k.as_str().to_owned(), json!(v)))
                                .collect()
                        })
                        .unwrap_or_default();
                    json!({
                        "messageId": m.message_id(),
                        "receiptHandle": m.receipt_handle(),
                        "body": m.body(),
                        "attributes": attributes,
                        "messageAttributes": {},
                        "eventSource": "aws:sqs",
                        "eventSourceARN": q.arn,
                        "awsRegion": "us-east-1",
                    })
                })
                .collect();
            let event: SqsEvent = serde_json::from_value(json!({"Records": records}))
                .map_err(|e| PortError::broken("build SqsEvent", e))?;
            let (mut resp, mut later) = self.call(service, q.feeds, event.clone()).await;
            if self.duplicate {
                let (again, again_later) = self.call(service, q.feeds, event).await;
                resp.batch_item_failures.extend(again.batch_item_failures);
                later.extend(again_later);
            }
            let failed: Vec<&str> = resp
                .batch_item_failures
                .iter()
                .map(|f| f.item_identifier.as_str())
                .collect();
            let done: Vec<DeleteMessageBatchRequestEntry> = messages
                .iter()
                .filter(|m| !failed.contains(&m.message_id().unwrap_or_default()))
                .enumerate()
                .filter_map(|(i, m)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(m.receipt_handle().unwrap_or_default())
                        .build()
                        .ok()
                })
                .collect();
            let stopping = stop.is_some_and(|s| *s.borrow());
            if !failed.is_empty() && stopping {
                for m in messages
                    .iter()
                    .filter(|m| failed.contains(&m.message_id().unwrap_or_default()))
                {
                    let r = sqs
                        .change_message_visibility()
                        .queue_url(&q.url)
                        .receipt_handle(m.receipt_handle().unwrap_or_default())
                        .visibility_timeout(0)
                        .send()
                        .await;
                    if let Err(e) = r {
                        warn!(error = %map_sdk_err("ChangeMessageVisibility", e), "a message waits its visibility timeout");
                    }
                }
            } else if !later.is_empty() {
                // As the step functions do: each failed record due again after its backoff
                // (or the queue's own visibility timeout, if that is shorter).
                for (_, delay) in &mut later {
                    *delay = q.visibility.map_or(*delay, |v| (*delay).min(v));
                }
                release(sqs, &[q.url.as_str()], &later).await;
            }
            if !done.is_empty() {
                sqs.delete_message_batch()
                    .queue_url(&q.url)
                    .set_entries(Some(done))
                    .send()
                    .await
                    .map_err(|e| map_sdk_err("DeleteMessageBatch", e))?;
            }
        }
        Ok(handled)
    }

    /// The function's handler, and when each record it failed is due again.
    async fn call(
        &self,
        service: &Service,
        feeds: Feeds,
        event: SqsEvent,
    ) -> (SqsBatchResponse, Later) {
        match feeds {
            Feeds::Steps | Feeds::DeadLetters => {
                let out = handle_steps_until(service, &self.dead_letters, event, None).await;
                (out.response, out.again)
            }
            Feeds::CtaInbox => (handle_cta_inbox(service, event).await, Vec::new()),
        }
    }

    /// Pumps until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            match self.pump(Some(&stop)).await {
                Ok(0) => {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = stop.changed() => {}
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    error!(error = %e, "polling the queues failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}
