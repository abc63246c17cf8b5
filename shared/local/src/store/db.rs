//! The embedded store's connections: one writer connection that group-commits, and read
//! connections beside it.
//!
//! Every write is a job put in a queue. The first caller to find no write under way
//! becomes the leader: it takes every job waiting and applies them in two `IMMEDIATE`
//! transactions, so that a job that fails is undone alone and the others stand ([`Undo`]:
//! a one-statement job is atomic by itself, a step's commit fails its version check
//! before it changes anything, any other job runs in a savepoint of its own). First the
//! jobs that need no sync (a receive), whose callers are answered at once: they do not
//! wait for other runs' fsync. Then the durable ones, synced to disk once
//! (`synchronous = FULL`), and only then is each of their callers told.
//! It goes on with whatever gathered meanwhile, and stops when nothing waits. With many
//! runs stepping at once their commits share one fsync instead of paying one each; a
//! lone caller writes at once, with no hand-over to another thread.
//!
//! A leader that came with a durable write will wait for an fsync: on a multi-thread
//! runtime it says so (`block_in_place`) for its whole turn, and the runtime moves its
//! other tasks to another thread, so the API keeps answering meanwhile. One that came
//! with a write needing no sync leads as it is (such a batch takes microseconds), though
//! a durable write gathered into its turn makes it sync there; measured with and without
//! that exception, leading as it is served 100 stepping runs faster at the same API
//! latency. Reads use their own connections on the calling thread: WAL lets them proceed
//! while a batch is written, so a read never waits for a write.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::Connection;
use tokio::sync::oneshot;

use baton_core::error::PortError;

use super::sql;

/// Prepared statements each connection keeps (rusqlite's default of 16 is fewer than the
/// store's distinct statements).
const STATEMENTS: usize = 64;

/// How a write that fails is undone without undoing the rest of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Undo {
    /// It makes at most one change, by one statement, which SQLite applies all or nothing.
    Statement,
    /// It may fail anywhere: it runs in a savepoint of its own, rolled back if it fails.
    Savepoint,
    /// Its expected failures (a version conflict) come before its first change: it needs
    /// no savepoint. Should it fail after changing something (only a broken store would),
    /// the whole batch is rolled back and every write in it fails, to be retried.
    CheckFirst,
}

/// A write waiting for the leader.
trait Job: Send {
    fn durable(&self) -> bool;
    fn undo(&self) -> Undo;
    /// Applies the write inside the batch's transaction; false when it failed (its
    /// savepoint is then rolled back).
    fn apply(&mut self, conn: &Connection) -> bool;
    /// Whether its write failed because the disk is full.
    fn failed_full(&self) -> bool;
    /// Tells the caller how it went, once the batch committed or failed.
    fn finish(self: Box<Self>, committed: Result<(), &BatchError>);
}

struct Pending<T, F> {
    durable: bool,
    undo: Undo,
    f: Option<F>,
    out: Option<Result<T, PortError>>,
    reply: oneshot::Sender<Result<T, PortError>>,
}

impl<T, F> Job for Pending<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, PortError> + Send,
{
    fn durable(&self) -> bool {
        self.durable
    }

    fn undo(&self) -> Undo {
        self.undo
    }

    fn apply(&mut self, conn: &Connection) -> bool {
        let Some(f) = self.f.take() else { return false };
        let out = catch_unwind(AssertUnwindSafe(|| f(conn))).unwrap_or_else(|_| {
            Err(PortError::broken(
                "embedded store: a write panicked",
                "panic while writing",
            ))
        });
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }

    fn failed_full(&self) -> bool {
        matches!(&self.out, Some(Err(e)) if e.is_storage_full())
    }

    fn finish(self: Box<Self>, committed: Result<(), &BatchError>) {
        let out = match (self.out, committed) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (_, Err(why)) if why.full => Err(super::disk_full(why.message.clone())),
            (_, Err(why)) => Err(PortError::unavailable(
                format!(
                    "embedded store: the write was not committed: {}",
                    why.message
                ),
                why.message.clone(),
            )),
            (None, Ok(())) => Err(PortError::broken(
                "embedded store: a write was never applied",
                "job skipped",
            )),
        };
        // The caller may have gone (its future dropped): the write stands all the same.
        let _ = self.reply.send(out);
    }
}

struct Writer {
    conn: Connection,
    /// Whether the connection is at `synchronous = FULL` (else `NORMAL`).
    synced: bool,
}

#[derive(Default)]
struct Waiting {
    jobs: Vec<Box<dyn Job>>,
    /// True while a leader is at work: it will take what is put here.
    leading: bool,
}

/// The connections of one store file.
pub(super) struct Db {
    path: PathBuf,
    writer: Mutex<Writer>,
    waiting: Mutex<Waiting>,
    idle: Mutex<Vec<Connection>>,
    stats: Mutex<WriteStats>,
    /// Checkpoints made by the writer's commits (counted by its WAL hook).
    checkpoints: Arc<AtomicU64>,
}

