//! `DynamoStore`: runs, timelines and CTAs in one DynamoDB table.
//!
//! | item | PK | SK | attributes |
//! |---|---|---|---|
//! | run | `RUN#<runId>` | `META` | `v` (version), `own`, `st`, `body` (the run without `metadata` and `context`) and `ob` (outbox), each packed by `baton-codec` (its JSON deflated when smaller; a JSON string in store format 1), `ni` (timeline items written), `tl` and `tf` (the tail: the latest commits' entries, packed, and the first one's seq), `ct` (the token of the commit that wrote it), `ttl`; `GSI2PK` = `OB#<shard>` while a parking outbox waits; `GSI3PK` = `FIN#<shard>` once ended, else `TMR#<shard>` (`GSI3SK` its soonest armed timer) while it has timers |
//! | timeline segment | `RUN#<runId>` | `T#<first seq:010>` | `n`, `b`: the entries one commit appended, or a tail copied out of the run item (`tv`: the version it was copied at), deflated JSON |
//! | resolution patch | `RUN#<runId>` | `P#<seq:010>` | `b`: an entry resolved in place (a pending result), whole |
//! | CTA | `CTA#<ctaId>` | `META` | `st`, `own`, `body`, `GSI1PK` = `OWNER#<owner>`, `GSI1SK` = `CTA#<status>#<createdAt>#<ctaId>`, `GSI4PK` = `ROOT#<rootRunId>`, `GSI4SK` = `GSI1SK`, `ttl`; `GSI2PK` = `DUE#<shard>` (`GSI2SK` its expiry) while pending, `CR#<shard>` while its resolution is unsent |
//! | run info | `RUN#<runId>` | `INFO` | `md` (`metadata`), `cx` (`context`); a top-level run's also `GSI1PK` = `OWNER#<owner>`, `GSI1SK` = `RUN#<createdAt>#<runId>` (its owner's list of runs); a subagent's `GSI4PK` = `ROOT#<rootRunId>`, `GSI4SK` = `RUN#<createdAt>#<runId>` (the runs under its top-level run). Written once with the run, read with the run item by one query of [`INFO`, `META`] |
//! | watch lease | `RUN#<runId>` | `LIVE` | `wu` (until when someone watches the run live, unix ms), `ttl`. Written by the API when it grants a watch; read with the run item by the same query |
//! | idempotency key | `IDEM#<len>#<owner>#<key>` | `META` | `runId` |
//! | owner's quota | `QUOTA#<owner>` | `META` | `active`: the active-run slots its top-level runs hold |
//! | owner's day | `SPEND#<day>#<owner>` | `S#<NN>` | `usd`, `ttl`: what its runs spent that UTC day, in `COUNTER_SHARDS` items (each run adds to one, by its id; a read sums them) |
//! | budgeted tree's ledger | `RUN#<rootRunId>` | `BUDGET`, `BUDGET#<NN>` | `budgetUsd`, `raises` (`BUDGET`), `spentUsd` (each; a commit without a raise adds to its run's shard; a read sums them) |
//!
//! One commit is one conditional write on the run's version. A step of the common kind
//! (a think and its tool calls) writes the run item alone: its entries join the item's tail
//! (`tail.rs`), one `UpdateItem`, one or two write units. A commit that writes more (a
//! patch outside the tail, new CTAs and child runs, quota and budget counters, entries too
//! large for the tail) is one `TransactWriteItems` of the run item and those items. A tail
//! that is full is first copied to its own segment. A step re-hydrates its window alone
//! (`load_window`): the run item, whose tail often holds the whole window, else, strongly
//! consistent, the segments newest first back to the one holding the
//! window's first seq, plus the patches after it, so a cold step reads what its window
//! holds, not the run's history. A page of the timeline (`entries_after`) reads the segments
//! that hold it, in order. Queries that stop early ask for pages of a few items: DynamoDB
//! bills a page for every item it reads, up to 1 MB. A whole timeline (`load`) is one paged `Query` (a history over
//! 1 MB works), eventually consistent: timeline items are written once (a tail's copy grows
//! until the tail moves on) and counted in `ni`, so a stale read is detected (a short count,
//! a gap in the seqs) and redone consistently. The GSI holds only CTAs, so the run
//! item, rewritten at every step, costs no index writes.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};
use tracing::instrument;

