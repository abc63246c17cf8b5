//! The step side: what queue consumers ask of the service. One message in, one conditional
//! commit, then the committed effects out (the transactional outbox).

use std::sync::atomic::Ordering;

use serde_json::Value;
use tracing::{debug, info, warn};

use super::cache::approx_bytes;
use super::{Handled, Service, StepError};
use crate::cta::Settlement;
use crate::engine::{self, Decision, Execution, StepIo};
use crate::error::PortError;
use crate::llm::{ChatRequest, LlmError, LlmReply};
use crate::message::{ChildOutcome, Effect, Input, StepMessage, outbox_continues};
use crate::ports::RunRecord;
use crate::run::{Run, RunStatus};
use crate::timeline::Entry;
use crate::tools::ToolKind;

impl Service {
    /// Handles one step message: re-hydrate, step, commit, perform the effects.
    ///
    /// A terminal error (one that no redelivery can cure: broken stored data, an item the
    /// store refuses) ends the run as failed with that error at once, and then counts as
    /// handled. Only a retryable error, or a run that cannot even be failed, is returned.
    pub async fn handle(&self, msg: &StepMessage) -> Result<Handled, StepError> {
        match self.step(msg).await {
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
        };
        self.step(&fail).await
    }

    async fn step(&self, msg: &StepMessage) -> Result<Handled, StepError> {
        for _ in 0..3 {
            let Some((record, timeline, bytes)) = self.hydrate(&msg.run_id).await? else {
                return self.handle_unknown_run(msg).await;
            };
            if !record.outbox.is_empty() && !sent_by(&record.outbox, msg) {
                self.perform(&record.run, &record.outbox).await?;
            }
            let run = record.run;
            let world = Thinker {
                service: self,
                run: &run,
                timeline: &timeline,
            };
            let now = self.deps.clock.now();
            let decision = engine::decide(&self.catalog, now, &run, &timeline, &msg.input, &world)
                .await
                .map_err(StepError::Llm)?;
            let transition = match decision {
                Decision::Commit(t) => t,
                Decision::Ignore(reason) => {
                    debug!(run_id = %run.run_id, message = %msg.id, %reason, "ignored");
                    self.cache_put(&run.run_id, run.version, timeline, bytes);
                    return Ok(Handled::Ignored(reason));
                }
            };
            match self.deps.store.commit(run.version, &transition).await {
                Ok(()) => {
                    let mut timeline = timeline;
                    transition.apply(&mut timeline);
                    let (status, version) = (transition.run.status, transition.run.version);
                    let bytes = bytes
                        + approx_bytes(&transition.appended)
                        + approx_bytes(&transition.updated);
                    self.cache_put(&run.run_id, version, timeline, bytes);
                    info!(run_id = %run.run_id, version, status = status.as_str(), "step committed");
                    self.perform(&transition.run, &transition.effects).await?;
                    return Ok(Handled::Committed { status, version });
                }
                Err(PortError::Conflict) => {
                    debug!(run_id = %run.run_id, "version moved; re-hydrating");
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(StepError::Contended(msg.run_id.clone()))
    }

    async fn think(
        &self,
        run: &Run,
        timeline: &[Entry],
        think_index: u32,
    ) -> Result<LlmReply, LlmError> {
        let agent = self
            .catalog
            .agent(&run.agent)
            .ok_or_else(|| LlmError::Fatal(format!("agent `{}` is not defined", run.agent)))?;
        let request = ChatRequest {
            run_id: &run.run_id,
            agent: &agent.name,
            think_index,
            model: agent.model.as_deref(),
            system: &agent.system,
            tools: self.catalog.specs(&agent.name),
            history: timeline,
        };
        let reply = self.deps.llm.complete(&request).await;
        if let Err(LlmError::Fatal(message)) = &reply {
            warn!(run_id = %run.run_id, %message, "model call failed for good");
        }
        reply
    }

    /// A message for a run that does not exist: tell a parent that tried to continue it.
    async fn handle_unknown_run(&self, msg: &StepMessage) -> Result<Handled, StepError> {
        if let Input::UserMessage {
            reply_to: Some(link),
            ..
        } = &msg.input
        {
            self.deps
                .queue
                .send(&[StepMessage {
                    run_id: link.run_id.clone(),
                    id: format!("{}:unknown", msg.id),
                    input: Input::ChildFinished {
                        child_run_id: msg.run_id.clone(),
                        tool_call_id: link.tool_call_id.clone(),
                        outcome: ChildOutcome::Ended {
                            status: RunStatus::Failed,
                            error: "there is no subagent with this id".into(),
                        },
                    },
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
        if let Some((rec, timeline)) = self.deps.store.load(&msg.run_id).await? {
            let now = self.deps.clock.now();
            let io = engine::Io::default();
            if let engine::Step::Ignore(why) =
                engine::step(&self.catalog, now, &rec.run, &timeline, &msg.input, &io)
            {
                // What the run committed is performed all the same (idempotent).
                if !rec.outbox.is_empty() && !sent_by(&rec.outbox, msg) {
                    self.perform(&rec.run, &rec.outbox).await?;
                }
                info!(run_id = %msg.run_id, message = %msg.id, %why, "stale dead letter ignored");
                return Ok(Handled::Ignored(format!("a stale dead letter: {why}")));
            }
        }
        warn!(run_id = %msg.run_id, message = %msg.id, reason, "dead-lettered");
        let message = format!("a step message could not be processed: {reason}");
        self.fail_now(msg, "dead_letter", &message).await
    }

    /// Performs the outboxes of runs that parked more than `older_than` ago and whose outbox
    /// is still outstanding: what a crash between a commit and its effects left, when no
    /// redelivery came to repair it. Returns how many runs it repaired. Then deletes the
    /// finished runs the store's retention period is over for.
    pub async fn sweep(&self, older_than: chrono::Duration) -> Result<usize, PortError> {
        let before = self.deps.clock.now() - older_than;
        let runs = self.deps.store.stale_outboxes(before, 100).await?;
        let mut repaired = 0;
        for run_id in &runs {
            info!(run_id = %run_id, "sweep: performing an outstanding outbox");
            // One run whose effects keep failing must not keep the others waiting.
            match self.repair(run_id).await {
                Ok(()) => repaired += 1,
                Err(e) => warn!(run_id = %run_id, error = %e, "sweep: the outbox failed again"),
            }
        }
        let purged = self
            .deps
            .store
            .purge_finished(self.deps.clock.now(), 100)
            .await?;
        if purged > 0 {
            info!(purged, "sweep: finished runs past their retention deleted");
        }
        Ok(repaired)
    }

    /// Performs a run's outstanding outbox (the start-up sweep and crash repair).
    pub async fn repair(&self, run_id: &str) -> Result<(), PortError> {
        if let Some(rec) = self.deps.store.get_run(run_id).await?
            && !rec.outbox.is_empty()
        {
            self.perform(&rec.run, &rec.outbox).await?;
        }
        Ok(())
    }

    /// Performs committed effects (each idempotent), then marks the outbox done.
    pub(super) async fn perform(&self, run: &Run, effects: &[Effect]) -> Result<(), PortError> {
        if effects.is_empty() {
            return Ok(());
        }
        let mut sends = Vec::new();
        let mut events = Vec::new();
        for e in effects {
            match e {
                Effect::Send(m) => sends.push(m.clone()),
                Effect::Publish(ev) => events.push(ev.clone()),
                Effect::Schedule { cta_id, run_id, at } => {
                    self.deps.scheduler.schedule(cta_id, run_id, *at).await?;
                }
                Effect::Unschedule { cta_id } => self.deps.scheduler.unschedule(cta_id).await?,
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
        }
        // The run's own next message goes last: when it is received, everything before it
        // was performed, so its step skips the replay and no write is spent clearing it.
        sends.sort_by_key(|m| m.run_id == run.run_id);
        let continues = outbox_continues(&run.run_id, effects);
        if !sends.is_empty() {
            self.deps.queue.send(&sends).await?;
        }
        if continues {
            Ok(())
        } else {
            self.deps.store.clear_outbox(&run.run_id, run.version).await
        }
    }

    /// The run and its timeline: the timeline from the cache when it is at the run's
    /// version, else from the store. Also the timeline's estimated bytes.
    async fn hydrate(
        &self,
        run_id: &str,
    ) -> Result<Option<(RunRecord, Vec<Entry>, usize)>, PortError> {
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(run_id);
        if let Some((version, timeline, bytes)) = cached {
            match self.deps.store.get_run(run_id).await? {
                Some(rec) if rec.run.version == version => {
                    self.warm_steps.fetch_add(1, Ordering::Relaxed);
                    return Ok(Some((rec, timeline, bytes)));
                }
                Some(_) => {}
                None => return Ok(None),
            }
        }
        self.cold_steps.fetch_add(1, Ordering::Relaxed);
        Ok(self.deps.store.load(run_id).await?.map(|(rec, timeline)| {
            let bytes = approx_bytes(&timeline);
            (rec, timeline, bytes)
        }))
    }

    fn cache_put(&self, run_id: &str, version: u64, timeline: Vec<Entry>, bytes: usize) {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(run_id, version, timeline, bytes);
    }
}

/// Whether `msg` is one of this outbox's sends: then the outbox was performed in full.
fn sent_by(outbox: &[Effect], msg: &StepMessage) -> bool {
    outbox
        .iter()
        .any(|e| matches!(e, Effect::Send(m) if m.id == msg.id && m.run_id == msg.run_id))
}

/// The engine's I/O for one step of one run: the model, and the catalog's tools.
struct Thinker<'a> {
    service: &'a Service,
    run: &'a Run,
    timeline: &'a [Entry],
}

impl StepIo for Thinker<'_> {
    async fn think(&self, think_index: u32) -> Result<LlmReply, LlmError> {
        self.service
            .think(self.run, self.timeline, think_index)
            .await
    }

    async fn execute(&self, call: Execution) -> Result<Value, String> {
        match self.service.catalog.tool(&call.tool).map(|d| &d.kind) {
            Some(ToolKind::Exec(tool)) => tool.execute(call.input).await,
            _ => Err(format!("`{}` is not an executable tool", call.tool)),
        }
    }
}
