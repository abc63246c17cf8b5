//! The local worker: pumps the embedded queue into [`Steps::handle`](baton_core::service::Steps::handle) and fires due
//! expiry timers, in-process. It stands in for what SQS event source mappings and
//! EventBridge Scheduler do on AWS.
//!
//! Messages of different runs are handled concurrently; a run's messages one at a time, in
//! order (the queue hands out only a group's head). A message that fails with a retryable
//! error is retried with backoff; after `max_receives` it is dead-lettered, which ends its
//! run as failed. A terminal error has already failed its run (`Steps::handle`) and is
//! not retried.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{Instrument, error, info, info_span, warn};

use baton_core::error::PortError;
use baton_core::service::{Delivery as ServiceDelivery, Service, ServiceError, Verdict};
use baton_local::store::{Delivery, LocalStore};

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Messages handled at once (each from a different run).
    pub concurrency: usize,
    /// How long a handed-out message stays hidden; must exceed one step's duration.
    pub visibility: Duration,
    /// Deliveries before a message is dead-lettered.
    pub max_receives: u32,
    /// How often due timers are looked for.
    pub timer_interval: Duration,
    /// Handle every message twice (as a redelivery after a lost acknowledgement would),
    /// to prove that duplicates change nothing.
    pub duplicate: bool,
    /// Where to record how long each message took, received to handled (its commit synced,
    /// its acknowledgement held for the next receive), for `baton bench`.
    pub step_times: Option<StepTimes>,
    /// How many steps of one run are taken in a row, each next message handed over
    /// in-process rather than written to the queue (`BATON_STEPS_IN_A_ROW`;
    /// [`Steps::consume_row`](baton_core::service::Steps::consume_row)); 1: every step through the queue.
    pub in_a_row: usize,
}

/// Durations of handled messages, shared with whoever reads them.
#[derive(Debug, Clone, Default)]
pub struct StepTimes(Arc<Mutex<Vec<Duration>>>);

impl StepTimes {
    fn push(&self, d: Duration) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(d);
    }

    /// Everything recorded so far, leaving the record empty.
    pub fn take(&self) -> Vec<Duration> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            concurrency: 64,
            visibility: Duration::from_secs(15 * 60),
            max_receives: 5,
            timer_interval: Duration::from_secs(1),
            duplicate: false,
            step_times: None,
            in_a_row: baton_core::service::STEPS_IN_A_ROW,
        }
    }
}

pub struct Worker {
    service: Arc<Service>,
    store: LocalStore,
    opts: WorkerOptions,
}

/// How often the running worker sweeps, and how old an outstanding outbox must be to count.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How soon a step that found the disk full is tried again.
const DISK_FULL_RETRY: Duration = Duration::from_secs(2);

fn backoff(receives: u32) -> Duration {
    Duration::from_millis(250u64.saturating_mul(1 << receives.min(8)).min(60_000))
}

impl Worker {
    pub fn new(service: Arc<Service>, store: LocalStore, opts: WorkerOptions) -> Self {
        Self {
            service,
            store,
            opts,
        }
    }

    /// Start-up recovery, for the data directory's one owner: releases what an earlier
    /// process received and never acknowledged, then performs every outbox a crash left
    /// unperformed (runs' effects and answered CTAs' resolutions). Returns how many runs
    /// and CTAs it repaired.
    pub async fn sweep(&self) -> Result<usize, PortError> {
        let released = self.store.release_leases().await?;
        if released > 0 {
            info!(
                released,
                "released messages an earlier process left in flight"
            );
        }
        let runs = self.store.runs_with_outbox().await?;
        for run_id in &runs {
            self.service.steps().repair(run_id).await?;
        }
        // Every resolution still outstanding was being sent when the last process stopped.
        let resolved = self
            .service
            .steps()
            .resend_resolutions(chrono::Duration::zero())
            .await?;
        Ok(runs.len() + resolved)
    }

    /// Handles the messages available now (one batch). Returns how many it handled.
    pub async fn pump_once(&self) -> Result<usize, PortError> {
        let mut batch = self
            .store
            .receive(self.opts.concurrency, self.opts.visibility)
            .await?;
        let n = batch.len();
        // The common case of one busy run: no task to spawn.
        if n == 1
            && let Some(d) = batch.pop()
        {
            process(
                self.service.clone(),
                self.store.clone(),
                self.opts.clone(),
                d,
            )
            .await;
            return Ok(1);
        }
        let mut set = JoinSet::new();
        for d in batch {
            set.spawn(process(
                self.service.clone(),
                self.store.clone(),
                self.opts.clone(),
                d,
            ));
        }
        while set.join_next().await.is_some() {}
        Ok(n)
    }

    /// Fires the timers due now: CTA expiries, and runs' own timers (plan step timeouts).
    pub async fn fire_due_timers(&self) -> Result<usize, PortError> {
        let now = self.service.now();
        let due = self.store.due_timers(now).await?;
        for t in &due {
            match self
                .service
                .steps()
                .fire_timer(&t.name, &t.run_id, None)
                .await
            {
                Ok(()) => {}
                Err(ServiceError::Port(e)) => return Err(e),
                // Refused (not due by the service's clock, or gone): the timer is done.
                Err(e) => warn!(timer = %t.name, error = %e, "timer refused"),
            }
            self.store.timer_fired(t).await?;
        }
        Ok(due.len())
    }

