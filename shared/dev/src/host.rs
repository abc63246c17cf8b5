//! `baton dev`: the API and the worker in one process on the embedded store.
//!
//! `baton dev` runs this; so do the end-to-end tests (which stop and start it again to
//! prove a parked run survives a restart).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use baton_api::{ApiError, AppState, Authenticator, BearerToken};
use baton_core::agent::Catalog;
use baton_core::error::PortError;
use baton_core::links::Links;
use baton_core::llm::Llm;
use baton_core::ports::Clock;
use baton_core::service::Service;

use crate::worker::{Worker, WorkerOptions};
use baton_local::{LocalStore, local_deps};

/// The owner of every run in local mode (one shared token, one user).
pub const LOCAL_OWNER: &str = "local";

#[derive(Clone)]
pub struct LocalOptions {
    pub data_dir: PathBuf,
    pub addr: SocketAddr,
    /// `None`: reuse the token stored in the data dir, or make one and store it.
    pub token: Option<String>,
    pub llm: Arc<dyn Llm>,
    pub catalog: Arc<Catalog>,
    pub clock: Arc<dyn Clock>,
    pub worker: WorkerOptions,
    /// The key one-time answer links are signed with; `None`: the data dir's own, made
    /// once and kept there.
    pub link_key: Option<String>,
    /// Where links point (default: this server's own address).
    pub public_url: Option<String>,
    /// How many bytes of recently stepped timelines the worker keeps in memory
    /// (`Config::cache_bytes` with [`machine_memory_mb`]).
    pub cache_bytes: usize,
    /// Where committed steps' spans are exported (`OTEL_EXPORTER_OTLP_ENDPOINT`): every
    /// [`TRACE_FLUSH_EVERY`], and what is left when the server stops.
    pub traces: Option<Arc<baton_telemetry::Traces>>,
    /// Each owner's quotas (`BATON_MAX_ACTIVE_RUNS_PER_OWNER`,
    /// `BATON_MAX_DAILY_COST_USD_PER_OWNER`).
    pub quotas: baton_core::service::Quotas,
    /// The users of `--users FILE`: each token its user's, with its groups (the server's own
    /// token stays its owner's).
    pub users: Vec<baton_api::TokenUser>,
    /// The SMTP server questions' e-mail goes through (`BATON_SMTP_URL`): needed when the
    /// agents file has an e-mail channel.
    pub smtp_url: Option<String>,
}

impl LocalOptions {
    /// `baton dev` on `data_dir`, on loopback (any free port), with the data directory's
    /// own token and link key, the system clock, the worker's defaults, the default cache
    /// budget, no traces and no quotas. Set the rest on what it returns.
    pub fn new(data_dir: impl Into<PathBuf>, llm: Arc<dyn Llm>, catalog: Arc<Catalog>) -> Self {
        Self {
            data_dir: data_dir.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: None,
            llm,
            catalog,
            clock: Arc::new(baton_core::ports::SystemClock),
            worker: WorkerOptions::default(),
            link_key: None,
            public_url: None,
            cache_bytes: baton_core::service::DEFAULT_CACHE_BYTES,
            traces: None,
            quotas: Default::default(),
            users: Vec::new(),
            smtp_url: None,
        }
    }
}

/// The machine's memory, in MB (Linux's `/proc/meminfo`; `None` elsewhere).
pub fn machine_memory_mb() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024)
}

/// A running local server.
pub struct LocalServer {
    pub addr: SocketAddr,
    pub token: String,
    /// True when the token was made by this start (the caller should print it).
    pub token_created: bool,
    pub store: LocalStore,
    pub service: Arc<Service>,
    stop: watch::Sender<bool>,
    server: JoinHandle<std::io::Result<()>>,
    worker: JoinHandle<()>,
    /// The task that exports spans, flushing what is left when the server stops.
    exports: Option<JoinHandle<()>>,
    /// The data directory's lock, held while this server lives ([`lock_data_dir`]).
    _lock: std::fs::File,
}

/// How often `baton dev` sends the spans its steps recorded (with `OTEL_EXPORTER_OTLP_ENDPOINT`).
pub const TRACE_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The token file `baton` clients read when `BATON_TOKEN` is not set.
/// Writes `text` to a file its user alone may read (0600, made so if it was not).
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = baton_local::store::create_private_file(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    file.set_len(0)?;
    file.write_all(text.as_bytes())
}

pub fn token_path(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("token")
}

