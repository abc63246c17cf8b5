//! The `baton dev` hosts, and the loops that feed them.
//!
//! | module | what |
//! |---|---|
//! | [`host`] | `baton dev`: the API and the worker in one process, on the embedded store |
//! | [`worker`] | pumps the embedded queue into the service and fires due timers |
//! | [`aws_host`] | `baton dev --aws`: the API and the Lambda handlers over AWS APIs |
//! | [`event_source`] | polls SQS into the Lambda handlers, as Lambda's event source mappings do |
//! | [`functions`] | each function's timeout, memory and mappings, from `template.yaml` |

pub mod aws_host;
pub mod event_source;
pub mod functions;
pub mod host;
pub mod loops;
pub mod mail;
pub mod worker;

pub use aws_host::{AwsDevOptions, AwsDevServer};
pub use host::{LOCAL_OWNER, LocalOptions, LocalServer, StartError, machine_memory_mb, token_path};
pub use worker::{Worker, WorkerOptions};
