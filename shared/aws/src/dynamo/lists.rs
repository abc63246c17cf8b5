//! The store's lists: an owner's top-level runs (the `INFO` items' `RUN#` keys in GSI1, then
//! the run items), the runs under a top-level run (their `INFO` items' keys in GSI4) and CTAs
//! (GSI1 by owner, GSI4 by top-level run), a page at a time.

use baton_core::cta::Cta;
use baton_core::error::PortError;
use baton_core::ports::{CtaQuery, RunPage, RunPosition, RunQuery};

use super::items::*;
use super::keys::*;
use super::{DynamoStore, GSI1, GSI4, Item};

impl DynamoStore {
    /// One query of the owner's `RUN#` keys in GSI1 (their `INFO` items, newest first, in
    /// the query's span of creation times: a range of the sort key), then one
    /// `BatchGetItem` of their run items (eventually consistent: a list may lag a step). A
    /// run whose item is gone (purged between the two) is left out.
    pub(super) async fn runs_page(&self, owner: &str, q: &RunQuery) -> Result<RunPage, PortError> {
        let pk = owner_pk(owner);
        let low = q
            .since
            .map_or_else(|| "RUN#".to_owned(), |t| format!("RUN#{}", sweep_time(t)));
        // A run created at `until` sorts after `RUN#<until>` (its id follows): left out.
        let high = q
            .until
            .map_or_else(|| "RUN#~".to_owned(), |t| format!("RUN#{}", sweep_time(t)));
        let mut page = self
            .listed_runs(GSI1, &pk, (low, high), false, q.after.as_ref(), q.limit)
            .await?;
        page.runs.retain(|r| r.owner == owner);
        Ok(page)
    }

    /// The `RUN#` keys under a top-level run in GSI4 (its descendants' `INFO` items, oldest
    /// first), then their run items.
    pub(super) async fn descendants_page(
        &self,
        root_run_id: &str,
        after: Option<&RunPosition>,
        limit: usize,
    ) -> Result<RunPage, PortError> {
        let pk = cta_root_pk(root_run_id);
        let span = ("RUN#".to_owned(), "RUN#~".to_owned());
        let mut page = self
            .listed_runs(GSI4, &pk, span, true, after, limit)
            .await?;
        page.runs
            .retain(|r| r.origin.root_run_id.as_deref() == Some(root_run_id));
        Ok(page)
    }

    /// One query of an index's `RUN#` keys between two sort keys (`INFO` items), from the
    /// position after, then their run items in one `BatchGetItem` per hundred. When `limit`
    /// keys were read, the page's `next` is the last key's position, its run read or not.
    async fn listed_runs(
        &self,
        index: &str,
        pk: &str,
        (low, high): (String, String),
        forward: bool,
        after: Option<&RunPosition>,
        limit: usize,
    ) -> Result<RunPage, PortError> {
        if limit == 0 {
            return Ok(RunPage::default());
        }
        let mut query = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(index)
            .key_condition_expression(format!("{index}PK = :pk AND {index}SK BETWEEN :lo AND :hi"))
            .expression_attribute_values(":pk", s(pk))
            .expression_attribute_values(":lo", s(low))
            .expression_attribute_values(":hi", s(high))
            .scan_index_forward(forward)
            .limit(i32::try_from(limit).unwrap_or(i32::MAX));
        if let Some(after) = after {
            query = query.set_exclusive_start_key(Some(Item::from([
                ("PK".into(), s(run_pk(&after.run_id))),
                ("SK".into(), s(INFO_SK)),
                (format!("{index}PK"), s(pk)),
                (
                    format!("{index}SK"),
                    s(run_gsi_sk(after.created_at, &after.run_id)),
                ),
            ])));
        }
        let mut infos = Vec::new();
        self.query_pages("Query runs", query, |item| {
            infos.push(item);
            Ok(infos.len() < limit)
        })
        .await?;
        let keys: Vec<String> = infos
            .iter()
            .filter_map(|i| get_s(i, "PK").ok().map(str::to_owned))
            .collect();
        let next = match infos.last() {
            Some(last) if infos.len() >= limit => Some(listed_position(last, index)?),
            _ => None,
        };
        let mut metas = self.get_metas(&keys).await?;
        let mut runs = Vec::new();
        for info in infos {
            let Some(mut meta) = get_s(&info, "PK").ok().and_then(|pk| metas.remove(pk)) else {
                continue;
            };
            for k in ["md", "cx"] {
                if let Some(v) = info.get(k) {
                    meta.insert(k.into(), v.clone());
                }
            }
            runs.push(parse_run(&meta)?.run);
        }
        Ok(RunPage { runs, next })
    }

