//! The HTTP API: one `axum` router, served by `baton dev` and by the `api` Lambda function.
//!
//! Every error is JSON `{"error": {"code", "message"}}` with the right status; bad input is
//! a 4xx and changes nothing. Callers are authenticated by an [`Authenticator`] and see only
//! their own runs and CTAs. The handlers call one service method each.

#[cfg(feature = "lambda")]
mod apigw;
mod auth;
mod bodies;
mod console;
mod ctas;
mod error;
mod runs;
use bodies::{CreateRunBody, MessageBody};
pub mod live;
pub mod openapi;
mod stream;
mod wire;

use std::collections::HashMap;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use baton_core::cta::{Cta, CtaResponse, CtaStatus, Via};
use baton_core::error::PortError;
use baton_core::ports::{Download, attachment};
use baton_core::service::{Answerer, CreateRun, Service, ServiceError, enveloped_len};
use baton_core::timeline::{Entry, EntryBody, TurnOptions};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[cfg(feature = "lambda")]
pub use apigw::ApiGatewayJwt;
pub use auth::{Authenticator, BearerToken, Caller, TokenUser, UsersFile};
pub use error::{ApiError, JsonBody};

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
pub(crate) const MAX_PAGE: usize = 1000;

#[derive(Clone)]
pub struct AppState {
    pub service: Arc<Service>,
    pub auth: Arc<dyn Authenticator>,
    /// Whether this host keeps a connection open for `GET /runs/{id}/stream` (not behind
    /// API Gateway, which buffers responses).
    pub streams: bool,
    /// Turns true when the server stops: open streams end, so a graceful stop never waits
    /// for a console left open.
    pub stop: Option<watch::Receiver<bool>>,
    /// The live channel of the runs whose steps this process runs (their streams carry
    /// deltas and tool events); `None` where steps run elsewhere (the `api` function).
    pub live: Option<Arc<live::Hub>>,
    /// Grants watches of runs whose live channel is outside the process (on AWS, the
    /// AppSync Events API the step functions publish to).
    pub watchers: Option<live::SharedWatchers>,
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let authed = Router::new()
        .route("/runs", post(create_run).get(runs::list_runs))
        .route("/runs/{run_id}", get(get_run))
        .route("/runs/{run_id}/timeline", get(get_timeline))
        .route("/runs/{run_id}/messages", post(post_message))
        .route("/runs/{run_id}/cancel", post(cancel_run))
        .route("/runs/{run_id}/fork", post(fork_run))
        .route("/runs/{run_id}/tree", get(runs::get_tree))
        .route("/runs/{run_id}/stream", get(stream::stream_run))
        .route("/runs/{run_id}/watch", post(live::watch_run))
        .route("/runs/{run_id}/files/{file_id}", get(get_file))
        .route("/usage", get(runs::usage))
        .route("/ctas", get(ctas::list_ctas))
        .route("/ctas/{cta_id}", get(ctas::get_cta))
        .route("/ctas/{cta_id}/response", post(ctas::answer_cta))
        .route("/ctas/{cta_id}/audit", get(ctas::cta_audit))
        .route("/ctas/{cta_id}/link", post(ctas::mint_link))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .route(
            "/health",
            get(|| async {
                Json(bodies::Health {
                    status: "ok".into(),
                })
            }),
        )
        .route("/openapi.json", get(openapi_document))
        .route("/", get(console::root))
        .route("/console", get(console::index))
        .route("/console/console.js", get(console::script))
        .route("/console/runs.js", get(console::runs_script))
        .route("/console/live.js", get(console::live_script))
        .route("/console/console.css", get(console::style))
        // A one-time link is its own credential: no sign-in.
        .route("/links/{token}", get(ctas::open_link))
        .route("/links/{token}/response", post(ctas::answer_link))
        .merge(authed)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn openapi_document(State(s): State<AppState>) -> Json<Value> {
    Json(openapi::document(&s.service.catalog().agent_names()))
}

async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    match state.auth.authenticate(req.headers(), req.extensions()) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

async fn create_run(
    State(s): State<AppState>,
    Extension(Caller { id: owner, .. }): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateRunBody>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let req = CreateRun {
        prompt: body.prompt,
        agent: body.agent,
        sandbox_id: body.sandbox_id,
        github: body.github,
        metadata: body.metadata,
        context: body.context,
        on_expiry: body.on_expiry,
        budget_usd: body.budget_usd,
        watch: body.watch.unwrap_or(false),
        options: TurnOptions {
            tier: body.tier,
            visible: body.visible.unwrap_or(true),
            trigger: None,
        },
    };
    let run = s
        .service
        .requests()
        .create_run(&owner, req, key.as_deref())
        .await?;
    Ok(accepted(bodies::RunAccepted {
        run_id: run.run_id,
        status: run.status,
    }))
}

/// The `{id}` segment of a path. A segment that is not valid UTF-8 (or missing) is a JSON
/// 400 like every other refusal, not axum's plain-text rejection.
pub struct Id(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Id {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(id)| Id(id))
            .map_err(|e| ApiError::invalid(format!("invalid path: {}", e.body_text())))
    }
}

