//! The engine: one think-or-dispatch iteration of one run, as a pure function.
//!
//! [`step`] takes the run, its timeline, the input message and whatever I/O results the
//! caller has gathered so far, and answers with what it still needs ([`Step::Think`]: a
//! model reply; [`Step::Execute`]: tool outputs) or with the [`Transition`] to commit: new
//! and resolved timeline entries, the run's new state, new CTAs and child runs, and the
//! effects to perform after the commit. It is deterministic: called again with more I/O it
//! makes the same decisions, and the ids it mints are derived from the run and the seq, so a
//! retried step mints the same ones. [`decide`] is the one loop that feeds it that I/O.
//!
//! No I/O, no clock, no randomness here: time and ids come in as inputs. Every decision
//! lives here (and is tested in this crate's `tests/engine/`, on the world of
//! `testkit`). One file per kind of input:
//!
//! | input | file |
//! |---|---|
//! | start, continue | `start.rs` |
//! | a follow-up user message | `user_message.rs` |
//! | a CTA answered or expired (and raising one) | `cta.rs` |
//! | a budget question (raised before a think, answered, expired) | `budget.rs` |
//! | a child run finished (and spawning one) | `children.rs` |
//! | a plan (`agent_orchestrate`), its children and its step timers | `plan/` |
//! | cancel, fail (and every end of a run) | `end.rs` |
//!
//! `think.rs` is the iteration itself (a model reply, its tool calls dispatched), `calls.rs`
//! the calls committed and not yet run (a reply is committed before its calls run), `work.rs`
//! the step under construction, `driver.rs` the loop.

mod ask;
mod budget;
mod calls;
mod children;
mod cta;
mod driver;
mod end;
mod plan;
mod start;
mod think;
pub use think::QUOTA_EXCEEDED;
mod user_message;
mod work;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::cta::{Cta, CtaStatus};
use crate::llm::LlmReply;
use crate::message::{Input, Transition};
use crate::run::Run;
use crate::timeline::{Entry, ToolResult};
use work::Work;

pub use calls::OUTCOME_UNKNOWN;
pub use driver::{Decision, OutOfTime, StepError, StepIo, ToolOutput, decide, ignored_effects};

/// A tool the caller must execute for the engine: a call whose reply (or approval) is
/// committed.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub call_id: String,
    /// The seq of the call's `tool` entry: what names this call of this run.
    pub seq: u64,
    pub tool: String,
    pub input: Value,
    /// How it may touch the world, as recorded on its entry.
    pub effects: crate::tools::Effects,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Call the model (for the run's `think_index`-th think) and step again with the reply.
    /// `changed`: the entries this step resolved or added before it thinks (by seq), which
    /// the model is given over the timeline the step read.
    Think {
        think_index: u32,
        changed: Vec<Entry>,
    },
    /// Execute these committed calls, in order, and step again with their outputs.
    Execute(Vec<Execution>),
    /// Commit this now, then step again from what it committed with the I/O gathered so
    /// far (the same message): a reply is committed before its calls run, an `idempotent` or
    /// `once` call's output before anything else runs, and a `once` call's start before it
    /// runs. `marked`: the seqs of the `once` calls this commit marks started; once it is
    /// in, this delivery may run them ([`Io::marked`]).
    Checkpoint {
        transition: Box<Transition>,
        marked: Vec<u64>,
    },
    /// The calls due next do not fit in the time the host's invocation has left
    /// ([`Io::out_of_time`]), and nothing is in hand to commit: stop; the message is
    /// delivered again, to an invocation with the time.
    Defer,
    /// Settle these pending CTAs as cancelled (the first write wins) and step again with
    /// the CTA records as they then are: the run is about to end, and the timeline must
    /// say what each CTA record says, even if an answer won the race.
    Settle(Vec<String>),
    /// Read the run tree's budget ledger ([`Io::budget`]) and step again: the run is
    /// budgeted and about to think.
    ReadBudget,
    /// Read the owner's spending of the day ([`Io::day_spend`]) and step again: the run is
    /// about to think.
    ReadDaySpend,
    /// Commit this.
    Done(Box<Transition>),
    /// Nothing to do: the message is stale or a redelivery.
    Ignore(String),
}

