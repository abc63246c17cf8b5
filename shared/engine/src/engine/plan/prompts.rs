//! What a plan's people and agents are shown: the one-line plan a human approves, and the
//! planner's and the reviewer's prompts.

use serde_json::{Map, Value};

use super::preview;
use crate::plan::{self, Plan, PlanState};

/// A plan in one line, for the human who approves it.
pub(super) fn summary(plan: &Plan) -> String {
    let steps: Vec<String> = plan
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            plan::Step::Agent(a) => format!("{}. `{}` ({})", i + 1, a.id, a.agent),
            plan::Step::Parallel(p) => {
                let each: Vec<String> = p
                    .parallel
                    .iter()
                    .map(|a| format!("`{}` ({})", a.id, a.agent))
                    .collect();
                format!("{}. at once: {}", i + 1, each.join(", "))
            }
        })
        .collect();
    let (shown, _) = preview(&steps.join("; "), 2048);
    shown
}

pub(super) fn planner_prompt(
    objective: &str,
    bindings: &Map<String, Value>,
    requested: &[String],
    priority: &[String],
) -> String {
    let mut text = format!("Objective: {objective}");
    if !bindings.is_empty() {
        let names: Vec<&str> = bindings.keys().map(String::as_str).collect();
        text.push_str(&format!(
            "\n\nBindings a step may use as {{{{bindings.<name>}}}}: {}",
            names.join(", ")
        ));
    }
    if !requested.is_empty() {
        text.push_str(&format!(
            "\n\nThe plan must produce (a step's result_key for each): {}",
            requested.join(", ")
        ));
    }
    if !priority.is_empty() {
        text.push_str(&format!(
            "\n\nAttend to these first: {}",
            priority.join(", ")
        ));
    }
    text
}

pub(super) fn reviewer_prompt(state: &PlanState) -> String {
    let plan = serde_json::to_string_pretty(&state.plan).unwrap_or_default();
    match &state.objective {
        Some(o) => format!("Objective: {o}\n\nPlan:\n{plan}"),
        None => format!("Plan:\n{plan}"),
    }
}
