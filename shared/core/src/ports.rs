//! The ports: small traits the service talks to, one per kind of infrastructure.
//!
//! The embedded adapter (`baton-local`) and the AWS adapters (`baton-aws`) implement the same traits
//! and pass the same contract tests. Every method is idempotent where the design needs it:
//! a message or an effect performed twice must not do anything twice.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::cta::{Cta, CtaStatus, Settlement};
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

/// Runs and their timelines as read: a run item, its timeline (whole, from a seq, a step's
/// window, a page of entries), an owner's runs and a tree's, a page at a time.
#[async_trait::async_trait]
pub trait RunReads: Send + Sync {
    /// The run item alone (cheap).
    async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, PortError>;

    /// The run item and its whole timeline, in seq order.
    async fn load(&self, run_id: &str) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError>;

    /// The run item and its timeline from seq `from` on, in seq order, as of one commit:
    /// a step's window ([`crate::engine::window_start`]), read in a bounded number of bytes
    /// whatever the run's length. (This default reads everything and drops the rest; a
    /// store overrides it.)
    async fn load_from(
        &self,
        run_id: &str,
        from: u64,
    ) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError> {
        Ok(self.load(run_id).await?.map(|(rec, mut entries)| {
            entries.retain(|e| e.seq >= from);
            (rec, entries)
        }))
    }

    /// The run item and its timeline from the seq `window` gives for it on (returned too),
    /// as of one commit: what a step re-hydrates. A store that can read the run item once
    /// for both overrides it (DynamoDB: one `GetItem` fewer per cold step).
    async fn load_window(
        &self,
        run_id: &str,
        window: &(dyn for<'r> Fn(&'r Run) -> u64 + Send + Sync),
    ) -> Result<Option<(RunRecord, Vec<Entry>, u64)>, PortError> {
        let Some(mut rec) = self.get_run(run_id).await? else {
            return Ok(None);
        };
        loop {
            let from = window(&rec.run);
            let Some((read, entries)) = self.load_from(run_id, from).await? else {
                return Ok(None);
            };
            // A commit in between may have moved the window back (a follow-up queued).
            if window(&read.run) >= from {
                return Ok(Some((read, entries, from)));
            }
            rec = read;
        }
    }

    /// Timeline entries with seq greater than `after` (all when `None`), at most `limit`.
    async fn entries_after(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Entry>, PortError>;

    /// An owner's top-level runs, newest first, created in `query`'s span, after
    /// `query.after` (the previous page's `next`), at most `query.limit`: a bounded number
    /// of reads, whatever the number of runs.
    async fn list_runs(&self, owner: &str, query: &RunQuery) -> Result<RunPage, PortError>;

    /// The runs under a top-level run (its subagents, theirs, and a plan's steps' runs, at
    /// any depth), oldest first, after `after`, at most `limit`: a bounded number of reads.
    async fn list_descendants(
        &self,
        root_run_id: &str,
        after: Option<&RunPosition>,
        limit: usize,
    ) -> Result<RunPage, PortError>;

    /// Leases `run_id` to watchers until `until`, where the store keeps the lease its steps
    /// read with the run (DynamoDB: the `LIVE` item; see `Live::watched`). A host whose
    /// watchers are in its own process keeps none (it knows them: `Live::expect`).
    async fn lease_watch(
        &self,
        _run_id: &str,
        _until: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), PortError> {
        Ok(())
    }
}

/// Runs as written: created, committed with their outbox (one conditional write), the
/// outbox then narrowed or cleared, and a retried step's failure noted beside the run.
#[async_trait::async_trait]
pub trait RunWrites: Send + Sync {
    /// Creates a run with its first entries and outbox. With an idempotency key, a second
    /// create by the same owner with the same key creates nothing and returns the first run.
    /// With an `admission`, the (top-level) run is admitted by its owner's quotas in the same
    /// write, or refused ([`PortError::QuotaExceeded`], [`PortError::DailyCostExceeded`]) with
    /// nothing written: any number of concurrent creates race for the slots, and at most the
    /// limit win.
    async fn create_run(
        &self,
        run: &Run,
        entries: &[Entry],
        outbox: &[Effect],
        idempotency_key: Option<&str>,
        admission: Option<&Admission>,
    ) -> Result<Created, PortError>;

    /// Commits a transition atomically if the run is still at `expected_version`:
    /// new and resolved entries, the run item with the transition's effects as its outbox,
    /// new CTAs and new child runs. [`PortError::Conflict`] if the version moved.
    async fn commit(&self, expected_version: u64, transition: &Transition)
    -> Result<(), PortError>;

