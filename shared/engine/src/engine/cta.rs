//! CTAs: raising one (a `request_human_feedback` call, or a tool call that needs approval),
//! and the two ways a pending one is resolved through the run's queue: answered, expired.

use serde_json::{Value, json};

use super::ask::Ask;
use super::{Execution, Next, Step, Work, derive_id};
use crate::cta::{
    Cta, CtaRequest, CtaResponse, CtaStatus, ESCALATE_TIMER, Gated, NOTIFY_TIMER, REMIND_TIMER,
};
use crate::message::{Effect, Input};
use crate::run::{ExpiryPolicy, RunStatus};
use crate::timeline::{CtaSnapshot, EntryBody, ToolResult};

/// `CtaAnswered`: resolve the pending result that waits for this CTA. An approved gate runs
/// its tool first (the caller executes it and steps again); a rejected one is an error
/// result the model sees.
pub(super) fn answered(
    w: &mut Work,
    cta_id: &str,
    response: &CtaResponse,
    responder: Option<&str>,
) -> Next {
    let Some(seq) = w.pending_cta(cta_id) else {
        return Next::Now(Step::Ignore(format!(
            "no pending result waits for CTA {cta_id}"
        )));
    };
    let Some(mut snap) = w.tool(seq).cta.clone() else {
        return Next::Now(Step::Ignore("not a CTA".into()));
    };
    if let Err(e) = response.validate_against(&snap.request) {
        return Next::Now(Step::Ignore(format!("invalid response: {e}")));
    }
    if w.tool(seq).plan.is_some() {
        return super::plan::answered(w, seq, snap, response, responder);
    }
    if snap.budget.is_some() {
        return super::budget::answered(w, seq, snap, response, responder);
    }
    // The last approval of a reply settled: the calls deferred behind it are due now, with
    // the approved call, and run in this step (`calls.rs`). Each is checked against the
    // agents file as it is now: the run may have waited days.
    let approved = matches!(response, CtaResponse::Approval { approved: true, .. });
    let revoked = if snap.gate && approved {
        match w.recheck(seq, true) {
            Recheck::Refused(why) => Some(why),
            _ => None,
        }
    } else {
        None
    };
    if !w.other_gates_pending(cta_id) {
        for e in w.deferred_calls() {
            if let Recheck::Refused(why) = w.recheck(e.seq, false) {
                w.resolve(e.seq, ToolResult::error(why), None);
            }
        }
    }
    // A call that must now be approved first was asked about: the rest wait for it too.
    if !w.other_gates_pending(cta_id) {
        for e in w.deferred_calls() {
            w.make_due(e.seq);
        }
    }
    // A call cut off while it ran, asked about: a person says whether it runs again.
    let cut_off = w.tool(seq).started > 0;
    let result = match (snap.gate, response) {
        (true, CtaResponse::Approval { approved: true, .. }) => match revoked {
            Some(why) => ToolResult::error(why),
            None => {
                w.make_due(seq);
                w.tool(seq).result.clone()
            }
        },
        (
            true,
            CtaResponse::Approval {
                approved: false,
                reason,
                ..
            },
        ) => {
            let said = match reason {
                Some(r) if !r.trim().is_empty() => format!("a human rejected this call: {r}"),
                _ => "a human rejected this call".to_owned(),
            };
            ToolResult::error(if cut_off {
                format!(
                    "{}: it was started and cut off before its result was recorded, and {said}                      again",
                    super::calls::OUTCOME_UNKNOWN
                )
            } else {
                said
            })
        }
        _ => ToolResult::Success {
            output: response.to_output(),
        },
    };
    snap.status = CtaStatus::Answered;
    snap.response = Some(response.clone());
    snap.responder = responder.map(str::to_owned);
    cancel_timers(&mut w.effects, &snap);
    w.resolve(seq, result, Some(snap));
    w.tell_parent_resumed(cta_id);
    w.after_resolution()
}

/// Whether the expiry of `cta_id` ends its run: by the run's `onExpiry`, and under
/// `default`, when the question has no default to take (a tool call's approval never has).
/// An expiry of a question no longer pending ends nothing (a duplicate, after it expired
/// into its default or was answered): the step ignores it.
pub(super) fn expiry_ends_run(w: &Work, cta_id: &str) -> bool {
    let Some(snap) = w
        .pending_cta(cta_id)
        .and_then(|seq| w.tool(seq).cta.as_ref())
    else {
        return false;
    };
    if snap.budget.is_some() {
        return true;
    }
    match w.run.origin.on_expiry {
        ExpiryPolicy::End => true,
        ExpiryPolicy::Continue => false,
        ExpiryPolicy::Default => snap.gate || snap.default.is_none(),
    }
}