impl LocalServer {
    pub async fn start(opts: LocalOptions) -> Result<Self, StartError> {
        // Before the store is opened (and perhaps migrated): one server per data directory.
        let lock = lock_data_dir(&opts.data_dir)?;
        let store = LocalStore::open(&opts.data_dir)?;
        let (token, token_created) = match opts.token {
            Some(t) if !t.trim().is_empty() => (t, false),
            _ => match store.get_meta("token").await? {
                Some(t) => (t, false),
                None => {
                    let t = format!("btn_{}", uuid::Uuid::new_v4().simple());
                    store.set_meta("token", &t).await?;
                    (t, true)
                }
            },
        };
        write_private(&token_path(&opts.data_dir), &token).map_err(StartError::Io)?;
        // Everything is set up before the first request is served and the first step is
        // taken: the port is bound first (its address is the links' base), then the service
        // is built with its links, then the worker, and only then the server.
        let bound = baton_api::Bound::bind(opts.addr).map_err(StartError::Io)?;
        let addr = bound.addr;
        // (The crash suite holds a start here, its port bound, to show nothing is served.)
        let _ = baton_core::failpoint::pass("host.before_links").await;
        let key = match opts.link_key {
            Some(k) => k,
            None => link_key(&store).await?,
        };
        let base = opts.public_url.unwrap_or_else(|| format!("http://{addr}"));
        let links = Links::new(key.as_bytes(), &base)
            .inspect_err(|e| warn!(error = %e, "one-time answer links are off"))
            .ok();
        let live = baton_api::live::Hub::new();
        let metrics = Arc::new(baton_telemetry::Metrics::prometheus());
        let service_catalog = opts.catalog.clone();
        let mut service = Service::builder(local_deps(&store, opts.llm, opts.clock), opts.catalog)
            .cache_bytes(opts.cache_bytes)
            .quotas(opts.quotas)
            .live(Some(live.clone()))
            .links(links)
            .notifier(notifier()?)
            .observer(metrics.clone());
        if let Some(mailer) = mailer(opts.smtp_url.as_deref(), &service_catalog)? {
            service = service.mailer(mailer);
        }
        if let Some(traces) = &opts.traces {
            service = service.observer(traces.clone());
        }
        let service = Arc::new(service.build());
        let worker = Worker::new(service.clone(), store.clone(), opts.worker);
        worker.sweep().await?;
        let (stop, stop_rx) = watch::channel(false);
        let exports = opts.traces.map(|t| export_spans(t, stop_rx.clone()));
        let worker = tokio::spawn(worker.run(stop_rx.clone()));

        let auth: Arc<dyn Authenticator> =
            Arc::new(BearerToken::new(token.clone(), LOCAL_OWNER).with_users(opts.users.clone()));
        let app = baton_api::router(AppState {
            service: service.clone(),
            auth: auth.clone(),
            streams: true,
            stop: Some(stop_rx.clone()),
            live: Some(live),
            watchers: None,
        })
        .merge(events_route(store.clone(), auth.clone()))
        .merge(metrics_route(metrics, auth));
        let server = bound.serve(app, stop_rx);
        info!(%addr, data = %opts.data_dir.display(), "baton dev listening");
        Ok(Self {
            addr,
            token,
            token_created,
            store,
            service,
            stop,
            server,
            worker,
            exports,
            _lock: lock,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving and working, and waits for both to finish.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
        let _ = self.worker.await;
        if let Some(task) = self.exports {
            let _ = task.await;
        }
    }

    /// Waits for Ctrl-C (or SIGTERM), then shuts down.
    pub async fn serve_until_signal(self) {
        stop_signal().await;
        self.shutdown().await;
    }
}

/// Waits for Ctrl-C or SIGTERM: what a terminal, a process manager or `kill` sends to
/// ask a server to stop gracefully.
pub async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} },
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// `GET /events?after=<position>&limit=<n>`: the events the embedded bus recorded, for UIs
/// and scripts polling a local server (on AWS, subscribe to the EventBridge bus instead).
fn events_route(store: LocalStore, auth: Arc<dyn Authenticator>) -> axum::Router {
    use axum::extract::Query;
    use axum::http::HeaderMap;
    use axum::response::{IntoResponse, Response};
    use std::collections::HashMap;

    let handler = move |headers: HeaderMap, Query(q): Query<HashMap<String, String>>| {
        let (store, auth) = (store.clone(), auth.clone());
        async move {
            let run = async || -> Result<serde_json::Value, ApiError> {
                auth.authenticate(&headers, &axum::http::Extensions::new())?;
                let num = |k: &str, default: i64| -> Result<i64, ApiError> {
                    q.get(k).map_or(Ok(default), |v| {
                        v.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                            ApiError::invalid(format!("`{k}` must be a non-negative integer"))
                        })
                    })
                };
                let after = num("after", 0)?;
                let limit = num("limit", 100)?.clamp(1, 1000) as usize;
                let events = store.events_after(after, limit).await?;
                let next = events.last().map_or(after, |(p, _)| *p);
                let list: Vec<serde_json::Value> = events
                    .into_iter()
                    .map(|(position, e)| {
                        serde_json::json!({"position": position, "id": e.id, "detailType": e.detail_type,
                            "detail": e.detail, "time": e.time})
                    })
                    .collect();
                Ok(serde_json::json!({"events": list, "next": next}))
            };
            let out: Response = match run().await {
                Ok(v) => axum::Json(v).into_response(),
                Err(e) => e.into_response(),
            };
            out
        }
    };
    axum::Router::new().route(
        "/events",
        axum::routing::get(handler).fallback(|| async { ApiError::method_not_allowed() }),
    )
}

