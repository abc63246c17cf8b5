//! Owners' quotas on DynamoDB: the conditional write that admits a run (an active-run slot
//! on the owner's `QUOTA#` counter), the day's spending read against its allowance (its
//! items are sharded: no one item takes every spending commit of an owner), a slot given
//! back, and the figures.

use super::*;

impl DynamoStore {
    /// The conditional writes that admit a run of `owner` by `a`: a slot taken. (The day's
    /// spending is summed from its shards, read: `spent_that_day`. Spending lands after a
    /// model replies, so its allowance is a read at each think in any case.)
    pub(super) fn admission_items(
        &self,
        owner: &str,
        a: &baton_core::ports::Admission,
    ) -> Result<Vec<TransactWriteItem>, PortError> {
        let mut items = Vec::new();
        if let Some(limit) = a.active_runs {
            items.push(self.slot_count(owner, 1, Some(limit))?);
        }
        Ok(items)
    }

    /// Whether `a` would refuse a run of `owner` as the figures read now.
    pub(super) async fn refused_now(
        &self,
        owner: &str,
        a: &baton_core::ports::Admission,
    ) -> Result<bool, PortError> {
        if let Some(limit) = a.active_runs
            && self.slots_held(owner).await? >= u64::from(limit)
        {
            return Ok(true);
        }
        if let Some(cost) = &a.daily_cost
            && self.spent_that_day(owner, cost.day).await? >= cost.limit_usd
        {
            return Ok(true);
        }
        Ok(false)
    }

    /// Why `a` refused a run of `owner`, with the figures as read now (best effort): the
    /// day's spending if it is past its allowance, else the slots.
    pub(super) async fn refusal(&self, owner: &str, a: &baton_core::ports::Admission) -> PortError {
        if let Some(cost) = &a.daily_cost {
            let spent = self
                .spent_on(owner, cost.day)
                .await
                .unwrap_or(cost.limit_usd);
            if spent >= cost.limit_usd || a.active_runs.is_none() {
                return PortError::DailyCostExceeded {
                    limit_usd: cost.limit_usd,
                    spent_usd: spent,
                };
            }
        }
        let limit = u64::from(a.active_runs.unwrap_or_default());
        let current = self.slots_held(owner).await.unwrap_or(limit);
        PortError::QuotaExceeded { limit, current }
    }

    pub(super) async fn spent_that_day(
        &self,
        owner: &str,
        day: chrono::NaiveDate,
    ) -> Result<f64, PortError> {
        // Every shard (and the one item of a table written before shards, `META`).
        let query = self
            .range(&spend_pk(owner, day), " ", "~")
            .consistent_read(true);
        let mut usd = 0.0;
        self.query_pages("Query (day's spending)", query, |item| {
            if let Some(AttributeValue::N(v)) = item.get("usd") {
                usd += v.parse::<f64>().unwrap_or(0.0);
            }
            Ok(true)
        })
        .await?;
        Ok(usd)
    }

    pub(super) async fn slots_held(&self, owner: &str) -> Result<u64, PortError> {
        let item = self.get_item(quota_pk(owner)).await?;
        Ok(match item.as_ref().and_then(|i| i.get("active")) {
            Some(AttributeValue::N(v)) => v.parse::<i64>().unwrap_or(0).max(0) as u64,
            _ => 0,
        })
    }
}
