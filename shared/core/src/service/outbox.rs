//! The transactional outbox's far side: a commit's effects performed (each idempotent) after
//! the commit, each on its own, the run's own next message last.
//!
//! One failing effect (a Scheduler throttle, a bus outage) holds back none of the others:
//! each is tried, what failed is *owed*. The outbox is narrowed to what is owed (indexed for
//! the sweep), then the run's next message goes, marked owed, so that its step performs
//! them again before it thinks and carries what still fails into its own commit. A waiting
//! run's step fails instead (its message comes back and tries once more); then the sweep
//! has them.

use super::Shared;
use crate::cta::Settlement;
use crate::error::PortError;
use crate::failpoint;
use crate::message::{Effect, StepMessage, outbox_continues};
use crate::observe::EffectsFailed;
use crate::ports::RunRecord;
use crate::run::Run;

/// The most effects a run may owe (each failed after its commit, carried by its steps) before
/// its steps wait for them: they ride in the run's item, which DynamoDB caps at 400 KB.
pub const MAX_OWED: usize = 256;

/// What performing an outbox left.
#[derive(Debug, Default)]
pub(super) struct Performed {
    /// Whether the outbox needs no clearing write: it ends with the run's own next message
    /// (which proves it performed), or it was narrowed to what is owed.
    pub settled: bool,
    /// The effects that failed, in their order: owed.
    pub owed: Vec<Effect>,
    /// The run's own next message, when it was asked for rather than sent
    /// (`Shared::perform_handing`): the caller delivers it in-process, or sends it.
    pub next: Option<StepMessage>,
}

impl Shared {
    /// Performs committed effects (each idempotent), then marks the outbox done, or narrows
    /// it to what failed. What is owed.
    pub(super) async fn perform(
        &self,
        run: &Run,
        effects: &[Effect],
    ) -> Result<Vec<Effect>, PortError> {
        Ok(self.perform_handing(run, effects, false).await?.owed)
    }

    /// `Shared::perform`, handing the run's own next message back (`hand_off`) instead
    /// of sending it when it is the only one: its step then runs in the same invocation
    /// ([`Steps::consume_in_a_row`]). It stands in the committed outbox, unsent: a crash
    /// before its step commits leaves it to the delivery before it, which finds it there
    /// and sends it (`perform_before_step`).
    pub(super) async fn perform_handing(
        &self,
        run: &Run,
        effects: &[Effect],
        hand_off: bool,
    ) -> Result<Performed, PortError> {
        if effects.is_empty() {
            return Ok(Performed::default());
        }
        let performed = self.perform_only_handing(run, effects, hand_off).await?;
        if !performed.settled {
            self.deps
                .store
                .clear_outbox(&run.run_id, run.version)
                .await?;
        }
        Ok(performed)
    }

    /// Performs committed effects (each idempotent, each on its own), leaving the outbox as
    /// it is when all succeed; when some fail, it is narrowed to them (and the run's own
    /// next message, marked owed) before that message is sent. An error is a crash, or the
    /// run's own next message (or the narrowing) failing: the outbox then stands whole.
    pub(super) async fn perform_only(
        &self,
        run: &Run,
        effects: &[Effect],
    ) -> Result<Performed, PortError> {
        self.perform_only_handing(run, effects, false).await
    }