    /// Marks the outbox of `version` performed (does nothing if the run moved past it).
    async fn clear_outbox(&self, run_id: &str, version: u64) -> Result<(), PortError>;

    /// Narrows the outbox of `version` to `owed`, what a perform of it left undone (an
    /// effect that failed, then the run's own next message marked owed), and indexes it for
    /// the sweep as of `at` whether or not it continues (does nothing if the run moved past
    /// `version`).
    async fn keep_outbox(
        &self,
        run_id: &str,
        version: u64,
        owed: &[Effect],
        at: DateTime<Utc>,
    ) -> Result<(), PortError>;

    /// Records, beside the run item and without moving its version, the last failure of
    /// a step being retried; read back as `Run::last_error` until the next commit clears it.
    async fn record_failure(&self, run_id: &str, failure: &LastError) -> Result<(), PortError>;
}

/// Questions (CTAs): read, settled with one conditional write (the first wins), listed a
/// page at a time, and each resolution marked sent to its run.
#[async_trait::async_trait]
pub trait Ctas: Send + Sync {
    async fn get_cta(&self, cta_id: &str) -> Result<Option<Cta>, PortError>;

    /// Moves a CTA out of `pending` with one conditional write: the first wins. An answer or
    /// an expiry is written with its resolution *outstanding* (the CTA's own outbox): the
    /// run still has to be told, and until [`Ctas::clear_resolution`] says it was, the
    /// sweep finds it ([`Sweep::stale_resolutions`]) and tells it again.
    async fn settle_cta(
        &self,
        cta_id: &str,
        settlement: &Settlement,
        at: DateTime<Utc>,
    ) -> Result<Settled, PortError>;

    /// Marks a CTA's resolution sent to its run.
    async fn clear_resolution(&self, cta_id: &str) -> Result<(), PortError>;

    /// A page of an owner's CTAs: at most `query.limit`, in [`CtaPosition`] order, after
    /// `query.after`. A bounded number of reads, whatever the number of CTAs.
    async fn list_ctas(&self, owner: &str, query: &CtaQuery) -> Result<Vec<Cta>, PortError>;
}

/// The follow-ups waiting for a run's turn, kept beside the run item without moving its
/// version: a turn claimed, follow-ups admitted under a cap, held in the run's queue, released.
#[async_trait::async_trait]
pub trait FollowUps: Send + Sync {
    /// Claims a finished run's next turn for the follow-up `message_id`, beside the run item
    /// and without moving its version, so that the API can say whether a message starts a
    /// turn or waits: true if it is this message's (no claim stands, the one that does is
    /// this message's own, or it was made before `stale`), false if another follow-up
    /// claimed the turn first. The run's next commit clears the claim.
    async fn claim_turn(
        &self,
        run_id: &str,
        message_id: &str,
        at: DateTime<Utc>,
        stale: DateTime<Utc>,
    ) -> Result<bool, PortError>;

    /// Admits the follow-up `message_id` to run `run_id`'s waiting follow-ups at `at`,
    /// beside the run item and without moving its version, with one conditional write:
    /// true if it is admitted (fewer than `cap` wait, or it is already among them: a
    /// client's retry), false if `cap` already wait. A follow-up waits from its admission
    /// until the run takes it up ([`Effect::ReleaseFollowUps`] after the commit that starts
    /// its turn, refuses it or drops it); while it waits in the run's queue
    /// ([`FollowUps::hold_follow_ups`]) its place holds, however long. One admitted before
    /// `stale` that the run does not hold never reached it (its request died before it
    /// was sent): its place is given back when a follow-up needs it.
    async fn admit_follow_up(
        &self,
        run_id: &str,
        message_id: &str,
        cap: usize,
        at: DateTime<Utc>,
        stale: DateTime<Utc>,
    ) -> Result<bool, PortError>;

    /// Marks follow-ups of run `run_id` as waiting in its queue ([`Effect::HoldFollowUps`]):
    /// their places hold until released, whatever their age (those no longer admitted, or
    /// a run no longer stored, are no error).
    async fn hold_follow_ups(&self, run_id: &str, message_ids: &[String]) -> Result<(), PortError>;

    /// Releases follow-ups from run `run_id`'s waiting ones (those not among them, or a
    /// run no longer stored, are no error).
    async fn release_follow_ups(
        &self,
        run_id: &str,
        message_ids: &[String],
    ) -> Result<(), PortError>;
}

/// What owners and run trees hold and spend: an owner's active-run slots and its spending
/// of a day, a budgeted tree's ledger.
#[async_trait::async_trait]
pub trait Ledgers: Send + Sync {
    /// How many active-run slots `owner` holds.
    async fn active_runs(&self, owner: &str) -> Result<u64, PortError>;

