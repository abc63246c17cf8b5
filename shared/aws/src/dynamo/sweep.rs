//! The sweep's side of the table: the sparse indexes of runs with a parking outbox (`GSI2`)
//! and of finished runs (`GSI3`), and the purge of a finished run's every item.

use baton_core::error::PortError;
use baton_core::ports::{Ctas, RunReads};
use chrono::{DateTime, Utc};

use baton_core::cta::Cta;

use super::items::{broken, get_s, s};
use super::keys::{cta_pk, run_pk, sweep_time};
use super::{DynamoStore, GSI2, GSI3, Item};

impl DynamoStore {
    /// Deletes every item of up to `limit` runs finished before `now` − retention.
    pub(super) async fn purge(&self, now: DateTime<Utc>, limit: usize) -> Result<usize, PortError> {
        let runs = self
            .indexed_runs(GSI3, "FIN", now - self.retention, limit)
            .await?;
        for run_id in &runs {
            let pk = run_pk(run_id);
            // The keys alone, eventually consistent (a finished run's items do not change):
            // half the read units, and none of the bodies in memory.
            let query = self.range(&pk, " ", "~").projection_expression("SK");
            let mut keys: Vec<Item> = Vec::new();
            self.query_pages("Query (purge keys)", query, |item| {
                keys.push(Item::from([
                    ("PK".to_owned(), s(&pk)),
                    (
                        "SK".to_owned(),
                        item.get("SK").cloned().unwrap_or(s("META")),
                    ),
                ]));
                Ok(true)
            })
            .await?;
            // Timeline items first, the run item (which indexes the run) last: a purge cut
            // short is finished by the next tick.
            let (meta, rest): (Vec<Item>, Vec<Item>) = keys
                .into_iter()
                .partition(|k| k.get("SK") == Some(&s("META")));
            for chunk in rest.chunks(25).chain(meta.chunks(25)) {
                self.delete_batch(chunk).await?;
            }
        }
        Ok(runs.len())
    }

    /// Run ids from a sweep index (`GSI2`, `GSI3`), keyed before `before`, all shards.
    pub(super) async fn indexed_runs(
        &self,
        index: &str,
        prefix: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<String>, PortError> {
        self.indexed(index, prefix, "RUN#", before, limit).await
    }

    /// The ids of the items (of partition key `item_prefix` + id) a sweep index holds in
    /// its `prefix` partitions, keyed before `before`.
    pub(super) async fn indexed(
        &self,
        index: &str,
        prefix: &str,
        item_prefix: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<String>, PortError> {
        let (pk, sk) = (format!("{index}PK"), format!("{index}SK"));
        let mut runs = Vec::new();
        for shard in 0..self.read_shards() {
            let query = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(index)
                .key_condition_expression("#pk = :pk AND #sk < :before")
                .expression_attribute_names("#pk", &pk)
                .expression_attribute_names("#sk", &sk)
                .expression_attribute_values(":pk", s(format!("{prefix}#{shard}")))
                .expression_attribute_values(":before", s(sweep_time(before)))
                // A page reads (and bills) only what the tick can take.
                .limit(i32::try_from(limit).unwrap_or(i32::MAX).clamp(1, 1000));
            self.query_pages("Query", query, |item| {
                if let Some(id) = get_s(&item, "PK")?.strip_prefix(item_prefix) {
                    runs.push(id.to_owned());
                }
                Ok(runs.len() < limit)
            })
            .await?;
            if runs.len() >= limit {
                break;
            }
        }
        runs.truncate(limit);
        Ok(runs)
    }

    /// Deletes up to 25 items by key, retrying what DynamoDB leaves unprocessed.
    async fn delete_batch(&self, keys: &[Item]) -> Result<(), PortError> {
        use aws_sdk_dynamodb::types::{DeleteRequest, WriteRequest};
        let requests: Vec<WriteRequest> = keys
            .iter()
            .map(|k| {
                let del = DeleteRequest::builder()
                    .set_key(Some(k.clone()))
                    .build()
                    .map_err(|e| broken("build delete", e))?;
                Ok(WriteRequest::builder().delete_request(del).build())
            })
            .collect::<Result<_, PortError>>()?;
        self.write_batch(requests).await
    }

    /// CTAs whose resolution is outstanding since before `before` (GSI2, `CR#` shards).
    pub(super) async fn outstanding_resolutions(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        let mut out = Vec::new();
        for cta_id in self.indexed(GSI2, "CR", "CTA#", before, limit).await? {
            if let Some(c) = self.get_cta(&cta_id).await? {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// Pending CTAs whose expiry is before `before` (GSI2, `DUE#` shards: a pending CTA is
    /// indexed by its expiry until it settles).
    pub(super) async fn ctas_due(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Cta>, PortError> {
        let mut out = Vec::new();
        for cta_id in self.indexed(GSI2, "DUE", "CTA#", before, limit).await? {
            if let Some(c) = self.get_cta(&cta_id).await?
                && c.status == baton_core::cta::CtaStatus::Pending
            {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// Timers of runs not ended due before `before` (GSI3, `TMR#` shards: a run with timers
    /// armed is indexed by its soonest until it has none, or ends and moves to `FIN#`).
    pub(super) async fn timers_due(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<baton_core::ports::DueTimer>, PortError> {
        let mut runs = Vec::new();
        for run_id in self.indexed_runs(GSI3, "TMR", before, limit).await? {
            if let Some(rec) = self.get_run(&run_id).await? {
                runs.push(rec.run);
            }
        }
        Ok(baton_core::ports::due_timers(&runs, before, limit))
    }

    /// Takes a CTA out of the sweep's index: its run has been told.
    pub(super) async fn remove_resolution(&self, cta_id: &str) -> Result<(), PortError> {
        self.update_meta(
            cta_pk(cta_id),
            "REMOVE GSI2PK, GSI2SK",
            "attribute_exists(PK)",
            &[],
        )
        .await
    }
}
