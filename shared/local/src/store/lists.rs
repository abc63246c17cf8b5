//! The store's lists: an owner's top-level runs (newest first, on `runs_top_by_owner`), the
//! runs under a top-level run (`runs_under_root`) and CTAs (by owner or top-level run, by status then
//! age), a page at a time.

use baton_core::cta::{Cta, CtaStatus};
use baton_core::error::PortError;
use baton_core::ports::{CtaQuery, RunPage, RunPosition, RunQuery};
use baton_core::run::Run;
use chrono::SecondsFormat;

use super::*;

impl LocalStore {
    pub(super) async fn runs_page(&self, owner: &str, q: &RunQuery) -> Result<RunPage, PortError> {
        let owner = owner.to_owned();
        let after = q.after.as_ref().map(|a| a.run_id.clone());
        let time =
            |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339_opts(SecondsFormat::Micros, true));
        let (since, until) = (time(q.since), time(q.until));
        let limit = q.limit;
        let runs = self.read(move |c| {
            // Newest first by run_key (the order runs were created in), on `runs_top_by_owner`;
            // the span compares instants (`julianday`), not the texts' varying precision.
            let mut stmt = c
                .prepare_cached(
                    "SELECT body FROM runs
                     WHERE owner = ?1 AND parent IS NULL
                       AND (?2 IS NULL OR run_key < (SELECT run_key FROM runs WHERE run_id = ?2))
                       AND (?3 IS NULL OR julianday(json_extract(body, '$.createdAt')) >= julianday(?3))
                       AND (?4 IS NULL OR julianday(json_extract(body, '$.createdAt')) < julianday(?4))
                     ORDER BY run_key DESC LIMIT ?5",
                )
                .map_err(sql)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            stmt.query_map(params![owner, after, since, until, limit], |r| {
                r.get::<_, String>(0)
            })
            .map_err(sql)?
            .map(|b| from_json::<Run>(&b.map_err(sql)?))
            .collect()
        })
        .await?;
        Ok(page(runs, limit))
    }

    /// Oldest first by run_key, on `runs_under_root`.
    pub(super) async fn descendants_page(
        &self,
        root_run_id: &str,
        after: Option<&RunPosition>,
        limit: usize,
    ) -> Result<RunPage, PortError> {
        let root = root_run_id.to_owned();
        let after = after.map(|a| a.run_id.clone());
        let runs = self
            .read(move |c| {
                let mut stmt = c
                    .prepare_cached(
                        "SELECT body FROM runs
                     WHERE root = ?1
                       AND (?2 IS NULL OR run_key > (SELECT run_key FROM runs WHERE run_id = ?2))
                     ORDER BY run_key LIMIT ?3",
                    )
                    .map_err(sql)?;
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                stmt.query_map(params![root, after, limit], |r| r.get::<_, String>(0))
                    .map_err(sql)?
                    .map(|b| from_json::<Run>(&b.map_err(sql)?))
                    .collect()
            })
            .await?;
        Ok(page(runs, limit))
    }

    /// By status, then in the order they were raised (rowid): a page is one indexed range
    /// of `ctas_by_owner` or `ctas_by_root`, after the position's CTA.
    pub(super) async fn ctas_page(&self, owner: &str, q: &CtaQuery) -> Result<Vec<Cta>, PortError> {
        let owner = owner.to_owned();
        let q = q.clone();
        self.read(move |c| {
            let by = if q.root_run_id.is_some() {
                "coalesce(json_extract(body, '$.rootRunId'), json_extract(body, '$.runId')) = ?2"
            } else {
                "?2 IS NULL"
            };
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT body FROM ctas WHERE owner = ?1 AND {by}
                       AND (?3 IS NULL OR status = ?3)
                       AND (?4 IS NULL OR status > ?4 OR (status = ?4
                            AND rowid > (SELECT rowid FROM ctas WHERE cta_id = ?5)))
                     ORDER BY status, rowid LIMIT ?6"
                ))
                .map_err(sql)?;
            let limit = i64::try_from(q.limit).unwrap_or(i64::MAX);
            let after = q.after.as_ref();
            stmt.query_map(
                params![
                    owner,
                    q.root_run_id,
                    q.status.map(CtaStatus::as_str),
                    after.map(|a| a.status.as_str()),
                    after.map(|a| a.cta_id.as_str()),
                    limit
                ],
                |r| r.get::<_, String>(0),
            )
            .map_err(sql)?
            .map(|b| from_json::<Cta>(&b.map_err(sql)?))
            .collect()
        })
        .await
    }
}

/// Files `cta_id` in the inbox of each of `assignees` (once each).
pub(super) fn assign(
    c: &rusqlite::Connection,
    cta_id: &str,
    assignees: &[String],
) -> Result<(), PortError> {
    for principal in assignees {
        c.execute(
            "INSERT OR IGNORE INTO cta_assignees (principal, cta_id) VALUES (?1, ?2)",
            params![principal, cta_id],
        )
        .map_err(sql)?;
    }
    Ok(())
}

impl LocalStore {
    /// A page of the CTAs assigned to any of `principals`, in the order of an owner's.
    pub(super) async fn assigned_page(
        &self,
        principals: &[String],
        q: &CtaQuery,
    ) -> Result<Vec<Cta>, PortError> {
        let principals =
            serde_json::to_string(principals).map_err(|e| broken("encode principals", e))?;
        let q = q.clone();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT body FROM ctas WHERE cta_id IN (SELECT cta_id FROM cta_assignees
                         WHERE principal IN (SELECT value FROM json_each(?1)))
                       AND (?2 IS NULL OR coalesce(json_extract(body, '$.rootRunId'),
                            json_extract(body, '$.runId')) = ?2)
                       AND (?3 IS NULL OR status = ?3)
                       AND (?4 IS NULL OR status > ?4 OR (status = ?4
                            AND rowid > (SELECT rowid FROM ctas WHERE cta_id = ?5)))
                     ORDER BY status, rowid LIMIT ?6",
                )
                .map_err(sql)?;
            let limit = i64::try_from(q.limit).unwrap_or(i64::MAX);
            let after = q.after.as_ref();
            stmt.query_map(
                params![
                    principals,
                    q.root_run_id,
                    q.status.map(CtaStatus::as_str),
                    after.map(|a| a.status.as_str()),
                    after.map(|a| a.cta_id.as_str()),
                    limit
                ],
                |r| r.get::<_, String>(0),
            )
            .map_err(sql)?
            .map(|b| from_json::<Cta>(&b.map_err(sql)?))
            .collect()
        })
        .await
    }
}

/// A page of runs read in one transaction (no listing without its run): `limit` read, more
/// may follow the last.
fn page(runs: Vec<Run>, limit: usize) -> RunPage {
    let next = runs
        .last()
        .filter(|_| runs.len() >= limit)
        .map(RunPosition::of);
    RunPage { runs, next }
}
