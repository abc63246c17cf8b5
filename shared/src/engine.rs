//! The engine: one think-or-dispatch iteration of one run, as a pure function.
//!
//! [`step`] takes the run, its timeline, the input message and whatever I/O results the
//! service has gathered so far, and answers with what it still needs ([`Step::Think`]: a
//! model reply; [`Step::Execute`]: tool outputs) or with the [`Transition`] to commit: new
//! and resolved timeline entries, the run's new state, new CTAs and child runs, and the
//! effects to perform after the commit. It is deterministic: called again with more I/O it
//! makes the same decisions, and the ids it mints are derived from the run and the seq, so a
//! retried step mints the same ones.
//!
//! No I/O, no clock, no randomness here: the engine never imports `tokio`, `reqwest` or an
//! AWS SDK. Every decision lives here and is tested here.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::agent::{AgentDef, Catalog};
use crate::cta::{Cta, CtaRequest, CtaResponse, CtaStatus};
use crate::llm::LlmReply;
use crate::run::{ExpiryPolicy, NewRun, ParentLink, Run, RunError, RunStatus, Usage};
use crate::timeline::{CtaSnapshot, Entry, EntryBody, ToolEntry, ToolResult};
use crate::tools::ToolKind;

/// A message on a run's ordered queue group: the only way a run changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepMessage {
    pub run_id: String,
    /// Deduplication id: the same effect always sends the same id.
    pub id: String,
    pub input: Input,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Input {
    /// The run was created: take its first step.
    Start,
    /// Think again; stale unless the run is still at `version`.
    Continue {
        version: u64,
    },
    /// A follow-up user turn on a finished run (from the API, or a parent continuing it).
    UserMessage {
        text: String,
        message_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to: Option<ParentLink>,
    },
    /// A human answered; the CTA item already records the answer.
    CtaAnswered {
        cta_id: String,
        response: CtaResponse,
    },
    /// A CTA's expiry fired; the CTA item already records it.
    CtaExpired {
        cta_id: String,
    },
    /// A child run ended.
    ChildFinished {
        child_run_id: String,
        tool_call_id: String,
        outcome: ChildOutcome,
    },
    Cancel {
        reason: String,
    },
    /// The run cannot go on (a poison message, a fatal model error).
    Fail {
        code: String,
        message: String,
    },
}

/// How a child run ended, as its parent learns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ChildOutcome {
    Completed {
        text: String,
        step_count: u32,
        total_usage: Usage,
    },
    Ended {
        status: RunStatus,
        error: String,
    },
}

/// An event for the bus (EventBridge detail-types of DESIGN.md §7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Unique and stable: consumers deduplicate on it.
    pub id: String,
    pub detail_type: String,
    pub detail: Value,
    pub time: DateTime<Utc>,
}

/// Something to do after the commit. Every effect is idempotent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Effect {
    Send(StepMessage),
    Publish(Event),
    /// A one-time expiry timer named by the CTA id.
    Schedule {
        cta_id: String,
        run_id: String,
        at: DateTime<Utc>,
    },
    Unschedule {
        cta_id: String,
    },
    /// Mark the CTA item cancelled if it is still pending.
    CancelCta {
        cta_id: String,
    },
}

/// What the engine decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The run's new state, with `version` bumped by one.
    pub run: Run,
    pub appended: Vec<Entry>,
    /// Resolved entries, whole, by seq.
    pub updated: Vec<Entry>,
    pub new_ctas: Vec<Cta>,
    /// Child runs to create in the same commit, with their first entries.
    pub new_runs: Vec<(Run, Vec<Entry>)>,
    pub effects: Vec<Effect>,
}

/// A tool the service must execute for the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub call_id: String,
    pub tool: String,
    pub input: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Call the model (for the run's `think_index`-th think) and step again with the reply.
    Think { think_index: u32 },
    /// Execute these tools and step again with their outputs.
    Execute(Vec<Execution>),
    /// Commit this.
    Done(Box<Transition>),
    /// Nothing to do: the message is stale or a redelivery.
    Ignore(String),
}

