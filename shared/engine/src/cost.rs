//! What model calls cost: a price table per model, and the totals a run carries.
//!
//! Prices are US dollars per million tokens, from the providers' public list prices; an
//! agents file's `prices` replaces any entry (and adds models the table lacks). A model with
//! no price costs nothing in the totals, and its entries say `cost: null`: unknown, not free.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// US dollars per million tokens. `cachedInput` is what input read from the provider's
/// prompt cache costs instead of `input` (default: `input`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Price {
    pub input: f64,
    pub output: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
}

/// The most a price may be, in US dollars per million tokens: far above any model's list
/// price (the dearest, o1-pro's output, is $600), and low enough that no run's cost can
/// leave what a number holds.
pub const MAX_PRICE_PER_MILLION: f64 = 10_000.0;

/// The least a price above zero may be, in US dollars per million tokens: a token then
/// costs at least 10⁻¹² dollars, a figure DynamoDB's numbers hold (a price of 10⁻²⁰⁰ would
/// make costs it cannot).
pub const MIN_PRICE_PER_MILLION: f64 = 0.000_001;

impl Price {
    /// Checks a price as an agents file gives it: each figure finite, 0 or from
    /// [`MIN_PRICE_PER_MILLION`] to [`MAX_PRICE_PER_MILLION`] (a negative price once made a
    /// run "cost" -$31,000).
    pub fn check(&self, model: &str) -> Result<(), String> {
        let figures = [
            ("input", Some(self.input)),
            ("output", Some(self.output)),
            ("cachedInput", self.cached_input),
        ];
        for (name, usd) in figures {
            if let Some(usd) = usd
                && !(usd == 0.0
                    || (usd.is_finite()
                        && (MIN_PRICE_PER_MILLION..=MAX_PRICE_PER_MILLION).contains(&usd)))
            {
                return Err(format!(
                    "price of `{model}`: `{name}` must be US dollars per million tokens, 0 or \
                     from {MIN_PRICE_PER_MILLION} to {MAX_PRICE_PER_MILLION}, not {usd}"
                ));
            }
        }
        Ok(())
    }

    /// What `usage` costs, in US dollars. `input_tokens` counts cached input too.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let fresh = usage.input_tokens - cached;
        (fresh as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + usage.output_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

/// The built-in table (list prices, per million tokens).
const BUILT_IN: &[(&str, f64, f64, f64)] = &[
    ("openai:gpt-4o-mini", 0.15, 0.60, 0.075),
    ("openai:gpt-4o", 2.50, 10.00, 1.25),
    ("openai:gpt-4.1", 2.00, 8.00, 0.50),
    ("openai:gpt-4.1-mini", 0.40, 1.60, 0.10),
    ("openai:gpt-4.1-nano", 0.10, 0.40, 0.025),
    ("anthropic:claude-sonnet-4-5", 3.00, 15.00, 0.30),
    ("anthropic:claude-haiku-4-5", 1.00, 5.00, 0.10),
    ("anthropic:claude-opus-4-1", 15.00, 75.00, 1.50),
    ("anthropic:claude-3-5-haiku-20241022", 0.80, 4.00, 0.08),
    (
        "bedrock:anthropic.claude-3-5-haiku-20241022-v1:0",
        0.80,
        4.00,
        0.08,
    ),
    (
        "bedrock:anthropic.claude-sonnet-4-5-20250929-v1:0",
        3.00,
        15.00,
        0.30,
    ),
    (
        "bedrock:anthropic.claude-haiku-4-5-20251001-v1:0",
        1.00,
        5.00,
        0.10,
    ),
    ("bedrock:amazon.nova-micro-v1:0", 0.035, 0.14, 0.00875),
    ("bedrock:amazon.nova-lite-v1:0", 0.06, 0.24, 0.015),
    ("bedrock:amazon.nova-pro-v1:0", 0.80, 3.20, 0.20),
];

/// The prefixes of Bedrock's cross-Region inference profiles.
const INFERENCE_GEOS: [&str; 8] = ["us", "eu", "apac", "jp", "au", "ca", "us-gov", "global"];

/// Prices by model, `provider:model-id`.
#[derive(Debug, Clone, PartialEq)]
pub struct Prices(BTreeMap<String, Price>);

impl Default for Prices {
    fn default() -> Self {
        Self(
            BUILT_IN
                .iter()
                .map(|&(m, input, output, cached)| {
                    let price = Price {
                        input,
                        output,
                        cached_input: Some(cached),
                    };
                    (m.to_owned(), price)
                })
                .collect(),
        )
    }
}

impl Prices {
    /// The built-in table with `overrides` replacing or adding entries.
    pub fn with(overrides: &BTreeMap<String, Price>) -> Self {
        let mut prices = Self::default();
        for (model, price) in overrides {
            prices.0.insert(qualified(model), *price);
        }
        prices
    }

    /// The price of `model` (`provider:id`, or a bare id: the OpenAI-compatible endpoint's).
    /// A Bedrock inference profile (`us.`, `eu.`, `apac.`, `global.`… before the model id)
    /// is priced as its foundation model unless it has a price of its own.
    pub fn get(&self, model: &str) -> Option<&Price> {
        let q = qualified(model);
        self.0.get(&q).or_else(|| {
            let (provider, id) = split_model(&q);
            let (geo, base) = id.split_once('.')?;
            let profile = provider == "bedrock" && INFERENCE_GEOS.contains(&geo);
            profile
                .then(|| self.0.get(&format!("bedrock:{base}")))
                .flatten()
        })
    }

    /// What a call to `model` that used `usage` cost, if the model has a price.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        self.get(model).map(|p| p.cost(usage))
    }
}

/// The providers a model id may name.
pub const PROVIDERS: [&str; 3] = ["openai", "anthropic", "bedrock"];

/// Splits `provider:model-id`; an id without a known provider prefix is the
/// OpenAI-compatible endpoint's (`llama3:8b` stays whole).
pub fn split_model(model: &str) -> (&str, &str) {
    match model.split_once(':') {
        Some((p, id)) if PROVIDERS.contains(&p) => (p, id),
        _ => ("openai", model),
    }
}

fn qualified(model: &str) -> String {
    let (provider, id) = split_model(model);
    format!("{provider}:{id}")
}

pub use crate::llm::Usage;

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Self) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.total_tokens += other.total_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}

