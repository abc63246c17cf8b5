//! Typed calls to action: the questions a run asks a human, and their answers.
//!
//! Requests and responses are tagged unions on `kind`; each variant carries only its own
//! fields. Validation lives here so the API, the `cta` consumer and the engine agree.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One option of a `choice` CTA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ChoiceOption {
    pub id: String,
    pub label: String,
    /// More about the option, shown under its label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// What the run asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum CtaRequest {
    Approval {
        message: String,
    },
    Text {
        prompt: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        placeholder: Option<String>,
        /// A blank answer is refused (by default any text, even none, answers).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        required: bool,
    },
    Choice {
        prompt: String,
        options: Vec<ChoiceOption>,
    },
}

/// What the human answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum CtaResponse {
    Approval {
        approved: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Approving a budget question: raise the budget by this much (US dollars) instead
        /// of what it asked for: from a millionth of a dollar to one million.
        #[serde(rename = "raiseUsd", default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(
            feature = "schemas",
            schemars(extend("minimum" = 0.000_001, "maximum" = 1_000_000))
        )]
        raise_usd: Option<f64>,
    },
    Text {
        text: String,
    },
    Choice {
        #[serde(rename = "selectedId")]
        selected_id: String,
    },
}

impl CtaResponse {
    /// An answer to an approval, with no reason and no raise.
    pub fn approval(approved: bool) -> Self {
        Self::Approval {
            approved,
            reason: None,
            raise_usd: None,
        }
    }

    /// A response as a caller sends it (an API body, a bus answer's fields), or why it is
    /// not one.
    pub fn from_json(value: serde_json::Value) -> Result<Self, InvalidResponse> {
        let response: Self = serde_json::from_value(value).map_err(InvalidResponse)?;
        // An amount out of bounds is no answer, whatever it answers.
        if let Self::Approval {
            raise_usd: Some(usd),
            ..
        } = &response
        {
            crate::budget::check_amount("raiseUsd", *usd)
                .map_err(|e| InvalidResponse(serde::de::Error::custom(e)))?;
        }
        Ok(response)
    }
}

/// A body that is no [`CtaResponse`]: the decoder's reason.
#[derive(Debug, thiserror::Error)]
#[error("invalid CTA response: {0}")]
pub struct InvalidResponse(#[source] pub serde_json::Error);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum CtaStatus {
    Pending,
    Answered,
    Expired,
    Cancelled,
}

impl CtaStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Answered => "answered",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "answered" => Some(Self::Answered),
            "expired" => Some(Self::Expired),
            "cancelled" => Some(Self::Cancelled),
            _ => None,
        }
    }
}

/// A request or response that does not fit its contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CtaInvalid(pub String);

impl CtaRequest {
    /// What the human is asked, in one line of text.
    pub fn question(&self) -> &str {
        match self {
            Self::Approval { message } => message,
            Self::Text { prompt, .. } | Self::Choice { prompt, .. } => prompt,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::Approval { .. } => "approval",
            Self::Text { .. } => "text",
            Self::Choice { .. } => "choice",
        }
    }

