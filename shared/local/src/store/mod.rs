//! The embedded adapter: every port in one SQLite file, durable on disk.
//!
//! Runs, timelines, CTAs, the step queue, published events and expiry timers share one
//! database, so a run parked on a CTA survives a restart. A commit is conditional on the
//! run's version and synced to disk (`synchronous = FULL`) before it returns; the writer
//! thread applies concurrent commits in one transaction, each in its own savepoint, so
//! they share one fsync (group commit, see `db`). The store is its host's queue too, so a
//! step whose effects are all step messages (most steps: the next turn, a child's start)
//! enqueues them in its commit's own transaction and keeps no outbox
//! ([`baton_core::ports::SendingStore::commit_sending`]), and the worker's acknowledgements are applied by its next
//! receive ([`LocalStore::ack_later`]): one write per step. Queue bookkeeping, outbox
//! clearing and event/timer writes need no sync of their own (in WAL mode they become
//! durable with the next synced commit): losing one in a crash only means an idempotent
//! effect is performed again, which the start-up sweep ([`LocalStore::runs_with_outbox`])
//! and message redelivery take care of.
//!
//! The queue keeps the SQS FIFO rules: one group per run, a group's next message is not
//! handed out while an earlier one is in flight, deduplication by message id, a visibility
//! timeout, and a receive count for dead-lettering.

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::Notify;

use baton_core::cta::{Applied, Cta, CtaChange, CtaStatus};
use baton_core::error::PortError;
use baton_core::message::{Effect, Transition, outbox_continues, outbox_owes};
use baton_core::ports::{
    Changed, Created, CtaQuery, Ctas, FollowUps, Ledgers, RunPage, RunPosition, RunQuery, RunReads,
    RunRecord, RunWrites,
};
use baton_core::run::{LastError, Run};
use baton_core::timeline::Entry;

mod commit;
mod db;
mod lists;
mod open;
pub use open::{create_private, create_private_file};
mod overdue;
mod queue;
mod rows;
mod schema;

use rows::*;

pub use db::WriteStats;
use db::{Db, Undo};
use schema::SCHEMA;

pub use queue::{Delivery, DueTimer};

/// The embedded adapter. Cheap to clone; clones share the connections.
#[derive(Clone)]
pub struct LocalStore {
    db: Arc<Db>,
    sent: Arc<Notify>,
    /// Receipts of handled messages, deleted with the next receive ([`LocalStore::ack_later`]).
    acks: Arc<std::sync::Mutex<Vec<i64>>>,
    /// Messages to make visible again whose own write failed (the disk was full, say),
    /// applied by the next receive ([`LocalStore::retry_later`]).
    releases: Arc<std::sync::Mutex<Vec<queue::Release>>>,
    /// What steps read of timelines ([`LocalStore::read_stats`]).
    reads: Arc<ReadCounts>,
}

/// Timeline entries read ([`RunReads::load_from`], [`RunReads::entries_after`]), and their
/// stored bytes.
#[derive(Debug, Default)]
struct ReadCounts {
    entries: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
}

impl ReadCounts {
    /// Counts an entry's row as it is read.
    fn count(&self, row: rusqlite::Result<Vec<u8>>) -> rusqlite::Result<Vec<u8>> {
        if let Ok(b) = &row {
            use std::sync::atomic::Ordering::Relaxed;
            self.entries.fetch_add(1, Relaxed);
            self.bytes.fetch_add(b.len() as u64, Relaxed);
        }
        row
    }
}

/// What steps read of timelines so far: entries, and their bytes as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadStats {
    pub entries: u64,
    pub bytes: u64,
}

fn broken(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> PortError {
    PortError::broken(format!("embedded store: {what}: {e}"), e)
}

pub(super) fn sql(e: rusqlite::Error) -> PortError {
    match e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ) =>
        {
            PortError::unavailable("embedded store is busy", e)
        }
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull => {
            disk_full(e)
        }
        e => broken("sqlite", e),
    }
}

/// What a write that found the data directory's disk full fails with.
pub(crate) fn disk_full(e: impl Into<baton_core::error::BoxError>) -> PortError {
    PortError::StorageFull {
        message: DISK_FULL.into(),
        source: Some(e.into()),
    }
}

/// The words for it, said to API callers too.
pub const DISK_FULL: &str = "the disk holding the data directory is full: nothing was written; \
     free some space and try again (runs under way carry on by themselves once it is free)";

