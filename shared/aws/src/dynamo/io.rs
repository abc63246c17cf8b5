//! The table's I/O: the store's client (asking each call what it consumed), and reads and
//! writes through it, each counted by the meter.

use super::*;

/// How many times a transaction cancelled only by a conflict with another is sent again
/// ([`DynamoStore::transact`]) before its caller is told.
const TRANSACTION_CONFLICT_RETRIES: u32 = 3;

impl DynamoStore {
    /// The store of `table`, over `client` with `super::consumed::ConsumedUnits` added.
    pub fn new(
        client: Client,
        table: impl Into<String>,
        retention_days: u32,
        meter: Arc<Meter>,
    ) -> Self {
        // Every call asks what it consumed, and the meter adds it up.
        let config = client
            .config()
            .to_builder()
            .interceptor(super::consumed::ConsumedUnits(meter.clone()))
            .build();
        Self {
            client: Client::from_conf(config),
            table: table.into(),
            retention: chrono::Duration::days(retention_days.into()),
            meter,
            tails: Default::default(),
            sweep_shards: SWEEP_SHARDS,
            read_shards: Arc::new(SWEEP_SHARDS.into()),
        }
    }

    /// Writes the sweep indexes over `shards` partitions (at most [`MAX_SWEEP_SHARDS`]):
    /// more, where one partition would take more runs than its write rate (about 1,000
    /// index writes a second). Reads cover the most the table was ever written with, once
    /// [`DynamoStore::claim_format`] has read the table's record of it.
    pub fn with_sweep_shards(mut self, shards: u32) -> Self {
        let shards = shards.clamp(1, MAX_SWEEP_SHARDS);
        self.sweep_shards = shards;
        self.read_shards = Arc::new(shards.into());
        self
    }

    /// The sweep shards its reads cover.
    pub fn read_shards(&self) -> u32 {
        self.read_shards.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records this release's store format on the table (item `BATON`/`FORMAT`), unless a
    /// newer release has recorded a newer one: then this release refuses the table (see
    /// `baton_core::ports::check_store_format`). One conditional write, at a host's start
    /// (each function's cold start).
    pub async fn claim_format(&self) -> Result<(), PortError> {
        use baton_core::ports::{STORE_FORMAT, check_store_format};
        let claimed = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("PK", s("BATON"))
            .key("SK", s("FORMAT"))
            .update_expression("SET fmt = :f")
            // A number no newer than this release's; anything else (a newer format, a
            // string no Baton writes) is read back below and said as found.
            .condition_expression(
                "attribute_not_exists(fmt) OR (attribute_type(fmt, :num) AND fmt <= :f)",
            )
            .expression_attribute_values(":f", n(STORE_FORMAT))
            .expression_attribute_values(":num", s("N"))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllOld)
            .send()
            .await;
        match claimed {
            Ok(out) => {
                let before = out.attributes();
                if before.is_none_or(|a| !a.contains_key("fmt")) {
                    // Said, not guessed at: a table no release recorded a format on is new,
                    // or was written before formats were recorded (format 1, which this
                    // release reads as it is).
                    tracing::info!(table = %self.table, format = STORE_FORMAT, "no store format recorded on the table (a new table, or format 1): recorded this release's");
                }
                let recorded = before
                    .and_then(|a| a.get("shards")?.as_n().ok()?.parse::<u32>().ok())
                    .unwrap_or(SWEEP_SHARDS);
                self.claim_shards(recorded).await
            }
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => {
                // A newer format is recorded: say which.
                let found = self
                    .client
                    .get_item()
                    .table_name(&self.table)
                    .key("PK", s("BATON"))
                    .key("SK", s("FORMAT"))
                    .consistent_read(true)
                    .send()
                    .await
                    .map_err(|e| map_sdk_err("GetItem", e))?
                    .item()
                    .and_then(|i| i.get("fmt").cloned());
                // Said as found, whatever its type: a number a newer release recorded, or
                // a string or anything else no Baton writes.
                let raw = match &found {
                    Some(AttributeValue::N(n)) => n.clone(),
                    Some(AttributeValue::S(s)) => s.clone(),
                    Some(other) => format!("{other:?}"),
                    None => "(none)".into(),
                };
                let store = format!("table {}", self.table);
                let found = baton_core::ports::parse_store_format(&raw, &store)?;
                check_store_format(Some(found), &store)
            }
            Err(e) => Err(map_sdk_err("UpdateItem", e)),
        }
    }