/// The I/O results gathered so far for this step, and what it knows of agents and tools
/// (`book`, taken when it started: what a call is checked against, on every pass of it).
#[derive(Default, Clone)]
pub struct Io {
    pub book: crate::agent::Book,
    /// The model's reply to the run's `think_index`-th think.
    pub reply: Option<LlmReply>,
    /// Which think `reply` answers: a reply is used only by the think it answers (a step
    /// stepped again after a conflict keeps a reply its run has not committed).
    pub think_index: Option<u32>,
    /// The model call failed for good: the run fails, after this step's input is applied.
    pub model_error: Option<String>,
    /// The outputs of the calls this delivery ran, by the seq of the call's entry.
    pub outputs: std::collections::HashMap<u64, Result<Value, String>>,
    /// The widgets each executed call added beside its output, by the call's seq.
    pub widgets: std::collections::HashMap<u64, Vec<crate::tools::Widget>>,
    /// The files each executed call returned (stored already), by the call's seq.
    pub files: std::collections::HashMap<u64, Vec<crate::timeline::FileRef>>,
    /// The plugin states each executed call set, by the call's seq.
    pub states:
        std::collections::HashMap<u64, std::collections::BTreeMap<String, serde_json::Value>>,
    /// How long each tool call executed this step ran, by the call's seq.
    pub durations: std::collections::HashMap<u64, u64>,
    /// The `once` calls this delivery marked started, each in a commit of its own
    /// ([`Step::Checkpoint`]): they may run. A call found started and not in here was cut
    /// off by a crash: its outcome is unknown.
    pub marked: std::collections::HashSet<u64>,
    /// The calls the engine asked to run next do not fit in the time the host's invocation
    /// has left: what is in hand is committed, and the step stops ([`Step::Defer`]).
    pub out_of_time: Option<OutOfTime>,
    /// The CTA records after [`Step::Settle`] (`None` until then), by CTA id.
    pub settled: Option<std::collections::HashMap<String, Cta>>,
    /// What the agent's plugins answered before the step's think (`None` until then).
    pub prepared: Option<crate::agent::Preparation>,
    /// The run tree's budget ledger, read before a budgeted run thinks (`None` until then).
    pub budget: Option<crate::budget::Ledger>,
    /// The owner's spending of the day against its daily allowance, read before the run
    /// thinks (`None` until then; `Some(None)`: no allowance is set).
    pub day_spend: Option<Option<DaySpend>>,
    /// The host refused the turn a follow-up would start on this ended run (its commit
    /// found the owner's active-run slots all taken), and why: the follow-up is refused,
    /// and the timeline says so.
    pub turn_refused: Option<String>,
    /// What the host holds each owner to: every commit the engine decides says, from it,
    /// whether it takes an active-run slot and up to what count, and whether it adds to the
    /// owner's spending of the day.
    pub owner: OwnerQuotas,
}

/// The host's quotas on each owner, as the engine's commits need them
/// (`BATON_MAX_ACTIVE_RUNS_PER_OWNER`, `BATON_MAX_DAILY_COST_USD_PER_OWNER`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OwnerQuotas {
    /// The most active runs an owner may hold, if the host limits them: a run that starts
    /// again takes its owner's active-run slot in its commit, and a follow-up that starts an
    /// ended top-level run's next turn is committed first (its commit takes the slot, or is
    /// refused before anything is paid for), its turn thinking in a step of its own. With
    /// no limit no count is kept, and no commit takes a slot.
    pub active_runs: Option<u32>,
    /// The owner's spending of the day is kept (a daily allowance is set): each commit adds
    /// its model calls' cost to it. Else it is not written (one item per owner, which every
    /// think of theirs would write).
    pub daily_spend: bool,
}

/// An owner's spending of the UTC day, and what its daily allowance is
/// (`BATON_MAX_DAILY_COST_USD_PER_OWNER`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DaySpend {
    pub spent_usd: f64,
    pub limit_usd: f64,
}

/// The first `max` bytes of `s` (on a char boundary), and whether it was cut.
fn preview(s: &str, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s.to_owned(), false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (s[..end].to_owned(), true)
}

impl Io {
    /// The I/O of a step that knows `book`, before any of it is done.
    pub fn new(book: crate::agent::Book) -> Io {
        Io {
            book,
            ..Io::default()
        }
    }
}

/// What an input's handler decided.
enum Next {
    /// Think (or dispatch the last reply's calls), then commit.
    Think,
    /// Commit what the handler did, without thinking.
    Commit,
    /// Run the calls the handler made due (an approval settled), then think or commit.
    RunDue,
    /// Answer the caller now: ignore the message, or ask for I/O first.
    Now(Step),
}

/// Mints a stable id from a run, a seq and a purpose.
pub fn derive_id(prefix: &str, run_id: &str, seq: u64) -> String {
    let name = format!("{run_id}/{seq}/{prefix}");
    format!(
        "{prefix}_{}",
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).simple()
    )
}

