use std::sync::Arc;
use std::time::Duration;

use super::*;

fn open(dir: &Path) -> Arc<Db> {
    let path = dir.join("t.db");
    let conn = Connection::open(&path).expect("open");
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
         CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    )
    .expect("schema");
    Arc::new(Db::new(&path, conn).expect("writer"))
}

/// Waits until `n` writes are queued behind a held writer (one batch to come).
fn wait_queued(db: &Db, n: usize) {
    for _ in 0..500 {
        if lock(&db.waiting).jobs.len() == n {
            break;
        }
        // A plain sleep: the writer's guard must not be held across an await.
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(lock(&db.waiting).jobs.len(), n, "all {n} writes queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_waiting_together_share_a_transaction_and_a_failing_one_fails_alone() {
    let dir = tempfile::tempdir().expect("tmp");
    let db = open(dir.path());
    // Hold the writer as a long sync would, while 200 writes queue up behind it.
    let held = lock(&db.writer);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..200i64 {
        let db = db.clone();
        set.spawn(async move {
            let out = db
                .write(i % 3 == 0, Undo::Savepoint, move |c| {
                    c.execute("INSERT INTO t VALUES (?1, 'a')", [i])
                        .map_err(sql)?;
                    if i % 10 == 0 {
                        // Fails after the first insert: the savepoint must undo both.
                        c.execute("INSERT INTO t VALUES (?1, 'b')", [i])
                            .map_err(sql)?;
                    }
                    Ok(i)
                })
                .await;
            (i, out)
        });
    }
    // One of them leads and waits for the writer; the others wait for it.
    wait_queued(&db, 200);
    drop(held);
    while let Some(r) = set.join_next().await {
        let (i, out) = r.expect("task");
        match out {
            Ok(v) => assert!(i % 10 != 0 && v == i),
            Err(e) => assert!(i % 10 == 0, "write {i} failed: {e}"),
        }
    }
    let stats = db.stats();
    // Two transactions: the writes needing no sync, answered first, and the durable
    // ones, synced once.
    assert_eq!(
        stats,
        WriteStats {
            jobs: 200,
            batches: 2,
            synced: 1,
            checkpoints: 0,
        }
    );
    let keys: Vec<i64> = db
        .read(|c| {
            let mut s = c.prepare("SELECT k FROM t ORDER BY k").map_err(sql)?;
            s.query_map([], |r| r.get(0))
                .map_err(sql)?
                .collect::<Result<_, _>>()
                .map_err(sql)
        })
        .await
        .expect("read");
    let expected: Vec<i64> = (0..200).filter(|i| i % 10 != 0).collect();
    assert_eq!(keys, expected, "every write but the failed ones, whole");
}

#[tokio::test]
async fn a_lone_write_is_applied_at_once_and_synced_only_when_asked() {
    let dir = tempfile::tempdir().expect("tmp");
    let db = open(dir.path());
    for (i, durable) in [(1i64, false), (2, true), (3, false)] {
        db.write(durable, Undo::Statement, move |c| {
            c.execute("INSERT INTO t VALUES (?1, 'x')", [i])
                .map_err(sql)
        })
        .await
        .expect("write");
    }
    assert_eq!(
        db.stats(),
        WriteStats {
            jobs: 3,
            batches: 3,
            synced: 1,
            checkpoints: 0,
        }
    );
    // A write that fails reports its own error and leaves the writer usable.
    let dup = db
        .write(true, Undo::Statement, |c| {
            c.execute("INSERT INTO t VALUES (1, 'again')", [])
                .map_err(sql)
        })
        .await;
    assert!(dup.is_err());
    let n: i64 = db
        .read(|c| {
            c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
                .map_err(sql)
        })
        .await
        .expect("count");
    assert_eq!(n, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_first_write_fails_alone_before_its_first_change_and_with_its_batch_after() {
    let dir = tempfile::tempdir().expect("tmp");
    let db = open(dir.path());
    // Three writes in one batch: one that fails its check (changing nothing), and two
    // that succeed.
    let run = |fail_after_change: bool| {
        let db = db.clone();
        async move {
            let guard = lock(&db.writer);
            let mut set = tokio::task::JoinSet::new();
            for i in 0..3i64 {
                let db = db.clone();
                set.spawn(async move {
                    db.write(true, Undo::CheckFirst, move |c| {
                        if i == 1 && !fail_after_change {
                            return Err(PortError::Conflict);
                        }
                        c.execute(
                            "INSERT INTO t VALUES (?1, 'c')",
                            [i + 100 * i64::from(fail_after_change)],
                        )
                        .map_err(sql)?;
                        if i == 1 {
                            return Err(PortError::broken("half-way", "test"));
                        }
                        Ok(i)
                    })
                    .await
                });
            }
            wait_queued(&db, 3);
            drop(guard);
            let mut outs = Vec::new();
            while let Some(r) = set.join_next().await {
                outs.push(r.expect("task"));
            }
            outs
        }
    };
    let outs = run(false).await;
    assert_eq!(outs.iter().filter(|o| o.is_ok()).count(), 2, "{outs:?}");
    assert!(outs.iter().any(|o| matches!(o, Err(PortError::Conflict))));
    let count = |db: Arc<Db>| async move {
        db.read(|c| {
            c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get::<_, i64>(0))
                .map_err(sql)
        })
        .await
        .expect("count")
    };
    assert_eq!(count(db.clone()).await, 2);
    // One that fails after its insert takes its whole batch with it: nothing half-done
    // is committed, and every writer is told.
    let outs = run(true).await;
    assert!(outs.iter().all(|o| o.is_err()), "{outs:?}");
    assert_eq!(count(db.clone()).await, 2, "the batch was rolled back");
}

/// Writes `n` rows of `bytes` each, one durable write per row.
async fn write_rows(db: &Db, n: i64, bytes: usize) {
    let big = "x".repeat(bytes);
    for i in 0..n {
        let v = big.clone();
        db.write(true, Undo::Statement, move |c| {
            c.execute("INSERT INTO t VALUES (?1, ?2)", rusqlite::params![i, v])
                .map_err(sql)
        })
        .await
        .expect("write");
    }
}

/// The length of the write-ahead log of `open(dir)`'s database.
fn wal_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("t.db-wal")).expect("wal").len()
}

#[tokio::test]
async fn the_log_is_folded_into_the_database_as_it_grows_and_each_fold_counted() {
    let dir = tempfile::tempdir().expect("tmp");
    let db = open(dir.path());
    // Three times the log's length in pages, a page and more per write (4 KB pages).
    write_rows(&db, 1500, 5000).await;
    let stats = db.stats();
    assert!(stats.checkpoints >= 2, "{stats:?}");
    assert_eq!(stats.fsyncs(), stats.synced + 2 * stats.checkpoints);
    // Folded, the log starts over from its head: it stays about its length, however much
    // was written (~3,000 pages here).
    let wal = wal_len(dir.path());
    assert!(wal < 6 * 1024 * 1024, "the log grew to {wal} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_stays_bounded_while_readers_never_pause() {
    let dir = tempfile::tempdir().expect("tmp");
    let db = open(dir.path());
    // Readers one after another, overlapping, for as long as the writes go on: a passive
    // checkpoint can never find the log free of them.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (db, stop) = (db.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    db.read(|c| {
                        c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get::<_, i64>(0))
                            .map_err(sql)
                    })
                    .await
                    .expect("read");
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    write_rows(&db, 12_000, 3000).await;
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.await.expect("reader");
    }
    // About 12,000 pages were written: the log must have started over along the way.
    let wal = wal_len(dir.path());
    assert!(wal < 40 * 1024 * 1024, "the log grew to {wal} bytes");
}