    /// What `owner`'s runs' own model calls cost on UTC day `day`, in US dollars.
    async fn spent_on(&self, owner: &str, day: chrono::NaiveDate) -> Result<f64, PortError>;

    /// The ledger of the budgeted run tree under top-level run `root_run_id`
    /// ([`crate::budget`]): created with that run, added to by every commit of the tree
    /// ([`Transition::spent_usd`], [`Transition::budget_raise`]). `None` for a tree without a
    /// budget.
    async fn ledger(&self, root_run_id: &str) -> Result<Option<crate::budget::Ledger>, PortError>;
}

/// What the sweep finds: outboxes and resolutions left outstanding, questions and timers
/// past their time, and finished runs to purge.
#[async_trait::async_trait]
pub trait Sweep: Send + Sync {
    /// Runs whose parking outbox (see `message::outbox_continues`), or whose start, is
    /// still outstanding and was committed before `before`, at most `limit` of them: what
    /// the sweep repairs.
    async fn stale_outboxes(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<String>, PortError>;

    /// Deletes every item of up to `limit` runs that finished more than the store's
    /// retention period before `now` (the sweep's purge); returns how many it deleted. A
    /// store that keeps everything (the embedded one) deletes nothing.
    async fn purge_finished(&self, now: DateTime<Utc>, limit: usize) -> Result<usize, PortError>;

    /// CTAs whose resolution is outstanding since before `before`, at most `limit`.
    async fn stale_resolutions(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError>;

    /// Pending CTAs whose expiry passed before `before`, at most `limit`: their timers were
    /// lost (a schedule dropped, or never made), so the sweep expires them.
    async fn overdue_ctas(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError>;

    /// Timers of runs not ended that were due before `before` and have not fired (a run's
    /// [`crate::run::Clocks::timers`]), at most `limit`: their schedules were lost, so the sweep
    /// fires them.
    async fn overdue_timers(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<DueTimer>, PortError>;
}

/// A store: every role of it ([`RunReads`], [`RunWrites`], [`Ctas`], [`FollowUps`],
/// [`Ledgers`], [`Sweep`]), as each adapter implements them. The service holds one; a test
/// that changes one role of a store wraps that role alone and puts it back with
/// [`StoreParts`].
pub trait Store: RunReads + RunWrites + Ctas + FollowUps + Ledgers + Sweep {}

impl<T: RunReads + RunWrites + Ctas + FollowUps + Ledgers + Sweep> Store for T {}

/// A store made of its roles, each of which may be another's: [`StoreParts::of`] splits a
/// store, a caller replaces the role it wraps (a test's failing commit, a slow purge), and the
/// parts are a store again.
#[derive(Clone)]
pub struct StoreParts {
    pub run_reads: Arc<dyn RunReads>,
    pub run_writes: Arc<dyn RunWrites>,
    pub ctas: Arc<dyn Ctas>,
    pub follow_ups: Arc<dyn FollowUps>,
    pub ledgers: Arc<dyn Ledgers>,
    pub sweep: Arc<dyn Sweep>,
}

impl StoreParts {
    /// Every role of `store`, as it is.
    pub fn of(store: Arc<dyn Store>) -> Self {
        Self {
            run_reads: store.clone(),
            run_writes: store.clone(),
            ctas: store.clone(),
            follow_ups: store.clone(),
            ledgers: store.clone(),
            sweep: store,
        }
    }
}

#[async_trait::async_trait]
impl RunReads for StoreParts {
    async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, PortError> {
        self.run_reads.get_run(run_id).await
    }
    async fn load(&self, run_id: &str) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError> {
        self.run_reads.load(run_id).await
    }
    async fn load_from(
        &self,
        run_id: &str,
        from: u64,
    ) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError> {
        self.run_reads.load_from(run_id, from).await
    }
    async fn load_window(
        &self,
        run_id: &str,
        window: &(dyn for<'r> Fn(&'r Run) -> u64 + Send + Sync),
    ) -> Result<Option<(RunRecord, Vec<Entry>, u64)>, PortError> {
        self.run_reads.load_window(run_id, window).await
    }
    async fn entries_after(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Entry>, PortError> {
        self.run_reads.entries_after(run_id, after, limit).await
    }
    async fn list_runs(&self, owner: &str, query: &RunQuery) -> Result<RunPage, PortError> {
        self.run_reads.list_runs(owner, query).await
    }
    async fn list_descendants(
        &self,
        root_run_id: &str,
        after: Option<&RunPosition>,
        limit: usize,
    ) -> Result<RunPage, PortError> {
        self.run_reads
            .list_descendants(root_run_id, after, limit)
            .await
    }
    async fn lease_watch(
        &self,
        run_id: &str,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), PortError> {
        self.run_reads.lease_watch(run_id, until).await
    }
}

#[async_trait::async_trait]
impl RunWrites for StoreParts {
    async fn create_run(
        &self,
        run: &Run,
        entries: &[Entry],
        outbox: &[Effect],
        idempotency_key: Option<&str>,
        admission: Option<&Admission>,
    ) -> Result<Created, PortError> {
        self.run_writes
            .create_run(run, entries, outbox, idempotency_key, admission)
            .await
    }
    async fn commit(
        &self,
        expected_version: u64,
        transition: &Transition,
    ) -> Result<(), PortError> {
        self.run_writes.commit(expected_version, transition).await
    }
    async fn clear_outbox(&self, run_id: &str, version: u64) -> Result<(), PortError> {
        self.run_writes.clear_outbox(run_id, version).await
    }
    async fn keep_outbox(
        &self,
        run_id: &str,
        version: u64,
        owed: &[Effect],
        at: DateTime<Utc>,
    ) -> Result<(), PortError> {
        self.run_writes.keep_outbox(run_id, version, owed, at).await
    }
    async fn record_failure(&self, run_id: &str, failure: &LastError) -> Result<(), PortError> {
        self.run_writes.record_failure(run_id, failure).await
    }
}

#[async_trait::async_trait]
impl Ctas for StoreParts {
    async fn get_cta(&self, cta_id: &str) -> Result<Option<Cta>, PortError> {
        self.ctas.get_cta(cta_id).await
    }
    async fn settle_cta(
        &self,
        cta_id: &str,
        settlement: &Settlement,
        at: DateTime<Utc>,
    ) -> Result<Settled, PortError> {
        self.ctas.settle_cta(cta_id, settlement, at).await
    }
    async fn clear_resolution(&self, cta_id: &str) -> Result<(), PortError> {
        self.ctas.clear_resolution(cta_id).await
    }
    async fn list_ctas(&self, owner: &str, query: &CtaQuery) -> Result<Vec<Cta>, PortError> {
        self.ctas.list_ctas(owner, query).await
    }
}

#[async_trait::async_trait]
impl FollowUps for StoreParts {
    async fn claim_turn(
        &self,
        run_id: &str,
        message_id: &str,
        at: DateTime<Utc>,
        stale: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        self.follow_ups
            .claim_turn(run_id, message_id, at, stale)
            .await
    }
    async fn admit_follow_up(
        &self,
        run_id: &str,
        message_id: &str,
        cap: usize,
        at: DateTime<Utc>,
        stale: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        self.follow_ups
            .admit_follow_up(run_id, message_id, cap, at, stale)
            .await
    }
    async fn hold_follow_ups(&self, run_id: &str, message_ids: &[String]) -> Result<(), PortError> {
        self.follow_ups.hold_follow_ups(run_id, message_ids).await
    }
    async fn release_follow_ups(
        &self,
        run_id: &str,
        message_ids: &[String],
    ) -> Result<(), PortError> {
        self.follow_ups
            .release_follow_ups(run_id, message_ids)
            .await
    }
}

#[async_trait::async_trait]
impl Ledgers for StoreParts {
    async fn active_runs(&self, owner: &str) -> Result<u64, PortError> {
        self.ledgers.active_runs(owner).await
    }
    async fn spent_on(&self, owner: &str, day: chrono::NaiveDate) -> Result<f64, PortError> {
        self.ledgers.spent_on(owner, day).await
    }
    async fn ledger(&self, root_run_id: &str) -> Result<Option<crate::budget::Ledger>, PortError> {
        self.ledgers.ledger(root_run_id).await
    }
}

#[async_trait::async_trait]
impl Sweep for StoreParts {
    async fn stale_outboxes(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<String>, PortError> {
        self.sweep.stale_outboxes(before, limit).await
    }
    async fn purge_finished(&self, now: DateTime<Utc>, limit: usize) -> Result<usize, PortError> {
        self.sweep.purge_finished(now, limit).await
    }
    async fn stale_resolutions(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        self.sweep.stale_resolutions(before, limit).await
    }
    async fn overdue_ctas(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        self.sweep.overdue_ctas(before, limit).await
    }
    async fn overdue_timers(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<DueTimer>, PortError> {
        self.sweep.overdue_timers(before, limit).await
    }
}

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
