//! The store's port, by role: what a step, a request and the sweep each ask of it. An
//! adapter implements every role; [`Store`] is their sum, and [`StoreParts`] a store put
//! together from roles (a test wraps the one it changes).

use super::*;

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

    /// Changes a CTA's record by [`Cta::apply`], written conditionally on the revision it
    /// read (read, apply and write again until the write is the one after the record read):
    /// no two concurrent changes lose one another, and of any number of settlements the
    /// first wins. A change that settles an answer or an expiry writes its resolution
    /// *outstanding* (the CTA's own outbox): the run still has to be told, and until
    /// [`Ctas::clear_resolution`] says it was, the sweep finds it
    /// ([`Sweep::stale_resolutions`]) and tells it again. Any other change keeps the outbox
    /// as it is.
    async fn change_cta(
        &self,
        cta_id: &str,
        change: &CtaChange,
        at: DateTime<Utc>,
    ) -> Result<Changed, PortError>;

    /// Moves a CTA out of `pending` ([`Ctas::change_cta`] with a settlement).
    async fn settle_cta(
        &self,
        cta_id: &str,
        settlement: &Settlement,
        at: DateTime<Utc>,
    ) -> Result<Settled, PortError> {
        let change = CtaChange::Settle(settlement.clone());
        Ok(match self.change_cta(cta_id, &change, at).await? {
            Changed::Applied { cta, .. } => Settled::Won(cta),
            Changed::Unchanged(cta) | Changed::Refused(cta) => Settled::Lost(cta),
            Changed::NotFound => Settled::NotFound,
        })
    }

    /// Marks a CTA's resolution sent to its run.
    async fn clear_resolution(&self, cta_id: &str) -> Result<(), PortError>;

    /// A page of an owner's CTAs: at most `query.limit`, in [`CtaPosition`] order, after
    /// `query.after`. A bounded number of reads, whatever the number of CTAs.
    async fn list_ctas(&self, owner: &str, query: &CtaQuery) -> Result<Vec<Cta>, PortError>;

    /// A page of the CTAs assigned to any of `principals` (`user:<id>`, `group:<name>`), in
    /// the order of an owner's, after `query.after`: at most `query.limit`.
    async fn list_assigned(
        &self,
        principals: &[String],
        query: &CtaQuery,
    ) -> Result<Vec<Cta>, PortError>;
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
    async fn change_cta(
        &self,
        cta_id: &str,
        change: &CtaChange,
        at: DateTime<Utc>,
    ) -> Result<Changed, PortError> {
        self.ctas.change_cta(cta_id, change, at).await
    }
    async fn clear_resolution(&self, cta_id: &str) -> Result<(), PortError> {
        self.ctas.clear_resolution(cta_id).await
    }
    async fn list_ctas(&self, owner: &str, query: &CtaQuery) -> Result<Vec<Cta>, PortError> {
        self.ctas.list_ctas(owner, query).await
    }
    async fn list_assigned(
        &self,
        principals: &[String],
        query: &CtaQuery,
    ) -> Result<Vec<Cta>, PortError> {
        self.ctas.list_assigned(principals, query).await
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