/// What the writer has done since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Writes applied.
    pub jobs: u64,
    /// Transactions they were applied in.
    pub batches: u64,
    /// Those of the transactions that were synced to disk (one fsync of the log each).
    pub synced: u64,
    /// Checkpoints that folded the log into the database file (two fsyncs each: the log,
    /// then the database).
    pub checkpoints: u64,
}

impl WriteStats {
    /// The fsyncs these writes cost: one per synced commit, two per checkpoint.
    pub fn fsyncs(&self) -> u64 {
        self.synced + 2 * self.checkpoints
    }
}

/// The log's length, in pages, at which a commit folds it into the database: SQLite's own
/// default (`wal_autocheckpoint`), done by the store so that it can count them.
const CHECKPOINT_PAGES: i32 = 1000;
/// The log's length at which a checkpoint waits for the reads under way so that the log
/// starts over (about 32 MB of 4 KB pages).
const RESTART_PAGES: i32 = 8 * CHECKPOINT_PAGES;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs blocking work `f`, telling a multi-thread runtime so that it moves this worker's
/// other tasks elsewhere meanwhile. (A current-thread runtime, as in tests, has nowhere to
/// move them: `f` just runs.)
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Clears `leading` if a leader unwinds, so that the next write leads instead of waiting
/// for ever.
struct StepDown<'a>(&'a Mutex<Waiting>);

impl Drop for StepDown<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            lock(self.0).leading = false;
        }
    }
}

impl Db {
    /// Takes over `conn` (schema in place, `synchronous = FULL`) as the writer's connection.
    pub(super) fn new(path: &Path, mut conn: Connection) -> Result<Self, PortError> {
        keep_plans(&conn)?;
        // What SQLite's automatic checkpoint does after a commit (a passive checkpoint once
        // the log reaches its length), counted: the hook takes the automatic one's place.
        // As the automatic one, it never fails the commit that called it (the commit has
        // happened: an error here would tell its callers otherwise); a checkpoint that
        // fails or copies nothing is tried again after the next commit.
        //
        // A passive checkpoint never waits, so while reads overlap without pause (many runs
        // stepping, a console polling) the log can never start over and grows without end:
        // 10 GB under a million parked runs being answered. Past `RESTART_PAGES` the
        // checkpoint restarts the log, waiting (`busy_timeout`) for the reads under way,
        // which take a query each.
        let checkpoints = Arc::new(AtomicU64::new(0));
        let made = checkpoints.clone();
        conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages| {
            if pages >= CHECKPOINT_PAGES {
                let mode = if pages >= RESTART_PAGES {
                    rusqlite::wal::CheckpointMode::RESTART
                } else {
                    rusqlite::wal::CheckpointMode::PASSIVE
                };
                match wal.checkpoint_v2(mode) {
                    Ok((_, copied)) if copied > 0 => {
                        made.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "embedded store: a checkpoint failed"),
                }
            }
            Ok(())
        }))
        .map_err(sql)?;
        Ok(Self {
            path: path.to_owned(),
            writer: Mutex::new(Writer { conn, synced: true }),
            waiting: Mutex::new(Waiting::default()),
            idle: Mutex::new(Vec::new()),
            stats: Mutex::new(WriteStats::default()),
            checkpoints,
        })
    }

    pub(super) fn stats(&self) -> WriteStats {
        WriteStats {
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            ..*lock(&self.stats)
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in a write transaction, all or nothing; `durable`: synced to disk before
    /// this returns. `undo`: how `f` is undone, alone, if it fails.
    pub(super) async fn write<T, F>(&self, durable: bool, undo: Undo, f: F) -> Result<T, PortError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, PortError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Pending {
            durable,
            undo,
            f: Some(f),
            out: None,
            reply,
        });
        let lead = {
            let mut w = lock(&self.waiting);
            w.jobs.push(job);
            !std::mem::replace(&mut w.leading, true)
        };
        if lead && durable {
            blocking(|| self.lead());
        } else if lead {
            // Without a sync a batch takes microseconds: not worth moving other tasks for.
            self.lead();
        }
        rx.await
            .map_err(|_| PortError::broken("embedded store: a write was dropped", "writer gone"))?
    }

    /// Applies batches until no job waits.
    fn lead(&self) {
        let _guard = StepDown(&self.waiting);
        let mut writer = lock(&self.writer);
        loop {
            let batch = {
                let mut w = lock(&self.waiting);
                if w.jobs.is_empty() {
                    w.leading = false;
                    return;
                }
                std::mem::take(&mut w.jobs)
            };
            // Writes that need no sync go first, in a transaction of their own, and are
            // answered before the sync: a receive must not wait out other runs' fsync.
            let (synced, quick): (Vec<_>, Vec<_>) = batch.into_iter().partition(|j| j.durable());
            for (mut batch, durable) in [(quick, false), (synced, true)] {
                if !batch.is_empty() {
                    self.commit(&mut writer, &mut batch, durable);
                }
            }
        }
    }

    /// Applies `batch` in one transaction (synced when `durable`) and answers its callers.
    fn commit(&self, writer: &mut Writer, batch: &mut Vec<Box<dyn Job>>, durable: bool) {
        let result = apply_batch(writer, batch, durable);
        if let Err(e) = &result {
            tracing::error!(error = %e, jobs = batch.len(), "embedded store: a batch of writes failed");
            if !writer.conn.is_autocommit() {
                let _ = writer.conn.execute_batch("ROLLBACK");
            }
        }
        {
            let mut st = lock(&self.stats);
            st.jobs += batch.len() as u64;
            st.batches += 1;
            st.synced += u64::from(durable);
        }
        let committed = result.as_ref().map(|_| ());
        for job in batch.drain(..) {
            job.finish(committed);
        }
    }

    /// Runs `f` over a read connection. Statements in `f` see the store as of their
    /// start; wrap several in a transaction to see one moment.
    pub(super) async fn read<T, F>(&self, f: F) -> Result<T, PortError>
    where
        F: FnOnce(&Connection) -> Result<T, PortError>,
    {
        let conn = match lock(&self.idle).pop() {
            Some(c) => c,
            None => self.open_reader()?,
        };
        let out = f(&conn);
        // A connection left inside a transaction (an error mid-way) is not reused.
        if conn.is_autocommit() {
            lock(&self.idle).push(conn);
        }
        out
    }

    fn open_reader(&self) -> Result<Connection, PortError> {
        let conn = Connection::open(&self.path).map_err(sql)?;
        keep_plans(&conn)?;
        conn.execute_batch("PRAGMA busy_timeout = 5000; PRAGMA query_only = 1;")
            .map_err(sql)?;
        Ok(conn)
    }

    /// Folds the write-ahead log into the database file (outside any write transaction).
    pub(super) async fn checkpoint(&self) -> Result<(), PortError> {
        let writer = lock(&self.writer);
        blocking(|| {
            writer
                .conn
                .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
                .map_err(sql)
        })
    }
}