/// `CtaExpired`: by the run's policy, the pending result becomes an error and the run ends
/// as `expired` (the default) or thinks on with the error; or (`default`) the question takes
/// the default it was asked with, as if answered then, and the run goes on.
pub(super) fn expired(w: &mut Work, cta_id: &str) -> Next {
    let Some(seq) = w.pending_cta(cta_id) else {
        return Next::Now(Step::Ignore(format!(
            "no pending result waits for CTA {cta_id}"
        )));
    };
    let Some(mut snap) = w.tool(seq).cta.clone() else {
        return Next::Now(Step::Ignore("not a CTA".into()));
    };
    if snap.budget.is_some() {
        return super::budget::expired(w, seq, snap);
    }
    let message = format!(
        "no answer came before the CTA expired at {}",
        snap.expires_at.to_rfc3339()
    );
    snap.status = CtaStatus::Expired;
    let applies = match (w.run.origin.on_expiry, &snap.default, snap.gate) {
        (ExpiryPolicy::Default, Some(default), false) => Some(default.clone()),
        _ => None,
    };
    if let Some(default) = applies {
        return expired_into_default(w, seq, snap, default, &message);
    }
    let gate = snap.gate;
    cancel_timers(&mut w.effects, &snap);
    w.resolve(seq, ToolResult::error(message.clone()), Some(snap));
    if gate && !w.other_gates_pending(cta_id) {
        for e in w.deferred_calls() {
            if let Some(s) = w.pending_call(&e.call_id) {
                let why = "not run: the approval this reply waited for expired";
                w.resolve(s, ToolResult::error(why), None);
            }
        }
    }
    w.tell_parent_resumed(cta_id);
    match w.run.origin.on_expiry {
        ExpiryPolicy::Continue => {
            w.push(EntryBody::Notice {
                code: "cta_expired".into(),
                message,
            });
            w.after_resolution()
        }
        ExpiryPolicy::End | ExpiryPolicy::Default => {
            w.end(RunStatus::Expired, "cta_expired", &message);
            Next::Commit
        }
    }
}

/// The question at `seq` expired unanswered and takes its default: the model is given the
/// default as the answer, saying it is one; the timeline keeps it as the CTA's response,
/// `defaulted`; the bus is told ([`DEFAULT_APPLIED`], with the default it applied).
fn expired_into_default(
    w: &mut Work,
    seq: u64,
    mut snap: crate::timeline::CtaSnapshot,
    default: CtaResponse,
    message: &str,
) -> Next {
    let cta_id = snap.cta_id.clone();
    let mut output = default.to_output();
    output["default"] = json!(true);
    output["note"] = json!(format!("{message}: this is the question's default answer"));
    snap.response = Some(default.clone());
    snap.defaulted = true;
    let expires_at = snap.expires_at;
    cancel_timers(&mut w.effects, &snap);
    w.resolve(seq, ToolResult::Success { output }, Some(snap));
    w.tell_parent_resumed(&cta_id);
    let detail = json!({
        "ctaId": cta_id,
        "runId": w.run.run_id,
        "expiresAt": expires_at,
        "default": default,
    });
    w.publish(DEFAULT_APPLIED, detail);
    w.after_resolution()
}

/// Cancels a settled question's expiry and its notifications' timers.
pub(super) fn cancel_timers(effects: &mut Vec<Effect>, snap: &CtaSnapshot) {
    for timer_id in std::iter::once(&snap.cta_id).chain(&snap.timers) {
        effects.push(Effect::CancelTimer {
            timer_id: timer_id.clone(),
        });
    }
}

/// The detail-type of the event that says a question expired into its default. Not
/// `cta.expired`: on AWS that is the scheduler's alone (the bus's policy refuses it from
/// anyone else, so that no one forges an expiry), and it is the CTA inbox's timer.
pub const DEFAULT_APPLIED: &str = "cta.defaulted";

