//! The step functions (`orchestrator`, `subagent`): a batch of SQS FIFO records, one step
//! per record, in order per run, while the invocation has time for one more.

#[cfg(feature = "steps")]
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use baton_aws::sdk::map_sdk_err;
use baton_core::message::StepMessage;
use baton_core::service::{Delivery, Service, StepDeadline, Verdict};
use futures_util::{StreamExt, stream};
use tracing::{Instrument, error, info, info_span, warn};
#[cfg(feature = "steps")]
use {
    crate::Startup,
    baton_core::llm::Llm,
    baton_core::service::STEPS_IN_A_ROW,
    lambda_runtime::{LambdaEvent, service_fn},
};

use crate::failure;

/// What a step function's invocations share: its service, the dead-letter queues' ARNs, and
/// the queues a deferred record may come from (steps, subagent) with the client to release it.
#[cfg(feature = "steps")]
struct StepsHandler {
    service: Arc<Service>,
    dead_letters: Vec<String>,
    queues: [String; 2],
    sqs: aws_sdk_sqs::Client,
    /// Runs of a batch stepped at once ([`steps_at_once`]), steps of each in a row.
    pace: Pace,
    /// The live channel's publisher, if the deployment has one: what a batch published is
    /// sent before the invocation ends (Lambda freezes a process between invocations).
    live: Option<Arc<baton_aws::appsync::AppSyncLive>>,
    /// The OTLP exporter, when one is configured: flushed at each invocation's end.
    traces: Option<Arc<baton_telemetry::Traces>>,
}

/// The longest an invocation's end waits for its live events to be sent.
#[cfg(feature = "steps")]
const LIVE_DRAIN: Duration = Duration::from_secs(1);
/// How long an invocation may spend sending its steps' spans before it returns.
#[cfg(feature = "steps")]
const TRACES_FLUSH: Duration = Duration::from_secs(1);

#[cfg(feature = "steps")]
/// The `orchestrator` and `subagent` functions: steps from their queue (and its dead-letter
/// queue, `BATON_DEAD_LETTER_QUEUE_ARN`), thinking with `llm`, until Lambda stops them.
pub async fn run_steps(startup: Startup, llm: Arc<dyn Llm>) -> Result<(), lambda_runtime::Error> {
    let aws = startup.settings.aws()?;
    let dead_letters = vec![aws.dead_letter_queue_arn()?.to_owned()];
    let queues = [aws.steps_queue_url.clone(), aws.subagent_queue_url.clone()];
    let sqs = aws_sdk_sqs::Client::new(&startup.sdk);
    let at_once = match startup.config.steps_at_once {
        Some(n) => n as usize,
        None => steps_at_once(
            startup.config.function_memory_mb,
            startup.config.cache_bytes(None),
        ),
    };
    // One EMF line per committed step in the function's log (CloudWatch makes them
    // metrics); spans to OTEL_EXPORTER_OTLP_ENDPOINT when it is set, sent before each
    // invocation returns.
    let traces = baton_telemetry::Traces::from_env("baton")?.map(Arc::new);
    let mut observers: Vec<Arc<dyn baton_core::observe::Observer>> = vec![Arc::new(
        baton_telemetry::Metrics::emf(&startup.config.metrics_namespace),
    )];
    observers.extend(traces.clone().map(|t| t as _));
    let live = startup.live()?;
    let service = startup
        .step_service(llm, live.clone().map(|l| l as _), observers)
        .await?;
    let pace = Pace {
        at_once,
        in_a_row: startup
            .config
            .steps_in_a_row
            .map_or(STEPS_IN_A_ROW, |n| n as usize),
    };
    let handler = Arc::new(StepsHandler {
        service,
        dead_letters,
        queues,
        sqs,
        pace,
        live,
        traces,
    });
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let handler = handler.clone();
        async move {
            let h = &*handler;
            let sqs = &h.sqs;
            let deadline = invocation_deadline(event.context.deadline);
            let urls = h.queues.each_ref().map(String::as_str);
            // Should this invocation crash, its records come back within HOLD.
            let hold = hold_for(deadline.as_ref().map_or(HOLD, StepDeadline::left));
            let records = event.payload.records.clone();
            let out = holding(
                sqs,
                &urls,
                &records,
                hold,
                &std::sync::atomic::AtomicU64::new(0),
                handle_steps(&h.service, &h.dead_letters, event.payload, deadline, h.pace),
            )
            .await;
            release(sqs, &urls, &out.again).await;
            if let Some(live) = &h.live {
                live.drain(LIVE_DRAIN).await;
            }
            if let Some(traces) = &h.traces {
                traces.flush(TRACES_FLUSH).await;
            }
            Ok::<_, lambda_runtime::Error>(out.response)
        }
    }))
    .await
}

