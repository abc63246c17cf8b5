//! A world to drive the engine in tests: every transition, no I/O. Steps are decided by the
//! same [`decide`] loop hosts use, with a scripted model; a tiny in-memory store and queue
//! commit with [`Transition::apply`] and deliver sends and CTA cancellations, so that
//! multi-run flows read as given/when/then. The engine's own tests use it (with a book of
//! their own), and so do a host's (with its catalog: the [`Agents`] it steps with).
//!
//! On with the `testkit` feature, for tests only.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // tests: a panic is the failure report

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::agent::{Book, PluginError, Preparation};
use crate::cta::{Cta, CtaResponse, CtaStatus};
use crate::engine::*;
use crate::llm::{LlmReply, ToolCall};
use crate::message::{Effect, Event, Input, StepMessage, Transition};
use crate::run::{NewRun, Run, RunStatus, Usage};
use crate::timeline::{Entry, EntryBody, ToolEntry};

mod scripted;

pub use scripted::{Done, Scripted};

/// What a step is decided with: the agents and tools of a [`Book`], and what an agent's
/// plugins add before a think (nothing, unless a host's catalog says otherwise).
pub trait Agents: Send + Sync {
    fn book(&self) -> Book;

    /// What `run`'s plugins add, the timeline being `seen`.
    fn prepare<'a>(
        &'a self,
        run: &'a Run,
        seen: Vec<Entry>,
    ) -> Pin<Box<dyn Future<Output = Result<Preparation, PluginError>> + Send + 'a>> {
        let _ = (run, seen);
        Box::pin(std::future::ready(Ok(Preparation::default())))
    }
}

impl Agents for Book {
    fn book(&self) -> Book {
        self.clone()
    }
}

/// How a call's idempotency key is made from its run, seq, call id and input.
pub type KeyFn = fn(&str, u64, &str, &Value) -> String;

/// A key that is its parts: the same for the same call, different for any other.
pub fn plain_key(run_id: &str, seq: u64, call_id: &str, input: &Value) -> String {
    format!("{run_id}/{seq}/{call_id}/{input}")
}

/// The world's clock at its start.
pub fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000, 0).unwrap()
}

pub fn call(name: &str, args: Value) -> ToolCall {
    ToolCall {
        id: String::new(),
        name: name.into(),
        arguments: args.to_string(),
    }
}

pub fn calls(calls: Vec<ToolCall>) -> LlmReply {
    LlmReply {
        text: None,
        tool_calls: calls,
        usage: Usage {
            input_tokens: 10,
            output_tokens: 2,
            total_tokens: 12,
            cached_input_tokens: 0,
            reasoning_tokens: 0,
        },
        model: Some("openai:gpt-4o-mini".into()),
        ..Default::default()
    }
}

pub fn text(t: &str) -> LlmReply {
    LlmReply {
        text: Some(t.into()),
        tool_calls: vec![],
        usage: Usage {
            input_tokens: 5,
            output_tokens: 1,
            total_tokens: 6,
            cached_input_tokens: 0,
            reasoning_tokens: 0,
        },
        model: Some("openai:gpt-4o-mini".into()),
        ..Default::default()
    }
}

/// The entry before a timeline's last, which must be the `usage` of the turn that ended.
pub fn before_usage(timeline: &[Entry]) -> &Entry {
    let n = timeline.len();
    assert!(
        matches!(timeline[n - 1].body, EntryBody::Usage { .. }),
        "the turn's usage closes the timeline: {:?}",
        timeline[n - 1]
    );
    &timeline[n - 2]
}

/// Runs a future that never waits (the scripted world answers at once) to completion.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the scripted world never waits"),
    }
}

/// How a delivery ended.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Done,
    Ignored,
    /// Its process died mid-delivery (`Sim::deliver_cut`): it is back in the queue.
    Crashed,
    /// Its invocation had no time for its next call: it is back in the queue.
    Deferred,
}

pub struct Sim {
    /// The agents and tools steps are decided with.
    pub agents: Box<dyn Agents>,
    /// How a call's idempotency key is made.
    pub key: KeyFn,
    pub now: DateTime<Utc>,
    pub runs: BTreeMap<String, (Run, Vec<Entry>)>,
    pub ctas: HashMap<String, Cta>,
    pub queue: VecDeque<StepMessage>,
    pub effects: Vec<Effect>,
    pub script: HashMap<String, Vec<LlmReply>>,
    pub executed: Vec<String>,
    /// The CTAs steps asked the store to settle before they stepped on (`Step::Settle`).
    pub settle_asked: Vec<String>,
    /// Budgeted trees' ledgers, by top-level run, kept as the stores keep them.
    pub ledgers: HashMap<String, crate::budget::Ledger>,
    /// Every commit so far, and how many of them were checkpoints.
    pub commits: usize,
    pub checkpoints: usize,
    /// The keys the calls ran under, in order.
    pub keys: Vec<String>,
    /// The thinks the model was asked for, by index, in order.
    pub asked: Vec<u32>,
    /// A tool whose calls do not fit in the invocation (see `Scripted::fits`).
    pub no_time_for: Option<String>,
    /// The think each agent's model fails for good at (none: it answers every one).
    pub model_fails: HashMap<String, u32>,
    /// Every change of a run's status a commit made.
    pub changes: BTreeSet<(RunStatus, RunStatus)>,
}

