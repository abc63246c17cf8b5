//! Baton on one machine: the embedded adapter, its worker, and the `baton dev` hosts.
//!
//! | module | what |
//! |---|---|
//! | [`store`] | `LocalStore`: every port in one SQLite file, durable on disk |
//! | [`worker`] | pumps the embedded queue into the service and fires due timers |
//! | [`host`] | `baton dev`: the API and the worker in one process |
//! | [`aws_host`] | `baton dev --aws`: the API and the Lambda handlers over AWS APIs |

pub mod aws_host;
pub mod blobs;
pub mod host;
pub mod store;
pub mod worker;

pub use aws_host::{AwsDevOptions, AwsDevServer};
pub use host::{LOCAL_OWNER, LocalOptions, LocalServer, StartError, local_service, token_path};
pub use store::LocalStore;
pub use worker::{Worker, WorkerOptions};
