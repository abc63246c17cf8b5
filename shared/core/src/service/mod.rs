//! The service: the only place that loads a run, calls the engine, commits with a version
//! check, and performs the committed effects through the ports.
//!
//! A host builds its service once, with everything it works with ([`Service::builder`]),
//! then calls one method each: the HTTP API calls the request methods (`requests.rs`), queue
//! consumers call [`Steps::consume`] (`consume.rs`, which steps through
//! [`Steps::handle`] in `steps.rs` and answers with the one [`Verdict`] a host maps to its
//! queue's terms), timers call [`Steps::fire_timer`].

mod cache;
mod consume;
mod ctas;
mod follow_ups;
mod fork;
mod notify;
mod outbox;
mod pages;
mod requests;
mod step_images;
mod step_world;
mod steps;
mod sweep;

pub use crate::config::{DEFAULT_CACHE_BYTES, budget_for};
pub use consume::{Delivery, ROW_FOR, STEPS_IN_A_ROW, SWEEP_EVENT, StepDeadline, Verdict};
pub use ctas::{Answerer, CTA_PAGE_BYTES, LINK_RESPONDER, MAX_CTA_PAGE};
use pages::{cut_page, decode_cursor, encode_cursor};
pub use requests::{MAX_RUN_PAGE, MAX_TREE_RUNS, RUN_PAGE_BYTES, RunFilter, RunTree};
pub use steps::{DEAD_LETTER_CODE, MAX_OUTAGE_REQUEUES};
pub use sweep::{PURGE_CHUNK, SWEEP_BUDGET};

/// The bytes a JSON document takes as the body string of Lambda's reply (a JSON document
/// itself): one more for each quote and backslash, escaped again there. A page that must fit
/// Lambda's 6 MB is measured so (a text of quotes takes twice its JSON there).
pub fn enveloped_len(json: &[u8]) -> usize {
    json.len() + json.iter().filter(|&&b| b == b'"' || b == b'\\').count()
}

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::agent::Catalog;
use crate::cta::Cta;
use crate::error::PortError;
use crate::llm::Llm;
use crate::ports::{Bus, Clock, Queue, Scheduler, Store};
use crate::run::{ExpiryPolicy, Run, RunStatus};
use crate::timeline::{Entry, TurnOptions};

/// The ports a service works through, built once per process.
#[derive(Clone)]
pub struct Deps {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub bus: Arc<dyn Bus>,
    pub scheduler: Arc<dyn Scheduler>,
    pub blobs: Arc<dyn crate::ports::Blobs>,
    pub llm: Arc<dyn Llm>,
    pub clock: Arc<dyn Clock>,
    /// `store` again, when it is `queue` too (the embedded adapter): a step whose effects
    /// are all step messages commits and enqueues them in one transaction
    /// ([`crate::ports::SendingStore::commit_sending`]).
    pub sending_store: Option<Arc<dyn crate::ports::SendingStore>>,
}