    /// Checks what a schema cannot: non-empty texts, at least one option, unique ids.
    pub fn validate(&self) -> Result<(), CtaInvalid> {
        let blank = |s: &str| s.trim().is_empty();
        match self {
            Self::Approval { message } if blank(message) => {
                Err(CtaInvalid("approval `message` must not be empty".into()))
            }
            Self::Text { prompt, .. } | Self::Choice { prompt, .. } if blank(prompt) => {
                Err(CtaInvalid("`prompt` must not be empty".into()))
            }
            Self::Choice { options, .. } => {
                if options.is_empty() {
                    return Err(CtaInvalid("choice needs at least one option".into()));
                }
                let mut seen = std::collections::HashSet::new();
                for o in options {
                    if blank(&o.id) {
                        return Err(CtaInvalid("choice option ids must not be empty".into()));
                    }
                    if !seen.insert(o.id.as_str()) {
                        return Err(CtaInvalid(format!("duplicate choice option id `{}`", o.id)));
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl CtaResponse {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Approval { .. } => "approval",
            Self::Text { .. } => "text",
            Self::Choice { .. } => "choice",
        }
    }

    /// A `raiseUsd` answers a budget question only (`budget`: this one is): an answer to
    /// any other that carries one is refused, through the API and in a fork's replacement
    /// alike.
    pub fn check_raise(&self, budget: bool) -> Result<(), String> {
        match self {
            Self::Approval {
                raise_usd: Some(_), ..
            } if !budget => {
                Err("`raiseUsd` answers a budget question only; this CTA is not one".into())
            }
            _ => Ok(()),
        }
    }

    /// A response must answer its own request: same kind, and a choice among the options.
    pub fn validate_against(&self, request: &CtaRequest) -> Result<(), CtaInvalid> {
        match (request, self) {
            (CtaRequest::Text { required: true, .. }, CtaResponse::Text { text })
                if text.trim().is_empty() =>
            {
                Err(CtaInvalid(
                    "this question needs an answer: `text` is blank".into(),
                ))
            }
            (
                CtaRequest::Approval { .. },
                CtaResponse::Approval {
                    approved,
                    raise_usd: Some(usd),
                    ..
                },
            ) => {
                if !approved {
                    return Err(CtaInvalid(
                        "`raiseUsd` goes with an approval (`approved: true`)".into(),
                    ));
                }
                crate::budget::check_amount("raiseUsd", *usd).map_err(CtaInvalid)
            }
            (CtaRequest::Approval { .. }, CtaResponse::Approval { .. })
            | (CtaRequest::Text { .. }, CtaResponse::Text { .. }) => Ok(()),
            (CtaRequest::Choice { options, .. }, CtaResponse::Choice { selected_id }) => {
                if options.iter().any(|o| &o.id == selected_id) {
                    Ok(())
                } else {
                    let ids: Vec<&str> = options.iter().map(|o| o.id.as_str()).collect();
                    Err(CtaInvalid(format!(
                        "selectedId `{selected_id}` is not one of the options ({})",
                        ids.join(", ")
                    )))
                }
            }
            _ => Err(CtaInvalid(format!(
                "this CTA is of kind `{}`, the response is of kind `{}`",
                request.kind(),
                self.kind()
            ))),
        }
    }

    /// A question's `default` as the model gives it: its kind's answer, with or without
    /// `kind` (`{"approved": true}`, `{"text": "…"}`, `{"selectedId": "…"}`), checked
    /// against the question as an answer is.
    pub fn default_for(request: &CtaRequest, value: serde_json::Value) -> Result<Self, CtaInvalid> {
        let mut value = value;
        match value.as_object_mut() {
            Some(o) => {
                o.entry("kind")
                    .or_insert_with(|| serde_json::Value::from(request.kind()));
            }
            None => {
                return Err(CtaInvalid(format!(
                    "`default` must be an object, the answer a `{}` question takes",
                    request.kind()
                )));
            }
        }
        let response = Self::from_json(value)
            .map_err(|e| CtaInvalid(format!("`default` is no answer to this question: {}", e.0)))?;
        response
            .validate_against(request)
            .map_err(|e| CtaInvalid(format!("`default` does not answer this question: {e}")))?;
        Ok(response)
    }

    /// The tool result the model sees for this answer.
    pub fn to_output(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// The CTA item: the authority on whether a question is still open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Cta {
    pub cta_id: String,
    pub run_id: String,
    /// The top-level run the asking run is under (itself if it is one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<String>,
    /// The asking run's agent, for an inbox (absent on a CTA stored before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// What the asking run was asked in its turn ([`crate::run::Run::prompt`]), for an inbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_prompt: Option<String>,
    pub tool_call_id: String,
    pub owner: String,
    #[serde(flatten)]
    pub request: CtaRequest,
    /// The answer the question takes if none comes before it expires, when the asking
    /// run's `onExpiry` is `default` (the model gave it with the question).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<CtaResponse>,
    pub status: CtaStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<CtaResponse>,
    /// True when the engine raised it to gate a tool call (not the model asking).
    #[serde(default)]
    pub gate: bool,
    /// The gated call: the tool, its input, and the policy's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gated: Option<Gated>,
    /// A budget question's figures: approving raises the run tree's budget
    /// ([`crate::budget`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::budget::BudgetAsk>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<DateTime<Utc>>,
    /// Who answered: the API caller, or the responder a bus event names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responder: Option<String>,
    /// It expired into its `default`, which is its `response` (as the timeline's copy says).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub defaulted: bool,
    /// What a one-time answer link must name to answer this CTA (see `baton_core::links`). The
    /// API never shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemas", schemars(skip))]
    pub link_nonce: Option<String>,
    /// Who may answer besides the owner (`user:<id>`, `group:<name>`), by the asking agent's
    /// policy, never the model's; none: the owner alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assignees: Vec<String>,
    /// How many distinct people must approve an approval (1 unless its policy says more).
    /// (`requiredApprovals`: a text question's `required` is another thing.)
    #[serde(
        rename = "requiredApprovals",
        default = "one",
        skip_serializing_if = "is_one"
    )]
    pub required: u32,
    /// Who approved so far, for an approval that needs several.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<Approver>,
    /// The question's history: created, notified, link opened, approved, answered, expired…
    /// (at most [`MAX_AUDIT`] events; `GET /ctas/{id}/audit`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit: Vec<AuditEvent>,
    /// The channels its assignees are told through, and its reminder and escalation (the
    /// asking agent's policy when it was asked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remind_after_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_after_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalate_to: Vec<String>,
    /// The messages owed and sent about it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deliveries: Vec<Delivery>,
    /// The record's revision: every change writes `rev + 1`, conditionally on `rev` (so that
    /// no two concurrent changes lose one another).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "schemas", schemars(skip))]
    pub rev: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// The most events a question's audit trail keeps (a reminder that fires for a month must
/// not grow its record without bound): past it, the newest replace the oldest but the first.
pub const MAX_AUDIT: usize = 200;

/// Through what a person answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Via {
    Api,
    Console,
    Link,
    Bus,
}

/// One approval of several an approval needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Approver {
    pub by: String,
    pub via: Via,
    pub at: DateTime<Utc>,
}

/// One event of a question's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// `created`, `notified`, `link_opened`, `approved`, `answered`, `reminded`,
    /// `escalated`, `expired`, `defaulted` or `cancelled`.
    #[serde(rename = "type")]
    pub kind: String,
    pub at: DateTime<Utc>,
    /// Who acted (an answer's responder, a link's recipient).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<Via>,
    /// A notification's channel, recipient and outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// What else it says (an approval's reason, the assignees an escalation added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl AuditEvent {
    /// An event of `kind` at `at`, saying nothing more.
    pub fn new(kind: &str, at: DateTime<Utc>) -> Self {
        Self {
            kind: kind.into(),
            at,
            by: None,
            via: None,
            channel: None,
            recipient: None,
            outcome: None,
            detail: None,
        }
    }

    /// The same, by `by` through `via`.
    #[must_use]
    pub fn by(mut self, by: Option<&str>, via: Option<Via>) -> Self {
        self.by = by.map(str::to_owned);
        self.via = via;
        self
    }
}

/// Whether `principal` (`user:<id>` or `group:<name>`) names the caller `id` in `groups`. A
/// `user:` names a caller by its whole id, or by the subject after an issuer's `#` (on AWS an
/// id is `<issuer>#<subject>`).
pub fn names(principal: &str, id: &str, groups: &[String]) -> bool {
    if let Some(user) = principal.strip_prefix("user:") {
        return id == user || id.rsplit_once('#').is_some_and(|(_, sub)| sub == user);
    }
    principal
        .strip_prefix("group:")
        .is_some_and(|g| groups.iter().any(|have| have == g))
}

/// Checks an assignee's form: `user:<id>` or `group:<name>`, neither blank.
pub fn check_principal(principal: &str) -> Result<(), String> {
    match principal.split_once(':') {
        Some(("user" | "group", name)) if !name.trim().is_empty() => Ok(()),
        _ => Err(format!(
            "assignee `{principal}` is neither `user:<id>` nor `group:<name>`"
        )),
    }
}

/// Checks who answers a policy's questions: each assignee's form, and `required` against
/// them (a group may hold any number of people; users count one each, and with no assignees
/// the owner alone answers).
pub fn check_assignment(assignees: &[String], required: u32) -> Result<(), String> {
    for a in assignees {
        check_principal(a)?;
    }
    if required == 0 {
        return Err("`required` must be at least 1".into());
    }
    let groups = assignees.iter().any(|a| a.starts_with("group:"));
    let people = if assignees.is_empty() {
        1
    } else {
        assignees.len()
    };
    if !groups && required as usize > people {
        return Err(format!(
            "`required` is {required}, more than the {people} who may answer"
        ));
    }
    Ok(())
}

/// Who answers an agent's questions (or one tool's approvals) besides the run's owner, and
/// how many distinct people must approve: the agents file's `questions`, checked by
/// [`check_assignment`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub assignees: Vec<String>,
    pub required: u32,
    /// The channels (the agents file's `notifiers`) each assignee is told through.
    pub notify: Vec<String>,
    /// Tell the assignees again after this many seconds, and every as many after, while it
    /// waits.
    pub remind_after_seconds: Option<u64>,
    /// After this many seconds unanswered, `escalate_to` are added to its assignees and told.
    pub escalate_after_seconds: Option<u64>,
    pub escalate_to: Vec<String>,
}

