//! The questions' routes: a caller's CTAs (`GET /ctas`, `GET /ctas/{id}`, its history
//! `GET /ctas/{id}/audit`), answering one (`POST /ctas/{id}/response`), and one-time answer
//! links (mint, open, answer). A CTA is its run's owner's and its assignees'.

use crate::*;

pub(crate) async fn list_ctas(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<bodies::CtaList>, ApiError> {
    let assigned = match q.get("assigned").map(String::as_str) {
        None => false,
        Some("me") => true,
        Some(_) => return Err(ApiError::invalid("`assigned` must be `me`")),
    };
    let status = match q.get("status").map(String::as_str) {
        None | Some("all") => None,
        Some(v) => Some(CtaStatus::parse(v).ok_or_else(|| {
            ApiError::invalid("`status` must be one of pending, answered, expired, cancelled, all")
        })?),
    };
    let root = q.get("rootRunId").map(String::as_str);
    let limit = match parse_num(&q, "limit")? {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => DEFAULT_CTA_PAGE,
    };
    let cursor = q.get("cursor").map(String::as_str);
    let requests = s.service.requests();
    let (ctas, next) = if assigned {
        requests
            .list_assigned(&caller.id, &caller.groups, status, root, cursor, limit)
            .await?
    } else {
        requests
            .list_ctas(&caller.id, status, root, cursor, limit)
            .await?
    };
    Ok(Json(bodies::CtaList {
        ctas: ctas.into_iter().map(bodies::owner_view).collect(),
        next_cursor: next,
    }))
}

pub(crate) async fn mint_link(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Id(cta_id): Id,
) -> Result<Json<bodies::Link>, ApiError> {
    let (url, expires_at) = s
        .service
        .requests()
        .mint_link(&caller.id, &caller.groups, &cta_id)
        .await?;
    Ok(Json(bodies::Link {
        cta_id,
        url,
        expires_at,
    }))
}

/// What a link's holder sees: the question, its context and its expiry; not whose it is.
pub(crate) async fn open_link(
    State(s): State<AppState>,
    Id(token): Id,
) -> Result<Response, ApiError> {
    let cta = s.service.requests().cta_by_link(&token).await?;
    Ok(Json(bodies::LinkQuestion::from(&cta)).into_response())
}

pub(crate) async fn answer_link(
    State(s): State<AppState>,
    Id(token): Id,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let response = CtaResponse::from_json(body).map_err(ServiceError::from)?;
    let cta = s
        .service
        .requests()
        .answer_by_link(&token, response)
        .await?;
    let message = if cta.status == CtaStatus::Pending {
        format!(
            "approval recorded: {} of the {} needed; this link will not answer again",
            cta.approvals.len(),
            cta.required
        )
    } else {
        "answer recorded; this link will not answer again".into()
    };
    Ok(answered(cta, None, &message))
}

pub(crate) async fn get_cta(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Id(cta_id): Id,
) -> Result<Json<Cta>, ApiError> {
    let cta = s
        .service
        .requests()
        .cta_for(&caller.id, &caller.groups, &cta_id)
        .await?;
    Ok(Json(bodies::owner_view(cta)))
}

pub(crate) async fn cta_audit(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Id(cta_id): Id,
) -> Result<Json<bodies::Audit>, ApiError> {
    let cta = s
        .service
        .requests()
        .cta_for(&caller.id, &caller.groups, &cta_id)
        .await?;
    Ok(Json(bodies::Audit { events: cta.audit }))
}

/// The header the console sends, so that its answers are recorded as given through it.
pub const VIA_HEADER: &str = "x-baton-via";

pub(crate) async fn answer_cta(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: axum::http::HeaderMap,
    Id(cta_id): Id,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let response = CtaResponse::from_json(body).map_err(ServiceError::from)?;
    let via = match headers.get(VIA_HEADER).and_then(|v| v.to_str().ok()) {
        Some("console") => Via::Console,
        _ => Via::Api,
    };
    let by = Answerer::caller(caller.id, caller.groups, via);
    let cta = s
        .service
        .requests()
        .answer_cta(&by, &cta_id, response)
        .await?;
    let run_id = Some(cta.run_id.clone());
    if cta.status == CtaStatus::Pending {
        let message = format!(
            "approval recorded: {} of the {} needed",
            cta.approvals.len(),
            cta.required
        );
        return Ok(answered(cta, run_id, &message));
    }
    Ok(answered(
        cta,
        run_id,
        "answer recorded; the run takes it in its turn (a run cancelled meanwhile records the \
         answer and stays cancelled)",
    ))
}

/// 202: the answer to `cta` is recorded, as `message` says.
fn answered(cta: Cta, run_id: Option<String>, message: &str) -> Response {
    let several = cta.required > 1;
    accepted(bodies::AnswerAccepted {
        cta_id: cta.cta_id,
        run_id,
        status: cta.status,
        message: message.into(),
        approvals: several.then(|| cta.approvals.into_iter().map(|a| a.by).collect()),
        required: several.then_some(cta.required),
    })
}