/// Why a request was refused, or could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state (already answered, run still active).
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// Too late: the CTA expired.
    #[error("{0}")]
    Gone(String),
    /// A one-time link refused: `link_invalid` (tampered, or not this deployment's),
    /// `link_expired`, `link_used` (it answered already), `cta_answered` (answered another
    /// way), `cta_cancelled`.
    #[error("{message}")]
    Link { code: &'static str, message: String },
    /// The caller may not do this: `not_assignee` (a question neither theirs nor assigned to
    /// them).
    #[error("{message}")]
    Forbidden { code: &'static str, message: String },
    /// The CTA was answered already: the first answer wins. Here is the winner.
    #[error("CTA `{}` was already answered", .0.cta_id)]
    AlreadyAnswered(Box<Cta>),
    #[error(transparent)]
    Port(#[from] PortError),
}

impl From<crate::cta::InvalidResponse> for ServiceError {
    fn from(e: crate::cta::InvalidResponse) -> Self {
        Self::Invalid(e.to_string())
    }
}

pub use crate::engine::StepError;

/// What handling a message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    Committed { status: RunStatus, version: u64 },
    Ignored(String),
}

/// A new top-level run, as the API receives it.
#[derive(Debug, Clone, Default)]
pub struct CreateRun {
    pub prompt: String,
    pub agent: Option<String>,
    pub sandbox_id: Option<String>,
    /// The repository the run works on (its tools read it in their context's scope).
    pub github: Option<crate::scope::GithubRepo>,
    pub metadata: Option<Value>,
    /// What the run works on: an object with a string `type` (see `contextGuidance`).
    pub context: Option<Value>,
    /// What it does when a question expires (none: as its agent says, else `end`).
    pub on_expiry: Option<ExpiryPolicy>,
    /// What it may spend, with its subagents and plan steps, before its owner is asked
    /// (none: its agent's `maxCostUsd`, if set; never above it).
    pub budget_usd: Option<f64>,
    /// The caller will watch the run (`baton run --follow`, the console): it counts as
    /// watched from its creation, so that its first reply streams.
    pub watch: bool,
    /// Its first turn's model tier and visibility (a trigger starts only follow-ups).
    pub options: TurnOptions,
}

/// A follow-up turn, as the API receives it: a person's `text`, or a `trigger` that asks the
/// agent to go on without one (a webhook, a schedule).
#[derive(Debug, Clone)]
pub struct FollowUp {
    pub text: Option<String>,
    pub trigger: Option<Trigger>,
    pub tier: Option<crate::timeline::Tier>,
    /// False: the turn is kept (the model sees it) but a conversation view leaves it out.
    pub visible: bool,
    /// The caller will watch the turn: it counts as watched from now, so that its reply
    /// streams.
    pub watch: bool,
}

impl FollowUp {
    /// A person's follow-up, shown and at the agent's usual tier.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            trigger: None,
            tier: None,
            visible: true,
            watch: false,
        }
    }
}

/// What started a turn no one wrote: a name (`[A-Za-z0-9._:/-]`, at most 64) and data for
/// the model (at most [`crate::run::MAX_RUN_CONTEXT_BYTES`] as JSON).
#[derive(Debug, Clone)]
pub struct Trigger {
    pub name: String,
    pub data: Option<Value>,
}

/// A run's `metadata` is at most this long as JSON: it is the caller's label for the run,
/// kept in the run item that every commit rewrites (and DynamoDB bills by the kilobyte).
pub const MAX_METADATA_BYTES: usize = 4 * 1024;

/// What both halves of a service work with: the ports, the catalog, and what the host has
/// besides (links, a live channel, observers, quotas). Built once, shared by [`Requests`]
/// and [`Steps`].
pub(crate) struct Shared {
    deps: Deps,
    catalog: Arc<Catalog>,
    /// One-time answer links, if the host has them.
    links: Option<crate::links::Links>,
    /// The host's channel to the runs' watchers, if it has one.
    live: Option<Arc<dyn crate::live::Live>>,
    /// What the host traces and measures committed steps with.
    observers: Vec<Arc<dyn crate::observe::Observer>>,
    /// Its owners' quotas.
    quotas: Quotas,
    /// What questions' notifications are sent with (`None`: none is, and each is recorded
    /// as undeliverable).
    notifier: Option<Arc<dyn crate::ports::Notifier>>,
    /// What its e-mail channels send with (`None`: their deliveries fail, recorded).
    mailer: Option<Arc<dyn crate::ports::Mailer>>,
}

/// What answers requests: the HTTP API's reads and writes (runs, their timelines and
/// files, questions and their answers, follow-ups, forks, links, usage). A request commits
/// only what it is about and performs only what it committed; what runs next is a step's.
pub struct Requests {
    shared: Arc<Shared>,
}

/// What runs steps: the queue consumers (a step message, delivered, becomes a decision, a
/// commit, then effects), the bus's inbox (answers, expiries, timers), and the sweep; with
/// the timelines it keeps warm between a run's steps.
pub struct Steps {
    shared: Arc<Shared>,
    /// Timelines of recently stepped runs, by version, within a byte budget.
    cache: Mutex<cache::TimelineCache>,
    /// Steps that found their timeline cached (warm) or had to load it (cold).
    warm_steps: AtomicU64,
    cold_steps: AtomicU64,
}

/// A host's service: what answers its requests ([`Service::requests`]) and what runs its
/// steps ([`Service::steps`]), over one set of ports. A host that has only one kind of
/// work (the API function, a step function) uses that half.
pub struct Service {
    requests: Requests,
    steps: Steps,
}

