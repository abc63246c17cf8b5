//! A step's commit: one conditional write on the run's version, of the run item alone
//! (its tail holding the step's entries, `tail.rs`) when that holds everything the step
//! wrote, else one transaction of the run item and the rest.

use super::items::*;
use super::keys::*;
use super::*;

impl DynamoStore {
    /// [`RunWrites::commit`] on DynamoDB.
    pub(super) async fn commit_step(
        &self,
        expected_version: u64,
        t: &Transition,
    ) -> Result<(), PortError> {
        let run_id = &t.run.run_id;
        // Where this commit's entries go (`tail.rs`): into the run item's tail while it has
        // room, the committed tail copied out to its segment first when it has not.
        let old = self.committed_tail(run_id, expected_version).await?;
        let mut run_item = self.run_item(&t.run, &t.effects, 0)?;
        let plan = tail::plan(run_id, &old, &t.appended, &t.updated, item_size(&run_item))?;
        let mut timeline_items = Vec::new();
        if let Some(copy) = plan.copy {
            self.copy_tail(copy).await?;
            baton_core::failpoint::hit("store.after_tail_copy")?;
            timeline_items.push(None);
        }
        if !plan.segments.is_empty() {
            timeline_items.extend(
                self.segment_items(run_id, &plan.segments)?
                    .into_iter()
                    .map(Some),
            );
        }
        for e in &plan.patches {
            timeline_items.push(Some(self.patch_item(run_id, e)?));
        }
        run_item.insert("ni".into(), n(timeline_items.len()));
        // This call's own token: should its write come back to it as a failed condition
        // (the request sent again), the item says whose write it was.
        let token = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
        run_item.insert("ct".into(), s(&token));
        if let Some((first, bytes)) = plan.tail {
            run_item.insert("tf".into(), n(first));
            run_item.insert(
                "tl".into(),
                AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(bytes)),
            );
        }
        let run_size = item_size(&run_item);
        let run_write = self.run_update(run_item, expected_version, t.release_slot, t.take_slot)?;
        let mut items = Vec::new();
        if t.release_slot {
            // Given back with the commit that ends the run: once, as the commit is
            // conditional on the run's version.
            items.push(self.slot_count(&t.run.owner, -1, None)?);
        }
        // Where the slot count is, once the run item goes first (a failed condition there
        // is the owner's limit, not a conflict).
        let mut slot_at = None;
        if t.take_slot {
            // With the commit that starts the turn: while one is free, for a follow-up's
            // (`slot_limit`); whatever the limit otherwise.
            slot_at = Some(items.len() + 1);
            items.push(self.slot_count(&t.run.owner, 1, t.slot_limit)?);
        }
        if t.daily_spend && t.spent_usd > 0.0 {
            let day = t.run.updated_at.date_naive();
            items.push(self.spend_add(&t.run.owner, day, t.spent_usd, &t.run.run_id)?);
        }
        if let Some(b) = t.run.origin.budget
            && (t.spent_usd > 0.0 || t.budget_raise.is_some())
        {
            // Once, as the commit is conditional on the run's version.
            items.push(self.ledger_add(
                t.run.root(),
                b,
                t.spent_usd,
                t.budget_raise.as_ref(),
                &t.run.run_id,
            )?);
        }
        for item in timeline_items.into_iter().flatten() {
            items.push(self.put(item, None)?);
        }
        // A question's inbox pointers, one per assignee, ride with the commit when they fit
        // (below, as children's INFO items do).
        let mut extras = Vec::new();
        for c in &t.new_ctas {
            items.push(self.put(self.cta_item(c)?, Some("attribute_not_exists(PK)"))?);
            for principal in &c.assignees {
                extras.push(self.assignment_item(principal, c));
            }
        }
        let mut infos = Vec::new();
        for (child, entries) in &t.new_runs {
            let segments = self.segment_items(&child.run_id, entries)?;
            items.push(self.put(
                self.run_item(child, &[], segments.len())?,
                Some("attribute_not_exists(PK)"),
            )?);
            infos.push(self.info_item(child)?);
            for seg in segments {
                items.push(self.put(seg, None)?);
            }
        }
        // A child's `INFO` item (its place in its tree) and a question's inbox pointers go
        // with the commit when they fit; when a plan starts many steps at once, or questions
        // have many assignees, they are written first (an `INFO` item whose run item never
        // comes is skipped by the lists, which read the run items; a pointer whose question
        // never comes, by the inboxes, which read the questions).
        extras.extend(infos);
        if items.len() + extras.len() <= MAX_TRANSACT_ITEMS {
            for extra in extras {
                items.push(self.put(extra, None)?);
            }
        } else {
            self.put_ahead(extras).await?;
        }
        if items.is_empty() {
            // The run item is the whole commit: no transaction, billed once.
            // Billed by the larger of the item before and after.
            let written = self
                .update_run(&run_write, run_size.max(old.item_bytes), &token)
                .await?;
            // Kept as a read would find it (the whole item, the attributes this commit does
            // not write included), so that the run's next commit plans as a fresh read's
            // would: a warm and a cold step make the same writes.
            match written {
                Some(item) => self.tails.keep(run_id, super::tail::Tail::of(&item)),
                None => self.tails.forget(run_id),
            }
            return Ok(());
        }