    async fn perform_only_handing(
        &self,
        run: &Run,
        effects: &[Effect],
        hand_off: bool,
    ) -> Result<Performed, PortError> {
        if effects.is_empty() {
            return Ok(Performed {
                settled: true,
                ..Performed::default()
            });
        }
        let continues = outbox_continues(&run.run_id, effects);
        let (own, others): (Vec<&Effect>, Vec<&Effect>) = effects
            .iter()
            .partition(|e| matches!(e, Effect::Send(m) if m.run_id == run.run_id));
        let mut owed = Vec::new();
        let mut failures = Vec::new();
        // Other runs' messages and the bus's events first: a child's start, a question's
        // `cta.request`, which no timer should hold back.
        let sends: Vec<StepMessage> = others
            .iter()
            .filter_map(|e| match e {
                Effect::Send(m) => Some(m.clone()),
                _ => None,
            })
            .collect();
        if !sends.is_empty() {
            let sent = self.deps.queue.send(&sends).await;
            self.settle(
                sent,
                "effect.after_send",
                || sends.iter().cloned().map(Effect::Send).collect(),
                &mut owed,
                &mut failures,
            )
            .await?;
        }
        // A `cta.request` names its CTA and carries no answer link: a link is a bearer
        // credential, and whoever may add a rule to the bus could read it. Its owner mints
        // one through the API (`POST /ctas/{id}/link`).
        let events: Vec<_> = others
            .iter()
            .filter_map(|e| match e {
                Effect::Publish(ev) => Some(ev.clone()),
                _ => None,
            })
            .collect();
        if !events.is_empty() {
            let published = self.deps.bus.publish(&events).await;
            self.settle(
                published,
                "effect.after_publish",
                || events.iter().cloned().map(Effect::Publish).collect(),
                &mut owed,
                &mut failures,
            )
            .await?;
        }
        for e in others {
            if matches!(e, Effect::Send(_) | Effect::Publish(_)) {
                continue;
            }
            let (done, point) = self.perform_one(e).await;
            self.settle(done, point, || vec![e.clone()], &mut owed, &mut failures)
                .await?;
        }
        // The run's own next message goes last: when it is received, everything before it
        // was performed (or is owed, and it says so), so its step skips the replay and no
        // write is spent clearing it.
        let mut own: Vec<StepMessage> = own
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send(m) => Some(m.clone()),
                _ => None,
            })
            .collect();
        let settled = continues || !owed.is_empty();
        if !owed.is_empty() {
            self.report_effects_failed(run, &owed, &failures);
            for m in &mut own {
                m.owed = true;
            }
            let mut kept = owed.clone();
            kept.extend(own.iter().cloned().map(Effect::Send));
            let now = self.deps.clock.now();
            self.deps
                .store
                .keep_outbox(&run.run_id, run.version, &kept, now)
                .await?;
        }
        let mut next = None;
        if hand_off && own.len() == 1 {
            next = own.pop();
            failpoint::hit("effect.after_send")?;
        } else if !own.is_empty() {
            self.deps.queue.send(&own).await?;
            failpoint::hit("effect.after_send")?;
        }
        Ok(Performed {
            settled,
            owed,
            next,
        })
    }

    /// Performs one effect on its own: whether it was done, and the failpoint after it.
    async fn perform_one(&self, e: &Effect) -> (Result<(), PortError>, &'static str) {
        match e {
            Effect::Send(m) => (
                self.deps.queue.send(std::slice::from_ref(m)).await,
                "effect.after_send",
            ),
            Effect::Publish(ev) => (
                self.deps.bus.publish(std::slice::from_ref(ev)).await,
                "effect.after_publish",
            ),
            Effect::Timer {
                timer_id,
                run_id,
                at,
            } => (
                self.deps.scheduler.schedule(timer_id, run_id, *at).await,
                "effect.after_schedule",
            ),
            Effect::CancelTimer { timer_id } => (
                self.deps.scheduler.unschedule(timer_id).await,
                "effect.after_unschedule",
            ),
            Effect::ReleaseFollowUps {
                run_id,
                message_ids,
            } => (
                self.deps
                    .store
                    .release_follow_ups(run_id, message_ids)
                    .await,
                "",
            ),
            Effect::HoldFollowUps {
                run_id,
                message_ids,
            } => (
                self.deps.store.hold_follow_ups(run_id, message_ids).await,
                "",
            ),
            Effect::CancelCta { cta_id } => {
                let now = self.deps.clock.now();
                let settled = self
                    .deps
                    .store
                    .settle_cta(cta_id, &Settlement::Cancelled, now)
                    .await
                    .map(drop);
                (settled, "")
            }
        }
    }

    /// Performs effects that no commit holds (what an ignored message still asks,
    /// [`crate::engine::Decision::Ignore`]), each idempotent: the first that fails fails
    /// the delivery, which is retried and asks them again.
    pub(super) async fn perform_uncommitted(
        &self,
        run: &Run,
        effects: &[Effect],
    ) -> Result<(), PortError> {
        for e in effects {
            let (done, point) = self.perform_one(e).await;
            done.inspect_err(|err| {
                tracing::warn!(run_id = %run.run_id, error = %err, effect = effect_kind(e), "an ignored message's effect failed");
            })?;
            if !point.is_empty() {
                crate::failpoint::hit(point)?;
            }
        }
        Ok(())
    }

    /// What a step delivering `msg` does first with its run's outbox, as `record` holds it:
    /// performs it if `msg` is not one of its sends (a crash or a failure left it), or what
    /// it owes if `msg` says so (`StepMessage::owed`); adds what still fails to `owed`, which
    /// the step's commit carries. Past [`MAX_OWED`] the step fails, to be retried: the run
    /// waits rather than its item growing.
    pub(super) async fn perform_before_step(
        &self,
        record: &RunRecord,
        msg: &StepMessage,
        owed: &mut Vec<Effect>,
    ) -> Result<(), PortError> {
        if record.outbox.is_empty() {
            return Ok(());
        }
        let left = if !sent_by(&record.outbox, msg) {
            self.perform(&record.run, &record.outbox).await?
        } else if msg.owed {
            // Sent from an outbox narrowed to what failed: those, again.
            let rest: Vec<Effect> = record
                .outbox
                .iter()
                .filter(|e| !matches!(e, Effect::Send(m) if m.run_id == msg.run_id))
                .cloned()
                .collect();
            self.perform(&record.run, &rest).await?
        } else {
            Vec::new()
        };
        for e in left {
            if !owed.contains(&e) {
                owed.push(e);
            }
        }
        if owed.len() > MAX_OWED {
            return Err(PortError::Unavailable {
                message: format!(
                    "{} effects are owed (the first: {}); the run waits until they can be performed",
                    owed.len(),
                    effect_kind(&owed[0])
                ),
                source: None,
            });
        }
        Ok(())
    }

    /// What one effect's attempt leaves: on success, its failpoint passed (a crash there is
    /// an error); on failure, the effect owed and the failure kept for the report (a
    /// crash is an error).
    async fn settle(
        &self,
        done: Result<(), PortError>,
        point: &str,
        effects: impl FnOnce() -> Vec<Effect>,
        owed: &mut Vec<Effect>,
        failures: &mut Vec<String>,
    ) -> Result<(), PortError> {
        match done {
            Ok(()) if point.is_empty() => Ok(()),
            Ok(()) => failpoint::hit(point),
            Err(e) if failpoint::is_crash(&e) => Err(e),
            Err(e) => {
                owed.extend(effects());
                failures.push(e.to_string());
                Ok(())
            }
        }
    }

    /// Tells the observers (and the log) that effects of `run`'s last commit failed.
    fn report_effects_failed(&self, run: &Run, owed: &[Effect], failures: &[String]) {
        let failed = EffectsFailed {
            run_id: run.run_id.clone(),
            agent: run.agent.clone(),
            kinds: owed.iter().map(effect_kind).collect(),
            error: failures.join("; "),
            at: self.deps.clock.now(),
        };
        tracing::warn!(run_id = %run.run_id, kinds = ?failed.kinds, error = %failed.error, "effects failed after their commit: owed, performed again by the run's next step or the sweep");
        for o in &self.observers {
            o.effects_failed(&failed);
        }
    }
}

/// An effect's kind, as metrics and logs name it.
pub(super) fn effect_kind(e: &Effect) -> &'static str {
    match e {
        Effect::Send(_) => "send",
        Effect::Publish(_) => "publish",
        Effect::Timer { .. } => "timer",
        Effect::CancelTimer { .. } => "cancel_timer",
        Effect::ReleaseFollowUps { .. } => "release_follow_ups",
        Effect::HoldFollowUps { .. } => "hold_follow_ups",
        Effect::CancelCta { .. } => "cancel_cta",
    }
}

/// Whether `msg` is one of this outbox's sends: then the outbox was performed in full, or
/// what was not is owed (`msg.owed`: the outbox was narrowed to it).
pub(super) fn sent_by(outbox: &[Effect], msg: &StepMessage) -> bool {
    outbox
        .iter()
        .any(|e| matches!(e, Effect::Send(m) if m.id == msg.id && m.run_id == msg.run_id))
}
