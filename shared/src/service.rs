//! The service: the only place that loads a run, calls the engine, commits with a version
//! check, and performs the committed effects through the ports.
//!
//! Hosts (the local dev server, the Lambda functions) call one method each: the HTTP API
//! calls the request methods, queue consumers call [`Service::handle`], timers call
//! [`Service::expire_cta`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tracing::{debug, info, warn};

use crate::agent::Catalog;
use crate::cta::{Cta, CtaResponse, CtaStatus};
use crate::engine::{self, Effect, Input, Io, Step, StepMessage, Transition};
use crate::error::PortError;
use crate::llm::{ChatRequest, Llm, LlmError};
use crate::ports::{Bus, Clock, Created, Queue, RunRecord, Scheduler, Settled, Store};
use crate::run::{ExpiryPolicy, NewRun, Run, RunStatus};
use crate::timeline::{Entry, EntryBody};
use crate::tools::ToolKind;

/// The ports a service works through, built once per process.
#[derive(Clone)]
pub struct Deps {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub bus: Arc<dyn Bus>,
    pub scheduler: Arc<dyn Scheduler>,
    pub llm: Arc<dyn Llm>,
    pub clock: Arc<dyn Clock>,
}

/// Why a request was refused, or could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state (already answered, run still active).
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// Too late: the CTA expired.
    #[error("{0}")]
    Gone(String),
    #[error(transparent)]
    Port(#[from] PortError),
}

/// Why a step message could not be handled now. The queue will deliver it again.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Port(#[from] PortError),
    #[error(transparent)]
    Llm(LlmError),
    #[error("run {0} kept changing under this step")]
    Contended(String),
}

/// What handling a message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    Committed { status: RunStatus, version: u64 },
    Ignored(String),
}

/// What the engine decided for a message, once its I/O is done.
enum Decision {
    Commit(Box<Transition>),
    Ignore(String),
}

/// A new top-level run, as the API receives it.
#[derive(Debug, Clone, Default)]
pub struct CreateRun {
    pub prompt: String,
    pub agent: Option<String>,
    pub sandbox_id: Option<String>,
    pub metadata: Option<Value>,
    pub on_expiry: ExpiryPolicy,
}

const CACHE_RUNS: usize = 512;

pub struct Service {
    deps: Deps,
    catalog: Arc<Catalog>,
    /// Timelines of recently stepped runs, by version: a warm worker re-reads only the run
    /// item, not the whole history. The store stays the truth: a version mismatch reloads.
    cache: Mutex<HashMap<String, (u64, Vec<Entry>)>>,
}

