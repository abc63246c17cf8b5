//! What moves a plan on: a step's child run finishing, the planner's or the reviewer's
//! answer, a human's answer to its review, a step's timer.

use super::*;

/// `ChildFinished` for one of a plan call's child runs: its planner, its reviewer or a step.
pub(in crate::engine) fn child_finished(
    w: &mut Work,
    seq: u64,
    child: &str,
    outcome: &ChildOutcome,
) -> Next {
    let Some((call_id, mut state)) = w.take_plan(seq) else {
        return Next::Now(Step::Ignore("not a plan".into()));
    };
    if state.helper.as_deref() == Some(child) {
        let result = helper_finished(w, seq, &call_id, &mut state, child, outcome);
        return w.settle_plan(seq, state, result);
    }
    let Some(plan) = state.plan.clone() else {
        return w.settle_plan(seq, state, None);
    };
    let Some(a) = plan.agent_steps().find(|a| {
        state.steps.get(&a.id).is_some_and(|s| {
            s.status == StepStatus::Running && s.child_run_id.as_deref() == Some(child)
        })
    }) else {
        // A step that timed out or lost a race, ending now: its spending is counted, no
        // more.
        return w.settle_plan(seq, state, None);
    };
    match outcome {
        ChildOutcome::Completed { text, .. } => {
            let output = match serde_json::from_str::<Value>(plan::strip_fence(text)) {
                Ok(v) => cap_output_at(v, MAX_STEP_OUTPUT_BYTES),
                Err(_) => Value::String(cap_at(text.clone(), MAX_STEP_OUTPUT_BYTES)),
            };
            if let Some(s) = state.steps.get_mut(&a.id) {
                s.status = StepStatus::Success;
                s.output = Some(output);
                if let Some(t) = s.timer_id.clone() {
                    w.effects.push(Effect::CancelTimer { timer_id: t });
                }
            }
            w.step_completed(&call_id, a, &mut state);
            // The first success of a `first_success` group wins; the rest stop.
            if let Some(p) = plan.steps.iter().find_map(|s| match s {
                plan::Step::Parallel(p)
                    if p.merge == Merge::FirstSuccess
                        && p.parallel.iter().any(|x| x.id == a.id) =>
                {
                    Some(p)
                }
                _ => None,
            }) {
                for other in &p.parallel {
                    let why = format!("cancelled: step `{}` succeeded first", a.id);
                    match state.steps.get(&other.id).map(|s| s.status) {
                        Some(StepStatus::Running) => {
                            w.stop_step(&call_id, &mut state, other, StepStatus::Skipped, why, true)
                        }
                        Some(StepStatus::Pending) => {
                            let why = format!("not run: step `{}` succeeded first", a.id);
                            w.stop_step(
                                &call_id,
                                &mut state,
                                other,
                                StepStatus::Skipped,
                                why,
                                false,
                            )
                        }
                        _ => {}
                    }
                }
            }
        }
        ChildOutcome::Ended { status, error, .. } => {
            let why = format!("subagent {child} {}: {error}", status.as_str());
            w.stop_step(&call_id, &mut state, a, StepStatus::Failed, why, false);
        }
    }
    let result = w.advance(seq, &call_id, &mut state);
    w.settle_plan(seq, state, result)
}

fn helper_finished(
    w: &mut Work,
    seq: u64,
    call_id: &str,
    state: &mut PlanState,
    child: &str,
    outcome: &ChildOutcome,
) -> Option<ToolResult> {
    let who = if state.phase == Phase::Planning {
        "planner"
    } else {
        "plan reviewer"
    };
    let text = match outcome {
        ChildOutcome::Completed { text, .. } => text,
        ChildOutcome::Ended { status, error, .. } => {
            state.helper = None;
            return Some(ToolResult::error(format!(
                "the {who} ({child}) {}: {error}",
                status.as_str()
            )));
        }
    };
    if state.phase == Phase::Planning {
        let parsed = serde_json::from_str::<Value>(plan::strip_fence(text))
            .map_err(|e| format!("the reply is not JSON: {e}"))
            .and_then(|v| w.parse_plan(&v));
        return match parsed {
            Ok(p) => {
                state.helper = None;
                w.with_plan(seq, call_id, state, p)
            }
            Err(e) if state.attempts < 2 => {
                state.attempts += 1;
                let message_id = format!("{}/{call_id}/plan-{}", w.run.run_id, state.attempts);
                w.effects.push(Effect::Send(StepMessage {
                    run_id: child.into(),
                    id: format!("{message_id}:resume"),
                    input: Input::UserMessage {
                        text: format!(
                            "That plan is not valid: {e}\nReply with the corrected plan: one JSON \
                             object, {{\"steps\": [...]}}, and nothing else."
                        ),
                        message_id,
                        reply_to: Some(ParentLink {
                            run_id: w.run.run_id.clone(),
                            tool_call_id: call_id.into(),
                        }),
                        options: crate::timeline::TurnOptions {
                            tier: w.run.origin.tier,
                            ..Default::default()
                        },
                    },
                    owed: false,
                }));
                Some(ToolResult::Pending {
                    reason: "the planner is correcting the plan".into(),
                })
            }
            Err(e) => {
                state.helper = None;
                Some(ToolResult::error(format!(
                    "the planner wrote no valid plan in {} tries; the last one: {e}",
                    state.attempts
                )))
            }
        };
    }
    state.helper = None;
    let (approved, notes) = plan::parse_review(text).unwrap_or_else(|e| {
        let (shown, _) = preview(text, 2048);
        (false, format!("{e}; it said: {shown}"))
    });
    w.publish(
        "plan.reviewed",
        json!({"runId": w.run.run_id, "callId": call_id, "approved": approved, "notes": notes,
               "reviewerRunId": child, "by": "agent"}),
    );
    state.review = Some(plan::Review {
        by: "agent".into(),
        outcome: if approved { "approved" } else { "sent_back" }.into(),
        notes: Some(notes.clone()),
        reviewer_run_id: Some(child.into()),
    });
    if approved {
        return w.advance(seq, call_id, state);
    }
    Some(ToolResult::error(format!(
        "the reviewer did not approve the plan, so it did not run: {notes}\nThe plan: {}",
        serde_json::to_string(&state.plan).unwrap_or_default()
    )))
}