impl Default for Assignment {
    fn default() -> Self {
        Self {
            assignees: Vec::new(),
            required: 1,
            notify: Vec::new(),
            remind_after_seconds: None,
            escalate_after_seconds: None,
            escalate_to: Vec::new(),
        }
    }
}

/// The prefix of a question's notification timer: it delivers what is owed (and retries
/// what failed).
pub const NOTIFY_TIMER: &str = "ntf-";
/// The prefix of a question's reminder timer.
pub const REMIND_TIMER: &str = "rmd-";
/// The prefix of a question's escalation timer.
pub const ESCALATE_TIMER: &str = "esc-";

/// What a question's timer is for, by its name: its expiry (named by the question alone), or
/// one of its notifications'.
pub fn cta_timer(name: &str) -> (Option<&'static str>, &str) {
    for prefix in [NOTIFY_TIMER, REMIND_TIMER, ESCALATE_TIMER] {
        if let Some(cta_id) = name.strip_prefix(prefix) {
            return (Some(prefix), cta_id);
        }
    }
    (None, name)
}

/// One message owed to one recipient through one channel, for one round of a question
/// (`asked`, `reminder-<n>`, `escalated`): delivered at most once for good, tried again
/// until it is, up to [`MAX_DELIVERY_ATTEMPTS`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    /// `<round>:<channel>:<recipient>`: what a receiver deduplicates on.
    pub id: String,
    pub round: String,
    pub channel: String,
    /// An assignee (`user:<id>`, `group:<name>`), or the owner's id.
    pub recipient: String,
    /// Tries claimed so far (a try is claimed before it is made: no two deliverers make the
    /// same try).
    pub attempts: u32,
    pub done: bool,
    /// The deliverer trying it now, until when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
}

