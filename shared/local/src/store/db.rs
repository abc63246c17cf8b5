//! The embedded store's connections: one writer connection that group-commits, and read
//! connections beside it.
//!
//! Every write is a job put in a queue. The first caller to find no write under way
//! becomes the leader: it takes every job waiting and applies them in one `IMMEDIATE`
//! transaction, each inside its own savepoint (so a job that fails, a version conflict
//! say, is rolled back alone and the others stand), syncs it to disk once (`synchronous =
//! FULL`) when any job in it asked to be durable, and only then tells each job's caller.
//! It goes on with whatever gathered meanwhile, and stops when nothing waits. With many
//! runs stepping at once their commits share one fsync instead of paying one each; a
//! lone caller writes at once, with no hand-over to another thread.
//!
//! The leader does blocking work: on a multi-thread runtime it says so
//! (`block_in_place`), and the runtime moves its other tasks to another thread, so the
//! API keeps answering while a batch syncs. Reads use their own connections (WAL lets
//! them proceed while a batch is written) and never wait for a write.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;
use tokio::sync::oneshot;

use baton_core::error::PortError;

use super::sql;

/// A write waiting for the leader.
trait Job: Send {
    fn durable(&self) -> bool;
    /// False for a job of one statement, which SQLite already applies all or nothing.
    fn savepoint(&self) -> bool;
    /// Applies the write inside the batch's transaction; false when it failed (its
    /// savepoint is then rolled back).
    fn apply(&mut self, conn: &Connection) -> bool;
    /// Tells the caller how it went, once the batch committed or failed.
    fn finish(self: Box<Self>, committed: Result<(), &str>);
}

struct Pending<T, F> {
    durable: bool,
    savepoint: bool,
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

    fn savepoint(&self) -> bool {
        self.savepoint
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

    fn finish(self: Box<Self>, committed: Result<(), &str>) {
        let out = match (self.out, committed) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (_, Err(why)) => Err(PortError::unavailable(
                format!("embedded store: the write was not committed: {why}"),
                why.to_owned(),
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
}

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
    pub(super) fn new(path: &Path, conn: Connection) -> Self {
        Self {
            path: path.to_owned(),
            writer: Mutex::new(Writer { conn, synced: true }),
            waiting: Mutex::new(Waiting::default()),
            idle: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in a write transaction, all or nothing; `durable`: synced to disk before
    /// this returns. `single`: `f` makes at most one change, by one statement (atomic by
    /// itself), so it needs no savepoint of its own.
    pub(super) async fn write<T, F>(
        &self,
        durable: bool,
        single: bool,
        f: F,
    ) -> Result<T, PortError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, PortError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Pending {
            durable,
            savepoint: !single,
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
            let mut batch = {
                let mut w = lock(&self.waiting);
                if w.jobs.is_empty() {
                    w.leading = false;
                    return;
                }
                std::mem::take(&mut w.jobs)
            };
            let durable = batch.iter().any(|j| j.durable());
            let result = apply_batch(&mut writer, &mut batch, durable);
            if let Err(e) = &result {
                tracing::error!(error = %e, jobs = batch.len(), "embedded store: a batch of writes failed");
                if !writer.conn.is_autocommit() {
                    let _ = writer.conn.execute_batch("ROLLBACK");
                }
            }
            let committed = result.as_ref().map(|_| ()).map_err(String::as_str);
            for job in batch {
                job.finish(committed);
            }
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

/// One transaction over the batch, one savepoint per job that needs one.
fn apply_batch(w: &mut Writer, batch: &mut [Box<dyn Job>], durable: bool) -> Result<(), String> {
    let conn = &w.conn;
    let run = |s: &str| conn.execute_batch(s).map_err(|e| format!("{s}: {e}"));
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
        let savepoint = job.savepoint();
        if savepoint {
            run("SAVEPOINT job")?;
        }
        let ok = job.apply(conn);
        if conn.is_autocommit() {
            return Err("SQLite rolled the transaction back".into());
        }
        if savepoint {
            if !ok {
                run("ROLLBACK TO job")?;
            }
            run("RELEASE job")?;
        }
    }
    run("COMMIT")
}
