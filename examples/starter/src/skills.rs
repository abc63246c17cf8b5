//! Skills: progressive disclosure of an agent's tools. An agent given the [`Skills`] plugin
//! starts with one tool, `activate_skill`, and a list of the skills it may turn on; once it
//! activates one, the plugin adds that skill's instructions and tools to every later
//! iteration of the run.
//!
//! The plugin's typed state ([`SkillState`]: the active skills, and how far it has read the
//! timeline) is the run's, committed with the step that thought. The tool reads it through
//! its context (`ctx.plugin_state`) to answer "already active" or name the skills there are;
//! the plugin, asked before the next think, reads the activations since it last looked and
//! turns them on. State changes only there, so a step tried again changes nothing twice.

use std::collections::BTreeSet;
use std::sync::Arc;

use baton_sdk::{
    Effects, Entry, EntryBody, Plugin, PluginError, Prepared, RunView, Tool, ToolContext,
    ToolError, ToolResult, Value, async_trait, json,
};
use serde::{Deserialize, Serialize};

/// The plugin's name, under which its state is kept on the run (`pluginState.skills`).
pub const NAME: &str = "skills";

/// The tool the model turns a skill on with.
pub const ACTIVATE: &str = "activate_skill";

/// One skill: what the agent is told once it is active, and the tools it then may call
/// (catalog tools: Rust or HTTP tools, or tools of MCP servers the agent already uses).
#[derive(Debug, Clone)]
pub struct Skill {
    pub name: String,
    /// One line: what the skill is for (shown before it is active).
    pub summary: String,
    /// Added to the system prompt while it is active.
    pub instructions: String,
    pub tools: Vec<String>,
}

/// The skills of a deployment.
#[derive(Debug, Clone)]
pub struct Skills(Arc<Vec<Skill>>);

impl Skills {
    pub fn new(skills: Vec<Skill>) -> Self {
        Self(Arc::new(skills))
    }

    fn get(&self, name: &str) -> Option<&Skill> {
        self.0.iter().find(|s| s.name == name)
    }

    fn names(&self) -> Vec<&str> {
        self.0.iter().map(|s| s.name.as_str()).collect()
    }

    /// The tool that turns them on (give it to the catalog beside the plugin).
    pub fn activate_tool(&self) -> ActivateSkill {
        ActivateSkill(self.clone())
    }
}

/// The run's skills, as the plugin keeps them.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillState {
    /// The skills turned on, in the order they were.
    pub active: Vec<String>,
    /// The timeline's next entry the plugin has not read yet.
    pub read_to: u64,
}

#[async_trait]
impl Plugin for Skills {
    type State = SkillState;

    fn name(&self) -> &str {
        NAME
    }

    async fn prepare(
        &self,
        _run: RunView<'_>,
        timeline: &[Entry],
        state: &mut SkillState,
    ) -> Result<Prepared, PluginError> {
        // The activations recorded since the last look: a successful `activate_skill` call.
        // It stops at one still pending (an approval, or a call the step runs after this
        // think): read again next time, once it has its result.
        let from = state.read_to;
        for entry in timeline.iter().filter(|e| e.seq >= from) {
            match activated(entry) {
                Activation::Pending => break,
                Activation::Of(name)
                    if self.get(&name).is_some() && !state.active.contains(&name) =>
                {
                    state.active.push(name);
                }
                _ => {}
            }
            state.read_to = entry.seq + 1;
        }
        let mut tools = vec![ACTIVATE.to_owned()];
        let mut context = Vec::new();
        let mut seen = BTreeSet::new();
        for skill in state.active.iter().filter_map(|n| self.get(n)) {
            context.push(format!(
                "Skill `{}` is active. {}",
                skill.name, skill.instructions
            ));
            tools.extend(
                skill
                    .tools
                    .iter()
                    .filter(|t| seen.insert(t.as_str()))
                    .cloned(),
            );
        }
        let idle: Vec<String> = self
            .0
            .iter()
            .filter(|s| !state.active.contains(&s.name))
            .map(|s| format!("`{}` ({})", s.name, s.summary))
            .collect();
        if !idle.is_empty() {
            context.push(format!(
                "Skills you may turn on with `{ACTIVATE}`: {}.",
                idle.join(", ")
            ));
        }
        Ok(tools
            .into_iter()
            .fold(Prepared::new(), Prepared::tool)
            .context(context.join("\n")))
    }
}

/// What a timeline entry says of an activation.
enum Activation {
    /// An `activate_skill` call that has no result yet.
    Pending,
    /// A successful one, of this skill.
    Of(String),
    /// Anything else.
    None,
}

fn activated(entry: &Entry) -> Activation {
    match &entry.body {
        EntryBody::Tool(call) if call.name == ACTIVATE => match &call.result {
            ToolResult::Pending { .. } => Activation::Pending,
            ToolResult::Success { output } => match output["activated"].as_str() {
                Some(name) => Activation::Of(name.to_owned()),
                None => Activation::None,
            },
            ToolResult::Error { .. } => Activation::None,
        },
        _ => Activation::None,
    }
}

/// `activate_skill`: turns one of the deployment's skills on for the rest of the run.
pub struct ActivateSkill(Skills);

#[async_trait]
impl Tool for ActivateSkill {
    fn name(&self) -> &str {
        ACTIVATE
    }

    fn description(&self) -> &str {
        "Turn a skill on: its instructions and tools are yours from your next step on."
    }

    fn effects(&self) -> Effects {
        Effects::None
    }

    fn schema(&self) -> Value {
        json!({"type": "object", "properties": {"name": {"type": "string"}},
               "required": ["name"], "additionalProperties": false})
    }

    async fn execute(&self, ctx: &ToolContext, input: Value) -> Result<Value, ToolError> {
        let name = input["name"].as_str().ok_or("`name` is a string")?;
        let Some(skill) = self.0.get(name) else {
            return Err(format!(
                "there is no skill `{name}`; there are: {}",
                self.0.names().join(", ")
            )
            .into());
        };
        // What the plugin has turned on so far, as this step's plugins left it.
        let state: SkillState = ctx.plugin_state(NAME)?;
        if state.active.iter().any(|a| a == name) {
            return Ok(json!({"already": name, "tools": skill.tools}));
        }
        Ok(json!({"activated": name, "tools": skill.tools}))
    }
}
