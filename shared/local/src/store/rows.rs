//! How runs, entries and outboxes are kept in rows: JSON and packed entry bytes, the
//! columns added since the first release.

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use baton_core::error::PortError;
use baton_core::message::Effect;
use baton_core::ports::RunRecord;
use baton_core::run::Run;
use baton_core::timeline::Entry;

use super::{broken, sql};

pub(super) fn to_json<T: Serialize>(v: &T) -> Result<String, PortError> {
    serde_json::to_string(v).map_err(|e| broken("encode", e))
}

pub(super) fn from_json<T: DeserializeOwned>(s: &str) -> Result<T, PortError> {
    serde_json::from_str(s).map_err(|e| broken("decode", e))
}

pub(super) fn encode_entry(e: &Entry) -> Result<(i64, Vec<u8>), PortError> {
    let body = baton_codec::encode_with(e, baton_codec::Packing::Lz4)
        .map_err(|e| broken("encode entry", e))?;
    Ok((e.seq as i64, body))
}

pub(super) fn encode_entries(entries: &[Entry]) -> Result<Vec<(i64, Vec<u8>)>, PortError> {
    entries.iter().map(encode_entry).collect()
}

/// How many active-run slots `owner` holds.
pub(super) fn slots_held(c: &Connection, owner: &str) -> Result<u64, PortError> {
    c.prepare_cached("SELECT COUNT(*) FROM active_slots WHERE owner = ?1")
        .and_then(|mut s| s.query_row([owner], |r| r.get::<_, i64>(0)))
        .map(|n| n.max(0) as u64)
        .map_err(sql)
}

/// Takes an active-run slot for `run_id` of `owner` unless `limit` are held (within the
/// caller's write: SQLite's writes are one at a time, so the count is exact).
fn take_slot(c: &Connection, run_id: &str, owner: &str, limit: u32) -> Result<(), PortError> {
    let held = slots_held(c, owner)?;
    if held >= u64::from(limit) {
        return Err(PortError::QuotaExceeded {
            limit: limit.into(),
            current: held,
        });
    }
    c.prepare_cached("INSERT INTO active_slots (run_id, owner) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![run_id, owner]))
        .map_err(sql)?;
    Ok(())
}

/// What `owner`'s runs spent on UTC day `day`.
pub(super) fn spent_on(c: &Connection, owner: &str, day: &str) -> Result<f64, PortError> {
    c.prepare_cached("SELECT usd FROM owner_spend WHERE owner = ?1 AND day = ?2")
        .and_then(|mut s| {
            s.query_row(params![owner, day], |r| r.get::<_, f64>(0))
                .optional()
        })
        .map(|v| v.unwrap_or(0.0))
        .map_err(sql)
}

/// Adds `usd` to what `owner`'s runs spent on UTC day `day`.
pub(super) fn add_spend(c: &Connection, owner: &str, day: &str, usd: f64) -> Result<(), PortError> {
    c.prepare_cached(
        "INSERT INTO owner_spend (owner, day, usd) VALUES (?1, ?2, ?3)
         ON CONFLICT (owner, day) DO UPDATE SET usd = usd + excluded.usd",
    )
    .and_then(|mut s| s.execute(params![owner, day, usd]))
    .map_err(sql)?;
    Ok(())
}

/// Admits run `run_id` of `owner` by `a` (within the caller's write, so exactly): its
/// owner spent less than the day's allowance, and it takes an active-run slot unless
/// `limit` are held.
pub(super) fn admit(
    c: &Connection,
    run_id: &str,
    owner: &str,
    a: &baton_core::ports::Admission,
) -> Result<(), PortError> {
    if let Some(cost) = &a.daily_cost {
        let spent = spent_on(c, owner, &cost.day.to_string())?;
        if spent >= cost.limit_usd {
            return Err(PortError::DailyCostExceeded {
                limit_usd: cost.limit_usd,
                spent_usd: spent,
            });
        }
    }
    match a.active_runs {
        Some(limit) => take_slot(c, run_id, owner, limit),
        None => Ok(()),
    }
}

/// Columns added since the first release, added to data directories made before them.
pub(super) fn migrate(conn: &Connection) -> Result<(), PortError> {
    for (table, column, decl) in [
        ("ctas", "unsent", "INTEGER"),
        ("runs", "failure", "TEXT"),
        // A follow-up's claim on a finished run's next turn, and when (ms since the epoch).
        ("runs", "claim", "TEXT"),
        ("runs", "claim_at", "INTEGER"),
        // A run's parent and top-level run, which the lists' indexes read (they read them
        // from the body before, and every commit, which rewrites the body, parsed it for
        // them). Filled in from the body when added.
        ("runs", "parent", "TEXT"),
        ("runs", "root", "TEXT"),
        // When a follow-up was admitted (NULL: its run holds it, as those admitted before
        // it are taken to be).
        ("follow_ups", "at_ms", "INTEGER"),
    ] {
        let exists: bool = conn
            .query_row(
                &format!("SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = ?1"),
                [column],
                |r| r.get::<_, i64>(0),
            )
            .map_err(sql)?
            > 0;
        if !exists {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))
                .map_err(sql)?;
            let from = match column {
                "parent" => Some("$.parent.runId"),
                "root" => Some("$.rootRunId"),
                _ => None,
            };
            if let Some(path) = from {
                conn.execute(
                    &format!("UPDATE runs SET {column} = json_extract(body, ?1)"),
                    [path],
                )
                .map_err(sql)?;
            }
        }
    }
    // The lists' indexes on those columns (the ones on the body's fields go).
    conn.execute_batch(
        "DROP INDEX IF EXISTS runs_by_owner;
         DROP INDEX IF EXISTS runs_by_root;
         CREATE INDEX IF NOT EXISTS runs_top_by_owner ON runs (owner, run_key) WHERE parent IS NULL;
         CREATE INDEX IF NOT EXISTS runs_under_root ON runs (root, run_key) WHERE root IS NOT NULL;",
    )
    .map_err(sql)?;
    Ok(())
}

