//! The transactional outbox's far side: a commit's effects performed (each idempotent) after
//! the commit, the run's own next message last.

use super::Service;
use crate::cta::Settlement;
use crate::error::PortError;
use crate::failpoint;
use crate::message::{Effect, outbox_continues};
use crate::run::Run;

impl Service {
    /// Performs committed effects (each idempotent), then marks the outbox done.
    pub(super) async fn perform(&self, run: &Run, effects: &[Effect]) -> Result<(), PortError> {
        if effects.is_empty() {
            return Ok(());
        }
        let continues = self.perform_only(run, effects).await?;
        if continues {
            Ok(())
        } else {
            self.deps.store.clear_outbox(&run.run_id, run.version).await
        }
    }

    /// Performs committed effects (each idempotent), leaving the outbox as it is; whether it
    /// ends with the run's own next message (then it never needs clearing).
    pub(super) async fn perform_only(
        &self,
        run: &Run,
        effects: &[Effect],
    ) -> Result<bool, PortError> {
        if effects.is_empty() {
            return Ok(true);
        }
        let mut sends = Vec::new();
        let mut events = Vec::new();
        for e in effects {
            match e {
                Effect::Send(m) => sends.push(m.clone()),
                // A `cta.request` names its CTA and carries no answer link: a link is a bearer
                // credential, and whoever may add a rule to the bus could read it. Its owner
                // mints one through the API (`POST /ctas/{id}/link`).
                Effect::Publish(ev) => events.push(ev.clone()),
                Effect::Schedule { cta_id, run_id, at } => {
                    self.deps.scheduler.schedule(cta_id, run_id, *at).await?;
                    failpoint::hit("effect.after_schedule")?;
                }
                Effect::Unschedule { cta_id } => {
                    self.deps.scheduler.unschedule(cta_id).await?;
                    failpoint::hit("effect.after_unschedule")?;
                }
                Effect::Timer {
                    timer_id,
                    run_id,
                    at,
                } => {
                    self.deps.scheduler.schedule(timer_id, run_id, *at).await?;
                    failpoint::hit("effect.after_schedule")?;
                }
                Effect::CancelTimer { timer_id } => {
                    self.deps.scheduler.unschedule(timer_id).await?;
                    failpoint::hit("effect.after_unschedule")?;
                }
                Effect::ReleaseFollowUps {
                    run_id,
                    message_ids,
                } => {
                    self.deps
                        .store
                        .release_follow_ups(run_id, message_ids)
                        .await?;
                }
                Effect::HoldFollowUps {
                    run_id,
                    message_ids,
                } => {
                    self.deps.store.hold_follow_ups(run_id, message_ids).await?;
                }
                Effect::CancelCta { cta_id } => {
                    let now = self.deps.clock.now();
                    self.deps
                        .store
                        .settle_cta(cta_id, &Settlement::Cancelled, now)
                        .await?;
                }
            }
        }
        if !events.is_empty() {
            self.deps.bus.publish(&events).await?;
            failpoint::hit("effect.after_publish")?;
        }
        // The run's own next message goes last: when it is received, everything before it
        // was performed, so its step skips the replay and no write is spent clearing it.
        sends.sort_by_key(|m| m.run_id == run.run_id);
        let continues = outbox_continues(&run.run_id, effects);
        if !sends.is_empty() {
            self.deps.queue.send(&sends).await?;
            failpoint::hit("effect.after_send")?;
        }
        Ok(continues)
    }
}