impl LocalStore {
    /// Runs `statement` (`?1` the run, `?2` a message id) for each of `message_ids`.
    async fn follow_ups(
        &self,
        run_id: &str,
        message_ids: &[String],
        statement: &'static str,
    ) -> Result<(), PortError> {
        if message_ids.is_empty() {
            return Ok(());
        }
        let (run_id, ids) = (run_id.to_owned(), message_ids.to_vec());
        self.write(false, move |c| {
            let mut each = c.prepare_cached(statement).map_err(sql)?;
            for id in &ids {
                each.execute(params![run_id, id]).map_err(sql)?;
            }
            Ok(())
        })
        .await
    }
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[async_trait::async_trait]
impl RunReads for LocalStore {
    async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, PortError> {
        let run_id = run_id.to_owned();
        self.read(move |c| run_row(c, &run_id)?.map(record).transpose())
            .await
    }

    async fn list_runs(&self, owner: &str, query: &RunQuery) -> Result<RunPage, PortError> {
        self.runs_page(owner, query).await
    }

    async fn list_descendants(
        &self,
        root_run_id: &str,
        after: Option<&RunPosition>,
        limit: usize,
    ) -> Result<RunPage, PortError> {
        self.descendants_page(root_run_id, after, limit).await
    }

    async fn load(&self, run_id: &str) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError> {
        self.load_from(run_id, 0).await
    }

    async fn load_from(
        &self,
        run_id: &str,
        from: u64,
    ) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError> {
        let run_id = run_id.to_owned();
        // Seqs are far below i64::MAX: a larger one is past every entry.
        let from = i64::try_from(from).unwrap_or(i64::MAX);
        let reads = self.reads.clone();
        self.read(move |c| {
            // One read transaction: the run and its entries as of one commit.
            let tx = c.unchecked_transaction().map_err(sql)?;
            let Some(row) = run_row(&tx, &run_id)? else {
                return Ok(None);
            };
            let rec = record(row)?;
            let mut stmt = tx
                .prepare_cached(
                    "SELECT body FROM entries WHERE run_key = (SELECT run_key FROM runs WHERE run_id = ?1) AND seq >= ?2 ORDER BY seq",
                )
                .map_err(sql)?;
            let entries = decode_entries(
                stmt.query_map(rusqlite::params![&run_id, from], |r| r.get::<_, Vec<u8>>(0))
                    .map_err(sql)?
                    .map(|b| reads.count(b)),
            )?;
            drop(stmt);
            tx.finish().map_err(sql)?;
            Ok(Some((rec, entries)))
        })
        .await
    }

    async fn entries_after(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Entry>, PortError> {
        let run_id = run_id.to_owned();
        // Seqs are far below i64::MAX: a larger cursor is past every entry.
        let after = after.map_or(-1, |a| i64::try_from(a).unwrap_or(i64::MAX));
        let reads = self.reads.clone();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT body FROM entries WHERE run_key = (SELECT run_key FROM runs WHERE run_id = ?1)
                     AND seq > ?2 ORDER BY seq LIMIT ?3",
                )
                .map_err(sql)?;
            decode_entries(
                stmt.query_map(params![run_id, after, limit as i64], |r| r.get::<_, Vec<u8>>(0))
                    .map_err(sql)?
                    .map(|b| reads.count(b)),
            )
        })
        .await
    }
}