/// The answer to a draft plan's approval CTA: approved, it runs; rejected, the reason goes
/// back to the model.
pub(in crate::engine) fn answered(
    w: &mut Work,
    seq: u64,
    mut snap: CtaSnapshot,
    response: &CtaResponse,
    responder: Option<&str>,
) -> Next {
    let Some((call_id, mut state)) = w.take_plan(seq) else {
        return Next::Now(Step::Ignore("not a plan".into()));
    };
    snap.status = CtaStatus::Answered;
    snap.response = Some(response.clone());
    snap.responder = responder.map(str::to_owned);
    let cta_id = snap.cta_id.clone();
    w.tool_mut(seq).cta = Some(snap);
    w.tell_parent_resumed(&cta_id);
    w.effects.push(Effect::CancelTimer { timer_id: cta_id });
    if let CtaResponse::Approval {
        approved, reason, ..
    } = response
    {
        w.publish(
            "plan.reviewed",
            json!({"runId": w.run.run_id, "callId": call_id, "approved": approved,
                   "notes": reason, "by": "human"}),
        );
        state.review = Some(plan::Review {
            by: "human".into(),
            outcome: if *approved { "approved" } else { "rejected" }.into(),
            notes: reason.clone().filter(|r| !r.trim().is_empty()),
            reviewer_run_id: None,
        });
    }
    let result = match response {
        CtaResponse::Approval { approved: true, .. } => w.advance(seq, &call_id, &mut state),
        CtaResponse::Approval { reason, .. } => Some(ToolResult::error(match reason {
            Some(r) if !r.trim().is_empty() => {
                format!("a human rejected this plan, so it did not run: {r}")
            }
            _ => "a human rejected this plan, so it did not run".to_owned(),
        })),
        other => Some(ToolResult::error(format!(
            "the plan's approval got a {} answer",
            other.kind()
        ))),
    };
    w.settle_plan(seq, state, result)
}

/// `Timer`: a plan step's timeout fired. The step fails and its child is cancelled, if it
/// still runs and the timer is due (an early or stale one changes nothing).
pub(in crate::engine) fn timer(w: &mut Work, timer_id: &str) -> Next {
    let found = w
        .pending_seqs(|t| t.plan.is_some())
        .into_iter()
        .find_map(|seq| {
            let p = w.tool(seq).plan.as_ref()?;
            let plan = p.plan.as_ref()?;
            let a = plan.agent_steps().find(|a| {
                p.steps.get(&a.id).is_some_and(|s| {
                    s.status == StepStatus::Running && s.timer_id.as_deref() == Some(timer_id)
                })
            })?;
            let deadline = p.steps.get(&a.id)?.deadline?;
            Some((seq, a.clone(), deadline))
        });
    let Some((seq, a, deadline)) = found else {
        return Next::Now(Step::Ignore(format!(
            "no running plan step has timer {timer_id}"
        )));
    };
    if w.now + chrono::Duration::seconds(1) < deadline {
        return Next::Now(Step::Ignore(format!(
            "timer {timer_id} is not due until {}",
            deadline.to_rfc3339()
        )));
    }
    let Some((call_id, mut state)) = w.take_plan(seq) else {
        return Next::Now(Step::Ignore("not a plan".into()));
    };
    let why = format!(
        "timed out: still running at its deadline, {}",
        deadline.to_rfc3339()
    );
    // The timer has fired: nothing to cancel but the child.
    if let Some(s) = state.steps.get_mut(&a.id) {
        s.timer_id = None;
    }
    w.stop_step(&call_id, &mut state, &a, StepStatus::Failed, why, true);
    let result = w.advance(seq, &call_id, &mut state);
    w.settle_plan(seq, state, result)
}