/// The I/O results gathered so far for this step.
#[derive(Debug, Default, Clone)]
pub struct Io {
    pub reply: Option<LlmReply>,
    /// The model call failed for good: the run fails, after this step's input is applied.
    pub model_error: Option<String>,
    pub outputs: HashMap<String, Result<Value, String>>,
}

/// Mints a stable id from a run, a seq and a purpose.
pub fn derive_id(prefix: &str, run_id: &str, seq: u64) -> String {
    let name = format!("{run_id}/{seq}/{prefix}");
    format!(
        "{prefix}_{}",
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).simple()
    )
}

/// One iteration of one run. See the module docs.
pub fn step(
    catalog: &Catalog,
    now: DateTime<Utc>,
    run: &Run,
    timeline: &[Entry],
    input: &Input,
    io: &Io,
) -> Step {
    let mut w = Work::new(catalog, now, run, timeline);
    let think = match input {
        Input::Start => {
            if run.status != RunStatus::Queued {
                return Step::Ignore("run already started".into());
            }
            w.run.status = RunStatus::Running;
            true
        }
        Input::Continue { version } => {
            if run.version != *version || run.status != RunStatus::Running {
                return Step::Ignore(format!("stale continue for version {version}"));
            }
            true
        }
        Input::UserMessage {
            text,
            message_id,
            reply_to,
        } => {
            let seen = timeline.iter().rev().any(|e| {
                matches!(&e.body, EntryBody::User { message_id: Some(m), .. } if m == message_id)
            });
            if seen {
                return Step::Ignore("message already applied".into());
            }
            if let Some(link) = reply_to
                && run.parent.as_ref().map(|p| &p.run_id) != Some(&link.run_id)
            {
                // Only a run's own parent may continue it: answer, change nothing else.
                w.send(
                    &link.run_id,
                    "refused",
                    Input::ChildFinished {
                        child_run_id: run.run_id.clone(),
                        tool_call_id: link.tool_call_id.clone(),
                        outcome: ChildOutcome::Ended {
                            status: run.status,
                            error: "this run has no such subagent".into(),
                        },
                    },
                );
                return w.done();
            }
            if !run.status.is_terminal() {
                let Some(link) = reply_to else {
                    return Step::Ignore("run is still active".into());
                };
                // A parent tried to continue a busy subagent: tell it, change nothing else.
                w.send(
                    &link.run_id,
                    "busy",
                    Input::ChildFinished {
                        child_run_id: run.run_id.clone(),
                        tool_call_id: link.tool_call_id.clone(),
                        outcome: ChildOutcome::Ended {
                            status: run.status,
                            error: "the subagent is still working on an earlier request".into(),
                        },
                    },
                );
                return w.done();
            }
            if let Some(link) = reply_to {
                w.run.parent = Some(link.clone());
            }
            w.push(EntryBody::User {
                text: text.clone(),
                message_id: Some(message_id.clone()),
            });
            w.run.status = RunStatus::Running;
            w.run.turn_thinks = 0;
            w.run.result = None;
            w.run.error = None;
            true
        }
        Input::CtaAnswered { cta_id, response } => {
            let Some(seq) =
                w.pending_where(|t| t.cta.as_ref().is_some_and(|c| &c.cta_id == cta_id))
            else {
                return Step::Ignore(format!("no pending result waits for CTA {cta_id}"));
            };
            let (call_id, name, input, snap) = {
                let t = w.tool(seq);
                (t.id.clone(), t.name.clone(), t.input.clone(), t.cta.clone())
            };
            let Some(mut snap) = snap else {
                return Step::Ignore("not a CTA".into());
            };
            if let Err(e) = response.validate_against(&snap.request) {
                return Step::Ignore(format!("invalid response: {e}"));
            }
            let result = match (snap.gate, response) {
                (true, CtaResponse::Approval { approved: true, .. }) => {
                    match io.outputs.get(&call_id) {
                        Some(out) => to_result(out.clone()),
                        None => {
                            return Step::Execute(vec![Execution {
                                call_id,
                                tool: name,
                                input,
                            }]);
                        }
                    }
                }
                (
                    true,
                    CtaResponse::Approval {
                        approved: false,
                        reason,
                    },
                ) => ToolResult::error(match reason {
                    Some(r) if !r.trim().is_empty() => format!("a human rejected this call: {r}"),
                    _ => "a human rejected this call".to_owned(),
                }),
                _ => ToolResult::Success {
                    output: response.to_output(),
                },
            };
            snap.status = CtaStatus::Answered;
            snap.response = Some(response.clone());
            w.resolve(seq, result, Some(snap));
            w.effects.push(Effect::Unschedule {
                cta_id: cta_id.clone(),
            });
            w.after_resolution()
        }
        Input::CtaExpired { cta_id } => {
            let Some(seq) =
                w.pending_where(|t| t.cta.as_ref().is_some_and(|c| &c.cta_id == cta_id))
            else {
                return Step::Ignore(format!("no pending result waits for CTA {cta_id}"));
            };
            let Some(mut snap) = w.tool(seq).cta.clone() else {
                return Step::Ignore("not a CTA".into());
            };
            let message = format!(
                "no answer came before the CTA expired at {}",
                snap.expires_at.to_rfc3339()
            );
            snap.status = CtaStatus::Expired;
            w.resolve(seq, ToolResult::error(message.clone()), Some(snap));
            w.effects.push(Effect::Unschedule {
                cta_id: cta_id.clone(),
            });
            match run.on_expiry {
                ExpiryPolicy::End => {
                    w.end(RunStatus::Expired, "cta_expired", &message);
                    false
                }
                ExpiryPolicy::Continue => {
                    w.push(EntryBody::Notice {
                        code: "cta_expired".into(),
                        message,
                    });
                    w.after_resolution()
                }
            }
        }
        Input::ChildFinished {
            child_run_id,
            tool_call_id,
            outcome,
        } => {
            let Some(seq) = w.pending_where(|t| {
                &t.id == tool_call_id && t.child_run_id.as_deref() == Some(child_run_id)
            }) else {
                return Step::Ignore(format!("no pending result waits for child {child_run_id}"));
            };
            let result = match outcome {
                ChildOutcome::Completed {
                    text,
                    step_count,
                    total_usage,
                } => ToolResult::Success {
                    output: json!({
                        "subagentId": child_run_id,
                        "text": text,
                        "stepCount": step_count,
                        "totalUsage": total_usage,
                    }),
                },
                ChildOutcome::Ended { status, error } => ToolResult::error(format!(
                    "subagent {child_run_id} {}: {error}",
                    status.as_str()
                )),
            };
            w.resolve(seq, result, None);
            w.start_queued_children();
            w.after_resolution()
        }
        Input::Cancel { reason } => {
            if run.status.is_terminal() {
                return Step::Ignore("run already ended".into());
            }
            w.end(RunStatus::Cancelled, "cancelled", reason);
            false
        }
        Input::Fail { code, message } => {
            if run.status.is_terminal() {
                return Step::Ignore("run already ended".into());
            }
            w.end(RunStatus::Failed, code, message);
            false
        }
    };
    if think && let Some(need) = w.think(io) {
        return need;
    }
    w.done()
}

