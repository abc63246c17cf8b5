//! What a host's queue consumer does with what it receives, written once for every host:
//! a step message (handle it, or end its run when it was dead-lettered; then acknowledge,
//! retry, or leave it as a crash would), and an inbox event (an answer or an expiry from the
//! bus, a plan step's timer, the sweep's tick; a refusal published as `cta.rejected`). The
//! hosts map the verdict onto their queue: SQS batch item failures on Lambda, the embedded
//! queue's visibility locally.

use serde_json::{Value, json};
use tracing::{error, info, warn};

use super::{ServiceError, Steps};
use crate::cta::CtaResponse;
use crate::message::{Event, StepMessage};

/// One delivery of a step message.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub message: &'a StepMessage,
    /// How many times it has been delivered, this one included.
    pub receives: u32,
    /// Why it is a dead letter (its retries are exhausted), when it is one: its run ends
    /// failed instead of stepping.
    pub dead: Option<&'a str>,
    /// When the host ends the invocation handling it (Lambda's timeout); `None`: never.
    pub deadline: Option<StepDeadline>,
}

/// How long a step may work in an invocation that its host ends at a deadline (Lambda):
/// the invocation's end less a margin for the step's commit and effects. A step starts only
/// while its model call fits before `work_by` ([`Steps::step_fits`]), and runs its tool
/// calls only if they fit too; else it is deferred, whole, to a fresh invocation, never cut
/// off half-done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepDeadline {
    /// The step's model call and tool calls must be done by then.
    pub work_by: std::time::Instant,
    /// What a fresh invocation has for a step's work: its timeout less the margin.
    pub window: std::time::Duration,
}

impl StepDeadline {
    /// The most an invocation keeps for a step's commit and effects.
    pub const MAX_MARGIN: std::time::Duration = std::time::Duration::from_secs(30);

    /// For an invocation of `timeout` that ends at `ends`: the margin for the commit and the
    /// effects is a tenth of the timeout, at most [`Self::MAX_MARGIN`] (30 s of Lambda's
    /// 900; 2 s of a 20 s test function).
    pub fn ending(ends: std::time::Instant, timeout: std::time::Duration) -> Self {
        let margin = (timeout / 10).min(Self::MAX_MARGIN);
        Self {
            work_by: ends.checked_sub(margin).unwrap_or(ends),
            window: timeout.saturating_sub(margin),
        }
    }

    /// The time left for work.
    pub fn left(&self) -> std::time::Duration {
        self.work_by
            .saturating_duration_since(std::time::Instant::now())
    }
}

/// What the host does with a step message once the service is done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Handled, or failed for good with its run already failed: delete it.
    Ack,
    /// Deliver it again later. `soon` when the failure was not the message's own (the
    /// store's disk was full): try again shortly, and do not count it toward dead-lettering.
    Retry { soon: bool },
    /// A test's failpoint crashed the consumer before its acknowledgement: leave the message
    /// as a dead process would (in flight, back after its visibility timeout or a restart).
    Crashed,
    /// Not started, or stopped before its tool calls: the invocation has no time left for
    /// them ([`StepDeadline`]). Nothing was done: deliver it again at once, to a fresh
    /// invocation; it is no failure of the message's.
    Defer,
}

/// How many steps of one run a host takes in a row by default (`BATON_STEPS_IN_A_ROW`): each
/// hands its run's next message to the next in-process ([`Steps::consume_row`]), so a run
/// that goes on at once spends no queue write, request or invocation on its next step.
pub const STEPS_IN_A_ROW: usize = 10;

/// No step of a row starts this long after the row's first: where the queue cannot say what
/// waits in a run's group (SQS), a cancel or an answer sent while the run steps in a row
/// waits at most this (and the step under way).
pub const ROW_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// The detail-type of the sweep's tick on the inbox.
pub const SWEEP_EVENT: &str = "baton.sweep";

impl Steps {
    /// Whether a step may start with `left` until its work must be done: its model call,
    /// every attempt of it timing out ([`crate::llm::Llm::longest_call`]), fits.
    pub fn step_fits(&self, left: std::time::Duration) -> bool {
        left >= self.longest_think()
    }

    /// The longest a step's model call can take, its retries included.
    pub fn longest_think(&self) -> std::time::Duration {
        self.shared.deps.llm.longest_call().unwrap_or_default()
    }

