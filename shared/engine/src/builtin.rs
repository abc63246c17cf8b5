//! The engine's own agents and tools: the orchestrator, `explore`, `code` and the plan's
//! helpers, and the tools the engine dispatches itself (`spawn_subagent`,
//! `agent_orchestrate`, `request_human_feedback`), as data a host offers with its own
//! schema checks.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::agent::{AgentDef, Limits, ORCHESTRATOR, is_subagent};
use crate::llm::ToolSpec;
use crate::plan::{self, AGENT_ORCHESTRATE};
use crate::timeline::Operation;
use crate::tools::{REQUEST_HUMAN_FEEDBACK, SPAWN_SUBAGENT, ToolKind};

/// The built-in agents, `explore` with `explore_tools` (a deployment's `http_fetch`).
pub fn agents(limits: &Limits, explore_tools: &[&str]) -> Vec<AgentDef> {
    let agent =
        |name: &str, system: &str, tools: &[&str]| AgentDef::new(name, system, tools, limits);
    let described = |mut a: AgentDef, d: &str| {
        a.description = Some(d.into());
        a
    };
    let internal = |mut a: AgentDef, op: Operation| {
        a.operation = op;
        a.max_iterations = 2;
        a
    };
    vec![
        agent(
            ORCHESTRATOR,
            "You are an orchestrator. You do not do the work yourself: delegate it to \
             subagents with spawn_subagent (explore to investigate, code to change things), \
             in parallel when tasks are independent, or run a whole plan of them at once with \
             agent_orchestrate when later work needs earlier results; ask the human with \
             request_human_feedback when a decision or approval is theirs to make. When the \
             work is done, answer with a short summary.",
            &[SPAWN_SUBAGENT, REQUEST_HUMAN_FEEDBACK, AGENT_ORCHESTRATE],
        ),
        described(
            agent(
                "explore",
                "You are an explore subagent. Investigate what you are asked and report your \
                 findings concisely. End every turn with a final answer.",
                explore_tools,
            ),
            "investigates a question and reports its findings",
        ),
        described(
            agent(
                "code",
                "You are a code subagent. Carry out the change you are asked for and report \
                 what you did. End every turn with a final answer.",
                &[],
            ),
            "carries out a change and reports what it did",
        ),
        internal(agent(plan::PLANNER, PLANNER_PROMPT, &[]), Operation::Plan),
        internal(
            agent(plan::PLAN_REVIEWER, REVIEWER_PROMPT, &[]),
            Operation::Review,
        ),
    ]
}

/// The planner's fixed instructions; [`tools`] adds the agents a plan may use.
const PLANNER_PROMPT: &str = "You write plans for agent_orchestrate. Reply with one JSON \
object and nothing else: {\"steps\": [...]}. Steps run in order. An agent step is \
{\"id\": \"...\", \"agent\": \"<agent>\", \"prompt\": \"...\", \"result_key\": \"...\"} (also \
optional: \"with\": {...} input for the agent, \"timeout_ms\"). A parallel step runs agent steps \
at once: {\"id\": \"...\", \"parallel\": [agent steps], \"merge\": \"collect\" or \
\"first_success\"}. A prompt may use an earlier step's output as {{result.<result_key>}} \
(or a field of it, {{result.<result_key>.<field>}}) and the call's bindings as \
{{bindings.<name>}}; steps of one parallel step cannot use each other's results. Ids and \
result keys use letters, digits, - and _. Keep plans short: only the steps the objective \
needs.";

/// The plan reviewer's fixed instructions.
const REVIEWER_PROMPT: &str = "You review plans before they run. Approve a plan that \
accomplishes its objective with the agents it names, in a sensible order, without needless \
or risky steps. Reply with one JSON object and nothing else: {\"approved\": true or false, \
\"notes\": \"what to change, or why it is fine\"}.";

/// A call's `context` for the runs it starts: an object with a string `type`, or null.
fn context_schema() -> Value {
    json!({
        "type": ["object", "null"],
        "properties": {"type": {"type": "string", "minLength": 1}},
        "required": ["type"]
    })
}

