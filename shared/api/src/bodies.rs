//! The bodies the API reads and writes, each the type a handler really parses or serializes;
//! the OpenAPI document's schemas are generated from these.

use baton_core::cost::Spent;
use baton_core::cta::{Cta, CtaRequest, CtaResponse, CtaStatus, Gated};
use baton_core::run::{ExpiryPolicy, ParentLink, Run, RunError, RunStatus, Usage};
use baton_core::timeline::{Entry, Tier};
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct CreateRunBody {
    pub(crate) prompt: String,
    /// 1 to 64 letters, digits, `-` and `_`.
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))]
    pub(crate) sandbox_id: Option<String>,
    /// The repository the run works on, `{repo: "owner/name", ref?}`: its subagents inherit
    /// it, its tools read it (`${run.githubRepo}`, `${run.githubRef}`).
    #[serde(default)]
    pub(crate) github: Option<baton_core::scope::GithubRepo>,
    #[serde(default)]
    pub(crate) agent: Option<String>,
    #[serde(default)]
    pub(crate) metadata: Option<Value>,
    /// An object with a string `type`, at most 16 KB.
    #[serde(default)]
    pub(crate) context: Option<Value>,
    #[serde(default)]
    pub(crate) on_expiry: Option<ExpiryPolicy>,
    /// What the run may spend with its subagents and plan steps, in US dollars, before its
    /// owner is asked whether it may spend more; from 0.000001, at most its agent's
    /// `maxCostUsd` (which applies when this is absent).
    #[serde(default)]
    #[schemars(extend("minimum" = 0.000_001, "maximum" = 1_000_000))]
    pub(crate) budget_usd: Option<f64>,
    /// You will watch the run (`POST /runs/{runId}/watch`, or its stream): it counts as
    /// watched from its creation, so that its first reply streams to you.
    #[serde(default)]
    pub(crate) watch: Option<bool>,
    /// The model tier of its first turn (the agent's `modelByTier` says which model).
    #[serde(default)]
    pub(crate) tier: Option<Tier>,
    /// False: the prompt is kept (the model sees it) but left out of a conversation view.
    #[serde(default)]
    pub(crate) visible: Option<bool>,
}

/// A follow-up turn: a person's `text`, or a `trigger` that asks the agent to go on without
/// one (exactly one of them).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessageBody {
    #[serde(default)]
    pub(crate) text: Option<String>,
    #[serde(default)]
    pub(crate) trigger: Option<TriggerBody>,
    #[serde(default)]
    pub(crate) tier: Option<Tier>,
    #[serde(default)]
    pub(crate) visible: Option<bool>,
    /// You will watch the turn: its reply streams to you from its first piece.
    #[serde(default)]
    pub(crate) watch: Option<bool>,
}

impl MessageBody {
    pub(crate) fn follow_up(self) -> baton_core::service::FollowUp {
        baton_core::service::FollowUp {
            text: self.text,
            trigger: self.trigger.map(|t| baton_core::service::Trigger {
                name: t.name,
                data: t.data,
            }),
            tier: self.tier,
            visible: self.visible.unwrap_or(true),
            watch: self.watch.unwrap_or(false),
        }
    }
}

/// What started a turn no one wrote: `name` (1 to 64 of letters, digits, `._:/-`) and
/// `data` for the model (at most 16 KB as JSON).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TriggerBody {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) data: Option<Value>,
}

/// `POST /runs/{id}/fork`: the entry the fork starts at, and what takes its place: a `user`
/// turn's new `text`, or a question's `response` (none: the same text, or the answer given).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ForkBody {
    #[serde(deserialize_with = "whole_number")]
    pub(crate) at_seq: u64,
    #[serde(default)]
    pub(crate) replacement: Option<ReplacementBody>,
}

/// A non-negative integer as JSON Schema counts one: `3` or `3.0` alike, of any size (one
/// past `u64` is past every run's end, as `u64::MAX` is).
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    n.as_u64()
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                // `as` saturates: 1e23 is u64::MAX.
                .map(|f| f as u64)
        })
        .ok_or_else(|| serde::de::Error::custom(format!("`{n}` is not a non-negative integer")))
}

/// A user turn's new `text`, or a question's `response` (exactly one of them).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplacementBody {
    #[serde(default)]
    pub(crate) text: Option<String>,
    #[serde(default)]
    pub(crate) response: Option<CtaResponse>,
}

/// `202` to `POST /runs/{id}/fork`: the new run.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ForkAccepted {
    pub(crate) run_id: String,
    pub(crate) status: RunStatus,
    pub(crate) forked_from: baton_core::fork::ForkedFrom,
}

/// `202` to `POST /runs`.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunAccepted {
    pub(crate) run_id: String,
    pub(crate) status: RunStatus,
}