#[async_trait::async_trait]
impl RunWrites for LocalStore {
    async fn create_run(
        &self,
        run: &Run,
        entries: &[Entry],
        outbox: &[Effect],
        idempotency_key: Option<&str>,
        admission: Option<&baton_core::ports::Admission>,
    ) -> Result<Created, PortError> {
        let new = NewRun::encode(run, entries)?;
        // A budgeted tree's ledger is created with its top-level run.
        let ledger = run
            .origin
            .budget
            .filter(|_| run.origin.parent.is_none())
            .map(baton_core::budget::Ledger::new);
        let admission = admission.copied();
        let outbox = outbox_json(outbox)?;
        let key = idempotency_key.map(str::to_owned);
        self.write(true, move |c| {
            if let Some(key) = &key {
                let existing: Option<RunRow> = c
                    .query_row(
                        &format!("SELECT {RUN_ROW} FROM runs WHERE owner = ?1 AND idem_key = ?2"),
                        params![new.owner, key],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                    )
                    .optional()
                    .map_err(sql)?;
                if let Some(row) = existing {
                    return Ok(Created::Existing(Box::new(record(row)?)));
                }
            }
            if let Some(a) = &admission {
                rows::admit(c, &new.run_id, &new.owner, a)?;
            }
            c.execute(
                "INSERT INTO runs (run_id, owner, version, body, outbox, idem_key, parent, root)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    new.run_id,
                    new.owner,
                    new.version,
                    new.body,
                    outbox,
                    key,
                    new.parent,
                    new.root
                ],
            )
            .map_err(sql)?;
            insert_entries(c, c.last_insert_rowid(), &new.entries)?;
            if let Some(l) = &ledger {
                rows::put_ledger(c, &new.run_id, l)?;
            }
            Ok(Created::Created)
        })
        .await
    }

    async fn commit(&self, expected_version: u64, t: &Transition) -> Result<(), PortError> {
        self.commit_with(expected_version, t, false).await
    }

    async fn clear_outbox(&self, run_id: &str, version: u64) -> Result<(), PortError> {
        let run_id = run_id.to_owned();
        self.write_one(false, move |c| {
            c.prepare_cached("UPDATE runs SET outbox = NULL WHERE run_id = ?1 AND version = ?2")
                .and_then(|mut s| s.execute(params![run_id, version as i64]))
                .map_err(sql)?;
            Ok(())
        })
        .await
    }

    /// The owed outbox is found by the sweep as any outbox is (`stale_outboxes` reads them
    /// all): `at` is not kept.
    async fn keep_outbox(
        &self,
        run_id: &str,
        version: u64,
        owed: &[Effect],
        _at: DateTime<Utc>,
    ) -> Result<(), PortError> {
        let (run_id, owed) = (run_id.to_owned(), to_json(&owed)?);
        self.write_one(false, move |c| {
            c.prepare_cached("UPDATE runs SET outbox = ?1 WHERE run_id = ?2 AND version = ?3")
                .and_then(|mut s| s.execute(params![owed, run_id, version as i64]))
                .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn record_failure(&self, run_id: &str, failure: &LastError) -> Result<(), PortError> {
        let (run_id, failure) = (run_id.to_owned(), to_json(failure)?);
        self.write_one(false, move |c| {
            c.execute(
                "UPDATE runs SET failure = ?1 WHERE run_id = ?2",
                params![failure, run_id],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }
}

#[async_trait::async_trait]
impl Ctas for LocalStore {
    async fn get_cta(&self, cta_id: &str) -> Result<Option<Cta>, PortError> {
        let cta_id = cta_id.to_owned();
        self.read(move |c| {
            let body: Option<String> = c
                .query_row("SELECT body FROM ctas WHERE cta_id = ?1", [cta_id], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(sql)?;
            body.map(|b| from_json(&b)).transpose()
        })
        .await
    }

    async fn change_cta(
        &self,
        cta_id: &str,
        change: &CtaChange,
        at: DateTime<Utc>,
    ) -> Result<Changed, PortError> {
        let (cta_id, change) = (cta_id.to_owned(), change.clone());
        // One writer: the read, the change and the write are one transaction.
        self.write(true, move |c| {
            let body: Option<String> = c
                .query_row("SELECT body FROM ctas WHERE cta_id = ?1", [&cta_id], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(sql)?;
            let Some(body) = body else {
                return Ok(Changed::NotFound);
            };
            let mut cta: Cta = from_json(&body)?;
            let settled = match cta.apply(&change, at) {
                Applied::Refused => return Ok(Changed::Refused(cta)),
                Applied::Unchanged => return Ok(Changed::Unchanged(cta)),
                Applied::Changed { settled } => settled,
            };
            let body = to_json(&cta)?;
            if settled {
                let unsent = (cta.status != CtaStatus::Cancelled).then(|| at.timestamp_millis());
                c.execute(
                    "UPDATE ctas SET status = ?1, body = ?2, unsent = ?3 WHERE cta_id = ?4",
                    params![cta.status.as_str(), body, unsent, cta_id],
                )
                .map_err(sql)?;
            } else {
                c.execute(
                    "UPDATE ctas SET body = ?1 WHERE cta_id = ?2",
                    params![body, cta_id],
                )
                .map_err(sql)?;
                // An escalation's new assignees find it in their inboxes.
                if let CtaChange::Round { assignees, .. } = &change {
                    lists::assign(c, &cta_id, assignees)?;
                }
            }
            Ok(Changed::Applied { cta, settled })
        })
        .await
    }

    async fn clear_resolution(&self, cta_id: &str) -> Result<(), PortError> {
        let cta_id = cta_id.to_owned();
        self.write_one(false, move |c| {
            c.execute("UPDATE ctas SET unsent = NULL WHERE cta_id = ?1", [cta_id])
                .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn list_ctas(&self, owner: &str, q: &CtaQuery) -> Result<Vec<Cta>, PortError> {
        self.ctas_page(owner, q).await
    }

    async fn list_assigned(
        &self,
        principals: &[String],
        q: &CtaQuery,
    ) -> Result<Vec<Cta>, PortError> {
        self.assigned_page(principals, q).await
    }
}

#[async_trait::async_trait]
impl FollowUps for LocalStore {
    async fn claim_turn(
        &self,
        run_id: &str,
        message_id: &str,
        at: DateTime<Utc>,
        stale: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        let (run_id, message_id) = (run_id.to_owned(), message_id.to_owned());
        let (at, stale) = (at.timestamp_millis(), stale.timestamp_millis());
        self.write_one(true, move |c| {
            let n = c
                .prepare_cached(
                    "UPDATE runs SET claim = ?1, claim_at = ?2 WHERE run_id = ?3
                     AND (claim IS NULL OR claim = ?1 OR claim_at < ?4)",
                )
                .and_then(|mut s| s.execute(params![message_id, at, run_id, stale]))
                .map_err(sql)?;
            Ok(n == 1)
        })
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
        let (run_id, message_id) = (run_id.to_owned(), message_id.to_owned());
        let (at, stale) = (at.timestamp_millis(), stale.timestamp_millis());
        self.write(true, move |c| {
            let stored: bool = c
                .prepare_cached("SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = ?1)")
                .and_then(|mut s| s.query_row([&run_id], |r| r.get(0)))
                .map_err(sql)?;
            if !stored {
                return Ok(false);
            }
            let (waiting, this): (i64, i64) = c
                .query_row(
                    "SELECT COUNT(*), COUNT(*) FILTER (WHERE message_id = ?2)
                     FROM follow_ups WHERE run_id = ?1",
                    params![run_id, message_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(sql)?;
            if this > 0 {
                return Ok(true);
            }
            if waiting >= cap as i64 {
                // Full: the places of follow-ups that never reached the run (admitted
                // before `stale`, not held in its queue) are given back first.
                let freed = c
                    .prepare_cached("DELETE FROM follow_ups WHERE run_id = ?1 AND at_ms < ?2")
                    .and_then(|mut s| s.execute(params![run_id, stale]))
                    .map_err(sql)?;
                if waiting - freed as i64 >= cap as i64 {
                    return Ok(false);
                }
            }
            c.execute(
                "INSERT INTO follow_ups (run_id, message_id, at_ms) VALUES (?1, ?2, ?3)",
                params![run_id, message_id, at],
            )
            .map_err(sql)?;
            Ok(true)
        })
        .await
    }

    async fn release_follow_ups(
        &self,
        run_id: &str,
        message_ids: &[String],
    ) -> Result<(), PortError> {
        self.follow_ups(
            run_id,
            message_ids,
            "DELETE FROM follow_ups WHERE run_id = ?1 AND message_id = ?2",
        )
        .await
    }

    async fn hold_follow_ups(&self, run_id: &str, message_ids: &[String]) -> Result<(), PortError> {
        // Held: no admission time, so never given back as one that never reached the run.
        self.follow_ups(
            run_id,
            message_ids,
            "UPDATE follow_ups SET at_ms = NULL WHERE run_id = ?1 AND message_id = ?2",
        )
        .await
    }
}

#[async_trait::async_trait]
impl Ledgers for LocalStore {
    async fn spent_on(&self, owner: &str, day: chrono::NaiveDate) -> Result<f64, PortError> {
        let owner = owner.to_owned();
        self.read(move |c| rows::spent_on(c, &owner, &day.to_string()))
            .await
    }

    async fn ledger(
        &self,
        root_run_id: &str,
    ) -> Result<Option<baton_core::budget::Ledger>, PortError> {
        let root = root_run_id.to_owned();
        self.read(move |c| rows::ledger(c, &root)).await
    }

    async fn active_runs(&self, owner: &str) -> Result<u64, PortError> {
        let owner = owner.to_owned();
        self.read(move |c| rows::slots_held(c, &owner)).await
    }
}
