//! Baton on one machine's disk: the embedded adapter.
//!
//! | module | what |
//! |---|---|
//! | [`store`] | `LocalStore`: every port in one SQLite file, durable on disk |
//! | [`blobs`] | `FileBlobs`: tool files beside it |
//!
//! [`local_service`] wires them into the core's service; `baton dev` (`baton-dev`) hosts it.

pub mod blobs;
pub mod store;

use std::sync::Arc;

use baton_core::agent::Catalog;
use baton_core::llm::Llm;
use baton_core::ports::Clock;
use baton_core::service::{Deps, Service};

pub use store::LocalStore;

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
        blobs: Arc::new(blobs::FileBlobs::new(
            store.path().parent().unwrap_or(std::path::Path::new(".")),
        )),
        llm,
        clock,
        sending_store: Some(Arc::new(store.clone())),
    };
    Arc::new(Service::new(deps, catalog))
}