/// `202` to a follow-up message or a cancel.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RequestAccepted {
    pub(crate) run_id: String,
    pub(crate) status: RunStatus,
    pub(crate) accepted: bool,
    /// A follow-up only: it waits for the turn under way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) queued: Option<bool>,
    pub(crate) message: String,
}

/// `GET /runs/{runId}`: the run, what it and its subagents spent, and its first entries.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunPage<'a> {
    #[serde(flatten)]
    pub(crate) run: Run,
    /// Its result as JSON, when its agent declares an `outputSchema` (the result matched
    /// it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) output: Option<serde_json::Value>,
    pub(crate) total: Spent,
    /// Its tree's budget, when it has one: what the tree (its top-level run, every
    /// subagent and plan step) may spend and has spent, and each raise its owner approved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) budget: Option<BudgetBody>,
    /// Why its tree's budget is not shown: the stored ledger does not read back (the run
    /// and its timeline are shown all the same).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) budget_error: Option<String>,
    pub(crate) timeline: &'a [Entry],
    /// The cursor to page on with `/timeline?after=`, when there is more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) timeline_next: Option<u64>,
}

/// `GET /runs`: a page of the caller's top-level runs, newest first, and the cursor of the
/// next page when more follow. At most 100 runs, each a few KB (a prompt preview, metadata
/// of at most 4 KB): far under Lambda's 6 MB reply (and the service stops a page at 4 MB).
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunList {
    pub(crate) runs: Vec<RunSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) next_cursor: Option<String>,
}

/// `GET /usage`: an owner's figures against its quotas (each present while its quota is set).
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UsageBody {
    pub(crate) owner: String,
    /// Top-level runs not yet ended, and how many may be (`BATON_MAX_ACTIVE_RUNS_PER_OWNER`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) active_runs: Option<Figure<u64>>,
    /// What its runs' model calls cost today (UTC), and what they may
    /// (`BATON_MAX_DAILY_COST_USD_PER_OWNER`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) daily_cost_usd: Option<Figure<f64>>,
    /// The UTC day `dailyCostUsd` is of.
    pub(crate) day: chrono::NaiveDate,
}

/// A figure against its limit.
#[derive(JsonSchema, Serialize)]
pub(crate) struct Figure<T> {
    pub(crate) current: T,
    pub(crate) limit: T,
}

impl UsageBody {
    pub(crate) fn new(owner: String, u: baton_core::service::Usage) -> Self {
        Self {
            owner,
            active_runs: u
                .quotas
                .active_runs
                .zip(u.active_runs)
                .map(|(limit, current)| Figure {
                    current,
                    limit: limit.into(),
                }),
            daily_cost_usd: u
                .quotas
                .daily_cost_usd
                .zip(u.spent_usd)
                .map(|(limit, current)| Figure { current, limit }),
            day: u.day,
        }
    }
}

/// A run in a list: what it is, where it stands and what it and its subagents spent.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunSummary {
    pub(crate) run_id: String,
    pub(crate) agent: String,
    pub(crate) status: RunStatus,
    /// What its current turn was asked (a preview).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) metadata: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<RunError>,
    pub(crate) total: Spent,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

impl From<Run> for RunSummary {
    fn from(run: Run) -> Self {
        Self {
            total: run.total(),
            run_id: run.run_id,
            agent: run.agent,
            status: run.status,
            prompt: run.prompt,
            metadata: run.origin.metadata,
            error: run.outcome.error,
            created_at: run.created_at,
            updated_at: run.updated_at,
        }
    }
}

/// `GET /runs/{runId}/tree`: a run and the runs under it (subagents, theirs, a plan's
/// steps' runs), oldest first, each one's parent before it.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunTreeBody {
    pub(crate) run: TreeNode,
    pub(crate) descendants: Vec<TreeNode>,
    /// More runs are under its top-level run than were read (500).
    pub(crate) truncated: bool,
}

/// A run in a tree: where it stands, what it spent, how long it worked.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TreeNode {
    pub(crate) run_id: String,
    pub(crate) agent: String,
    pub(crate) status: RunStatus,
    /// Where a running run is: `thinking`, `waiting_on_user`, `executing_plan`…
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) state: Option<String>,
    /// The run it reports to and the tool call (a subagent's, or a plan's) that started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) parent: Option<ParentLink>,
    /// What it was asked (a preview).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt: Option<String>,
    /// Its own model calls' cost and tokens.
    pub(crate) cost_usd: f64,
    pub(crate) usage: Usage,
    /// With what the runs under it spent.
    pub(crate) total: Spent,
    /// How long it worked, in ms (waits for humans and idle time between turns left out).
    pub(crate) worked_ms: u64,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