/// A deliverer's claim on a try: its own token, and when another may take the delivery
/// over (the deliverer died).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub token: String,
    pub until: DateTime<Utc>,
}

/// How many times a delivery is tried before it is given up.
pub const MAX_DELIVERY_ATTEMPTS: u32 = 5;

/// The most deliveries one claim takes (sent at once, so that a round fits well within a
/// function's time however many people it tells; the rest wait for the next timer).
pub const MAX_CLAIMED: usize = 16;

impl Delivery {
    pub fn new(round: &str, channel: &str, recipient: &str) -> Self {
        Self {
            id: format!("{round}:{channel}:{recipient}"),
            round: round.into(),
            channel: channel.into(),
            recipient: recipient.into(),
            attempts: 0,
            done: false,
            lease: None,
        }
    }

    /// Whether it is to be tried at `now`: not delivered, tries left, and no deliverer on it.
    pub fn owed(&self, now: DateTime<Utc>) -> bool {
        !self.done
            && self.attempts < MAX_DELIVERY_ATTEMPTS
            && self.lease.as_ref().is_none_or(|l| l.until <= now)
    }
}

/// What one try of a delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    pub id: String,
    pub ok: bool,
    /// `delivered` (and the receiver's status), or why not.
    pub outcome: String,
}

/// A change to a CTA's record, applied by [`Cta::apply`] and written by the adapters
/// conditionally on the record's `rev` (they read, apply and write again until their write
/// is the one after the record they read).
#[derive(Debug, Clone, PartialEq)]
pub enum CtaChange {
    /// It leaves `pending` (only from `pending`).
    Settle(Settlement),
    /// One of the several approvals it needs (only while `pending`): the same person counts
    /// once; the last one needed settles it, approved.
    Approve { by: String, via: Via },
    /// An event of its history, in any status.
    Record(AuditEvent),
    /// A round of notifications while it waits (a reminder, an escalation): its event, the
    /// assignees it adds and the deliveries it owes (each once, by id).
    Round {
        event: AuditEvent,
        assignees: Vec<String>,
        deliveries: Vec<Delivery>,
    },
    /// A deliverer claims every delivery owed at the change's time: each one's next try is
    /// its, under `lease` (the same try is never made twice at once).
    Claim(Lease),
    /// Deliveries tried: what came of each, said in the history; their leases end.
    Tried(Vec<Tried>),
}

