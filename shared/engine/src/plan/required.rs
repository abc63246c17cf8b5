//! What a plan must have: an agent's `planRequirements`, by the run's context type — the
//! agents a plan's steps must include, in order, some optional (seed 001's `project_create`:
//! template discovery, an optional template, `create_onto_project`, the context document).

use serde::{Deserialize, Serialize};

use super::{Plan, Step};

/// A step a plan must include: one of `agent`'s, after the steps required before it (in a
/// later stage: steps at once are in no order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Required {
    pub agent: String,
    /// The plan may leave it out; if it has it, it is in its place.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// What the step is for, as the planner is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
}

/// The key of the requirements of a run with no context, or of a context type with none of
/// its own.
pub const ANY_CONTEXT: &str = "*";

/// The requirements in words, for the planner's prompt and for its corrections.
pub fn describe(required: &[Required]) -> String {
    required
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut line = format!("{}. a step of agent `{}`", i + 1, r.agent);
            if r.optional {
                line.push_str(" (optional)");
            }
            if let Some(p) = &r.purpose {
                line.push_str(&format!(": {p}"));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Plan {
    /// Checks that the plan has the `required` steps, in order: each one's agent in a stage
    /// after the one before's (an optional step may be missing). The error says which is
    /// missing, and the whole list, so that a planner can correct its plan.
    pub fn check_required(&self, required: &[Required]) -> Result<(), String> {
        let stages: Vec<(usize, &str)> = self
            .steps
            .iter()
            .enumerate()
            .flat_map(|(i, s)| match s {
                Step::Agent(a) => vec![(i, a.agent.as_str())],
                Step::Parallel(p) => p.parallel.iter().map(|a| (i, a.agent.as_str())).collect(),
            })
            .collect();
        let mut after: Option<(usize, &str)> = None;
        for r in required {
            let found = stages
                .iter()
                .find(|(stage, agent)| *agent == r.agent && after.is_none_or(|(a, _)| *stage > a));
            match (found, after) {
                (Some(&(stage, agent)), _) => after = Some((stage, agent)),
                (None, _) if r.optional => {}
                (None, None) => {
                    return Err(missing(
                        &format!("it has no step of agent `{}`", r.agent),
                        required,
                    ));
                }
                (None, Some((_, before))) => {
                    return Err(missing(
                        &format!(
                            "it has no step of agent `{}` after its step of `{before}`",
                            r.agent
                        ),
                        required,
                    ));
                }
            }
        }
        Ok(())
    }
}

fn missing(what: &str, required: &[Required]) -> String {
    format!(
        "{what}. A plan for this context must include, in this order (each in a later step \
         than the one before):\n{}",
        describe(required)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(steps: serde_json::Value) -> Plan {
        Plan::parse(&steps, 10, |_| true).expect("valid")
    }

    fn req(agent: &str, optional: bool) -> Required {
        Required {
            agent: agent.into(),
            optional,
            purpose: None,
        }
    }

    #[test]
    fn required_steps_come_in_order_and_optional_ones_may_be_missing() {
        let required = [
            req("finder", false),
            req("maker", true),
            req("creator", false),
            req("writer", false),
        ];
        let step = |id: &str, agent: &str| json!({"id": id, "agent": agent, "prompt": "p"});
        let ok = plan(json!([
            step("a", "finder"),
            step("b", "creator"),
            step("c", "writer")
        ]));
        assert_eq!(ok.check_required(&required), Ok(()));
        let with_optional = plan(json!([
            step("a", "finder"),
            step("m", "maker"),
            step("b", "creator"),
            step("c", "writer")
        ]));
        assert_eq!(with_optional.check_required(&required), Ok(()));
        let missing = plan(json!([step("a", "finder"), step("c", "writer")]));
        let e = missing.check_required(&required).expect_err("no creator");
        assert!(
            e.starts_with("it has no step of agent `creator` after its step of `finder`"),
            "{e}"
        );
        assert!(e.contains("2. a step of agent `maker` (optional)"), "{e}");
        let backwards = plan(json!([
            step("c", "writer"),
            step("a", "finder"),
            step("b", "creator")
        ]));
        assert!(backwards.check_required(&required).is_err());
        // Steps at once are in no order: the writer must come in a later stage.
        let at_once = plan(json!([step("a", "finder"), step("b", "creator"),
            {"id": "g", "parallel": [step("c", "writer"), step("d", "explore")]}]));
        assert_eq!(at_once.check_required(&required), Ok(()));
        let same_stage = plan(json!([step("a", "finder"),
            {"id": "g", "parallel": [step("b", "creator"), step("c", "writer")]}]));
        assert!(same_stage.check_required(&required).is_err());
        let none = plan(json!([step("x", "explore")]));
        let e = none.check_required(&required).expect_err("nothing");
        assert!(e.starts_with("it has no step of agent `finder`"), "{e}");
    }
}
