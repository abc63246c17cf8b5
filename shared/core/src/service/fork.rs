//! `POST /runs/{id}/fork`: reads the original run, builds its fork (`crate::fork`), and
//! creates it with its first message, as a new run is created.

use tracing::info;

use super::{Requests, ServiceError};
use crate::fork::{Refused, Replacement};
use crate::message::{Effect, StepMessage};
use crate::ports::{Created, RunRecord};
use crate::run::Run;

impl Requests {
    /// Starts a fork of the owner's run `run_id` at its entry `at_seq` (see [`crate::fork`]).
    /// The fork's history is a copy of the original's entries before it, written with the
    /// fork in one go: nothing of it runs again. With an idempotency key, a retry returns
    /// the first fork. A fork's keys are its own: scoped to forks of this run (a space,
    /// which no key the API takes holds, keeps them apart from `POST /runs`'s).
    pub async fn fork_run(
        &self,
        owner: &str,
        run_id: &str,
        at_seq: u64,
        replacement: Option<Replacement>,
        idempotency_key: Option<&str>,
    ) -> Result<Run, ServiceError> {
        let (rec, timeline) = match self.shared.deps.store.load(run_id).await? {
            Some((rec, t)) if rec.run.owner == owner => (rec, t),
            _ => return Err(ServiceError::NotFound(format!("no run `{run_id}`"))),
        };
        let now = self.shared.deps.clock.now();
        let id = format!("run_{}", uuid::Uuid::new_v4().simple());
        let fork =
            crate::fork::fork(&rec.run, &timeline, at_seq, replacement, id, now).map_err(|r| {
                match r {
                    Refused::Mismatch(message) => ServiceError::Conflict {
                        code: "fork_mismatch",
                        message,
                    },
                    Refused::Conflict(message) => ServiceError::Conflict {
                        code: "not_forkable",
                        message,
                    },
                }
            })?;
        let first = vec![Effect::Send(StepMessage {
            run_id: fork.run.run_id.clone(),
            id: format!("{}:fork", fork.run.run_id),
            input: fork.first,
            owed: false,
        })];
        let key = idempotency_key.map(|k| format!("fork {run_id} {k}"));
        let admission = self.shared.admission();
        let mut run = fork.run;
        run.active_slot = admission.is_some_and(|a| a.active_runs.is_some());
        let record = match self
            .shared
            .deps
            .store
            .create_run(
                &run,
                &fork.entries,
                &first,
                key.as_deref(),
                admission.as_ref(),
            )
            .await?
        {
            Created::Created => RunRecord { run, outbox: first },
            Created::Existing(rec) => super::requests::retried(*rec, "fork"),
        };
        crate::failpoint::hit("fork.after_insert")?;
        self.shared.perform(&record.run, &record.outbox).await?;
        info!(run_id = %record.run.run_id, from = %run_id, at_seq, "run forked");
        Ok(record.run)
    }
}
