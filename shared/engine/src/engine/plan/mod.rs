//! Plans: an `agent_orchestrate` call, from its plan (given, or written by the planner agent)
//! through an optional review (a human's approval CTA, or the reviewer agent's verdict) to its
//! steps' child runs and the merged result.
//!
//! The plan's state rides on its call's timeline entry ([`ToolEntry::plan`]), so each move
//! of a plan is committed with the run, and its child runs are created in that same commit
//! with ids derived from the run, the call's seq and the step's id: a crash anywhere, or a
//! message handled twice, starts no child twice.
//!
//! [`ToolEntry::plan`]: crate::timeline::ToolEntry

mod drafts;
mod held;
mod inputs;
mod phases;
mod prompts;

use serde_json::{Map, Value, json};

pub(in crate::engine) use inputs::{answered, child_finished, timer};
use prompts::{planner_prompt, reviewer_prompt, summary};

use super::{MAX_OUTPUT_BYTES, Next, Step, Work, cap_at, cap_output, derive_id, preview};
use crate::agent::AgentDef;
use crate::cta::{CtaResponse, CtaStatus};
use crate::message::{ChildOutcome, Effect, Input, StepMessage};
use crate::plan::{
    self, AgentStep, ExecutionMode, Merge, Phase, Plan, PlanState, Root, Scope, StepStatus,
};
use crate::run::ParentLink;
use crate::timeline::{CtaSnapshot, ToolResult};

/// A step's output is kept (and passed on) up to this size; the child's timeline has it all.
pub const MAX_STEP_OUTPUT_BYTES: usize = 16 * 1024;

/// The child run (or timer) id of `tag` under the call at `seq`.
fn tagged(prefix: &str, run_id: &str, seq: u64, tag: &str) -> String {
    derive_id(prefix, &format!("{run_id}/{tag}"), seq)
}

/// `agent_orchestrate`'s input, read after its schema has been checked.
struct Call {
    plan: Option<Value>,
    prompt: Option<String>,
    bindings: Map<String, Value>,
    timeout_ms: Option<u64>,
    max_parallel: Option<usize>,
    mode: ExecutionMode,
    /// How a draft is approved, if the call says.
    approval: Option<plan::PlanApproval>,
    /// What the plan must produce, and what it must attend to first (for the planner).
    requested_outputs: Vec<String>,
    priority_entities: Vec<String>,
}

impl Call {
    fn read(input: &Value) -> Self {
        let mode = match input.get("execution_mode").and_then(Value::as_str) {
            Some("draft_only") => ExecutionMode::DraftOnly,
            Some("agent_review") => ExecutionMode::AgentReview,
            Some(_) => ExecutionMode::AutoExecute,
            // The seed's legacy flag: `auto_execute: false` drafts.
            None if input.get("auto_execute") == Some(&Value::Bool(false)) => {
                ExecutionMode::DraftOnly
            }
            None => ExecutionMode::AutoExecute,
        };
        Self {
            plan: input.get("plan").cloned(),
            prompt: input
                .get("prompt")
                .and_then(Value::as_str)
                .map(str::to_owned),
            bindings: input
                .get("bindings")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            timeout_ms: input.get("timeout_ms").and_then(Value::as_u64),
            max_parallel: input
                .get("max_parallel")
                .and_then(Value::as_u64)
                .map(|n| n as usize),
            mode,
            approval: match input.get("approval").and_then(Value::as_str) {
                Some("question") => Some(plan::PlanApproval::Question),
                Some("conversation") => Some(plan::PlanApproval::Conversation),
                _ => None,
            },
            requested_outputs: strings(input, "requested_outputs"),
            priority_entities: strings(input, "priority_entities"),
        }
    }
}