/// Where the timeline a step of `run` for `input` needs begins: [`step`] reads nothing
/// before it, so a host may hand it the entries from there on (a window) instead of the
/// whole timeline. The loop's inputs (a think, a tool's, a child's or a human's result, a
/// timer) touch only the current batch and the follow-ups waiting: a bounded window,
/// whatever the run's length. A follow-up message, a cancel and a failure read the whole
/// timeline (to drop a message applied before, to say a late cancel once); they come at a
/// person's pace, not the loop's.
pub fn window_start(run: &Run, input: &Input) -> u64 {
    match input {
        Input::UserMessage { .. } | Input::Cancel { .. } | Input::Fail { .. } | Input::Start => 0,
        Input::Continue { .. }
        | Input::CtaAnswered { .. }
        | Input::CtaExpired { .. }
        | Input::ChildFinished { .. }
        | Input::ChildWaiting { .. }
        | Input::ChildResumed { .. }
        | Input::BudgetSpent { .. }
        | Input::BudgetRaised
        | Input::Timer { .. } => run
            .waits
            .queued
            .iter()
            .copied()
            .fold(run.batch_start, u64::min),
    }
}

/// One iteration of one run. See the module docs. `timeline` is the run's whole timeline,
/// or its entries from [`window_start`] on.
pub fn step(now: DateTime<Utc>, run: &Run, timeline: &[Entry], input: &Input, io: &Io) -> Step {
    owner_rules(
        run,
        input,
        io.owner,
        decide_step(now, run, timeline, input, io),
    )
}

/// [`step`], before the owner's quotas are applied to what it commits.
fn decide_step(now: DateTime<Utc>, run: &Run, timeline: &[Entry], input: &Input, io: &Io) -> Step {
    let mut w = Work::new(&io.book, now, run, timeline, io.settled.as_ref());
    w.ledger = io.budget.clone();
    let ending = ends_run(&w, run, input);
    if io.settled.is_none() && ending {
        let ids: Vec<String> = w
            .pending_seqs(|t| {
                t.cta
                    .as_ref()
                    .is_some_and(|c| c.status == CtaStatus::Pending)
            })
            .into_iter()
            .filter_map(|s| w.tool(s).cta.as_ref().map(|c| c.cta_id.clone()))
            .collect();
        if !ids.is_empty() {
            return Step::Settle(ids);
        }
    }
    if io.settled.is_none()
        && matches!(input, Input::UserMessage { reply_to: None, .. })
        && !run.status.is_terminal()
    {
        // A follow-up while the run waits on drafts alone answers them in the conversation
        // (`plan/held.rs`): their questions are withdrawn first, the first write winning.
        let ids = w.conversational_drafts();
        if !ids.is_empty() {
            return Step::Settle(ids);
        }
    }
    // The calls committed and not yet run come first, whatever the input (a delivery after
    // a crash or a deferral finds them so): each runs, or is known to have been cut off.
    // An input that ends the run ends them too.
    if !ending
        && !run.status.is_terminal()
        && !w.left_to_continue(input)
        && let Some(need) = w.run_due(io)
    {
        return w.step_for(need);
    }
    let next = match input {
        Input::Start => start::start(&mut w),
        Input::Continue { version } => start::resume(&mut w, *version),
        Input::UserMessage {
            text,
            message_id,
            reply_to,
            options,
        } => user_message::apply(
            &mut w,
            text,
            message_id,
            reply_to.as_ref(),
            options,
            user_message::Slot {
                limited: io.owner.active_runs.is_some(),
                refused: io.turn_refused.as_deref(),
            },
        ),
        Input::CtaAnswered {
            cta_id,
            response,
            responder,
        } => cta::answered(&mut w, cta_id, response, responder.as_deref()),
        Input::CtaExpired { cta_id } => cta::expired(&mut w, cta_id),
        Input::ChildFinished {
            child_run_id,
            tool_call_id,
            outcome,
            spent,
            breakdown,
        } => children::finished(
            &mut w,
            child_run_id,
            tool_call_id,
            outcome,
            *spent,
            breakdown,
        ),
        Input::ChildWaiting {
            child_run_id,
            asker_run_id,
            cta_id,
            question,
        } => children::waiting(&mut w, child_run_id, asker_run_id, cta_id, question),
        Input::ChildResumed {
            child_run_id,
            cta_id,
        } => children::resumed(&mut w, child_run_id, cta_id),
        Input::BudgetSpent { run_id } => budget::spent(&mut w, run_id),
        Input::BudgetRaised => budget::raised(&mut w),
        Input::Cancel { reason } => end::cancel(&mut w, reason),
        Input::Timer { timer_id } if w.run.clock.deadline_timer.as_deref() == Some(timer_id) => {
            w.run.clock.timers.remove(timer_id);
            end::deadline(&mut w)
        }
        Input::Timer { timer_id } => {
            w.run.clock.timers.remove(timer_id);
            plan::timer(&mut w, timer_id)
        }
        Input::Fail { code, message } => end::fail(&mut w, code, message),
    };
    // An input already applied (the message delivered again after a crash, or stepped again
    // after a checkpoint of its own) is stale; what the step ran of the due calls stands.
    let next = match next {
        Next::Now(Step::Ignore(_)) if w.ran_due => w.carry_on(),
        next => next,
    };
    let next = match next {
        Next::RunDue => match w.run_due(io) {
            Some(need) => return w.step_for(need),
            None => w.after_resolution(),
        },
        next => next,
    };
    match next {
        Next::Now(step) => step,
        Next::Think => match w.think(io) {
            Some(need) => need,
            None => w.done(),
        },
        Next::Commit => w.done(),
        Next::RunDue => unreachable!("no call is due once they have run"),
    }
}

