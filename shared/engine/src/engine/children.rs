//! Subagents: starting a child run (`spawn_subagent`), continuing one by its id, queueing
//! calls over the parallel cap, and the parent's side of a child finishing.

use serde_json::{Value, json};

use super::{Next, Step, Work, derive_id};
use crate::cost::Spent;
use crate::message::{ChildOutcome, Effect, Input, StepMessage};
use crate::run::{NewRun, ParentLink, Run, RunStatus, WaitingCta};
use crate::timeline::{Entry, EntryBody, ToolResult};
use crate::tools::{REQUEST_HUMAN_FEEDBACK, SPAWN_SUBAGENT};

/// `ChildWaiting`: a CTA waits in the tree under child `child_run_id`. The run's timeline
/// says so (naming the child, the question and the CTA), `waitingCtas` lists it, and the
/// run's own parent hears it too. Nothing is thought: the run waits as it did.
pub(super) fn waiting(
    w: &mut Work,
    child_run_id: &str,
    asker_run_id: &str,
    cta_id: &str,
    question: &str,
) -> Next {
    let ours = w.child_call(child_run_id).is_some();
    if !ours || w.run.waits.waiting_ctas.iter().any(|c| c.cta_id == cta_id) {
        return Next::Now(Step::Ignore(format!(
            "no subagent {child_run_id} waits here, or CTA {cta_id} is known"
        )));
    }
    let who = if asker_run_id == child_run_id {
        format!("subagent {child_run_id}")
    } else {
        format!("subagent {asker_run_id} (under {child_run_id})")
    };
    w.push(EntryBody::Notice {
        code: "subagent_waiting".into(),
        message: format!("{who} asks a human: \"{question}\" (CTA {cta_id})"),
    });
    w.run.waits.waiting_ctas.push(WaitingCta {
        cta_id: cta_id.into(),
        run_id: asker_run_id.into(),
        child_run_id: child_run_id.into(),
    });
    if let Some(parent) = w.run.origin.parent.clone() {
        let up = Input::ChildWaiting {
            child_run_id: w.run.run_id.clone(),
            asker_run_id: asker_run_id.into(),
            cta_id: cta_id.into(),
            question: question.into(),
        };
        w.send(&parent.run_id, &format!("asks:{cta_id}"), up);
    }
    Next::Commit
}

/// `ChildResumed`: that CTA was answered or expired; the run, and its parent, stop listing it.
pub(super) fn resumed(w: &mut Work, child_run_id: &str, cta_id: &str) -> Next {
    let before = w.run.waits.waiting_ctas.len();
    w.run
        .waits
        .waiting_ctas
        .retain(|c| !(c.cta_id == cta_id && c.child_run_id == child_run_id));
    if w.run.waits.waiting_ctas.len() == before {
        return Next::Now(Step::Ignore(format!("CTA {cta_id} was not listed")));
    }
    w.tell_parent_resumed(cta_id);
    Next::Commit
}

impl Work<'_> {
    /// The pending call child run `child` works for: a `spawn_subagent` call, or a plan's.
    pub(super) fn child_call(&self, child: &str) -> Option<u64> {
        self.pending_where(|t| {
            t.child_run_id.as_deref() == Some(child)
                || t.plan.as_ref().is_some_and(|p| p.owns(child))
        })
    }

    /// Tells the parent, if any, that a CTA in this run's tree no longer waits.
    pub(super) fn tell_parent_resumed(&mut self, cta_id: &str) {
        if let Some(parent) = self.run.origin.parent.clone() {
            let input = Input::ChildResumed {
                child_run_id: self.run.run_id.clone(),
                cta_id: cta_id.into(),
            };
            self.send(&parent.run_id, &format!("resumed:{cta_id}"), input);
        }
    }
}

