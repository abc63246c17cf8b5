//! The run item's tail (store format 3): the entries of a run's latest commits, kept in the
//! run item (`tl`, packed by `baton-codec`; `tf` its first seq) until they no longer fit,
//! then copied out to a segment of their own.
//!
//! Why: a commit that wrote its entries to a segment beside the run item had to be a
//! transaction (both items or neither), and DynamoDB bills a transaction's writes twice, a
//! kilobyte of each item two units. A commit whose entries ride in the run item is one
//! conditional `UpdateItem`, billed once — by the larger of the item before and after it.
//! So the tail grows only while that costs no more kilobytes than the step's own entries
//! would ([`plan`]); else the commit first copies the tail, as it was committed, to the
//! segment `T#<tf>` with a plain `PutItem`, then writes the run item with a tail of its own
//! entries only. A step of small entries then costs one or two units where it cost four.
//!
//! That copy is safe outside the commit because what it writes is already committed: the
//! tail read at version `v` is the same for every writer at `v`. It carries `tv` (that
//! version) and only ever replaces a copy made at an older version (a tail at a later
//! version holds everything an earlier one did, entries resolved since included), so a
//! slow writer cannot shrink a segment a newer one wrote. A copy whose commit then fails
//! (a crash, a lost race) leaves a segment at `T#<tf>` that repeats the run item's tail:
//! readers take the tail over it, and `load` does not count it.

use std::collections::HashMap;
use std::sync::Mutex;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use baton_core::error::PortError;
use baton_core::timeline::Entry;

use super::Item;
use super::items::{broken, get_n, n, s};
use super::keys::{run_pk, seg_sk};

/// The most kilobytes a run item may take with its tail: entries that would make it larger
/// go to segments, in a transaction.
pub(super) const MAX_TAIL_ITEM_KB: usize = 4;

/// The write units of an item of `bytes`, by DynamoDB's rule: one a kilobyte or part.
pub(super) fn units(bytes: usize) -> usize {
    bytes.div_ceil(1024).max(1)
}

/// A run item's tail as a read found it: at which version, from which seq, its bytes, and
/// the size of the whole item then (what an update of it is billed at, at least).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Tail {
    pub version: u64,
    pub first: u64,
    pub bytes: Vec<u8>,
    pub item_bytes: usize,
}

impl Tail {
    /// The tail of run item `item` (empty when it has none).
    pub(super) fn of(item: &Item) -> Tail {
        let bytes = match item.get("tl") {
            Some(AttributeValue::B(b)) => b.as_ref().to_vec(),
            _ => Vec::new(),
        };
        Tail {
            version: get_n(item, "v").unwrap_or(0),
            first: get_n(item, "tf").unwrap_or(0),
            bytes,
            item_bytes: super::items::item_size(item),
        }
    }

    pub(super) fn entries(&self) -> Result<Vec<Entry>, PortError> {
        if self.bytes.is_empty() {
            return Ok(Vec::new());
        }
        baton_codec::decode(&self.bytes).map_err(|e| broken("decode the run item's tail", e))
    }

    /// The segment key a copy of this tail is written at, if it holds anything.
    pub(super) fn segment_key(&self) -> Option<String> {
        (!self.bytes.is_empty()).then(|| seg_sk(self.first))
    }
}

/// The tails this store read lately, by run: what a commit at that version copies out
/// and appends to, without reading the run item again. Bounded; a miss costs one read.
#[derive(Default)]
pub(super) struct Tails(Mutex<HashMap<String, Tail>>);

/// At most this many tails are kept (each at most [`MAX_TAIL_ITEM_KB`]).
const KEPT: usize = 512;

impl Tails {
    pub(super) fn keep(&self, run_id: &str, tail: Tail) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= KEPT && !map.contains_key(run_id) {
            map.clear();
        }
        map.insert(run_id.to_owned(), tail);
    }

    /// Keeps no tail of `run_id`: its next commit reads the run item.
    pub(super) fn forget(&self, run_id: &str) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(run_id);
    }

    /// The tail read at `version`, if that is the one kept.
    pub(super) fn at(&self, run_id: &str, version: u64) -> Option<Tail> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(run_id).filter(|t| t.version == version).cloned()
    }
}

