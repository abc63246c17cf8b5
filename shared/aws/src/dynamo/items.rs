//! The table's items: keys, how runs, timeline segments, patches and CTAs become items and
//! come back, and an item's size by DynamoDB's rules. No requests here.

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use baton_core::cta::Cta;
use baton_core::error::PortError;
use baton_core::message::{Effect, outbox_continues};
use baton_core::ports::RunRecord;
use baton_core::run::Run;
use baton_core::timeline::Entry;

use super::keys::*;
use super::{DynamoStore, Item, MAX_BLOB};

pub(super) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}
pub(super) fn n(v: impl std::fmt::Display) -> AttributeValue {
    AttributeValue::N(v.to_string())
}
pub(super) fn broken(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> PortError {
    PortError::broken(format!("DynamoDB item: {what}: {e}"), e)
}

pub(super) fn get_s<'a>(item: &'a Item, k: &str) -> Result<&'a str, PortError> {
    match item.get(k) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(PortError::Broken {
            message: format!("DynamoDB item lacks string attribute `{k}`"),
            source: None,
        }),
    }
}

/// A number attribute, when the item has it and it parses.
pub(super) fn get_n(item: &Item, k: &str) -> Option<u64> {
    match item.get(k) {
        Some(AttributeValue::N(v)) => v.parse().ok(),
        _ => None,
    }
}

pub(super) fn get_b<'a>(item: &'a Item, k: &str) -> Result<&'a [u8], PortError> {
    match item.get(k) {
        Some(AttributeValue::B(v)) => Ok(v.as_ref()),
        _ => Err(PortError::Broken {
            message: format!("DynamoDB item lacks binary attribute `{k}`"),
            source: None,
        }),
    }
}

/// An item's size by DynamoDB's rules: attribute names plus values.
pub fn item_size(item: &Item) -> usize {
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) => s.len(),
            AttributeValue::N(x) => x.len().div_ceil(2) + 1,
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
            AttributeValue::M(m) => 3 + m.iter().map(|(k, v)| k.len() + value(v)).sum::<usize>(),
            AttributeValue::L(l) => 3 + l.iter().map(value).sum::<usize>(),
            _ => 0,
        }
    }
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

impl DynamoStore {
    pub(super) fn run_item(
        &self,
        run: &Run,
        outbox: &[Effect],
        timeline_items: usize,
    ) -> Result<Item, PortError> {
        let mut item = Item::from([
            ("PK".into(), s(run_pk(&run.run_id))),
            ("SK".into(), s("META")),
            ("v".into(), n(run.version)),
            ("own".into(), s(&run.owner)),
            ("st".into(), s(run.status.as_str())),
            ("body".into(), packed(&lean(run), "run")?),
        ]);
        if !outbox.is_empty() {
            item.insert("ob".into(), packed(outbox, "outbox")?);
            // A parking outbox is indexed until it is cleared, for the sweep (GSI2).
            if !outbox_continues(&run.run_id, outbox) {
                item.insert("GSI2PK".into(), s(self.sweep_pk(&run.run_id)));
                item.insert("GSI2SK".into(), s(sweep_sk(run.updated_at, &run.run_id)));
            }
        }
        if run.status.is_terminal() {
            // The sweep purges the whole run (timeline items too) once the retention period
            // is over; the run item's TTL, a week later, is only the backstop.
            item.insert(
                "ttl".into(),
                n((run.updated_at + self.retention + TTL_BACKSTOP).timestamp()),
            );
            item.insert(
                "GSI3PK".into(),
                s(format!("FIN#{}", shard(&run.run_id, self.sweep_shards))),
            );
            item.insert("GSI3SK".into(), s(sweep_sk(run.updated_at, &run.run_id)));
        } else if let Some(soonest) = run.clock.timers.values().min() {
            // A run with timers armed is indexed by its soonest, for the sweep, which fires
            // one whose schedule was lost (GSI3 too: a run is in one of the two at most).
            item.insert(
                "GSI3PK".into(),
                s(format!("TMR#{}", shard(&run.run_id, self.sweep_shards))),
            );
            item.insert("GSI3SK".into(), s(sweep_sk(*soonest, &run.run_id)));
        }
        item.insert("ni".into(), n(timeline_items));
        Ok(item)
    }