/// Two `{id}` segments of a path (a run and one of its files), refused as JSON like [`Id`].
pub struct Ids(pub String, pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Ids {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path((a, b))| Ids(a, b))
            .map_err(|e| ApiError::invalid(format!("invalid path: {}", e.body_text())))
    }
}

/// The `Idempotency-Key` header, if any: 1 to 255 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let k = v.as_bytes();
    if !k.iter().all(|b| (b'!'..=b'~').contains(b)) {
        return Err(ApiError::invalid(
            "Idempotency-Key must be visible ASCII (no spaces or control characters)",
        ));
    }
    if k.is_empty() || k.len() > 255 {
        return Err(ApiError::invalid(
            "Idempotency-Key must be 1 to 255 characters",
        ));
    }
    Ok(Some(String::from_utf8_lossy(k).into_owned()))
}

fn accepted(body: impl serde::Serialize) -> Response {
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// What a reply's body may take in Lambda's reply (at most 6 MB: the HTTP response is a
/// JSON document whose body is a string), leaving 256 KB for its headers and fields. A
/// response's timeline is cut where its entries would pass what is left of it beside the
/// run (the rest is one `GET /runs/{id}/timeline?after=` away), counted as the envelope
/// counts them ([`enveloped_len`]).
pub const REPLY_BYTES: usize = 6 * 1024 * 1024 - 256 * 1024;
/// The most timeline entries `GET /runs/{id}` reads; the rest is paged with `/timeline`.
pub const PAGE_ENTRIES: usize = 100;

/// How many of the leading entries fit in `budget` bytes of enveloped JSON (at least one:
/// an entry is at most about 1 MB, a model's whole reply).
fn page(entries: &[Entry], budget: usize) -> Result<usize, PortError> {
    let mut used = 0;
    for (n, e) in entries.iter().enumerate() {
        used += enveloped_len(&encode(e)?) + 1;
        if used > budget && n > 0 {
            return Ok(n);
        }
    }
    Ok(entries.len())
}

fn encode(v: &impl serde::Serialize) -> Result<Vec<u8>, PortError> {
    serde_json::to_vec(v).map_err(|e| PortError::broken("encode a reply", e))
}

async fn get_run(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Id(run_id): Id,
) -> Result<Response, ApiError> {
    let (service, id) = (&s.service, run_id.as_str());
    let (view, _) = runs::read_as(&s, &caller, id, |owner| async move {
        service.requests().get_run(&owner, id, PAGE_ENTRIES).await
    })
    .await?;
    // What the run and its subagents spent together; `reported` is the engine's own ledger.
    let total = view.run.total();
    let mut run = view.run;
    run.spend.reported = Default::default();
    // The budget is shown with its tree's figures, apart.
    let (ledger, budget_error) = match view.ledger {
        Some(Ok(l)) => (Some(l), None),
        Some(Err(e)) => (
            None,
            Some(format!("the budget's ledger cannot be read: {e}")),
        ),
        None => (None, None),
    };
    let budget = run
        .origin
        .budget
        .take()
        .zip(ledger)
        .map(|(b, l)| bodies::BudgetBody::new(b, l));
    // The deadline's timer is the engine's too (its working time, `workedMs`, is shown).
    run.clock.deadline_timer = None;
    // The run item holds a preview of a long answer; the whole one is in the timeline.
    if let Some(EntryBody::Assistant { text: Some(t), .. }) = view.result_entry.map(|e| e.body) {
        run.outcome.result = Some(t);
        run.outcome.result_truncated = false;
    }
    let output = run
        .outcome
        .result
        .as_deref()
        .filter(|_| run.outcome.structured)
        .and_then(|r| serde_json::from_str(baton_core::llm::unfenced(r)).ok());
    let beside = enveloped_len(&encode(&run)?)
        + enveloped_len(&encode(&total)?)
        + enveloped_len(&encode(&output)?);
    let n = page(&view.entries, REPLY_BYTES.saturating_sub(beside))?;
    let timeline_next = (view.more || n < view.entries.len())
        .then(|| n.checked_sub(1).map(|i| view.entries[i].seq))
        .flatten();
    Ok(Json(bodies::RunPage {
        run,
        output,
        total,
        budget,
        budget_error,
        timeline: &view.entries[..n],
        timeline_next,
    })
    .into_response())
}

/// `GET /ctas` without a `limit`: a page of 50 (at most `MAX_CTA_PAGE`, 100).
const DEFAULT_CTA_PAGE: usize = 50;

pub(crate) fn parse_num(q: &HashMap<String, String>, key: &str) -> Result<Option<u64>, ApiError> {
    q.get(key)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| ApiError::invalid(format!("`{key}` must be a non-negative integer")))
        })
        .transpose()
}

