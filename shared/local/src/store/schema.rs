//! The SQLite schema: one file holds runs, timelines, CTAs, the step queue and timers.
//! Every statement is idempotent, so opening an existing file applies it again harmlessly.

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_key  INTEGER PRIMARY KEY,
    run_id   TEXT NOT NULL UNIQUE,
    owner    TEXT NOT NULL,
    version  INTEGER NOT NULL,
    body     TEXT NOT NULL,
    outbox   TEXT,
    idem_key TEXT,
    UNIQUE (owner, idem_key)
);
-- An owner's top-level runs, newest first (what `list_runs` pages), and the runs under a
-- top-level run, oldest first (what `list_descendants` pages): on the columns `parent` and
-- `root`, which `migrate` adds (`rows.rs`).
CREATE TABLE IF NOT EXISTS entries (
    run_key INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    body    BLOB NOT NULL,
    UNIQUE (run_key, seq)
);
CREATE TABLE IF NOT EXISTS ctas (
    cta_id TEXT PRIMARY KEY,
    owner  TEXT NOT NULL,
    status TEXT NOT NULL,
    body   TEXT NOT NULL,
    -- when the answer or expiry was written, while its run has not been told (the CTA's outbox)
    unsent INTEGER
);
CREATE INDEX IF NOT EXISTS ctas_by_owner ON ctas (owner, status);
-- The CTAs under a top-level run (what `list_ctas` pages with a root run): each row's rowid
-- orders them within a key, as in ctas_by_owner.
CREATE INDEX IF NOT EXISTS ctas_by_root ON ctas (
    coalesce(json_extract(body, '$.rootRunId'), json_extract(body, '$.runId')), status);
-- Who a CTA is assigned to besides its owner (`user:<id>`, `group:<name>`): an assignee's inbox.
CREATE TABLE IF NOT EXISTS cta_assignees (
    principal TEXT NOT NULL,
    cta_id    TEXT NOT NULL,
    PRIMARY KEY (principal, cta_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queue (
    id         INTEGER PRIMARY KEY,
    dedup_id   TEXT NOT NULL,
    group_id   TEXT NOT NULL,
    body       TEXT NOT NULL,
    visible_at INTEGER NOT NULL,
    receives   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS queue_by_group ON queue (group_id, id);
CREATE INDEX IF NOT EXISTS queue_by_dedup ON queue (dedup_id);
CREATE TABLE IF NOT EXISTS events (
    seq         INTEGER PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    detail_type TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS timers (
    name   TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    at_ms  INTEGER NOT NULL
) WITHOUT ROWID;
-- The follow-ups admitted to a run's waiting ones and not yet taken up (the cap's count):
-- `at_ms` when each was admitted, NULL once the run holds it in its queue (`at_ms`, which
-- `migrate` adds to a data directory made before it).
CREATE TABLE IF NOT EXISTS follow_ups (
    run_id     TEXT NOT NULL,
    message_id TEXT NOT NULL,
    PRIMARY KEY (run_id, message_id)
) WITHOUT ROWID;
-- The active-run slots top-level runs hold (BATON_MAX_ACTIVE_RUNS_PER_OWNER): an owner's
-- count is its rows, taken and given back in the writes that start and end its runs.
CREATE TABLE IF NOT EXISTS active_slots (
    run_id TEXT PRIMARY KEY,
    owner  TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS active_slots_owner ON active_slots (owner);
-- What each owner's runs' own model calls cost, by UTC day (BATON_MAX_DAILY_COST_USD_PER_OWNER).
CREATE TABLE IF NOT EXISTS owner_spend (
    owner TEXT NOT NULL,
    day   TEXT NOT NULL,
    usd   REAL NOT NULL,
    PRIMARY KEY (owner, day)
) WITHOUT ROWID;
-- Each budgeted run tree's ledger (its budget with every raise, what its runs spent), as
-- JSON, by its top-level run: added to in the commits of the tree's steps.
CREATE TABLE IF NOT EXISTS budgets (
    root_run_id TEXT PRIMARY KEY,
    ledger      TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
";
