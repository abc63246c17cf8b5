//! Owners' quotas on DynamoDB: the conditional writes that admit a run (an active-run slot
//! on the owner's `QUOTA#` counter, the day's spending under its allowance), a slot given
//! back, and the figures.

use super::*;

impl DynamoStore {
    /// The conditional writes that admit a run of `owner` by `a`: a slot taken, the day's
    /// spending below its allowance.
    pub(super) fn admission_items(
        &self,
        owner: &str,
        a: &baton_core::ports::Admission,
    ) -> Result<Vec<TransactWriteItem>, PortError> {
        let mut items = Vec::new();
        if let Some(limit) = a.active_runs {
            items.push(self.slot_count(owner, 1, Some(limit))?);
        }
        if let Some(cost) = &a.daily_cost {
            items.push(self.spend_below(owner, cost.day, cost.limit_usd)?);
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

    pub(super) async fn readmit_run(
        &self,
        run_id: &str,
        owner: &str,
        admission: &baton_core::ports::Admission,
    ) -> Result<(), PortError> {
        let mut items = Vec::new();
        if admission.active_runs.is_some() {
            let mark = aws_sdk_dynamodb::types::Update::builder()
                .table_name(&self.table)
                .key("PK", s(run_pk(run_id)))
                .key("SK", s("META"))
                .update_expression("SET slot = :one")
                .condition_expression("attribute_exists(PK) AND attribute_not_exists(slot)")
                .expression_attribute_values(":one", n(1))
                .build()
                .map_err(|e| PortError::broken("build update", e))?;
            items.push(TransactWriteItem::builder().update(mark).build());
        }
        let marked = !items.is_empty();
        items.extend(self.admission_items(owner, admission)?);
        if items.is_empty() {
            return Ok(());
        }
        match self.transact(items, None).await {
            Ok(()) => Ok(()),
            // The run holds a slot already: admitted (or it is gone: its follow-up finds
            // that out).
            Err(TransactFailure::Condition(failed)) if marked && failed.contains(&0) => Ok(()),
            Err(TransactFailure::Condition(_)) => Err(self.refusal(owner, admission).await),
            Err(TransactFailure::Port(e)) => Err(e),
        }
    }

    pub(super) async fn give_back(
        &self,
        run_id: &str,
        owner: &str,
        version: u64,
    ) -> Result<(), PortError> {
        let unmark = aws_sdk_dynamodb::types::Update::builder()
            .table_name(&self.table)
            .key("PK", s(run_pk(run_id)))
            .key("SK", s("META"))
            .update_expression("REMOVE slot")
            .condition_expression("attribute_exists(slot) AND v = :v")
            .expression_attribute_values(":v", n(version))
            .build()
            .map_err(|e| PortError::broken("build update", e))?;
        let items = vec![
            TransactWriteItem::builder().update(unmark).build(),
            self.slot_count(owner, -1, None)?,
        ];
        match self.transact(items, None).await {
            // No slot, or the run moved on (a turn started, and holds it): nothing to do.
            Ok(()) | Err(TransactFailure::Condition(_)) => Ok(()),
            Err(TransactFailure::Port(e)) => Err(e),
        }
    }

    pub(super) async fn spent_that_day(
        &self,
        owner: &str,
        day: chrono::NaiveDate,
    ) -> Result<f64, PortError> {
        let item = self.get_item(spend_pk(owner, day)).await?;
        Ok(match item.as_ref().and_then(|i| i.get("usd")) {
            Some(AttributeValue::N(v)) => v.parse::<f64>().unwrap_or(0.0),
            _ => 0.0,
        })
    }

    pub(super) async fn slots_held(&self, owner: &str) -> Result<u64, PortError> {
        let item = self.get_item(quota_pk(owner)).await?;
        Ok(match item.as_ref().and_then(|i| i.get("active")) {
            Some(AttributeValue::N(v)) => v.parse::<i64>().unwrap_or(0).max(0) as u64,
            _ => 0,
        })
    }
}