/// Tool outputs larger than this (as JSON) are cut, with an explicit marker, so that every
/// entry fits any store (DynamoDB items stop at 400 KB) and the model sees what is stored.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

fn to_result(out: Result<Value, String>) -> ToolResult {
    match out {
        Ok(output) => ToolResult::Success {
            output: cap_output(output),
        },
        Err(error) => ToolResult::Error {
            error: cap_text(error),
        },
    }
}

/// Model replies longer than this are cut the same way.
pub const MAX_REPLY_BYTES: usize = 256 * 1024;

fn cap_text(s: String) -> String {
    cap_at(s, MAX_OUTPUT_BYTES)
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
    json!({"truncated": true, "originalBytes": size, "preview": cap_text(text)})
}

/// The step being built: the run as it becomes, and what the commit will hold.
struct Work<'a> {
    catalog: &'a Catalog,
    now: DateTime<Utc>,
    run: Run,
    timeline: &'a [Entry],
    appended: Vec<Entry>,
    updated: BTreeMap<u64, Entry>,
    new_ctas: Vec<Cta>,
    new_runs: Vec<(Run, Vec<Entry>)>,
    effects: Vec<Effect>,
    /// The seq of the first entry of the current batch.
    batch_start: u64,
}

impl<'a> Work<'a> {
    fn new(catalog: &'a Catalog, now: DateTime<Utc>, run: &Run, timeline: &'a [Entry]) -> Self {
        let batch_start = timeline
            .iter()
            .rposition(|e| matches!(e.body, EntryBody::Assistant { .. }))
            .map_or(0, |i| i as u64 + 1);
        Self {
            catalog,
            now,
            run: run.clone(),
            timeline,
            appended: Vec::new(),
            updated: BTreeMap::new(),
            new_ctas: Vec::new(),
            new_runs: Vec::new(),
            effects: Vec::new(),
            batch_start,
        }
    }