/// What [`Cta::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The record changed (write it); `settled`: it left `pending` by this change.
    Changed { settled: bool },
    /// Nothing to write: an approval by someone who had approved already.
    Unchanged,
    /// Not applicable to the record as it is (no longer pending).
    Refused,
}

/// The call an approval CTA gates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemas", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Gated {
    pub tool: String,
    pub input: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a CTA leaves `pending`, by one conditional write: the first one wins.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    Answered {
        response: CtaResponse,
        responder: Option<String>,
        /// Through what (none: a caller that did not say, such as a fork's replacement).
        via: Option<Via>,
    },
    Expired,
    Cancelled,
}

impl Settlement {
    pub fn status(&self) -> CtaStatus {
        match self {
            Self::Answered { .. } => CtaStatus::Answered,
            Self::Expired => CtaStatus::Expired,
            Self::Cancelled => CtaStatus::Cancelled,
        }
    }
}

impl Cta {
    /// Who a round of its notifications goes to: its assignees, or its owner if it has none.
    pub fn recipients(&self) -> Vec<String> {
        if self.assignees.is_empty() {
            vec![self.owner.clone()]
        } else {
            self.assignees.clone()
        }
    }

    /// The deliveries a round owes `recipients`: one per channel each.
    pub fn round(&self, round: &str, recipients: &[String]) -> Vec<Delivery> {
        recipients
            .iter()
            .flat_map(|r| self.notify.iter().map(move |c| Delivery::new(round, c, r)))
            .collect()
    }

    /// Whether `principal` is among those who may answer besides the owner.
    pub fn is_assignee(&self, id: &str, groups: &[String]) -> bool {
        self.assignees.iter().any(|p| names(p, id, groups))
    }

    /// Whether the caller `id` in `groups` may see and answer it: its owner or an assignee.
    pub fn may_answer(&self, id: &str, groups: &[String]) -> bool {
        self.owner == id || self.is_assignee(id, groups)
    }

