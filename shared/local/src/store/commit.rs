//! A step's commit: conditional on the run's version, in the writer's group transaction;
//! with its step messages enqueued in the same transaction when all its effects are sends.

use baton_core::error::PortError;
use baton_core::message::{Effect, Transition};
use baton_core::ports::SendingStore;

use rusqlite::{OptionalExtension, params};

use super::db::Undo;
use super::{LocalStore, NewRun, encode_entries, insert_entries, outbox_json, queue, sql, to_json};

impl LocalStore {
    /// `Store::commit`, and with `send` also [`SendingStore::commit_sending`]: the transition's
    /// step messages enqueued in the commit's transaction, and no outbox kept.
    pub(super) async fn commit_with(
        &self,
        expected_version: u64,
        t: &Transition,
        send: bool,
    ) -> Result<(), PortError> {
        // Everything is encoded here, on the caller's thread; the writer only writes.
        let run_id = t.run.run_id.clone();
        let (version, body) = (t.run.version as i64, to_json(&t.run)?);
        let (outbox, sends) = if send {
            let messages = t.effects.iter().map(|e| match e {
                Effect::Send(m) => Ok(m),
                other => Err(PortError::broken(
                    format!("embedded store: a commit cannot perform {other:?}"),
                    "not a step message",
                )),
            });
            let messages = messages.collect::<Result<Vec<_>, _>>()?;
            (None, Some(queue::queue_rows(messages)?))
        } else {
            (outbox_json(&t.effects)?, None)
        };
        let appended = encode_entries(&t.appended)?;
        let updated = encode_entries(&t.updated)?;
        let ctas = t
            .new_ctas
            .iter()
            .map(|c| {
                Ok((
                    c.cta_id.clone(),
                    c.owner.clone(),
                    c.status.as_str(),
                    to_json(c)?,
                    c.assignees.clone(),
                ))
            })
            .collect::<Result<Vec<_>, PortError>>()?;
        let children = t
            .new_runs
            .iter()
            .map(|(run, entries)| NewRun::encode(run, entries))
            .collect::<Result<Vec<_>, _>>()?;
        let expected = expected_version as i64;
        let release_slot = t.release_slot;
        let take_slot = t.take_slot;
        let slot_limit = t.slot_limit;
        let owner = t.run.owner.clone();
        let spent = (t.daily_spend && t.spent_usd > 0.0)
            .then(|| (t.run.updated_at.date_naive().to_string(), t.spent_usd));
        // A budgeted tree's ledger takes this step's spending and raise.
        let ledger = t
            .run
            .origin
            .budget
            .filter(|_| t.spent_usd > 0.0 || t.budget_raise.is_some())
            .map(|b| {
                (
                    t.run.root().to_owned(),
                    b,
                    t.spent_usd,
                    t.budget_raise.clone(),
                )
            });
        // Its one expected failure, a version conflict, comes before it changes anything.
        self.db
            .write(true, Undo::CheckFirst, move |c| {
                if take_slot && let Some(limit) = slot_limit {
                    // A follow-up's turn takes a slot while one is free: refused before
                    // anything changes (a version conflict first, as the update says it).
                    let version: Option<i64> = c
                        .prepare_cached("SELECT version FROM runs WHERE run_id = ?1")
                        .and_then(|mut s| s.query_row([&run_id], |r| r.get(0)).optional())
                        .map_err(sql)?;
                    if version != Some(expected) {
                        return Err(PortError::Conflict);
                    }
                    let current = super::rows::slots_held(c, &owner)?;
                    if current >= u64::from(limit) {
                        return Err(PortError::QuotaExceeded {
                            limit: limit.into(),
                            current,
                        });
                    }
                }
                let key: i64 = c
                    .prepare_cached(
                        "UPDATE runs SET version = ?1, body = ?2, outbox = ?3, failure = NULL,
                         claim = NULL WHERE run_id = ?4 AND version = ?5 RETURNING run_key",
                    )
                    .and_then(|mut s| {
                        s.query_row(params![version, body, outbox, run_id, expected], |r| {
                            r.get(0)
                        })
                        .optional()
                    })
                    .map_err(sql)?
                    .ok_or(PortError::Conflict)?;
                if release_slot {
                    c.prepare_cached("DELETE FROM active_slots WHERE run_id = ?1")
                        .and_then(|mut s| s.execute([&run_id]))
                        .map_err(sql)?;
                }
                if take_slot {
                    c.prepare_cached(
                        "INSERT OR IGNORE INTO active_slots (run_id, owner) VALUES (?1, ?2)",
                    )
                    .and_then(|mut s| s.execute(params![run_id, owner]))
                    .map_err(sql)?;
                }
                if let Some((day, usd)) = &spent {
                    super::rows::add_spend(c, &owner, day, *usd)?;
                }
                if let Some((root, budget, usd, raise)) = &ledger {
                    super::rows::add_to_ledger(c, root, *budget, *usd, raise.as_ref())?;
                }
                insert_entries(c, key, &appended)?;
                let mut upd = c
                    .prepare_cached("UPDATE entries SET body = ?1 WHERE run_key = ?2 AND seq = ?3")
                    .map_err(sql)?;
                for (seq, body) in &updated {
                    upd.execute(params![body, key, seq]).map_err(sql)?;
                }
                for (cta_id, owner, status, body, assignees) in &ctas {
                    c.execute(
                        "INSERT INTO ctas (cta_id, owner, status, body) VALUES (?1, ?2, ?3, ?4)",
                        params![cta_id, owner, status, body],
                    )
                    .map_err(sql)?;
                    super::lists::assign(c, cta_id, assignees)?;
                }
                for child in &children {
                    c.execute(
                        "INSERT INTO runs (run_id, owner, version, body, parent, root)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        params![
                            child.run_id,
                            child.owner,
                            child.version,
                            child.body,
                            child.parent,
                            child.root
                        ],
                    )
                    .map_err(sql)?;
                    insert_entries(c, c.last_insert_rowid(), &child.entries)?;
                }
                if let Some(rows) = &sends {
                    queue::enqueue(c, rows)?;
                }
                Ok(())
            })
            .await
    }
}

#[async_trait::async_trait]
impl SendingStore for LocalStore {
    async fn commit_sending(&self, expected_version: u64, t: &Transition) -> Result<(), PortError> {
        self.commit_with(expected_version, t, true).await?;
        self.wake_receivers();
        Ok(())
    }
}