    fn entry(&self, seq: u64) -> &Entry {
        if let Some(e) = self.updated.get(&seq) {
            return e;
        }
        let base = self.timeline.len() as u64;
        if seq < base {
            &self.timeline[seq as usize]
        } else {
            &self.appended[(seq - base) as usize]
        }
    }

    fn entry_mut(&mut self, seq: u64) -> &mut Entry {
        let base = self.timeline.len() as u64;
        if seq >= base {
            return &mut self.appended[(seq - base) as usize];
        }
        let timeline = self.timeline;
        self.updated
            .entry(seq)
            .or_insert_with(|| timeline[seq as usize].clone())
    }

    fn tool(&self, seq: u64) -> &ToolEntry {
        match &self.entry(seq).body {
            EntryBody::Tool(t) => t,
            _ => unreachable!("seq {seq} is a tool entry by construction"),
        }
    }

    fn tool_mut(&mut self, seq: u64) -> &mut ToolEntry {
        match &mut self.entry_mut(seq).body {
            EntryBody::Tool(t) => t,
            _ => unreachable!("seq {seq} is a tool entry by construction"),
        }
    }

    fn push(&mut self, body: EntryBody) -> u64 {
        let seq = self.run.next_seq;
        self.run.next_seq += 1;
        if matches!(body, EntryBody::Assistant { .. }) {
            self.batch_start = seq + 1;
        }
        self.appended.push(Entry {
            seq,
            at: self.now,
            body,
        });
        seq
    }

    fn batch(&self) -> std::ops::Range<u64> {
        self.batch_start..self.run.next_seq
    }

    /// The pending tool entries of the current batch that match.
    fn pending_seqs(&self, pred: impl Fn(&ToolEntry) -> bool) -> Vec<u64> {
        self.batch()
            .filter(|&s| match &self.entry(s).body {
                EntryBody::Tool(t) => t.result.is_pending() && pred(t),
                _ => false,
            })
            .collect()
    }

    fn pending_where(&self, pred: impl Fn(&ToolEntry) -> bool) -> Option<u64> {
        self.pending_seqs(pred).into_iter().next()
    }

    fn resolve(&mut self, seq: u64, result: ToolResult, cta: Option<CtaSnapshot>) {
        let t = self.tool_mut(seq);
        t.result = result;
        if cta.is_some() {
            t.cta = cta;
        }
    }

    fn send(&mut self, run_id: &str, tag: &str, input: Input) {
        let id = format!("{}:{}:{tag}", self.run.run_id, self.run.version + 1);
        self.effects.push(Effect::Send(StepMessage {
            run_id: run_id.into(),
            id,
            input,
        }));
    }

    fn publish(&mut self, detail_type: &str, detail: Value) {
        let n = self
            .effects
            .iter()
            .filter(|e| matches!(e, Effect::Publish(_)))
            .count();
        let id = format!("{}:{}:{n}", self.run.run_id, self.run.version + 1);
        self.effects.push(Effect::Publish(Event {
            id,
            detail_type: detail_type.into(),
            detail,
            time: self.now,
        }));
    }

    /// After a pending result resolved: think if the batch is complete, else keep waiting.
    fn after_resolution(&mut self) -> bool {
        if self.pending_where(|_| true).is_some() {
            self.run.status = RunStatus::Waiting;
            false
        } else {
            self.run.status = RunStatus::Running;
            true
        }
    }

