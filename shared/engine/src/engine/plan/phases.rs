//! A plan call's moves through its phases (seed 002's state machine), each said on the bus
//! with its timing.

use serde_json::json;

use super::Work;
use crate::plan::{self, Phase, PlanState};
use crate::timeline::ToolResult;

impl Work<'_> {
    /// Moves plan call `call_id` to phase `to`, saying so on the bus (for traces, metrics
    /// and UIs) with when, how long it was in the phase it leaves (`inPhaseMs`) and since
    /// the call was made (`sincePlanMs`). A plan's first phase comes from none (`from`
    /// null); staying in a phase says nothing.
    pub(in crate::engine) fn enter(&mut self, call_id: &str, state: &mut PlanState, to: Phase) {
        let from = state.phase_since.map(|since| (state.phase, since));
        if from.is_some_and(|(phase, _)| phase == to) {
            return;
        }
        let now = self.now;
        let ms = |since: chrono::DateTime<chrono::Utc>| (now - since).num_milliseconds().max(0);
        let mut detail = json!({"runId": self.run.run_id, "callId": call_id,
            "from": from.map(|(p, _)| p.as_str()), "to": to.as_str(), "at": self.now});
        if let Some((_, since)) = from {
            detail["inPhaseMs"] = json!(ms(since));
        }
        if let Some(at) = state.started_at {
            detail["sincePlanMs"] = json!(ms(at));
        }
        self.publish(plan::PHASE_EVENT, detail);
        state.phase = to;
        state.phase_since = Some(self.now);
    }

    /// The plan call ended with `result`: `done` when it succeeded, `failed` when it is an
    /// error or its output says a step failed.
    pub(in crate::engine) fn plan_ended(
        &mut self,
        call_id: &str,
        state: &mut PlanState,
        result: &ToolResult,
    ) {
        let ok = match result {
            ToolResult::Success { output } => output["success"].as_bool() != Some(false),
            _ => false,
        };
        self.enter(call_id, state, if ok { Phase::Done } else { Phase::Failed });
    }
}
