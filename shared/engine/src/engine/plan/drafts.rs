//! A drafted plan (`draft_only`): told to the model at once, to be confirmed in the
//! conversation (the default), or parked on an approval question.

use serde_json::json;

use super::{Work, cap_output, summary};
use crate::cta::{CtaRequest, Gated};
use crate::plan::{self, PlanState};
use crate::timeline::ToolResult;

impl Work<'_> {
    /// The draft told to the model at once (seed 001): the call's result is the plan, which
    /// the model shows the person and asks about in its own words; the person's reply is
    /// the next turn, in which the model runs it (a call of its own), revises it or answers.
    pub(super) fn draft_told(&mut self, call_id: &str, state: &PlanState) -> ToolResult {
        let Some(plan) = &state.plan else {
            return ToolResult::error("no plan to review");
        };
        self.publish(
            "plan.ready_for_review",
            json!({"runId": self.run.run_id, "callId": call_id, "ctaId": null,
                   "in": "conversation", "plan": plan}),
        );
        let output = json!({
            "status": "draft",
            "plan": plan,
            "bindings": state.bindings,
            "note": "This plan has not run. Tell the person what it will do, in your own \
                     words, and ask whether to run it. When they confirm, call \
                     agent_orchestrate with this plan and execution_mode auto_execute; if they \
                     ask for changes, draft a revised plan; otherwise answer them.",
        });
        ToolResult::Success {
            output: cap_output(output),
        }
    }

    /// Parks the plan on an approval CTA whose gated input is the plan.
    pub(super) fn draft(&mut self, seq: u64, call_id: &str, state: &PlanState) -> ToolResult {
        let Some(plan) = &state.plan else {
            return ToolResult::error("no plan to review");
        };
        let message = format!("Run this plan? {}", summary(plan));
        let gated = Gated {
            tool: plan::AGENT_ORCHESTRATE.into(),
            input: cap_output(json!({"plan": plan, "bindings": state.bindings})),
            reason: Some("the agent drafted this plan for your review before it runs".into()),
        };
        let expiry = self
            .book
            .agent(&self.run.agent)
            .map_or(self.book.limits.cta_expiry, |a| a.cta_expiry);
        let ask = crate::engine::ask::Ask {
            request: CtaRequest::Approval { message },
            default: None,
            gated: Some(gated),
            gate: false,
            expiry,
            budget: None,
        };
        let result = self.raise_cta(seq, call_id, ask);
        let cta_id = self.tool(seq).cta.as_ref().map(|c| c.cta_id.clone());
        self.publish(
            "plan.ready_for_review",
            json!({"runId": self.run.run_id, "callId": call_id, "ctaId": cta_id, "plan": plan}),
        );
        result
    }
}
