//! The schemas of the tools the engine dispatches itself: `spawn_subagent`,
//! `agent_orchestrate` and `request_human_feedback`.

use serde_json::{Value, json};

use super::{REQUEST_HUMAN_FEEDBACK, SPAWN_SUBAGENT, ToolDef, ToolKind};

/// A call's `context` for the runs it starts: an object with a string `type`, or null.
fn context_schema() -> Value {
    json!({
        "type": ["object", "null"],
        "properties": {"type": {"type": "string", "minLength": 1}},
        "required": ["type"]
    })
}

/// `spawn_subagent`: start a child run of one of `agents`, or continue one by its id.
pub fn spawn_subagent(agents: &[String]) -> ToolDef {
    ToolDef::new(
        SPAWN_SUBAGENT,
        "Delegate a task to a subagent. Give `agent` and `prompt` to start one; give \
         `subagentId` (from an earlier result) and `prompt` to continue that subagent's \
         conversation. `askHuman: true` lets a new subagent ask the human questions too. \
         A new subagent works on this run's context, sandbox and repository unless the call \
         gives its own `context` ({\"type\": ..., ...}, or null for none), `sandboxId` or \
         `github` ({\"repo\": \"owner/name\", \"ref\"?: ...}). The result is the subagent's \
         final answer.",
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
                "context": context_schema()
            },
            "required": ["prompt"],
            "anyOf": [{"required": ["agent"]}, {"required": ["subagentId"]}],
            "additionalProperties": false
        }),
        ToolKind::Spawn,
    )
}

/// `agent_orchestrate`: run a plan of agents, in sequence and in parallel (see `crate::plan`).
pub fn agent_orchestrate(agents: &[String]) -> ToolDef {
    ToolDef::new(
        crate::plan::AGENT_ORCHESTRATE,
        &format!(
            "Run a multi-agent plan durably, as one call. Give `plan` (or `prompt`, and a \
             planner writes the plan). A plan is {{\"steps\": [...]}}, run in order; a step \
             is an agent step {{\"id\", \"agent\", \"prompt\", \"with\"?: {{...}}, \
             \"result_key\"?, \"timeout_ms\"?}} or a parallel step {{\"id\", \"parallel\": \
             [agent steps], \"max_concurrency\"?, \"merge\"?: \"collect\" | \"first_success\", \
             \"result_key\"?}}. A prompt or `with` may use an earlier step's output as \
             {{{{result.<result_key>}}}} (and .<field>), and `bindings` as \
             {{{{bindings.<name>}}}}. A step that uses the result of a failed step is skipped. \
             Agents: {}. `execution_mode`: auto_execute (default) runs it; draft_only asks a \
             human to approve it first; agent_review asks a reviewer agent first. With a \
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
pub fn request_human_feedback() -> ToolDef {
    let text = json!({"type": "string", "minLength": 1});
    let expires = json!({"type": "integer", "minimum": 1});
    // A default is its kind's answer (its `kind` may be left out).
    let default = |kind: &str, props: Value, required: &[&str]| {
        let mut props = props;
        props["kind"] = json!({"const": kind});
        json!({"type": "object", "properties": props, "required": required,
            "additionalProperties": false})
    };
    ToolDef::new(
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