    /// Thinks and dispatches. Returns what the service must fetch first, if anything.
    fn think(&mut self, io: &Io) -> Option<Step> {
        let catalog = self.catalog;
        let Some(agent) = catalog.agent(&self.run.agent) else {
            let msg = format!(
                "agent `{}` is not defined in this deployment",
                self.run.agent
            );
            self.end(RunStatus::Failed, "unknown_agent", &msg);
            return None;
        };
        if self.run.turn_thinks >= agent.max_iterations {
            let msg = format!(
                "stopped after {} iterations, the limit for agent `{}`",
                agent.max_iterations, agent.name
            );
            self.run.result = Some(msg.clone());
            self.end(RunStatus::Completed, "max_iterations", &msg);
            return None;
        }
        if let Some(error) = &io.model_error {
            self.end(RunStatus::Failed, "model_error", error);
            return None;
        }
        let Some(reply) = &io.reply else {
            return Some(Step::Think {
                think_index: self.run.thinks,
            });
        };
        self.run.thinks += 1;
        self.run.turn_thinks += 1;
        self.run.usage += reply.usage;
        let text = reply.text.clone().map(|t| cap_at(t, MAX_REPLY_BYTES));
        let reply_seq = self.push(EntryBody::Assistant {
            text: text.clone(),
            usage: reply.usage,
        });
        if reply.tool_calls.is_empty() {
            self.run.result = Some(text.unwrap_or_default());
            self.end(RunStatus::Completed, "", "");
            return None;
        }
        let mut executions = Vec::new();
        let mut ids = std::collections::HashSet::new();
        for (i, call) in reply.tool_calls.iter().enumerate() {
            let mut id = if call.id.is_empty() {
                format!("call_{}_{i}", self.run.thinks - 1)
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
            let seq = self.push(EntryBody::Tool(ToolEntry {
                id: id.clone(),
                name: call.name.clone(),
                input: input.clone(),
                result: ToolResult::Pending {
                    reason: "dispatching".into(),
                },
                reply_seq,
                cta: None,
                child_run_id: None,
            }));
            let max = catalog.limits.max_tool_calls;
            let result = if i >= max {
                ToolResult::error(format!(
                    "not run: at most {max} tool calls are run per reply; call it again in a later reply"
                ))
            } else if let Err(e) = parsed {
                ToolResult::error(format!("arguments are not valid JSON: {e}"))
            } else {
                self.dispatch(agent, seq, &id, &call.name, input, io, &mut executions)
            };
            self.tool_mut(seq).result = result;
        }
        if !executions.is_empty() {
            return Some(Step::Execute(executions));
        }
        if self.pending_where(|_| true).is_some() {
            self.run.status = RunStatus::Waiting;
        } else {
            self.run.status = RunStatus::Running;
            self.send(
                &self.run.run_id.clone(),
                "continue",
                Input::Continue {
                    version: self.run.version + 1,
                },
            );
        }
        None
    }

    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &mut self,
        agent: &AgentDef,
        seq: u64,
        id: &str,
        name: &str,
        input: Value,
        io: &Io,
        executions: &mut Vec<Execution>,
    ) -> ToolResult {
        let catalog = self.catalog;
        let Some(def) = catalog.tool_for(agent, name) else {
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
        match &def.kind {
            ToolKind::Spawn => self.spawn(seq, id, &input),
            ToolKind::Feedback => match serde_json::from_value::<CtaRequest>(input) {
                Ok(req) => match req.validate() {
                    Ok(()) => self.raise_cta(seq, id, req, false),
                    Err(e) => ToolResult::error(e.to_string()),
                },
                Err(e) => ToolResult::error(format!("invalid CTA request: {e}")),
            },
            ToolKind::Exec(tool) => {
                let gated = agent.approval.get(name).is_some_and(|p| p.requires(&input))
                    || tool.needs_approval(&input);
                if gated {
                    let message = format!("Allow `{name}` to run with input {input}?");
                    return self.raise_cta(seq, id, CtaRequest::Approval { message }, true);
                }
                match io.outputs.get(id) {
                    Some(out) => to_result(out.clone()),
                    None => {
                        executions.push(Execution {
                            call_id: id.into(),
                            tool: name.into(),
                            input,
                        });
                        ToolResult::Pending {
                            reason: "executing".into(),
                        }
                    }
                }
            }
        }
    }

    fn raise_cta(
        &mut self,
        seq: u64,
        call_id: &str,
        request: CtaRequest,
        gate: bool,
    ) -> ToolResult {
        let cta_id = derive_id("cta", &self.run.run_id, seq);
        let expires_at = self.now
            + chrono::Duration::from_std(self.catalog.limits.cta_expiry)
                .unwrap_or(chrono::Duration::days(30));
        let cta = Cta {
            cta_id: cta_id.clone(),
            run_id: self.run.run_id.clone(),
            tool_call_id: call_id.into(),
            owner: self.run.owner.clone(),
            request: request.clone(),
            status: CtaStatus::Pending,
            response: None,
            gate,
            created_at: self.now,
            expires_at,
            resolved_at: None,
        };
        let mut detail = json!({
            "ctaId": cta_id,
            "runId": self.run.run_id,
            "expiresAt": expires_at,
        });
        if let (Value::Object(d), Ok(Value::Object(r))) =
            (&mut detail, serde_json::to_value(&request))
        {
            d.extend(r);
        }
        self.publish("cta.request", detail);
        self.effects.push(Effect::Schedule {
            cta_id: cta_id.clone(),
            run_id: self.run.run_id.clone(),
            at: expires_at,
        });
        self.new_ctas.push(cta);
        self.tool_mut(seq).cta = Some(CtaSnapshot {
            cta_id,
            request,
            status: CtaStatus::Pending,
            response: None,
            expires_at,
            gate,
        });
        ToolResult::Pending {
            reason: "waiting for a human".into(),
        }
    }

    fn running_children(&self) -> usize {
        self.pending_seqs(|t| t.child_run_id.is_some()).len()
    }

    fn spawn(&mut self, seq: u64, id: &str, input: &Value) -> ToolResult {
        let limits = &self.catalog.limits;
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
        if self.run.depth + 1 > limits.max_depth {
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
        self.start_child(seq, id, input);
        ToolResult::Pending {
            reason: "waiting for subagent".into(),
        }
    }

    fn start_child(&mut self, seq: u64, call_id: &str, input: &Value) {
        let text = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_owned);
        // `sub_` marks a subagent run: queues route on it without reading the run.
        let child_id = derive_id("sub", &self.run.run_id, seq);
        let mut child = Run::new(NewRun {
            run_id: child_id.clone(),
            agent: text("agent").unwrap_or_default(),
            owner: self.run.owner.clone(),
            parent: Some(ParentLink {
                run_id: self.run.run_id.clone(),
                tool_call_id: call_id.into(),
            }),
            depth: self.run.depth + 1,
            on_expiry: self.run.on_expiry,
            sandbox_id: text("sandboxId").or_else(|| self.run.sandbox_id.clone()),
            metadata: None,
            now: self.now,
        });
        let first = Entry {
            seq: 0,
            at: self.now,
            body: EntryBody::User {
                text: text("prompt").unwrap_or_default(),
                message_id: None,
            },
        };
        child.next_seq = 1;
        self.new_runs.push((child, vec![first]));
        self.effects.push(Effect::Send(StepMessage {
            run_id: child_id.clone(),
            id: format!("{child_id}:start"),
            input: Input::Start,
        }));
        self.tool_mut(seq).child_run_id = Some(child_id);
    }

    fn resume_child(&mut self, seq: u64, call_id: &str, child_id: &str, input: &Value) {
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
            },
        }));
        self.tool_mut(seq).child_run_id = Some(child_id.into());
    }

    /// Starts queued `spawn_subagent` calls while slots are free, in call order.
    fn start_queued_children(&mut self) {
        let queued = self.pending_seqs(|t| t.child_run_id.is_none() && t.cta.is_none());
        for seq in queued {
            if self.running_children() >= self.catalog.limits.max_parallel_children {
                break;
            }
            let (id, input) = {
                let t = self.tool(seq);
                (t.id.clone(), t.input.clone())
            };
            if let Some(sub) = input.get("subagentId").and_then(Value::as_str) {
                self.resume_child(seq, &id, sub, &input);
            } else {
                self.start_child(seq, &id, &input);
            }
            self.tool_mut(seq).result = ToolResult::Pending {
                reason: "waiting for subagent".into(),
            };
        }
    }

    /// Ends the run: settles everything pending, records why, tells the parent.
    fn end(&mut self, status: RunStatus, code: &str, message: &str) {
        let why = format!("run {}: {message}", status.as_str());
        for seq in self.pending_seqs(|_| true) {
            let t = self.tool(seq).clone();
            let mut snap = t.cta.clone();
            if let Some(s) = snap.as_mut() {
                s.status = CtaStatus::Cancelled;
                self.effects.push(Effect::CancelCta {
                    cta_id: s.cta_id.clone(),
                });
                self.effects.push(Effect::Unschedule {
                    cta_id: s.cta_id.clone(),
                });
            }
            if let Some(child) = &t.child_run_id {
                let id = format!("{child}:cancel:{}", self.run.run_id);
                self.effects.push(Effect::Send(StepMessage {
                    run_id: child.clone(),
                    id,
                    input: Input::Cancel {
                        reason: format!("parent {}", why),
                    },
                }));
            }
            self.resolve(
                seq,
                ToolResult::error(format!("not completed: {why}")),
                snap,
            );
        }
        self.run.status = status;
        let run_id = self.run.run_id.clone();
        if status == RunStatus::Completed {
            if !code.is_empty() {
                self.push(EntryBody::Notice {
                    code: code.into(),
                    message: message.into(),
                });
            }
            let text = self.run.result.clone().unwrap_or_default();
            self.publish(
                "run.completed",
                json!({
                    "runId": run_id, "text": text, "usage": self.run.usage,
                }),
            );
        } else {
            let body = EntryBody::Error {
                code: code.into(),
                message: message.into(),
            };
            let body = if status == RunStatus::Failed {
                body
            } else {
                EntryBody::Notice {
                    code: code.into(),
                    message: message.into(),
                }
            };
            self.push(body);
            self.run.error = Some(RunError {
                code: code.into(),
                message: message.into(),
            });
            self.publish(&format!("run.{}", status.as_str()), json!({
                "runId": run_id, "error": {"code": code, "message": message}, "usage": self.run.usage,
            }));
        }
        if let Some(parent) = self.run.parent.clone() {
            let outcome = if status == RunStatus::Completed {
                ChildOutcome::Completed {
                    text: self.run.result.clone().unwrap_or_default(),
                    step_count: self.run.thinks,
                    total_usage: self.run.usage,
                }
            } else {
                ChildOutcome::Ended {
                    status,
                    error: message.into(),
                }
            };
            self.send(
                &parent.run_id,
                "finished",
                Input::ChildFinished {
                    child_run_id: run_id,
                    tool_call_id: parent.tool_call_id,
                    outcome,
                },
            );
        }
    }

    fn done(mut self) -> Step {
        let state = match self.run.status {
            RunStatus::Running | RunStatus::Queued => Some("thinking"),
            RunStatus::Waiting => {
                if self.pending_where(|t| t.cta.is_some()).is_some() {
                    Some("waiting_on_user")
                } else {
                    Some("waiting_on_subagents")
                }
            }
            _ => None,
        };
        if let Some(s) = state
            && self.run.state.as_deref() != Some(s)
        {
            self.publish("run.state", json!({"runId": self.run.run_id, "state": s}));
        }
        self.run.state = state.map(str::to_owned);
        self.run.version += 1;
        self.run.updated_at = self.now;
        Step::Done(Box::new(Transition {
            run: self.run,
            appended: self.appended,
            updated: self.updated.into_values().collect(),
            new_ctas: self.new_ctas,
            new_runs: self.new_runs,
            effects: self.effects,
        }))
    }
}

#[cfg(test)]
mod tests;
