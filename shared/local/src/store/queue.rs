//! The embedded queue, bus and timers: SQS FIFO rules on a table (one group per run, a
//! group's next message held back while an earlier one is in flight, deduplication by id, a
//! visibility timeout, a receive count for dead-lettering), events kept for `GET /events`,
//! and expiry timers the worker fires.

use std::time::Duration;

use baton_core::error::PortError;
use baton_core::message::{Event, StepMessage};
use baton_core::ports::{Bus, Queue, Scheduler};
use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, params};

use super::{LocalStore, from_json, now_ms, sql, to_json};

/// A message handed out by [`LocalStore::receive`].
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Pass back to [`LocalStore::ack`] or [`LocalStore::retry_later`].
    pub receipt: i64,
    pub message: Result<StepMessage, String>,
    /// How many times it has been handed out, this one included.
    pub receives: u32,
}

/// A due expiry timer.
#[derive(Debug, Clone, PartialEq)]
pub struct DueTimer {
    /// A CTA id (its expiry), or a run's own timer id (`tmr_…`).
    pub name: String,
    pub run_id: String,
    /// When it was set for (what [`LocalStore::timer_fired`] deletes).
    pub at_ms: i64,
}

impl LocalStore {
    /// Tells whoever waits in [`LocalStore::wait_for_messages`] that messages were sent.
    pub(super) fn wake_receivers(&self) {
        self.sent.notify_waiters();
        self.sent.notify_one();
    }

