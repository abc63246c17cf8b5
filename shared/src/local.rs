//! The local host: the API and the worker in one process on the embedded store.
//!
//! `baton dev` runs this; so do the end-to-end tests (which stop and start it again to
//! prove a parked run survives a restart).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

use crate::adapters::local::LocalStore;
use crate::agent::Catalog;
use crate::api::{self, AppState, BearerToken};
use crate::error::PortError;
use crate::llm::Llm;
use crate::ports::Clock;
use crate::service::{Deps, Service};
use crate::worker::{Worker, WorkerOptions};

/// The owner of every run in local mode (one shared token, one user).
pub const LOCAL_OWNER: &str = "local";

pub struct LocalOptions {
    pub data_dir: PathBuf,
    pub addr: SocketAddr,
    /// `None`: reuse the token stored in the data dir, or make one and store it.
    pub token: Option<String>,
    pub llm: Arc<dyn Llm>,
    pub catalog: Arc<Catalog>,
    pub clock: Arc<dyn Clock>,
    pub worker: WorkerOptions,
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
}

/// Builds the service over the embedded store.
pub fn local_service(
    store: &LocalStore,
    llm: Arc<dyn Llm>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
) -> Arc<Service> {
    let deps = Deps {
        store: Arc::new(store.clone()),
        queue: Arc::new(store.clone()),
        bus: Arc::new(store.clone()),
        scheduler: Arc::new(store.clone()),
        llm,
        clock,
    };
    Arc::new(Service::new(deps, catalog))
}

/// The token file `baton` clients read when `BATON_TOKEN` is not set.
pub fn token_path(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("token")
}

impl LocalServer {
    pub async fn start(opts: LocalOptions) -> Result<Self, StartError> {
        let store = LocalStore::open(&opts.data_dir)?;
        let (token, token_created) = match opts.token {
            Some(t) if !t.trim().is_empty() => (t, false),
            _ => match store.get_meta("token")? {
                Some(t) => (t, false),
                None => {
                    let t = format!("btn_{}", uuid::Uuid::new_v4().simple());
                    store.set_meta("token", &t)?;
                    (t, true)
                }
            },
        };
        std::fs::write(token_path(&opts.data_dir), &token).map_err(StartError::Io)?;
        let service = local_service(&store, opts.llm, opts.catalog, opts.clock);
        let worker = Worker::new(service.clone(), store.clone(), opts.worker);
        worker.sweep().await?;
        let (stop, stop_rx) = watch::channel(false);
        let worker = tokio::spawn(worker.run(stop_rx.clone()));

        let app = api::router(AppState {
            service: service.clone(),
            auth: Arc::new(BearerToken::new(token.clone(), LOCAL_OWNER)),
        });
        let listener = tokio::net::TcpListener::bind(opts.addr)
            .await
            .map_err(StartError::Io)?;
        let addr = listener.local_addr().map_err(StartError::Io)?;
        let mut rx = stop_rx;
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.wait_for(|s| *s).await;
                })
                .await
        });
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
    }

    /// Waits for Ctrl-C (or SIGTERM), then shuts down.
    pub async fn serve_until_signal(self) {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = ctrl_c.await;
                        return self.shutdown().await;
                    }
                };
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        self.shutdown().await;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] PortError),
    #[error("{0}")]
    Io(#[source] std::io::Error),
}