    /// Handles one delivery of a step message (twice, when `twice`: as a redelivery after a
    /// lost acknowledgement would) and says what to do with it. A retryable failure is noted
    /// on the run (`lastError`) before it is retried.
    pub async fn consume(&self, d: Delivery<'_>, twice: bool) -> Verdict {
        let started = self.shared.deps.clock.now();
        let mut result = self.deliver(d, None).await;
        if twice && result.is_ok() {
            result = self.deliver(d, None).await;
        }
        self.verdict(d, result, started).await
    }

    /// [`Steps::consume`], handing back the run's own next message instead of sending it,
    /// when the step leaves one (and nothing else of the run's to send): its host steps it
    /// in the same invocation, or sends it with [`Steps::send_next`]. Until that next step
    /// commits, the message stands unsent in the run's committed outbox, so a crash in
    /// between loses nothing: the delivery being consumed comes back and sends it.
    pub async fn consume_in_a_row(&self, d: Delivery<'_>) -> (Verdict, Option<StepMessage>) {
        let started = self.shared.deps.clock.now();
        let mut next = None;
        let result = self.deliver(d, d.dead.is_none().then_some(&mut next)).await;
        let verdict = self.verdict(d, result, started).await;
        (verdict, next.filter(|_| verdict == Verdict::Ack))
    }

    /// Consumes `first`, then the steps of its run that follow at once, in-process, each with
    /// the next message the one before handed back ([`Steps::consume_in_a_row`]), up to
    /// `in_a_row` steps and [`ROW_FOR`], while the deadline leaves time for a step and nothing
    /// else waits in the run's group ([`crate::ports::Queue::waiting`]); the next message
    /// left is sent, behind what waits. `stepped` is called after each step. The verdict is the
    /// first delivery's: its step's, or a later one's that did not succeed (a failure or a
    /// crash leaves that delivery to come back and send the message its run's outbox holds; a
    /// step deferred for time sends its message now, for a fresh invocation).
    pub async fn consume_row(
        &self,
        first: Delivery<'_>,
        in_a_row: usize,
        mut stepped: impl FnMut(),
    ) -> Verdict {
        let began = std::time::Instant::now();
        let (mut verdict, mut next) = self.consume_in_a_row(first).await;
        stepped();
        let mut taken = 1;
        while let Some(msg) = next.take() {
            let time = first.deadline.is_none_or(|d| self.step_fits(d.left()));
            // What waits in the run's group (a cancel, say) comes before its next step.
            let waiting = || async {
                self.shared
                    .deps
                    .queue
                    .waiting(&msg.run_id)
                    .await
                    .unwrap_or(true)
            };
            if taken >= in_a_row || began.elapsed() >= ROW_FOR || !time || waiting().await {
                return self.sent_next(&msg, verdict).await;
            }
            let delivery = Delivery {
                message: &msg,
                receives: 1,
                dead: None,
                deadline: first.deadline,
            };
            let span = tracing::info_span!("step", in_a_row = taken, run_id = %msg.run_id);
            (verdict, next) =
                tracing::Instrument::instrument(self.consume_in_a_row(delivery), span).await;
            stepped();
            taken += 1;
            if verdict == Verdict::Defer {
                return self.sent_next(&msg, Verdict::Ack).await;
            }
        }
        verdict
    }

    /// `verdict`, once `msg` (a run's next message a row ends with) is sent; if it cannot be,
    /// the row's first delivery is retried, and its delivery sends it.
    async fn sent_next(&self, msg: &StepMessage, verdict: Verdict) -> Verdict {
        match self.send_next(msg).await {
            Ok(()) => verdict,
            Err(e) => {
                warn!(run_id = %msg.run_id, error = %e, "a run's next message could not be sent; the row's first message is retried, which sends it");
                Verdict::Retry { soon: false }
            }
        }
    }

    /// Sends a run's next message that [`Steps::consume_in_a_row`] handed back.
    pub async fn send_next(&self, msg: &StepMessage) -> Result<(), crate::error::PortError> {
        self.shared.deps.queue.send(std::slice::from_ref(msg)).await
    }

    async fn deliver(
        &self,
        d: Delivery<'_>,
        next: Option<&mut Option<StepMessage>>,
    ) -> Result<super::Handled, super::StepError> {
        match d.dead {
            Some(why) => self.dead_letter(d.message, why).await,
            None => self.handle_handing(d.message, d.deadline, next).await,
        }
    }