/// What each owner may have under way and spend ([`ServiceBuilder::quotas`]): past either,
/// `POST /runs`, forks and follow-ups that would start an ended run are refused, by the
/// store's conditional writes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Quotas {
    /// `BATON_MAX_ACTIVE_RUNS_PER_OWNER`: top-level runs not yet ended (none: no limit).
    pub active_runs: Option<u32>,
    /// `BATON_MAX_DAILY_COST_USD_PER_OWNER`: what an owner's runs' model calls may cost in a
    /// UTC day before it may start no more that day (none: no limit).
    pub daily_cost_usd: Option<f64>,
}

impl Quotas {
    /// As the configuration sets them.
    pub fn of(config: &crate::config::Config) -> Self {
        Self {
            active_runs: config.max_active_runs_per_owner,
            daily_cost_usd: config.max_daily_cost_usd_per_owner,
        }
    }
}

/// How a host builds its service: its ports and catalog, then what it has besides (links,
/// a live channel, observers, a cache budget), then [`ServiceBuilder::build`]. The one way
/// a service is made: everything it works with is given before its first request.
pub struct ServiceBuilder {
    shared: Shared,
    cache_bytes: usize,
}

impl ServiceBuilder {
    /// One-time answer links: `POST /ctas/{id}/link` mints them (`None`: off, the default).
    /// No `cta.request` event carries one: a link is a bearer credential, and the bus is
    /// read by whoever its rules let in.
    pub fn links(mut self, links: Option<crate::links::Links>) -> Self {
        self.shared.links = links;
        self
    }

    /// Where what steps do before they commit goes (streamed replies, tool calls starting
    /// and ending), for whoever watches a run (`None`: nowhere, the default).
    pub fn live(mut self, live: Option<Arc<dyn crate::live::Live>>) -> Self {
        self.shared.live = live;
        self
    }

    /// What questions' notifications (the agents file's `notifiers`) are sent with.
    pub fn notifier(mut self, notifier: Arc<dyn crate::ports::Notifier>) -> Self {
        self.shared.notifier = Some(notifier);
        self
    }

    /// What questions' e-mails (the agents file's `email` notifiers) are sent with.
    pub fn mailer(mut self, mailer: Arc<dyn crate::ports::Mailer>) -> Self {
        self.shared.mailer = Some(mailer);
        self
    }

    /// Hands every committed step's report to `observer` too (traces, metrics).
    pub fn observer(mut self, observer: Arc<dyn crate::observe::Observer>) -> Self {
        self.shared.observers.push(observer);
        self
    }

    /// Keeps at most `bytes` of recently stepped timelines in memory (default
    /// [`DEFAULT_CACHE_BYTES`]; 0 keeps none, and every step reads its window from the
    /// store).
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Each owner's quotas (default: none).
    pub fn quotas(mut self, quotas: Quotas) -> Self {
        self.shared.quotas = Quotas {
            active_runs: quotas.active_runs.filter(|n| *n > 0),
            daily_cost_usd: quotas.daily_cost_usd.filter(|n| *n > 0.0),
        };
        self
    }

    pub fn build(self) -> Service {
        let shared = Arc::new(self.shared);
        Service {
            requests: Requests {
                shared: shared.clone(),
            },
            steps: Steps {
                shared,
                cache: Mutex::new(cache::TimelineCache::new(self.cache_bytes)),
                warm_steps: AtomicU64::new(0),
                cold_steps: AtomicU64::new(0),
            },
        }
    }
}

/// What `GET /runs/{id}` shows: the run and the start of its timeline.
#[derive(Debug, Clone)]
pub struct RunView {
    pub run: Run,
    /// The first entries, in order.
    pub entries: Vec<Entry>,
    /// True when the timeline goes on past `entries`.
    pub more: bool,
    /// The entry holding the whole final answer when `run.result` is only its preview.
    pub result_entry: Option<Entry>,
    /// Its tree's budget ledger, when it is budgeted; or why the stored one cannot be read
    /// (the rest of the run is shown all the same).
    pub ledger: Option<Result<crate::budget::Ledger, String>>,
}

/// An owner's figures against its quotas ([`Requests::usage`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    pub quotas: Quotas,
    /// Its top-level runs not yet ended (kept while an active-runs quota is set).
    pub active_runs: Option<u64>,
    /// The UTC day, and what its runs' model calls cost that day (kept while a daily
    /// allowance is set).
    pub day: chrono::NaiveDate,
    pub spent_usd: Option<f64>,
}