async fn get_timeline(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Id(run_id): Id,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let after = parse_num(&q, "after")?;
    let limit = parse_num(&q, "limit")?.map_or(MAX_PAGE, |l| (l as usize).clamp(1, MAX_PAGE));
    let (service, id) = (&s.service, run_id.as_str());
    let ((run, entries), _) = runs::read_as(&s, &caller, id, |owner| async move {
        service.requests().timeline(&owner, id, after, limit).await
    })
    .await?;
    let entries = &entries[..page(&entries, REPLY_BYTES)?];
    Ok(Json(bodies::TimelinePage {
        run_id: run.run_id,
        status: run.status,
        entries,
        next: entries.last().map(|e| e.seq).or(after),
    })
    .into_response())
}

/// The media type of `GET /runs/{id}/files/{fileId}?link=1`'s reply when it is a link.
pub const FILE_LINK_MEDIA_TYPE: &str = "application/vnd.baton.file-link+json";

/// A file a tool of the caller's run returned: its bytes, as a download (or a link to them).
async fn get_file(
    State(s): State<AppState>,
    Extension(Caller { id: owner, .. }): Extension<Caller>,
    Ids(run_id, file_id): Ids,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let as_link = match q.get("link").map(String::as_str) {
        None | Some("0") => false,
        Some("1") => true,
        Some(_) => return Err(ApiError::invalid("`link` must be 0 or 1")),
    };
    let blob = match s.service.requests().file(&owner, &run_id, &file_id).await? {
        Download::Bytes(blob) => blob,
        // A page's script cannot follow a redirect to another origin with its token, nor
        // read where it went: it asks for the link itself and navigates there.
        Download::Link(url) if as_link => {
            let mut r = Json(json!({ "url": url })).into_response();
            r.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static(FILE_LINK_MEDIA_TYPE),
            );
            return Ok(r);
        }
        // A large file on a store that links it: from the store, not through this reply.
        Download::Link(url) => {
            let mut r = StatusCode::FOUND.into_response();
            let h = r.headers_mut();
            let location = axum::http::HeaderValue::from_str(&url).map_err(|e| {
                ApiError::from(ServiceError::from(PortError::broken("file URL", e)))
            })?;
            h.insert(axum::http::header::LOCATION, location);
            h.insert(
                axum::http::header::CACHE_CONTROL,
                axum::http::HeaderValue::from_static("no-store"),
            );
            return Ok(r);
        }
    };
    let mut r = (StatusCode::OK, blob.bytes).into_response();
    let h = r.headers_mut();
    let header = |v: &str| {
        axum::http::HeaderValue::from_str(v)
            .unwrap_or_else(|_| axum::http::HeaderValue::from_static("application/octet-stream"))
    };
    h.insert(axum::http::header::CONTENT_TYPE, header(&blob.media_type));
    // The name is a plain file name (no quotes, slashes or control characters).
    let disposition = attachment(&blob.name);
    h.insert(
        axum::http::header::CONTENT_DISPOSITION,
        header(&disposition),
    );
    h.insert(
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
    Ok(r)
}

