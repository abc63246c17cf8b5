//! The iteration itself: ask the model (unless a guardrail ends the turn), record its reply,
//! and dispatch each tool call to a tool run, a CTA or a child run.

use std::time::Duration;

use serde_json::{Value, json};

use super::{
    Io, MAX_CTA_REQUEST_BYTES, MAX_REPLY_BYTES, PREVIEW_BYTES, Step, Work, cap_at, cap_output,
    preview,
};
use crate::agent::{AgentDef, ApprovalBatch, Prepared};
use crate::cta::Gated;
use crate::cta::{CtaRequest, CtaResponse};
use crate::run::RunStatus;
use crate::timeline::{EXECUTING, EntryBody, ToolEntry, ToolResult};
use crate::tools::{Effects, ToolKind};

/// The code a run ends `failed` with when its owner's daily allowance is spent before its
/// next model call.
pub const QUOTA_EXCEEDED: &str = "quota_exceeded";

/// One tool call of a reply, as dispatch needs it.
pub(super) struct Call<'a> {
    pub(super) seq: u64,
    pub(super) id: &'a str,
    pub(super) name: &'a str,
}

impl Work<'_> {
    /// Thinks and dispatches. Returns what the service must fetch first, if anything.
    pub(super) fn think(&mut self, io: &Io) -> Option<Step> {
        let book = self.book;
        if self.unsaved_effects {
            // An output with effects is committed before the next think: this step commits
            // it, and the run thinks in its next delivery.
            self.run.status = RunStatus::Running;
            self.send_continue();
            return None;
        }
        let Some(agent) = book.agent(&self.run.agent) else {
            let msg = format!(
                "agent `{}` is not defined in this deployment",
                self.run.agent
            );
            self.end(RunStatus::Failed, "unknown_agent", &msg);
            return None;
        };
        if self.run.counters.turn_thinks >= agent.max_iterations {
            let msg = format!(
                "stopped after {} iterations, the limit for agent `{}`",
                agent.max_iterations, agent.name
            );
            self.set_result(msg.clone(), None);
            self.end(RunStatus::Completed, "max_iterations", &msg);
            return None;
        }
        if let Some(max) = agent.max_wall {
            let worked = self.run.working_time(self.now);
            if worked.num_milliseconds() > max.as_millis() as i64 {
                let msg = format!(
                    "stopped after working {} s, past maxWallSeconds = {} for agent `{}` \
                     (time waiting for a human, or between turns, is not counted)",
                    worked.num_seconds(),
                    max.as_secs(),
                    agent.name
                );
                self.end(RunStatus::Failed, "deadline_exceeded", &msg);
                return None;
            }
        }
        if let Some(error) = &io.model_error {
            self.end(RunStatus::Failed, "model_error", error);
            return None;
        }
        // A turn that asks nothing (a blank prompt or follow-up) is answered without the
        // model: the agent's clarifying reply, as a reply of its own (seed 001, 4.5).
        if self.run.counters.turn_thinks == 0 && self.run.prompt.as_deref() == Some("") {
            self.run.counters.turn_thinks += 1;
            let text = agent.clarifying_reply.clone();
            let seq = self.push(EntryBody::Assistant {
                text: Some(text.clone()),
                usage: Default::default(),
                model: None,
                cost_usd: None,
                operation: agent.operation,
                latency_ms: None,
                first_token_ms: None,
                truncated: false,
                stop_reason: None,
                fallbacks: Vec::new(),
                reasoning: None,
            });
            self.set_result(text, Some(seq));
            self.end(RunStatus::Completed, "", "");
            return None;
        }
        // The reply to this think, if the step has it (one to another think is not this
        // one's: the step was stepped again after a conflict and its run had moved on).
        let reply = io
            .reply
            .as_ref()
            .filter(|_| io.think_index == Some(self.run.counters.thinks));
        if reply.is_none()
            && let Some(asked) = self.check_budget(agent, io)
        {
            return asked;
        }
        if reply.is_none() {
            // The owner's allowance of the day is checked where money is spent: before each
            // model call, not only when a run is admitted. Past it, the run ends; calls
            // already under way (other runs' thinks) finish, which bounds the overshoot.
            match io.day_spend {
                None => return Some(Step::ReadDaySpend),
                Some(Some(day)) if day.spent_usd >= day.limit_usd => {
                    let msg = format!(
                        "its owner has spent ${:.4} of the ${:.4} a day allows \
                         (BATON_MAX_DAILY_COST_USD_PER_OWNER) on model calls: the run stopped \
                         before its next one; the allowance starts again at midnight UTC",
                        day.spent_usd, day.limit_usd
                    );
                    self.end(RunStatus::Failed, QUOTA_EXCEEDED, &msg);
                    return None;
                }
                Some(_) => {}
            }
        }
        let Some(reply) = reply else {
            // What this step changed before its think (an answer resolving a call, a
            // follow-up's message) is part of what the model must be given.
            let changed = self
                .updated
                .values()
                .chain(&self.appended)
                .cloned()
                .collect();
            return Some(Step::Think {
                think_index: self.run.counters.thinks,
                changed,
            });
        };
        self.run.counters.thinks += 1;
        self.run.counters.turn_thinks += 1;
        // The plugins' state after their answer commits with the step that thought.
        if let Some(p) = &io.prepared {
            self.run.plugin_state.extend(p.states.clone());
        }
        self.run.spend.usage += reply.usage;
        let model = reply.model.clone();
        let cost_usd = model
            .as_deref()
            .and_then(|m| book.prices.cost(m, &reply.usage));
        self.run.spend.cost_usd += cost_usd.unwrap_or(0.0);
        let line = crate::cost::CostLine {
            operation: agent.operation,
            model: model.clone(),
            context_type: self.run.context_type().map(str::to_owned),
            execution_mode: self.run.origin.execution_mode,
            calls: 1,
            usage: reply.usage,
            cost_usd: cost_usd.unwrap_or(0.0),
        };
        crate::cost::add_line(&mut self.run.spend.cost_breakdown, line);
        let text = reply.text.clone().map(|t| cap_at(t, MAX_REPLY_BYTES));
        let reply_seq = self.push(EntryBody::Assistant {
            text: text.clone(),
            usage: reply.usage,
            model,
            cost_usd,
            operation: agent.operation,
            latency_ms: reply.latency_ms,
            first_token_ms: reply.first_token_ms,
            truncated: reply.cut.is_some(),
            stop_reason: reply.cut.clone(),
            fallbacks: reply.fallbacks.clone(),
            reasoning: reply.reasoning.clone(),
        });
        if reply.tool_calls.is_empty()
            && let Some(reason) = &reply.cut
        {
            // A cut text is no answer: the model is asked again (within the turn's
            // iterations), told why, and the turn's result is the reply that fits.
            self.ask_again(format!(
                "[Baton: your last reply was cut off at its output limit (the provider said \
                 `{reason}`) and was not delivered. Answer again, complete and shorter, so \
                 that it fits.]"
            ));
            return None;
        }
        if reply.tool_calls.is_empty() {
            let answer = text.unwrap_or_default();
            let output = agent.output_for(self.run.origin.action.as_deref());
            if let Some(output) = output
                && let Err(why) = check_output(output.as_ref(), &answer)
            {
                // An answer of the wrong shape is no answer: the model is told what is
                // wrong and asked again (within the turn's iterations).
                self.ask_again(format!(
                    "[Baton: your final answer must be one JSON object that matches the \
                     output schema you were given, with nothing around it. It was not \
                     delivered: {why}. Answer again, in that shape.]"
                ));
                return None;
            }
            self.run.outcome.structured = output.is_some();
            let answer = match output {
                Some(_) => crate::llm::unfenced(&answer).to_owned(),
                None => answer,
            };
            self.set_result(answer, Some(reply_seq));
            self.end(RunStatus::Completed, "", "");
            return None;
        }
        if self.run.counters.tools_spent {
            // Asked for a final answer without tools, it called tools again.
            let msg = format!(
                "the model kept calling tools after this turn's {} tool calls \
                 (maxToolCallsPerTurn of agent `{}`), asked for a final answer without them",
                agent.max_tool_calls_per_turn, agent.name
            );
            self.end(RunStatus::Failed, "tool_call_limit", &msg);
            return None;
        }
        let mut capped = 0;
        // The calls its host runs, by seq, with their effects.
        let mut executions: Vec<(u64, Effects)> = Vec::new();
        let mut ids = std::collections::HashSet::new();
        // What the model was offered: the plugins' answer for this step.
        let prepared = io
            .prepared
            .as_ref()
            .map_or_else(|| agent.granted(self.given), |p| p.prepared.clone());
        // Kept for the calls of this reply that will wait: they are checked against it then.
        self.run.offered = prepared
            .tools
            .iter()
            .filter(|t| !self.run.origin.granted.contains(t))
            .cloned()
            .collect();
        for (i, call) in reply.tool_calls.iter().enumerate() {
            let mut id = if call.id.is_empty() {
                format!("call_{}_{i}", self.run.counters.thinks - 1)
            } else {
                call.id.clone()
            };
            if !ids.insert(id.clone()) {
                id = format!("{id}_{i}");
                ids.insert(id.clone());
            }
            let parsed = if call.arguments.trim().is_empty() {
                Ok(json!({}))
            } else {
                serde_json::from_str::<Value>(&call.arguments)
            };
            let input = match &parsed {
                Ok(v) => v.clone(),
                Err(_) => Value::String(call.arguments.clone()),
            };
            let seq = self.push(EntryBody::Tool(ToolEntry::new(
                id.clone(),
                call.name.clone(),
                input.clone(),
                ToolResult::pending("dispatching"),
                reply_seq,
            )));
            let max = agent.max_tool_calls_per_turn;
            let cut_off = reply.cut.is_some() && i + 1 == reply.tool_calls.len();
            let result = if cut_off {
                // The call the reply was writing when it was cut: its input may be whole
                // by chance, but it is not what the model meant to send.
                ToolResult::error(
                    "not run: the reply was cut off at its output limit while writing this \
                     call; call it again (with a shorter input) if you still need it",
                )
            } else if self.run.counters.turn_tool_calls >= max {
                capped += 1;
                ToolResult::error(format!(
                    "not run: this turn's limit of {max} tool calls is reached; answer with what \
                     you have"
                ))
            } else if let Err(e) = parsed {
                self.run.counters.turn_tool_calls += 1;
                ToolResult::error(format!("arguments are not valid JSON: {e}"))
            } else {
                self.run.counters.turn_tool_calls += 1;
                let call = Call {
                    seq,
                    id: &id,
                    name: &call.name,
                };
                self.dispatch(agent, &prepared, call, input, &mut executions)
            };
            self.tool_mut(seq).result = result;
            self.time_call(seq, io);
        }
        if capped > 0 {
            // The turn's calls are spent: said in the timeline and on the bus, and the
            // model's next think (once the calls that run are back) is for a final answer.
            let msg = format!(
                "{capped} tool call(s) not run: the turn asked for {} and agent `{}` may make {} \
                 (maxToolCallsPerTurn); the model is asked for its final answer without tools",
                self.run.counters.turn_tool_calls + capped,
                agent.name,
                agent.max_tool_calls_per_turn,
            );
            self.push(EntryBody::Error {
                code: "tool_call_limit".into(),
                message: msg.clone(),
            });
            let event =
                json!({"runId": self.run.run_id, "code": "tool_call_limit", "message": msg});
            self.publish("run.error", event);
            self.run.counters.tools_spent = true;
        }
        // A call of this reply waits for approval: the others wait with it (unless the
        // agent says its calls are independent), and run when the approvals are settled.
        let gated = self.new_ctas.iter().any(|c| c.gate);
        if gated && agent.approval_batch == ApprovalBatch::Deferred {
            for (seq, _) in executions.drain(..) {
                self.tool_mut(seq).result = ToolResult::Pending {
                    reason: super::DEFERRED.into(),
                };
            }
        }
        if !executions.is_empty() {
            // The reply is committed with its calls due before any of them runs. Calls that
            // change nothing run in the run's next delivery, before it thinks, and their
            // outputs ride in its commit; the others run once this commit is in.
            self.run.status = RunStatus::Running;
            if executions.iter().all(|(_, e)| *e == Effects::None) {
                self.send_continue();
            } else {
                self.checkpoint(io);
            }
            return None;
        }
        if self.pending_where(|_| true).is_some() {
            self.run.status = RunStatus::Waiting;
        } else {
            self.run.status = RunStatus::Running;
            self.send_continue();
        }
        None
    }

    /// `request_human_feedback`: the question, checked, raised as a CTA. `expiresInSeconds`
    /// may shorten the wait, never lengthen it past the agent's; `default` must answer the
    /// question as a human would.
    fn ask_human(&mut self, agent: &AgentDef, seq: u64, id: &str, mut input: Value) -> ToolResult {
        let fields = input.as_object_mut();
        let (asked, default) = match fields {
            Some(o) => (o.remove("expiresInSeconds"), o.remove("default")),
            None => (None, None),
        };
        let expiry = asked
            .and_then(|v| v.as_u64())
            .map(Duration::from_secs)
            .map_or(agent.cta_expiry, |d| d.min(agent.cta_expiry));
        let request = match serde_json::from_value::<CtaRequest>(input) {
            Ok(req) => req,
            Err(e) => return ToolResult::error(format!("invalid CTA request: {e}")),
        };
        if let Err(e) = request.validate() {
            return ToolResult::error(e.to_string());
        }
        let default = match default.map(|d| CtaResponse::default_for(&request, d)) {
            None => None,
            Some(Ok(d)) => Some(d),
            Some(Err(e)) => return ToolResult::error(e.to_string()),
        };
        let size = serde_json::to_string(&(&request, &default)).map_or(usize::MAX, |s| s.len());
        if size > MAX_CTA_REQUEST_BYTES {
            return ToolResult::error(format!(
                "the question is {size} bytes; ask in at most {MAX_CTA_REQUEST_BYTES} (a human \
                 has to read it)"
            ));
        }
        let ask = super::ask::Ask {
            request,
            default,
            gated: None,
            gate: false,
            expiry,
            budget: None,
        };
        self.raise_cta(seq, id, ask)
    }

    pub(super) fn dispatch(
        &mut self,
        agent: &AgentDef,
        prepared: &Prepared,
        call: Call<'_>,
        input: Value,
        executions: &mut Vec<(u64, Effects)>,
    ) -> ToolResult {
        let Call { seq, id, name } = call;
        let Some(def) = self.book.tool_for(agent, prepared, name) else {
            return ToolResult::error(format!(
                "unknown tool `{name}`; this agent's tools are: {}",
                if agent.tools.is_empty() {
                    "(none)".to_owned()
                } else {
                    agent.tools.join(", ")
                }
            ));
        };
        if let Err(e) = def.validate(&input) {
            return ToolResult::error(e);
        }
        if def.kind() == ToolKind::Exec {
            self.tool_mut(seq).effects = Some(def.effects());
        }
        match def.kind() {
            ToolKind::Spawn => self.spawn(seq, id, &input),
            ToolKind::Orchestrate => self.orchestrate(agent, seq, id, &input),
            ToolKind::Feedback => self.ask_human(agent, seq, id, input),
            ToolKind::Exec => {
                let policy = agent.approval.get(name).filter(|p| p.requires(&input));
                if policy.is_some() || def.needs_approval(&input) {
                    let (shown, _) = preview(&input.to_string(), PREVIEW_BYTES);
                    let message = format!("Allow `{name}` to run with input {shown}?");
                    let approval = CtaRequest::Approval { message };
                    let reason = policy
                        .and_then(|p| p.reason.clone())
                        .or_else(|| def.approval_reason(&input));
                    let gated = Gated {
                        tool: name.to_owned(),
                        input: cap_output(input),
                        reason,
                    };
                    let ask = super::ask::Ask::gate(approval, gated, agent.cta_expiry);
                    return self.raise_cta(seq, id, ask);
                }
                // Run once its reply is committed (`calls.rs`).
                executions.push((seq, def.effects()));
                ToolResult::Pending {
                    reason: EXECUTING.into(),
                }
            }
        }
    }
}

impl Work<'_> {
    /// A reply that is no answer: the model is told `note` (out of the owner's sight) and
    /// thinks again, within the turn's iterations.
    fn ask_again(&mut self, note: String) {
        self.push(EntryBody::User {
            text: note,
            message_id: None,
            options: crate::timeline::TurnOptions {
                tier: self.run.origin.tier,
                visible: false,
                trigger: None,
            },
        });
        self.run.status = RunStatus::Running;
        self.send_continue();
    }
}

/// Why a final answer does not match the agent's output schema, if it does not: it must be
/// one JSON object (a fence around it, as models add, is taken off) that validates.
fn check_output(output: &dyn crate::tools::Offered, answer: &str) -> Result<(), String> {
    let value: serde_json::Value = serde_json::from_str(crate::llm::unfenced(answer))
        .map_err(|e| format!("it is not JSON ({e})"))?;
    output
        .validate(&value)
        .map_err(|e| format!("it does not match the schema: {e}"))
}