/// Tokens and dollars: what a run spent, or what its subagents did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Spent {
    pub usage: Usage,
    pub cost_usd: f64,
}

impl Spent {
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

impl std::ops::AddAssign for Spent {
    fn add_assign(&mut self, other: Self) {
        self.usage += other.usage;
        self.cost_usd += other.cost_usd;
    }
}

impl std::ops::Sub for Spent {
    type Output = Spent;
    fn sub(self, other: Self) -> Spent {
        let (a, b) = (self.usage, other.usage);
        Spent {
            usage: Usage {
                input_tokens: a.input_tokens.saturating_sub(b.input_tokens),
                output_tokens: a.output_tokens.saturating_sub(b.output_tokens),
                total_tokens: a.total_tokens.saturating_sub(b.total_tokens),
                cached_input_tokens: a.cached_input_tokens.saturating_sub(b.cached_input_tokens),
                reasoning_tokens: a.reasoning_tokens.saturating_sub(b.reasoning_tokens),
            },
            cost_usd: (self.cost_usd - other.cost_usd).max(0.0),
        }
    }
}

/// What model calls of one kind cost, in a run and the subagents under it: one line per
/// operation, model, context type and plan execution mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CostLine {
    pub operation: crate::timeline::Operation,
    /// `provider:model-id`, when the provider said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The `type` of the context the run worked on (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_type: Option<String>,
    /// The plan's mode, for the calls a plan's planner, reviewer and steps made (absent:
    /// outside plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_mode: Option<crate::plan::ExecutionMode>,
    pub calls: u64,
    pub usage: Usage,
    /// US dollars (models without a price count 0).
    pub cost_usd: f64,
}

/// A breakdown keeps at most this many lines; past it, new kinds of call are summed in a
/// line whose context type is [`OTHER_CONTEXT`].
pub const MAX_COST_LINES: usize = 64;
pub const OTHER_CONTEXT: &str = "(other)";

impl CostLine {
    fn same_kind(&self, other: &CostLine) -> bool {
        self.operation == other.operation
            && self.model == other.model
            && self.context_type == other.context_type
            && self.execution_mode == other.execution_mode
    }
}

/// Adds `line` to the breakdown `lines` (to the line of its kind, if there is one).
pub fn add_line(lines: &mut Vec<CostLine>, mut line: CostLine) {
    if !lines.iter().any(|l| l.same_kind(&line)) && lines.len() >= MAX_COST_LINES {
        line.context_type = Some(OTHER_CONTEXT.into());
    }
    match lines.iter_mut().find(|l| l.same_kind(&line)) {
        Some(l) => {
            l.calls += line.calls;
            l.usage += line.usage;
            l.cost_usd += line.cost_usd;
        }
        None => lines.push(line),
    }
}