/// The step deadline of an invocation that ends at `deadline_ms` (Lambda's context, ms
/// since the epoch), its whole time taken as its timeout. A deadline already past as the
/// batch starts is no real invocation's (an emulator's such as `cargo lambda watch`, or a
/// broken clock): none.
pub fn invocation_deadline(deadline_ms: u64) -> Option<StepDeadline> {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(deadline_ms);
    let left = at.duration_since(SystemTime::now()).ok()?;
    Some(StepDeadline::ending(Instant::now() + left, left))
}

/// What a steps batch did: the response for Lambda, and the records it reports failed,
/// each with when it is to be delivered again, for [`release`].
#[derive(Debug, Default)]
pub struct StepsOutcome {
    pub response: SqsBatchResponse,
    /// At once: a record deferred because the invocation's time ran out, or one behind a
    /// failed record of its group (SQS holds a group while its head is in flight). After
    /// [`retry_delay`]: a record whose step failed retryably.
    pub again: Vec<(SqsMessage, Duration)>,
}

/// How long a record whose step failed retryably (a throttle, a provider's 429 after its
/// own retries, a 5xx) waits before its next delivery: 30 s, doubled with each receive, at
/// most 15 minutes. Without it, it would wait the queue's visibility timeout (90 minutes),
/// and its run with it. With the queues' `maxReceiveCount` of 8, a run that fails every
/// attempt is dead-lettered, and failed, about 45 minutes after its first (30 s + 1 + 2 + 4
/// + 8 + 15 + 15 minutes of waits, plus the attempts).
pub fn retry_delay(receives: u32) -> Duration {
    let doublings = receives.saturating_sub(1).min(10);
    Duration::from_secs(30 << doublings).min(MAX_RETRY_DELAY)
}

/// The longest a retried record waits.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(15 * 60);

/// The most memory one step may hold beyond the cache, in MB, measured: the heaviest work a
/// deployment allows (`tests/lambda/memory.py`: a 3.9 MB model request, a 4.6 MB window,
/// 8 tool results of 64 KB) took 7.3 MB more a step at once (158.7 MB peak at 2 at once,
/// 201.0 at 6, 217.4 at 10, in 256 MB), with half as much again for margin. Runs waiting on
/// a model hold little, and share the invocation's billed duration: more at once is cheaper.
/// (A Rust tool of a deployment's own that returns files holds up to 4 × 5 MB more while
/// its step commits: such a deployment sets `BATON_STEPS_AT_ONCE`.)
pub const STEP_MEMORY_MB: u64 = 12;
/// What a step function holds besides its steps and cache, in MB (the runtime, clients, TLS),
/// measured the same way (144 MB at 2 at once, less 64 MB of cache and 2 steps), rounded up.
pub const BASE_MEMORY_MB: u64 = 80;

/// How many runs of a batch a function of `memory_mb` steps at once, its cache of
/// `cache_bytes` aside, at the most each step was measured to hold ([`STEP_MEMORY_MB`]): at
/// least 2 (so that one slow model call never holds the others back), at most a batch (10).
/// 256 MB with its 64 MB cache: 9; 512 MB and more: 10.
pub fn steps_at_once(memory_mb: Option<u64>, cache_bytes: usize) -> usize {
    let Some(memory) = memory_mb else {
        return MAX_BATCH;
    };
    let cache = (cache_bytes as u64).div_ceil(1024 * 1024);
    let free = memory.saturating_sub(cache + BASE_MEMORY_MB);
    usize::try_from(free / STEP_MEMORY_MB)
        .unwrap_or(MAX_BATCH)
        .clamp(2, MAX_BATCH)
}

