//! A plan call as it runs: its phase, its steps' child runs and their results, kept on its
//! tool call's timeline entry.

use super::*;

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

/// How a drafted plan (`draft_only`) is approved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PlanApproval {
    /// In the conversation (seed 001): the call's result is the plan, which the model shows
    /// the person in its own words and asks about; confirmed, the model runs it with a call
    /// of its own.
    #[default]
    Conversation,
    /// On an approval question (a CTA whose gated input is the plan): approved, it runs.
    Question,
}

/// Where a plan call is (seed 002's state machine): `planning → reviewing →
/// awaiting_approval → dispatching → awaiting_results → merging → done | failed`, each
/// phase but the first optional (a plan the call gave is not planned; one run at once is not
/// reviewed), `dispatching ⇄ awaiting_results` once per stage.
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
    /// Its ready steps' child runs are being started.
    Dispatching,
    /// Its started steps run; it waits for their results (`running` in plans stored before).
    #[serde(alias = "running")]
    AwaitingResults,
    /// Every step is done: their results are merged into the call's output.
    Merging,
    /// It ended with an output that says it succeeded.
    Done,
    /// It ended with an error, or an output that says it did not succeed.
    Failed,
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
    /// When its child run started, and how long it took once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
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
            started_at: None,
            duration_ms: None,
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
    /// How a draft of it is approved.
    #[serde(default, skip_serializing_if = "is_conversation")]
    pub approval: PlanApproval,
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
    /// The planner's child run, once there is one (its conversation is there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planner_run_id: Option<String>,
    /// Plans the planner has written for this call (it may try twice).
    #[serde(default)]
    pub attempts: u32,
    /// Agent steps by id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub steps: BTreeMap<String, StepRun>,
    /// When the call was made (a plan's duration counts from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// When it entered its phase (a phase's duration counts from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_since: Option<DateTime<Utc>>,
    /// Drafted because an approval policy on `agent_orchestrate` matched the call (not
    /// because the model asked for a draft): only an answer to its approval question runs
    /// it, never the conversation.
    #[serde(
        rename = "heldByPolicy",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub held_by_policy: bool,
    /// How its review came out: the reviewer agent's verdict and notes, or a person's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<Review>,
}

/// The verdict on a plan before it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Review {
    /// `agent` (the `plan_reviewer`), `human` (its approval question answered) or
    /// `conversation` (the person wrote while the draft waited).
    pub by: String,
    /// `approved`, `sent_back` (the reviewer asked for changes), `rejected` (a person said
    /// no) or `answered_in_conversation` (the model reads what the person wrote).
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// The reviewer's child run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reviewer_run_id: Option<String>,
}

fn is_conversation(a: &PlanApproval) -> bool {
    *a == PlanApproval::Conversation
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Planning => "planning",
            Phase::Reviewing => "reviewing",
            Phase::AwaitingApproval => "awaiting_approval",
            Phase::Dispatching => "dispatching",
            Phase::AwaitingResults => "awaiting_results",
            Phase::Merging => "merging",
            Phase::Done => "done",
            Phase::Failed => "failed",
        }
    }
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
        let mut out = serde_json::json!({
            "success": success,
            "steps": steps,
            "bindings": self.results(),
        });
        // What failed, in the plan's order (seed 002's `errors`): only when something did.
        let errors: Vec<Value> = plan
            .agent_steps()
            .filter_map(|a| {
                let s = self.steps.get(&a.id)?;
                let failed = matches!(s.status, StepStatus::Failed | StepStatus::Skipped);
                let error = s.error.as_ref().filter(|_| failed)?;
                Some(serde_json::json!({"step": a.id, "status": s.status, "error": error}))
            })
            .collect();
        if !errors.is_empty() {
            out["errors"] = Value::Array(errors);
        }
        out
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
