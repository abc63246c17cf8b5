//! Agents are data: a name, a system prompt, a model, tools, an approval policy, limits
//! (their definitions are the engine's: `baton_engine::agent`, re-exported here).
//!
//! The [`Catalog`] holds every agent and tool a deployment knows, its plugins and the
//! guardrails. It is built once at start-up; a bad agents file is a start-up error that names
//! the problem. Each step is handed a [`Book`] of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;

pub use baton_engine::agent::*;

pub use crate::agents_file::{
    ActionSpec, AgentSpec, AgentsFile, AlwaysKeyword, ApprovalSpec, FileError,
};
use crate::plan;
use crate::timeline::Operation;
use crate::tools;
use baton_engine::cta::{Assignment, check_assignment, check_principal};

mod catalog;
mod declared;
mod extensions;
mod notifiers;
mod plugin;

pub use catalog::{Catalog, HTTP_FETCH, Listed, RELIST_INTERVAL, Toolbox};
pub use extensions::Extensions;
pub use plugin::{Plugin, Prepare};

/// A problem with the agent definitions, reported at start-up.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("notifier `{notifier}`: {message}")]
    Notifier { notifier: String, message: String },
    #[error("agent `{agent}` lists unknown tool `{tool}` (known tools: {known})")]
    UnknownTool {
        agent: String,
        tool: String,
        known: String,
    },
    #[error(
        "two tools are named `{0}` (among the built-in ones, the deployment's Rust tools, the \
         agents file's HTTP tools and `httpFetch`): rename one"
    )]
    DuplicateTool(String),
    #[error("agent `{agent}` sets an approval policy for `{tool}`, which is not one of its tools")]
    ApprovalForMissingTool { agent: String, tool: String },
    #[error("agent `{agent}`: approval regex for `{tool}` is invalid: {source}")]
    BadRegex {
        agent: String,
        tool: String,
        #[source]
        source: regex::Error,
    },
    #[error("agent name `{0}` is not valid: use letters, digits, `-` and `_`")]
    BadName(String),
    #[error(
        "agent `{agent}`: contextBytes is {bytes}; it must be from {MIN_CONTEXT_BYTES} to {MAX_CONTEXT_BYTES}"
    )]
    ContextBudget { agent: String, bytes: usize },
    #[error("agent `{0}`: maxIterations must be at least 1")]
    ZeroIterations(String),
    #[error("{0}")]
    BadPrice(String),
    #[error("agent `{0}`: maxToolCallsPerTurn must be at least 1")]
    ZeroToolCalls(String),
    #[error(
        "agent `{agent}`: ctaExpirySeconds is {seconds}; it must be from 1 to {MAX_CTA_EXPIRY_SECS} (one year)"
    )]
    BadCtaExpiry { agent: String, seconds: u64 },
    #[error("agent `{agent}`: maxWallSeconds must be at least 1")]
    ZeroWall { agent: String },
    #[error("agent `{agent}`: {message}")]
    Invalid { agent: String, message: String },
    #[error("mcpServers.{server}: {message}")]
    Server { server: String, message: String },
    #[error("tools.{tool}: {message}")]
    HttpTool { tool: String, message: String },
    #[error("toolTimeoutSeconds must be at least 1")]
    ZeroTimeout,
    #[error("agent `{0}` writes or reviews plans; it cannot have tools")]
    InternalWithTools(String),
    #[error("plans.{field} must be from 1 to {max}")]
    PlanLimit { field: &'static str, max: u64 },
    #[error(transparent)]
    Schema(#[from] tools::SchemaError),
}

/// Its fallbacks, tool choice and reasoning, checked.
fn check_controls(name: &str, spec: &AgentSpec) -> Result<(), CatalogError> {
    let invalid = |message: String| CatalogError::Invalid {
        agent: name.to_owned(),
        message,
    };
    for (i, model) in spec.fallback_models.iter().enumerate() {
        if model.trim().is_empty() || spec.fallback_models[..i].contains(model) {
            return Err(invalid(format!(
                "`fallbackModels[{i}]` must be a model id, once: `{model}`"
            )));
        }
    }
    if spec.fallback_models.len() > 4 {
        return Err(invalid("`fallbackModels` may name at most 4 models".into()));
    }
    use baton_engine::llm::ToolChoice;
    match &spec.tool_choice {
        Some(ToolChoice::Required) if spec.tools.is_empty() => {
            return Err(invalid(
                "`toolChoice` is `required` and the agent has no tools".into(),
            ));
        }
        Some(ToolChoice::Tool { tool })
            if !spec
                .tools
                .iter()
                .any(|t| t == tool || t.starts_with("mcp:")) =>
        {
            return Err(invalid(format!(
                "`toolChoice` names `{tool}`, which is not one of its tools"
            )));
        }
        _ => {}
    }
    if let Some(r) = &spec.reasoning {
        if r.effort.is_none() && r.budget_tokens.is_none() {
            return Err(invalid(
                "`reasoning` needs an `effort` or a `budgetTokens`".into(),
            ));
        }
        if r.budget_tokens.is_some_and(|b| {
            !(baton_engine::llm::MIN_REASONING_BUDGET..=MAX_REASONING_BUDGET).contains(&b)
        }) {
            return Err(invalid(format!(
                "`reasoning.budgetTokens` must be from {} to {MAX_REASONING_BUDGET}",
                baton_engine::llm::MIN_REASONING_BUDGET
            )));
        }
    }
    Ok(())
}

/// The largest thinking budget an agent may give its model.
pub const MAX_REASONING_BUDGET: u32 = 128_000;

/// An agent's actions, checked: each named with letters, digits, `-` and `_`, with a
/// prompt, and schemas of objects.
fn actions(
    agent: &str,
    specs: std::collections::BTreeMap<String, crate::agents_file::ActionSpec>,
) -> Result<std::collections::BTreeMap<String, baton_engine::agent::Action>, CatalogError> {
    let invalid = |message: String| CatalogError::Invalid {
        agent: agent.to_owned(),
        message,
    };
    let mut out = std::collections::BTreeMap::new();
    for (name, spec) in specs {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(invalid(format!(
                "action `{name}`: a name is 1 to 64 letters, digits, `-` or `_`"
            )));
        }
        if spec.prompt.trim().is_empty() {
            return Err(invalid(format!("action `{name}` needs a `prompt`")));
        }
        let schema = |which: &str, s: Option<serde_json::Value>| match s {
            None => Ok(None),
            Some(s) if s.get("type").and_then(serde_json::Value::as_str) == Some("object") => {
                let def: Arc<dyn baton_engine::tools::Offered> = Arc::new(tools::ToolDef::new(
                    &format!("{name}.{which}"),
                    "",
                    s,
                    baton_engine::tools::ToolKind::Exec,
                ));
                Ok(Some(def))
            }
            Some(_) => Err(invalid(format!(
                "action `{name}`: `{which}` must be a JSON schema of `\"type\": \"object\"`"
            ))),
        };
        let input = schema("inputSchema", spec.input_schema)?;
        let output = schema("outputSchema", spec.output_schema)?.map(|o| {
            // The answer's shape, as the providers are asked for it.
            let tool: Arc<dyn baton_engine::tools::Offered> = Arc::new(tools::ToolDef::new(
                baton_engine::llm::OUTPUT_TOOL,
                "Give your final answer: this tool's input is the answer, in the shape asked for.",
                o.spec().parameters.clone(),
                baton_engine::tools::ToolKind::Exec,
            ));
            tool
        });
        out.insert(
            name,
            baton_engine::agent::Action {
                description: spec.description,
                prompt: spec.prompt,
                input,
                output,
            },
        );
    }
    Ok(out)
}

