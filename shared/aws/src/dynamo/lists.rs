//! The store's lists: an owner's top-level runs (the `INFO` items' `RUN#` keys in GSI1, then
//! the run items) and CTAs (GSI1 by owner, GSI4 by top-level run), a page at a time.

use baton_core::cta::Cta;
use baton_core::error::PortError;
use baton_core::ports::{CtaQuery, RunPosition};
use baton_core::run::Run;

use super::items::*;
use super::{DynamoStore, GSI1, GSI4, Item};

impl DynamoStore {
    /// One query of the owner's `RUN#` keys in GSI1 (their `INFO` items, newest first),
    /// then one `BatchGetItem` of their run items (eventually consistent: a list may lag a
    /// step). A run whose item is gone (purged between the two) is left out.
    pub(super) async fn runs_page(
        &self,
        owner: &str,
        after: Option<&RunPosition>,
        limit: usize,
    ) -> Result<Vec<Run>, PortError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let pk = owner_pk(owner);
        let mut query = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(GSI1)
            .key_condition_expression("GSI1PK = :pk AND begins_with(GSI1SK, :p)")
            .expression_attribute_values(":pk", s(&pk))
            .expression_attribute_values(":p", s("RUN#"))
            .scan_index_forward(false)
            .limit(i32::try_from(limit).unwrap_or(i32::MAX));
        if let Some(after) = after {
            query = query.set_exclusive_start_key(Some(Item::from([
                ("PK".into(), s(run_pk(&after.run_id))),
                ("SK".into(), s(INFO_SK)),
                ("GSI1PK".into(), s(&pk)),
                (
                    "GSI1SK".into(),
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
            let run = parse_run(&meta)?.run;
            if run.owner == owner {
                runs.push(run);
            }
        }
        Ok(runs)
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
