//! API errors: every one is JSON `{"error": {"code", "message"}}` with the right status, and
//! bad input is a 4xx that changes nothing. Request bodies are read here too, so that a body
//! that is too large or not JSON gets the same shape.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use baton_core::error::PortError;
use baton_core::service::ServiceError;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::error;

use crate::MAX_BODY_BYTES;

/// An API error: status, stable code, human message (and a quota's figures).
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// `quota_exceeded`: the limit, and the owner's figure against it.
    pub quota: Option<Box<(serde_json::Value, serde_json::Value)>>,
    /// `Retry-After`, in seconds, when it is known when the request may succeed.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            quota: None,
            retry_after: None,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this route",
        )
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
}

/// Every error's body: `{"error": {"code", "message"}}`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ErrorDetail {
    /// Stable, for programs: `invalid_request`, `not_found`, `cta_expired`…
    pub code: String,
    /// For people.
    pub message: String,
    /// `quota_exceeded`: the owner's limit (active runs, or US dollars a day)…
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<serde_json::Value>,
    /// …and its figure against it when the request was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<serde_json::Value>,
}

impl ErrorBody {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            error: ErrorDetail {
                code: code.to_owned(),
                message: message.into(),
                limit: None,
                current: None,
            },
        }
    }

    /// As JSON text, for the places that write bytes themselves (a stream's last event, a
    /// connection's raw answer).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = ErrorBody::new(self.code, self.message);
        if let Some((limit, current)) = self.quota.map(|q| *q) {
            body.error.limit = Some(limit);
            body.error.current = Some(current);
        }
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::Invalid(m) => Self::invalid(m),
            ServiceError::NotFound(m) => Self::new(StatusCode::NOT_FOUND, "not_found", m),
            ServiceError::Conflict { code, message } => {
                Self::new(StatusCode::CONFLICT, code, message)
            }
            ServiceError::Gone(m) => Self::new(StatusCode::GONE, "cta_expired", m),
            ServiceError::Forbidden { code, message } => {
                Self::new(StatusCode::FORBIDDEN, code, message)
            }
            ServiceError::Link { code, message } => {
                let status = match code {
                    "link_expired" => StatusCode::GONE,
                    "link_invalid" => StatusCode::FORBIDDEN,
                    _ => StatusCode::CONFLICT,
                };
                Self::new(status, code, message)
            }
            e @ ServiceError::AlreadyAnswered(_) => {
                Self::new(StatusCode::CONFLICT, "cta_answered", e.to_string())
            }
            ServiceError::Port(e) => e.into(),
        }
    }
}

impl From<PortError> for ApiError {
    fn from(e: PortError) -> Self {
        match e {
            // The caller's own limits, not the backend's trouble: said as they are.
            PortError::QuotaExceeded { limit, current } => {
                return Self {
                    quota: Some(Box::new((limit.into(), current.into()))),
                    ..Self::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "quota_exceeded",
                        format!(
                            "you have {current} runs under way and may have at most {limit} \
                             (BATON_MAX_ACTIVE_RUNS_PER_OWNER): start this one when one of \
                             them has ended"
                        ),
                    )
                };
            }
            PortError::DailyCostExceeded {
                limit_usd,
                spent_usd,
            } => {
                // Until the next UTC day, when the allowance starts again.
                let now = chrono::Utc::now();
                let midnight = now
                    .date_naive()
                    .succ_opt()
                    .and_then(|d| d.and_hms_opt(0, 0, 0))
                    .map_or(now, |t| t.and_utc());
                let wait = (midnight - now).num_seconds().max(1) as u64;
                return Self {
                    quota: Some(Box::new((limit_usd.into(), spent_usd.into()))),
                    retry_after: Some(wait),
                    ..Self::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "quota_exceeded",
                        format!(
                            "your runs have spent ${spent_usd:.4} today (UTC) of the ${limit_usd:.4} \
                             a day allowed (BATON_MAX_DAILY_COST_USD_PER_OWNER): try again \
                             after midnight UTC"
                        ),
                    )
                };
            }
            _ => {}
        }
        error!(error = %e, source = ?std::error::Error::source(&e), "backend error");
        if e.is_storage_full() {
            // Said as it is: the one who can free the space is the one who reads this.
            Self::new(StatusCode::SERVICE_UNAVAILABLE, "disk_full", e.to_string())
        } else if e.is_retryable() {
            Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the service is busy; try again",
            )
        } else {
            Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
        }
    }
}

/// A JSON body: 400 when it does not parse, 413 when it is too large.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("request body is larger than {MAX_BODY_BYTES} bytes"),
                )
            } else {
                ApiError::invalid(format!("cannot read request body: {}", e.body_text()))
            }
        })?;
        // An object, as every route's body is: serde would read a struct from an array too
        // (`["p", "chat"]` as `{prompt, agent}`), which no route documents.
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first.is_some_and(|b| *b != b'{') {
            return Err(ApiError::invalid(
                "invalid JSON body: it must be a JSON object (`{...}`)",
            ));
        }
        // The error names the field it is about (`budgetUsd: invalid type: …`).
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))?;
        de.end()
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))?;
        Ok(JsonBody(value))
    }
}
