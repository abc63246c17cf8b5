//! Opening the store, its figures, and the read and write paths every port method takes
//! (the writer thread's transactions, the read connections).

use super::*;

impl LocalStore {
    /// Opens (or creates) `dir/baton.db`.
    ///
    /// What it creates is its user's alone (the database holds the dev token and the link
    /// key): the directory 0700, the database 0600 (SQLite gives its log files the
    /// database's mode).
    pub fn open(dir: &Path) -> Result<Self, PortError> {
        create_private(dir).map_err(|e| broken("create data dir", e))?;
        let path = dir.join("baton.db");
        create_private_file(&path).map_err(|e| broken("create the database file", e))?;
        // A data directory made before files were private is made so.
        #[cfg(unix)]
        for name in ["baton.db", "baton.db-wal", "baton.db-shm"] {
            use std::os::unix::fs::PermissionsExt;
            let _ =
                std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o600));
        }
        let conn = Connection::open(&path).map_err(sql)?;
        // A step changes about six pages (its run, its entries and their index, the queue
        // and its two indexes) and the write-ahead log takes each whole: 4 KB pages (the
        // OS's) write a quarter of what 16 KB pages did, and a lone run stepped a quarter
        // faster with them. Entries larger than a page overflow into pages of their own.
        // (An existing file keeps the page size it was made with.)
        conn.execute_batch(
            "PRAGMA page_size = 4096;
             PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA temp_store = MEMORY;
             PRAGMA busy_timeout = 5000;",
        )
        .map_err(sql)?;
        // Before anything is changed: a store a newer release wrote is not ours to touch.
        let has_meta: bool = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(sql)?
            > 0;
        let store = format!("{}", path.display());
        let raw: Option<String> = if has_meta {
            conn.query_row("SELECT value FROM meta WHERE key = 'format'", [], |r| {
                r.get::<_, String>(0)
            })
            .optional()
            .map_err(sql)?
        } else {
            None
        };
        // No format recorded: a new store, or one written before formats were (format 1),
        // which the migrations below bring up to this release's.
        let found = match raw {
            Some(raw) => Some(baton_core::ports::parse_store_format(&raw, &store)?),
            None => {
                if has_meta {
                    tracing::info!(store = %store, "no store format recorded (written before formats were: format 1): migrating it to this release's");
                }
                None
            }
        };
        baton_core::ports::check_store_format(found, &store)?;
        conn.execute_batch(SCHEMA).map_err(sql)?;
        migrate(&conn)?;
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('format', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [baton_core::ports::STORE_FORMAT.to_string()],
        )
        .map_err(sql)?;
        Ok(Self {
            db: Arc::new(Db::new(&path, conn)?),
            sent: Arc::new(Notify::new()),
            acks: Arc::default(),
            releases: Arc::default(),
            reads: Arc::default(),
        })
    }

    /// What steps have read of timelines so far (the whole timeline, or a step's window).
    pub fn read_stats(&self) -> ReadStats {
        use std::sync::atomic::Ordering::Relaxed;
        ReadStats {
            entries: self.reads.entries.load(Relaxed),
            bytes: self.reads.bytes.load(Relaxed),
        }
    }

    pub fn path(&self) -> &Path {
        self.db.path()
    }

    /// How many writes the store applied, in how many transactions, how many synced.
    pub fn write_stats(&self) -> WriteStats {
        self.db.stats()
    }

    /// Runs `f` in a transaction of the writer thread, all or nothing; `durable`: synced
    /// to disk before this returns.
    pub(super) async fn write<T, F>(&self, durable: bool, f: F) -> Result<T, PortError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, PortError> + Send + 'static,
    {
        self.db.write(durable, Undo::Savepoint, f).await
    }

    /// [`LocalStore::write`] for an `f` that changes rows by one statement at most.
    pub(super) async fn write_one<T, F>(&self, durable: bool, f: F) -> Result<T, PortError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, PortError> + Send + 'static,
    {
        self.db.write(durable, Undo::Statement, f).await
    }

    /// Runs `f` over a read connection (it never waits for a write).
    pub(super) async fn read<T, F>(&self, f: F) -> Result<T, PortError>
    where
        F: FnOnce(&Connection) -> Result<T, PortError>,
    {
        self.db.read(f).await
    }

    /// Runs whose committed effects are not marked performed (for the start-up sweep).
    pub async fn runs_with_outbox(&self) -> Result<Vec<String>, PortError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached("SELECT run_id FROM runs WHERE outbox IS NOT NULL")
                .map_err(sql)?;
            stmt.query_map([], |r| r.get(0))
                .map_err(sql)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql)
        })
        .await
    }

    pub async fn get_meta(&self, key: &str) -> Result<Option<String>, PortError> {
        let key = key.to_owned();
        self.read(move |c| {
            c.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
                .optional()
                .map_err(sql)
        })
        .await
    }

    pub async fn set_meta(&self, key: &str, value: &str) -> Result<(), PortError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.write_one(true, move |c| {
            c.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    /// Folds the write-ahead log into the database file and returns its size in bytes.
    pub async fn checkpoint(&self) -> Result<u64, PortError> {
        self.db.checkpoint().await?;
        let mut total = 0;
        for suffix in ["", "-wal"] {
            let mut p = self.path().to_owned().into_os_string();
            p.push(suffix);
            total += std::fs::metadata(&p).map_or(0, |m| m.len());
        }
        Ok(total)
    }
}

/// Creates `dir` (and its parents) readable by its user only, if it does not exist.
pub fn create_private(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates the file at `path` readable and writable by its user only, if it does not exist.
pub fn create_private_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}