/// Keeps `conn`'s statements prepared once: a cache large enough for all of the store's
/// statements, and the query planner stability guarantee. Without it SQLite compiles a
/// statement again whenever a value bound where the planner might look at it changes
/// (`LIMIT ?` between 1 and more, say); the receive's query was compiled anew on most
/// steps of a lone run, an eighth of its CPU. The store's plans do not depend on values.
fn keep_plans(conn: &Connection) -> Result<(), PortError> {
    conn.set_prepared_statement_cache_capacity(STATEMENTS);
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map(drop)
    .map_err(sql)
}

/// One transaction over the batch, one savepoint per job that needs one.
/// Why a batch of writes was not committed; `full` when the disk is.
#[derive(Debug)]
pub(super) struct BatchError {
    message: String,
    full: bool,
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<&str> for BatchError {
    fn from(message: &str) -> Self {
        Self {
            message: message.into(),
            full: false,
        }
    }
}

fn apply_batch(
    w: &mut Writer,
    batch: &mut [Box<dyn Job>],
    durable: bool,
) -> Result<(), BatchError> {
    let conn = &w.conn;
    // Cached: a batch runs four of these and two per job, and parsing them each time was
    // a few percent of the CPU with many runs stepping.
    let run = |s: &str| {
        conn.prepare_cached(s)
            .and_then(|mut st| st.raw_execute())
            .map(drop)
            .map_err(|e| BatchError {
                full: e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull),
                message: format!("{s}: {e}"),
            })
    };
    if w.synced != durable {
        run(if durable {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = NORMAL"
        })?;
        w.synced = durable;
    }
    run("BEGIN IMMEDIATE")?;
    for job in batch.iter_mut() {
        let undo = job.undo();
        if undo == Undo::Savepoint {
            run("SAVEPOINT job")?;
        }
        let changes = conn.total_changes();
        let ok = job.apply(conn);
        if conn.is_autocommit() {
            return Err(BatchError {
                message: "SQLite rolled the transaction back".into(),
                full: job.failed_full(),
            });
        }
        match undo {
            Undo::Savepoint => {
                if !ok {
                    run("ROLLBACK TO job")?;
                }
                run("RELEASE job")?;
            }
            Undo::CheckFirst if !ok && conn.total_changes() != changes => {
                return Err(BatchError {
                    message: "a write failed after changing rows".into(),
                    full: job.failed_full(),
                });
            }
            Undo::CheckFirst | Undo::Statement => {}
        }
    }
    run("COMMIT")
}

#[cfg(test)]
#[path = "db_tests.rs"]
mod tests;
