//! The step side: what queue consumers ask of the service. One message in, one conditional
//! commit, then the committed effects out (the transactional outbox).

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use tracing::{debug, info, warn};

use super::cache::{Window, approx_bytes, at_a_persons_pace};
use super::step_world::StepWorld;
use super::{Handled, StepError, Steps};
use crate::agent::Listed;
use crate::engine::{self, Decision};
use crate::error::PortError;
use crate::failpoint;
use crate::message::{ChildOutcome, Effect, Input, StepMessage};
use crate::ports::RunRecord;
use crate::run::{Run, RunStatus};

/// How many more times a commit holding a model's reply is tried when the store is
/// unavailable for a moment (a throttle past the SDK's own retries, an outage), and the first
/// wait (doubling): the reply is not thrown away for want of a write that may go through.
const REPLY_COMMIT_RETRIES: u32 = 4;
const REPLY_COMMIT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);
/// Version conflicts running (other writers' commits: children reporting, answers) a step
/// reads its run again for before it gives up and is redelivered, and how many when it
/// holds a reply not yet committed.
const CONFLICTS: u32 = 3;
const CONFLICTS_WITH_A_REPLY: u32 = 10;

/// A dead-lettered step message ends its run once this many of its deliveries failed in
/// its own step (the queues' `maxReceiveCount` is 8).
pub const GIVE_UP_AFTER_FAILURES: u32 = 4;
/// The error code of a run ended because its step message was dead-lettered.
pub const DEAD_LETTER_CODE: &str = "dead_letter";
/// How many times a dead letter whose deliveries mostly never started is sent back.
pub const MAX_REQUEUES: u32 = 2;
/// How many times a dead letter whose last failure was the model provider's is sent back
/// (a provider outage): on AWS each round is about 45 minutes of retries (8 receives), so
/// about three days of outage before its run fails.
pub const MAX_OUTAGE_REQUEUES: u32 = 96;

impl Steps {
    /// Handles one step message: re-hydrate, step, commit, perform the effects.
    ///
    /// A terminal error (one that no redelivery can cure: broken stored data, an item the
    /// store refuses) ends the run as failed with that error at once, and then counts as
    /// handled. Only a retryable error, or a run that cannot even be failed, is returned.
    pub async fn handle(&self, msg: &StepMessage) -> Result<Handled, StepError> {
        self.handle_within(msg, None).await
    }

    /// [`Steps::handle`] in an invocation that ends at `deadline`: a step whose tool calls
    /// do not fit in the time left stops before running any ([`StepError::OutOfTime`]).
    pub async fn handle_within(
        &self,
        msg: &StepMessage,
        deadline: Option<super::StepDeadline>,
    ) -> Result<Handled, StepError> {
        self.handle_handing(msg, deadline, None).await
    }

    /// [`Steps::handle_within`], with the run's own next message put in `next` rather than
    /// sent, when there is one to hand off (see [`Steps::consume_in_a_row`]).
    pub(super) async fn handle_handing(
        &self,
        msg: &StepMessage,
        deadline: Option<super::StepDeadline>,
        next: Option<&mut Option<StepMessage>>,
    ) -> Result<Handled, StepError> {
        match self.step(msg, deadline, next).await {
            Err(e) if !e.is_retryable() && !matches!(msg.input, Input::Fail { .. }) => {
                warn!(run_id = %msg.run_id, message = %msg.id, error = %e, "terminal step error; failing the run");
                self.fail_now(msg, "step_error", &e.to_string()).await
            }
            other => other,
        }
    }

    /// Ends `msg`'s run as failed, from the consumer that holds its queue group.
    async fn fail_now(
        &self,
        msg: &StepMessage,
        code: &str,
        message: &str,
    ) -> Result<Handled, StepError> {
        let fail = StepMessage {
            run_id: msg.run_id.clone(),
            id: format!("{}:{code}", msg.id),
            input: Input::Fail {
                code: code.into(),
                message: message.into(),
            },
            owed: false,
        };
        self.step(&fail, None, None).await
    }