    /// One `Query` of GSI1 (an owner's) or GSI4 (a top-level run's), from the position
    /// after, of at most `limit` items: more requests only when the CTAs pass DynamoDB's 1 MB
    /// a page (at most 100 CTAs of at most 400 KB each: a bounded number).
    pub(super) async fn ctas_page(&self, owner: &str, q: &CtaQuery) -> Result<Vec<Cta>, PortError> {
        let (index, pk) = match &q.root_run_id {
            Some(root) => (GSI4, cta_root_pk(root)),
            None => (GSI1, owner_pk(owner)),
        };
        let prefix = q
            .status
            .map_or_else(|| "CTA#".to_owned(), |st| format!("CTA#{}#", st.as_str()));
        let mut query = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(index)
            .key_condition_expression(format!("{index}PK = :pk AND begins_with({index}SK, :p)"))
            .expression_attribute_values(":pk", s(&pk))
            .expression_attribute_values(":p", s(prefix))
            .limit(i32::try_from(q.limit).unwrap_or(i32::MAX));
        if let Some(after) = &q.after {
            let sk = cta_gsi_sk(after.status, after.created_at, &after.cta_id);
            query = query.set_exclusive_start_key(Some(Item::from([
                ("PK".into(), s(cta_pk(&after.cta_id))),
                ("SK".into(), s("META")),
                (format!("{index}PK"), s(&pk)),
                (format!("{index}SK"), s(sk)),
            ])));
        }
        let mut out = Vec::new();
        if q.limit == 0 {
            return Ok(out);
        }
        self.query_pages("Query CTAs", query, |item| {
            let cta = parse_cta(&item)?;
            // A top-level run's CTAs are all its owner's; the check costs nothing.
            if cta.owner == owner {
                out.push(cta);
            }
            Ok(out.len() < q.limit)
        })
        .await?;
        Ok(out)
    }
}

impl DynamoStore {
    /// A page of the CTAs assigned to any of `principals`: each one's pointers from GSI1 (by
    /// status, then age, after `q.after`), merged in that order, then the CTAs themselves,
    /// as they are now (a pointer left behind by a status change is passed over).
    pub(super) async fn assigned_page(
        &self,
        principals: &[String],
        q: &CtaQuery,
    ) -> Result<Vec<Cta>, PortError> {
        if q.limit == 0 {
            return Ok(Vec::new());
        }
        let prefix = q
            .status
            .map_or_else(|| "CTA#".to_owned(), |st| format!("CTA#{}#", st.as_str()));
        let mut found: Vec<(String, String)> = Vec::new();
        for principal in principals {
            let pk = assignee_pk(principal);
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(GSI1)
                .key_condition_expression("GSI1PK = :pk AND begins_with(GSI1SK, :p)")
                .expression_attribute_values(":pk", s(&pk))
                .expression_attribute_values(":p", s(&prefix))
                .limit(i32::try_from(q.limit).unwrap_or(i32::MAX));
            if let Some(after) = &q.after {
                query = query.set_exclusive_start_key(Some(Item::from([
                    ("PK".into(), s(&pk)),
                    ("SK".into(), s(cta_pk(&after.cta_id))),
                    ("GSI1PK".into(), s(&pk)),
                    (
                        "GSI1SK".into(),
                        s(cta_gsi_sk(after.status, after.created_at, &after.cta_id)),
                    ),
                ])));
            }
            let mut n = 0;
            self.query_pages("Query assigned CTAs", query, |item| {
                found.push((
                    get_s(&item, "GSI1SK")?.to_owned(),
                    get_s(&item, "cta")?.to_owned(),
                ));
                n += 1;
                Ok(n < q.limit)
            })
            .await?;
        }
        found.sort();
        found.dedup_by(|a, b| a.1 == b.1);
        found.truncate(q.limit);
        let pks: Vec<String> = found.iter().map(|(_, id)| cta_pk(id)).collect();
        let items = self.get_metas(&pks).await?;
        let mut out = Vec::new();
        for (_, id) in &found {
            let Some(item) = items.get(&cta_pk(id)) else {
                continue;
            };
            let cta = parse_cta(item)?;
            let root = cta.root_run_id.as_deref().unwrap_or(&cta.run_id);
            if q.status.is_none_or(|st| st == cta.status)
                && q.root_run_id.as_deref().is_none_or(|r| r == root)
            {
                out.push(cta);
            }
        }
        Ok(out)
    }

    /// Files a CTA that left `pending` under its new status in its assignees' inboxes (the
    /// listing reads each CTA as it is, so a pointer this fails to move costs a read, never a
    /// wrong answer).
    pub(super) async fn refile(&self, cta: &Cta) {
        for principal in &cta.assignees {
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(self.assignment_item(principal, cta)))
                .send()
                .await;
            if let Err(e) = put {
                tracing::warn!(cta_id = %cta.cta_id, principal, error = %crate::sdk::map_sdk_err("PutItem", e),
                    "an assignee's inbox keeps the CTA under its old status");
            }
        }
    }
}

/// Where a listing (an `INFO` item) is in an index of runs: its sort key is
/// `RUN#<created at>#<run id>` ([`run_gsi_sk`]).
fn listed_position(info: &Item, index: &str) -> Result<RunPosition, PortError> {
    let sk = get_s(info, &format!("{index}SK"))?;
    sk.strip_prefix("RUN#")
        .and_then(|rest| rest.split_once('#'))
        .and_then(|(at, run_id)| {
            let at = chrono::DateTime::parse_from_rfc3339(at).ok()?;
            Some(RunPosition {
                created_at: at.to_utc(),
                run_id: run_id.to_owned(),
            })
        })
        .ok_or_else(|| PortError::Broken {
            message: format!("a run's listing has the sort key `{sk}`"),
            source: None,
        })
}