/// What `now` adds to `before` (a breakdown is only ever added to): the lines to report.
pub fn lines_since(now: &[CostLine], before: &[CostLine]) -> Vec<CostLine> {
    now.iter()
        .filter_map(|l| {
            let Some(b) = before.iter().find(|b| b.same_kind(l)) else {
                return Some(l.clone());
            };
            let was = Spent {
                usage: b.usage,
                cost_usd: b.cost_usd,
            };
            let spent = Spent {
                usage: l.usage,
                cost_usd: l.cost_usd,
            } - was;
            let calls = l.calls.saturating_sub(b.calls);
            (calls > 0 || !spent.is_zero()).then(|| CostLine {
                calls,
                usage: spent.usage,
                cost_usd: spent.cost_usd,
                ..l.clone()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_costs_its_tokens_at_the_models_price() {
        let prices = Prices::default();
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            total_tokens: 1_500_000,
            cached_input_tokens: 400_000,
            reasoning_tokens: 0,
        };
        // 600k fresh × 0.15 + 400k cached × 0.075 + 500k × 0.60, per million.
        let cost = prices.cost("gpt-4o-mini", &usage).expect("priced");
        assert!((cost - (0.09 + 0.03 + 0.30)).abs() < 1e-9, "{cost}");
        assert_eq!(
            prices.cost("openai:gpt-4o-mini", &usage),
            Some(cost),
            "a bare id is the OpenAI-compatible endpoint's"
        );
        assert_eq!(prices.cost("local-llama", &usage), None);
        let over = Prices::with(&BTreeMap::from([(
            "local-llama".to_owned(),
            Price {
                input: 1.0,
                output: 2.0,
                cached_input: None,
            },
        )]));
        assert_eq!(over.cost("openai:local-llama", &usage), Some(1.0 + 1.0));
    }

    fn line(model: &str, context: &str, tokens: u64, cost_usd: f64) -> CostLine {
        CostLine {
            operation: crate::timeline::Operation::Think,
            model: Some(model.into()),
            context_type: Some(context.into()),
            execution_mode: None,
            calls: 1,
            usage: Usage {
                input_tokens: tokens,
                output_tokens: 0,
                total_tokens: tokens,
                cached_input_tokens: 0,
                reasoning_tokens: 0,
            },
            cost_usd,
        }
    }

    #[test]
    fn a_breakdown_sums_calls_of_a_kind_and_reports_what_was_added_since() {
        let mut lines = vec![];
        add_line(&mut lines, line("m", "ticket", 10, 1.0));
        add_line(&mut lines, line("m", "ticket", 5, 0.5));
        add_line(&mut lines, line("m", "doc", 7, 0.25));
        assert_eq!(lines.len(), 2);
        assert_eq!((lines[0].calls, lines[0].usage.input_tokens), (2, 15));
        let reported = lines.clone();
        add_line(&mut lines, line("m", "doc", 3, 0.25));
        let since = lines_since(&lines, &reported);
        assert_eq!(since.len(), 1, "only the line that grew: {since:?}");
        assert_eq!((since[0].calls, since[0].usage.input_tokens), (1, 3));
        assert!((since[0].cost_usd - 0.25).abs() < 1e-12);
        for i in 0..(MAX_COST_LINES + 5) {
            add_line(&mut lines, line("m", &format!("t{i}"), 1, 0.0));
        }
        assert_eq!(
            lines.len(),
            MAX_COST_LINES + 1,
            "kinds past the cap share a line"
        );
        let other = lines.last().expect("a line");
        assert_eq!(other.context_type.as_deref(), Some(OTHER_CONTEXT));
        assert_eq!(other.calls, 7);
    }

    #[test]
    fn an_inference_profile_is_priced_as_its_foundation_model() {
        let p = Prices::default();
        let base = p.get("bedrock:anthropic.claude-haiku-4-5-20251001-v1:0");
        assert!(base.is_some());
        for geo in ["us", "eu", "global"] {
            let id = format!("bedrock:{geo}.anthropic.claude-haiku-4-5-20251001-v1:0");
            assert_eq!(p.get(&id), base, "{id}");
        }
        // Not a profile: no price taken from elsewhere.
        assert_eq!(
            p.get("bedrock:xx.anthropic.claude-haiku-4-5-20251001-v1:0"),
            None
        );
        assert_eq!(
            p.get("openai:us.anthropic.claude-haiku-4-5-20251001-v1:0"),
            None
        );
    }

    #[test]
    fn model_ids_split_on_known_providers_only() {
        assert_eq!(
            split_model("bedrock:anthropic.claude-3-5-haiku-20241022-v1:0"),
            ("bedrock", "anthropic.claude-3-5-haiku-20241022-v1:0")
        );
        assert_eq!(split_model("llama3:8b"), ("openai", "llama3:8b"));
        assert_eq!(split_model("gpt-4o"), ("openai", "gpt-4o"));
        assert_eq!(split_model("anthropic:claude-sonnet-4-5").0, "anthropic");
    }
}