/// What a commit does for its owner's quotas. Its run's active-run slot
/// ([`Run::active_slot`]): a run that ends gives it back (`Work::done`, and an ended run
/// holds none); under a limit, a top-level run that starts again without one (a follow-up
/// starts its next turn) takes one, in the commit that starts the turn, so it counts while
/// it is active and only then — up to the limit when a follow-up starts it (the commit is
/// refused past it). And whether its model calls' cost adds to the owner's day.
fn owner_rules(before: &Run, input: &Input, owner: OwnerQuotas, mut step: Step) -> Step {
    if let Step::Done(t)
    | Step::Checkpoint {
        transition: t,
        marked: _,
    } = &mut step
    {
        debug_assert!(
            before.status.may_become(t.run.status),
            "run {}: {:?} -> {:?} is not in RunStatus::CHANGES",
            before.run_id,
            before.status,
            t.run.status
        );
        let was_active = !before.status.is_terminal();
        let is_active = !t.run.status.is_terminal();
        t.take_slot = owner.active_runs.is_some()
            && !was_active
            && is_active
            && !before.active_slot
            && t.run.origin.parent.is_none();
        if t.take_slot {
            t.run.active_slot = true;
            if matches!(input, Input::UserMessage { reply_to: None, .. }) {
                t.slot_limit = owner.active_runs;
            }
        }
        t.daily_spend = owner.daily_spend;
    }
    step
}

/// Whether `input` ends an active run whatever else happens (so its pending CTAs end too).
fn ends_run(w: &Work, run: &Run, input: &Input) -> bool {
    match input {
        Input::Cancel { .. } | Input::Fail { .. } => !run.status.is_terminal(),
        Input::CtaExpired { cta_id } => cta::expiry_ends_run(w, cta_id),
        Input::ChildFinished { outcome, .. } => {
            !run.status.is_terminal() && children::exhausted(outcome).is_some()
        }
        _ => false,
    }
}

/// The pending reason of a call deferred behind its reply's approvals.
pub const DEFERRED: &str = "deferred until this reply's approvals are settled";

/// Tool outputs larger than this (as JSON) are cut, with an explicit marker, so that every
/// entry fits any store (DynamoDB items stop at 400 KB) and the model sees what is stored.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Model replies longer than this are cut the same way. A reply is stored whole up to here
/// (the DynamoDB adapter spreads one large entry over several items).
pub const MAX_REPLY_BYTES: usize = 1024 * 1024;

/// What the run item, events and messages carry of a text that may be long (a final
/// answer, an error): a preview of at most this, with a reference to the whole text.
/// EventBridge events stop at 256 KB and DynamoDB items at 400 KB; previews keep every
/// event and the run item far below, whatever the model wrote.
pub const PREVIEW_BYTES: usize = 8 * 1024;

/// A question for a human (`request_human_feedback`), as JSON, is at most this long: it is
/// stored on the CTA item and sent whole in `cta.request`.
pub const MAX_CTA_REQUEST_BYTES: usize = 32 * 1024;

fn to_result(out: Result<Value, String>) -> ToolResult {
    match out {
        Ok(output) => ToolResult::Success {
            output: cap_output(output),
        },
        Err(error) => ToolResult::Error {
            error: cap_at(error, MAX_OUTPUT_BYTES),
        },
    }
}

fn cap_at(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… [truncated: {} of {} bytes kept]",
        &s[..end],
        end,
        s.len()
    )
}

fn cap_output(v: Value) -> Value {
    let size = match &v {
        Value::String(s) => s.len(),
        v => v.to_string().len(),
    };
    if size <= MAX_OUTPUT_BYTES {
        return v;
    }
    let text = match v {
        Value::String(s) => s,
        v => v.to_string(),
    };
    json!({"truncated": true, "originalBytes": size, "preview": cap_at(text, MAX_OUTPUT_BYTES)})
}