impl Work<'_> {
    /// The pending call whose CTA `cta_id` still waits (an approved plan's call stays
    /// pending while its steps run, its CTA answered).
    pub(super) fn pending_cta(&self, cta_id: &str) -> Option<u64> {
        self.pending_where(|t| {
            t.cta
                .as_ref()
                .is_some_and(|c| c.cta_id == cta_id && c.status == CtaStatus::Pending)
        })
    }

    /// Whether a gate of the current batch other than `cta_id` still waits.
    pub(super) fn other_gates_pending(&self, cta_id: &str) -> bool {
        self.pending_where(|t| t.cta.as_ref().is_some_and(|c| c.gate && c.cta_id != cta_id))
            .is_some()
    }

    /// The calls of the current batch deferred behind its approvals.
    pub(super) fn deferred_calls(&self) -> Vec<Execution> {
        self.pending_seqs(
            |t| matches!(&t.result, ToolResult::Pending { reason } if reason == super::DEFERRED),
        )
        .into_iter()
        .map(|s| self.execution(s))
        .collect()
    }

    /// The seq of the pending call `call_id` of the current batch.
    pub(super) fn pending_call(&self, call_id: &str) -> Option<u64> {
        self.pending_where(|t| t.id == call_id)
    }

    /// Whether the waiting call at `seq` may run now, by the agents file as it is now (the
    /// run may have waited hours or days, across restarts and redeploys): its agent must
    /// still exist and grant the tool, and a call no one approved (`approved`: a human
    /// just did) is asked about if an approval policy now wants it (a CTA is raised for it
    /// here, and it waits).
    pub(super) fn recheck(&mut self, seq: u64, approved: bool) -> Recheck {
        let (call_id, name, input) = {
            let t = self.tool(seq);
            (t.id.clone(), t.name.clone(), t.input.clone())
        };
        let book = self.book;
        let Some(agent) = book.agent(&self.run.agent) else {
            return Recheck::Refused(format!(
                "not run: agent `{}` is no longer in the agents file",
                self.run.agent
            ));
        };
        let prepared = agent.granted(self.given);
        let Some(def) = book.tool_for(agent, &prepared, &name) else {
            return Recheck::Refused(gone(book, &agent.name, &name));
        };
        if def.kind() != crate::tools::ToolKind::Exec {
            return Recheck::Run;
        }
        let policy = agent.approval.get(&name).filter(|p| p.requires(&input));
        if approved || (policy.is_none() && !def.needs_approval(&input)) {
            return Recheck::Run;
        }
        let (shown, _) = super::preview(&input.to_string(), super::PREVIEW_BYTES);
        let message = format!("Allow `{name}` to run with input {shown}?");
        let gated = Gated {
            tool: name.clone(),
            reason: policy
                .and_then(|p| p.reason.clone())
                .or_else(|| def.approval_reason(&input)),
            input: super::cap_output(input),
        };
        let ask = Ask::gate(CtaRequest::Approval { message }, gated, agent.cta_expiry);
        let result = self.raise_cta(seq, &call_id, ask);
        self.tool_mut(seq).result = result;
        Recheck::Ask
    }

    /// Raises a CTA for the call at `seq`, asking `ask`.
    pub(super) fn raise_cta(&mut self, seq: u64, call_id: &str, ask: Ask) -> ToolResult {
        let Ask {
            request,
            default,
            gated,
            gate,
            expiry,
            budget,
        } = ask;
        // A default is the question's only where the run takes defaults at expiry: no one is
        // told of an answer that will never be given.
        let default = default.filter(|_| self.run.origin.on_expiry == ExpiryPolicy::Default);
        let cta_id = derive_id("cta", &self.run.run_id, seq);
        let assignment = self.assignment(gated.as_ref(), budget.is_some());
        // Several approvers approve; any other question takes one answer.
        let required = match request {
            CtaRequest::Approval { .. } => assignment.required,
            _ => 1,
        };
        let expires_at =
            self.now + chrono::Duration::from_std(expiry).unwrap_or(chrono::Duration::days(30));
        if let Some(parent) = self.run.origin.parent.clone() {
            let (question, _) = super::preview(request.question(), super::PREVIEW_BYTES);
            let waiting = Input::ChildWaiting {
                child_run_id: self.run.run_id.clone(),
                asker_run_id: self.run.run_id.clone(),
                cta_id: cta_id.clone(),
                question,
            };
            self.send(&parent.run_id, &format!("asks:{cta_id}"), waiting);
        }
        let cta = Cta {
            cta_id: cta_id.clone(),
            run_id: self.run.run_id.clone(),
            root_run_id: Some(self.run.root().to_owned()),
            agent: Some(self.run.agent.clone()),
            run_prompt: self.run.prompt.clone(),
            tool_call_id: call_id.into(),
            owner: self.run.owner.clone(),
            request: request.clone(),
            default: default.clone(),
            status: CtaStatus::Pending,
            response: None,
            gate,
            gated: gated.clone(),
            budget,
            created_at: self.now,
            expires_at,
            resolved_at: None,
            defaulted: false,
            responder: None,
            link_nonce: Some(derive_id("lnk", &self.run.run_id, seq)),
            assignees: assignment.assignees.clone(),
            required,
            approvals: Vec::new(),
            audit: vec![crate::cta::AuditEvent::new("created", self.now)],
            notify: assignment.notify.clone(),
            remind_after_seconds: assignment.remind_after_seconds,
            escalate_after_seconds: assignment.escalate_after_seconds,
            escalate_to: assignment.escalate_to.clone(),
            deliveries: Vec::new(),
            rev: 0,
        };
        let mut cta = cta;
        cta.deliveries = cta.round("asked", &cta.recipients());
        // Its notifications, reminders and escalation run on the durable timers its expiry
        // does, each named by the question.
        let timers = [
            (NOTIFY_TIMER, (!cta.deliveries.is_empty()).then_some(0)),
            (REMIND_TIMER, assignment.remind_after_seconds),
            (ESCALATE_TIMER, assignment.escalate_after_seconds),
        ];
        let mut set = Vec::new();
        for (prefix, after) in timers {
            let Some(after) = after else { continue };
            let at = self.now + chrono::Duration::seconds(i64::try_from(after).unwrap_or(0));
            if at < expires_at {
                let timer_id = format!("{prefix}{cta_id}");
                set.push(timer_id.clone());
                self.effects.push(Effect::Timer {
                    timer_id,
                    run_id: self.run.run_id.clone(),
                    at,
                });
            }
        }
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
        if let Some(d) = &default {
            detail["default"] = json!(d);
        }
        if let Some(b) = &budget {
            detail["budget"] = json!(b);
        }
        if !assignment.assignees.is_empty() {
            detail["assignees"] = json!(assignment.assignees);
        }
        if required > 1 {
            detail["required"] = json!(required);
        }
        if let Some(g) = &gated {
            detail["tool"] = json!(g.tool);
            detail["input"] = g.input.clone();
            if let Some(reason) = &g.reason {
                detail["reason"] = json!(reason);
            }
        }
        self.publish("cta.request", detail);
        self.effects.push(Effect::Timer {
            timer_id: cta_id.clone(),
            run_id: self.run.run_id.clone(),
            at: expires_at,
        });
        self.new_ctas.push(cta);
        self.tool_mut(seq).cta = Some(CtaSnapshot {
            cta_id,
            request,
            default,
            status: CtaStatus::Pending,
            response: None,
            defaulted: false,
            responder: None,
            expires_at,
            gate,
            budget,
            timers: set,
        });
        ToolResult::Pending {
            reason: "waiting for a human".into(),
        }
    }
}

