//! Budgeted run trees' ledgers on DynamoDB: one item in the top-level run's partition
//! (`SK = BUDGET`, purged with it), put in the write that creates the run and added to
//! (`ADD`) in each commit of the tree's steps, so each step's spending and raise count once.

use aws_sdk_dynamodb::types::Update;
use baton_core::budget::{Budget, Ledger, Raise};

use super::*;

/// The `SK` of a budgeted tree's ledger, in its top-level run's partition (outside the
/// [`INFO_SK`, `META`] range the run's reads query).
const BUDGET_SK: &str = "BUDGET";

impl DynamoStore {
    /// The ledger item of a new budgeted top-level run.
    pub(super) fn ledger_put(
        &self,
        root_run_id: &str,
        budget: Budget,
    ) -> Result<TransactWriteItem, PortError> {
        let item = Item::from([
            ("PK".into(), s(run_pk(root_run_id))),
            ("SK".into(), s(BUDGET_SK)),
            ("budgetUsd".into(), n(budget.budget_usd)),
            ("spentUsd".into(), n(0.0)),
        ]);
        self.put(item, None)
    }

    /// Adds a commit's spending and raise to its tree's ledger.
    pub(super) fn ledger_add(
        &self,
        root_run_id: &str,
        budget: Budget,
        spent_usd: f64,
        raise: Option<&Raise>,
    ) -> Result<TransactWriteItem, PortError> {
        // A ledger lost (or a tree stored before budgets) starts again from the budget.
        let mut expr =
            "SET budgetUsd = if_not_exists(budgetUsd, :first) ADD spentUsd :spent".to_owned();
        let mut u = Update::builder()
            .table_name(&self.table)
            .key("PK", s(run_pk(root_run_id)))
            .key("SK", s(BUDGET_SK))
            .expression_attribute_values(":first", n(budget.budget_usd))
            .expression_attribute_values(":spent", n(spent_usd));
        if let Some(r) = raise {
            let body = serde_json::to_string(r).map_err(|e| broken("encode raise", e))?;
            expr = "SET budgetUsd = if_not_exists(budgetUsd, :first) + :by, \
                    raises = list_append(if_not_exists(raises, :none), :raise) \
                    ADD spentUsd :spent"
                .to_owned();
            u = u
                .expression_attribute_values(":by", n(r.by_usd))
                .expression_attribute_values(":none", AttributeValue::L(Vec::new()))
                .expression_attribute_values(":raise", AttributeValue::L(vec![s(body)]));
        }
        let update = u
            .update_expression(expr)
            .build()
            .map_err(|e| broken("build update", e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    pub(super) async fn read_ledger(&self, root_run_id: &str) -> Result<Option<Ledger>, PortError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("PK", s(run_pk(root_run_id)))
            .key("SK", s(BUDGET_SK))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map_sdk_err("GetItem", e))?;
        self.count_read(out.item().map_or(1, item_size), true);
        let Some(item) = out.item else {
            return Ok(None);
        };
        let num = |k: &str| match item.get(k) {
            Some(AttributeValue::N(v)) => v.parse::<f64>().unwrap_or(0.0),
            _ => 0.0,
        };
        let raises = match item.get("raises") {
            Some(AttributeValue::L(l)) => l
                .iter()
                .filter_map(|v| v.as_s().ok())
                .map(|b| serde_json::from_str(b).map_err(|e| broken("decode raise", e)))
                .collect::<Result<Vec<_>, _>>()?,
            _ => Vec::new(),
        };
        Ok(Some(Ledger {
            budget_usd: num("budgetUsd"),
            spent_usd: num("spentUsd"),
            raises,
        }))
    }
}
