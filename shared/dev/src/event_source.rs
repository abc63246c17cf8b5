//! Event source mappings, in-process: stands in for Lambda's SQS event source mappings when
//! the functions run inside one process (`baton dev --aws`, the tests over an emulator). It
//! polls each queue, hands the handler a real `SqsEvent` (the JSON Lambda would send),
//! deletes what succeeded and leaves failures to the visibility timeout. It can deliver
//! every message twice, to prove that duplicates change nothing.
//!
//! It holds each function to Lambda's contract, not kinder ([`Function`], from
//! `template.yaml`): a batch holds at most the mapping's `BatchSize` records; at most
//! `MaximumConcurrency` invocations of a mapping run at once (a batch waits in its queue
//! meanwhile, as a throttled one does); an invocation is handed its deadline and as many
//! runs at once as its memory holds; and one still running at its function's timeout is
//! ended there, as Lambda ends it: its future is dropped mid-step, nothing of its batch is
//! deleted or released, and the whole batch comes back after the queue's visibility
//! timeout, each record's receive count raised. And as Lambda's recursive loop detection
//! does, a function that may not loop is not invoked with a record past about 16 hops of
//! a chain of invocations through SQS ([`crate::loops`]): the record stays in its queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName};
use serde_json::json;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::{error, warn};

use baton_core::error::PortError;
use baton_core::service::{Service, StepDeadline, budget_for};

use baton_aws::sdk::map_sdk_err;
use baton_core::service::STEPS_IN_A_ROW;
use baton_lambda::{Pace, handle_events, handle_steps, hold_for, holding, release, steps_at_once};

pub use crate::functions::Function;

/// Records to make visible again, each after its delay.
type Later = Vec<(aws_lambda_events::event::sqs::SqsMessage, Duration)>;

/// Which handler a queue feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feeds {
    /// `orchestrator` / `subagent`.
    Steps,
    /// `orchestrator` / `subagent`, reading their dead-letter queues.
    DeadLetters,
    /// `events`.
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
    /// The function the queue feeds, as Lambda runs it.
    pub function: Function,
}

#[derive(Clone)]
pub struct EventSources {
    /// Each queue with the function it feeds: that function's SQS client (Lambda's event
    /// source mapping reads with the function's role) and its service, and the invocations
    /// its mapping may still start (`MaximumConcurrency`).
    queues: Vec<(EventSource, Consumer, Arc<Semaphore>)>,
    /// Invocations ended at their function's timeout, so far.
    ended: Arc<AtomicU64>,
    /// Each message's hops along its chain of invocations, as the functions sent them.
    lineage: crate::loops::Lineage,
    /// Invocations Lambda's recursive loop detection would have stopped, so far.
    loops_stopped: Arc<AtomicU64>,
    /// What Lambda would bill, and the mappings' own SQS requests.
    billing: Arc<Billing>,
    /// The ARNs of the queues that feed [`Feeds::DeadLetters`].
    dead_letters: Vec<String>,
    duplicate: bool,
    /// Runs of a batch a step function steps at once, when set (else its memory decides).
    at_once: Option<usize>,
    /// Steps of one run a step function takes in a row (`BATON_STEPS_IN_A_ROW`; else
    /// `STEPS_IN_A_ROW`).
    in_a_row: Option<usize>,
    /// How long a receive waits for a message (SQS long polling): 0, then a short sleep
    /// when every queue is empty, for one poller over several queues; more for a poller of
    /// one queue among many ([`EventSources::pollers_of`]).
    wait_seconds: i32,
}

/// What the stand-in's invocations would cost on Lambda, counted as Lambda bills them:
/// each invocation (a request) and its duration at its function's memory (rounded up to the
/// millisecond), and the SQS requests the event source mappings make for them (receives that
/// returned messages, deletes, visibility changes; the empty polls of an idle mapping are a
/// fixed cost of its own).
#[derive(Debug, Default)]
pub struct Billing {
    pub invocations: AtomicU64,
    /// Megabyte-milliseconds.
    pub mb_ms: AtomicU64,
    pub receives: AtomicU64,
    pub deletes: AtomicU64,
    pub visibility_changes: AtomicU64,
}

/// A snapshot of [`Billing`].
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Billed {
    pub invocations: u64,
    pub gb_seconds: f64,
    pub mapping_sqs_requests: u64,
}