/// An `outputSchema` as the tool Anthropic and Bedrock answer with: a schema that is not an
/// object's is refused (one that does not compile is, where steps run: `Catalog::build`).
fn output_tool(
    name: &str,
    schema: serde_json::Value,
) -> Result<Arc<dyn baton_engine::tools::Offered>, CatalogError> {
    if schema.get("type").and_then(serde_json::Value::as_str) != Some("object") {
        return Err(CatalogError::Invalid {
            agent: name.to_owned(),
            message: "`outputSchema` must be a JSON schema of `\"type\": \"object\"` \
                      (every provider's structured output is an object)"
                .into(),
        });
    }
    Ok(Arc::new(tools::ToolDef::new(
        baton_engine::llm::OUTPUT_TOOL,
        "Give your final answer: this tool's input is the answer, in the shape asked for.",
        schema,
        baton_engine::tools::ToolKind::Exec,
    )))
}

/// An agent of the agents file, checked.
fn agent_def(limits: &Limits, name: String, spec: AgentSpec) -> Result<AgentDef, CatalogError> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(CatalogError::BadName(name));
    }
    if spec.max_iterations == Some(0) {
        return Err(CatalogError::ZeroIterations(name));
    }
    if let Some(reply) = &spec.clarifying_reply
        && (reply.trim().is_empty() || reply.len() > 4000)
    {
        return Err(CatalogError::Invalid {
            agent: name,
            message: "`clarifyingReply` must be 1 to 4000 bytes of text".into(),
        });
    }
    if spec.max_tool_calls_per_turn == Some(0) {
        return Err(CatalogError::ZeroToolCalls(name));
    }
    check_controls(&name, &spec)?;
    if spec.max_wall_seconds == Some(0) {
        return Err(CatalogError::ZeroWall { agent: name });
    }
    if spec.max_output_tokens == Some(0) {
        return Err(CatalogError::Invalid {
            agent: name,
            message: "maxOutputTokens must be at least 1".into(),
        });
    }
    if let Some(usd) = spec.max_cost_usd
        && let Err(message) = crate::budget::check_amount("maxCostUsd", usd)
    {
        return Err(CatalogError::Invalid {
            agent: name,
            message,
        });
    }
    if let Some(bytes) = spec.context_bytes
        && !(MIN_CONTEXT_BYTES..=MAX_CONTEXT_BYTES).contains(&bytes)
    {
        return Err(CatalogError::ContextBudget { agent: name, bytes });
    }
    if let Some(seconds) = spec.cta_expiry_seconds
        && !(1..=MAX_CTA_EXPIRY_SECS).contains(&seconds)
    {
        return Err(CatalogError::BadCtaExpiry {
            agent: name,
            seconds,
        });
    }
    let questions = match spec.questions {
        None => Assignment::default(),
        Some(q) => {
            for (key, seconds) in [
                ("remindAfterSeconds", q.remind_after_seconds),
                ("escalateAfterSeconds", q.escalate_after_seconds),
            ] {
                if seconds.is_some_and(|s| !(1..=MAX_CTA_EXPIRY_SECS).contains(&s)) {
                    return Err(CatalogError::Invalid {
                        agent: name,
                        message: format!(
                            "`questions.{key}` must be from 1 to {MAX_CTA_EXPIRY_SECS} seconds"
                        ),
                    });
                }
            }
            let escalate_to = q.escalate_to.unwrap_or_default();
            if q.escalate_after_seconds.is_some() == escalate_to.is_empty() {
                return Err(CatalogError::Invalid {
                    agent: name,
                    message: "`questions.escalateAfterSeconds` and `questions.escalateTo` go \
                              together"
                        .into(),
                });
            }
            for principal in &escalate_to {
                check_principal(principal).map_err(|message| CatalogError::Invalid {
                    agent: name.clone(),
                    message: format!("`questions.escalateTo`: {message}"),
                })?;
            }
            Assignment {
                assignees: q.assignees,
                required: q.required.unwrap_or(1),
                notify: q.notify.unwrap_or_default(),
                remind_after_seconds: q.remind_after_seconds,
                escalate_after_seconds: q.escalate_after_seconds,
                escalate_to,
            }
        }
    };
    let check = |assignment: &Assignment, what: &str| {
        check_assignment(&assignment.assignees, assignment.required).map_err(|message| {
            CatalogError::Invalid {
                agent: name.clone(),
                message: format!("{what}: {message}"),
            }
        })
    };
    check(&questions, "`questions`")?;
    let mut approval = HashMap::new();
    for (tool, a) in spec.approval {
        let policy = match a {
            ApprovalSpec::Keyword(AlwaysKeyword::Always) => Approval::ALWAYS,
            ApprovalSpec::Rule(rule) => Approval {
                input_matches: match rule.input_matches.as_deref().map(Regex::new) {
                    None => None,
                    Some(Ok(re)) => Some(re),
                    Some(Err(source)) => {
                        return Err(CatalogError::BadRegex {
                            agent: name,
                            tool,
                            source,
                        });
                    }
                },
                assignment: match (rule.assignees, rule.required, rule.notify) {
                    (None, None, None) => None,
                    (assignees, required, notify) => {
                        let own = Assignment {
                            assignees: assignees.unwrap_or_else(|| questions.assignees.clone()),
                            required: required.unwrap_or(questions.required),
                            notify: notify.unwrap_or_else(|| questions.notify.clone()),
                            ..questions.clone()
                        };
                        check(&own, &format!("the approval of `{tool}`"))?;
                        Some(own)
                    }
                },
                reason: rule.reason,
            },
        };
        approval.insert(tool, policy);
    }
    Ok(AgentDef {
        description: spec.description,
        operation: match name.as_str() {
            plan::PLANNER => Operation::Plan,
            plan::PLAN_REVIEWER => Operation::Review,
            _ => Operation::Think,
        },
        system: spec.system.unwrap_or_default(),
        model: spec.model,
        model_by_context: spec.model_by_context,
        model_by_tier: spec.model_by_tier,
        tools: spec.tools,
        approval,
        questions,
        approval_batch: spec.approval_batch.unwrap_or_default(),
        on_unknown_outcome: spec.on_unknown_outcome.unwrap_or_default(),
        max_iterations: spec.max_iterations.unwrap_or(limits.max_iterations),
        max_tool_calls_per_turn: spec
            .max_tool_calls_per_turn
            .unwrap_or(limits.max_tool_calls),
        cta_expiry: spec
            .cta_expiry_seconds
            .map_or(limits.cta_expiry, Duration::from_secs),
        on_expiry: spec.on_expiry,
        max_wall: spec.max_wall_seconds.map(Duration::from_secs),
        max_cost_usd: spec.max_cost_usd,
        max_output_tokens: spec.max_output_tokens,
        context_bytes: spec.context_bytes.unwrap_or(limits.context_bytes),
        context_guidance: spec.context_guidance,
        clarifying_reply: spec
            .clarifying_reply
            .unwrap_or_else(|| baton_engine::agent::DEFAULT_CLARIFYING_REPLY.into()),
        fallback_models: spec.fallback_models,
        plan_requirements: spec.plan_requirements,
        plan_approval: spec.plan_approval,
        actions: actions(&name, spec.actions)?,
        vision: spec.vision,
        tool_choice: spec.tool_choice,
        reasoning: spec.reasoning,
        output: match spec.output_schema {
            None => None,
            Some(schema) => Some(output_tool(&name, schema)?),
        },
        name,
    })
}

#[cfg(test)]
mod tests;