    async fn verdict(
        &self,
        d: Delivery<'_>,
        result: Result<super::Handled, super::StepError>,
        started: chrono::DateTime<chrono::Utc>,
    ) -> Verdict {
        let msg = d.message;
        match result {
            Ok(_) => match crate::failpoint::pass("step.before_ack").await {
                Ok(()) => Verdict::Ack,
                Err(_) => Verdict::Crashed,
            },
            Err(super::StepError::OutOfTime(why)) => {
                info!(run_id = %msg.run_id, message = %msg.id, %why, "step deferred to a fresh invocation");
                Verdict::Defer
            }
            Err(e) if e.is_retryable() => {
                let soon = e.is_storage_full();
                warn!(run_id = %msg.run_id, message = %msg.id, error = %e, soon, "step failed; it will be retried");
                self.note_failure(msg, d.receives, &e, started).await;
                Verdict::Retry { soon }
            }
            Err(e) => {
                // The service already tried to fail the run; another delivery cannot help.
                error!(run_id = %msg.run_id, message = %msg.id, error = %e, "step failed for good and its run could not be failed; acknowledged");
                Verdict::Ack
            }
        }
    }

    /// An event from the inbox: `cta.response` (validated as the API validates an answer;
    /// the first valid answer wins, and a redelivery of the answer that won is a success),
    /// `cta.expired`, a plan step's `timer.fired`, or the sweep's tick (outboxes older than
    /// `sweep_after`). An error that is not worth retrying has been published as
    /// `cta.rejected` (id `<message_id>:rejected`) before it is returned.
    pub async fn inbox_event(
        &self,
        message_id: &str,
        detail_type: &str,
        detail: &Value,
        sweep_after: chrono::Duration,
    ) -> Result<(), ServiceError> {
        let field = |k: &str| detail[k].as_str().unwrap_or_default().to_owned();
        let outcome = match detail_type {
            "cta.response" => self.bus_answer(detail).await,
            "cta.expired" => self.shared.cta_timer(&field("ctaId")).await,
            crate::message::TIMER_FIRED => {
                let due = detail["due"].as_str().and_then(|d| d.parse().ok());
                self.fire_timer(&field("timerId"), &field("runId"), due)
                    .await
            }
            SWEEP_EVENT => self
                .sweep(sweep_after)
                .await
                .map(|n| info!(repaired = n, "sweep done"))
                .map_err(ServiceError::from),
            other => Err(ServiceError::Invalid(format!("unexpected event `{other}`"))),
        };
        match outcome {
            Err(ServiceError::Port(e)) if e.is_retryable() => Err(ServiceError::Port(e)),
            Err(e) => {
                warn!(message_id, cta_id = %field("ctaId"), error = %e, "inbox event rejected");
                let event = Event {
                    id: format!("{message_id}:rejected"),
                    detail_type: "cta.rejected".into(),
                    detail: json!({"ctaId": field("ctaId"), "eventType": detail_type, "reason": e.to_string()}),
                    time: self.shared.deps.clock.now(),
                };
                if let Err(e) = self.shared.deps.bus.publish(&[event]).await {
                    warn!(error = %e, "publishing cta.rejected failed");
                }
                Err(e)
            }
            ok => ok,
        }
    }

    /// A `cta.response` event's detail: `ctaId`, the response's fields and, optionally, who
    /// answered (`responder`, 1 to 256 characters).
    async fn bus_answer(&self, detail: &Value) -> Result<(), ServiceError> {
        let mut fields = detail.clone();
        let mut responder = None;
        let mut cta_id = String::new();
        if let Value::Object(m) = &mut fields {
            cta_id = m
                .remove("ctaId")
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            m.remove("eventId");
            responder = m.remove("responder");
        }
        let responder = match responder {
            None | Some(Value::Null) => None,
            Some(Value::String(r)) if !r.trim().is_empty() && r.len() <= 256 => Some(r),
            Some(_) => {
                return Err(ServiceError::Invalid(
                    "`responder` must be a string of 1 to 256 characters".into(),
                ));
            }
        };
        let response = CtaResponse::from_json(fields)?;
        match self
            .shared
            .answer(
                &super::ctas::Answerer {
                    id: responder,
                    groups: Vec::new(),
                    via: crate::cta::Via::Bus,
                },
                &cta_id,
                response.clone(),
                true,
            )
            .await
        {
            // A redelivery of the answer that won (the bus delivers at least once): nothing
            // to do, nothing to reject.
            Err(ServiceError::AlreadyAnswered(won)) if won.response.as_ref() == Some(&response) => {
                Ok(())
            }
            other => other.map(|_| ()),
        }
    }

    /// The service's clock (hosts that fire timers ask it what time it is).
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.shared.deps.clock.now()
    }
}