impl Sim {
    /// An empty world whose steps are decided with `agents`.
    pub fn over(agents: impl Agents + 'static) -> Self {
        Self {
            agents: Box::new(agents),
            key: plain_key,
            now: t0(),
            runs: BTreeMap::new(),
            ctas: HashMap::new(),
            queue: VecDeque::new(),
            effects: vec![],
            script: HashMap::new(),
            executed: vec![],
            settle_asked: vec![],
            ledgers: HashMap::new(),
            commits: 0,
            checkpoints: 0,
            keys: vec![],
            asked: vec![],
            no_time_for: None,
            model_fails: HashMap::new(),
            changes: BTreeSet::new(),
        }
    }

    pub fn script(&mut self, agent: &str, replies: Vec<LlmReply>) {
        self.script.insert(agent.into(), replies);
    }

    pub fn create(&mut self, agent: &str, prompt: &str) -> String {
        let id = format!("run_top{}", self.runs.len());
        let mut run = Run::new(NewRun::top_level(id.clone(), agent, "o", self.now));
        run.next_seq = 1;
        // As a host creates a run: what its turn was asked, previewed.
        run.set_prompt(prompt);
        let first = Entry {
            seq: 0,
            at: self.now,
            body: EntryBody::user(prompt),
        };
        self.runs.insert(id.clone(), (run, vec![first]));
        self.queue.push_back(StepMessage {
            run_id: id.clone(),
            id: format!("{id}:start"),
            input: Input::Start,
            owed: false,
        });
        id
    }

    pub fn deliver(&mut self, msg: &StepMessage) -> Outcome {
        self.deliver_cut(msg, usize::MAX)
    }

    /// Delivers `msg` as a process that dies after its `commits`-th commit does: what it
    /// ran after that commit is lost with it, and the message is delivered again later.
    pub fn deliver_cut(&mut self, msg: &StepMessage, commits: usize) -> Outcome {
        let mut io = Io::new(self.agents.book());
        let mut made = 0;
        let mut windowed_io = Io::new(self.agents.book());
        let mut outcome = Outcome::Ignored;
        loop {
            let (run, timeline) = self.runs.get(&msg.run_id).cloned().expect("run exists");
            let world = self.world(&run);
            let decided = block_on(decide(
                self.now, &run, &timeline, &msg.input, &world, &mut io,
            ));
            let done = world.done();
            self.asked.extend(done.asked);
            self.executed.extend(done.executed);
            self.keys.extend(done.keys);
            let decision = match decided {
                Err(StepError::OutOfTime(_)) => {
                    // Delivered again at once, to an invocation with the time.
                    self.queue.push_front(msg.clone());
                    return Outcome::Deferred;
                }
                other => other.expect("the scripted model never fails to answer"),
            };
            let settled = done.settled;
            for id in &settled {
                if let Some(c) = self
                    .ctas
                    .get_mut(id)
                    .filter(|c| c.status == CtaStatus::Pending)
                {
                    c.status = CtaStatus::Cancelled;
                }
            }
            self.settle_asked.extend(settled);
            // The same step on the window a host may hand it decides the same.
            let from = window_start(&run, &msg.input) as usize;
            let windowed = block_on(decide(
                self.now,
                &run,
                &timeline[from.min(timeline.len())..],
                &msg.input,
                &self.world(&run),
                &mut windowed_io,
            ))
            .expect("the scripted model never fails to answer");
            assert_eq!(
                windowed, decision,
                "{:?} on the window from {from} decides as on the whole timeline",
                msg.input
            );
            let (t, marked) = match decision {
                Decision::Ignore { .. } => return outcome,
                Decision::Commit(t) => (t, None),
                Decision::Checkpoint(t, marked) => (t, Some(marked)),
            };
            if made == commits {
                // The process died before this commit: its message is delivered again.
                self.queue.push_front(msg.clone());
                return Outcome::Crashed;
            }
            made += 1;
            self.commit(&run, timeline, &t);
            outcome = Outcome::Done;
            match marked {
                None => return outcome,
                Some(marked) => {
                    // A checkpoint: decided again from what it committed.
                    self.checkpoints += 1;
                    io.marked.extend(marked.iter().copied());
                    windowed_io.marked.extend(marked);
                }
            }
        }
    }

