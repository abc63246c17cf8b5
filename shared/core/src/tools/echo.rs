//! `echo`: returns its text. The benchmark's and the tests' tool.

use serde_json::{Value, json};

use super::{Effects, Tool, ToolContext, ToolError};

pub struct Echo;

#[async_trait::async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Returns `text` unchanged."
    }
    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": false
        })
    }
    fn effects(&self) -> Effects {
        Effects::None
    }
    async fn execute(&self, _: &ToolContext, input: Value) -> Result<Value, ToolError> {
        match input.get("text") {
            Some(Value::String(s)) => Ok(Value::String(s.clone())),
            _ => Err("`text` must be a string".into()),
        }
    }
}
