//! The one loop that drives the engine to a decision for one message: step, do the I/O the
//! step asks for (the plugins' preparation, a model reply, tool outputs), step again with it,
//! until the engine commits, commits a checkpoint (and is driven again from it), or ignores. The I/O itself is the caller's ([`StepIo`]): the
//! service asks the plugins, calls the model and the tools; the engine tests answer from a
//! script. Nothing here awaits anything but that.

use std::collections::HashMap;
use std::future::Future;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{Execution, Io, Step, step};
use crate::agent::{Book, PluginError, Preparation, Prepared};
use crate::cta::Cta;
use crate::error::PortError;
use crate::llm::{LlmError, LlmReply};
use crate::message::{Effect, Input, Transition};
use crate::run::Run;
use crate::timeline::{Entry, EntryBody};

/// The I/O a step may ask for.
pub trait StepIo: Sync {
    /// What the step knows of agents and tools, taken before it (the MCP servers' tools as
    /// listed then): every pass of the step checks its calls against this, however the
    /// servers' listings move meanwhile.
    fn book(&self) -> Book;
    /// What the plugins of `run`'s agent add to its next iteration (the engine adds the
    /// tools the run was granted). Asked once, before the step's think. They read the
    /// timeline as the model will: `timeline` as the step read it, with `changed` (the calls
    /// the step ran, the message it applied) over it ([`crate::timeline::overlay`]).
    fn prepare(
        &self,
        run: &Run,
        timeline: &[Entry],
        changed: &[Entry],
    ) -> impl Future<Output = Result<Preparation, PluginError>> + Send;
    /// The model's reply for the run's `think_index`-th think, given the timeline as the step
    /// read it with `changed` (what the step resolved or added before thinking) over it, and
    /// offered what the agent's plugins `prepared`.
    fn think(
        &self,
        think_index: u32,
        changed: &[Entry],
        prepared: &Prepared,
    ) -> impl Future<Output = Result<LlmReply, LlmError>> + Send;
    /// A tool's output (its `result` may be an error the model sees). An `Err` is the step's
    /// own I/O failing (a file the tool returned could not be stored): the step stops, and
    /// is tried again, the call with it.
    fn execute(
        &self,
        call: Execution,
    ) -> impl Future<Output = Result<ToolOutput, PortError>> + Send;
    /// The step is about to execute these calls (for whoever watches the run).
    fn executing(&self, _calls: &[Execution]) {}
    /// Whether `call` fits in the time its host's invocation has left. An [`OutOfTime`]
    /// stops the step before it runs: what the step has in hand is committed, and the
    /// message is delivered again, to an invocation with the time.
    fn fits(&self, _call: &Execution) -> Result<(), OutOfTime> {
        Ok(())
    }
    /// Whether a model call fits in the time the invocation has left: if not, the step
    /// stops before it thinks (an output it has in hand changes nothing, and runs again).
    fn think_fits(&self) -> Result<(), OutOfTime> {
        Ok(())
    }
    /// The ledger of the run tree under top-level run `root_run_id` ([`crate::budget`]), as
    /// the store holds it now (`None`: none kept).
    fn ledger(
        &self,
        root_run_id: &str,
    ) -> impl Future<Output = Result<Option<crate::budget::Ledger>, PortError>> + Send;
    /// `owner`'s spending of the UTC day against its daily allowance, as the store holds it
    /// now (`None`: no allowance is set, and nothing is read).
    fn day_spend(
        &self,
        _owner: &str,
    ) -> impl Future<Output = Result<Option<super::DaySpend>, PortError>> + Send {
        std::future::ready(Ok(None))
    }
    /// Settles these CTAs as cancelled where they are still pending (the first write wins)
    /// and returns their records as they then are, by id.
    fn settle(
        &self,
        cta_ids: Vec<String>,
    ) -> impl Future<Output = Result<HashMap<String, Cta>, PortError>> + Send;
}

/// What executing a tool gave: its result, and the widgets it added beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub result: Result<Value, String>,
    pub widgets: Vec<crate::tools::Widget>,
    /// The files it returned, already in the blob store.
    pub files: Vec<crate::timeline::FileRef>,
    /// The states it set for its agent's plugins, by plugin: they replace theirs in the
    /// commit that records its output, and the next `prepare` reads them.
    pub states: std::collections::BTreeMap<String, Value>,
    /// How long it ran.
    pub duration_ms: Option<u64>,
}

