//! Draft plans a person answers in the conversation (seed 001, §4.3 and §5.7): a plan the
//! model drafted for review (`execution_mode: draft_only`) waits on an approval question,
//! and the person may answer it there — or simply write ("looks good, run it", "add a
//! step first"). A follow-up that comes while the run waits on such drafts alone is not
//! queued behind them: each draft's question is withdrawn (settled `cancelled`, the first
//! write wins: an answer that got there first stands and the follow-up waits as before),
//! its call returns the plan to the model as held for review, and the follow-up starts the
//! model's next turn, which runs the plan (`agent_orchestrate` with it and `auto_execute`),
//! drafts another, or answers.
//!
//! A plan drafted because an approval policy on `agent_orchestrate` matched its call is a
//! person's gate, not the model's choice: only its approval question runs it, and a
//! follow-up waits behind it.

use super::*;
use crate::cta::Cta;
use std::collections::HashMap;

impl Work<'_> {
    /// The approval questions of the drafts a follow-up would answer in the conversation:
    /// the run waits on nothing else (every pending call of its batch is such a draft).
    pub(in crate::engine) fn conversational_drafts(&self) -> Vec<String> {
        let pending = self.pending_seqs(|_| true);
        let drafts: Vec<String> = pending
            .iter()
            .filter_map(|&seq| {
                let t = self.tool(seq);
                let p = t.plan.as_ref()?;
                let cta = t.cta.as_ref()?;
                (p.phase == Phase::AwaitingApproval
                    && !p.held_by_policy
                    && cta.status == CtaStatus::Pending)
                    .then(|| cta.cta_id.clone())
            })
            .collect();
        if drafts.is_empty() || drafts.len() != pending.len() {
            return Vec::new();
        }
        drafts
    }

    /// Hands the drafts whose questions this step withdrew (`settled`: the CTA records
    /// after the withdrawal) back to the model as held for review; `true` if none waits
    /// any more (an answer written first keeps its draft waiting, and the follow-up with it).
    pub(in crate::engine) fn hand_back_drafts(&mut self, settled: &HashMap<String, Cta>) -> bool {
        let mut waiting = false;
        for seq in self.pending_seqs(|t| t.plan.is_some() && t.cta.is_some()) {
            let Some(mut snap) = self.tool(seq).cta.clone() else {
                continue;
            };
            match settled.get(&snap.cta_id).map(|c| c.status) {
                Some(CtaStatus::Cancelled) => {}
                _ => {
                    waiting = true;
                    continue;
                }
            }
            let Some((call_id, mut state)) = self.take_plan(seq) else {
                continue;
            };
            snap.status = CtaStatus::Cancelled;
            let cta_id = snap.cta_id.clone();
            self.effects.push(Effect::CancelCta {
                cta_id: cta_id.clone(),
            });
            crate::engine::cta::cancel_timers(&mut self.effects, &snap);
            self.tell_parent_resumed(&cta_id);
            state.review = Some(plan::Review {
                by: "conversation".into(),
                outcome: "answered_in_conversation".into(),
                notes: None,
                reviewer_run_id: None,
            });
            self.publish(
                "plan.reviewed",
                json!({"runId": self.run.run_id, "callId": call_id, "by": "conversation",
                       "ctaId": cta_id}),
            );
            let output = json!({
                "status": "held_for_review",
                "plan": state.plan,
                "bindings": state.bindings,
                "note": "The person wrote in the conversation instead of answering this \
                         plan's approval question; their message follows. If they confirm \
                         it, run this plan as it is: call agent_orchestrate with it and \
                         execution_mode auto_execute. If they ask for changes, draft it \
                         again; otherwise answer them.",
            });
            // It ends without running: the model reads what the person wrote (and runs the
            // plan, with a call of its own, if they confirmed it).
            self.enter(&call_id, &mut state, Phase::Done);
            self.tool_mut(seq).plan = Some(Box::new(state));
            self.resolve(
                seq,
                ToolResult::Success {
                    output: cap_output(output),
                },
                Some(snap),
            );
        }
        !waiting
    }
}