impl Requests {
    /// `owner`'s figures against the quotas (`GET /usage`).
    pub async fn usage(&self, owner: &str) -> Result<Usage, ServiceError> {
        let shared = &self.shared;
        let day = shared.deps.clock.now().date_naive();
        let active_runs = match shared.quotas.active_runs {
            Some(_) => Some(shared.deps.store.active_runs(owner).await?),
            None => None,
        };
        let spent_usd = match shared.quotas.daily_cost_usd {
            Some(_) => Some(shared.deps.store.spent_on(owner, day).await?),
            None => None,
        };
        Ok(Usage {
            quotas: shared.quotas,
            active_runs,
            day,
            spent_usd,
        })
    }

    pub fn links(&self) -> Option<&crate::links::Links> {
        self.shared.links.as_ref()
    }
}

impl Service {
    /// A service over `deps` with `catalog`: add what the host has, then build.
    pub fn builder(deps: Deps, catalog: Arc<Catalog>) -> ServiceBuilder {
        ServiceBuilder {
            shared: Shared {
                deps,
                catalog,
                links: None,
                live: None,
                observers: Vec::new(),
                quotas: Quotas::default(),
                notifier: None,
                mailer: None,
            },
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }

    /// What answers the host's requests.
    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    /// What runs the host's steps.
    pub fn steps(&self) -> &Steps {
        &self.steps
    }

    pub fn links(&self) -> Option<&crate::links::Links> {
        self.requests.links()
    }

    pub fn catalog(&self) -> &Catalog {
        &self.requests.shared.catalog
    }

    /// The ports this service drives, for tests that look inside. Hosts call the service's
    /// methods, never its ports.
    pub fn deps(&self) -> &Deps {
        &self.requests.shared.deps
    }

    /// The time by the service's clock.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.requests.shared.deps.clock.now()
    }
}

impl Shared {
    /// What a top-level run starting now must fit in (`None`: no quota is set).
    fn admission(&self) -> Option<crate::ports::Admission> {
        let a = crate::ports::Admission {
            active_runs: self.quotas.active_runs,
            daily_cost: self
                .quotas
                .daily_cost_usd
                .map(|limit_usd| crate::ports::DailyCost {
                    limit_usd,
                    day: self.deps.clock.now().date_naive(),
                }),
        };
        (!a.is_open()).then_some(a)
    }

    /// Tells the observers what a step of `before` that committed `t` did.
    fn report(
        &self,
        before: &Run,
        input: &crate::message::Input,
        t: &crate::message::Transition,
        started: chrono::DateTime<chrono::Utc>,
    ) {
        let observers = &self.observers;
        if observers.is_empty() {
            return;
        }
        let ended = self.deps.clock.now();
        let report =
            crate::observe::StepReport::new(&self.catalog, before, input, t, started, ended);
        for o in observers.iter() {
            o.step(&report);
        }
    }

    /// Tells the observers that a step of `run` failed (it will be tried again).
    fn report_failure(
        &self,
        run: &Run,
        msg: &crate::message::StepMessage,
        attempt: u32,
        error: &StepError,
        started: chrono::DateTime<chrono::Utc>,
    ) {
        let observers = &self.observers;
        if observers.is_empty() {
            return;
        }
        let failure = crate::observe::StepFailure {
            run_id: run.run_id.clone(),
            agent: run.agent.clone(),
            parent: run.origin.parent.clone(),
            version: run.version,
            attempt,
            input: crate::observe::input_name(&msg.input),
            started,
            ended: self.deps.clock.now(),
            error: error.to_string(),
        };
        for o in observers.iter() {
            o.step_failed(&failure);
        }
    }

    /// The live channel, if the host has one and someone may be watching `run`.
    pub(crate) fn live_for(&self, run: &crate::run::Run) -> Option<&Arc<dyn crate::live::Live>> {
        self.live.as_ref().filter(|l| l.watched(run))
    }
}

impl Steps {
    /// How many steps found their timeline cached, and how many loaded it from the store.
    pub fn cache_use(&self) -> (u64, u64) {
        (
            self.warm_steps.load(Ordering::Relaxed),
            self.cold_steps.load(Ordering::Relaxed),
        )
    }

    /// How many bytes of recently stepped timelines this service keeps at most.
    pub fn cache_budget(&self) -> usize {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .budget()
    }
}