/// `ChildFinished`: resolve the call that waits for this child, start queued calls in the
/// freed slot, and think once the whole batch has settled (the fan-in).
pub(super) fn finished(
    w: &mut Work,
    child_run_id: &str,
    tool_call_id: &str,
    outcome: &ChildOutcome,
    spent: Spent,
    breakdown: &[crate::cost::CostLine],
) -> Next {
    let Some(seq) = w
        .child_call(child_run_id)
        .filter(|&s| w.tool(s).id == tool_call_id)
    else {
        return Next::Now(Step::Ignore(format!(
            "no pending result waits for child {child_run_id}"
        )));
    };
    w.run.spend.children += spent;
    for line in breakdown {
        crate::cost::add_line(&mut w.run.spend.cost_breakdown, line.clone());
    }
    // Whatever its tree still waited on is over with it.
    w.run
        .waits
        .waiting_ctas
        .retain(|c| c.child_run_id != child_run_id);
    // Its owner refused the tree more budget: the tree ends, not only this subagent.
    if let Some(message) = exhausted(outcome) {
        let message = format!("subagent {child_run_id}: {message}");
        // A plan's call is left to the end, which abandons the plan.
        if w.tool(seq).plan.is_none() {
            w.resolve(seq, ToolResult::error(message.clone()), None);
        }
        w.end(RunStatus::Failed, crate::budget::EXHAUSTED, &message);
        return Next::Commit;
    }
    if w.tool(seq).plan.is_some() {
        return super::plan::child_finished(w, seq, child_run_id, outcome);
    }
    // An action's answer matched its output schema: the parent is given it as JSON too.
    let input = &w.tool(seq).input;
    let structured = input
        .get("action")
        .and_then(Value::as_str)
        .is_some_and(|action| {
            let agent = input
                .get("agent")
                .and_then(Value::as_str)
                .unwrap_or_default();
            w.book
                .agent(agent)
                .and_then(|a| a.actions.get(action))
                .is_some_and(|a| a.output.is_some())
        });
    let result = match outcome {
        ChildOutcome::Completed {
            text,
            step_count,
            total_usage,
        } => {
            let mut output = json!({
                "subagentId": child_run_id,
                "text": text,
                "stepCount": step_count,
                "totalUsage": total_usage,
            });
            if structured && let Ok(v) = serde_json::from_str::<Value>(crate::llm::unfenced(text)) {
                output["output"] = v;
            }
            ToolResult::Success { output }
        }
        ChildOutcome::Ended { status, error, .. } => ToolResult::error(format!(
            "subagent {child_run_id} {}: {error}",
            status.as_str()
        )),
    };
    w.resolve(seq, result, None);
    w.start_queued_children();
    w.after_resolution()
}

/// A child's end that ends its whole tree: more budget was refused it (or not given in
/// time). Its error, if so.
pub(super) fn exhausted(outcome: &ChildOutcome) -> Option<&str> {
    match outcome {
        ChildOutcome::Ended {
            code: Some(code),
            error,
            ..
        } if code == crate::budget::EXHAUSTED => Some(error),
        _ => None,
    }
}

