//! The operators' reads of runs: a page of runs by status, agent, time and owner (`GET
//! /runs`), a run's tree (`GET /runs/{runId}/tree`), and whose runs a caller may read.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use baton_core::run::RunStatus;
use baton_core::service::{RunFilter, ServiceError};
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::{ApiError, AppState, Caller, Id, bodies, parse_num};

/// `GET /runs` without a `limit`: a page of 20 (at most `MAX_RUN_PAGE`, 100).
const DEFAULT_RUN_PAGE: usize = 20;

pub(crate) async fn list_runs(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<bodies::RunList>, ApiError> {
    let owner = owner_asked(&s, caller, &q)?;
    let limit = match parse_num(&q, "limit")? {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => DEFAULT_RUN_PAGE,
    };
    let filter = run_filter(&q)?;
    let cursor = q.get("cursor").map(String::as_str);
    let (runs, next) = s
        .service
        .requests()
        .list_runs(&owner, &filter, cursor, limit)
        .await?;
    Ok(Json(bodies::RunList {
        runs: runs.into_iter().map(bodies::RunSummary::from).collect(),
        next_cursor: next,
    }))
}

/// `GET /usage`: the caller's figures against its quotas; an operator's `?owner=`, another's.
pub(crate) async fn usage(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<bodies::UsageBody>, ApiError> {
    let owner = owner_asked(&s, caller, &q)?;
    let usage = s.service.requests().usage(&owner).await?;
    Ok(Json(bodies::UsageBody::new(owner, usage)))
}

/// `read` of `run_id` as the caller, its owner; and, for an operator, when the run is not
/// the caller's, as whoever's it is (one more read, only then). Returns what was read and
/// the owner it was read as.
pub(crate) async fn read_as<T, F: Future<Output = Result<T, ServiceError>>>(
    s: &AppState,
    caller: &Caller,
    run_id: &str,
    read: impl Fn(String) -> F,
) -> Result<(T, String), ApiError> {
    match read(caller.id.clone()).await {
        Err(ServiceError::NotFound(message)) if s.auth.is_operator(caller) => {
            match s.service.requests().run_owner(run_id).await? {
                Some(owner) if owner != caller.id => Ok((read(owner.clone()).await?, owner)),
                _ => Err(ServiceError::NotFound(message).into()),
            }
        }
        read => Ok((read?, caller.id.clone())),
    }
}

/// The owner whose runs or figures a read is of: `?owner=`, another's only for an operator,
/// else the caller.
fn owner_asked(
    s: &AppState,
    caller: Caller,
    q: &HashMap<String, String>,
) -> Result<String, ApiError> {
    match q.get("owner").filter(|o| **o != caller.id) {
        Some(other) if s.auth.is_operator(&caller) => Ok(other.clone()),
        Some(_) => Err(forbidden()),
        None => Ok(caller.id),
    }
}

fn forbidden() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "only an operator (BATON_OPERATORS) reads another owner's runs and figures",
    )
}

/// `GET /runs`' filters: `status` (one, or `all`), `agent`, `since` and `until` (RFC 3339).
fn run_filter(q: &HashMap<String, String>) -> Result<RunFilter, ApiError> {
    let status = match q.get("status").map(String::as_str) {
        None | Some("all") => None,
        Some(v) => Some(
            serde_json::from_value::<RunStatus>(Value::String(v.to_owned())).map_err(|_| {
                ApiError::invalid(
                    "`status` must be one of queued, running, waiting, completed, failed, \
                     expired, cancelled, all",
                )
            })?,
        ),
    };
    let time = |key: &str| {
        q.get(key)
            .map(|v| {
                DateTime::parse_from_rfc3339(v)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|_| {
                        ApiError::invalid(format!(
                            "`{key}` must be a time in RFC 3339 (2026-11-26T09:00:00Z)"
                        ))
                    })
            })
            .transpose()
    };
    let agent = q.get("agent").filter(|a| !a.is_empty()).cloned();
    Ok(RunFilter {
        status,
        agent,
        since: time("since")?,
        until: time("until")?,
    })
}

/// `GET /runs/{runId}/tree`: the run and the runs under it, each with where it stands and
/// what it spent.
pub(crate) async fn get_tree(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Id(run_id): Id,
) -> Result<Json<bodies::RunTreeBody>, ApiError> {
    let (service, id) = (&s.service, run_id.as_str());
    let (tree, _) = read_as(&s, &caller, id, |owner| async move {
        service.requests().run_tree(&owner, id).await
    })
    .await?;
    Ok(Json(bodies::RunTreeBody {
        run: bodies::TreeNode::from(tree.run),
        descendants: tree
            .descendants
            .into_iter()
            .map(bodies::TreeNode::from)
            .collect(),
        truncated: tree.truncated,
    }))
}
