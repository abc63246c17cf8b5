//! The questions' routes: a caller's CTAs (`GET /ctas`, `GET /ctas/{id}`), answering one
//! (`POST /ctas/{id}/response`), and one-time answer links (mint, open, answer).

use crate::*;

pub(crate) async fn list_ctas(
    State(s): State<AppState>,
    Extension(Caller(owner)): Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<bodies::CtaList>, ApiError> {
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
    let (ctas, next) = s
        .service
        .requests()
        .list_ctas(&owner, status, root, cursor, limit)
        .await?;
    Ok(Json(bodies::CtaList {
        ctas: ctas.into_iter().map(bodies::owner_view).collect(),
        next_cursor: next,
    }))
}

pub(crate) async fn mint_link(
    State(s): State<AppState>,
    Extension(Caller(owner)): Extension<Caller>,
    Id(cta_id): Id,
) -> Result<Json<bodies::Link>, ApiError> {
    let (url, expires_at) = s.service.requests().mint_link(&owner, &cta_id).await?;
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
    Ok(answered(
        cta,
        None,
        "answer recorded; this link will not answer again",
    ))
}

pub(crate) async fn get_cta(
    State(s): State<AppState>,
    Extension(Caller(owner)): Extension<Caller>,
    Id(cta_id): Id,
) -> Result<Json<Cta>, ApiError> {
    let cta = s.service.requests().get_cta(Some(&owner), &cta_id).await?;
    Ok(Json(bodies::owner_view(cta)))
}

pub(crate) async fn answer_cta(
    State(s): State<AppState>,
    Extension(Caller(owner)): Extension<Caller>,
    Id(cta_id): Id,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let response = CtaResponse::from_json(body).map_err(ServiceError::from)?;
    let cta = s
        .service
        .requests()
        .answer_cta(Some(&owner), &cta_id, response, Some(owner.clone()))
        .await?;
    let run_id = Some(cta.run_id.clone());
    Ok(answered(
        cta,
        run_id,
        "answer recorded; the run takes it in its turn (a run cancelled meanwhile records the \
         answer and stays cancelled)",
    ))
}

/// 202: the answer to `cta` is recorded, as `message` says.
fn answered(cta: Cta, run_id: Option<String>, message: &str) -> Response {
    accepted(bodies::AnswerAccepted {
        cta_id: cta.cta_id,
        run_id,
        status: cta.status,
        message: message.into(),
    })
}
