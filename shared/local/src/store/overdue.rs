//! What the sweep looks for when a timer was lost: questions past their expiry and runs'
//! timers past their time. The embedded host's timers are rows of this database, fired by
//! its worker, so these find something only after a stop that outlasted a timer.

use baton_core::cta::Cta;
use baton_core::error::PortError;
use baton_core::ports::DueTimer;
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