impl From<Result<Value, String>> for ToolOutput {
    fn from(result: Result<Value, String>) -> Self {
        Self {
            result,
            widgets: Vec::new(),
            files: Vec::new(),
            states: Default::default(),
            duration_ms: None,
        }
    }
}

/// Why a step could not be taken: [`decide`]'s I/O failed, or its host could not commit
/// what it decided. Retryable ones ([`StepError::is_retryable`]) put the message back on
/// its queue: it can succeed later. Terminal ones cannot; by the time a host's step returns
/// one, it has already tried to end the run as failed with the error's message, so hosts
/// acknowledge the message instead of redelivering it.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Port(#[from] PortError),
    /// The model could not be reached after the client's own retries.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// The run kept changing under the step: its commit conflicted past the host's retries.
    #[error("run {0} kept changing under this step")]
    Contended(String),
    /// The invocation has no time left for what the step would do next: nothing was done,
    /// deliver it again to a fresh one.
    #[error(transparent)]
    OutOfTime(#[from] OutOfTime),
    /// A plugin of the agent could not prepare the think: its own error, retryable or not.
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

impl StepError {
    /// Whether delivering the same message again can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Port(e) => e.is_retryable(),
            Self::Llm(e) => matches!(e, LlmError::Unavailable { .. }),
            Self::Contended(_) | Self::OutOfTime(_) => true,
            Self::Plugin(e) => e.retryable,
        }
    }

    /// Whether it failed only because the store's disk is full (see
    /// [`PortError::StorageFull`]): a host retries it soon, without counting the attempt.
    pub fn is_storage_full(&self) -> bool {
        matches!(self, Self::Port(e) if e.is_storage_full())
    }
}

/// What the step would do next does not fit in the time its host's invocation has left:
/// stopped before it starts, so that nothing is cut off half-done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OutOfTime(pub String);

/// What the engine decided for a message, once its I/O is done.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Commit this: the message is handled.
    Commit(Box<Transition>),
    /// Commit this, then decide again from what it committed, with the same message and
    /// I/O ([`Step::Checkpoint`]); once it is in, the calls in `marked` are this delivery's
    /// to run ([`Io::marked`]).
    Checkpoint(Box<Transition>, Vec<u64>),
    /// Nothing to commit: the message is stale or a redelivery, for `reason`. `effects`:
    /// what its being ignored still asks of the host (each idempotent), performed without
    /// a commit ([`ignored_effects`]).
    Ignore {
        reason: String,
        effects: Vec<Effect>,
    },
}

/// What ignoring `input` for `run` still asks: a top-level follow-up that was taken up
/// before and posted again (a client's retry) was admitted again under its owner's cap, so
/// its place is freed — unless the first still waits in the run's queue, whose place it is.
pub fn ignored_effects(run: &Run, timeline: &[Entry], input: &Input) -> Vec<Effect> {
    let Input::UserMessage {
        message_id,
        reply_to: None,
        ..
    } = input
    else {
        return vec![];
    };
    let waits = timeline.iter().any(|e| {
        run.waits.queued.contains(&e.seq)
            && matches!(&e.body, EntryBody::Queued { message_id: m, .. } if m == message_id)
    });
    if waits {
        return vec![];
    }
    vec![Effect::ReleaseFollowUps {
        run_id: run.run_id.clone(),
        message_ids: vec![message_id.clone()],
    }]
}

/// `run` with the plugin states the step's calls set, in the order of the calls.
fn states_set(run: &Run, io: &Io) -> Run {
    let mut seqs: Vec<u64> = io.states.keys().copied().collect();
    seqs.sort_unstable();
    let mut run = run.clone();
    for seq in seqs {
        run.plugin_state.extend(io.states[&seq].clone());
    }
    run
}

