//! Plans (`agent_orchestrate`), as tables of given/when/then on the in-memory world: the
//! helpers here, how a plan runs in `running.rs`, how one is planned and reviewed in
//! `review.rs`.

use super::*;
use baton_engine::plan::{PlanState, StepStatus};
use baton_engine::timeline::Operation;

fn plan_call(input: Value) -> LlmReply {
    calls(vec![call("agent_orchestrate", input)])
}

fn state(s: &Sim, id: &str) -> PlanState {
    *s.tools(id)[0].plan.clone().expect("a plan call")
}

fn status(s: &Sim, id: &str, step: &str) -> StepStatus {
    state(s, id).steps[step].status
}

fn child_of(s: &Sim, id: &str, step: &str) -> String {
    state(s, id).steps[step]
        .child_run_id
        .clone()
        .expect("started")
}

fn first_prompt(s: &Sim, run: &str) -> String {
    match &s.runs[run].1[0].body {
        EntryBody::User { text, .. } => text.clone(),
        other => panic!("{other:?}"),
    }
}

fn output(s: &Sim, id: &str) -> Value {
    match &s.tools(id)[0].result {
        ToolResult::Success { output } => output.clone(),
        other => panic!("{other:?}"),
    }
}

fn error(s: &Sim, id: &str) -> String {
    match &s.tools(id)[0].result {
        ToolResult::Error { error } => error.clone(),
        other => panic!("{other:?}"),
    }
}

/// Starts the orchestrator's run and takes its first step (the plan call).
fn start(s: &mut Sim) -> String {
    let id = s.create("orchestrator", "go");
    let first = s.queue.pop_front().expect("start");
    s.deliver(&first);
    id
}

/// Delivers queued messages, except those for `held`, until only those are left.
fn run_all_but(s: &mut Sim, held: &str) {
    while let Some(i) = s.queue.iter().position(|m| m.run_id != held) {
        let m = s.queue.remove(i).expect("queued");
        s.deliver(&m);
    }
}

fn sent(s: &Sim, to: &str, pred: impl Fn(&Input) -> bool) -> usize {
    s.effects
        .iter()
        .filter(|e| matches!(e, Effect::Send(m) if m.run_id == to && pred(&m.input)))
        .count()
}

mod conversation;
mod review;
mod running;