impl Billing {
    pub fn snapshot(&self) -> Billed {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Billed {
            invocations: n(&self.invocations),
            gb_seconds: n(&self.mb_ms) as f64 / 1024.0 / 1000.0,
            mapping_sqs_requests: n(&self.receives)
                + n(&self.deletes)
                + n(&self.visibility_changes),
        }
    }
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
        let queues = queues
            .into_iter()
            .map(|(q, c)| {
                let slots = Arc::new(Semaphore::new(q.function.max_concurrency.max(1)));
                (q, c, slots)
            })
            .collect();
        Self {
            queues,
            ended: Arc::default(),
            lineage: Default::default(),
            loops_stopped: Arc::default(),
            billing: Arc::default(),
            dead_letters,
            duplicate: false,
            at_once: None,
            in_a_row: None,
            wait_seconds: 0,
        }
    }

    /// How many invocations were ended at their function's timeout so far.
    pub fn invocations_ended(&self) -> u64 {
        self.ended.load(Ordering::SeqCst)
    }

    /// The functions' messages counted along their chains by `lineage` (the one their
    /// queue clients count with: [`crate::loops::Lineage::counting`]).
    pub fn counting_hops(mut self, lineage: crate::loops::Lineage) -> Self {
        self.lineage = lineage;
        self
    }

    /// How many invocations Lambda's recursive loop detection would have stopped so far.
    pub fn loops_stopped(&self) -> u64 {
        self.loops_stopped.load(Ordering::SeqCst)
    }

    /// What the invocations so far would be billed.
    pub fn billed(&self) -> Billed {
        self.billing.snapshot()
    }

    /// `n` pollers of each step queue (not the dead-letter queues nor the CTA inbox), each
    /// long-polling its one queue, as Lambda's event source mapping scales out its pollers
    /// when many message groups wait.
    pub fn pollers_of_steps(&self, n: usize) -> Vec<Self> {
        let mut out = Vec::new();
        for q in self
            .queues
            .iter()
            .filter(|(q, _, _)| q.feeds == Feeds::Steps)
        {
            for _ in 0..n {
                out.push(Self {
                    queues: vec![q.clone()],
                    ended: self.ended.clone(),
                    lineage: self.lineage.clone(),
                    loops_stopped: self.loops_stopped.clone(),
                    billing: self.billing.clone(),
                    dead_letters: self.dead_letters.clone(),
                    duplicate: self.duplicate,
                    at_once: self.at_once,
                    in_a_row: self.in_a_row,
                    wait_seconds: 1,
                });
            }
        }
        out
    }

    /// Step this many runs of a batch at once (`BATON_STEPS_AT_ONCE`); `None`: as many as
    /// each function's memory allows.
    pub fn stepping_at_once(mut self, n: Option<usize>) -> Self {
        self.at_once = n;
        self
    }

    /// Take this many steps of one run in a row (`BATON_STEPS_IN_A_ROW`); `None`: as the
    /// functions do by default (`STEPS_IN_A_ROW`).
    pub fn stepping_in_a_row(mut self, n: Option<usize>) -> Self {
        self.in_a_row = n;
        self
    }

    /// Deliver every batch twice.
    pub fn duplicating(mut self, on: bool) -> Self {
        self.duplicate = on;
        self
    }

    /// The queue at `url`, feeding `function`: its ARN (for the `eventSourceARN` Lambda
    /// reports) and visibility timeout are read.
    pub async fn queue(
        sqs: &aws_sdk_sqs::Client,
        url: &str,
        feeds: Feeds,
        function: Function,
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
            function,
        })
    }

    /// One receive per queue, each batch's invocation awaited in turn; returns how many
    /// messages were handed to handlers.
    pub async fn pump_once(&self) -> Result<usize, PortError> {
        let mut handled = 0;
        for (q, consumer, _) in &self.queues {
            if let Some(batch) = self.receive(q, consumer).await? {
                handled += batch.len();
                self.invoke(q, consumer, batch, None).await?;
            }
        }
        Ok(handled)
    }

    /// One receive from `q`: up to its function's `BatchSize` messages, if any wait.
    async fn receive(
        &self,
        q: &EventSource,
        consumer: &Consumer,
    ) -> Result<Option<Vec<Message>>, PortError> {
        let out = consumer
            .sqs
            .receive_message()
            .queue_url(&q.url)
            .max_number_of_messages(q.function.batch_size.clamp(1, 10) as i32)
            .wait_time_seconds(self.wait_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .map_err(|e| map_sdk_err("ReceiveMessage", e))?;
        let messages = out.messages.unwrap_or_default();
        if !messages.is_empty() {
            self.billing.receives.fetch_add(1, Ordering::Relaxed);
        }
        Ok((!messages.is_empty()).then_some(messages))
    }

    /// One invocation of `q`'s function with `messages`, as Lambda makes it: the `SqsEvent`,
    /// the function's deadline, and its end at the timeout. What succeeded is deleted; what
    /// failed is released when due (or, once `stop` is set, at once, so that a graceful stop
    /// leaves no message in flight to hold up its run's group). An invocation ended at its
    /// timeout deletes and releases nothing.
    async fn invoke(
        &self,
        q: &EventSource,
        Consumer { sqs, service }: &Consumer,
        messages: Vec<Message>,
        stop: Option<&watch::Receiver<bool>>,
    ) -> Result<(), PortError> {
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
        // How far along its chain of invocations this one is: its furthest record's.
        let hops = messages
            .iter()
            .map(|m| self.lineage.of(m.body().unwrap_or_default()))
            .max()
            .unwrap_or(0);
        if hops > crate::loops::MAX_HOPS && !q.function.loops_allowed {
            // Lambda stops the loop: the function is not invoked, and its batch comes
            // back after the queue's visibility timeout (to be stopped again).
            self.loops_stopped.fetch_add(1, Ordering::SeqCst);
            warn!(
                function = %q.function.name,
                hops,
                records = messages.len(),
                "recursive loop detected: Lambda stops invoking a function whose RecursiveLoop is not Allow"
            );
            return Ok(());
        }
        let invocations = if self.duplicate { 2 } else { 1 };
        let mut resp = SqsBatchResponse::default();
        let mut later = Vec::new();
        for _ in 0..invocations {
            let f = &q.function;
            let ends = Instant::now() + f.timeout;
            let call = crate::loops::Lineage::invoked(
                hops,
                self.call(sqs, service, q, event.clone(), ends),
            );
            let started = Instant::now();
            let outcome = tokio::time::timeout_at(ends.into(), call).await;
            let ms =
                u64::try_from(started.elapsed().as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
            self.billing.invocations.fetch_add(1, Ordering::Relaxed);
            self.billing
                .mb_ms
                .fetch_add(ms.saturating_mul(f.memory_mb), Ordering::Relaxed);
            match outcome {
                Ok((r, l)) => {
                    resp.batch_item_failures.extend(r.batch_item_failures);
                    later.extend(l);
                }
                Err(_) => {
                    self.ended.fetch_add(1, Ordering::SeqCst);
                    warn!(
                        function = %f.name,
                        timeout_s = f.timeout.as_secs_f64(),
                        records = messages.len(),
                        "invocation ended at its timeout: its batch comes back after the queue's visibility timeout"
                    );
                    return Ok(());
                }
            }
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
                self.billing
                    .visibility_changes
                    .fetch_add(1, Ordering::Relaxed);
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
            self.billing
                .visibility_changes
                .fetch_add(later.len() as u64, Ordering::Relaxed);
            release(sqs, &[q.url.as_str()], &later).await;
        }
        if !done.is_empty() {
            self.billing.deletes.fetch_add(1, Ordering::Relaxed);
            sqs.delete_message_batch()
                .queue_url(&q.url)
                .set_entries(Some(done))
                .send()
                .await
                .map_err(|e| map_sdk_err("DeleteMessageBatch", e))?;
        }
        Ok(())
    }

    /// The function's handler, in an invocation that ends at `ends`, and when each record
    /// it failed is due again.
    async fn call(
        &self,
        sqs: &aws_sdk_sqs::Client,
        service: &Service,
        q: &EventSource,
        event: SqsEvent,
        ends: Instant,
    ) -> (SqsBatchResponse, Later) {
        match q.feeds {
            Feeds::Steps | Feeds::DeadLetters => {
                let f = &q.function;
                let deadline = StepDeadline::ending(ends, f.timeout);
                let at_once = self
                    .at_once
                    .unwrap_or_else(|| steps_at_once(Some(f.memory_mb), budget_for(f.memory_mb)));
                let pace = Pace {
                    at_once,
                    in_a_row: self.in_a_row.unwrap_or(STEPS_IN_A_ROW),
                };
                // As the step functions do: the batch held while they work ([`holding`]).
                let records = event.records.clone();
                let out = holding(
                    sqs,
                    &[q.url.as_str()],
                    &records,
                    hold_for(f.timeout),
                    &self.billing.visibility_changes,
                    handle_steps(service, &self.dead_letters, event, Some(deadline), pace),
                )
                .await;
                (out.response, out.again)
            }
            Feeds::CtaInbox => (handle_events(service, event).await, Vec::new()),
        }
    }

    /// Pumps until `stop` turns true: each queue polled while its mapping may start another
    /// invocation, each invocation run beside the others; on stop, the invocations under way
    /// are let finish.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let mut running = JoinSet::new();
        while !*stop.borrow() {
            let mut received = 0;
            for i in 0..this.queues.len() {
                let (q, consumer, slots) = &this.queues[i];
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue;
                };
                match this.receive(q, consumer).await {
                    Ok(Some(batch)) => {
                        received += batch.len();
                        let (this, stop) = (this.clone(), stop.clone());
                        running.spawn(async move {
                            let (q, consumer, _) = &this.queues[i];
                            if let Err(e) = this.invoke(q, consumer, batch, Some(&stop)).await {
                                error!(error = %e, "settling an invocation's batch failed");
                            }
                            drop(slot);
                        });
                    }
                    Ok(None) => {}
                    Err(e) => {
                        error!(error = %e, "polling the queues failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
            while running.try_join_next().is_some() {}
            if received == 0 {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stop.changed() => {}
                }
            }
        }
        while running.join_next().await.is_some() {}
    }
}