/// Where a commit's entries go.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// The committed tail, copied to its segment before the commit.
    pub copy: Option<Item>,
    /// The run item's tail after the commit: its first seq and bytes (empty: none).
    pub tail: Option<(u64, Vec<u8>)>,
    /// Appended entries too large for the tail: segments, in the commit.
    pub segments: Vec<Entry>,
    /// Entries resolved in place that are not in the new tail: patches, in the commit.
    pub patches: Vec<Entry>,
}

/// Decides a commit's writes. Its appended entries join the committed tail `old` while the
/// run item (`base` bytes without a tail) takes no more kilobytes than it took before the
/// commit or would take with the appended entries alone (an update is billed by the larger
/// of the item before and after it, so joining then costs nothing this commit and keeps
/// the next one's item no larger). Else the old tail is copied out and they start a new
/// one, or, past [`MAX_TAIL_ITEM_KB`], go to segments. An entry resolved in place is
/// changed in the tail when the tail holds it and stays; otherwise it is a patch.
pub(super) fn plan(
    run_id: &str,
    old: &Tail,
    appended: &[Entry],
    updated: &[Entry],
    base: usize,
) -> Result<Plan, PortError> {
    let encode = |entries: &[Entry]| {
        baton_codec::encode(entries).map_err(|e| broken("encode the run item's tail", e))
    };
    // `tl` and `tf` themselves: names, the first seq as a number.
    let with = |tail: usize| base + 4 + 11 + tail;
    let fits = |tail: usize| units(with(tail)) <= MAX_TAIL_ITEM_KB;
    let mut kept = old.entries()?;
    let mut joined = kept.clone();
    let mut outside = Vec::new();
    for e in updated {
        match joined.iter().position(|t| t.seq == e.seq) {
            Some(i) => joined[i] = e.clone(),
            None => outside.push(e.clone()),
        }
    }
    joined.extend_from_slice(appended);
    if joined.is_empty() {
        return Ok(Plan {
            patches: outside,
            ..Plan::default()
        });
    }
    let bytes = encode(&joined)?;
    let alone = if appended.is_empty() {
        Vec::new()
    } else {
        encode(appended)?
    };
    let allowed = units(old.item_bytes).max(units(with(alone.len())));
    if fits(bytes.len()) && (kept.is_empty() || units(with(bytes.len())) <= allowed) {
        return Ok(Plan {
            tail: Some((joined[0].seq, bytes)),
            patches: outside,
            ..Plan::default()
        });
    }
    // A commit that resolves entries of the tail (a reply's calls, committed due with it)
    // splits it at the first of them: what comes before is copied out as committed, and the
    // rest, resolved, starts the new tail with the appended entries. No patch, so no
    // transaction: a loop of calls that ride in the next commit writes the run item alone.
    if let Some(split) = kept
        .iter()
        .position(|e| updated.iter().any(|u| u.seq == e.seq))
        .filter(|&i| i > 0)
    {
        let rest = encode(&joined[split..])?;
        if fits(rest.len()) {
            let prefix = &kept[..split];
            return Ok(Plan {
                copy: Some(copy_item(run_id, old, &encode(prefix)?, prefix.len())),
                tail: Some((joined[split].seq, rest)),
                patches: outside,
                ..Plan::default()
            });
        }
    }
    // The tail as committed is copied out; what this commit resolved in it is a patch over
    // the copy.
    let mut plan = Plan::default();
    if !kept.is_empty() {
        plan.copy = Some(copy_item(run_id, old, &old.bytes, kept.len()));
        plan.patches = updated.to_vec();
    } else {
        plan.patches = outside;
    }
    kept.clear();
    if !appended.is_empty() {
        if fits(alone.len()) {
            plan.tail = Some((appended[0].seq, alone));
        } else {
            plan.segments = appended.to_vec();
        }
    }
    Ok(plan)
}

