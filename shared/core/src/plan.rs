//! Plans (`agent_orchestrate`): agent steps in sequence and in parallel groups, each run as a
//! child run, with earlier results flowing into later prompts as `{{result.<key>}}` and the
//! call's bindings as `{{bindings.<name>}}`.
//!
//! This module is plain data: the plan's format, its validation (the same for a plan the model
//! writes and one the planner writes), the template language and the state a running plan
//! keeps on its tool call's timeline entry. The engine runs plans (`engine/plan.rs`).

mod template;

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use template::{Ref, Root, Template};

/// The built-in tool that runs a plan.
pub const AGENT_ORCHESTRATE: &str = "agent_orchestrate";
/// The internal agent that turns a prompt into a plan (operation `plan`).
pub const PLANNER: &str = "planner";
/// The internal agent that reviews a plan before it runs (operation `review`).
pub const PLAN_REVIEWER: &str = "plan_reviewer";

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
        if let Some(with) = &self.with {
            let mut filled = Map::new();
            for (k, v) in with {
                filled.insert(k.clone(), fill(v, scope)?);
            }
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str("Input:\n");
            text.push_str(
                &serde_json::to_string_pretty(&Value::Object(filled)).unwrap_or_default(),
            );
        }
        Ok(text)
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

/// How a plan call runs once its plan is known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    /// Run it.
    #[default]
    AutoExecute,
    /// Park it on an approval CTA; run it if a human approves.
    DraftOnly,
    /// Ask the reviewer agent first; run it if the reviewer approves.
    AgentReview,
}

/// Where a plan call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The planner is writing the plan.
    Planning,
    /// The reviewer is reading it.
    Reviewing,
    /// A human is (an approval CTA on the call).
    AwaitingApproval,
    /// Its steps run.
    Running,
}

/// How one agent step stands. The output schema's `partial` is a parallel step's alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    Running,
    Success,
    Failed,
    Skipped,
    /// Of a parallel step: some of its steps succeeded, not all.
    Partial,
}

impl StepStatus {
    pub fn is_done(self) -> bool {
        !matches!(self, Self::Pending | Self::Running)
    }
}

/// One agent step as it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct StepRun {
    pub status: StepStatus,
    /// Its child run (the output schema's `exec_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The timer that ends it, and when it fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
}

impl StepRun {
    fn pending() -> Self {
        Self {
            status: StepStatus::Pending,
            child_run_id: None,
            output: None,
            error: None,
            timer_id: None,
            deadline: None,
        }
    }
}

/// A plan call as it goes: kept on its tool call's timeline entry, so that every step of the
/// plan is committed with the run (a crash anywhere repeats nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PlanState {
    pub mode: ExecutionMode,
    pub phase: Phase,
    /// The prompt the planner was given (none when the call gave the plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub bindings: Map<String, Value>,
    /// Child runs of a parallel step at once (the deployment's cap, or the call's lower one).
    pub max_parallel: usize,
    /// Each step's timeout, from the call (the deployment's, or the call's shorter one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The planner's or the reviewer's child run, while it works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helper: Option<String>,
    /// Plans the planner has written for this call (it may try twice).
    #[serde(default)]
    pub attempts: u32,
    /// Agent steps by id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub steps: BTreeMap<String, StepRun>,
}

impl PlanState {
    /// Starts keeping track of `plan`'s steps.
    pub fn set_plan(&mut self, plan: Plan) {
        self.steps = plan
            .agent_steps()
            .map(|a| (a.id.clone(), StepRun::pending()))
            .collect();
        self.plan = Some(plan);
    }

    /// Every child run that is still working for this call: the helper and running steps.
    pub fn live_children(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.helper.iter().map(String::as_str).collect();
        out.extend(
            self.steps
                .values()
                .filter(|s| s.status == StepStatus::Running)
                .filter_map(|s| s.child_run_id.as_deref()),
        );
        out
    }

    /// Whether `child` is (or was) one of this call's child runs.
    pub fn owns(&self, child: &str) -> bool {
        self.helper.as_deref() == Some(child)
            || self
                .steps
                .values()
                .any(|s| s.child_run_id.as_deref() == Some(child))
    }

    /// The status of a top-level step.
    pub fn status_of(&self, step: &Step) -> StepStatus {
        match step {
            Step::Agent(a) => self
                .steps
                .get(&a.id)
                .map_or(StepStatus::Pending, |s| s.status),
            Step::Parallel(p) => {
                let all: Vec<StepStatus> = p
                    .parallel
                    .iter()
                    .map(|a| {
                        self.steps
                            .get(&a.id)
                            .map_or(StepStatus::Pending, |s| s.status)
                    })
                    .collect();
                if all.iter().any(|s| !s.is_done()) {
                    return if all.contains(&StepStatus::Running) {
                        StepStatus::Running
                    } else {
                        StepStatus::Pending
                    };
                }
                let won = all.iter().filter(|s| **s == StepStatus::Success).count();
                match p.merge {
                    _ if all.iter().all(|s| *s == StepStatus::Skipped) => StepStatus::Skipped,
                    Merge::FirstSuccess if won > 0 => StepStatus::Success,
                    Merge::Collect if won == all.len() => StepStatus::Success,
                    Merge::Collect if won > 0 => StepStatus::Partial,
                    _ => StepStatus::Failed,
                }
            }
        }
    }