    /// Records this store's sweep shards on the table when they are more than `recorded`,
    /// and reads the most of the two from then on.
    async fn claim_shards(&self, recorded: u32) -> Result<(), PortError> {
        use std::sync::atomic::Ordering;
        if self.sweep_shards > recorded {
            let raised = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("PK", s("BATON"))
                .key("SK", s("FORMAT"))
                .update_expression("SET shards = :n")
                .condition_expression("attribute_not_exists(shards) OR shards < :n")
                .expression_attribute_values(":n", n(self.sweep_shards))
                .send()
                .await;
            match raised {
                Ok(_) => {}
                // Raised past this one's meanwhile: read it at the next cold start.
                Err(e) if e.code() == Some("ConditionalCheckFailedException") => {}
                Err(e) => return Err(map_sdk_err("UpdateItem", e)),
            }
        }
        self.read_shards
            .store(self.sweep_shards.max(recorded), Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn count_read(&self, bytes: usize, consistent: bool) {
        Meter::count(&self.meter.dynamodb);
        let units = bytes.div_ceil(4096).max(1) as u64;
        self.meter.read_half_units.fetch_add(
            if consistent { units * 2 } else { units },
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub(super) fn count_write(&self, items: &[&Item], transactional: bool) {
        Meter::count(&self.meter.dynamodb);
        let units: u64 = items
            .iter()
            .map(|i| item_size(i).div_ceil(1024).max(1) as u64)
            .sum();
        self.meter.write_units.fetch_add(
            if transactional { units * 2 } else { units },
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub(super) async fn transact(
        &self,
        items: Vec<TransactWriteItem>,
        token: Option<String>,
    ) -> Result<(), TransactFailure> {
        if items.len() > MAX_TRANSACT_ITEMS {
            return Err(TransactFailure::Port(PortError::Broken {
                message: format!(
                    "a commit of {} items exceeds DynamoDB's {MAX_TRANSACT_ITEMS}",
                    items.len()
                ),
                source: None,
            }));
        }
        let sized: Vec<&Item> = items
            .iter()
            .filter_map(|i| i.put().map(|p| p.item()))
            .collect();
        self.count_write(&sized, true);
        // A transaction cancelled only because another touched one of its items at once
        // (an owner's counter or day's spending, which its runs' commits share) wrote
        // nothing: it is sent again here, a few times, rather than failing its step (whose
        // model call would run again).
        let mut conflicts = 0;
        let r = loop {
            let r = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .set_client_request_token(token.clone())
                .send()
                .await;
            let conflicted = matches!(
                r.as_ref().map_err(|e| e.as_service_error()),
                Err(Some(TransactWriteItemsError::TransactionCanceledException(ex)))
                    if ex.cancellation_reasons().iter().any(|r| r.code() == Some("TransactionConflict"))
                        && ex.cancellation_reasons().iter().all(|r| {
                            matches!(r.code(), None | Some("None" | "TransactionConflict"))
                        })
            );
            if conflicted && conflicts < TRANSACTION_CONFLICT_RETRIES {
                conflicts += 1;
                let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0]) % 40;
                tokio::time::sleep(std::time::Duration::from_millis(10 + jitter)).await;
                continue;
            }
            break r;
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(ex)) => {
                    let failed: Vec<usize> = ex
                        .cancellation_reasons()
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.code() == Some("ConditionalCheckFailed"))
                        .map(|(i, _)| i)
                        .collect();
                    let transient = ex
                        .cancellation_reasons()
                        .iter()
                        .filter_map(|r| r.code())
                        .find(|c| is_retryable_cancellation(c));
                    match (failed.is_empty(), transient) {
                        (false, _) => Err(TransactFailure::Condition(failed)),
                        // Throttled or in conflict with another transaction: nothing was
                        // written, and the same transaction may succeed in a moment.
                        (true, Some(reason)) => Err(TransactFailure::Port(PortError::unavailable(
                            format!("TransactWriteItems: cancelled: {reason}"),
                            e,
                        ))),
                        (true, None) => {
                            Err(TransactFailure::Port(map_sdk_err("TransactWriteItems", e)))
                        }
                    }
                }
                Some(TransactWriteItemsError::IdempotentParameterMismatchException(_)) => {
                    Err(TransactFailure::Condition(vec![0]))
                }
                _ => Err(TransactFailure::Port(map_sdk_err("TransactWriteItems", e))),
            },
        }
    }

    /// One conditional update of an item's `META`, metered; a condition that no longer
    /// holds (the item moved on, or is gone) is not an error: there is nothing left to do.
    pub(super) async fn update_meta(
        &self,
        pk: String,
        update: &str,
        condition: &str,
        values: &[(&str, AttributeValue)],
    ) -> Result<(), PortError> {
        Meter::count(&self.meter.dynamodb);
        self.meter
            .write_units
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("PK", s(pk))
            .key("SK", s("META"))
            .update_expression(update)
            .condition_expression(condition);
        for (k, v) in values {
            req = req.expression_attribute_values(*k, v.clone());
        }
        match req.send().await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(()),
            Err(e) => Err(map_sdk_err("UpdateItem", e)),
        }
    }