    /// One delivery of `msg`: decide, commit, perform; decide again from each checkpoint the
    /// engine commits on the way ([`Decision::Checkpoint`]: a reply before its calls run, a
    /// call's start or output before the next), with the I/O gathered so far; re-hydrate and
    /// decide again after a conflict, keeping a reply its run has not committed.
    async fn step(
        &self,
        msg: &StepMessage,
        deadline: Option<super::StepDeadline>,
        mut next: Option<&mut Option<StepMessage>>,
    ) -> Result<Handled, StepError> {
        let started = self.shared.deps.clock.now();
        // Boxed, as what a checkpoint holds: the step's future stays small to move.
        let mut io: Option<Box<engine::Io>> = None;
        // What this delivery's last checkpoint committed: the next decision starts there.
        let mut held: Option<Box<Hydrated>> = None;
        let mut last: Option<(RunStatus, u64)> = None;
        let mut conflicts = 0;
        // Effects an earlier commit left undone (a failed perform's): carried into this
        // step's commit, so that none is lost when its outbox is replaced.
        let mut owed: Vec<Effect> = Vec::new();
        loop {
            let fresh = held.is_none();
            let hydrated = match held.take() {
                Some(h) => *h,
                None => match self.hydrate(&msg.run_id, &msg.input).await? {
                    Some(h) => h,
                    None => return self.handle_unknown_run(msg).await,
                },
            };
            let Hydrated { record, window } = hydrated;
            if fresh {
                self.shared
                    .perform_before_step(&record, msg, &mut owed)
                    .await?;
            }
            let run = record.run;
            let listed = self.list_tools(&run).await;
            let world = StepWorld {
                deps: &self.shared.deps,
                catalog: &self.shared.catalog,
                daily_cost_usd: self.shared.quotas.daily_cost_usd,
                live: self.shared.live_for(&run),
                longest_think: self.longest_think(),
                run: &run,
                window: &window,
                read: std::sync::OnceLock::new(),
                book: self.shared.catalog.book(&listed),
                listed,
                deadline,
                plugin_states: Default::default(),
            };
            // The step's book (the MCP servers' listings) is taken once, by its first pass.
            let io = io.get_or_insert_with(|| {
                Box::new(engine::Io {
                    owner: engine::OwnerQuotas {
                        active_runs: self.shared.quotas.active_runs,
                        daily_spend: self.shared.quotas.daily_cost_usd.is_some(),
                    },
                    ..engine::Io::new(world.book.clone())
                })
            });
            let now = self.shared.deps.clock.now();
            let timeline = &window.entries;
            let decision = engine::decide(now, &run, timeline, &msg.input, &world, io).await?;
            // What a think read of the history for the model: cached from now on.
            let window = world.read.into_inner().unwrap_or(window);
            let (mut transition, marked) = match decision {
                Decision::Commit(t) => (t, None),
                Decision::Checkpoint(t, marked) => (t, Some(marked)),
                Decision::Ignore { reason, effects } => {
                    self.cache_put(&run.run_id, run.version, window);
                    if let Some((status, version)) = last {
                        // Stale once its own checkpoint took it: what committed stands.
                        return Ok(Handled::Committed { status, version });
                    }
                    debug!(run_id = %run.run_id, message = %msg.id, %reason, "ignored");
                    self.shared.perform_uncommitted(&run, &effects).await?;
                    return Ok(Handled::Ignored(reason));
                }
            };
            if !owed.is_empty() {
                transition.effects.splice(0..0, owed.iter().cloned());
            }
            crate::failpoint::hit("step.before_commit")?;
            // Where the store is the queue, a step that only sends messages (a child's
            // start, a parent's notice) sends them with its commit: nothing is left to
            // perform after it. A run's own next message alone, to be handed over
            // in-process (`next`), stands in the commit's outbox instead: no queue is written.
            let handing = next.is_some()
                && matches!(&transition.effects[..], [Effect::Send(m)] if m.run_id == run.run_id);
            let sending = self.shared.deps.sending_store.as_ref().filter(|_| {
                !handing
                    && !transition.effects.is_empty()
                    && transition
                        .effects
                        .iter()
                        .all(|e| matches!(e, Effect::Send(_)))
            });
            let sent = sending.is_some();
            // A reply is paid for: a commit of one that the store turns away for now (a
            // throttle, an outage) is tried again here, the reply in hand, while the
            // invocation has the time.
            let paid = transition
                .appended
                .iter()
                .any(|e| matches!(e.body, crate::timeline::EntryBody::Assistant { .. }));
            let mut tries = 0;
            let committed = loop {
                let committed = match sending {
                    Some(store) => store.commit_sending(run.version, &transition).await,
                    None => {
                        self.shared
                            .deps
                            .store
                            .commit(run.version, &transition)
                            .await
                    }
                };
                let wait = REPLY_COMMIT_BACKOFF * 2u32.pow(tries);
                let time = deadline.is_none_or(|d| d.left() > wait + REPLY_COMMIT_BACKOFF);
                match committed {
                    Err(e)
                        if paid
                            && time
                            && tries < REPLY_COMMIT_RETRIES
                            && e.is_unavailable()
                            && !failpoint::is_crash(&e) =>
                    {
                        warn!(run_id = %run.run_id, error = %e, "a reply's commit failed; trying again with the reply in hand");
                        tries += 1;
                        tokio::time::sleep(wait).await;
                    }
                    committed => break committed,
                }
            };
            match committed {
                Ok(()) => {
                    // What was owed is this commit's outbox now.
                    owed.clear();
                    if transition
                        .appended
                        .iter()
                        .any(|e| matches!(e.body, crate::timeline::EntryBody::Assistant { .. }))
                    {
                        // A reply is in, with its calls: no failure asks for it again.
                        crate::failpoint::pass("step.after_think").await?;
                    }
                    crate::failpoint::pass("step.after_commit").await?;
                    let mut window = window;
                    transition.apply(&mut window.entries);
                    let (status, version) = (transition.run.status, transition.run.version);
                    window.bytes +=
                        approx_bytes(&transition.appended) + approx_bytes(&transition.updated);
                    info!(run_id = %run.run_id, version, status = status.as_str(), checkpoint = marked.is_some(), "step committed");
                    // Watchers that cannot stream the timeline are handed what committed.
                    if let Some(live) = self
                        .shared
                        .live_for(&transition.run)
                        .filter(|l| l.carries_committed())
                    {
                        live.publish(crate::live::committed(&transition));
                    }
                    self.shared.report(&run, &msg.input, &transition, started);
                    let transition = *transition;
                    let Some(marked) = marked else {
                        // A run left to a person (a question, or ended until a follow-up)
                        // keeps no window in memory: its next step comes at a person's pace
                        // and reads it back, so a million such runs hold none.
                        if !at_a_persons_pace(&transition.run) {
                            let window = self.kept(&transition.run, window);
                            self.cache_put(&run.run_id, version, window);
                        }
                        if !sent {
                            let performed = self
                                .shared
                                .perform_handing(
                                    &transition.run,
                                    &transition.effects,
                                    next.is_some(),
                                )
                                .await?;
                            if let Some(slot) = next.as_deref_mut() {
                                *slot = performed.next;
                            }
                            let owed = performed.owed;
                            // A waiting run has no next message to carry what it owes (a
                            // child's start, a timer): its step fails, so that its message
                            // comes back after its backoff and performs them once more (that
                            // delivery is stale, and is then let go: the sweep has the rest).
                            if !owed.is_empty()
                                && !crate::message::outbox_continues(
                                    &run.run_id,
                                    &transition.effects,
                                )
                            {
                                // (Each failure is logged and counted where it happened.)
                                return Err(StepError::Port(PortError::Unavailable {
                                    message: format!(
                                        "{} effects of a committed step failed and are owed (the first: {})",
                                        owed.len(),
                                        super::outbox::effect_kind(&owed[0])
                                    ),
                                    source: None,
                                }));
                            }
                        }
                        return Ok(Handled::Committed { status, version });
                    };
                    // A checkpoint: its effects now (the next commit replaces its outbox,
                    // so none is cleared), then on from what it committed.
                    if !sent {
                        owed = self
                            .shared
                            .perform_only(&transition.run, &transition.effects)
                            .await?
                            .owed;
                    }
                    io.marked.extend(marked);
                    crate::failpoint::pass("step.after_checkpoint").await?;
                    last = Some((status, version));
                    held = Some(Box::new(Hydrated {
                        record: RunRecord {
                            run: transition.run,
                            outbox: transition.effects,
                        },
                        window,
                    }));
                }
                Err(PortError::QuotaExceeded { limit, current })
                    if transition.slot_limit.is_some() && io.turn_refused.is_none() =>
                {
                    // No slot for the follow-up's turn: decided again, refusing it.
                    debug!(run_id = %run.run_id, limit, current, "no active-run slot for a follow-up's turn");
                    io.turn_refused = Some(format!(
                        "its owner already has {current} active runs, the most allowed ({limit}); post it again once one has ended"
                    ));
                }
                Err(PortError::Conflict) => {
                    io.turn_refused = None;
                    debug!(run_id = %run.run_id, "version moved; re-hydrating");
                    conflicts += 1;
                    // A step with a reply in hand reads the run again longer, pausing a
                    // little more each time, while the invocation has the time: given up,
                    // the reply would be paid for again.
                    let pause = REPLY_COMMIT_BACKOFF * conflicts;
                    let keep = paid
                        && conflicts < CONFLICTS_WITH_A_REPLY
                        && deadline.is_none_or(|d| d.left() > pause + REPLY_COMMIT_BACKOFF);
                    if conflicts >= CONFLICTS && !keep {
                        return Err(StepError::Contended(msg.run_id.clone()));
                    }
                    if paid {
                        tokio::time::sleep(pause).await;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Lists the MCP servers the run's agent uses (those not listed yet), then takes the
    /// step's snapshot of every listing: the engine never lists a server.
    async fn list_tools(&self, run: &Run) -> Listed {
        if let Some(agent) = self.shared.catalog.agent(&run.agent) {
            self.shared
                .catalog
                .list_servers_for(agent, &agent.granted(run), &run.scope())
                .await;
        }
        self.shared.catalog.listed()
    }

    /// A message for a run that does not exist: tell a parent that tried to continue it.
    async fn handle_unknown_run(&self, msg: &StepMessage) -> Result<Handled, StepError> {
        if let Input::UserMessage {
            reply_to: Some(link),
            ..
        } = &msg.input
        {
            self.shared
                .deps
                .queue
                .send(&[StepMessage {
                    run_id: link.run_id.clone(),
                    id: format!("{}:unknown", msg.id),
                    input: Input::ChildFinished {
                        child_run_id: msg.run_id.clone(),
                        tool_call_id: link.tool_call_id.clone(),
                        outcome: ChildOutcome::Ended {
                            code: None,
                            status: RunStatus::Failed,
                            error: "there is no subagent with this id".into(),
                        },
                        spent: Default::default(),
                        breakdown: vec![],
                    },
                    owed: false,
                }])
                .await?;
        }
        Ok(Handled::Ignored(format!("no run `{}`", msg.run_id)))
    }

    /// A message that failed too often: end its run as failed, so nothing is left waiting.
    ///
    /// Unless the run has moved past it: a dead letter the engine would ignore anyway (a
    /// stale continue, an answer or a child result already applied, a redelivered start)
    /// says nothing about the run's present state, which it must not fail.
    pub async fn dead_letter(&self, msg: &StepMessage, reason: &str) -> Result<Handled, StepError> {
        if let Some((rec, timeline)) = self.shared.deps.store.load(&msg.run_id).await? {
            let now = self.shared.deps.clock.now();
            let io = engine::Io {
                book: self.shared.catalog.book(&self.shared.catalog.listed()),
                ..engine::Io::default()
            };
            if let engine::Step::Ignore(why) =
                engine::step(now, &rec.run, &timeline, &msg.input, &io)
            {
                // What the run committed is performed all the same (idempotent).
                if !rec.outbox.is_empty() && !super::outbox::sent_by(&rec.outbox, msg) {
                    self.shared.perform(&rec.run, &rec.outbox).await?;
                }
                info!(run_id = %msg.run_id, message = %msg.id, %why, "stale dead letter ignored");
                return Ok(Handled::Ignored(format!("a stale dead letter: {why}")));
            }
        }
        // The root cause is the last error a delivery recorded, when there is one.
        let last = match self.shared.deps.store.get_run(&msg.run_id).await? {
            Some(rec) => rec.run.outcome.last_error,
            None => None,
        };
        // SQS counts every receive, deferrals behind other records of its run included: a
        // message most of whose deliveries never started its step goes back to its queue,
        // at most MAX_REQUEUES times (a crash loop, which records no failures, ends too).
        let (id, requeues) = crate::message::requeued(&msg.id);
        let own = last
            .as_ref()
            .filter(|l| l.message_id.as_deref() == Some(id))
            .map_or(0, |l| l.failures);
        // A provider outage is no fault of the run's: while its last failure is the model
        // provider's, the message goes back to wait for it, round after round of retries
        // (each round's first delivery takes a step at once if the provider answers).
        let outage = last
            .as_ref()
            .is_some_and(|l| l.provider && l.message_id.as_deref() == Some(id));
        // Sent back under an id of its own (a FIFO queue drops a copy of one it holds).
        let requeue = async || {
            let again = StepMessage {
                id: format!("{id}#r{}", requeues + 1),
                ..msg.clone()
            };
            self.shared
                .deps
                .queue
                .send(std::slice::from_ref(&again))
                .await
        };
        if outage && requeues < MAX_OUTAGE_REQUEUES {
            requeue().await?;
            warn!(run_id = %msg.run_id, message = %msg.id, requeues, "dead letter sent back to its queue: the model provider is failing, not the run");
            return Ok(Handled::Ignored(format!(
                "sent back to its queue: the model provider is failing ({} of {MAX_OUTAGE_REQUEUES} rounds)",
                requeues + 1
            )));
        }
        if own < GIVE_UP_AFTER_FAILURES && requeues < MAX_REQUEUES {
            requeue().await?;
            info!(run_id = %msg.run_id, message = %msg.id, own, "dead letter sent back to its queue: its deliveries were mostly deferred");
            return Ok(Handled::Ignored(format!(
                "sent back to its queue ({own} of its deliveries failed)"
            )));
        }
        warn!(run_id = %msg.run_id, message = %msg.id, reason, own, "dead-lettered");
        let message = match last {
            Some(l) => format!("{} (gave up: {reason})", l.message),
            None => format!("a step message could not be processed: {reason}"),
        };
        self.fail_now(msg, DEAD_LETTER_CODE, &message).await
    }

    /// Records on the run why a delivery of `msg` (started at `started`) failed and how
    /// many there were, so that the API shows a retrying step's trouble (`lastError`) while
    /// it retries, and tells the observers. Best effort: a store that cannot take this write
    /// cannot take the step either.
    pub async fn note_failure(
        &self,
        msg: &StepMessage,
        attempts: u32,
        error: &StepError,
        started: DateTime<Utc>,
    ) {
        let (id, _) = crate::message::requeued(&msg.id);
        let before = match self.shared.deps.store.get_run(&msg.run_id).await {
            Ok(Some(rec)) => {
                self.shared
                    .report_failure(&rec.run, msg, attempts, error, started);
                rec.run.outcome.last_error
            }
            _ => None,
        };
        let failures = before
            .filter(|l| l.message_id.as_deref() == Some(id))
            .map_or(0, |l| l.failures)
            + 1;
        let failure = crate::run::LastError {
            message: error.to_string(),
            attempts,
            at: self.shared.deps.clock.now(),
            message_id: Some(id.to_owned()),
            failures,
            provider: matches!(
                error,
                StepError::Llm(crate::llm::LlmError::Unavailable { .. })
            ),
        };
        if let Err(e) = self
            .shared
            .deps
            .store
            .record_failure(&msg.run_id, &failure)
            .await
        {
            warn!(run_id = %msg.run_id, error = %e, "recording the step's failure failed");
        }
    }

    /// The run and what a step for `input` reads of its timeline: the cached timeline when
    /// it is at the run's version and reaches back far enough, else the entries from
    /// [`engine::window_start`] on, from the store (a bounded read, whatever the run's
    /// length, for every input of the loop).
    async fn hydrate(&self, run_id: &str, input: &Input) -> Result<Option<Hydrated>, PortError> {
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(run_id);
        if let Some((version, window)) = cached {
            let Some(record) = self.shared.deps.store.get_run(run_id).await? else {
                return Ok(None);
            };
            if version == record.run.version
                && window.base <= engine::window_start(&record.run, input)
            {
                self.warm_steps.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(Hydrated { record, window }));
            }
        }
        self.cold_steps.fetch_add(1, Ordering::Relaxed);
        let window = |run: &crate::run::Run| engine::window_start(run, input);
        let Some((record, timeline, base)) =
            self.shared.deps.store.load_window(run_id, &window).await?
        else {
            return Ok(None);
        };
        let window = Window::new(base, timeline, None);
        Ok(Some(Hydrated { record, window }))
    }
}

/// What a step starts from: the run, and what it holds of its timeline.
struct Hydrated {
    record: RunRecord,
    window: Window,
}
