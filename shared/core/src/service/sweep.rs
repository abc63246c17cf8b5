//! The sweep: what a crash between a write and its send left undone (outboxes, answers'
//! resolutions), and the finished runs past their retention, within a time budget per tick.

use tracing::{info, warn};

use super::Steps;
use crate::error::PortError;

/// How long one sweep tick starts new work: the `events` function that runs it has 30 s, and
/// the answers in its batch must not wait long behind it. What is left waits for the next
/// tick (every 5 minutes).
pub const SWEEP_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);
/// Finished runs purged at a time, between looks at the budget.
pub const PURGE_CHUNK: usize = 10;

impl Steps {
    /// Performs the outboxes of runs that parked more than `older_than` ago and whose outbox
    /// is still outstanding: what a crash between a commit and its effects left, when no
    /// redelivery came to repair it. Returns how many runs it repaired. Then deletes the
    /// finished runs the store's retention period is over for. Within [`SWEEP_BUDGET`]: what
    /// is left then waits for the next tick.
    pub async fn sweep(&self, older_than: chrono::Duration) -> Result<usize, PortError> {
        self.sweep_within(older_than, SWEEP_BUDGET).await
    }

    /// [`Steps::sweep`], starting no new work once `budget` has passed (a repair or a
    /// purge of [`PURGE_CHUNK`] runs under way is finished).
    pub async fn sweep_within(
        &self,
        older_than: chrono::Duration,
        budget: std::time::Duration,
    ) -> Result<usize, PortError> {
        let started = std::time::Instant::now();
        let spent = || started.elapsed() >= budget;
        let before = self.shared.deps.clock.now() - older_than;
        let runs = self.shared.deps.store.stale_outboxes(before, 100).await?;
        let mut repaired = 0;
        for run_id in &runs {
            if spent() {
                info!("sweep: out of time; the other outboxes wait for the next tick");
                return Ok(repaired);
            }
            info!(run_id = %run_id, "sweep: performing an outstanding outbox");
            // One run whose effects keep failing must not keep the others waiting; each
            // such run is reported (the alarm's metric, `OutboxRepairFailures`).
            match self.repair(run_id).await {
                Ok(true) => repaired += 1,
                Ok(false) => self.report_repair_failed(run_id, "effects still fail"),
                Err(e) => {
                    warn!(run_id = %run_id, error = %e, "sweep: the outbox failed again");
                    self.report_repair_failed(run_id, &e.to_string());
                }
            }
        }
        repaired += self.resend_resolutions(older_than).await?;
        // Lost timers, within the tick's budget too (the rest wait for the next tick).
        if !spent() {
            repaired += self.expire_overdue(older_than).await?;
        }
        if !spent() {
            repaired += self.fire_overdue_timers(older_than).await?;
        }
        let mut purged = 0;
        while !spent() {
            let n = self
                .shared
                .deps
                .store
                .purge_finished(self.shared.deps.clock.now(), PURGE_CHUNK)
                .await?;
            purged += n;
            if n < PURGE_CHUNK {
                break;
            }
        }
        if purged > 0 {
            info!(purged, "sweep: finished runs past their retention deleted");
        }
        Ok(repaired)
    }

    /// Expires the questions still pending more than `older_than` past their expiry: their
    /// timer was lost (a schedule dropped by Scheduler, or never made), and nothing else
    /// would end their wait. Returns how many it expired.
    pub async fn expire_overdue(&self, older_than: chrono::Duration) -> Result<usize, PortError> {
        let before = self.shared.deps.clock.now() - older_than;
        let ctas = self.shared.deps.store.overdue_ctas(before, 100).await?;
        let mut expired = 0;
        for cta in &ctas {
            warn!(cta_id = %cta.cta_id, run_id = %cta.run_id, expires_at = %cta.expires_at.to_rfc3339(),
                "sweep: a question past its expiry, its timer lost: expiring it");
            match self.shared.expire_cta(&cta.cta_id).await {
                Ok(()) => expired += 1,
                Err(e) => warn!(cta_id = %cta.cta_id, error = %e, "sweep: the expiry failed"),
            }
        }
        Ok(expired)
    }

    /// Fires the runs' timers (a plan step's timeout, a run's deadline) still unfired more
    /// than `older_than` past their time: their schedules were lost. Returns how many.
    pub async fn fire_overdue_timers(
        &self,
        older_than: chrono::Duration,
    ) -> Result<usize, PortError> {
        let before = self.shared.deps.clock.now() - older_than;
        let timers = self.shared.deps.store.overdue_timers(before, 100).await?;
        let mut fired = 0;
        for t in &timers {
            warn!(run_id = %t.run_id, timer_id = %t.timer_id, due = %t.due.to_rfc3339(),
                "sweep: a timer past its time, its schedule lost: firing it");
            match self.fire_timer(&t.timer_id, &t.run_id, Some(t.due)).await {
                Ok(()) => fired += 1,
                Err(e) => warn!(timer_id = %t.timer_id, error = %e, "sweep: the timer failed"),
            }
        }
        Ok(fired)
    }

    /// Sends again the resolutions of CTAs answered or expired more than `older_than` ago
    /// whose runs were never told (a crash between the answer's write and its send).
    /// Returns how many it sent.
    pub async fn resend_resolutions(
        &self,
        older_than: chrono::Duration,
    ) -> Result<usize, PortError> {
        let before = self.shared.deps.clock.now() - older_than;
        let ctas = self
            .shared
            .deps
            .store
            .stale_resolutions(before, 100)
            .await?;
        let mut sent = 0;
        for cta in &ctas {
            info!(cta_id = %cta.cta_id, run_id = %cta.run_id, "sweep: sending an outstanding resolution");
            match self.shared.send_resolution(cta).await {
                Ok(()) => sent += 1,
                Err(e) => {
                    warn!(cta_id = %cta.cta_id, error = %e, "sweep: the resolution failed again")
                }
            }
        }
        Ok(sent)
    }

    /// Performs a run's outstanding outbox (the start-up sweep and crash repair): whether
    /// it was performed whole (false: some effects failed again, and it stays narrowed to
    /// them for the next tick).
    pub async fn repair(&self, run_id: &str) -> Result<bool, PortError> {
        if let Some(rec) = self.shared.deps.store.get_run(run_id).await?
            && !rec.outbox.is_empty()
        {
            return Ok(self.shared.perform(&rec.run, &rec.outbox).await?.is_empty());
        }
        Ok(true)
    }

    /// Tells the observers (and the log) that a sweep could not repair `run_id`'s outbox.
    fn report_repair_failed(&self, run_id: &str, error: &str) {
        warn!(run_id, error, "sweep: an outbox is still owed");
        for o in &self.shared.observers {
            o.repair_failed(run_id, error);
        }
    }
}
