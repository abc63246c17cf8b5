//! Reading a run's timeline items: a step's window, a page, the first item. Each query
//! asks for pages of a few items where it stops early (DynamoDB bills a page for every item
//! it reads, up to 1 MB).

use super::items::*;
use super::keys::*;
use super::*;

impl DynamoStore {
    /// [`RunReads::load`]: the run item with a strongly consistent read, the timeline with an
    /// eventually consistent one (half the read units). Timeline items are written once (a copy of
    /// the tail grows until the tail moves on) and the run item counts them (`ni`), so a
    /// stale read shows as a short count or a gap in the seqs: then the timeline is read
    /// again, consistently.
    pub(super) async fn load_timeline(
        &self,
        run_id: &str,
    ) -> Result<Option<(RunRecord, Vec<Entry>)>, PortError> {
        let Some(meta) = self.step_run_item(run_id).await? else {
            return Ok(None);
        };
        let rec = parse_run(&meta)?;
        let tail = tail::Tail::of(&meta);
        let (copy, tail_entries) = (tail.segment_key(), tail.entries()?);
        let expected = get_n(&meta, "ni");
        let counted = |items: &[Item]| {
            items
                .iter()
                .filter(|i| get_s(i, "SK").ok() != copy.as_deref())
                .count() as u64
        };
        let pk = run_pk(run_id);
        let items = self.query(&pk, "P#", "T#~", true, false, |_| true).await?;
        if Some(counted(&items)) == expected {
            let entries = assemble(&items, &tail_entries, rec.run.next_seq)?;
            if whole(&entries, rec.run.next_seq) {
                return Ok(Some((rec, entries)));
            }
        }
        let items = self.query(&pk, "P#", "T#~", true, true, |_| true).await?;
        let entries = assemble(&items, &tail_entries, rec.run.next_seq)?;
        Ok(Some((rec, entries)))
    }

    /// [`RunReads::entries_after`]: up to `limit` entries after seq `after`.
    pub(super) async fn page_after(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Entry>, PortError> {
        let Some(from) = after.map_or(Some(0), |a| a.checked_add(1)) else {
            return Ok(Vec::new()); // past every seq
        };
        // The run item first: entries a later commit appends are past its `next_seq`.
        let Some(meta) = self.get_run_item(run_id).await? else {
            return Ok(Vec::new());
        };
        let rec = parse_run(&meta)?;
        if limit == 0 || from >= rec.run.next_seq {
            return Ok(Vec::new());
        }
        let tail = tail::Tail::of(&meta);
        let tail_entries = tail.entries()?;
        let items = if !tail_entries.is_empty() && from >= tail.first {
            Vec::new() // all of it in the run item's tail
        } else {
            self.page_items(run_id, from, limit).await?
        };
        let mut entries = assemble(&items, &tail_entries, rec.run.next_seq)?;
        entries.retain(|e| e.seq >= from);
        entries.truncate(limit);
        Ok(entries)
    }

    /// The entries from seq `from` on of the run whose item (read just before, strongly) is
    /// `meta`: from its tail alone when the tail reaches back to `from`, else with
    /// [`Self::window_items`].
    pub(super) async fn window_after(
        &self,
        run_id: &str,
        meta: &Item,
        from: u64,
        next_seq: u64,
    ) -> Result<Vec<Entry>, PortError> {
        let tail = super::tail::Tail::of(meta);
        let tail_entries = tail.entries()?;
        let items = if !tail_entries.is_empty() && from >= tail.first {
            Vec::new()
        } else {
            self.window_items(run_id, from).await?
        };
        let mut entries = assemble(&items, &tail_entries, next_seq)?;
        entries.retain(|e| e.seq >= from);
        Ok(entries)
    }

    /// The timeline items that hold the entries from seq `from` on, read strongly: the
    /// segments back to the one that holds `from` (newest first, stopping there), and the
    /// patches from `from` on. Bounded by what is after `from`, not by the run's length.
    pub(super) async fn window_items(
        &self,
        run_id: &str,
        from: u64,
    ) -> Result<Vec<Item>, PortError> {
        let pk = run_pk(run_id);
        let mut items = Vec::new();
        // Newest first, until the segment that holds `from`: a window is a few segments.
        self.query_until(&pk, ("T#", "T#~"), false, 4, |item| {
            let more = match get_s(&item, "SK") {
                Ok(sk) => sk
                    .get(2..)
                    .and_then(|d| d.parse::<u64>().ok())
                    .is_none_or(|first| first > from),
                Err(_) => false,
            };
            items.push(item);
            Ok(more)
        })
        .await?;
        items.extend(
            self.query(&pk, &patch_sk(from), "P#~", true, true, |_| true)
                .await?,
        );
        Ok(items)
    }

    /// The timeline items that hold `limit` entries from seq `from` on, read strongly and
    /// in order: the segment that holds `from` (found with a one-item query), the segments
    /// after it until `limit` entries are covered, and the patches among them. Bounded by
    /// `limit`, wherever `from` is in the run.
    pub(super) async fn page_items(
        &self,
        run_id: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Item>, PortError> {
        let pk = run_pk(run_id);
        let holding = self
            .first_item(&pk, "T#", &seg_sk(from), false)
            .await?
            .and_then(|item| {
                get_s(&item, "SK")
                    .ok()
                    .map(|sk| sk.chars().take(12).collect::<String>())
            });
        let start = holding.unwrap_or_else(|| "T#".into());
        let (mut covered, mut parts_left, mut last) = (0u64, 0u64, from);
        let mut items = Vec::new();
        self.query_until(&pk, (&start, "T#~"), true, 10, |item| {
            let sk = get_s(&item, "SK")?;
            if sk.len() == 12 {
                // A segment's first (or only) item: `n` entries from its first seq.
                let first: u64 = sk[2..]
                    .parse()
                    .map_err(|e| broken("parse a segment's key", e))?;
                let n = get_n(&item, "n").unwrap_or(1).max(1);
                parts_left = get_n(&item, "parts").unwrap_or(1).saturating_sub(1);
                last = first + n - 1;
                covered = (last + 1).saturating_sub(from);
            } else {
                parts_left = parts_left.saturating_sub(1);
            }
            items.push(item);
            Ok(parts_left > 0 || covered < limit as u64)
        })
        .await?;
        items.extend(
            self.query(&pk, &patch_sk(from), &patch_sk(last), true, true, |_| true)
                .await?,
        );
        Ok(items)
    }

    /// The first item of a partition with SK in [lo, hi], in the order asked: one item read.
    pub(super) async fn first_item(
        &self,
        pk: &str,
        lo: &str,
        hi: &str,
        forward: bool,
    ) -> Result<Option<Item>, PortError> {
        let out = self
            .range(pk, lo, hi)
            .consistent_read(true)
            .scan_index_forward(forward)
            .limit(1)
            .send()
            .await
            .map_err(|e| map_sdk_err("Query", e))?;
        self.count_read(out.items().iter().map(item_size).sum(), true);
        Ok(out.items.unwrap_or_default().into_iter().next())
    }
}