        items.insert(0, TransactWriteItem::builder().update(run_write).build());
        self.meter.write_units.fetch_add(
            2 * run_size.div_ceil(1024).max(1) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        // The same (run, version) always sends the same token: a retried commit is not a
        // conflict. DynamoDB keeps tokens per account and Region, not per table: the table
        // is in it, so that two tables' runs of one id (two stacks, tests) never meet.
        let token = uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("{}/{run_id}/{expected_version}", self.table).as_bytes(),
        )
        .simple()
        .to_string();
        match self.transact(items, Some(token)).await {
            Ok(()) => {
                // A transaction answers no item: the next commit reads the run item again.
                self.tails.forget(run_id);
                Ok(())
            }
            Err(TransactFailure::Condition(failed))
                if slot_at.is_some_and(|i| failed == [i])
                    && let Some(limit) = t.slot_limit =>
            {
                let limit = u64::from(limit);
                let current = self.slots_held(&t.run.owner).await.unwrap_or(limit);
                Err(PortError::QuotaExceeded { limit, current })
            }
            Err(TransactFailure::Condition(_)) => Err(PortError::Conflict),
            Err(TransactFailure::Port(e)) => Err(e),
        }
    }

    /// A commit that writes the run item alone: one conditional `UpdateItem` (billed once,
    /// where a transaction bills twice), which writes `ct`, a token of this call. A failed
    /// condition is [`PortError::Conflict`], as a transaction's is, unless the item it
    /// found is this call's own write (the SDK sent the request again after an answer was
    /// lost on the way back): a transaction's `ClientRequestToken` makes its retry succeed,
    /// and the token does the same here.
    /// Answers the item as written, when DynamoDB says it (`None` otherwise).
    pub(super) async fn update_run(
        &self,
        update: &aws_sdk_dynamodb::types::Update,
        size: usize,
        token: &str,
    ) -> Result<Option<Item>, PortError> {
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};
        Meter::count(&self.meter.dynamodb);
        self.meter.write_units.fetch_add(
            size.div_ceil(1024).max(1) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(update.key().clone()))
            .update_expression(update.update_expression())
            .set_condition_expression(update.condition_expression().map(str::to_owned))
            .set_expression_attribute_names(update.expression_attribute_names().cloned())
            .set_expression_attribute_values(update.expression_attribute_values().cloned())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            // The item as written (free: it is the write's own answer).
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match r {
            Ok(out) => Ok(out.attributes().cloned()),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    let ours = c
                        .item()
                        .and_then(|i| i.get("ct"))
                        .is_some_and(|ct| ct == &s(token));
                    if ours {
                        // Our own write, found: the item as it is.
                        Ok(c.item().cloned())
                    } else {
                        Err(PortError::Conflict)
                    }
                }
                _ => Err(map_sdk_err("UpdateItem", e)),
            },
        }
    }

    /// Copies a committed tail to its segment ([`super::tail::COPY_CONDITION`]); a newer
    /// copy already there is success: it holds all this one does.
    pub(super) async fn copy_tail(&self, item: Item) -> Result<(), PortError> {
        self.count_write(&[&item], false);
        let tv = item.get("tv").cloned().unwrap_or_else(|| n(0));
        let r = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(super::tail::COPY_CONDITION)
            .expression_attribute_values(":tv", tv)
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(()),
            Err(e) => Err(map_sdk_err("PutItem", e)),
        }
    }

    /// The committed tail of `run_id` at `version`: the one its last read kept, else read
    /// strongly (the whole item: its size is what its update is billed at, at least). A run at another version is a
    /// [`PortError::Conflict`] before anything is written.
    pub(super) async fn committed_tail(
        &self,
        run_id: &str,
        version: u64,
    ) -> Result<super::tail::Tail, PortError> {
        if let Some(t) = self.tails.at(run_id, version) {
            return Ok(t);
        }
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("PK", s(run_pk(run_id)))
            .key("SK", s("META"))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map_sdk_err("GetItem", e))?;
        self.count_read(out.item().map_or(1, item_size), true);
        let tail = out.item().map(super::tail::Tail::of).unwrap_or_default();
        if tail.version != version {
            return Err(PortError::Conflict);
        }
        Ok(tail)
    }
}