/// `spawn_subagent`: start a child run of one of `agents`, or continue one by its id.
pub fn spawn_subagent(agents: &[String]) -> (ToolSpec, ToolKind) {
    spec(
        SPAWN_SUBAGENT,
        "Delegate a task to a subagent. Give `agent` and `prompt` to start one; give \
         `subagentId` (from an earlier result) and `prompt` to continue that subagent's \
         conversation. `askHuman: true` lets a new subagent ask the human questions too. \
         A new subagent works on this run's context, sandbox and repository unless the call \
         gives its own `context` ({\"type\": ..., ...}, or null for none), `sandboxId` or \
         `github` ({\"repo\": \"owner/name\", \"ref\"?: ...}). `action` names one of the \
         agent's actions (its prompt comes first; `input` is its input, checked against its \
         schema). The result is the subagent's final answer (and, for an action with an \
         output schema, that answer as JSON: `output`).",
        json!({
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": agents},
                "prompt": {"type": "string", "minLength": 1},
                "subagentId": {"type": "string", "minLength": 1},
                "sandboxId": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "github": {
                    "type": "object",
                    "properties": {"repo": {"type": "string"}, "ref": {"type": "string"}},
                    "required": ["repo"],
                    "additionalProperties": false
                },
                "askHuman": {"type": "boolean"},
                "action": {"type": "string", "minLength": 1},
                "input": {"type": "object"},
                "context": context_schema()
            },
            "allOf": [
                {"anyOf": [{"required": ["agent"]}, {"required": ["subagentId"]}]},
                {"anyOf": [{"required": ["prompt"]}, {"required": ["action"]}]}
            ],
            "additionalProperties": false
        }),
        ToolKind::Spawn,
    )
}

/// `agent_orchestrate`: run a plan of agents, in sequence and in parallel (see `crate::plan`).
pub fn agent_orchestrate(agents: &[String]) -> (ToolSpec, ToolKind) {
    spec(
        AGENT_ORCHESTRATE,
        &format!(
            "Run a multi-agent plan durably, as one call. Give `plan` (or `prompt`, and a \
             planner writes the plan). A plan is {{\"steps\": [...]}}, run in order; a step \
             is an agent step {{\"id\", \"agent\", \"prompt\", \"with\"?: {{...}}, \
             \"result_key\"?, \"timeout_ms\"?}} or a parallel step {{\"id\", \"parallel\": \
             [agent steps], \"max_concurrency\"?, \"merge\"?: \"collect\" | \"first_success\", \
             \"result_key\"?}}. A prompt or `with` may use an earlier step's output as \
             {{{{result.<result_key>}}}} (and .<field>), and `bindings` as \
             {{{{bindings.<name>}}}}. A step that uses the result of a failed step is skipped. \
             Agents: {}. `execution_mode`: auto_execute (default) runs it; draft_only drafts it: \
             the result is the plan, which you show the person in your own words and ask \
             them to confirm (confirmed, call again with it and auto_execute), or, with \
             `approval`: \"question\", a human approves it on a question first; \
             agent_review asks a reviewer agent first. With a \
             `prompt`, `requested_outputs` (what the plan must produce) and \
             `priority_entities` (what it must attend to first) guide the planner. Its agents \
             work on this run's context unless `context` gives another (or null: none). The result \
             is {{success, steps: [{{id, type, status, exec_id, outputs, error}}], bindings, \
             errors?}}.",
            agents.join(", ")
        ),
        json!({
            "type": "object",
            "properties": {
                "plan": {"type": ["object", "array"]},
                "prompt": {"type": "string", "minLength": 1},
                "bindings": {"type": "object"},
                "timeout_ms": {"type": "integer", "minimum": 1},
                "max_parallel": {"type": "integer", "minimum": 1},
                "execution_mode": {"enum": ["auto_execute", "draft_only", "agent_review"]},
                "approval": {"enum": ["conversation", "question"]},
                "auto_execute": {"type": "boolean"},
                "requested_outputs": {"type": "array", "items": {"type": "string", "minLength": 1}},
                "priority_entities": {"type": "array", "items": {"type": "string", "minLength": 1}},
                "context": context_schema()
            },
            "oneOf": [{"required": ["plan"]}, {"required": ["prompt"]}],
            "additionalProperties": false
        }),
        ToolKind::Orchestrate,
    )
}