    /// What is written once with a run, in an item of its own (`INFO`): its `metadata` and
    /// `context`, which the run item, rewritten at every commit and billed whole for it,
    /// goes without (up to 4 KB + 16 KB less per step); for a top-level run, its place in
    /// its owner's list of runs (GSI1, `RUN#<createdAt>#<runId>`, beside the owner's CTAs);
    /// for a subagent, its place among the runs under its top-level run (GSI4, beside their
    /// CTAs), which a run's tree reads.
    pub(super) fn info_item(&self, run: &Run) -> Result<Item, PortError> {
        let mut item = Item::from([
            ("PK".into(), s(run_pk(&run.run_id))),
            ("SK".into(), s(INFO_SK)),
        ]);
        let sk = run_gsi_sk(run.created_at, &run.run_id);
        match (&run.origin.parent, &run.origin.root_run_id) {
            (None, _) => {
                item.insert("GSI1PK".into(), s(owner_pk(&run.owner)));
                item.insert("GSI1SK".into(), s(sk));
            }
            (Some(_), Some(root)) => {
                item.insert("GSI4PK".into(), s(cta_root_pk(root)));
                item.insert("GSI4SK".into(), s(sk));
            }
            (Some(_), None) => {}
        }
        for (k, v) in [("md", &run.origin.metadata), ("cx", &run.origin.context)] {
            if let Some(v) = v {
                item.insert(
                    k.into(),
                    s(serde_json::to_string(v).map_err(|e| broken("encode run info", e))?),
                );
            }
        }
        Ok(item)
    }

    /// The commit's write of the run item `item` ([`Self::run_item`], with its tail): every
    /// attribute set afresh, the outbox, TTL and tail removed when absent, the timeline item
    /// count raised by the item's `ni`, all conditional on the version.
    pub(super) fn run_update(
        &self,
        item: Item,
        expected: u64,
        release_slot: bool,
        take_slot: bool,
    ) -> Result<Update, PortError> {
        let run_pk = match item.get("PK") {
            Some(AttributeValue::S(pk)) => pk.clone(),
            _ => return Err(broken("run item", std::io::Error::other("no key"))),
        };
        let mut sets = Vec::new();
        let mut removes = Vec::new();
        let mut update = aws_sdk_dynamodb::types::Update::builder()
            .table_name(&self.table)
            .key("PK", s(run_pk))
            .key("SK", s("META"))
            .condition_expression("v = :ev")
            .expression_attribute_values(":ev", n(expected));
        for (k, v) in item {
            match k.as_str() {
                "PK" | "SK" => {}
                "ni" => update = update.expression_attribute_values(":ni", v),
                _ => {
                    sets.push(format!("#{k} = :{k}"));
                    update = update
                        .expression_attribute_names(format!("#{k}"), &k)
                        .expression_attribute_values(format!(":{k}"), v);
                }
            }
        }
        for k in [
            "ob", "lerr", "tc", "tcat", "ttl", "GSI2PK", "GSI2SK", "GSI3PK", "GSI3SK", "tl", "tf",
        ] {
            if !sets.iter().any(|x| x.starts_with(&format!("#{k} "))) {
                removes.push(format!("#{k}"));
                update = update.expression_attribute_names(format!("#{k}"), k);
            }
        }
        if release_slot {
            removes.push("#slot".into());
            update = update.expression_attribute_names("#slot", "slot");
        } else if take_slot {
            sets.push("#slot = :slot".into());
            update = update
                .expression_attribute_names("#slot", "slot")
                .expression_attribute_values(":slot", n(1));
        }
        let mut expr = format!("SET {}", sets.join(", "));
        if !removes.is_empty() {
            expr.push_str(&format!(" REMOVE {}", removes.join(", ")));
        }
        expr.push_str(" ADD ni :ni");
        update
            .update_expression(expr)
            .build()
            .map_err(|e| broken("build update", e))
    }