/// The most records Lambda hands a FIFO queue's function at once.
pub const MAX_BATCH: usize = 10;

/// How a step function paces a batch: how many of its runs it steps at once
/// ([`steps_at_once`]), and how many steps of each in a row ([`STEPS_IN_A_ROW`]:
/// [`Steps::consume_row`](baton_core::service::Steps::consume_row)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub at_once: usize,
    pub in_a_row: usize,
}

impl Pace {
    /// `at_once` runs at once, each one step an invocation (every step through the queue).
    pub fn step_by_step(at_once: usize) -> Self {
        Self {
            at_once,
            in_a_row: 1,
        }
    }
}

/// The step functions' handler (`orchestrator`, `subagent`; the in-process event source
/// mappings too): one step per message, in order per run, at most `pace.at_once` runs of
/// the batch at a time ([`steps_at_once`]), while the invocation has time for them.
///
/// A run whose step leaves it going on (its next message its only send) takes its next
/// step in the same invocation, up to `pace.in_a_row` steps and
/// [`ROW_FOR`](baton_core::service::ROW_FOR) in a row; the
/// last next message is sent. Until a step of the row commits, the message that drives it
/// stands in its run's committed outbox, unsent: should the invocation crash, the record
/// the row began with comes back and sends it. A step of the row that fails leaves that
/// record with its verdict (retried after its backoff, sending the message then; deferred,
/// the message is sent at once).
///
/// Each run is one FIFO message group. The records of one group are stepped in order; the
/// groups of a batch are stepped concurrently, so a slow model call holds back only its own
/// run, not the other runs Lambda put in the same batch. With SQS FIFO and
/// `ReportBatchItemFailures`, once a message of a group fails, every later message of that
/// group in the batch is reported failed too, or SQS would deliver them out of order; other
/// groups are not affected. Only retryable errors are reported: a terminal one has already
/// failed its run (see `Steps::handle`), so redelivering it could not help. Records from
/// one of `dead_letters` (queue ARNs) end their run as failed.
///
/// With a [`StepDeadline`] (Lambda's: the invocation ends then), no step is cut off: every
/// record, the first of its group too, starts only while its model call fits before the
/// deadline ([`Steps::step_fits`](baton_core::service::Steps::step_fits)), and a step whose tool calls do not fit stops before
/// running them; such a record and the rest of its group are deferred, in order: reported
/// failed and due again at once. Every failure is returned with when it is due again
/// ([`StepsOutcome::again`]), so the caller makes it visible then ([`release`]) rather than
/// after the visibility timeout.
pub async fn handle_steps(
    service: &Service,
    dead_letters: &[String],
    event: SqsEvent,
    deadline: Option<StepDeadline>,
    pace: Pace,
) -> StepsOutcome {
    // The batch's groups in the order they first appear, each with its records in order.
    let mut groups: Vec<(String, Vec<(usize, SqsMessage)>)> = Vec::new();
    for (i, rec) in event.records.into_iter().enumerate() {
        let group = rec
            .attributes
            .get("MessageGroupId")
            .cloned()
            .unwrap_or_default();
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, recs)) => recs.push((i, rec)),
            None => groups.push((group, vec![(i, rec)])),
        }
    }
    let mut failures: Vec<(usize, SqsMessage, Option<Duration>)> = stream::iter(
        groups
            .into_iter()
            .map(|(_, recs)| handle_group(service, dead_letters, recs, deadline, pace.in_a_row)),
    )
    .buffer_unordered(pace.at_once.max(1))
    .collect::<Vec<_>>()
    .await
    .into_iter()
    .flatten()
    .collect();
    failures.sort_by_key(|(i, _, _)| *i);
    let mut out = StepsOutcome::default();
    for (_, rec, again) in failures {
        out.response
            .batch_item_failures
            .push(failure(rec.message_id.clone().unwrap_or_default()));
        if let Some(delay) = again {
            out.again.push((rec, delay));
        }
    }
    out
}