mod budget;
mod commit;
mod consumed;
mod follow_ups;
mod io;
mod items;
mod keys;
pub use keys::{MAX_SWEEP_SHARDS, SWEEP_SHARDS};
mod lists;
mod quota;
mod reads;
mod sweep;
mod tail;

use io::TransactFailure;
use items::*;
use keys::*;

use crate::sdk::{Meter, is_retryable_cancellation, map_sdk_err};
use baton_core::cta::{Applied, Cta, CtaChange, CtaStatus};
use baton_core::error::PortError;
use baton_core::message::{Effect, Transition};
use baton_core::ports::{
    Changed, Created, CtaQuery, Ctas, FollowUps, Ledgers, RunPage, RunPosition, RunQuery, RunReads,
    RunRecord, RunWrites, Sweep,
};

/// The most rounds of read, apply and conditional write one change to a CTA takes before it
/// gives up as a conflict (each lost round is another change that won).
const MAX_CTA_ROUNDS: usize = 16;
use baton_core::run::{LastError, Run};
use baton_core::timeline::Entry;

type Item = HashMap<String, AttributeValue>;

/// The GSI listing an owner's CTAs (`CTA#…`) and top-level runs (`RUN#…`, their `INFO` items).
/// At most this many segments, of at most this many bytes in all, are written in a run's
/// creating transaction (DynamoDB's limits: 100 items, 4 MB); more are written before it.
const CREATE_SEGMENTS: usize = 90;
const CREATE_SEGMENT_BYTES: usize = 3 * 1024 * 1024;

pub const GSI1: &str = "GSI1";
/// The sparse GSI of runs with a parking outbox not yet performed, for the sweep.
pub const GSI2: &str = "GSI2";
/// The sparse GSI of finished runs by when they finished, for the sweep's purge.
pub const GSI3: &str = "GSI3";
/// The GSI listing CTAs by top-level run (`GSI4PK` = `ROOT#<rootRunId>`, sorted as GSI1).
pub const GSI4: &str = "GSI4";
/// DynamoDB's limit on items in one transaction.
const MAX_TRANSACT_ITEMS: usize = 100;
/// Items stay under DynamoDB's 400 KB limit with room for keys and attributes.
const MAX_BLOB: usize = 390 * 1024;

pub struct DynamoStore {
    client: Client,
    table: String,
    retention: chrono::Duration,
    meter: Arc<Meter>,
    /// The run items' tails it read lately (see `tail.rs`).
    tails: tail::Tails,
    /// The sweep shards it writes to ([`SWEEP_SHARDS`] unless told).
    sweep_shards: u32,
    /// The sweep shards it reads: the most the table was ever written with, as the table
    /// records it ([`DynamoStore::claim_format`]), so that fewer shards lose nothing.
    read_shards: Arc<std::sync::atomic::AtomicU32>,
}