impl From<Run> for TreeNode {
    fn from(run: Run) -> Self {
        // A run working now counts its turn so far.
        let worked_ms = run.clock.worked_ms
            + run.clock.working_since.map_or(0, |t| {
                u64::try_from((run.updated_at - t).num_milliseconds()).unwrap_or(0)
            });
        Self {
            total: run.total(),
            run_id: run.run_id,
            agent: run.agent,
            status: run.status,
            state: run.outcome.state,
            parent: run.origin.parent,
            prompt: run.prompt,
            cost_usd: run.spend.cost_usd,
            usage: run.spend.usage,
            worked_ms,
            created_at: run.created_at,
            updated_at: run.updated_at,
        }
    }
}

/// `GET /runs/{runId}/timeline`.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TimelinePage<'a> {
    pub(crate) run_id: String,
    pub(crate) status: RunStatus,
    pub(crate) entries: &'a [Entry],
    /// The cursor to page on with `after=`: the last entry's, else the one given.
    pub(crate) next: Option<u64>,
}

/// `GET /ctas`: a page, each as its owner sees it (see [`owner_view`]), and the cursor of
/// the next page when more follow. A page holds at most 100 CTAs and 4 MB of them (but one
/// CTA, whatever its size: at most 400 KB), under Lambda's 6 MB reply.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CtaList {
    pub(crate) ctas: Vec<Cta>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) next_cursor: Option<String>,
}

/// A CTA as its owner and assignees see it: all but the link nonce (a link's own secret
/// part), its revision, its history (`GET /ctas/{id}/audit`) and its notifications' book-
/// keeping (their outcomes are in the history).
pub(crate) fn owner_view(mut cta: Cta) -> Cta {
    cta.link_nonce = None;
    cta.rev = 0;
    cta.audit = Vec::new();
    cta.deliveries = Vec::new();
    cta
}

/// `GET /ctas/{ctaId}/audit`: the question's history, oldest first.
#[derive(JsonSchema, Serialize)]
pub(crate) struct Audit {
    pub(crate) events: Vec<baton_core::cta::AuditEvent>,
}

/// `GET /links/{token}`: what a link's holder sees of a CTA: the question, its state and
/// its expiry; not whose it is, nor the run's.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LinkQuestion<'a> {
    pub(crate) cta_id: &'a str,
    #[serde(flatten)]
    pub(crate) request: &'a CtaRequest,
    /// The answer it takes if none comes in time (when its run expires questions into
    /// their defaults).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) default: Option<&'a CtaResponse>,
    pub(crate) status: CtaStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) response: Option<&'a CtaResponse>,
    pub(crate) gate: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gated: Option<&'a Gated>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) resolved_at: Option<DateTime<Utc>>,
    /// How many distinct people must approve, and how many have (an approval that needs
    /// several).
    #[serde(rename = "requiredApprovals", skip_serializing_if = "Option::is_none")]
    pub(crate) required: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) approved: Option<usize>,
}

impl<'a> From<&'a Cta> for LinkQuestion<'a> {
    fn from(cta: &'a Cta) -> Self {
        Self {
            cta_id: &cta.cta_id,
            request: &cta.request,
            default: cta.default.as_ref(),
            status: cta.status,
            response: cta.response.as_ref(),
            gate: cta.gate,
            gated: cta.gated.as_ref(),
            created_at: cta.created_at,
            expires_at: cta.expires_at,
            resolved_at: cta.resolved_at,
            required: (cta.required > 1).then_some(cta.required),
            approved: (cta.required > 1).then_some(cta.approvals.len()),
        }
    }
}

/// `202` to an answer.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AnswerAccepted {
    pub(crate) cta_id: String,
    /// Not said to a link's holder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) run_id: Option<String>,
    pub(crate) status: CtaStatus,
    pub(crate) message: String,
    /// An approval that needs several: who approved so far, and how many must.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) approvals: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) required: Option<u32>,
}

/// `POST /ctas/{ctaId}/link`.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Link {
    pub(crate) cta_id: String,
    pub(crate) url: String,
    pub(crate) expires_at: DateTime<Utc>,
}

#[derive(JsonSchema, Serialize)]
pub(crate) struct Health {
    pub(crate) status: String,
}

/// A run tree's budget on `GET /runs/{runId}`.
#[derive(JsonSchema, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BudgetBody {
    /// What the tree may spend now: its first budget with every raise, in US dollars.
    pub(crate) budget_usd: f64,
    /// What its runs' own model calls have cost so far.
    pub(crate) spent_usd: f64,
    /// Its first budget: what a budget question asks for by default.
    pub(crate) step_usd: f64,
    pub(crate) raises: Vec<baton_core::budget::Raise>,
}

impl BudgetBody {
    pub(crate) fn new(step: baton_core::budget::Budget, l: baton_core::budget::Ledger) -> Self {
        Self {
            budget_usd: l.budget_usd,
            spent_usd: l.spent_usd,
            step_usd: step.budget_usd,
            raises: l.raises,
        }
    }
}