/// The strings of an array field of `input` (none if it is absent).
fn strings(input: &Value, field: &str) -> Vec<String> {
    input
        .get(field)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl<'a> Work<'a> {
    /// Dispatches an `agent_orchestrate` call (its input valid against the tool's schema).
    pub(super) fn orchestrate(
        &mut self,
        agent: &AgentDef,
        seq: u64,
        call_id: &str,
        input: &Value,
    ) -> ToolResult {
        let limits = self.book.limits.plan;
        if self.run.origin.depth + 1 > limits.max_depth {
            self.refused_depth(plan::AGENT_ORCHESTRATE, limits.max_depth);
            return ToolResult::error(format!(
                "a plan runs its steps as subagents, which may nest at most {} deep; this run \
                 is at depth {}: do this work yourself",
                limits.max_depth, self.run.origin.depth
            ));
        }
        if let Err(e) = input
            .get("context")
            .map_or(Ok(()), |c| crate::run::check_context_size("context", c))
        {
            return ToolResult::error(e);
        }
        let mut call = Call::read(input);
        // An approval policy on the tool drafts the plan for a human, whatever the call says.
        let held_by_policy = agent
            .approval
            .get(plan::AGENT_ORCHESTRATE)
            .is_some_and(|p| p.requires(input));
        if held_by_policy {
            call.mode = ExecutionMode::DraftOnly;
        }
        let step_timeout = limits.step_timeout.map(|d| d.as_millis() as u64);
        // A draft is approved as the call says, else as its agent does; one an approval
        // policy made is a person's gate: a question.
        let approval = match held_by_policy {
            true => plan::PlanApproval::Question,
            false => call.approval.or(agent.plan_approval).unwrap_or_default(),
        };
        let mut state = PlanState {
            approval,
            mode: call.mode,
            phase: Phase::Planning,
            objective: call.prompt.clone(),
            plan: None,
            bindings: call.bindings,
            max_parallel: call
                .max_parallel
                .map_or(limits.max_parallel, |n| n.min(limits.max_parallel)),
            timeout_ms: [call.timeout_ms, step_timeout].into_iter().flatten().min(),
            helper: None,
            planner_run_id: None,
            attempts: 0,
            steps: Default::default(),
            started_at: Some(self.now),
            phase_since: None,
            held_by_policy,
            review: None,
        };
        let result = match (call.plan, call.prompt) {
            (Some(raw), _) => match self.parse_plan(&raw) {
                Ok(plan) => self.with_plan(seq, call_id, &mut state, plan),
                Err(e) => return ToolResult::error(format!("the plan is not valid: {e}")),
            },
            (None, Some(objective)) => {
                let child = tagged("sub", &self.run.run_id, seq, "planner");
                let mut text = planner_prompt(
                    &objective,
                    &state.bindings,
                    &call.requested_outputs,
                    &call.priority_entities,
                );
                let required = self.plan_requirements();
                if !required.is_empty() {
                    text.push_str(&format!(
                        "\n\nThe plan must include, in this order (each in a later step than \
                         the one before):\n{}",
                        plan::describe_required(required)
                    ));
                }
                // What this agent is told for the run's kind of context guides its plan too.
                let kind = self.run.context_type().unwrap_or("");
                if let Some(guidance) = agent.context_guidance.get(kind) {
                    text.push_str(&format!(
                        "\n\nGuidance for this context ({kind}): {guidance}"
                    ));
                }
                self.new_child(&child, seq, plan::PLANNER, text, vec![], Some(state.mode));
                self.enter(call_id, &mut state, Phase::Planning);
                state.planner_run_id = Some(child.clone());
                state.helper = Some(child);
                state.attempts = 1;
                Some(ToolResult::Pending {
                    reason: "the planner is writing the plan".into(),
                })
            }
            (None, None) => return ToolResult::error("give `plan` or `prompt`"),
        };
        if let Some(r) = result.as_ref().filter(|r| !r.is_pending()) {
            self.plan_ended(call_id, &mut state, r);
        }
        self.tool_mut(seq).plan = Some(Box::new(state));
        result.unwrap_or_else(|| ToolResult::Pending {
            reason: "running the plan".into(),
        })
    }

    /// Says on the bus that a guardrail refused a call: a subagent past the depth cap.
    pub(in crate::engine) fn refused_depth(&mut self, tool: &str, max_depth: u32) {
        self.publish(
            "run.refused",
            json!({"runId": self.run.run_id, "guardrail": "depth", "tool": tool,
                   "depth": self.run.origin.depth, "maxDepth": max_depth}),
        );
    }

    /// The plan in `raw`, checked: its form, its caps and agents, and the steps the calling
    /// agent requires of a plan for the run's context type.
    pub(in crate::engine) fn parse_plan(&self, raw: &Value) -> Result<Plan, String> {
        let book = self.book;
        let plan = Plan::parse(raw, book.limits.plan.max_steps, |a| book.is_subagent(a))?;
        for a in plan.agent_steps() {
            if let Some(name) = &a.action
                && !book
                    .agent(&a.agent)
                    .is_some_and(|d| d.actions.contains_key(name))
            {
                return Err(format!(
                    "step `{}`: agent `{}` has no action `{name}`",
                    a.id, a.agent
                ));
            }
        }
        plan.check_required(self.plan_requirements())?;
        Ok(plan)
    }

    /// What the run's agent requires of a plan for the run's context type.
    fn plan_requirements(&self) -> &'a [plan::Required] {
        self.book
            .agent(&self.run.agent)
            .map_or(&[], |a| a.plan_requirements(self.run.context_type()))
    }

    /// The plan is known: say so, then run it, or have it reviewed first. `Some` is the
    /// call's result (pending, or final when nothing was left to run).
    fn with_plan(
        &mut self,
        seq: u64,
        call_id: &str,
        state: &mut PlanState,
        plan: Plan,
    ) -> Option<ToolResult> {
        self.publish(
            "plan.created",
            json!({"runId": self.run.run_id, "callId": call_id, "mode": state.mode, "plan": plan}),
        );
        state.set_plan(plan);
        match state.mode {
            ExecutionMode::AutoExecute => self.advance(seq, call_id, state),
            ExecutionMode::DraftOnly => {
                self.enter(call_id, state, Phase::AwaitingApproval);
                Some(match state.approval {
                    plan::PlanApproval::Question => self.draft(seq, call_id, state),
                    plan::PlanApproval::Conversation => self.draft_told(call_id, state),
                })
            }
            ExecutionMode::AgentReview => {
                self.enter(call_id, state, Phase::Reviewing);
                let child = tagged("sub", &self.run.run_id, seq, "review");
                let text = reviewer_prompt(state);
                self.new_child(
                    &child,
                    seq,
                    plan::PLAN_REVIEWER,
                    text,
                    vec![],
                    Some(state.mode),
                );
                state.helper = Some(child);
                Some(ToolResult::Pending {
                    reason: "the reviewer is reading the plan".into(),
                })
            }
        }
    }

    /// Starts what can start; `Some(result)` once every step is done.
    pub(in crate::engine) fn advance(
        &mut self,
        seq: u64,
        call_id: &str,
        state: &mut PlanState,
    ) -> Option<ToolResult> {
        let plan = state.plan.clone()?;
        for step in &plan.steps {
            match step {
                plan::Step::Agent(a) => {
                    if state.steps.get(&a.id).map(|s| s.status) == Some(StepStatus::Pending) {
                        self.enter(call_id, state, Phase::Dispatching);
                        self.start_step(seq, call_id, state, a);
                    }
                }
                plan::Step::Parallel(p) => {
                    let cap = p
                        .max_concurrency
                        .map_or(state.max_parallel, |c| (c as usize).min(state.max_parallel))
                        .max(1);
                    for a in &p.parallel {
                        let running = p
                            .parallel
                            .iter()
                            .filter(|a| state.steps[&a.id].status == StepStatus::Running)
                            .count();
                        if running >= cap {
                            break;
                        }
                        if state.steps[&a.id].status == StepStatus::Pending {
                            self.enter(call_id, state, Phase::Dispatching);
                            self.start_step(seq, call_id, state, a);
                        }
                    }
                }
            }
            if !state.status_of(step).is_done() {
                self.enter(call_id, state, Phase::AwaitingResults);
                self.tool_mut(seq).result = ToolResult::Pending {
                    reason: format!("running plan step `{}`", step_id(step)),
                };
                return None;
            }
        }
        self.enter(call_id, state, Phase::Merging);
        let output = state.output();
        let mut detail =
            json!({"runId": self.run.run_id, "callId": call_id, "success": output["success"]});
        if let Some(at) = state.started_at {
            detail["durationMs"] = json!((self.now - at).num_milliseconds().max(0));
        }
        self.publish("plan.completed", detail);
        Some(ToolResult::Success {
            output: cap_output(output),
        })
    }

    /// Starts one agent step's child run, or settles it at once: skipped when it uses the
    /// result of a step that did not succeed, failed when a template cannot be filled or
    /// the run's deadline has passed.
    fn start_step(&mut self, seq: u64, call_id: &str, state: &mut PlanState, a: &AgentStep) {
        let refs = a.refs().unwrap_or_default();
        let failed_dep = refs
            .iter()
            .filter(|r| r.root == Root::Result)
            .find_map(|r| state.producer_failed(&r.key));
        let settled = failed_dep.map(|from| {
            (
                StepStatus::Skipped,
                format!("skipped: it uses the result of step `{from}`, which did not succeed"),
            )
        });
        let results = state.results();
        let rendered = a.render(&Scope {
            results: &results,
            bindings: &state.bindings,
        });
        let mut limit = [state.timeout_ms, a.timeout_ms].into_iter().flatten().min();
        let remaining = self
            .book
            .agent(&self.run.agent)
            .and_then(|agent| agent.max_wall)
            .map(|max| max.as_millis() as i64 - self.run.working_time(self.now).num_milliseconds());
        // An action's input, checked before its child starts.
        let action = a.action.as_deref().and_then(|name| {
            let def = self.book.agent(&a.agent)?.actions.get(name)?;
            Some((name, def.clone()))
        });
        let checked = match &action {
            Some((name, def)) => a
                .input(&Scope {
                    results: &results,
                    bindings: &state.bindings,
                })
                .and_then(|input| def.check_input(name, input.as_ref())),
            None => Ok(()),
        };
        let settled = settled.or_else(|| match (&rendered, remaining) {
            (Err(e), _) => Some((StepStatus::Failed, e.clone())),
            (_, _) if checked.is_err() => Some((
                StepStatus::Failed,
                format!("not started: {}", checked.clone().err().unwrap_or_default()),
            )),
            (_, Some(left)) if left <= 0 => Some((
                StepStatus::Failed,
                "not started: the run's maxWallSeconds has passed".to_owned(),
            )),
            _ => None,
        });
        if let Some((status, error)) = settled {
            if let Some(s) = state.steps.get_mut(&a.id) {
                s.status = status;
                s.error = Some(error);
            }
            self.step_completed(call_id, a, state);
            return;
        }
        if let Some(left) = remaining {
            limit = Some(limit.map_or(left as u64, |l| l.min(left as u64)));
        }
        let child = tagged("sub", &self.run.run_id, seq, &a.id);
        let rendered = rendered.unwrap_or_default();
        let prompt = match &action {
            Some((_, def)) => def.prompt_for(Some(&rendered), None),
            None => rendered,
        };
        self.new_child(&child, seq, &a.agent, prompt, vec![], Some(state.mode));
        if let (Some((name, _)), Some((run, _))) = (&action, self.new_runs.last_mut()) {
            run.origin.action = Some((*name).to_owned());
        }
        let Some(s) = state.steps.get_mut(&a.id) else {
            return;
        };
        s.status = StepStatus::Running;
        s.child_run_id = Some(child.clone());
        s.started_at = Some(self.now);
        if let Some(ms) = limit {
            let timer_id = tagged("tmr", &self.run.run_id, seq, &a.id);
            let at = self.now + chrono::Duration::milliseconds(ms as i64);
            s.timer_id = Some(timer_id.clone());
            s.deadline = Some(at);
            self.effects.push(Effect::Timer {
                timer_id,
                run_id: self.run.run_id.clone(),
                at,
            });
        }
        self.publish(
            "plan.step.started",
            json!({"runId": self.run.run_id, "callId": call_id, "stepId": a.id,
                   "agent": a.agent, "childRunId": child}),
        );
    }

    fn step_completed(&mut self, call_id: &str, a: &AgentStep, state: &mut PlanState) {
        let now = self.now;
        let Some(s) = state.steps.get_mut(&a.id) else {
            return;
        };
        if let Some(at) = s.started_at {
            s.duration_ms = Some((now - at).num_milliseconds().max(0) as u64);
        }
        let mut detail = json!({"runId": self.run.run_id, "callId": call_id, "stepId": a.id,
                                "status": s.status});
        if let Some(ms) = s.duration_ms {
            detail["durationMs"] = json!(ms);
        }
        if let Some(c) = &s.child_run_id {
            detail["childRunId"] = json!(c);
        }
        if let Some(e) = &s.error {
            detail["error"] = json!(e);
        }
        self.publish("plan.step.completed", detail);
    }

    /// Ends a running step: its timer is cancelled, and its child too unless it ended.
    fn stop_step(
        &mut self,
        call_id: &str,
        state: &mut PlanState,
        a: &AgentStep,
        status: StepStatus,
        error: String,
        cancel_child: bool,
    ) {
        let Some(s) = state.steps.get_mut(&a.id) else {
            return;
        };
        s.status = status;
        s.error = Some(error.clone());
        if let Some(t) = s.timer_id.clone() {
            self.effects.push(Effect::CancelTimer { timer_id: t });
        }
        if cancel_child && let Some(child) = s.child_run_id.clone() {
            self.cancel_child(&child, &error);
        }
        self.step_completed(call_id, a, state);
    }

    pub(super) fn cancel_child(&mut self, child: &str, reason: &str) {
        let id = format!("{child}:cancel:{}", self.run.run_id);
        self.effects.push(Effect::Send(StepMessage {
            run_id: child.into(),
            id,
            input: Input::Cancel {
                reason: reason.into(),
            },
            owed: false,
        }));
    }

    /// The run is ending with this plan call pending: its children are cancelled, its
    /// timers too.
    pub(super) fn abandon_plan(&mut self, state: &PlanState, why: &str) {
        for child in state.live_children() {
            self.cancel_child(child, &format!("parent {why}"));
        }
        for s in state.steps.values() {
            if s.status == StepStatus::Running
                && let Some(t) = &s.timer_id
            {
                self.effects.push(Effect::CancelTimer {
                    timer_id: t.clone(),
                });
            }
        }
    }

    fn take_plan(&mut self, seq: u64) -> Option<(String, PlanState)> {
        let t = self.tool_mut(seq);
        let state = t.plan.take()?;
        Some((t.id.clone(), *state))
    }

    /// Puts the state back and resolves the call if `result` is final.
    fn settle_plan(&mut self, seq: u64, state: PlanState, result: Option<ToolResult>) -> Next {
        let mut state = state;
        if let Some(r) = result.as_ref().filter(|r| !r.is_pending()) {
            let call_id = self.tool(seq).id.clone();
            self.plan_ended(&call_id, &mut state, r);
        }
        self.tool_mut(seq).plan = Some(Box::new(state));
        match result {
            Some(r) if !r.is_pending() => {
                self.resolve(seq, r, None);
                self.after_resolution()
            }
            Some(r) => {
                self.tool_mut(seq).result = r;
                Next::Commit
            }
            None => Next::Commit,
        }
    }
}

fn step_id(step: &plan::Step) -> &str {
    match step {
        plan::Step::Agent(a) => &a.id,
        plan::Step::Parallel(p) => &p.id,
    }
}

/// A step output kept whole up to `max` bytes of JSON, else its preview.
fn cap_output_at(v: Value, max: usize) -> Value {
    let size = v.to_string().len();
    if size <= max.min(MAX_OUTPUT_BYTES) {
        return v;
    }
    json!({"truncated": true, "originalBytes": size, "preview": cap_at(v.to_string(), max)})
}
