//! Plans (`agent_orchestrate`): agent steps in sequence and in parallel groups, each run as a
//! child run, with earlier results flowing into later prompts as `{{result.<key>}}` and the
//! call's bindings as `{{bindings.<name>}}`.
//!
//! This module is plain data: the plan's format, its validation (the same for a plan the model
//! writes and one the planner writes), the template language and the state a running plan
//! keeps on its tool call's timeline entry. The engine runs plans (`engine/plan.rs`).

mod required;
mod state;
mod template;

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use required::{ANY_CONTEXT, Required, describe as describe_required};
pub use state::{
    ExecutionMode, Phase, PlanApproval, PlanState, Review, StepRun, StepStatus, parse_review,
    strip_fence,
};
pub use template::{Ref, Root, Template};

/// The built-in tool that runs a plan.
pub const AGENT_ORCHESTRATE: &str = "agent_orchestrate";
/// The internal agent that turns a prompt into a plan (operation `plan`).
pub const PLANNER: &str = "planner";
/// The internal agent that reviews a plan before it runs (operation `review`).
pub const PLAN_REVIEWER: &str = "plan_reviewer";
/// The bus event a plan call's every change of phase puts out: `{runId, callId, from, to,
/// at, inPhaseMs?, sincePlanMs?}` (`from` null when it begins; `to` `done` or `failed` when
/// it ends).
pub const PHASE_EVENT: &str = "plan.phase";

/// A plan: steps run in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
pub struct Plan {
    pub steps: Vec<Step>,
}

/// One step: an agent, or a group of agents run at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum Step {
    Parallel(ParallelStep),
    Agent(AgentStep),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentStep {
    pub id: String,
    pub agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Input for the agent, given to it as JSON after the prompt; strings may hold templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with: Option<Map<String, Value>>,
    /// Where later steps find this step's output: `{{result.<result_key>}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_key: Option<String>,
    /// This step's timeout (it may only lower the call's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// One of the agent's actions: its prompt comes first, `with` is its input (checked
    /// against its input schema before the child starts), and its output is checked
    /// against its output schema before it is bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ParallelStep {
    pub id: String,
    pub parallel: Vec<AgentStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    #[serde(default)]
    pub merge: Merge,
    /// Where later steps find the merged output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_key: Option<String>,
}

/// How a parallel step's outputs merge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Merge {
    /// Every step runs; the output maps each one's result key (or id) to its output.
    #[default]
    Collect,
    /// The first to succeed wins (its output is the step's); the others are cancelled.
    FirstSuccess,
}

/// What a plan may be: the caps of the deployment (a call may lower `max_parallel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanLimits {
    /// Agent steps per plan, counting those inside parallel steps.
    pub max_steps: usize,
    /// Child runs of one parallel step at once.
    pub max_parallel: usize,
    /// How deep a plan's child runs may be (a top-level run is depth 0).
    pub max_depth: u32,
    /// Each step's timeout unless the call sets a shorter one.
    pub step_timeout: Option<std::time::Duration>,
}