    /// Waits until a message may have been sent, or `timeout` passes.
    pub async fn wait_for_messages(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.sent.notified()).await;
    }

    /// Hands out up to `max` messages: the oldest visible message of each group whose
    /// earlier messages are all done, hidden for `visibility` from now.
    ///
    /// Messages acknowledged with [`LocalStore::ack_later`] are deleted first, in the same
    /// transaction, so the next message of their runs is handed out now.
    pub async fn receive(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, PortError> {
        let now = now_ms();
        let acks = self.take_acks();
        let deleting = acks.clone();
        let releases = std::mem::take(&mut *lock(&self.releases));
        let releasing = releases.clone();
        let received = self
            .write(false, move |tx| {
                delete(tx, &deleting)?;
                release(tx, &releasing)?;
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT q.id, q.body, q.receives FROM queue q
                     WHERE q.visible_at <= ?1
                       AND q.id = (SELECT MIN(p.id) FROM queue p WHERE p.group_id = q.group_id)
                     ORDER BY q.id LIMIT ?2",
                    )
                    .map_err(sql)?;
                let rows = stmt
                    .query_map(params![now, max as i64], |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, i64>(2)?,
                        ))
                    })
                    .map_err(sql)?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(sql)?;
                let hide = now + visibility.as_millis() as i64;
                let mut upd = tx
                    .prepare_cached(
                        "UPDATE queue SET visible_at = ?1, receives = receives + 1 WHERE id = ?2",
                    )
                    .map_err(sql)?;
                let mut out = Vec::with_capacity(rows.len());
                for (id, body, receives) in rows {
                    upd.execute(params![hide, id]).map_err(sql)?;
                    out.push(Delivery {
                        receipt: id,
                        message: serde_json::from_str(&body).map_err(|e| e.to_string()),
                        receives: receives as u32 + 1,
                    });
                }
                Ok(out)
            })
            .await;
        if received.is_err() {
            self.restore_acks(acks);
            lock(&self.releases).extend(releases);
        }
        received
    }

    /// Acknowledges a handled message with the next [`LocalStore::receive`] (or
    /// [`LocalStore::flush_acks`]) instead of a write of its own: the worker receives as
    /// soon as a message is done, so the delete is not put off, only shared. Until then
    /// the message stays in flight, holding back its run's group as an acknowledged one
    /// would not; a crash before then redelivers it, as a crash before any ack would.
    pub fn ack_later(&self, receipt: i64) {
        lock(&self.acks).push(receipt);
    }

    /// Deletes the messages [`LocalStore::ack_later`] holds, now.
    pub async fn flush_acks(&self) -> Result<(), PortError> {
        let acks = self.take_acks();
        if acks.is_empty() {
            return Ok(());
        }
        let deleting = acks.clone();
        let done = self.write(false, move |tx| delete(tx, &deleting)).await;
        if done.is_err() {
            self.restore_acks(acks);
        }
        done
    }

    fn take_acks(&self) -> Vec<i64> {
        std::mem::take(&mut *lock(&self.acks))
    }

    fn restore_acks(&self, acks: Vec<i64>) {
        lock(&self.acks).extend(acks);
    }

    /// Makes every message handed out earlier visible again now: at start-up, whatever an
    /// earlier process received and never acknowledged was in flight when it died (or was
    /// stopped), and must not wait out the visibility timeout behind its run's group.
    /// Returns how many it released. Only the data directory's one owner calls this.
    pub async fn release_leases(&self) -> Result<usize, PortError> {
        let now = now_ms();
        self.write_one(false, move |tx| {
            tx.execute(
                "UPDATE queue SET visible_at = ?1 WHERE visible_at > ?1 AND receives > 0",
                [now],
            )
            .map_err(sql)
        })
        .await
    }

    /// Deletes a handled message.
    pub async fn ack(&self, receipt: i64) -> Result<(), PortError> {
        self.write_one(false, move |tx| delete(tx, &[receipt]))
            .await
    }

    /// Makes a message visible again after `delay`; with `uncount`, its receive does not
    /// count toward dead-lettering. If this write fails, the next receive makes it.
    pub async fn retry_later(
        &self,
        receipt: i64,
        delay: Duration,
        uncount: bool,
    ) -> Result<(), PortError> {
        let r = Release {
            receipt,
            at: now_ms() + delay.as_millis() as i64,
            uncount,
        };
        let done = self.write_one(false, move |tx| release(tx, &[r])).await;
        if done.is_err() {
            // Not left to the visibility timeout: the next receive that can write makes it
            // visible (once space is freed, if the disk was full).
            lock(&self.releases).push(r);
        }
        done
    }

    /// How many messages are queued or in flight (acknowledgements held are applied first).
    pub async fn queue_depth(&self) -> Result<u64, PortError> {
        self.flush_acks().await?;
        self.read(|c| {
            c.query_row("SELECT COUNT(*) FROM queue", [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(sql)
        })
        .await
    }

    /// Timers due at `now`.
    pub async fn due_timers(&self, now: DateTime<Utc>) -> Result<Vec<DueTimer>, PortError> {
        let now = now.timestamp_millis();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT name, run_id, at_ms FROM timers WHERE at_ms <= ?1 ORDER BY at_ms",
                )
                .map_err(sql)?;
            stmt.query_map([now], |r| {
                Ok(DueTimer {
                    name: r.get(0)?,
                    run_id: r.get(1)?,
                    at_ms: r.get(2)?,
                })
            })
            .map_err(sql)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql)
        })
        .await
    }

    /// A fired timer is done: deleted unless it was set again meanwhile, for any other time
    /// (an expiry that fired early sets its timer again, for `expiresAt`; a round of
    /// notifications too large for one claim sets its own for now, to go on).
    pub async fn timer_fired(&self, timer: &DueTimer) -> Result<(), PortError> {
        let (name, at_ms) = (timer.name.clone(), timer.at_ms);
        self.write_one(false, move |tx| {
            tx.execute(
                "DELETE FROM timers WHERE name = ?1 AND at_ms = ?2",
                params![name, at_ms],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    /// A stored timer's fire time, if it exists.
    pub async fn timer(&self, cta_id: &str) -> Result<Option<DateTime<Utc>>, PortError> {
        let cta_id = cta_id.to_owned();
        self.read(move |c| {
            let ms: Option<i64> = c
                .query_row("SELECT at_ms FROM timers WHERE name = ?1", [cta_id], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(sql)?;
            Ok(ms.and_then(DateTime::from_timestamp_millis))
        })
        .await
    }

    /// Published events after position `after`, with their positions.
    pub async fn events_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, Event)>, PortError> {
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT seq, body FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2")
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![after, limit as i64], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(sql)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql)?;
            rows.into_iter()
                .map(|(s, b)| Ok((s, from_json(&b)?)))
                .collect()
        })
        .await
    }
}

/// Deletes messages by receipt.
/// A message to make visible again at `at` (ms); `uncount` takes back its receive (a
/// failure that says nothing of the message, such as a full disk, does not count toward
/// dead-lettering it).
#[derive(Debug, Clone, Copy)]
pub(super) struct Release {
    receipt: i64,
    at: i64,
    uncount: bool,
}

fn release(tx: &rusqlite::Connection, releases: &[Release]) -> Result<(), PortError> {
    if releases.is_empty() {
        return Ok(());
    }
    let mut stmt = tx
        .prepare_cached(
            "UPDATE queue SET visible_at = ?1, receives = MAX(receives - ?2, 0) WHERE id = ?3",
        )
        .map_err(sql)?;
    for r in releases {
        stmt.execute(params![r.at, i64::from(r.uncount), r.receipt])
            .map_err(sql)?;
    }
    Ok(())
}