    pub(super) async fn get_item(&self, pk: String) -> Result<Option<Item>, PortError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("PK", s(pk))
            .key("SK", s("META"))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map_sdk_err("GetItem", e))?;
        self.count_read(out.item().map_or(1, item_size), true);
        Ok(out.item)
    }

    /// A run item read strongly, with its `INFO` item (`metadata`, `context`) merged in:
    /// one query of two adjacent keys, billed as one item of their joint size.
    pub(super) async fn get_run_item(&self, run_id: &str) -> Result<Option<Item>, PortError> {
        Ok(self.run_items(run_id).await?.map(|(meta, _)| meta))
    }

    /// [`Self::get_run_item`] for a step, which may commit next: a run stored before runs
    /// had an `INFO` item (its `metadata` and `context` in the run item's body, and not in
    /// its owner's list) gets one first, once, so that the commit's leaner body loses
    /// nothing.
    pub(super) async fn step_run_item(&self, run_id: &str) -> Result<Option<Item>, PortError> {
        let Some((meta, has_info)) = self.run_items(run_id).await? else {
            return Ok(None);
        };
        if !has_info {
            let info = self.info_item(&parse_run(&meta)?.run)?;
            Meter::count(&self.meter.dynamodb);
            self.meter.write_units.fetch_add(
                item_size(&info).div_ceil(1024).max(1) as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(info))
                .send()
                .await
                .map_err(|e| map_sdk_err("PutItem", e))?;
        }
        Ok(Some(meta))
    }

    /// Leases `run_id` to its watchers until `until`: its steps stream what they do (model
    /// replies, tools starting and ending) to the live channel while the lease holds. One
    /// small item beside the run item (`LIVE`), which the step's read of the run reads too;
    /// its TTL removes it a day after it lapses, and the sweep with the run.
    pub async fn lease_watch(&self, run_id: &str, until: DateTime<Utc>) -> Result<(), PortError> {
        let item = Item::from([
            ("PK".into(), s(run_pk(run_id))),
            ("SK".into(), s(LIVE_SK)),
            ("wu".into(), n(until.timestamp_millis())),
            (
                "ttl".into(),
                n((until + chrono::Duration::days(1)).timestamp()),
            ),
        ]);
        self.count_write(&[&item], false);
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| map_sdk_err("PutItem", e))?;
        Ok(())
    }

    /// The run item (with its `INFO` item's attributes and its watch lease merged in) and
    /// whether it has an `INFO` item.
    async fn run_items(&self, run_id: &str) -> Result<Option<(Item, bool)>, PortError> {
        let out = self
            .range(&run_pk(run_id), INFO_SK, "META")
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map_sdk_err("Query", e))?;
        let items = out.items.unwrap_or_default();
        self.count_read(items.iter().map(item_size).sum(), true);
        let (mut meta, mut info, mut lease) = (None, None, None);
        for item in items {
            match item.get("SK") {
                Some(AttributeValue::S(sk)) if sk == "META" => meta = Some(item),
                Some(AttributeValue::S(sk)) if sk == LIVE_SK => lease = item.get("wu").cloned(),
                _ => info = Some(item),
            }
        }
        let has_info = info.is_some();
        if let Some(meta) = &meta {
            // What a commit at this version appends to, or copies out.
            self.tails.keep(run_id, super::tail::Tail::of(meta));
        }
        Ok(meta.map(|mut meta| {
            for (k, v) in info.into_iter().flatten() {
                if k == "md" || k == "cx" {
                    meta.insert(k, v);
                }
            }
            if let Some(wu) = lease {
                meta.insert("wu".into(), wu);
            }
            (meta, has_info)
        }))
    }

    /// The run items (`META`) of the partitions `pks`, eventually consistent, by partition:
    /// `BatchGetItem`s of up to 100 keys, the keys it leaves unprocessed asked again (as
    /// [`crate::sdk::retry_failed_entries`] does). Missing items are absent from the map.
    pub(super) async fn get_metas(
        &self,
        pks: &[String],
    ) -> Result<HashMap<String, Item>, PortError> {
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        let found = std::sync::Mutex::new(HashMap::new());
        for chunk in pks.chunks(100) {
            let keys: Vec<Item> = chunk
                .iter()
                .map(|pk| Item::from([("PK".into(), s(pk)), ("SK".into(), s("META"))]))
                .collect();
            crate::sdk::retry_failed_entries("BatchGetItem", keys, |keys| async {
                let asked = KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .build()
                    .map_err(|e| broken("build a batch get", e))?;
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, asked)
                    .send()
                    .await
                    .map_err(|e| map_sdk_err("BatchGetItem", e))?;
                let items = out
                    .responses
                    .and_then(|mut r| r.remove(&self.table))
                    .unwrap_or_default();
                self.count_read(items.iter().map(item_size).sum(), false);
                let mut found = found.lock().unwrap_or_else(|p| p.into_inner());
                for item in items {
                    if let Ok(pk) = get_s(&item, "PK") {
                        found.insert(pk.to_owned(), item);
                    }
                }
                Ok(out
                    .unprocessed_keys
                    .and_then(|mut u| u.remove(&self.table))
                    .map(|k| k.keys)
                    .unwrap_or_default())
            })
            .await?;
        }
        Ok(found.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    /// A query of the items of partition `pk` whose SK lies in [lo, hi].
    pub(super) fn range(&self, pk: &str, lo: &str, hi: &str) -> QueryFluentBuilder {
        self.client
            .query()
            .table_name(&self.table)
            .key_condition_expression("PK = :pk AND SK BETWEEN :lo AND :hi")
            .expression_attribute_values(":pk", s(pk))
            .expression_attribute_values(":lo", s(lo))
            .expression_attribute_values(":hi", s(hi))
    }

    /// Every item of a partition whose SK lies in [lo, hi], until `keep_going` says stop
    /// after an item.
    pub(super) async fn query(
        &self,
        pk: &str,
        lo: &str,
        hi: &str,
        forward: bool,
        consistent: bool,
        mut keep_going: impl FnMut(&Item) -> bool,
    ) -> Result<Vec<Item>, PortError> {
        let query = self
            .range(pk, lo, hi)
            .consistent_read(consistent)
            .scan_index_forward(forward);
        let mut out = Vec::new();
        self.query_pages("Query", query, |item| {
            let more = keep_going(&item);
            out.push(item);
            Ok(more)
        })
        .await?;
        Ok(out)
    }

    /// The items of partition `pk` with SK in [lo, hi], in the order asked, read strongly,
    /// handed to `each` until it says stop. DynamoDB bills a query page for every item it
    /// reads, up to 1 MB, whatever the caller keeps: so pages of `first` items, then twice
    /// as many each time (at most 100), and a read that stops early reads at most about
    /// twice what it used, in a few requests. (Not the SDK's paginator: its pages keep the
    /// size the first request asked for.)
    pub(super) async fn query_until(
        &self,
        pk: &str,
        (lo, hi): (&str, &str),
        forward: bool,
        first: i32,
        mut each: impl FnMut(Item) -> Result<bool, PortError>,
    ) -> Result<(), PortError> {
        let (mut page, mut after) = (first.max(1), None);
        loop {
            let out = self
                .range(pk, lo, hi)
                .consistent_read(true)
                .scan_index_forward(forward)
                .limit(page)
                .set_exclusive_start_key(after.take())
                .send()
                .await
                .map_err(|e| map_sdk_err("Query", e))?;
            self.count_read(out.items().iter().map(item_size).sum(), true);
            after = out.last_evaluated_key;
            for item in out.items.unwrap_or_default() {
                if !each(item)? {
                    return Ok(());
                }
            }
            if after.is_none() {
                return Ok(());
            }
            page = (page * 2).min(100);
        }
    }

    /// Hands each item of `query`'s pages (the SDK's paginator) to `each`, counting every
    /// page's reads, until the pages end or `each` says stop.
    pub(super) async fn query_pages(
        &self,
        what: &str,
        query: QueryFluentBuilder,
        mut each: impl FnMut(Item) -> Result<bool, PortError>,
    ) -> Result<(), PortError> {
        let consistent = query.get_consistent_read().unwrap_or(false);
        let mut pages = query.into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| map_sdk_err(what, e))?;
            self.count_read(page.items().iter().map(item_size).sum(), consistent);
            for item in page.items.unwrap_or_default() {
                if !each(item)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Items written ahead of a transaction that would not hold them (unconditional puts,
    /// 25 to a `BatchWriteItem`): each is named only by an item the transaction writes.
    pub(super) async fn put_ahead(&self, items: Vec<Item>) -> Result<(), PortError> {
        let mut puts = items
            .into_iter()
            .map(|item| {
                let put = aws_sdk_dynamodb::types::PutRequest::builder()
                    .set_item(Some(item))
                    .build()
                    .map_err(|e| broken("build a put", e))?;
                Ok(aws_sdk_dynamodb::types::WriteRequest::builder()
                    .put_request(put)
                    .build())
            })
            .collect::<Result<Vec<_>, PortError>>()?;
        while !puts.is_empty() {
            let rest = puts.split_off(puts.len().min(25));
            self.write_batch(puts).await?;
            puts = rest;
        }
        Ok(())
    }

    /// Up to 25 puts or deletes in one `BatchWriteItem`, retrying what DynamoDB leaves
    /// unprocessed.
    pub(super) async fn write_batch(
        &self,
        requests: Vec<aws_sdk_dynamodb::types::WriteRequest>,
    ) -> Result<(), PortError> {
        crate::sdk::retry_failed_entries("BatchWriteItem", requests, |requests| async move {
            Meter::count(&self.meter.dynamodb);
            self.meter
                .write_units
                .fetch_add(requests.len() as u64, std::sync::atomic::Ordering::Relaxed);
            let out = self
                .client
                .batch_write_item()
                .request_items(&self.table, requests)
                .send()
                .await
                .map_err(|e| map_sdk_err("BatchWriteItem", e))?;
            Ok(out
                .unprocessed_items()
                .and_then(|u| u.get(&self.table))
                .cloned()
                .unwrap_or_default())
        })
        .await
    }
}

pub(super) enum TransactFailure {
    /// The indexes of the items whose condition failed.
    Condition(Vec<usize>),
    Port(PortError),
}