/// A run's row: its body, outbox and last failure, and whether it holds an active-run slot.
pub(super) type RunRow = (String, Option<String>, Option<String>, bool);

/// What a [`RunRow`] is read with (the run's table is `runs`).
pub(super) const RUN_ROW: &str = "body, outbox, failure, \
     EXISTS (SELECT 1 FROM active_slots a WHERE a.run_id = runs.run_id)";

pub(super) fn record((body, outbox, failure, slot): RunRow) -> Result<RunRecord, PortError> {
    let mut run: Run = from_json(&body)?;
    run.outcome.last_error = failure.map(|f| from_json(&f)).transpose()?;
    run.active_slot = slot;
    Ok(RunRecord {
        run,
        outbox: match outbox {
            Some(o) => from_json(&o)?,
            None => Vec::new(),
        },
    })
}

pub(super) fn run_row(c: &Connection, run_id: &str) -> Result<Option<RunRow>, PortError> {
    c.prepare_cached(&format!("SELECT {RUN_ROW} FROM runs WHERE run_id = ?1"))
        .and_then(|mut s| {
            s.query_row([run_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
        })
        .map_err(sql)
}

pub(super) fn insert_entries(
    c: &Connection,
    key: i64,
    entries: &[(i64, Vec<u8>)],
) -> Result<(), PortError> {
    let mut stmt = c
        .prepare_cached("INSERT INTO entries (run_key, seq, body) VALUES (?1, ?2, ?3)")
        .map_err(sql)?;
    for (seq, body) in entries {
        stmt.execute(params![key, seq, body]).map_err(sql)?;
    }
    Ok(())
}

pub(super) fn decode_entries(
    rows: impl Iterator<Item = rusqlite::Result<Vec<u8>>>,
) -> Result<Vec<Entry>, PortError> {
    rows.map(|b| {
        baton_codec::decode::<Entry>(&b.map_err(sql)?).map_err(|e| broken("decode entry", e))
    })
    .collect()
}

pub(super) fn outbox_json(effects: &[Effect]) -> Result<Option<String>, PortError> {
    if effects.is_empty() {
        Ok(None)
    } else {
        to_json(&effects).map(Some)
    }
}

/// A run row to insert: id, owner, version, body, its first entries.
pub(super) struct NewRun {
    pub(super) run_id: String,
    pub(super) owner: String,
    pub(super) version: i64,
    pub(super) body: String,
    /// Its parent's id and its top-level run's (none for a top-level run): columns of their
    /// own, so that the lists' indexes need not read the body a commit rewrites.
    pub(super) parent: Option<String>,
    pub(super) root: Option<String>,
    pub(super) entries: Vec<(i64, Vec<u8>)>,
}

impl NewRun {
    pub(super) fn encode(run: &Run, entries: &[Entry]) -> Result<Self, PortError> {
        Ok(Self {
            run_id: run.run_id.clone(),
            owner: run.owner.clone(),
            version: run.version as i64,
            body: to_json(run)?,
            parent: run.origin.parent.as_ref().map(|p| p.run_id.clone()),
            root: run.origin.root_run_id.clone(),
            entries: encode_entries(entries)?,
        })
    }
}

/// The ledger of the run tree under `root_run_id`, if it is budgeted.
pub(super) fn ledger(
    c: &Connection,
    root_run_id: &str,
) -> Result<Option<baton_core::budget::Ledger>, PortError> {
    let body: Option<String> = c
        .prepare_cached("SELECT ledger FROM budgets WHERE root_run_id = ?1")
        .and_then(|mut s| s.query_row([root_run_id], |r| r.get(0)).optional())
        .map_err(sql)?;
    body.map(|b| {
        serde_json::from_str(&b)
            .map_err(|e| PortError::broken(format!("budget ledger of {root_run_id}"), e))
    })
    .transpose()
}

/// Writes the ledger of the run tree under `root_run_id` (within the caller's write).
pub(super) fn put_ledger(
    c: &Connection,
    root_run_id: &str,
    ledger: &baton_core::budget::Ledger,
) -> Result<(), PortError> {
    let body = super::to_json(ledger)?;
    c.prepare_cached(
        "INSERT INTO budgets (root_run_id, ledger) VALUES (?1, ?2)
         ON CONFLICT (root_run_id) DO UPDATE SET ledger = excluded.ledger",
    )
    .and_then(|mut s| s.execute(params![root_run_id, body]))
    .map_err(sql)?;
    Ok(())
}

/// Adds a commit's spending and raise to its tree's ledger (within the commit's write, so
/// each once).
pub(super) fn add_to_ledger(
    c: &Connection,
    root_run_id: &str,
    budget: baton_core::budget::Budget,
    spent_usd: f64,
    raise: Option<&baton_core::budget::Raise>,
) -> Result<(), PortError> {
    let mut ledger =
        ledger(c, root_run_id)?.unwrap_or_else(|| baton_core::budget::Ledger::new(budget));
    ledger.spent_usd += spent_usd;
    if let Some(r) = raise {
        ledger.budget_usd += r.by_usd;
        ledger.raises.push(r.clone());
    }
    put_ledger(c, root_run_id, &ledger)
}
