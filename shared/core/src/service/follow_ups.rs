//! Follow-up turns (`POST /runs/{id}/messages`): admitted beside the run item, then queued
//! for the run's one writer, which starts each turn in order.

use super::{FollowUp, Requests, ServiceError, Trigger};
use crate::message::{Input, StepMessage};
use crate::run::{MAX_RUN_CONTEXT_BYTES, Run};
use crate::timeline::TurnOptions;

/// How long after its admission a follow-up that its run does not hold gives back its
/// place under the cap: its request died before sending it (the send comes within the
/// request, and its run takes it up within seconds of it).
pub const UNSENT_AFTER: chrono::Duration = chrono::Duration::minutes(15);

impl Requests {
    /// Queues a follow-up user turn. On a finished run it starts the next turn; while a
    /// turn is under way, or when another follow-up has claimed the finished run's next
    /// turn, it waits for the turn before it to end (the run keeps it as a `queued` entry).
    /// Answers the run as it was and whether the message waits.
    ///
    /// With an idempotency key the message's id derives from it, so a client's retry never
    /// duplicates the turn: the run applies a message id once.
    pub async fn post_message(
        &self,
        owner: &str,
        run_id: &str,
        message: FollowUp,
        idempotency_key: Option<&str>,
    ) -> Result<(Run, bool), ServiceError> {
        let (text, trigger) = turn_text(message.text, message.trigger)?;
        let options = TurnOptions {
            tier: message.tier,
            visible: message.visible,
            trigger,
        };
        let run = self.owned_run(owner, run_id).await?;
        if run.status.is_final() {
            return Err(ended(&run));
        }
        let message_id = match idempotency_key {
            Some(key) => {
                let name = format!("{}/{owner}/{run_id}/{key}", key.len());
                let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes());
                format!("msg_{}", id.simple())
            }
            None => format!("msg_{}", uuid::Uuid::new_v4().simple()),
        };
        // The cap holds where the message is admitted: one conditional write, which any
        // number of concurrent posts race for (a read of `run.queued` could not: only the
        // run's writer updates it, after the messages have been taken).
        let cap = crate::run::MAX_QUEUED;
        let now = self.shared.deps.clock.now();
        if !self
            .shared
            .deps
            .store
            .admit_follow_up(run_id, &message_id, cap, now, now - UNSENT_AFTER)
            .await?
        {
            return Err(ServiceError::Conflict {
                code: "queue_full",
                message: format!(
                    "{cap} follow-up messages already wait for this run's turn; post again once it has taken some up"
                ),
            });
        }
        // Should the process die from here to the send, the place is given back by the rule
        // above: a follow-up the run does not hold, admitted `UNSENT_AFTER` ago.
        crate::failpoint::hit("message.after_admit")?;
        if message.watch {
            self.expect_watcher(run_id).await?;
        }
        let sent = self
            .claim_and_send(&run, message_id.clone(), text, options)
            .await;
        if sent.is_err() {
            // Not sent: its place is free again (best effort; the error is what counts).
            let _ = self
                .shared
                .deps
                .store
                .release_follow_ups(run_id, &[message_id])
                .await;
        }
        let queued = sent?;
        crate::failpoint::hit("message.after_queue")?;
        Ok((run, queued))
    }

    /// Whether `a` admits a run of `owner` as its figures read now: the day's spending under
    /// its allowance, a free active-run slot; refused as [`RunWrites::create_run`] refuses.
    ///
    /// [`RunWrites::create_run`]: crate::ports::Store::create_run
    async fn admissible_now(
        &self,
        owner: &str,
        a: &crate::ports::Admission,
    ) -> Result<(), ServiceError> {
        let store = &self.shared.deps.store;
        if let Some(cost) = &a.daily_cost {
            let spent_usd = store.spent_on(owner, cost.day).await?;
            if spent_usd >= cost.limit_usd {
                return Err(crate::error::PortError::DailyCostExceeded {
                    limit_usd: cost.limit_usd,
                    spent_usd,
                }
                .into());
            }
        }
        if let Some(limit) = a.active_runs {
            let current = store.active_runs(owner).await?;
            if current >= u64::from(limit) {
                return Err(crate::error::PortError::QuotaExceeded {
                    limit: limit.into(),
                    current,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Sends an admitted follow-up to its run: whether it waits (see `post_message`).
    async fn claim_and_send(
        &self,
        run: &Run,
        message_id: String,
        text: String,
        options: TurnOptions,
    ) -> Result<bool, ServiceError> {
        let run_id = run.run_id.as_str();
        // On a finished run, the first follow-up to claim its next turn starts it; the others
        // wait. A claim whose message never reached the queue (its request died in between)
        // stops counting after a step's longest budget.
        if run.status.is_terminal()
            && run.origin.parent.is_none()
            && let Some(admission) = self.shared.admission()
        {
            // Its next turn makes it active again: refused now if its owner's quotas would
            // refuse a run as they read now. What holds is the commit that starts the turn,
            // which takes the active-run slot only while one is free (and refuses the
            // follow-up in the timeline otherwise): nothing is taken before the send, so
            // nothing is left held should the request die before it.
            self.admissible_now(&run.owner, &admission).await?;
        }
        // A run waiting on drafted plans alone takes a follow-up at once, as the
        // answer to them (`baton-engine`'s `engine/plan/held.rs`).
        let answers_drafts = run.outcome.state.as_deref() == Some("waiting_on_user")
            && run
                .outcome
                .state_detail
                .as_ref()
                .is_some_and(|d| d["draftPlans"] == serde_json::json!(true));
        let queued = if run.status.is_terminal() {
            let now = self.shared.deps.clock.now();
            let stale = now - chrono::Duration::minutes(15);
            let claimed = self
                .shared
                .deps
                .store
                .claim_turn(run_id, &message_id, now, stale)
                .await?;
            crate::failpoint::pass("message.after_claim").await?;
            !claimed
        } else {
            !answers_drafts
        };
        // The queue's id names the message and the run's version it was posted at: a
        // retry (same `Idempotency-Key`) posted after the first one's turn has ended is
        // not a duplicate to the queue (SQS FIFO drops one for five minutes), so it reaches
        // the run, which applies nothing twice and gives back the slot taken for it.
        self.shared
            .deps
            .queue
            .send(&[StepMessage {
                run_id: run_id.into(),
                id: format!("{message_id}.{}", run.version),
                input: Input::UserMessage {
                    text,
                    message_id,
                    reply_to: None,
                    options,
                },
                owed: false,
            }])
            .await?;
        Ok(queued)
    }
}

/// The text a follow-up turn starts with: the person's, or for a trigger a note of what
/// started it and its data (what the model is given), with the trigger's name.
fn turn_text(
    text: Option<String>,
    trigger: Option<Trigger>,
) -> Result<(String, Option<String>), ServiceError> {
    let invalid = |m: String| Err(ServiceError::Invalid(m));
    match (text, trigger) {
        (Some(text), None) => Ok((text, None)),
        (None, Some(Trigger { name, data })) => {
            let named = (1..=64).contains(&name.len())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c));
            if !named {
                return invalid("`trigger.name` must be 1 to 64 letters, digits or `._:/-`".into());
            }
            let data = data
                .filter(|d| !d.is_null())
                .map(|d| d.to_string())
                .unwrap_or_default();
            if data.len() > MAX_RUN_CONTEXT_BYTES {
                return invalid(format!(
                    "`trigger.data` is {} bytes as JSON; at most {MAX_RUN_CONTEXT_BYTES} are allowed",
                    data.len()
                ));
            }
            let mut text = format!(
                "No one wrote this turn: the trigger `{name}` started it. Continue the work it \
                 calls for."
            );
            if !data.is_empty() {
                text.push_str(&format!("\nTrigger data: {data}"));
            }
            Ok((text, Some(name)))
        }
        _ => invalid("give exactly one of `text` and `trigger`".into()),
    }
}

/// The refusal of a follow-up to a run that ended for good, saying how to go on.
fn ended(run: &Run) -> ServiceError {
    ServiceError::Conflict {
        code: "run_ended",
        message: format!(
            "the run ended ({}) and takes no follow-up: fork it (POST /runs/{}/fork) or start a new run (POST /runs)",
            run.status.as_str(),
            run.run_id
        ),
    }
}
