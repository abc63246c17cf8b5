//! Baton on one machine's disk: the embedded adapter.
//!
//! | module | what |
//! |---|---|
//! | [`store`] | `LocalStore`: every port in one SQLite file, durable on disk |
//! | [`blobs`] | `FileBlobs`: tool files beside it |
//!
//! [`local_deps`] hands them to the core's service as its ports; `baton dev` (`baton-dev`) hosts it.

pub mod blobs;
pub mod store;

use std::sync::Arc;

use baton_core::llm::Llm;
use baton_core::ports::Clock;
use baton_core::service::Deps;

pub use store::LocalStore;

/// The ports over the embedded store (with the host's model and clock): what a host builds
/// its service with (`Service::builder`).
pub fn local_deps(store: &LocalStore, llm: Arc<dyn Llm>, clock: Arc<dyn Clock>) -> Deps {
    Deps {
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
    }
}