/// The segment a committed tail (or its first `entries`, packed as `bytes`) is copied to:
/// `T#<tf>`, with the version it was read at.
fn copy_item(run_id: &str, tail: &Tail, bytes: &[u8], entries: usize) -> Item {
    Item::from([
        ("PK".into(), s(run_pk(run_id))),
        ("SK".into(), s(seg_sk(tail.first))),
        ("n".into(), n(entries)),
        ("tv".into(), n(tail.version)),
        ("b".into(), AttributeValue::B(Blob::new(bytes.to_vec()))),
    ])
}

/// The condition of a tail's copy: it replaces no copy made at a later version.
pub(super) const COPY_CONDITION: &str = "attribute_not_exists(PK) OR tv < :tv";

#[cfg(test)]
mod tests {
    use super::super::tests::noise;
    use super::*;
    use baton_core::timeline::EntryBody;

    fn entry(seq: u64, text: &str) -> Entry {
        Entry {
            seq,
            at: chrono::DateTime::from_timestamp(0, 0).unwrap_or_default(),
            body: EntryBody::user(text),
        }
    }

    /// The tail of a run item of `base` bytes besides it, at `version`.
    fn tail(version: u64, base: usize, entries: &[Entry]) -> Tail {
        let bytes = if entries.is_empty() {
            Vec::new()
        } else {
            baton_codec::encode(entries).expect("encodes")
        };
        Tail {
            version,
            first: entries.first().map_or(0, |e| e.seq),
            item_bytes: base + bytes.len(),
            bytes,
        }
    }

    fn decoded(plan: &Plan) -> Vec<Entry> {
        plan.tail
            .as_ref()
            .map(|(_, b)| baton_codec::decode(b).expect("decodes"))
            .unwrap_or_default()
    }

    #[test]
    fn entries_join_the_tail_while_the_run_items_kilobytes_stay_the_same() {
        let old = tail(3, 500, &[entry(4, "a"), entry(5, "b")]);
        let plan = plan("r", &old, &[entry(6, "c")], &[], 500).expect("plans");
        assert!(plan.copy.is_none() && plan.segments.is_empty() && plan.patches.is_empty());
        assert_eq!(plan.tail.as_ref().map(|t| t.0), Some(4));
        assert_eq!(
            decoded(&plan),
            vec![entry(4, "a"), entry(5, "b"), entry(6, "c")]
        );
        // Entries that would take the item into its next kilobyte, where they alone would
        // not: the tail is copied out instead (an update is billed by the larger of the
        // item before and after, so a grown item costs every commit until its copy).
        let (a, b) = (noise(1, 300), noise(2, 300));
        let old = tail(3, 600, &[entry(4, &a)]);
        assert!(units(old.item_bytes) == 1);
        let copied = super::plan("r", &old, &[entry(5, &b)], &[], 600).expect("plans");
        assert!(copied.copy.is_some(), "copied out");
        assert_eq!(decoded(&copied), vec![entry(5, &b)]);
        // An item that took two kilobytes already takes the entries at no cost.
        let old = tail(3, 1300, &[entry(4, &a)]);
        let joined = super::plan("r", &old, &[entry(5, &b)], &[], 1300).expect("plans");
        assert!(joined.copy.is_none(), "joined");
        assert_eq!(decoded(&joined), vec![entry(4, &a), entry(5, &b)]);
    }

