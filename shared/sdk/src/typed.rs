//! Tools whose input and output are Rust types: [`TypedTool`], offered as a [`Tool`] by
//! [`Typed`].

use std::future::Future;
use std::time::Duration;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Effects, Tool, ToolContext, ToolError};

/// A tool whose input is a Rust type the model's arguments are read into, and whose output
/// is one it answers with. What the model is shown of its input is the JSON Schema derived
/// from [`TypedTool::Input`] (`#[derive(JsonSchema)]`; its doc comments are the fields'
/// descriptions), and the catalog checks every call's arguments against it before the tool
/// runs: [`TypedTool::call`] is handed a value that parsed.
///
/// An `Err` from `call` is an error result the model sees, and the run goes on. Give it to
/// the deployment as any tool: `Extensions::new().tool(Typed(MyTool))`.
///
/// ```
/// use baton_sdk::prelude::*;
///
/// /// Converts an amount between two currencies at a fixed rate.
/// struct Convert;
///
/// #[derive(Deserialize, JsonSchema)]
/// #[serde(deny_unknown_fields)]
/// struct Amount {
///     /// How much, in `from`.
///     value: f64,
///     /// An ISO 4217 code: EUR or USD.
///     from: String,
/// }
///
/// #[derive(Serialize)]
/// struct Converted {
///     value: f64,
///     currency: &'static str,
/// }
///
/// impl TypedTool for Convert {
///     type Input = Amount;
///     type Output = Converted;
///     fn name(&self) -> &str {
///         "convert"
///     }
///     fn description(&self) -> &str {
///         "Converts an amount between euros and dollars."
///     }
///     fn effects(&self) -> Effects {
///         Effects::None
///     }
///     /// Large sums are a person's to convert.
///     fn needs_approval(&self, input: &Amount) -> bool {
///         input.value > 10_000.0
///     }
///     async fn call(&self, _: &ToolContext, input: Amount) -> Result<Converted, ToolError> {
///         match input.from.as_str() {
///             "EUR" => Ok(Converted { value: input.value * 1.25, currency: "USD" }),
///             "USD" => Ok(Converted { value: input.value * 0.8, currency: "EUR" }),
///             // The model sees it, and may ask again in another currency.
///             other => Err(format!("no rate from {other}").into()),
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let tool = Typed(Convert);
/// // What the model is shown: the schema derived from `Amount`.
/// let schema = tool.schema();
/// assert_eq!(schema["required"], json!(["value", "from"]));
/// assert_eq!(schema["properties"]["from"]["description"], "An ISO 4217 code: EUR or USD.");
/// // A call, as a step makes it.
/// let ctx = ToolContext::builder("run_1").agent("banker").call_id("call_1").build();
/// let out = tool.execute(&ctx, json!({"value": 8.0, "from": "EUR"})).await;
/// assert_eq!(out, Ok(json!({"value": 10.0, "currency": "USD"})));
/// // The model is told what went wrong, in the tool's words or the input's.
/// let refused = tool.execute(&ctx, json!({"value": 1.0, "from": "GBP"})).await;
/// assert_eq!(refused, Err(ToolError::model("no rate from GBP")));
/// assert!(tool.needs_approval(&json!({"value": 20000.0, "from": "USD"})));
/// # }
/// ```
pub trait TypedTool: Send + Sync + 'static {
    /// The call's arguments, as the model gives them.
    type Input: DeserializeOwned + JsonSchema + Send;
    /// What the call answers: its JSON is the result the model reads.
    type Output: Serialize + Send;

    /// The name the model calls it by, and agents list it under.
    fn name(&self) -> &str;

    /// What the model is told it does.
    fn description(&self) -> &str;

    /// How a call may touch the world ([`Tool::effects`]); `Once` unless said otherwise.
    fn effects(&self) -> Effects {
        Effects::Once
    }

    /// Whether this call needs a human's approval first ([`Tool::needs_approval`]).
    fn needs_approval(&self, _input: &Self::Input) -> bool {
        false
    }

    /// Why this call needs approval, for the human.
    fn approval_reason(&self, _input: &Self::Input) -> Option<String> {
        None
    }

    /// How long one call may take ([`Tool::timeout`]).
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Runs the tool. An `Err` is an error result the model sees ([`ToolError::Model`]; a
    /// `String` converts to one), or a transient failure the step is tried again for
    /// ([`ToolError::Retry`]).
    fn call(
        &self,
        ctx: &ToolContext,
        input: Self::Input,
    ) -> impl Future<Output = Result<Self::Output, ToolError>> + Send;
}

/// A [`TypedTool`] as a [`Tool`], the form a deployment's [`crate::Extensions`] take.
pub struct Typed<T>(pub T);

impl<T: TypedTool> Typed<T> {
    fn input(&self, input: &Value) -> Result<T::Input, String> {
        T::Input::deserialize(input)
            .map_err(|e| format!("invalid arguments for `{}`: {e}", self.0.name()))
    }
}

#[async_trait::async_trait]
impl<T: TypedTool> Tool for Typed<T> {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn description(&self) -> &str {
        self.0.description()
    }

    /// [`TypedTool::Input`]'s schema, without the keys a model's tool list does not take
    /// (`$schema`, `title`).
    fn schema(&self) -> Value {
        let mut schema = schemars::schema_for!(T::Input).to_value();
        if let Some(o) = schema.as_object_mut() {
            o.remove("$schema");
            o.remove("title");
        }
        schema
    }

    /// An input that does not parse needs none: it is refused before any approval.
    fn needs_approval(&self, input: &Value) -> bool {
        self.input(input).is_ok_and(|i| self.0.needs_approval(&i))
    }

    fn approval_reason(&self, input: &Value) -> Option<String> {
        self.0.approval_reason(&self.input(input).ok()?)
    }

    fn timeout(&self) -> Option<Duration> {
        self.0.timeout()
    }

    fn effects(&self) -> Effects {
        self.0.effects()
    }

    async fn execute(&self, ctx: &ToolContext, input: Value) -> Result<Value, ToolError> {
        let output = self.0.call(ctx, self.input(&input)?).await?;
        serde_json::to_value(output)
            .map_err(|e| format!("`{}` answered what is not JSON: {e}", self.0.name()).into())
    }
}