impl Work<'_> {
    /// Who answers a question of this run's agent: for a tool call's approval, the tool's
    /// policy, else the agent's `questions`; a budget's question is its owner's alone (it is
    /// the owner's money).
    fn assignment(&self, gated: Option<&Gated>, budget: bool) -> crate::cta::Assignment {
        let Some(agent) = self.book.agent(&self.run.agent).filter(|_| !budget) else {
            return crate::cta::Assignment::default();
        };
        gated
            .and_then(|g| agent.approval.get(&g.tool))
            .and_then(|p| p.assignment.clone())
            .unwrap_or_else(|| agent.questions.clone())
    }
}

/// What a waiting call is to do when it is about to run ([`Work::recheck`]).
pub(super) enum Recheck {
    Run,
    /// Not run: the error result the model sees says why.
    Refused(String),
    /// An approval is asked for first.
    Ask,
}

/// Why the tool `name` of agent `agent` cannot run now, naming the kind of tool it was.
fn gone(book: &crate::agent::Book, agent: &str, name: &str) -> String {
    let changed = "its agents file changed while the run waited";
    if book.tool(name).is_some() {
        return format!("not run: `{name}` is no longer granted to agent `{agent}` ({changed})");
    }
    match (book.mcp_server_of(name), name.split_once("__")) {
        (Some(server), _) => {
            format!("not run: MCP server `{server}` does not list the tool `{name}` now")
        }
        (None, Some((server, _))) => format!(
            "not run: `{name}` was a tool of MCP server `{server}`, which is no longer in the \
             agents file ({changed})"
        ),
        (None, None) => {
            format!("not run: `{name}` is no longer a tool in the agents file ({changed})")
        }
    }
}