impl Default for PlanLimits {
    fn default() -> Self {
        Self {
            max_steps: 12,
            max_parallel: 4,
            max_depth: 3,
            step_timeout: None,
        }
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Plan {
    /// Parses and checks a plan: `{"steps": [...]}` or the list of steps itself. `agent`
    /// says whether a plan may name an agent. The error says what is wrong and where, in
    /// words a model can act on (the planner is shown it and tries once more).
    pub fn parse(
        value: &Value,
        max_steps: usize,
        agent: impl Fn(&str) -> bool,
    ) -> Result<Plan, String> {
        let steps = match value {
            Value::Array(steps) => steps,
            Value::Object(o) => match o.get("steps") {
                Some(Value::Array(steps)) if o.len() == 1 => steps,
                _ => return Err("a plan is {\"steps\": [...]} (or the list of steps)".into()),
            },
            _ => return Err("a plan is {\"steps\": [...]} (or the list of steps)".into()),
        };
        let mut plan = Plan { steps: Vec::new() };
        for (i, raw) in steps.iter().enumerate() {
            let at = || match raw.get("id").and_then(Value::as_str) {
                Some(id) => format!("step {} (`{id}`)", i + 1),
                None => format!("step {}", i + 1),
            };
            let step = if raw.get("parallel").is_some() {
                serde_json::from_value(raw.clone()).map(Step::Parallel)
            } else {
                serde_json::from_value(raw.clone()).map(Step::Agent)
            };
            plan.steps.push(step.map_err(|e| format!("{}: {e}", at()))?);
        }
        plan.check(max_steps, agent)?;
        Ok(plan)
    }

    /// The agent steps, in order (a parallel step's in its order).
    pub fn agent_steps(&self) -> impl Iterator<Item = &AgentStep> {
        self.steps.iter().flat_map(|s| match s {
            Step::Agent(a) => std::slice::from_ref(a).iter(),
            Step::Parallel(p) => p.parallel.iter(),
        })
    }

    fn check(&self, max_steps: usize, agent: impl Fn(&str) -> bool) -> Result<(), String> {
        for step in &self.steps {
            if let Step::Parallel(p) = step
                && p.parallel.is_empty()
            {
                return Err(format!("step `{}`: `parallel` is empty", p.id));
            }
        }
        let count = self.agent_steps().count();
        if count == 0 {
            return Err("a plan needs at least one step".into());
        }
        if count > max_steps {
            return Err(format!(
                "a plan may have at most {max_steps} agent steps (parallel ones counted); this one has {count}"
            ));
        }
        let mut ids = HashSet::new();
        // Result keys made by the steps before the one being checked.
        let mut known: HashSet<&str> = HashSet::new();
        for step in &self.steps {
            let (id, key, agents): (&str, Option<&String>, Vec<&AgentStep>) = match step {
                Step::Agent(a) => (&a.id, None, vec![a]),
                Step::Parallel(p) => {
                    if p.max_concurrency == Some(0) {
                        return Err(format!(
                            "step `{}`: max_concurrency must be at least 1",
                            p.id
                        ));
                    }
                    (&p.id, p.result_key.as_ref(), p.parallel.iter().collect())
                }
            };
            if !ids.insert(id) {
                return Err(format!("step id `{id}` is used twice"));
            }
            if !valid_name(id) {
                return Err(format!(
                    "step id `{id}` is not valid: use 1 to 64 letters, digits, `-` and `_`"
                ));
            }
            let mut made = Vec::new();
            for a in &agents {
                if matches!(step, Step::Parallel(_)) {
                    if !ids.insert(&a.id) {
                        return Err(format!("step id `{}` is used twice", a.id));
                    }
                    if !valid_name(&a.id) {
                        return Err(format!(
                            "step id `{}` is not valid: use 1 to 64 letters, digits, `-` and `_`",
                            a.id
                        ));
                    }
                }
                a.check(&agent, &known)?;
                made.extend(a.result_key.as_deref());
            }
            made.extend(key.map(String::as_str));
            for k in made {
                if !valid_name(k) {
                    return Err(format!(
                        "result_key `{k}` is not valid: use 1 to 64 letters, digits, `-` and `_`"
                    ));
                }
                if !known.insert(k) {
                    return Err(format!("result_key `{k}` is used twice"));
                }
            }
        }
        Ok(())
    }
}

impl AgentStep {
    fn check(&self, agent: &impl Fn(&str) -> bool, known: &HashSet<&str>) -> Result<(), String> {
        let at = format!("step `{}`", self.id);
        if !agent(&self.agent) {
            return Err(format!(
                "{at}: there is no agent `{}` a plan may use",
                self.agent
            ));
        }
        if self.prompt.as_deref().is_none_or(|p| p.trim().is_empty()) && self.with.is_none() {
            return Err(format!("{at}: give the agent a `prompt` (or `with`)"));
        }
        if self.timeout_ms == Some(0) {
            return Err(format!("{at}: timeout_ms must be at least 1"));
        }
        for r in self.refs().map_err(|e| format!("{at}: {e}"))? {
            if r.root == Root::Result && !known.contains(r.key.as_str()) {
                return Err(format!(
                    "{at}: `{r}` names no result of an earlier step (result keys so far: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        let mut k: Vec<&&str> = known.iter().collect();
                        k.sort();
                        k.iter()
                            .map(|s| s.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ));
            }
        }
        Ok(())
    }

    /// Every reference in its prompt and `with`.
    pub fn refs(&self) -> Result<Vec<Ref>, String> {
        let mut out = Vec::new();
        if let Some(p) = &self.prompt {
            out.extend(Template::parse(p)?.refs());
        }
        if let Some(with) = &self.with {
            for v in with.values() {
                collect_refs(v, &mut out)?;
            }
        }
        Ok(out)
    }

    /// The prompt its child run starts with: the prompt, then `with` as JSON, each template
    /// filled in from `scope`. An error names the reference that could not be filled.
    pub fn render(&self, scope: &Scope) -> Result<String, String> {
        let mut text = match &self.prompt {
            Some(p) => Template::parse(p)?.render(scope)?,
            None => String::new(),
        };
        if let Some(filled) = self.input(scope)? {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str("Input:\n");
            text.push_str(&serde_json::to_string_pretty(&filled).unwrap_or_default());
        }
        Ok(text)
    }

    /// Its `with`, its templates filled in (none without one).
    pub fn input(&self, scope: &Scope) -> Result<Option<Value>, String> {
        let Some(with) = &self.with else {
            return Ok(None);
        };
        let mut filled = Map::new();
        for (k, v) in with {
            filled.insert(k.clone(), fill(v, scope)?);
        }
        Ok(Some(Value::Object(filled)))
    }
}

fn collect_refs(v: &Value, out: &mut Vec<Ref>) -> Result<(), String> {
    match v {
        Value::String(s) => out.extend(Template::parse(s)?.refs()),
        Value::Array(a) => {
            for v in a {
                collect_refs(v, out)?;
            }
        }
        Value::Object(o) => {
            for v in o.values() {
                collect_refs(v, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Fills the templates in a `with` value: a string that is one reference alone becomes the
/// referenced value itself (an object stays an object); other strings are filled as text.
fn fill(v: &Value, scope: &Scope) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => {
            let t = Template::parse(s)?;
            match t.alone() {
                Some(r) => scope.get(r)?.clone(),
                None => Value::String(t.render(scope)?),
            }
        }
        Value::Array(a) => {
            Value::Array(a.iter().map(|v| fill(v, scope)).collect::<Result<_, _>>()?)
        }
        Value::Object(o) => {
            let mut m = Map::new();
            for (k, v) in o {
                m.insert(k.clone(), fill(v, scope)?);
            }
            Value::Object(m)
        }
        v => v.clone(),
    })
}

/// What templates may refer to: the results so far and the call's bindings.
pub struct Scope<'a> {
    pub results: &'a Map<String, Value>,
    pub bindings: &'a Map<String, Value>,
}

impl Scope<'_> {
    /// The value `r` refers to, or why there is none.
    pub fn get(&self, r: &Ref) -> Result<&Value, String> {
        let (map, what) = match r.root {
            Root::Result => (self.results, "result"),
            Root::Bindings => (self.bindings, "binding"),
        };
        let mut v = map
            .get(&r.key)
            .ok_or_else(|| format!("`{r}`: there is no {what} `{}`", r.key))?;
        for field in &r.path {
            v = match v {
                Value::Object(o) => o.get(field),
                Value::Array(a) => field.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            }
            .ok_or_else(|| format!("`{r}`: no `{field}` there"))?;
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests;