/// Sends the spans `traces` recorded every [`TRACE_FLUSH_EVERY`], and what is left once
/// `stop` turns.
pub(crate) fn export_spans(
    traces: Arc<baton_telemetry::Traces>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TRACE_FLUSH_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => traces.flush(TRACE_FLUSH_EVERY).await,
                _ = stop.changed() => break,
            }
        }
        traces.flush(TRACE_FLUSH_EVERY).await;
    })
}

/// `GET /metrics`: committed steps' counters by agent and model, in the Prometheus text
/// format (OpenMetrics), for a scraper that sends the server's token.
pub(crate) fn metrics_route(
    metrics: Arc<baton_telemetry::Metrics>,
    auth: Arc<dyn Authenticator>,
) -> axum::Router {
    use axum::http::{HeaderMap, header};
    use axum::response::IntoResponse;

    let handler = move |headers: HeaderMap| {
        let (metrics, auth) = (metrics.clone(), auth.clone());
        async move {
            match auth.authenticate(&headers, &axum::http::Extensions::new()) {
                Ok(_) => (
                    [(header::CONTENT_TYPE, baton_telemetry::Metrics::CONTENT_TYPE)],
                    metrics.prometheus_text(),
                )
                    .into_response(),
                Err(e) => e.into_response(),
            }
        }
    };
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(handler).fallback(|| async { ApiError::method_not_allowed() }),
    )
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] PortError),
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error(transparent)]
    Template(#[from] crate::functions::TemplateError),
    /// Another server holds the data directory.
    #[error("{0}")]
    Busy(String),
}

/// The name of the lock file in a data directory.
pub const LOCK_FILE: &str = "baton.lock";

/// Takes the data directory's exclusive lock (`baton.lock`, the holder's process id in it),
/// held until the returned file is dropped or the process ends, however it ends (the OS lets
/// go of it). Two servers on one directory would each take the queue's messages and run the
/// same tool calls again: a second one refuses to start, naming the first.
pub fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File, StartError> {
    use std::io::{Read, Seek, Write};
    // For its user's eyes only, as everything the directory holds.
    baton_local::store::create_private(dir).map_err(StartError::Io)?;
    let mut file =
        baton_local::store::create_private_file(&dir.join(LOCK_FILE)).map_err(StartError::Io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "another process".to_owned(),
                pid => format!("process {pid}"),
            };
            return Err(StartError::Busy(format!(
                "the data directory {} is in use by another Baton server ({holder}): one \
                 server per data directory; stop that one, or give this one another --data",
                dir.display()
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(StartError::Io(e)),
    }
    file.set_len(0).map_err(StartError::Io)?;
    file.rewind().map_err(StartError::Io)?;
    file.write_all(std::process::id().to_string().as_bytes())
        .map_err(StartError::Io)?;
    Ok(file)
}

/// The data dir's own link key: made once (two v4 UUIDs' random bits) and kept in the store,
/// so links stay valid across restarts.
async fn link_key(store: &LocalStore) -> Result<String, StartError> {
    if let Some(k) = store.get_meta("link_key").await? {
        return Ok(k);
    }
    let k = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    store.set_meta("link_key", &k).await?;
    Ok(k)
}

/// What `baton dev` sends questions' e-mail with: the SMTP server at `smtp_url`, needed
/// when the agents file has an e-mail channel.
fn mailer(
    smtp_url: Option<&str>,
    catalog: &baton_core::agent::Catalog,
) -> Result<Option<Arc<dyn baton_core::ports::Mailer>>, StartError> {
    let channels = catalog.email_channels();
    match smtp_url {
        Some(url) => crate::mail::SmtpMailer::new(url)
            .map(|m| Some(Arc::new(m) as Arc<dyn baton_core::ports::Mailer>))
            .map_err(|e| StartError::Io(std::io::Error::other(e))),
        None if !channels.is_empty() => Err(StartError::Io(std::io::Error::other(format!(
            "the agents file's e-mail channels ({}) need an SMTP server on baton dev: set \
             BATON_SMTP_URL (e.g. smtp://127.0.0.1:1025)",
            channels
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )))),
        None => Ok(None),
    }
}

/// How `baton dev` sends questions' notifications: as a function does.
pub(crate) fn notifier() -> Result<Arc<dyn baton_core::ports::Notifier>, StartError> {
    baton_lambda::notifier::HttpNotifier::new()
        .map(|n| Arc::new(n) as Arc<dyn baton_core::ports::Notifier>)
        .map_err(|e| StartError::Io(std::io::Error::other(e)))
}
