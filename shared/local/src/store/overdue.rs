//! What the sweep looks for when a timer was lost: questions past their expiry and runs'
//! timers past their time. The embedded host's timers are rows of this database, fired by
//! its worker, so these find something only after a stop that outlasted a timer.

use baton_core::cta::Cta;
use baton_core::error::PortError;
use baton_core::ports::{DueTimer, Sweep};
use baton_core::run::Run;

use super::*;

impl LocalStore {
    /// Pending CTAs expired before `before`, soonest first, at most `limit`.
    pub(super) async fn ctas_due(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT body FROM ctas WHERE status = 'pending'")
                .map_err(sql)?;
            let mut out = Vec::new();
            for body in stmt.query_map([], |r| r.get::<_, String>(0)).map_err(sql)? {
                let cta: Cta = from_json(&body.map_err(sql)?)?;
                if cta.expires_at < before {
                    out.push(cta);
                }
            }
            out.sort_by_key(|c| c.expires_at);
            out.truncate(limit);
            Ok(out)
        })
        .await
    }

    /// The timers of runs not ended that were due before `before` and have not fired.
    pub(super) async fn timers_due(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<DueTimer>, PortError> {
        let runs: Vec<Run> = self
            .read(move |c| {
                let mut stmt = c
                    .prepare_cached(
                        "SELECT body FROM runs WHERE json_extract(body, '$.timers') IS NOT NULL",
                    )
                    .map_err(sql)?;
                stmt.query_map([], |r| r.get::<_, String>(0))
                    .map_err(sql)?
                    .map(|b| from_json::<Run>(&b.map_err(sql)?))
                    .collect()
            })
            .await?;
        Ok(baton_core::ports::due_timers(&runs, before, limit))
    }
}

#[async_trait::async_trait]
impl Sweep for LocalStore {
    async fn stale_outboxes(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<String>, PortError> {
        let rows: Vec<(String, String, String)> = self
            .read(|c| {
                let mut stmt = c
                    .prepare_cached(
                        "SELECT run_id, body, outbox FROM runs WHERE outbox IS NOT NULL",
                    )
                    .map_err(sql)?;
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .map_err(sql)?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(sql)
            })
            .await?;
        let mut out = Vec::new();
        for (run_id, body, outbox) in rows {
            let run: Run = from_json(&body)?;
            let effects: Vec<Effect> = from_json(&outbox)?;
            // A run's start counts too until its first step: it was never received.
            let parked = !outbox_continues(&run_id, &effects)
                || outbox_owes(&run_id, &effects)
                || run.version == 0;
            if run.updated_at < before && parked {
                out.push(run_id);
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    /// `baton dev` keeps everything: its data directory is the developer's to delete.
    async fn purge_finished(&self, _: DateTime<Utc>, _: usize) -> Result<usize, PortError> {
        Ok(0)
    }

    async fn stale_resolutions(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        let before = before.timestamp_millis();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT body FROM ctas WHERE unsent IS NOT NULL AND unsent < ?1 ORDER BY unsent LIMIT ?2",
                )
                .map_err(sql)?;
            stmt.query_map(params![before, limit as i64], |r| r.get::<_, String>(0))
                .map_err(sql)?
                .map(|b| from_json::<Cta>(&b.map_err(sql)?))
                .collect()
        })
        .await
    }

    async fn overdue_timers(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<baton_core::ports::DueTimer>, PortError> {
        self.timers_due(before, limit).await
    }

    async fn overdue_ctas(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        self.ctas_due(before, limit).await
    }
}