async fn post_message(
    State(s): State<AppState>,
    Extension(Caller { id: owner, .. }): Extension<Caller>,
    Id(run_id): Id,
    headers: HeaderMap,
    JsonBody(body): JsonBody<MessageBody>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let (run, queued) = s
        .service
        .requests()
        .post_message(&owner, &run_id, body.follow_up(), key.as_deref())
        .await?;
    let message = if queued {
        "the run is busy: this message starts its own turn when the turns before it end"
    } else {
        "this message starts the run's next turn"
    };
    Ok(accepted(bodies::RequestAccepted {
        run_id: run.run_id,
        status: run.status,
        accepted: true,
        queued: Some(queued),
        message: message.into(),
    }))
}

async fn fork_run(
    State(s): State<AppState>,
    Extension(Caller { id: owner, .. }): Extension<Caller>,
    Id(run_id): Id,
    headers: HeaderMap,
    JsonBody(body): JsonBody<bodies::ForkBody>,
) -> Result<Response, ApiError> {
    use baton_core::fork::Replacement;
    let key = idempotency_key(&headers)?;
    let replacement = match body.replacement {
        None => None,
        Some(bodies::ReplacementBody {
            text: Some(t),
            response: None,
        }) => Some(Replacement::Text(t)),
        Some(bodies::ReplacementBody {
            text: None,
            response: Some(r),
        }) => Some(Replacement::Response(r)),
        Some(_) => {
            return Err(ApiError::invalid(
                "`replacement` is `{\"text\": ...}` (a user turn) or `{\"response\": ...}` (a \
                 question's answer): exactly one",
            ));
        }
    };
    let run = s
        .service
        .requests()
        .fork_run(&owner, &run_id, body.at_seq, replacement, key.as_deref())
        .await?;
    let forked_from = run.origin.forked_from.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            "this `Idempotency-Key` started a run that is not a fork",
        )
    })?;
    Ok(accepted(bodies::ForkAccepted {
        run_id: run.run_id,
        status: run.status,
        forked_from,
    }))
}

async fn cancel_run(
    State(s): State<AppState>,
    Extension(Caller { id: owner, .. }): Extension<Caller>,
    Id(run_id): Id,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let run = s
        .service
        .requests()
        .cancel(&owner, &run_id, key.as_deref())
        .await?;
    Ok(accepted(bodies::RequestAccepted {
        run_id: run.run_id,
        status: run.status,
        accepted: true,
        queued: None,
        message: "the run ends cancelled, with its pending CTAs and subagents, when its turn \
            in the run's queue comes; if the run ends on its own first, it keeps that outcome \
            and its timeline says the cancel came too late (notice `cancel_too_late`)"
            .into(),
    }))
}

/// Connections the kernel completes before the server accepts them. tokio's default (1,024)
/// overflowed when 1,000 clients connected at once while the worker kept both cores busy
/// (`TcpExtListenOverflows`): dropped handshakes are retried by the client after 1, 3, 7 and
/// 15 s, so a burst of run creations took up to 15 s. The kernel caps it at
/// `net.core.somaxconn` (4,096 on current kernels).
const LISTEN_BACKLOG: u32 = 8192;

fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted server can bind while old connections linger.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `app` on `addr` until `stop` turns true; returns the bound address (so `addr` may
/// name port 0) and the server's task.
pub async fn serve(
    app: Router,
    addr: SocketAddr,
    stop: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, JoinHandle<std::io::Result<()>>)> {
    let bound = Bound::bind(addr)?;
    let addr = bound.addr;
    Ok((addr, bound.serve(app, stop)))
}

/// A port bound and not yet served: a host learns its address (its links' base) and sets
/// everything up before the first request is accepted. The kernel queues connections made
/// meanwhile; none is answered by a service half set up.
pub struct Bound {
    pub addr: SocketAddr,
    listener: tokio::net::TcpListener,
}

impl Bound {
    pub fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = listen(addr)?;
        Ok(Self {
            addr: listener.local_addr()?,
            listener,
        })
    }

    /// Serves `app` until `stop` turns true.
    pub fn serve(
        self,
        app: Router,
        mut stop: watch::Receiver<bool>,
    ) -> JoinHandle<std::io::Result<()>> {
        tokio::spawn(async move {
            axum::serve(wire::JsonListener(self.listener), app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        })
    }
}