    /// The segment items for entries appended by one commit: one item, or several when they
    /// would not fit DynamoDB's 400 KB item limit together.
    pub(super) fn segment_items(
        &self,
        run_id: &str,
        entries: &[Entry],
    ) -> Result<Vec<Item>, PortError> {
        let blob = baton_codec::encode(entries).map_err(|e| broken("encode entries", e))?;
        if blob.len() > MAX_BLOB {
            if entries.len() == 1 {
                // One entry larger than an item (a long final answer): its bytes go in
                // parts, `T#<seq>` (which says how many) then `T#<seq>#<i:03>`.
                let base = seg_sk(entries[0].seq);
                let chunks: Vec<&[u8]> = blob.chunks(MAX_BLOB).collect();
                return Ok(chunks
                    .iter()
                    .enumerate()
                    .map(|(i, part)| {
                        let mut item = Item::from([
                            ("PK".into(), s(run_pk(run_id))),
                            ("b".into(), AttributeValue::B(Blob::new(part.to_vec()))),
                        ]);
                        if i == 0 {
                            item.insert("SK".into(), s(&base));
                            item.insert("n".into(), n(1));
                            item.insert("parts".into(), n(chunks.len()));
                        } else {
                            item.insert("SK".into(), s(format!("{base}#{i:03}")));
                        }
                        item
                    })
                    .collect());
            }
            let (a, b) = entries.split_at(entries.len() / 2);
            let mut items = self.segment_items(run_id, a)?;
            items.extend(self.segment_items(run_id, b)?);
            return Ok(items);
        }
        Ok(vec![Item::from([
            ("PK".into(), s(run_pk(run_id))),
            ("SK".into(), s(seg_sk(entries[0].seq))),
            ("n".into(), n(entries.len())),
            ("b".into(), AttributeValue::B(Blob::new(blob))),
        ])])
    }

    pub(super) fn patch_item(&self, run_id: &str, e: &Entry) -> Result<Item, PortError> {
        let blob = baton_codec::encode(e).map_err(|e| broken("encode entry", e))?;
        Ok(Item::from([
            ("PK".into(), s(run_pk(run_id))),
            ("SK".into(), s(patch_sk(e.seq))),
            ("b".into(), AttributeValue::B(Blob::new(blob))),
        ]))
    }

    pub(super) fn cta_item(&self, c: &Cta) -> Result<Item, PortError> {
        let sk = cta_gsi_sk(c.status, c.created_at, &c.cta_id);
        let mut item = Item::from([
            ("PK".into(), s(cta_pk(&c.cta_id))),
            ("SK".into(), s("META")),
            ("st".into(), s(c.status.as_str())),
            ("own".into(), s(&c.owner)),
            (
                "body".into(),
                s(serde_json::to_string(c).map_err(|e| broken("encode CTA", e))?),
            ),
            ("GSI1PK".into(), s(owner_pk(&c.owner))),
            ("GSI1SK".into(), s(&sk)),
            (
                "GSI4PK".into(),
                s(cta_root_pk(c.root_run_id.as_deref().unwrap_or(&c.run_id))),
            ),
            ("GSI4SK".into(), s(sk)),
            // What a change is written conditionally on (`change_cta`).
            ("rev".into(), n(c.rev)),
        ]);
        if let Some(at) = c.resolved_at {
            item.insert("ttl".into(), n((at + self.retention).timestamp()));
        }
        if c.status == baton_core::cta::CtaStatus::Pending {
            // Indexed by its expiry while pending: the sweep expires it should its timer
            // be lost. Settling it writes the item anew, without these.
            item.insert("GSI2PK".into(), s(self.due_pk(&c.cta_id)));
            item.insert("GSI2SK".into(), s(sweep_sk(c.expires_at, &c.cta_id)));
        }
        Ok(item)
    }

    /// The pointer that files `c` in the inbox of `principal`: keyed by the CTA, listed in
    /// GSI1 as the owner's CTAs are (by status, then age), kept as long as the CTA may be.
    pub(super) fn assignment_item(&self, principal: &str, c: &Cta) -> Item {
        let pk = assignee_pk(principal);
        Item::from([
            ("PK".into(), s(&pk)),
            ("SK".into(), s(cta_pk(&c.cta_id))),
            ("GSI1PK".into(), s(pk)),
            (
                "GSI1SK".into(),
                s(cta_gsi_sk(c.status, c.created_at, &c.cta_id)),
            ),
            ("cta".into(), s(&c.cta_id)),
            ("ttl".into(), n((c.expires_at + self.retention).timestamp())),
        ])
    }

