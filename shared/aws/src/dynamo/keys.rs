//! The table's keys: each item's partition and sort keys, the indexes' keys, and the shards
//! of the sweep's indexes and of the counters many runs add to.

use baton_core::cta::CtaStatus;
use chrono::{DateTime, Utc};

use super::DynamoStore;

pub(super) fn run_pk(id: &str) -> String {
    format!("RUN#{id}")
}
pub(super) fn cta_pk(id: &str) -> String {
    format!("CTA#{id}")
}
pub(super) fn seg_sk(first: u64) -> String {
    format!("T#{first:010}")
}
pub use crate::settings::{MAX_SWEEP_SHARDS, SWEEP_SHARDS};
/// The sweep shard of `id` among `shards`.
pub(super) fn shard(id: &str, shards: u32) -> u32 {
    let h = id
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    h % shards.max(1)
}

impl DynamoStore {
    /// The sweep index's partition for a run whose outbox waits (GSI2).
    pub(super) fn sweep_pk(&self, run_id: &str) -> String {
        format!("OB#{}", shard(run_id, self.sweep_shards))
    }
    /// The sweep index's partition for a pending CTA, by its expiry (GSI2 too).
    pub(super) fn due_pk(&self, cta_id: &str) -> String {
        format!("DUE#{}", shard(cta_id, self.sweep_shards))
    }
    /// The sweep index's partition for a CTA whose resolution is outstanding (GSI2 too).
    pub(super) fn resolution_pk(&self, cta_id: &str) -> String {
        format!("CR#{}", shard(cta_id, self.sweep_shards))
    }
}
/// How long after the retention period the run item's own TTL fires, should the sweep not.
pub(super) const TTL_BACKSTOP: chrono::Duration = chrono::Duration::days(7);
/// Sorts by time: the sweep asks for the keys before a cut-off.
pub(super) fn sweep_sk(at: DateTime<Utc>, run_id: &str) -> String {
    format!("{}#{run_id}", sweep_time(at))
}
pub(super) fn sweep_time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}
pub(super) fn patch_sk(seq: u64) -> String {
    format!("P#{seq:010}")
}
pub(super) fn idem_pk(owner: &str, key: &str) -> String {
    format!("IDEM#{}#{owner}#{key}", owner.len())
}
/// A top-level run's key in GSI4, which lists the CTAs under it.
pub(super) fn cta_root_pk(root_run_id: &str) -> String {
    format!("ROOT#{root_run_id}")
}

/// An assignee's inbox: a pointer item per CTA assigned to `principal` (`user:<id>`,
/// `group:<name>`), listed in GSI1 under the same key.
pub(super) fn assignee_pk(principal: &str) -> String {
    format!("ASG#{principal}")
}

/// An owner's partition in GSI1, which lists their CTAs (`CTA#…`) and top-level runs
/// (`RUN#…`).
pub(super) fn owner_pk(owner: &str) -> String {
    format!("OWNER#{owner}")
}
/// An owner's quota item: `active`, the active-run slots its top-level runs hold.
pub(super) fn quota_pk(owner: &str) -> String {
    format!("QUOTA#{owner}")
}
/// What an owner's runs spent on a UTC day: `usd`, in [`COUNTER_SHARDS`] items (`SK`
/// [`counter_sk`]), which a read sums.
pub(super) fn spend_pk(owner: &str, day: chrono::NaiveDate) -> String {
    format!("SPEND#{day}#{owner}")
}
/// The items a counter that many runs add to at once (an owner's day's spending, a budgeted
/// tree's spending) is kept in: each run adds to one, picked by its id, so that the
/// transactions of runs stepping at once seldom touch the same item (DynamoDB cancels
/// concurrent transactions on one item), and a read sums them all (one query).
pub(super) const COUNTER_SHARDS: u32 = 32;
/// The shard of a counter that `run_id`'s commits add to: `prefix#NN`.
pub(super) fn counter_sk(prefix: &str, run_id: &str) -> String {
    let h = run_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("{prefix}#{:02}", h % u64::from(COUNTER_SHARDS))
}

/// A top-level run's sort key in GSI1: by creation time (fixed width, so that it sorts).
pub(super) fn run_gsi_sk(created_at: DateTime<Utc>, run_id: &str) -> String {
    format!("RUN#{}#{run_id}", sweep_time(created_at))
}

/// A CTA's sort key in the indexes that list CTAs (GSI1 by owner, GSI4 by top-level run):
/// by status, then oldest first (`CtaPosition`'s order).
pub(super) fn cta_gsi_sk(status: CtaStatus, created_at: DateTime<Utc>, cta_id: &str) -> String {
    format!(
        "CTA#{}#{}#{cta_id}",
        status.as_str(),
        created_at.to_rfc3339()
    )
}
