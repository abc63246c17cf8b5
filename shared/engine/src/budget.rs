//! Budgets: what a run tree (a top-level run with its subagents and plan steps) may spend
//! before a human is asked whether it may spend more.
//!
//! A budgeted run carries [`Budget`] (its tree's first budget, also each question's step);
//! the tree's [`Ledger`] (the budget with every raise, and what every run of the tree has
//! spent) is kept by the store beside the top-level run, added to in each commit of the
//! tree: a child's spending counts at once. A step reads it before it thinks; the engine
//! asks the owner ([`BudgetAsk`], on an approval CTA) instead of calling the model when the
//! tree has spent its budget.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A run tree's budget, on each of its runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// What the tree may spend before its owner is first asked, in US dollars; each
    /// question asks for this much more unless its answer says otherwise.
    pub budget_usd: f64,
}

/// What a run tree may spend and has spent, as its store keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Ledger {
    /// The budget with every raise.
    pub budget_usd: f64,
    /// What the tree's runs' own model calls cost so far.
    pub spent_usd: f64,
    /// Each raise a human approved, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raises: Vec<Raise>,
}

impl Ledger {
    /// A tree's ledger at its creation.
    pub fn new(budget: Budget) -> Self {
        Self {
            budget_usd: budget.budget_usd,
            spent_usd: 0.0,
            raises: Vec::new(),
        }
    }

    /// Whether the tree's next model call must wait for a human.
    pub fn exhausted(&self) -> bool {
        self.spent_usd >= self.budget_usd
    }
}

/// A raise of a tree's budget: approved by a human, committed with the step that took the
/// answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Raise {
    pub by_usd: f64,
    /// The run that asked, and its question.
    pub run_id: String,
    pub cta_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responder: Option<String>,
    pub at: DateTime<Utc>,
}

/// What a budget question tells its human (on the CTA, its timeline entry and the bus).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BudgetAsk {
    pub spent_usd: f64,
    pub budget_usd: f64,
    /// What approving adds beyond what the tree has spent by then, unless the answer
    /// carries its own `raiseUsd`.
    pub ask_usd: f64,
}

/// The code a run ends `failed` with when its budget question is rejected or expires.
pub const EXHAUSTED: &str = "budget_exhausted";

/// The name of a budget question's timeline entry (a `tool` entry the model never sees).
pub const ENTRY: &str = "baton_budget";

/// The largest amount of money Baton takes anywhere it enters — a run's `budgetUsd`, an
/// agent's `maxCostUsd`, an answer's `raiseUsd`, a daily quota — and the most a tree's
/// budget may reach with its raises: one million US dollars. A figure past it is a mistake
/// or an attack (two raises of 1.7e308 once made a tree's budget infinite, which JSON cannot
/// carry).
pub const MAX_USD: f64 = 1_000_000.0;

/// The smallest amount above zero Baton takes where money enters: a millionth of a US
/// dollar. With prices of 0 or at least [`crate::cost::MIN_PRICE_PER_MILLION`], every cost
/// and every sum is 0 or at least 10⁻¹², far inside what DynamoDB's numbers hold (from
/// 10⁻¹³⁰, 38 digits), as [`MAX_USD`] keeps them far below its largest.
pub const MIN_USD: f64 = 0.000_001;

/// Checks a budget as a caller gives it (a run's `budgetUsd`, an agent's `maxCostUsd`, an
/// answer's `raiseUsd`): a finite amount from [`MIN_USD`] to [`MAX_USD`].
pub fn check_amount(what: &str, usd: f64) -> Result<(), String> {
    if usd.is_finite() && (MIN_USD..=MAX_USD).contains(&usd) {
        Ok(())
    } else {
        Err(format!(
            "`{what}` must be an amount in US dollars from {MIN_USD} to {MAX_USD}, not {usd}"
        ))
    }
}
