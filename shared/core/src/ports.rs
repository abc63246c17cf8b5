//! The ports: small traits the service talks to, one per kind of infrastructure.
//!
//! The embedded adapter (`baton-local`) and the AWS adapters (`baton-aws`) implement the same traits
//! and pass the same contract tests. Every method is idempotent where the design needs it:
//! a message or an effect performed twice must not do anything twice.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::cta::{Cta, CtaChange, CtaStatus, Settlement};
use crate::error::PortError;
use crate::message::{Effect, Event, StepMessage, Transition};
use crate::run::{LastError, Run};
use crate::timeline::Entry;

/// A run with its outstanding outbox: effects committed but not yet marked performed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub run: Run,
    pub outbox: Vec<Effect>,
}

/// The outcome of creating a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    Created,
    /// A run with the same owner and idempotency key exists already.
    Existing(Box<RunRecord>),
}

/// The outcome of settling a CTA.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// This call moved the CTA out of `pending`.
    Won(Cta),
    /// Someone else did first; here is the CTA as it is.
    Lost(Cta),
    NotFound,
}

/// The outcome of a change to a CTA's record ([`crate::cta::CtaChange`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Changed {
    /// Written; `settled`: this change moved it out of `pending`.
    Applied {
        cta: Cta,
        settled: bool,
    },
    /// Nothing to write (the same person approving again): the CTA as it is.
    Unchanged(Cta),
    /// Not applicable to the CTA as it is (no longer pending).
    Refused(Cta),
    NotFound,
}

/// Runs, timelines and CTAs, with a conditional commit.
/// The timers of `runs` (not ended) due before `before`, soonest first, at most `limit`.
pub fn due_timers(runs: &[crate::run::Run], before: DateTime<Utc>, limit: usize) -> Vec<DueTimer> {
    let mut out: Vec<DueTimer> = runs
        .iter()
        .filter(|r| !r.status.is_terminal())
        .flat_map(|r| {
            r.clock
                .timers
                .iter()
                .filter(|(_, at)| **at < before)
                .map(|(id, at)| DueTimer {
                    run_id: r.run_id.clone(),
                    timer_id: id.clone(),
                    due: *at,
                })
        })
        .collect();
    out.sort_by_key(|t| t.due);
    out.truncate(limit);
    out
}

/// A run's timer past its time ([`Sweep::overdue_timers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueTimer {
    pub run_id: String,
    pub timer_id: String,
    pub due: DateTime<Utc>,
}

mod store;
pub use store::{Ctas, FollowUps, Ledgers, RunReads, RunWrites, Store, StoreParts, Sweep};

/// What a top-level run must fit in to start (or start again): its owner's quotas.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Admission {
    /// It takes one of the owner's active-run slots, of which there are this many.
    pub active_runs: Option<u32>,
    /// Its owner spent less than `limit_usd` on UTC day `day`.
    pub daily_cost: Option<DailyCost>,
}

/// [`Admission::daily_cost`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DailyCost {
    pub limit_usd: f64,
    pub day: chrono::NaiveDate,
}

impl Admission {
    /// Whether it asks anything of the store.
    pub fn is_open(&self) -> bool {
        self.active_runs.is_none() && self.daily_cost.is_none()
    }
}

/// Which CTAs [`Ctas::list_ctas`] reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CtaQuery {
    pub status: Option<CtaStatus>,
    /// Only those under this top-level run (its own and its subagents', at any depth).
    pub root_run_id: Option<String>,
    /// Those after this one (the last of the previous page).
    pub after: Option<CtaPosition>,
    pub limit: usize,
}

/// Which of an owner's top-level runs [`RunReads::list_runs`] reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// Those after this one (the last of the previous page).
    pub after: Option<RunPosition>,
    /// Only those created at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only those created before this time.
    pub until: Option<DateTime<Utc>>,
    pub limit: usize,
}

impl RunQuery {
    /// A page of `limit` runs after `after`, whenever created.
    pub fn page(after: Option<RunPosition>, limit: usize) -> Self {
        Self {
            after,
            limit,
            ..Self::default()
        }
    }
}