    /// Applies `change` at `at` (the adapters write the result conditionally on the `rev`
    /// they read; a change bumps it).
    pub fn apply(&mut self, change: &CtaChange, at: DateTime<Utc>) -> Applied {
        let applied = match change {
            CtaChange::Settle(_) | CtaChange::Approve { .. }
                if self.status != CtaStatus::Pending =>
            {
                return Applied::Refused;
            }
            CtaChange::Settle(settlement) => {
                self.settle(settlement, at);
                Applied::Changed { settled: true }
            }
            CtaChange::Approve { by, via } => {
                if self.approvals.iter().any(|a| &a.by == by) {
                    return Applied::Unchanged;
                }
                self.approvals.push(Approver {
                    by: by.clone(),
                    via: *via,
                    at,
                });
                self.record(AuditEvent::new("approved", at).by(Some(by), Some(*via)));
                if self.approvals.len() >= self.required as usize {
                    let settlement = Settlement::Answered {
                        response: CtaResponse::approval(true),
                        responder: Some(by.clone()),
                        via: Some(*via),
                    };
                    self.settle(&settlement, at);
                    Applied::Changed { settled: true }
                } else {
                    Applied::Changed { settled: false }
                }
            }
            CtaChange::Record(event) => {
                self.record(event.clone());
                Applied::Changed { settled: false }
            }
            CtaChange::Round { .. } if self.status != CtaStatus::Pending => {
                return Applied::Refused;
            }
            CtaChange::Round {
                event,
                assignees,
                deliveries,
            } => {
                for a in assignees {
                    if !self.assignees.contains(a) {
                        self.assignees.push(a.clone());
                    }
                }
                // What earlier rounds settled (delivered, or given up) is in the history: the
                // record keeps what is still owed, so that a reminder every minute for a
                // month does not outgrow an item (DynamoDB's 400 KB).
                self.deliveries
                    .retain(|d| !d.done && d.attempts < MAX_DELIVERY_ATTEMPTS);
                for d in deliveries {
                    if !self.deliveries.iter().any(|have| have.id == d.id) {
                        self.deliveries.push(d.clone());
                    }
                }
                self.record(event.clone());
                Applied::Changed { settled: false }
            }
            CtaChange::Claim(lease) => {
                let mut claimed = false;
                for d in self
                    .deliveries
                    .iter_mut()
                    .filter(|d| d.owed(at))
                    .take(MAX_CLAIMED)
                {
                    d.attempts += 1;
                    d.lease = Some(lease.clone());
                    claimed = true;
                }
                if !claimed {
                    return Applied::Unchanged;
                }
                Applied::Changed { settled: false }
            }
            CtaChange::Tried(tried) => {
                for t in tried {
                    let Some(d) = self.deliveries.iter_mut().find(|d| d.id == t.id) else {
                        continue;
                    };
                    d.lease = None;
                    d.done |= t.ok;
                    let mut event = AuditEvent::new("notified", at);
                    event.channel = Some(d.channel.clone());
                    event.recipient = Some(d.recipient.clone());
                    event.outcome = Some(t.outcome.clone());
                    event.detail = Some(format!("{} (attempt {})", d.round, d.attempts));
                    self.record(event);
                }
                Applied::Changed { settled: false }
            }
        };
        self.rev += 1;
        applied
    }

    /// Adds an event to the history, keeping the first and the newest [`MAX_AUDIT`].
    pub fn record(&mut self, event: AuditEvent) {
        if self.audit.len() >= MAX_AUDIT {
            self.audit.remove(1);
        }
        self.audit.push(event);
    }

    /// Applies a settlement to a pending CTA, and says so in its history.
    fn settle(&mut self, settlement: &Settlement, at: DateTime<Utc>) {
        self.status = settlement.status();
        if let Settlement::Answered {
            response,
            responder,
            via,
        } = settlement
        {
            self.response = Some(response.clone());
            self.responder = responder.clone();
            let mut event = AuditEvent::new("answered", at).by(responder.as_deref(), *via);
            if let CtaResponse::Approval {
                approved, reason, ..
            } = response
            {
                event.outcome = Some(if *approved { "approved" } else { "rejected" }.into());
                event.detail = reason.clone();
            }
            self.record(event);
        }
        // A question with a default has one only when its run expires questions into their
        // defaults (the engine keeps none otherwise), and the engine applies it then: the
        // record says so as the timeline does. (An approval that gates a call, or a budget's,
        // ends otherwise.)
        if let (Settlement::Expired, Some(default), false, None) =
            (settlement, &self.default, self.gate, &self.budget)
        {
            self.response = Some(default.clone());
            self.defaulted = true;
        }
        match settlement {
            Settlement::Answered { .. } => {}
            Settlement::Expired if self.defaulted => self.record(AuditEvent::new("defaulted", at)),
            Settlement::Expired => self.record(AuditEvent::new("expired", at)),
            Settlement::Cancelled => self.record(AuditEvent::new("cancelled", at)),
        }
        self.resolved_at = Some(at);
    }
}

#[cfg(test)]
mod tests;