fn delete(tx: &rusqlite::Connection, receipts: &[i64]) -> Result<(), PortError> {
    if receipts.is_empty() {
        return Ok(());
    }
    let mut stmt = tx
        .prepare_cached("DELETE FROM queue WHERE id = ?1")
        .map_err(sql)?;
    for r in receipts {
        stmt.execute([r]).map_err(sql)?;
    }
    Ok(())
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Step messages encoded for [`enqueue`]: id, group, body.
pub(super) type QueueRows = Vec<(String, String, String)>;

pub(super) fn queue_rows<'a>(
    messages: impl IntoIterator<Item = &'a StepMessage>,
) -> Result<QueueRows, PortError> {
    messages
        .into_iter()
        .map(|m| Ok((m.id.clone(), m.run_id.clone(), to_json(m)?)))
        .collect()
}

/// Appends messages to their groups, visible now; one whose id is still queued is dropped.
pub(super) fn enqueue(tx: &rusqlite::Connection, rows: &QueueRows) -> Result<(), PortError> {
    let mut stmt = tx
        .prepare_cached(
            "INSERT INTO queue (dedup_id, group_id, body, visible_at)
             SELECT ?1, ?2, ?3, ?4 WHERE NOT EXISTS (SELECT 1 FROM queue WHERE dedup_id = ?1)",
        )
        .map_err(sql)?;
    let now = now_ms();
    for (id, group, body) in rows {
        stmt.execute(params![id, group, body, now]).map_err(sql)?;
    }
    Ok(())
}

#[async_trait::async_trait]
impl Queue for LocalStore {
    async fn send(&self, messages: &[StepMessage]) -> Result<(), PortError> {
        let rows = queue_rows(messages)?;
        let write = move |tx: &rusqlite::Connection| enqueue(tx, &rows);
        if messages.len() == 1 {
            self.write_one(false, write).await?;
        } else {
            self.write(false, write).await?;
        }
        self.wake_receivers();
        Ok(())
    }

    /// More than one message in the run's group: the one being handled, and another (or an
    /// acknowledged one not yet deleted, which only ends a row early).
    async fn waiting(&self, run_id: &str) -> Result<bool, PortError> {
        let run_id = run_id.to_owned();
        self.read(move |c| {
            c.prepare_cached("SELECT COUNT(*) FROM queue WHERE group_id = ?1")
                .and_then(|mut s| s.query_row([&run_id], |r| r.get::<_, i64>(0)))
                .map(|n| n > 1)
                .map_err(sql)
        })
        .await
    }
}

#[async_trait::async_trait]
impl Bus for LocalStore {
    async fn publish(&self, events: &[Event]) -> Result<(), PortError> {
        let rows = events
            .iter()
            .map(|e| Ok((e.id.clone(), e.detail_type.clone(), to_json(e)?)))
            .collect::<Result<Vec<_>, PortError>>()?;
        self.write(false, move |tx| {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO events (id, detail_type, body) VALUES (?1, ?2, ?3)",
                )
                .map_err(sql)?;
            for (id, detail_type, body) in &rows {
                stmt.execute(params![id, detail_type, body]).map_err(sql)?;
            }
            Ok(())
        })
        .await
    }
}

#[async_trait::async_trait]
impl Scheduler for LocalStore {
    async fn schedule(
        &self,
        timer_id: &str,
        run_id: &str,
        at: DateTime<Utc>,
    ) -> Result<(), PortError> {
        let (timer_id, run_id, at) = (timer_id.to_owned(), run_id.to_owned(), at_ms(at));
        self.write_one(false, move |tx| {
            tx.execute(
                // Set again (a timer re-armed) is set for the new time, as on AWS.
                "INSERT INTO timers (name, run_id, at_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(name) DO UPDATE SET run_id = excluded.run_id, at_ms = excluded.at_ms",
                params![timer_id, run_id, at],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn unschedule(&self, timer_id: &str) -> Result<(), PortError> {
        let timer_id = timer_id.to_owned();
        self.write_one(false, move |tx| {
            tx.execute("DELETE FROM timers WHERE name = ?1", [timer_id])
                .map_err(sql)?;
            Ok(())
        })
        .await
    }
}

/// A timer's time in whole milliseconds, rounded up: a timer due by the millisecond (its
/// `at_ms` at or before `now`'s) is then never early by the nanosecond, so the service's
/// check that it is due agrees with [`LocalStore::due_timers`].
fn at_ms(at: DateTime<Utc>) -> i64 {
    let ms = at.timestamp_millis();
    if at.timestamp_subsec_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    }
}
