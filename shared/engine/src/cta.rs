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
    /// Applies a settlement to a pending CTA (the adapters write the result conditionally).
    pub fn settle(&mut self, settlement: &Settlement, at: DateTime<Utc>) {
        self.status = settlement.status();
        if let Settlement::Answered {
            response,
            responder,
        } = settlement
        {
            self.response = Some(response.clone());
            self.responder = responder.clone();
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
        self.resolved_at = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn choice() -> CtaRequest {
        CtaRequest::Choice {
            prompt: "Pick".into(),
            options: vec![
                ChoiceOption {
                    id: "a".into(),
                    label: "A".into(),
                    description: None,
                },
                ChoiceOption {
                    id: "b".into(),
                    label: "B".into(),
                    description: None,
                },
            ],
        }
    }

    #[test]
    fn a_raise_answers_a_budget_question_only() {
        let raise = CtaResponse::from_json(json!({"kind": "approval", "approved": true,
            "raiseUsd": 5}))
        .expect("an answer");
        assert_eq!(raise.check_raise(true), Ok(()));
        let err = raise.check_raise(false).expect_err("not a budget question");
        assert!(err.contains("budget question only"), "{err}");
        let plain = CtaResponse::from_json(json!({"kind": "approval", "approved": true}))
            .expect("an answer");
        assert_eq!(plain.check_raise(false), Ok(()));
        // Past a million dollars, a raise is no answer at all.
        let err = CtaResponse::from_json(json!({"kind": "approval", "approved": true,
            "raiseUsd": 1.7e308}))
        .expect_err("too large");
        assert!(err.to_string().contains("to 1000000"), "{err}");
    }

    #[test]
    fn requests_and_responses_are_tagged_on_kind() {
        let r: CtaRequest = serde_json::from_value(json!({"kind": "text", "prompt": "Name?"}))
            .expect("valid text request");
        assert_eq!(
            r,
            CtaRequest::Text {
                prompt: "Name?".into(),
                placeholder: None,
                required: false,
            }
        );
        let a: CtaResponse =
            serde_json::from_value(json!({"kind": "choice", "selectedId": "b"})).expect("valid");
        assert_eq!(
            a,
            CtaResponse::Choice {
                selected_id: "b".into()
            }
        );
        // A field of another kind is refused, not ignored.
        assert!(
            serde_json::from_value::<CtaResponse>(json!({"kind": "text", "approved": true}))
                .is_err()
        );
    }

    #[test]
    fn a_response_must_answer_its_own_request() {
        let table: Vec<(CtaRequest, serde_json::Value, bool)> = vec![
            (choice(), json!({"kind": "choice", "selectedId": "a"}), true),
            (
                choice(),
                json!({"kind": "choice", "selectedId": "z"}),
                false,
            ),
            (choice(), json!({"kind": "text", "text": "a"}), false),
            (
                CtaRequest::Approval {
                    message: "ok?".into(),
                },
                json!({"kind": "approval", "approved": false, "reason": "no"}),
                true,
            ),
            (
                CtaRequest::Approval {
                    message: "ok?".into(),
                },
                json!({"kind": "choice", "selectedId": "a"}),
                false,
            ),
            (
                CtaRequest::Text {
                    prompt: "?".into(),
                    placeholder: None,
                    required: false,
                },
                json!({"kind": "text", "text": ""}),
                true,
            ),
            (
                CtaRequest::Text {
                    prompt: "?".into(),
                    placeholder: None,
                    required: false,
                },
                json!({"kind": "approval", "approved": true}),
                false,
            ),
            (
                CtaRequest::Text {
                    prompt: "?".into(),
                    placeholder: None,
                    required: true,
                },
                json!({"kind": "text", "text": "  "}),
                false,
            ),
        ];
        for (req, resp, ok) in table {
            let resp: CtaResponse = serde_json::from_value(resp).expect("well-formed");
            assert_eq!(
                resp.validate_against(&req).is_ok(),
                ok,
                "{req:?} / {resp:?}"
            );
        }
    }

    #[test]
    fn requests_are_checked_beyond_their_schema() {
        let dup = CtaRequest::Choice {
            prompt: "p".into(),
            options: vec![
                ChoiceOption {
                    id: "a".into(),
                    label: "A".into(),
                    description: None,
                },
                ChoiceOption {
                    id: "a".into(),
                    label: "B".into(),
                    description: None,
                },
            ],
        };
        assert!(dup.validate().is_err());
        assert!(
            CtaRequest::Choice {
                prompt: "p".into(),
                options: vec![]
            }
            .validate()
            .is_err()
        );
        assert!(
            CtaRequest::Approval {
                message: " ".into()
            }
            .validate()
            .is_err()
        );
        assert!(choice().validate().is_ok());
    }

    #[test]
    fn a_cta_serializes_flat_with_its_request_fields() {
        let now = Utc::now();
        let cta = Cta {
            cta_id: "c1".into(),
            run_id: "r1".into(),
            root_run_id: None,
            agent: None,
            run_prompt: None,
            tool_call_id: "t1".into(),
            owner: "o".into(),
            request: choice(),
            default: None,
            status: CtaStatus::Pending,
            response: None,
            gate: false,
            gated: None,
            budget: None,
            created_at: now,
            expires_at: now,
            resolved_at: None,
            defaulted: false,
            responder: None,
            link_nonce: None,
        };
        let v = serde_json::to_value(&cta).expect("serializes");
        assert_eq!(v["kind"], "choice");
        assert_eq!(v["options"][1]["id"], "b");
        assert_eq!(v["ctaId"], "c1");
        let back: Cta = serde_json::from_value(v).expect("round-trips");
        assert_eq!(back, cta);
    }
}