    #[test]
    fn a_full_tail_is_copied_out_as_committed_and_the_new_entries_start_another() {
        let (a, b, c) = (noise(1, 200), noise(2, 200), noise(3, 300));
        let old = tail(7, 1500, &[entry(4, &a), entry(5, &b)]);
        // What this commit resolves in the old tail is a patch over its copy, not a
        // change to what the copy writes (that is committed already), when the tail cannot
        // be split there (what follows, resolved, would not fit a run item).
        let mut resolved = entry(5, &b);
        resolved.body = EntryBody::Notice {
            code: "resolved".into(),
            message: noise(5, 4000),
        };
        let plan = plan(
            "r",
            &old,
            &[entry(6, &c)],
            std::slice::from_ref(&resolved),
            1500,
        )
        .expect("plans");
        let copy = plan.copy.as_ref().expect("copied");
        assert_eq!(copy.get("SK"), Some(&s("T#0000000004")));
        assert_eq!(get_n(copy, "tv"), Some(7));
        assert_eq!(get_n(copy, "n"), Some(2));
        let copied: Vec<Entry> = match copy.get("b") {
            Some(AttributeValue::B(b)) => baton_codec::decode(b.as_ref()).expect("decodes"),
            _ => panic!("no bytes"),
        };
        assert_eq!(copied, vec![entry(4, &a), entry(5, &b)]);
        assert_eq!(plan.patches, vec![resolved]);
        assert_eq!(decoded(&plan), vec![entry(6, &c)]);
    }

    #[test]
    fn a_full_tail_whose_entry_is_resolved_is_split_there_with_no_patch() {
        let (a, b, c, d) = (noise(1, 400), noise(2, 900), noise(3, 400), noise(4, 900));
        // A reply (4) and its call (5), committed due; this commit resolves the call and
        // appends the next reply (6) and call (7).
        let old = tail(7, 1500, &[entry(4, &a), entry(5, &b)]);
        let resolved = entry(5, &format!("{b} done"));
        let plan = plan(
            "r",
            &old,
            &[entry(6, &c), entry(7, &d)],
            std::slice::from_ref(&resolved),
            1500,
        )
        .expect("plans");
        let copy = plan.copy.as_ref().expect("the reply copied out");
        assert_eq!(copy.get("SK"), Some(&s("T#0000000004")));
        assert_eq!((get_n(copy, "tv"), get_n(copy, "n")), (Some(7), Some(1)));
        let copied: Vec<Entry> = match copy.get("b") {
            Some(AttributeValue::B(b)) => baton_codec::decode(b.as_ref()).expect("decodes"),
            _ => panic!("no bytes"),
        };
        assert_eq!(copied, vec![entry(4, &a)], "as committed");
        assert!(plan.patches.is_empty() && plan.segments.is_empty());
        assert_eq!(plan.tail.as_ref().map(|t| t.0), Some(5));
        assert_eq!(
            decoded(&plan),
            vec![resolved, entry(6, &c), entry(7, &d)],
            "the resolved call starts the new tail"
        );
    }

    #[test]
    fn an_entry_resolved_in_the_tail_is_changed_there_and_one_outside_is_a_patch() {
        let old = tail(2, 300, &[entry(4, "a")]);
        let plan = plan("r", &old, &[], &[entry(4, "a2"), entry(1, "z")], 300).expect("plans");
        assert_eq!(decoded(&plan), vec![entry(4, "a2")]);
        assert_eq!(plan.patches, vec![entry(1, "z")]);
    }

    #[test]
    fn entries_too_large_for_any_tail_go_to_segments() {
        let old = tail(2, 900, &[]);
        let big = entry(1, &noise(3, 5000));
        let plan = plan("r", &old, std::slice::from_ref(&big), &[], 900).expect("plans");
        assert!(plan.tail.is_none() && plan.copy.is_none());
        assert_eq!(plan.segments, vec![big]);
    }

    #[test]
    fn the_tails_kept_are_bounded_and_read_only_at_their_version() {
        let tails = Tails::default();
        tails.keep("a", tail(3, 500, &[entry(1, "x")]));
        assert!(tails.at("a", 3).is_some());
        assert!(tails.at("a", 4).is_none());
        for i in 0..KEPT + 1 {
            tails.keep(&format!("r{i}"), Tail::default());
        }
        assert!(tails.0.lock().expect("lock").len() <= KEPT);
    }
}