    /// Adds `by` to the active-run slots `owner` holds: with `limit`, only while fewer
    /// than `limit` are held (a conditional write: concurrent takes cannot pass it).
    pub(super) fn slot_count(
        &self,
        owner: &str,
        by: i64,
        limit: Option<u32>,
    ) -> Result<TransactWriteItem, PortError> {
        let mut u = Update::builder()
            .table_name(&self.table)
            .key("PK", s(quota_pk(owner)))
            .key("SK", s("META"))
            .update_expression("ADD active :by")
            .expression_attribute_values(":by", n(by));
        if let Some(limit) = limit {
            u = u
                .condition_expression("attribute_not_exists(active) OR active < :max")
                .expression_attribute_values(":max", n(limit));
        }
        let update = u.build().map_err(|e| broken("build update", e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Adds `usd`, which `run_id` spent, to what `owner`'s runs spent on `day` (its shard;
    /// kept two days past it).
    pub(super) fn spend_add(
        &self,
        owner: &str,
        day: chrono::NaiveDate,
        usd: f64,
        run_id: &str,
    ) -> Result<TransactWriteItem, PortError> {
        let expires = day
            .and_hms_opt(0, 0, 0)
            .map_or(0, |t| t.and_utc().timestamp() + 3 * 86_400);
        let update = Update::builder()
            .table_name(&self.table)
            .key("PK", s(spend_pk(owner, day)))
            .key("SK", s(counter_sk("S", run_id)))
            .update_expression("ADD usd :usd SET #ttl = :ttl")
            .expression_attribute_names("#ttl", "ttl")
            .expression_attribute_values(":usd", n(usd))
            .expression_attribute_values(":ttl", n(expires))
            .build()
            .map_err(|e| broken("build update", e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    pub(super) fn put(
        &self,
        item: Item,
        condition: Option<&str>,
    ) -> Result<TransactWriteItem, PortError> {
        let mut p = Put::builder().table_name(&self.table).set_item(Some(item));
        if let Some(c) = condition {
            p = p.condition_expression(c);
        }
        let put = p.build().map_err(|e| broken("build put", e))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }
}

/// The run item's `SK`; its `INFO` item sorts just before it, so that one query of
/// [`INFO_SK`, `META`] reads both.
pub(super) const INFO_SK: &str = "INFO";

/// The `SK` of a run's watch lease (`wu`: until when, unix ms), between `INFO` and `META`:
/// the query that reads the run reads it too.
pub(super) const LIVE_SK: &str = "LIVE";

/// The run as the run item keeps it: without `metadata` and `context`, which are in its
/// `INFO` item.
/// The run as its item keeps it: without `metadata` and `context` (the `INFO` item's).
fn lean(run: &Run) -> std::borrow::Cow<'_, Run> {
    if run.origin.metadata.is_none() && run.origin.context.is_none() {
        return std::borrow::Cow::Borrowed(run);
    }
    let mut lean = run.clone();
    lean.origin.metadata = None;
    lean.origin.context = None;
    std::borrow::Cow::Owned(lean)
}

/// A run item's body or outbox as written since store format 2: bytes, packed by
/// `baton-codec` (deflated when that is smaller). The item is rewritten at every commit and
/// billed by the kilobyte, twice in a transaction: a run's 0.7 to 3 KB of JSON deflates to
/// about half.
pub(super) fn packed<T: serde::Serialize + ?Sized>(
    v: &T,
    what: &str,
) -> Result<AttributeValue, PortError> {
    let bytes = baton_codec::encode(v).map_err(|e| broken(&format!("encode {what}"), e))?;
    Ok(AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(
        bytes,
    )))
}

/// Reads what [`packed`] wrote, or the JSON string format 1 wrote.
fn unpacked<T: serde::de::DeserializeOwned>(
    v: &AttributeValue,
    what: &str,
) -> Result<T, PortError> {
    match v {
        AttributeValue::B(b) => {
            baton_codec::decode(b.as_ref()).map_err(|e| broken(&format!("decode {what}"), e))
        }
        AttributeValue::S(json) => {
            serde_json::from_str(json).map_err(|e| broken(&format!("decode {what}"), e))
        }
        _ => Err(broken(
            what,
            std::io::Error::other("neither bytes nor a string"),
        )),
    }
}

/// A run item, with its `INFO` item's attributes (`md`, `cx`) merged in when it has one.
pub(super) fn parse_run(item: &Item) -> Result<RunRecord, PortError> {
    let body = item
        .get("body")
        .ok_or_else(|| broken("run item", std::io::Error::other("no body")))?;
    let mut run: Run = unpacked(body, "run")?;
    for (k, field) in [
        ("md", &mut run.origin.metadata),
        ("cx", &mut run.origin.context),
    ] {
        if let Some(AttributeValue::S(v)) = item.get(k) {
            *field = Some(serde_json::from_str(v).map_err(|e| broken("decode run info", e))?);
        }
    }
    if let Some(AttributeValue::N(wu)) = item.get("wu") {
        run.watched_until = wu.parse().ok();
    }
    run.active_slot = item.contains_key("slot");
    if let Some(AttributeValue::S(f)) = item.get("lerr") {
        run.outcome.last_error =
            Some(serde_json::from_str(f).map_err(|e| broken("decode failure", e))?);
    }
    let outbox = match item.get("ob") {
        Some(o) => unpacked(o, "outbox")?,
        None => Vec::new(),
    };
    Ok(RunRecord { run, outbox })
}

pub(super) fn parse_cta(item: &Item) -> Result<Cta, PortError> {
    serde_json::from_str(get_s(item, "body")?).map_err(|e| broken("decode CTA", e))
}

/// Segments (and patches over them) into entries, in seq order, with the run item's
/// `tail` (the newest entries, which a segment may repeat: a copy of the tail whose commit
/// did not happen) taken over any segment's.
pub(super) fn assemble(
    items: &[Item],
    tail: &[Entry],
    next_seq: u64,
) -> Result<Vec<Entry>, PortError> {
    let mut entries = std::collections::BTreeMap::new();
    let mut patches = Vec::new();
    // Segments stored in parts, by their first item's key: (part index, bytes).
    let mut parted: std::collections::BTreeMap<&str, Vec<(usize, &[u8])>> = Default::default();
    for item in items {
        let sk = get_s(item, "SK")?;
        if let Some(rest) = sk.strip_prefix("T#") {
            if let Some((_, i)) = rest.split_once('#') {
                let i = i
                    .parse()
                    .map_err(|e| broken("parse a segment part's key", e))?;
                parted
                    .entry(&sk[..sk.len() - 4])
                    .or_default()
                    .push((i, get_b(item, "b")?));
            } else if item.contains_key("parts") {
                parted.entry(sk).or_default().push((0, get_b(item, "b")?));
            } else {
                let seg: Vec<Entry> = baton_codec::decode(get_b(item, "b")?)
                    .map_err(|e| broken("decode segment", e))?;
                entries.extend(seg.into_iter().map(|e| (e.seq, e)));
            }
        } else if sk.starts_with("P#") {
            patches.push(
                baton_codec::decode::<Entry>(get_b(item, "b")?)
                    .map_err(|e| broken("decode patch", e))?,
            );
        }
    }
    for (_, mut parts) in parted {
        parts.sort_by_key(|(i, _)| *i);
        let blob: Vec<u8> = parts
            .into_iter()
            .flat_map(|(_, b)| b.iter().copied())
            .collect();
        let seg: Vec<Entry> =
            baton_codec::decode(&blob).map_err(|e| broken("decode a segment in parts", e))?;
        entries.extend(seg.into_iter().map(|e| (e.seq, e)));
    }
    for p in patches {
        if let Some(slot) = entries.get_mut(&p.seq) {
            *slot = p;
        }
    }
    entries.extend(tail.iter().map(|e| (e.seq, e.clone())));
    Ok(entries
        .into_values()
        .take_while(|e| e.seq < next_seq)
        .collect())
}

/// Whether `entries` run without a gap to the last seq before `next_seq`.
pub(super) fn whole(entries: &[Entry], next_seq: u64) -> bool {
    entries.windows(2).all(|w| w[1].seq == w[0].seq + 1)
        && entries
            .last()
            .map_or(next_seq == 0, |e| e.seq + 1 == next_seq)
}
