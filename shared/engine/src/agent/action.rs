//! An agent's named actions (seed 002's `ActionID`).

use std::sync::Arc;

use serde_json::Value;

use crate::tools::Offered;

/// A named action of an agent (seed 002's `ActionID`): its own prompt, the input it takes
/// and the output it gives, each a JSON schema its host compiled.
#[derive(Clone)]
pub struct Action {
    pub description: Option<String>,
    /// Given to the child run before the input.
    pub prompt: String,
    /// What its input must be: checked before a child run starts.
    pub input: Option<Arc<dyn Offered>>,
    /// What its output must be: the child run's final answer is checked against it, and
    /// asked again, before its parent binds it.
    pub output: Option<Arc<dyn Offered>>,
}

impl Action {
    /// The child run's first message: the action's prompt, the call's words if any, and
    /// the input as JSON.
    pub fn prompt_for(&self, words: Option<&str>, input: Option<&Value>) -> String {
        let mut text = self.prompt.clone();
        if let Some(w) = words.filter(|w| !w.trim().is_empty()) {
            text.push_str("\n\n");
            text.push_str(w);
        }
        if let Some(input) = input {
            text.push_str("\n\nInput:\n");
            text.push_str(&serde_json::to_string_pretty(input).unwrap_or_default());
        }
        text
    }

    /// Checks `input` (none: `{}`) against the input schema: the violations, said.
    pub fn check_input(&self, name: &str, input: Option<&Value>) -> Result<(), String> {
        let Some(schema) = &self.input else {
            return Ok(());
        };
        let empty = Value::Object(Default::default());
        schema
            .validate(input.unwrap_or(&empty))
            .map_err(|e| format!("the input of action `{name}` does not match its schema: {e}"))
    }
}