/// A page of [`RunReads::list_runs`] or [`RunReads::list_descendants`]: the runs read, and where
/// the next page starts when the read stopped at its limit (more may follow). That is the
/// last run *listed*, which may not be in `runs`: a listing whose run is gone (a DynamoDB
/// index entry written ahead of a commit that never came, or a purge half done) is left
/// out of the page but still moves it on, so the list does not end there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunPage {
    pub runs: Vec<Run>,
    pub next: Option<RunPosition>,
}

/// Where a top-level run is in the order [`RunReads::list_runs`] pages in: newest first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunPosition {
    #[serde(rename = "t")]
    pub created_at: DateTime<Utc>,
    #[serde(rename = "r")]
    pub run_id: String,
}

impl RunPosition {
    pub fn of(run: &Run) -> Self {
        Self {
            created_at: run.created_at,
            run_id: run.run_id.clone(),
        }
    }
}

/// Where a CTA is in the order pages are read in: by status (by name), then oldest first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CtaPosition {
    #[serde(rename = "s")]
    pub status: CtaStatus,
    #[serde(rename = "t")]
    pub created_at: DateTime<Utc>,
    #[serde(rename = "c")]
    pub cta_id: String,
}

impl CtaPosition {
    pub fn of(cta: &Cta) -> Self {
        Self {
            status: cta.status,
            created_at: cta.created_at,
            cta_id: cta.cta_id.clone(),
        }
    }
}

/// A store that is also its host's queue (the embedded adapter): it commits a transition
/// whose effects are all step messages and enqueues them in the same transaction
/// (deduplicated by id, as [`Queue::send`] does), leaving no outbox. One write instead of a
/// commit and a send, and no crash window between them.
#[async_trait::async_trait]
pub trait SendingStore: Send + Sync {
    async fn commit_sending(
        &self,
        expected_version: u64,
        transition: &Transition,
    ) -> Result<(), PortError>;
}

/// Sends step messages to runs' ordered groups (FIFO per run id, deduplicated by id).
#[async_trait::async_trait]
pub trait Queue: Send + Sync {
    async fn send(&self, messages: &[StepMessage]) -> Result<(), PortError>;

    /// Whether more than the message being handled is in `run_id`'s group (a cancel, an
    /// answer, a follow-up sent meanwhile), when the queue can tell: a run's steps in a row
    /// end then, so that what waits comes before its next step. An SQS FIFO group cannot be
    /// looked into (`false`): there a row ends at its bounds.
    async fn waiting(&self, _run_id: &str) -> Result<bool, PortError> {
        Ok(false)
    }
}

/// Publishes events for UIs and other systems. Consumers deduplicate on `Event::id`.
#[async_trait::async_trait]
pub trait Bus: Send + Sync {
    async fn publish(&self, events: &[Event]) -> Result<(), PortError>;
}

/// Sends a question's notifications: one HTTP `POST` of a JSON body (a webhook's, Slack's).
#[async_trait::async_trait]
pub trait Notifier: Send + Sync {
    /// The receiver's status when it answered 2xx; otherwise why not (its status, or the
    /// connection's failure), in a line.
    async fn post(
        &self,
        url: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
    ) -> Result<u16, String>;
}

/// One e-mail: a question told to a recipient through an e-mail channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mail {
    pub from: String,
    pub to: String,
    pub subject: String,
    /// Plain text.
    pub text: String,
    /// The delivery it is (`Baton-Delivery`), which a transport that can says in a header.
    pub delivery_id: String,
}

/// Sends a question's e-mails: through SES on AWS, an SMTP server on `baton dev`.
#[async_trait::async_trait]
pub trait Mailer: Send + Sync {
    /// What the service said when it took the message (its message id, its reply);
    /// otherwise why not, in a line.
    async fn send(&self, mail: &Mail) -> Result<String, String>;
}

/// One-time timers: CTA expiries and runs' own timers. Scheduling an existing name and
/// unscheduling a missing one both succeed.
#[async_trait::async_trait]
pub trait Scheduler: Send + Sync {
    /// Sets the one-time timer `timer_id` to fire for `run_id` at `at`: a CTA's expiry (the
    /// timer is named by the CTA's id) or a run's own timer (its id starts with
    /// [`crate::message::TIMER_PREFIX`]: a plan step's timeout, a run's deadline).
    async fn schedule(
        &self,
        timer_id: &str,
        run_id: &str,
        at: DateTime<Utc>,
    ) -> Result<(), PortError>;
    async fn unschedule(&self, timer_id: &str) -> Result<(), PortError>;
}

