//! What a question is for, as the engine raises it: the one type every part that asks a human
//! (a tool call's approval, `request_human_feedback`, a budget's raise, a plan's review)
//! hands to [`Work::raise_cta`](super::Work::raise_cta), so that none of them needs the
//! others: `cta.rs` raises and resolves it, and sends each answer back to the part that asked.

use std::time::Duration;

use crate::cta::{CtaRequest, CtaResponse, Gated};

/// A question to raise ([`super::Work::raise_cta`]).
pub(super) struct Ask {
    pub request: CtaRequest,
    /// The answer it takes at expiry under `onExpiry: "default"`.
    pub default: Option<CtaResponse>,
    /// What the human is shown they gate.
    pub gated: Option<Gated>,
    /// The answer runs the call itself (a tool call's approval), so that the reply's other
    /// calls wait for it.
    pub gate: bool,
    pub expiry: Duration,
    /// A budget question's figures ([`crate::budget`]).
    pub budget: Option<crate::budget::BudgetAsk>,
}

impl Ask {
    /// A tool call's approval: the answer runs (or refuses) the call.
    pub fn gate(request: CtaRequest, gated: Gated, expiry: Duration) -> Self {
        Self {
            request,
            default: None,
            gated: Some(gated),
            gate: true,
            expiry,
            budget: None,
        }
    }
}
