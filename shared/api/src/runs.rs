//! The operators' reads of runs: a page of runs by status, agent, time and owner (`GET
//! /runs`), a run's tree (`GET /runs/{runId}/tree`), and whose runs a caller may read.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use baton_core::run::RunStatus;
use baton_core::service::RunFilter;
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
    // Another owner's runs: an operator's to read.
    let owner = match q.get("owner").filter(|o| **o != caller.0) {
        Some(other) if s.auth.is_operator(&caller) => other.clone(),
        Some(_) => return Err(forbidden()),
        None => caller.0,
    };
    let limit = match parse_num(&q, "limit")? {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => DEFAULT_RUN_PAGE,
    };
    let filter = run_filter(&q)?;
    let cursor = q.get("cursor").map(String::as_str);
    let (runs, next) = s.service.list_runs(&owner, &filter, cursor, limit).await?;
    Ok(Json(bodies::RunList {
        runs: runs.into_iter().map(bodies::RunSummary::from).collect(),
        next_cursor: next,
    }))
}

/// Whose run the caller reads: its own, or, an operator, whoever's `run_id` is (one more
/// read, for operators only).
pub(crate) async fn reader(
    s: &AppState,
    caller: &Caller,
    run_id: &str,
) -> Result<String, ApiError> {
    if s.auth.is_operator(caller)
        && let Some(owner) = s.service.run_owner(run_id).await?
    {
        return Ok(owner);
    }
    Ok(caller.0.clone())
}

fn forbidden() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "only an operator (BATON_OPERATORS) reads another owner's runs",
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
    let owner = reader(&s, &caller, &run_id).await?;
    let tree = s.service.run_tree(&owner, &run_id).await?;
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