    /// The scripted world for a step of `run`.
    pub fn world(&self, run: &Run) -> Scripted<'_> {
        Scripted {
            agents: &*self.agents,
            key: self.key,
            replies: self.script.get(&run.agent).cloned().unwrap_or_default(),
            agent: run.agent.clone(),
            run_id: run.run_id.clone(),
            executed: Mutex::new(Vec::new()),
            keys: Mutex::new(Vec::new()),
            asked: Mutex::new(Vec::new()),
            no_time_for: self.no_time_for.clone(),
            fails_at: self.model_fails.get(&run.agent).copied(),
            settled: Mutex::new(Vec::new()),
            ctas: self.ctas.clone(),
            ledger: self.ledgers.get(run.root()).cloned(),
        }
    }

    /// Commits `t`, a step of `run` (whose timeline was `timeline`), as the stores do.
    pub fn commit(&mut self, run: &Run, timeline: Vec<Entry>, t: &Transition) {
        assert_eq!(
            t.run.version,
            run.version + 1,
            "a commit bumps the version by one"
        );
        assert!(
            run.status.may_become(t.run.status),
            "{:?} -> {:?} is not in RunStatus::CHANGES",
            run.status,
            t.run.status
        );
        if run.status != t.run.status {
            self.changes.insert((run.status, t.run.status));
        }
        for (child, _) in &t.new_runs {
            assert_eq!(child.status, RunStatus::Queued, "a run starts queued");
        }
        for e in &t.updated {
            assert!(
                matches!(timeline[e.seq as usize].tool(), Some(t) if t.result.is_pending()),
                "only pending results are resolved"
            );
        }
        for (i, e) in t.appended.iter().enumerate() {
            assert_eq!(e.seq, (timeline.len() + i) as u64, "seqs are dense");
        }
        // As the stores do in the commit: the tree's ledger takes the step's spending and
        // raise.
        if let Some(b) = t.run.origin.budget {
            let l = self
                .ledgers
                .entry(t.run.root().to_owned())
                .or_insert_with(|| crate::budget::Ledger::new(b));
            l.spent_usd += t.spent_usd;
            if let Some(r) = &t.budget_raise {
                l.budget_usd += r.by_usd;
                l.raises.push(r.clone());
            }
        }
        let mut tl = timeline;
        t.apply(&mut tl);
        assert_eq!(t.run.next_seq, tl.len() as u64);
        self.runs.insert(t.run.run_id.clone(), (t.run.clone(), tl));
        for c in &t.new_ctas {
            self.ctas.insert(c.cta_id.clone(), c.clone());
        }
        for (child, entries) in &t.new_runs {
            self.runs
                .insert(child.run_id.clone(), (child.clone(), entries.clone()));
        }
        for e in &t.effects {
            match e {
                Effect::Send(m) => self.queue.push_back(m.clone()),
                Effect::CancelCta { cta_id } => {
                    if let Some(c) = self
                        .ctas
                        .get_mut(cta_id)
                        .filter(|c| c.status == CtaStatus::Pending)
                    {
                        c.status = CtaStatus::Cancelled;
                    }
                }
                _ => {}
            }
        }
        self.effects.extend(t.effects.iter().cloned());
        self.commits += 1;
    }

    /// Delivers queued messages until none is left.
    pub fn run_all(&mut self) {
        while let Some(m) = self.queue.pop_front() {
            self.deliver(&m);
        }
    }

    pub fn send(&mut self, run_id: &str, input: Input) -> Outcome {
        self.deliver(&StepMessage {
            run_id: run_id.into(),
            id: "test".into(),
            input,
            owed: false,
        })
    }

    /// As the service does: settle the CTA item first, then queue the resolution.
    pub fn answer(&mut self, cta_id: &str, response: CtaResponse) {
        let c = self.ctas.get_mut(cta_id).expect("cta");
        assert_eq!(c.status, CtaStatus::Pending);
        c.status = CtaStatus::Answered;
        let run_id = c.run_id.clone();
        self.queue.push_back(StepMessage {
            run_id,
            id: format!("{cta_id}:answered"),
            input: Input::CtaAnswered {
                cta_id: cta_id.into(),
                response,
                responder: None,
            },
            owed: false,
        });
    }

    pub fn run(&self, id: &str) -> &Run {
        &self.runs[id].0
    }

    pub fn tools(&self, id: &str) -> Vec<ToolEntry> {
        self.runs[id]
            .1
            .iter()
            .filter_map(|e| e.tool().cloned())
            .collect()
    }

    pub fn pending_ctas(&self, run_id: &str) -> Vec<Cta> {
        let mut v: Vec<Cta> = self
            .ctas
            .values()
            .filter(|c| c.run_id == run_id && c.status == CtaStatus::Pending)
            .cloned()
            .collect();
        v.sort_by(|a, b| a.tool_call_id.cmp(&b.tool_call_id));
        v
    }

    pub fn events(&self, detail_type: &str) -> Vec<Event> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Publish(ev) if ev.detail_type == detail_type => Some(ev.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn children(&self, id: &str) -> Vec<String> {
        self.tools(id)
            .into_iter()
            .filter_map(|t| t.child_run_id)
            .collect()
    }
}

pub fn feedback(kind: Value) -> LlmReply {
    calls(vec![call("request_human_feedback", kind)])
}

pub fn spawn(agent: &str, prompt: &str) -> ToolCall {
    call("spawn_subagent", json!({"agent": agent, "prompt": prompt}))
}