impl DynamoStore {
    /// Writes CTAs as the store keeps them, 25 a request, outside any run's commit: for
    /// loading a table in bulk (a test of 10,000 waiting CTAs). A run's own CTAs are written
    /// by its commits.
    pub async fn import_ctas(&self, ctas: &[Cta]) -> Result<(), PortError> {
        use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
        for chunk in ctas.chunks(25) {
            let requests = chunk
                .iter()
                .map(|c| {
                    let put = PutRequest::builder()
                        .set_item(Some(self.cta_item(c)?))
                        .build()
                        .map_err(|e| broken("build put", e))?;
                    Ok(WriteRequest::builder().put_request(put).build())
                })
                .collect::<Result<Vec<_>, PortError>>()?;
            self.write_batch(requests).await?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl RunReads for DynamoStore {
    async fn lease_watch(&self, run_id: &str, until: DateTime<Utc>) -> Result<(), PortError> {
        DynamoStore::lease_watch(self, run_id, until).await
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, PortError> {
        self.get_run_item(run_id)
            .await?
            .map(|i| parse_run(&i))
            .transpose()
    }

    async fn list_runs(&self, owner: &str, query: &RunQuery) -> Result<RunPage, PortError> {
        self.runs_page(owner, query).await
    }

    async fn list_descendants(
        &self,
        root_run_id: &str,
        after: Option<&RunPosition>,
        limit: usize,
    ) -> Result<RunPage, PortError> {
        self.descendants_page(root_run_id, after, limit).await
    }

    #[instrument(skip(self))]
    async fn load(&self, run_id: &str) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError> {
        self.load_timeline(run_id).await
    }

    async fn load_from(
        &self,
        run_id: &str,
        from: u64,
    ) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError> {
        if from == 0 {
            return self.load(run_id).await;
        }
        let Some(meta) = self.step_run_item(run_id).await? else {
            return Ok(None);
        };
        let rec = parse_run(&meta)?;
        let entries = self
            .window_after(run_id, &meta, from, rec.run.next_seq)
            .await?;
        Ok(Some((rec, entries)))
    }

    async fn load_window(
        &self,
        run_id: &str,
        window: &(dyn for<'r> Fn(&'r Run) -> u64 + Send + Sync),
    ) -> Result<Option<(RunRecord, Vec<Entry>, u64)>, PortError> {
        // One read of the run item, then its window's items after it, strongly: entries of
        // a later commit are past `next_seq` (dropped); a later patch makes the step's
        // commit fail on its version, not succeed.
        let Some(meta) = self.step_run_item(run_id).await? else {
            return Ok(None);
        };
        let rec = parse_run(&meta)?;
        let from = window(&rec.run);
        if from == 0 {
            return Ok(self
                .load(run_id)
                .await?
                .map(|(rec, entries)| (rec, entries, 0)));
        }
        let entries = self
            .window_after(run_id, &meta, from, rec.run.next_seq)
            .await?;
        Ok(Some((rec, entries, from)))
    }

    async fn entries_after(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Entry>, PortError> {
        self.page_after(run_id, after, limit).await
    }
}

#[async_trait::async_trait]
impl RunWrites for DynamoStore {
    #[instrument(skip_all, fields(run_id = %run.run_id))]
    async fn create_run(
        &self,
        run: &Run,
        entries: &[Entry],
        outbox: &[Effect],
        idempotency_key: Option<&str>,
        admission: Option<&baton_core::ports::Admission>,
    ) -> Result<Created, PortError> {
        let admission = admission.copied().unwrap_or_default();
        let segments = if entries.is_empty() {
            Vec::new()
        } else {
            self.segment_items(&run.run_id, entries)?
        };
        let mut item = self.run_item(run, outbox, segments.len())?;
        if !outbox.is_empty() {
            // The start is indexed for the sweep too, until the first step's commit: a
            // crash before it was sent must not leave the run queued for good.
            item.insert("GSI2PK".into(), s(self.sweep_pk(&run.run_id)));
            item.insert("GSI2SK".into(), s(sweep_sk(run.updated_at, &run.run_id)));
        }
        if admission.active_runs.is_some() {
            item.insert("slot".into(), n(1));
        }
        let mut items = vec![self.put(item, Some("attribute_not_exists(PK)"))?];
        items.push(self.put(self.info_item(run)?, None)?);
        if let Some(b) = run.origin.budget.filter(|_| run.origin.parent.is_none()) {
            items.push(self.ledger_put(&run.run_id, b)?);
        }
        // A fork's copied history may not fit one transaction (100 items, 4 MB): its
        // segments are then written first, under a run id no one reads until the run item
        // that names them is written.
        let bytes: usize = segments.iter().map(item_size).sum();
        if segments.len() > CREATE_SEGMENTS || bytes > CREATE_SEGMENT_BYTES {
            // Not written ahead for a run its quotas refuse already (the transaction below
            // still decides: this read only spares a refused fork's history being left
            // behind).
            if !admission.is_open() && self.refused_now(&run.owner, &admission).await? {
                return Err(self.refusal(&run.owner, &admission).await);
            }
            self.put_ahead(segments).await?;
        } else {
            for seg in segments {
                items.push(self.put(seg, None)?);
            }
        }
        if let Some(key) = idempotency_key {
            let idem = Item::from([
                ("PK".into(), s(idem_pk(&run.owner, key))),
                ("SK".into(), s("META")),
                ("runId".into(), s(&run.run_id)),
                // Keys are honoured for a day, as payment APIs do.
                (
                    "ttl".into(),
                    n((run.created_at + chrono::Duration::days(1)).timestamp()),
                ),
            ]);
            items.push(self.put(idem, Some("attribute_not_exists(PK)"))?);
        }
        let idem_index = items.len() - 1;
        // The day's spending, read (its items are sharded; see `quota.rs`): past its
        // allowance a run is refused, unless its idempotency key names one made before (the
        // transaction below then answers with that one).
        if let Some(cost) = &admission.daily_cost
            && self.spent_that_day(&run.owner, cost.day).await? >= cost.limit_usd
        {
            let made = match idempotency_key {
                Some(key) => self.get_item(idem_pk(&run.owner, key)).await?.is_some(),
                None => false,
            };
            if !made {
                return Err(self.refusal(&run.owner, &admission).await);
            }
        }
        let admitting = items.len();
        items.extend(self.admission_items(&run.owner, &admission)?);
        match self.transact(items, None).await {
            Ok(()) => Ok(Created::Created),
            Err(TransactFailure::Condition(failed))
                if failed.iter().any(|i| *i >= admitting)
                    && !(idempotency_key.is_some() && failed.contains(&idem_index)) =>
            {
                Err(self.refusal(&run.owner, &admission).await)
            }
            Err(TransactFailure::Condition(failed))
                if idempotency_key.is_some() && failed.contains(&idem_index) =>
            {
                let key = idempotency_key.unwrap_or_default();
                let idem = self
                    .get_item(idem_pk(&run.owner, key))
                    .await?
                    .ok_or(PortError::Conflict)?;
                let existing = get_s(&idem, "runId")?.to_owned();
                let rec = self.get_run(&existing).await?.ok_or(PortError::Conflict)?;
                Ok(Created::Existing(Box::new(rec)))
            }
            Err(TransactFailure::Condition(_)) => Err(PortError::Conflict),
            Err(TransactFailure::Port(e)) => Err(e),
        }
    }

    #[instrument(skip_all, fields(run_id = %t.run.run_id, version = t.run.version))]
    async fn commit(&self, expected_version: u64, t: &Transition) -> Result<(), PortError> {
        self.commit_step(expected_version, t).await
    }

    async fn clear_outbox(&self, run_id: &str, version: u64) -> Result<(), PortError> {
        self.update_meta(
            run_pk(run_id),
            "REMOVE ob, GSI2PK, GSI2SK",
            "v = :v",
            &[(":v", n(version))],
        )
        .await
    }

    async fn keep_outbox(
        &self,
        run_id: &str,
        version: u64,
        owed: &[Effect],
        at: DateTime<Utc>,
    ) -> Result<(), PortError> {
        self.update_meta(
            run_pk(run_id),
            "SET ob = :ob, GSI2PK = :pk, GSI2SK = :sk",
            "v = :v",
            &[
                (":ob", packed(owed, "outbox")?),
                (":pk", s(self.sweep_pk(run_id))),
                (":sk", s(sweep_sk(at, run_id))),
                (":v", n(version)),
            ],
        )
        .await
    }

    async fn record_failure(&self, run_id: &str, failure: &LastError) -> Result<(), PortError> {
        let f = serde_json::to_string(failure).map_err(|e| broken("encode failure", e))?;
        self.update_meta(
            run_pk(run_id),
            "SET lerr = :f",
            "attribute_exists(PK)",
            &[(":f", s(f))],
        )
        .await
    }
}

#[async_trait::async_trait]
impl Ctas for DynamoStore {
    async fn get_cta(&self, cta_id: &str) -> Result<Option<Cta>, PortError> {
        self.get_item(cta_pk(cta_id))
            .await?
            .map(|i| parse_cta(&i))
            .transpose()
    }

    #[instrument(skip(self, change))]
    async fn change_cta(
        &self,
        cta_id: &str,
        change: &CtaChange,
        at: DateTime<Utc>,
    ) -> Result<Changed, PortError> {
        // Read, apply, write conditionally on the revision read; a write that lost to
        // another reads again. Each round's loser saw a change win, so a bounded number
        // suffices but under a storm of changes to one question.
        for _ in 0..MAX_CTA_ROUNDS {
            let Some(old) = self.get_item(cta_pk(cta_id)).await? else {
                return Ok(Changed::NotFound);
            };
            let mut cta = parse_cta(&old)?;
            let rev = cta.rev;
            let settled = match cta.apply(change, at) {
                Applied::Refused => return Ok(Changed::Refused(cta)),
                Applied::Unchanged => return Ok(Changed::Unchanged(cta)),
                Applied::Changed { settled } => settled,
            };
            let mut item = self.cta_item(&cta)?;
            if settled && cta.status != CtaStatus::Cancelled {
                // The CTA's outbox: indexed for the sweep until the run has been told.
                item.insert("GSI2PK".into(), s(self.resolution_pk(cta_id)));
                item.insert("GSI2SK".into(), s(sweep_sk(at, cta_id)));
            } else if !settled && cta.status != CtaStatus::Pending {
                // A settled CTA's outbox stays as it is.
                for key in ["GSI2PK", "GSI2SK"] {
                    if let Some(v) = old.get(key) {
                        item.insert(key.into(), v.clone());
                    }
                }
            }
            self.count_write(&[&item], false);
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item));
            let put = if rev == 0 {
                put.condition_expression("attribute_not_exists(rev) OR rev = :rev")
            } else {
                put.condition_expression("rev = :rev")
            };
            match put.expression_attribute_values(":rev", n(rev)).send().await {
                Ok(_) => {
                    // Its assignees' inboxes: under its new status, and an escalation's new
                    // assignees filed.
                    let added = matches!(change, CtaChange::Round { assignees, .. } if !assignees.is_empty());
                    if settled || added {
                        self.refile(&cta).await;
                    }
                    return Ok(Changed::Applied { cta, settled });
                }
                Err(e) if e.code() == Some("ConditionalCheckFailedException") => continue,
                Err(e) => return Err(map_sdk_err("PutItem", e)),
            }
        }
        Err(PortError::Conflict)
    }

    async fn clear_resolution(&self, cta_id: &str) -> Result<(), PortError> {
        self.remove_resolution(cta_id).await
    }

    async fn list_ctas(&self, owner: &str, q: &CtaQuery) -> Result<Vec<Cta>, PortError> {
        self.ctas_page(owner, q).await
    }

    async fn list_assigned(
        &self,
        principals: &[String],
        q: &CtaQuery,
    ) -> Result<Vec<Cta>, PortError> {
        self.assigned_page(principals, q).await
    }
}

#[async_trait::async_trait]
impl Ledgers for DynamoStore {
    async fn ledger(
        &self,
        root_run_id: &str,
    ) -> Result<Option<baton_core::budget::Ledger>, PortError> {
        self.read_ledger(root_run_id).await
    }

    async fn spent_on(&self, owner: &str, day: chrono::NaiveDate) -> Result<f64, PortError> {
        self.spent_that_day(owner, day).await
    }

    async fn active_runs(&self, owner: &str) -> Result<u64, PortError> {
        self.slots_held(owner).await
    }
}

#[async_trait::async_trait]
impl Sweep for DynamoStore {
    async fn stale_outboxes(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<String>, PortError> {
        self.indexed_runs(GSI2, "OB", before, limit).await
    }

    async fn purge_finished(&self, now: DateTime<Utc>, limit: usize) -> Result<usize, PortError> {
        self.purge(now, limit).await
    }

    async fn stale_resolutions(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        self.outstanding_resolutions(before, limit).await
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

#[cfg(test)]
mod tests;