impl Service {
    pub fn new(deps: Deps, catalog: Arc<Catalog>) -> Self {
        Self {
            deps,
            catalog,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn deps(&self) -> &Deps {
        &self.deps
    }

    // ---- requests (the HTTP API) ----

    pub async fn create_run(
        &self,
        owner: &str,
        req: CreateRun,
        idempotency_key: Option<&str>,
    ) -> Result<Run, ServiceError> {
        if req.prompt.trim().is_empty() {
            return Err(ServiceError::Invalid("`prompt` must not be empty".into()));
        }
        let agent = req
            .agent
            .unwrap_or_else(|| crate::agent::ORCHESTRATOR.to_owned());
        if self.catalog.agent(&agent).is_none() {
            return Err(ServiceError::Invalid(format!(
                "unknown agent `{agent}`; known agents: {}",
                self.catalog.agent_names().join(", ")
            )));
        }
        let now = self.deps.clock.now();
        let mut run = Run::new(NewRun {
            run_id: format!("run_{}", uuid::Uuid::new_v4().simple()),
            agent,
            owner: owner.to_owned(),
            parent: None,
            depth: 0,
            on_expiry: req.on_expiry,
            sandbox_id: req.sandbox_id,
            metadata: req.metadata,
            now,
        });
        run.next_seq = 1;
        let first = Entry {
            seq: 0,
            at: now,
            body: EntryBody::User {
                text: req.prompt,
                message_id: None,
            },
        };
        let start = vec![Effect::Send(StepMessage {
            run_id: run.run_id.clone(),
            id: format!("{}:start", run.run_id),
            input: Input::Start,
        })];
        let record = match self
            .deps
            .store
            .create_run(&run, &[first], &start, idempotency_key)
            .await?
        {
            Created::Created => RunRecord { run, outbox: start },
            Created::Existing(rec) => *rec,
        };
        self.perform(&record.run, &record.outbox).await?;
        info!(run_id = %record.run.run_id, agent = %record.run.agent, "run created");
        Ok(record.run)
    }

    async fn owned_run(&self, owner: &str, run_id: &str) -> Result<Run, ServiceError> {
        match self.deps.store.get_run(run_id).await? {
            Some(r) if r.run.owner == owner => Ok(r.run),
            _ => Err(ServiceError::NotFound(format!("no run `{run_id}`"))),
        }
    }

    pub async fn get_run(
        &self,
        owner: &str,
        run_id: &str,
    ) -> Result<(Run, Vec<Entry>), ServiceError> {
        match self.deps.store.load(run_id).await? {
            Some((r, timeline)) if r.run.owner == owner => Ok((r.run, timeline)),
            _ => Err(ServiceError::NotFound(format!("no run `{run_id}`"))),
        }
    }

    pub async fn timeline(
        &self,
        owner: &str,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<(Run, Vec<Entry>), ServiceError> {
        let run = self.owned_run(owner, run_id).await?;
        let entries = self.deps.store.entries_after(run_id, after, limit).await?;
        Ok((run, entries))
    }

    /// Queues a follow-up user turn on a finished run.
    pub async fn post_message(
        &self,
        owner: &str,
        run_id: &str,
        text: &str,
    ) -> Result<Run, ServiceError> {
        if text.trim().is_empty() {
            return Err(ServiceError::Invalid("`text` must not be empty".into()));
        }
        let run = self.owned_run(owner, run_id).await?;
        if !run.status.is_terminal() {
            return Err(ServiceError::Conflict {
                code: "run_active",
                message: format!(
                    "run is {}; a follow-up message is taken once it has finished",
                    run.status.as_str()
                ),
            });
        }
        let message_id = format!("msg_{}", uuid::Uuid::new_v4().simple());
        self.deps
            .queue
            .send(&[StepMessage {
                run_id: run_id.into(),
                id: message_id.clone(),
                input: Input::UserMessage {
                    text: text.into(),
                    message_id,
                    reply_to: None,
                },
            }])
            .await?;
        Ok(run)
    }

    /// Queues a cancellation; the run's writer cancels its CTAs and children.
    pub async fn cancel(&self, owner: &str, run_id: &str) -> Result<Run, ServiceError> {
        let run = self.owned_run(owner, run_id).await?;
        if run.status.is_terminal() {
            return Err(ServiceError::Conflict {
                code: "run_ended",
                message: format!("run already ended ({})", run.status.as_str()),
            });
        }
        self.deps
            .queue
            .send(&[StepMessage {
                run_id: run_id.into(),
                id: format!("{run_id}:cancel"),
                input: Input::Cancel {
                    reason: "cancelled by the user".into(),
                },
            }])
            .await?;
        Ok(run)
    }

    pub async fn list_ctas(
        &self,
        owner: &str,
        status: Option<CtaStatus>,
    ) -> Result<Vec<Cta>, ServiceError> {
        Ok(self.deps.store.list_ctas(owner, status).await?)
    }

    pub async fn get_cta(&self, owner: Option<&str>, cta_id: &str) -> Result<Cta, ServiceError> {
        match self.deps.store.get_cta(cta_id).await? {
            Some(c) if owner.is_none_or(|o| o == c.owner) => Ok(c),
            _ => Err(ServiceError::NotFound(format!("no CTA `{cta_id}`"))),
        }
    }

    /// Accepts an answer with the CTA's own conditional write, then queues the resolution
    /// for the run's writer. `owner` is `None` for trusted callers (the bus consumer).
    pub async fn answer_cta(
        &self,
        owner: Option<&str>,
        cta_id: &str,
        response: CtaResponse,
    ) -> Result<Cta, ServiceError> {
        let cta = self.get_cta(owner, cta_id).await?;
        if cta.status != CtaStatus::Pending {
            return Err(self.settled_error(&cta).await);
        }
        response
            .validate_against(&cta.request)
            .map_err(|e| ServiceError::Invalid(e.to_string()))?;
        let now = self.deps.clock.now();
        if now >= cta.expires_at {
            self.expire_cta(cta_id).await?;
            return Err(ServiceError::Gone(format!(
                "CTA `{cta_id}` expired at {}",
                cta.expires_at.to_rfc3339()
            )));
        }
        match self
            .deps
            .store
            .settle_cta(cta_id, CtaStatus::Answered, Some(&response), now)
            .await?
        {
            Settled::Won(cta) => {
                self.send_resolution(&cta).await?;
                info!(cta_id, run_id = %cta.run_id, "CTA answered");
                Ok(cta)
            }
            Settled::Lost(cta) => Err(self.settled_error(&cta).await),
            Settled::NotFound => Err(ServiceError::NotFound(format!("no CTA `{cta_id}`"))),
        }
    }

    /// The refusal for a CTA that is no longer pending. An answered CTA's resolution is
    /// sent again on the way (deduplicated), which repairs a send lost after the write.
    async fn settled_error(&self, cta: &Cta) -> ServiceError {
        match cta.status {
            CtaStatus::Expired => ServiceError::Gone(format!("CTA `{}` expired", cta.cta_id)),
            CtaStatus::Cancelled => ServiceError::Conflict {
                code: "cta_cancelled",
                message: format!("CTA `{}` was cancelled with its run", cta.cta_id),
            },
            _ => {
                if let Err(e) = self.send_resolution(cta).await {
                    warn!(cta_id = %cta.cta_id, error = %e, "re-sending a resolution failed");
                }
                ServiceError::Conflict {
                    code: "cta_answered",
                    message: format!("CTA `{}` was already answered", cta.cta_id),
                }
            }
        }
    }

    async fn send_resolution(&self, cta: &Cta) -> Result<(), PortError> {
        let input = match (&cta.status, &cta.response) {
            (CtaStatus::Answered, Some(r)) => Input::CtaAnswered {
                cta_id: cta.cta_id.clone(),
                response: r.clone(),
            },
            (CtaStatus::Expired, _) => Input::CtaExpired {
                cta_id: cta.cta_id.clone(),
            },
            _ => return Ok(()),
        };
        let id = format!("{}:{}", cta.cta_id, cta.status.as_str());
        self.deps
            .queue
            .send(&[StepMessage {
                run_id: cta.run_id.clone(),
                id,
                input,
            }])
            .await
    }

    /// An expiry timer fired: settle the CTA as expired if nobody answered first.
    pub async fn expire_cta(&self, cta_id: &str) -> Result<(), PortError> {
        let now = self.deps.clock.now();
        match self
            .deps
            .store
            .settle_cta(cta_id, CtaStatus::Expired, None, now)
            .await?
        {
            Settled::Won(cta) => {
                info!(cta_id, run_id = %cta.run_id, "CTA expired");
                self.send_resolution(&cta).await
            }
            Settled::Lost(_) | Settled::NotFound => Ok(()),
        }
    }

    // ---- steps (queue consumers) ----

    /// Handles one step message: re-hydrate, step, commit, perform the effects.
    pub async fn handle(&self, msg: &StepMessage) -> Result<Handled, StepError> {
        for _ in 0..3 {
            let Some((record, timeline)) = self.hydrate(&msg.run_id).await? else {
                return self.handle_unknown_run(msg).await;
            };
            if !record.outbox.is_empty() && !sent_by(&record.outbox, msg) {
                self.perform(&record.run, &record.outbox).await?;
            }
            let run = record.run;
            let transition = match self.decide(&run, &timeline, msg).await? {
                Decision::Commit(t) => t,
                Decision::Ignore(reason) => {
                    debug!(run_id = %run.run_id, message = %msg.id, %reason, "ignored");
                    self.cache_put(&run.run_id, run.version, timeline);
                    return Ok(Handled::Ignored(reason));
                }
            };
            match self.deps.store.commit(run.version, &transition).await {
                Ok(()) => {
                    let mut timeline = timeline;
                    apply(&mut timeline, &transition);
                    let (status, version) = (transition.run.status, transition.run.version);
                    self.cache_put(&run.run_id, version, timeline);
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

    /// Runs the engine to a decision, doing the I/O it asks for.
    async fn decide(
        &self,
        run: &Run,
        timeline: &[Entry],
        msg: &StepMessage,
    ) -> Result<Decision, StepError> {
        let now = self.deps.clock.now();
        let mut io = Io::default();
        loop {
            match engine::step(&self.catalog, now, run, timeline, &msg.input, &io) {
                Step::Think { think_index } => match self.think(run, timeline, think_index).await {
                    Ok(reply) => io.reply = Some(reply),
                    Err(LlmError::Fatal(message)) => {
                        warn!(run_id = %run.run_id, %message, "model call failed for good");
                        io.model_error = Some(message);
                    }
                    Err(e) => return Err(StepError::Llm(e)),
                },
                Step::Execute(calls) => {
                    for call in calls {
                        let out = match self.catalog.tool(&call.tool).map(|d| &d.kind) {
                            Some(ToolKind::Exec(tool)) => tool.execute(call.input).await,
                            _ => Err(format!("`{}` is not an executable tool", call.tool)),
                        };
                        io.outputs.insert(call.call_id, out);
                    }
                }
                Step::Done(t) => return Ok(Decision::Commit(t)),
                Step::Ignore(reason) => return Ok(Decision::Ignore(reason)),
            }
        }
    }

    async fn think(
        &self,
        run: &Run,
        timeline: &[Entry],
        think_index: u32,
    ) -> Result<crate::llm::LlmReply, LlmError> {
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
        self.deps.llm.complete(&request).await
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
                        outcome: engine::ChildOutcome::Ended {
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
    pub async fn dead_letter(&self, msg: &StepMessage, reason: &str) -> Result<Handled, StepError> {
        warn!(run_id = %msg.run_id, message = %msg.id, reason, "dead-lettered");
        let fail = StepMessage {
            run_id: msg.run_id.clone(),
            id: format!("{}:dead", msg.id),
            input: Input::Fail {
                code: "dead_letter".into(),
                message: format!("a step message could not be processed: {reason}"),
            },
        };
        self.handle(&fail).await
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
    async fn perform(&self, run: &Run, effects: &[Effect]) -> Result<(), PortError> {
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
                        .settle_cta(cta_id, CtaStatus::Cancelled, None, now)
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
        let continues = sends.last().is_some_and(|m| m.run_id == run.run_id);
        if !sends.is_empty() {
            self.deps.queue.send(&sends).await?;
        }
        if continues {
            Ok(())
        } else {
            self.deps.store.clear_outbox(&run.run_id, run.version).await
        }
    }

    async fn hydrate(&self, run_id: &str) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError> {
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(run_id);
        if let Some((version, timeline)) = cached {
            match self.deps.store.get_run(run_id).await? {
                Some(rec) if rec.run.version == version => return Ok(Some((rec, timeline))),
                Some(_) => {}
                None => return Ok(None),
            }
        }
        self.deps.store.load(run_id).await
    }

    fn cache_put(&self, run_id: &str, version: u64, timeline: Vec<Entry>) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_RUNS
            && let Some(k) = cache.keys().next().cloned()
        {
            cache.remove(&k);
        }
        cache.insert(run_id.to_owned(), (version, timeline));
    }
}

/// Whether `msg` is one of this outbox's sends: then the outbox was performed in full.
fn sent_by(outbox: &[Effect], msg: &StepMessage) -> bool {
    outbox
        .iter()
        .any(|e| matches!(e, Effect::Send(m) if m.id == msg.id && m.run_id == msg.run_id))
}

/// Applies a committed transition to a timeline held in memory.
fn apply(timeline: &mut Vec<Entry>, t: &Transition) {
    for e in &t.updated {
        if let Some(slot) = timeline.get_mut(e.seq as usize) {
            *slot = e.clone();
        }
    }
    timeline.extend(t.appended.iter().cloned());
}
