//! Budgeted run trees' ledgers on DynamoDB: items in the top-level run's partition (purged
//! with it). `SK = BUDGET` holds the budget and its raises, put in the write that creates
//! the run; each commit of the tree's steps adds (`ADD`) its spending to one of
//! [`COUNTER_SHARDS`] items (`BUDGET#NN`, by the committing run), so that a wide fan-out's
//! commits seldom touch one item at once, and each step's spending counts once. A read
//! sums them (one query).

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

    /// Adds a commit of `run_id`'s spending and raise to its tree's ledger: a raise (and the
    /// spending with it) to the ledger's own item, spending alone to `run_id`'s shard.
    pub(super) fn ledger_add(
        &self,
        root_run_id: &str,
        budget: Budget,
        spent_usd: f64,
        raise: Option<&Raise>,
        run_id: &str,
    ) -> Result<TransactWriteItem, PortError> {
        let sk = match raise {
            Some(_) => BUDGET_SK.to_owned(),
            None => counter_sk(BUDGET_SK, run_id),
        };
        // A ledger lost (or a tree stored before budgets) starts again from the budget.
        let mut expr =
            "SET budgetUsd = if_not_exists(budgetUsd, :first) ADD spentUsd :spent".to_owned();
        let mut u = Update::builder()
            .table_name(&self.table)
            .key("PK", s(run_pk(root_run_id)))
            .key("SK", s(sk))
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
        // The ledger's own item and its shards (`BUDGET`, `BUDGET#00` …).
        let query = self
            .range(&run_pk(root_run_id), BUDGET_SK, &format!("{BUDGET_SK}#~"))
            .consistent_read(true);
        let (mut own, mut shards) = (None, Vec::new());
        self.query_pages("Query (ledger)", query, |item| {
            match item.get("SK") {
                Some(AttributeValue::S(sk)) if sk == BUDGET_SK => own = Some(item),
                _ => shards.push(item),
            }
            Ok(true)
        })
        .await?;
        // A figure that is there but no finite number is not read as 0: the ledger does
        // not read back, and says why (a run's reads show the rest of it).
        let figure = |item: &Item, k: &str| -> Result<Option<f64>, PortError> {
            match item.get(k) {
                None => Ok(None),
                Some(AttributeValue::N(v)) => match v.parse::<f64>() {
                    Ok(f) if f.is_finite() => Ok(Some(f)),
                    _ => Err(undecodable(root_run_id, k, &format!("{v:?}"))),
                },
                Some(other) => Err(undecodable(root_run_id, k, &format!("{other:?}"))),
            }
        };
        let mut spent = 0.0;
        for shard in &shards {
            spent += figure(shard, "spentUsd")?.unwrap_or(0.0);
        }
        // A ledger whose own item was lost starts again from the budget a shard kept.
        let (item, own_spent) = match own {
            Some(item) => {
                let own_spent = figure(&item, "spentUsd")?.unwrap_or(0.0);
                (item, own_spent)
            }
            None => match shards.into_iter().next() {
                Some(shard) => (shard, 0.0),
                None => return Ok(None),
            },
        };
        let budget_usd = figure(&item, "budgetUsd")?.unwrap_or(0.0);
        let raises = match item.get("raises") {
            Some(AttributeValue::L(l)) => l
                .iter()
                .filter_map(|v| v.as_s().ok())
                .map(|b| serde_json::from_str(b).map_err(|e| broken("decode raise", e)))
                .collect::<Result<Vec<_>, _>>()?,
            _ => Vec::new(),
        };
        Ok(Some(Ledger {
            budget_usd,
            spent_usd: own_spent + spent,
            raises,
        }))
    }
}

/// A ledger figure that does not read back as a number.
fn undecodable(root_run_id: &str, key: &str, found: &str) -> PortError {
    broken(
        &format!("budget ledger of {root_run_id}"),
        std::io::Error::other(format!("`{key}` is {found}, not a number")),
    )
}
