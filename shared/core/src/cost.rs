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

impl Price {
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
    pub fn get(&self, model: &str) -> Option<&Price> {
        self.0.get(&qualified(model))
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

/// Token usage, per model call and summed per run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Every input token, read from the provider's prompt cache or not.
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    /// The part of `input_tokens` read from the prompt cache (billed at a lower price).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Self) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.total_tokens += other.total_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
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
        Spent {
            usage: Usage {
                input_tokens: self
                    .usage
                    .input_tokens
                    .saturating_sub(other.usage.input_tokens),
                output_tokens: self
                    .usage
                    .output_tokens
                    .saturating_sub(other.usage.output_tokens),
                total_tokens: self
                    .usage
                    .total_tokens
                    .saturating_sub(other.usage.total_tokens),
                cached_input_tokens: self
                    .usage
                    .cached_input_tokens
                    .saturating_sub(other.usage.cached_input_tokens),
            },
            cost_usd: (self.cost_usd - other.cost_usd).max(0.0),
        }
    }
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