/// A file's bytes and what to serve them as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub name: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// The files tools return, by key `<runId>/<fileId>` (S3 on AWS, the data folder locally).
/// Putting a key again with the same bytes is harmless: a retried step does.
#[async_trait::async_trait]
pub trait Blobs: Send + Sync {
    async fn put(&self, key: &str, blob: &Blob) -> Result<(), PortError>;
    async fn get(&self, key: &str) -> Result<Option<Blob>, PortError>;

    /// The file at `key` as a download: its bytes or, above `inline_max` bytes where the
    /// store can, a URL that serves them for `ttl` (a host whose replies are limited in size
    /// sends large files from the store, not through itself). By default, its bytes.
    async fn download(
        &self,
        key: &str,
        inline_max: u64,
        ttl: std::time::Duration,
    ) -> Result<Option<Download>, PortError> {
        let _ = (inline_max, ttl);
        Ok(self.get(key).await?.map(Download::Bytes))
    }
}

/// A `Content-Disposition` that saves a file as `name` (a plain file name; anything not ASCII
/// becomes `_`).
pub fn attachment(name: &str) -> String {
    format!(
        "attachment; filename=\"{}\"",
        name.replace(|c: char| !c.is_ascii() || c == '"' || c == '\\', "_")
    )
}

/// What [`Blobs::download`] gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Download {
    Bytes(Blob),
    /// A URL that serves the bytes (with the file's name and media type) until it expires.
    Link(String),
}

/// The time, passed in so tests can move it.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock tests move by hand.
#[derive(Debug)]
pub struct ManualClock(std::sync::Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self(std::sync::Mutex::new(start))
    }
    pub fn advance(&self, by: chrono::Duration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The format of the data this release writes (runs, timelines, CTAs, outboxes, timers, on
/// either store). A store records the format it was written in; a release reads every
/// format from [`OLDEST_STORE_FORMAT`] to this one (a run may wait a year for its answer,
/// across many upgrades: `tests/fixtures/releases/` holds one store per release, and a
/// test finishes each one's runs with this code), and refuses to start on a store a newer
/// release wrote ([`check_store_format`]) rather than misread it.
///
/// | format | written by |
/// |---|---|
/// | 1 | 0.1.0 |
/// | 2 | DynamoDB: a run item's `body` and `ob` (outbox) packed as bytes (`baton-codec`), not JSON strings |
/// | 3 | DynamoDB: a run item's tail (`tl`, `tf`) holds its latest commits' entries until a segment takes them |
pub const STORE_FORMAT: u32 = 3;
/// The oldest format this release reads.
pub const OLDEST_STORE_FORMAT: u32 = 1;

/// The store format `raw` records, or an error that says what was found instead (a store
/// no Baton wrote, or a damaged one, is not read as some format it is not).
pub fn parse_store_format(raw: &str, store: &str) -> Result<u32, PortError> {
    raw.trim().parse().map_err(|_| {
        PortError::broken(
            format!(
                "{store} records its store format as {raw:?}, which is not a format number: \
                 a Baton store records a whole number ({OLDEST_STORE_FORMAT} to {STORE_FORMAT} \
                 for this release); it was damaged, or no Baton wrote it"
            ),
            std::io::Error::other("store format"),
        )
    })
}

/// Whether this release may use a store whose recorded format is `found` (`None`: new,
/// or written before formats were recorded, which is format 1).
pub fn check_store_format(found: Option<u32>, store: &str) -> Result<(), PortError> {
    match found {
        Some(f) if f > STORE_FORMAT => Err(PortError::broken(
            format!(
                "{store} was written by a newer Baton (store format {f}); this release reads \
                 formats {OLDEST_STORE_FORMAT} to {STORE_FORMAT}: run the release that wrote it, \
                 or a newer one"
            ),
            std::io::Error::other("store format"),
        )),
        Some(f) if f < OLDEST_STORE_FORMAT => Err(PortError::broken(
            format!(
                "{store} is in store format {f}, older than this release reads \
                 ({OLDEST_STORE_FORMAT} to {STORE_FORMAT}): upgrade through a release that reads it first"
            ),
            std::io::Error::other("store format"),
        )),
        _ => Ok(()),
    }
}