/// Steps until a decision, gathering the I/O in `io` (which the caller keeps from one
/// decision of a message to the next: its checkpoints, and its retries after a conflict).
/// A fatal model error is handed back to the engine (the run fails after this message's
/// input is applied); an error worth retrying is returned.
pub async fn decide<W: StepIo>(
    now: DateTime<Utc>,
    run: &Run,
    timeline: &[Entry],
    input: &Input,
    world: &W,
    io: &mut Io,
) -> Result<Decision, StepError> {
    loop {
        match step(now, run, timeline, input, io) {
            Step::Think {
                think_index,
                changed,
            } => {
                world.think_fits()?;
                // The plugins answer once, before the think: the step's input from then on,
                // with the tools the run was granted.
                let prepared = match io.book.agent(&run.agent) {
                    Some(_) => {
                        // The plugins read the states the step's calls set, over the run's.
                        let with_states;
                        let seen = match io.states.is_empty() {
                            true => run,
                            false => {
                                with_states = states_set(run, io);
                                &with_states
                            }
                        };
                        let mut p = world.prepare(seen, timeline, &changed).await?;
                        p.prepared.tools.extend(run.origin.granted.iter().cloned());
                        p
                    }
                    None => Preparation::default(),
                };
                let reply = world.think(think_index, &changed, &prepared.prepared).await;
                io.prepared = Some(prepared);
                match reply {
                    Ok(reply) => {
                        io.reply = Some(reply);
                        io.think_index = Some(think_index);
                    }
                    Err(LlmError::Fatal { message, .. }) => io.model_error = Some(message),
                    Err(e) => return Err(e.into()),
                }
            }
            Step::Settle(ids) => io.settled = Some(world.settle(ids).await?),
            Step::ReadDaySpend => io.day_spend = Some(world.day_spend(&run.owner).await?),
            Step::ReadBudget => {
                let kept = world.ledger(run.root()).await?;
                // A tree with no ledger kept (one lost, or stored before budgets): its own
                // budget, nothing known spent.
                io.budget = Some(kept.unwrap_or_else(|| {
                    crate::budget::Ledger::new(
                        run.origin
                            .budget
                            .unwrap_or(crate::budget::Budget { budget_usd: 0.0 }),
                    )
                }));
            }
            Step::Execute(calls) => {
                world.executing(&calls);
                for call in calls {
                    if let Err(late) = world.fits(&call) {
                        // What ran is committed, and the rest is left for a fresh invocation.
                        io.out_of_time = Some(late);
                        break;
                    }
                    let seq = call.seq;
                    let out = world.execute(call).await?;
                    if !out.widgets.is_empty() {
                        io.widgets.insert(seq, out.widgets);
                    }
                    if !out.files.is_empty() {
                        io.files.insert(seq, out.files);
                    }
                    if !out.states.is_empty() {
                        io.states.insert(seq, out.states);
                    }
                    if let Some(ms) = out.duration_ms {
                        io.durations.insert(seq, ms);
                    }
                    io.outputs.insert(seq, out.result);
                }
            }
            Step::Defer => {
                let late = io.out_of_time.take().unwrap_or_else(|| {
                    OutOfTime("the invocation has no time left for the next call".into())
                });
                return Err(late.into());
            }
            Step::Checkpoint { transition, marked } => {
                return Ok(Decision::Checkpoint(transition, marked));
            }
            Step::Done(t) => return Ok(Decision::Commit(t)),
            Step::Ignore(reason) => {
                let effects = ignored_effects(run, timeline, input);
                return Ok(Decision::Ignore { reason, effects });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_can_succeed_later_is_retried() {
        let table = [
            (StepError::Port(PortError::Conflict), true),
            (
                StepError::Port(PortError::Unavailable {
                    message: "throttled".into(),
                    source: None,
                }),
                true,
            ),
            (
                StepError::Port(PortError::Broken {
                    message: "item too large".into(),
                    source: None,
                }),
                false,
            ),
            (
                StepError::Llm(LlmError::Unavailable {
                    message: "connection refused".into(),
                    source: None,
                }),
                true,
            ),
            (StepError::Llm(LlmError::fatal("bad key")), false),
            (StepError::Contended("run_1".into()), true),
            (
                StepError::Plugin(PluginError::retry("the index timed out")),
                true,
            ),
            (
                StepError::Plugin(PluginError::fatal("its state does not read")),
                false,
            ),
        ];
        for (error, retryable) in table {
            assert_eq!(error.is_retryable(), retryable, "{error}");
        }
    }
}