/// The records of one message group, in order: the ones to report failed, each with its
/// position in the batch and when it is due again (`None`: after its visibility timeout).
async fn handle_group(
    service: &Service,
    dead_letters: &[String],
    records: Vec<(usize, SqsMessage)>,
    deadline: Option<StepDeadline>,
    in_a_row: usize,
) -> Vec<(usize, SqsMessage, Option<Duration>)> {
    let mut failed = false;
    let mut out = Vec::new();
    let last = records.len();
    for (n, (i, rec)) in records.into_iter().enumerate() {
        let id = rec.message_id.clone().unwrap_or_default();
        if failed {
            out.push((i, rec, Some(Duration::ZERO)));
            continue;
        }
        if let Some(d) = &deadline {
            let left = d.left();
            if !service.steps().step_fits(left) {
                if service.steps().step_fits(d.window) {
                    info!(message_id = %id, left_ms = left.as_millis() as u64, "deferred: no time for a step in this invocation");
                    failed = true;
                    out.push((i, rec, Some(Duration::ZERO)));
                    continue;
                }
                // No invocation has the time: deferring could never help.
                warn!(
                    window_ms = d.window.as_millis() as u64,
                    model_ms = service.steps().longest_think().as_millis() as u64,
                    "the function's timeout is shorter than one model call at its worst (timeout x attempts): raise it, or lower BATON_LLM_TIMEOUT_SECONDS"
                );
            }
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
            .as_ref()
            .is_some_and(|a| dead_letters.contains(a));
        let receives = rec
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        let delivery = Delivery {
            message: &msg,
            receives,
            dead: dead.then_some("its retries were exhausted"),
            deadline,
        };
        let span = info_span!("step", message_id = %id, run_id = %msg.run_id, dead);
        // A row is for a run's last record in the batch: the ones after it come first.
        let verdict = if in_a_row > 1 && n + 1 == last {
            service
                .steps()
                .consume_row(delivery, in_a_row, || {})
                .instrument(span)
                .await
        } else {
            service
                .steps()
                .consume(delivery, false)
                .instrument(span)
                .await
        };
        match verdict {
            Verdict::Ack => {}
            // Back to the queue after its backoff, with the rest of its FIFO group behind it.
            Verdict::Retry { .. } => {
                failed = true;
                out.push((i, rec, Some(retry_delay(receives))));
            }
            // Not started (or stopped before its tools): a fresh invocation takes it now.
            Verdict::Defer => {
                failed = true;
                out.push((i, rec, Some(Duration::ZERO)));
            }
            // As a crash would leave it: it waits its visibility timeout out.
            Verdict::Crashed => {
                failed = true;
                out.push((i, rec, None));
            }
        }
    }
    out
}

/// The longest a record of a crashed invocation stays hidden (an out-of-memory kill, a panic,
/// a timeout): each record is held for this long at a time while its invocation runs, and
/// held again every half of it ([`holding`]), so that a crash hides a run for at most this,
/// not the queue's 90-minute visibility timeout.
pub const HOLD: Duration = Duration::from_secs(120);

/// How long the records of an invocation of a function that times out after `timeout` are
/// held at a time: [`HOLD`], or twice a shorter timeout.
pub fn hold_for(timeout: Duration) -> Duration {
    HOLD.min(timeout.saturating_mul(2))
        .max(Duration::from_secs(2))
}

/// Runs `work` (an invocation's steps) while holding `records` hidden for `hold` at a time,
/// renewed every half of it (`ChangeMessageVisibilityBatch`: one request per queue at the
/// start, and one more each renewal of a long invocation). Each request is counted in
/// `requests`.
pub async fn holding<T>(
    sqs: &aws_sdk_sqs::Client,
    queue_urls: &[&str],
    records: &[SqsMessage],
    hold: Duration,
    requests: &std::sync::atomic::AtomicU64,
    work: impl std::future::Future<Output = T>,
) -> T {
    let renew = async {
        loop {
            hold_once(sqs, queue_urls, records, hold, requests).await;
            tokio::time::sleep(hold / 2).await;
        }
    };
    tokio::select! {
        biased;
        out = work => out,
        () = renew => unreachable!("the renewals never end"),
    }
}

/// One hold of `records` (see [`holding`]), a request per queue. A failure leaves a record
/// to the queue's own visibility timeout: logged, not fatal.
async fn hold_once(
    sqs: &aws_sdk_sqs::Client,
    queue_urls: &[&str],
    records: &[SqsMessage],
    hold: Duration,
    requests: &std::sync::atomic::AtomicU64,
) {
    for url in queue_urls {
        let name = url.rsplit('/').next().unwrap_or_default();
        let entries: Vec<_> = records
            .iter()
            .filter(|r| {
                r.event_source_arn
                    .as_deref()
                    .and_then(|a| a.rsplit(':').next())
                    == Some(name)
            })
            .filter_map(|r| r.receipt_handle.as_deref())
            .enumerate()
            .filter_map(|(i, receipt)| {
                aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .visibility_timeout(hold.as_secs() as i32)
                    .build()
                    .ok()
            })
            .collect();
        if entries.is_empty() {
            continue;
        }
        requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = sqs
            .change_message_visibility_batch()
            .queue_url(*url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            warn!(error = %map_sdk_err("ChangeMessageVisibilityBatch", e), "a batch's records wait their queue's visibility timeout should the invocation crash");
        }
    }
}

/// Makes each record visible again after its delay (`ChangeMessageVisibility`), so that its
/// run waits that long, not the queue's visibility timeout. `queue_urls` are the queues the
/// records may come from; a record of another queue (a dead-letter queue's) waits its
/// timeout out.
pub async fn release(
    sqs: &aws_sdk_sqs::Client,
    queue_urls: &[&str],
    records: &[(SqsMessage, Duration)],
) {
    for (rec, delay) in records {
        let name = rec
            .event_source_arn
            .as_deref()
            .and_then(|a| a.rsplit(':').next())
            .unwrap_or_default();
        let url = queue_urls
            .iter()
            .find(|u| !name.is_empty() && u.rsplit('/').next() == Some(name));
        let (Some(url), Some(receipt)) = (url, rec.receipt_handle.as_deref()) else {
            continue;
        };
        if let Err(e) = sqs
            .change_message_visibility()
            .queue_url(*url)
            .receipt_handle(receipt)
            .visibility_timeout(delay.as_secs().min(MAX_RETRY_DELAY.as_secs()) as i32)
            .send()
            .await
        {
            warn!(error = %map_sdk_err("ChangeMessageVisibility", e), "a failed record waits its visibility timeout");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retried_record_waits_30_s_doubled_per_receive_up_to_15_minutes() {
        let waits: Vec<u64> = (1..=8).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(waits, [30, 60, 120, 240, 480, 900, 900, 900]);
        assert_eq!(retry_delay(0), Duration::from_secs(30));
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY_DELAY);
        // What the docs say: a run failing every attempt is dead-lettered (8 receives)
        // after seven waits of about 45 minutes in all.
        let total: u64 = (1..8).map(|n| retry_delay(n).as_secs()).sum();
        assert_eq!(total, 2730);
    }

    #[test]
    fn a_function_steps_as_many_runs_at_once_as_its_memory_holds_at_the_worst() {
        let cache = |mb| baton_core::service::budget_for(mb);
        assert_eq!(steps_at_once(Some(256), cache(256)), 9);
        assert_eq!(steps_at_once(Some(512), cache(512)), MAX_BATCH);
        assert_eq!(steps_at_once(Some(1024), cache(1024)), MAX_BATCH);
        // 128 MB: its 32 MB cache and the base leave one step's room; never fewer than 2.
        assert_eq!(steps_at_once(Some(128), cache(128)), 2);
        // A cache set larger than the memory leaves two, never none.
        assert_eq!(steps_at_once(Some(128), 512 * 1024 * 1024), 2);
        // Not on Lambda (tests, `baton dev --aws`): the whole batch.
        assert_eq!(steps_at_once(None, cache(256)), MAX_BATCH);
    }
}