    /// Handles messages until nothing is queued or in flight (for tests and the benchmark).
    pub async fn drain(&self) -> Result<(), PortError> {
        loop {
            if self.pump_once().await? == 0 {
                if self.store.queue_depth().await? == 0 {
                    return Ok(());
                }
                self.store
                    .wait_for_messages(Duration::from_millis(20))
                    .await;
            }
        }
    }

    /// Runs until `stop` turns true: the pump, the timers and, every minute, the sweep of
    /// outboxes and resolutions left outstanding by a failure that no crash followed.
    /// (Call [`Worker::sweep`] once before, at start-up.)
    ///
    /// Free slots are refilled as soon as any message is done, so one slow think (a real
    /// model can take minutes) never holds up other runs' steps.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut inflight = JoinSet::new();
        let mut next_timers = tokio::time::Instant::now();
        let mut next_sweep = tokio::time::Instant::now() + SWEEP_EVERY;
        while !*stop.borrow() {
            if tokio::time::Instant::now() >= next_timers {
                if let Err(e) = self.fire_due_timers().await {
                    error!(error = %e, "firing timers failed");
                }
                next_timers = tokio::time::Instant::now() + self.opts.timer_interval;
            }
            if tokio::time::Instant::now() >= next_sweep {
                if let Err(e) = self
                    .service
                    .steps()
                    .sweep(chrono::Duration::from_std(SWEEP_EVERY).unwrap_or_default())
                    .await
                {
                    error!(error = %e, "sweep failed");
                }
                next_sweep = tokio::time::Instant::now() + SWEEP_EVERY;
            }
            let free = self.opts.concurrency.saturating_sub(inflight.len());
            if free > 0 {
                match self.store.receive(free, self.opts.visibility).await {
                    Ok(batch) => {
                        for d in batch {
                            let (svc, store) = (self.service.clone(), self.store.clone());
                            inflight.spawn(process(svc, store, self.opts.clone(), d));
                        }
                    }
                    Err(e) => error!(error = %e, "queue receive failed"),
                }
            }
            let wait = next_timers
                .saturating_duration_since(tokio::time::Instant::now())
                .min(Duration::from_millis(250));
            tokio::select! {
                Some(_) = inflight.join_next(), if !inflight.is_empty() => {
                    // Every slot freed meanwhile is refilled by the one receive that follows.
                    while inflight.try_join_next().is_some() {}
                }
                _ = self.store.wait_for_messages(wait) => {}
                _ = stop.changed() => {}
            }
        }
        // Let steps under way finish their commit and effects, and delete what they did.
        while inflight.join_next().await.is_some() {}
        if let Err(e) = self.store.flush_acks().await {
            error!(error = %e, "acknowledging the last messages failed; they will be redelivered");
        }
    }
}

async fn process(service: Arc<Service>, store: LocalStore, opts: WorkerOptions, d: Delivery) {
    let started = Instant::now();
    let (max_receives, duplicate) = (opts.max_receives, opts.duplicate);
    let msg = match d.message {
        Ok(m) => m,
        Err(e) => {
            error!(receipt = d.receipt, error = %e, "undecodable message dropped");
            let _ = store.ack(d.receipt).await;
            return;
        }
    };
    let span =
        info_span!("step", run_id = %msg.run_id, message_id = %msg.id, receives = d.receives);
    async {
        let why = format!("failed {} times", d.receives.saturating_sub(1));
        let delivery = ServiceDelivery {
            message: &msg,
            receives: d.receives,
            dead: (d.receives > max_receives).then_some(why.as_str()),
            deadline: None,
        };
        // A duplicated delivery is handled twice, step by step.
        let verdict = if opts.in_a_row > 1 && !duplicate {
            let mut last = started;
            service
                .steps()
                .consume_row(delivery, opts.in_a_row, || {
                    if let Some(times) = &opts.step_times {
                        times.push(last.elapsed());
                    }
                    last = Instant::now();
                })
                .await
        } else {
            let verdict = service.steps().consume(delivery, duplicate).await;
            if let Some(times) = &opts.step_times {
                times.push(started.elapsed());
            }
            verdict
        };
        let done = match verdict {
            Verdict::Ack => {
                store.ack_later(d.receipt);
                Ok(())
            }
            // Not the message's fault (the disk was full): tried again soon, as often as it
            // takes, and never dead-lettered for it.
            Verdict::Retry { soon: true } => {
                store.retry_later(d.receipt, DISK_FULL_RETRY, true).await
            }
            Verdict::Retry { soon: false } => {
                store
                    .retry_later(d.receipt, backoff(d.receives), false)
                    .await
            }
            // A crash before the ack: the message stays in flight until a restart releases it.
            Verdict::Crashed => Ok(()),
            // This host ends no step at a deadline (none is given): taken at once if it comes.
            Verdict::Defer => store.retry_later(d.receipt, Duration::ZERO, true).await,
        };
        if let Err(e) = done {
            error!(error = %e, "queue bookkeeping failed");
        }
    }
    .instrument(span)
    .await;
}