/// `request_human_feedback`: ask a human a typed question and wait for the answer.
pub fn request_human_feedback() -> (ToolSpec, ToolKind) {
    let text = json!({"type": "string", "minLength": 1});
    let expires = json!({"type": "integer", "minimum": 1});
    // A default is its kind's answer (its `kind` may be left out).
    let default = |kind: &str, props: Value, required: &[&str]| {
        let mut props = props;
        props["kind"] = json!({"const": kind});
        json!({"type": "object", "properties": props, "required": required,
            "additionalProperties": false})
    };
    spec(
        REQUEST_HUMAN_FEEDBACK,
        "Ask a human and wait for the answer (it may take days). kind `approval` takes \
         `message` and answers {approved, reason?}; kind `text` takes `prompt` (and \
         `placeholder`, and `required: true` to refuse a blank answer) and answers {text}; kind \
         `choice` takes `prompt` and `options` [{id, label, description?}] and answers \
         {selectedId}. `expiresInSeconds` may shorten how long \
         the question waits (never past this agent's limit). `default` (an answer of the \
         question's kind) is the answer it takes if none comes in time, when the run expires \
         questions into their defaults; such an answer says `default: true`.",
        json!({
            "type": "object",
            "oneOf": [
                {"properties": {"kind": {"const": "approval"}, "message": text,
                    "expiresInSeconds": expires,
                    "default": default("approval",
                        json!({"approved": {"type": "boolean"}, "reason": {"type": "string"}}),
                        &["approved"])},
                 "required": ["kind", "message"], "additionalProperties": false},
                {"properties": {"kind": {"const": "text"}, "prompt": text,
                    "placeholder": {"type": "string"}, "required": {"type": "boolean"},
                    "expiresInSeconds": expires,
                    "default": default("text", json!({"text": {"type": "string"}}), &["text"])},
                 "required": ["kind", "prompt"], "additionalProperties": false},
                {"properties": {"kind": {"const": "choice"}, "prompt": text,
                    "options": {"type": "array", "minItems": 1, "items": {
                        "type": "object",
                        "properties": {"id": text, "label": {"type": "string"},
                            "description": {"type": "string"}},
                        "required": ["id", "label"], "additionalProperties": false}},
                    "expiresInSeconds": expires,
                    "default": default("choice", json!({"selectedId": text}), &["selectedId"])},
                 "required": ["kind", "prompt", "options"], "additionalProperties": false}
            ]
        }),
        ToolKind::Feedback,
    )
}

/// The engine's tools for a book of `agents`: what `spawn_subagent` and plans may start is
/// every agent but the orchestrator and the plan's helpers, and the planner is told which
/// (and how many steps a plan may have).
pub fn tools(
    agents: &mut BTreeMap<String, AgentDef>,
    limits: &Limits,
) -> [(ToolSpec, ToolKind); 3] {
    let subagents: Vec<String> = agents.keys().filter(|n| is_subagent(n)).cloned().collect();
    let listing: Vec<String> = subagents
        .iter()
        .map(
            |n| match agents.get(n).and_then(|a| a.description.as_deref()) {
                Some(d) => format!("- {n}: {d}"),
                None => format!("- {n}"),
            },
        )
        .collect();
    if let Some(planner) = agents.get_mut(plan::PLANNER) {
        planner.system.push_str(&format!(
            "\n\nA plan has at most {} agent steps (parallel ones counted). The agents a \
             plan may use:\n{}",
            limits.plan.max_steps,
            listing.join("\n")
        ));
    }
    [
        spawn_subagent(&subagents),
        request_human_feedback(),
        agent_orchestrate(&subagents),
    ]
}

fn spec(name: &str, description: &str, parameters: Value, kind: ToolKind) -> (ToolSpec, ToolKind) {
    let spec = ToolSpec {
        name: name.into(),
        description: description.into(),
        parameters,
    };
    (spec, kind)
}