impl Work<'_> {
    pub(super) fn running_children(&self) -> usize {
        self.pending_seqs(|t| t.child_run_id.is_some()).len()
    }

    pub(super) fn spawn(&mut self, seq: u64, id: &str, input: &Value) -> ToolResult {
        let limits = &self.book.limits;
        if let Some(sub) = input.get("subagentId").and_then(Value::as_str) {
            if self.running_children() >= limits.max_parallel_children {
                return ToolResult::Pending {
                    reason: "queued".into(),
                };
            }
            self.resume_child(seq, id, sub, input);
            return ToolResult::Pending {
                reason: "waiting for subagent".into(),
            };
        }
        if let Err(e) = given_context(input).and_then(|()| given_scope(input).map(|_| ())) {
            return ToolResult::error(e);
        }
        if let Err(e) = self.action_of(input) {
            return ToolResult::error(e);
        }
        let ask = input.get("askHuman").and_then(Value::as_bool) == Some(true);
        if ask {
            let may_ask = self.book.agent(&self.run.agent).is_some_and(|a| {
                a.tools
                    .iter()
                    .chain(&self.run.origin.granted)
                    .any(|t| t == REQUEST_HUMAN_FEEDBACK)
            });
            if !may_ask {
                return ToolResult::error(
                    "`askHuman` grants request_human_feedback, which this agent does not have itself",
                );
            }
        }
        if self.run.origin.depth + 1 > limits.max_depth {
            self.refused_depth(crate::tools::SPAWN_SUBAGENT, limits.max_depth);
            return ToolResult::error(format!(
                "subagents may nest at most {} deep; do this work yourself or answer",
                limits.max_depth
            ));
        }
        if self.running_children() >= limits.max_parallel_children {
            return ToolResult::Pending {
                reason: "queued".into(),
            };
        }
        self.start_child(seq, input);
        ToolResult::Pending {
            reason: "waiting for subagent".into(),
        }
    }

    pub(super) fn start_child(&mut self, seq: u64, input: &Value) {
        let text = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_owned);
        // `sub_` marks a subagent run: queues route on it without reading the run.
        let child_id = derive_id("sub", &self.run.run_id, seq);
        let granted = if input.get("askHuman").and_then(Value::as_bool) == Some(true) {
            vec![REQUEST_HUMAN_FEEDBACK.to_owned()]
        } else {
            vec![]
        };
        let agent = text("agent").unwrap_or_default();
        let words = text("prompt");
        let action = self.action_of(input).ok().flatten();
        let prompt = match &action {
            Some((_, a)) => a.prompt_for(words.as_deref(), input.get("input")),
            None => words.unwrap_or_default(),
        };
        self.new_child(&child_id, seq, &agent, prompt, granted, None);
        if let (Some((name, _)), Some((child, _))) = (action, self.new_runs.last_mut()) {
            child.origin.action = Some(name);
        }
        if let (Ok(Some(github)), Some((child, _))) = (given_scope(input), self.new_runs.last_mut())
        {
            child.origin.github = Some(github);
        }
        if let Some(sandbox) = text("sandboxId")
            && let Some((child, _)) = self.new_runs.last_mut()
        {
            child.origin.sandbox_id = Some(sandbox);
        }
        self.tool_mut(seq).child_run_id = Some(child_id);
    }

    /// The action a `spawn_subagent` call names, checked: its agent has it, and the call's
    /// `input` matches its input schema (none named: `None`; an `input` without one is an
    /// error).
    fn action_of(&self, input: &Value) -> Result<Option<(String, crate::agent::Action)>, String> {
        let Some(name) = input.get("action").and_then(Value::as_str) else {
            if input.get("input").is_some() {
                return Err("`input` goes with an `action`".into());
            }
            return Ok(None);
        };
        let agent = input
            .get("agent")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Some(def) = self.book.agent(agent) else {
            return Err(format!("there is no agent `{agent}`"));
        };
        let Some(action) = def.actions.get(name) else {
            let known: Vec<&str> = def.actions.keys().map(String::as_str).collect();
            return Err(format!(
                "agent `{agent}` has no action `{name}` (its actions: {})",
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ));
        };
        action.check_input(name, input.get("input"))?;
        Ok(Some((name.to_owned(), action.clone())))
    }

    /// Creates child run `child_id` of `agent` (in this step's commit) for the call at
    /// `seq`, with `prompt` as its first entry, and starts it. It works on this run's context
    /// unless the call gives its own `context` (`null`: none), asks for this turn's model
    /// tier, and runs under `mode` when a plan starts it (else under this run's mode).
    pub(super) fn new_child(
        &mut self,
        child_id: &str,
        seq: u64,
        agent: &str,
        prompt: String,
        granted: Vec<String>,
        mode: Option<crate::plan::ExecutionMode>,
    ) {
        let call_id = self.tool(seq).id.clone();
        let context = match self.tool(seq).input.get("context") {
            Some(Value::Null) => None,
            Some(given) => Some(given.clone()),
            None => self.run.origin.context.clone(),
        };
        let mut child = Run::new(NewRun {
            run_id: child_id.into(),
            agent: agent.into(),
            owner: self.run.owner.clone(),
            parent: Some(ParentLink {
                run_id: self.run.run_id.clone(),
                tool_call_id: call_id,
            }),
            depth: self.run.origin.depth + 1,
            // Its own agent's policy, else its parent's.
            on_expiry: self
                .book
                .agent(agent)
                .and_then(|a| a.on_expiry)
                .unwrap_or(self.run.origin.on_expiry),
            sandbox_id: self.run.origin.sandbox_id.clone(),
            metadata: None,
            context,
            root_run_id: Some(self.run.root().to_owned()),
            now: self.now,
        });
        child.set_prompt(&prompt);
        let first = Entry {
            seq: 0,
            at: self.now,
            body: EntryBody::user(prompt),
        };
        child.next_seq = 1;
        child.origin.granted = granted;
        child.origin.tier = self.run.origin.tier;
        child.origin.budget = self.run.origin.budget;
        child.origin.github = self.run.origin.github.clone();
        child.origin.execution_mode = mode.or(self.run.origin.execution_mode);
        self.new_runs.push((child, vec![first]));
        self.effects.push(Effect::Send(StepMessage {
            run_id: child_id.into(),
            id: format!("{child_id}:start"),
            input: Input::Start,
            owed: false,
        }));
    }

    pub(super) fn resume_child(&mut self, seq: u64, call_id: &str, child_id: &str, input: &Value) {
        let prompt = input
            .get("prompt")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let message_id = format!("{}/{call_id}", self.run.run_id);
        self.effects.push(Effect::Send(StepMessage {
            run_id: child_id.into(),
            id: format!("{message_id}:resume"),
            input: Input::UserMessage {
                text: prompt.into(),
                message_id,
                reply_to: Some(ParentLink {
                    run_id: self.run.run_id.clone(),
                    tool_call_id: call_id.into(),
                }),
                options: crate::timeline::TurnOptions {
                    tier: self.run.origin.tier,
                    ..Default::default()
                },
            },
            owed: false,
        }));
        self.tool_mut(seq).child_run_id = Some(child_id.into());
    }

    /// Starts queued `spawn_subagent` calls while slots are free, in call order.
    pub(super) fn start_queued_children(&mut self) {
        let queued = self.pending_seqs(|t| {
            t.name == SPAWN_SUBAGENT
                && matches!(&t.result, ToolResult::Pending { reason } if reason == "queued")
        });
        for seq in queued {
            if self.running_children() >= self.book.limits.max_parallel_children {
                break;
            }
            let (id, input) = {
                let t = self.tool(seq);
                (t.id.clone(), t.input.clone())
            };
            if let Some(sub) = input.get("subagentId").and_then(Value::as_str) {
                self.resume_child(seq, &id, sub, &input);
            } else {
                self.start_child(seq, &input);
            }
            self.tool_mut(seq).result = ToolResult::Pending {
                reason: "waiting for subagent".into(),
            };
        }
    }
}

/// A call's own `context` for the runs it starts fits what a run's may hold.
fn given_context(input: &Value) -> Result<(), String> {
    input
        .get("context")
        .map_or(Ok(()), |c| crate::run::check_context_size("context", c))
}

/// A call's own `sandboxId` and `github` are plain names (they reach command lines and
/// paths: see [`crate::scope`]); the repository, if it gave one.
fn given_scope(input: &Value) -> Result<Option<crate::scope::GithubRepo>, String> {
    if let Some(id) = input.get("sandboxId").and_then(Value::as_str) {
        crate::scope::check_sandbox_id(id)?;
    }
    let Some(github) = input.get("github") else {
        return Ok(None);
    };
    let github: crate::scope::GithubRepo =
        serde_json::from_value(github.clone()).map_err(|e| format!("`github`: {e}"))?;
    crate::scope::check_github(&github)?;
    Ok(Some(github))
}