    /// A parallel step's merged output.
    fn merged(&self, p: &ParallelStep) -> Value {
        let ok = p.parallel.iter().filter_map(|a| {
            let s = self.steps.get(&a.id)?;
            (s.status == StepStatus::Success).then(|| (a, s.output.clone().unwrap_or(Value::Null)))
        });
        match p.merge {
            Merge::FirstSuccess => ok.map(|(_, v)| v).next().unwrap_or(Value::Null),
            Merge::Collect => Value::Object(
                ok.map(|(a, v)| (a.result_key.clone().unwrap_or_else(|| a.id.clone()), v))
                    .collect(),
            ),
        }
    }

    /// The results later steps may use, by result key: those of steps that succeeded (a
    /// parallel step's when at least one of its steps did).
    pub fn results(&self) -> Map<String, Value> {
        let mut out = Map::new();
        let Some(plan) = &self.plan else {
            return out;
        };
        for step in &plan.steps {
            if let Step::Parallel(p) = step
                && let Some(k) = &p.result_key
                && matches!(
                    self.status_of(step),
                    StepStatus::Success | StepStatus::Partial
                )
            {
                out.insert(k.clone(), self.merged(p));
            }
        }
        for a in plan.agent_steps() {
            if let (Some(k), Some(s)) = (&a.result_key, self.steps.get(&a.id))
                && s.status == StepStatus::Success
            {
                out.insert(k.clone(), s.output.clone().unwrap_or(Value::Null));
            }
        }
        out
    }

    /// The step (agent or parallel) that makes result `key`, and whether it came to nothing.
    pub fn producer_failed(&self, key: &str) -> Option<String> {
        let plan = self.plan.as_ref()?;
        for step in &plan.steps {
            if let Step::Parallel(p) = step
                && p.result_key.as_deref() == Some(key)
            {
                let st = self.status_of(step);
                return matches!(st, StepStatus::Failed | StepStatus::Skipped)
                    .then(|| p.id.clone());
            }
        }
        let a = plan
            .agent_steps()
            .find(|a| a.result_key.as_deref() == Some(key))?;
        let st = self.steps.get(&a.id).map(|s| s.status)?;
        matches!(st, StepStatus::Failed | StepStatus::Skipped).then(|| a.id.clone())
    }

    /// The tool result of a finished plan (seed 002's output schema).
    pub fn output(&self) -> Value {
        let Some(plan) = &self.plan else {
            return Value::Null;
        };
        let agent = |a: &AgentStep| {
            let s = self.steps.get(&a.id);
            let mut o = Map::new();
            o.insert("id".into(), a.id.clone().into());
            o.insert("type".into(), "agent".into());
            let status = s.map_or(StepStatus::Pending, |s| s.status);
            o.insert(
                "status".into(),
                serde_json::to_value(status).unwrap_or_default(),
            );
            if let Some(s) = s {
                if let Some(c) = &s.child_run_id {
                    o.insert("exec_id".into(), c.clone().into());
                }
                if let Some(v) = &s.output {
                    o.insert("outputs".into(), v.clone());
                }
                if let Some(e) = &s.error {
                    o.insert("error".into(), e.clone().into());
                }
            }
            Value::Object(o)
        };
        let steps: Vec<Value> = plan
            .steps
            .iter()
            .map(|step| match step {
                Step::Agent(a) => agent(a),
                Step::Parallel(p) => {
                    let status = self.status_of(step);
                    let mut o = serde_json::json!({
                        "id": p.id,
                        "type": "parallel",
                        "status": status,
                        "children": p.parallel.iter().map(agent).collect::<Vec<_>>(),
                    });
                    if matches!(status, StepStatus::Success | StepStatus::Partial) {
                        o["outputs"] = self.merged(p);
                    }
                    o
                }
            })
            .collect();
        let success = plan
            .steps
            .iter()
            .all(|s| self.status_of(s) == StepStatus::Success);
        serde_json::json!({
            "success": success,
            "steps": steps,
            "bindings": self.results(),
        })
    }
}

/// A reviewer's verdict: `{"approved": bool, "notes": "..."}`, alone or in a code fence.
pub fn parse_review(text: &str) -> Result<(bool, String), String> {
    #[derive(Deserialize)]
    struct Review {
        approved: bool,
        #[serde(default)]
        notes: String,
    }
    serde_json::from_str::<Review>(strip_fence(text))
        .map(|r| (r.approved, r.notes))
        .map_err(|e| format!("the reply is not {{\"approved\": bool, \"notes\": \"...\"}}: {e}"))
}

/// The JSON a model wrote, without a Markdown code fence around it.
pub fn strip_fence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

#[cfg(test)]
mod tests;
