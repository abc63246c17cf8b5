//! `SchedulerTimers`: one-time EventBridge Scheduler schedules for CTA expiry.
//!
//! The schedule is named by the CTA id, deletes itself after firing, and puts a
//! `cta.expired` event `{ctaId, runId, due}` on the Baton bus. A run's own timer (a plan
//! step's timeout, named `tmr_…`) puts `timer.fired` `{timerId, runId, due}` instead.
//!
//! EventBridge Scheduler invokes a target with 60-second precision: a schedule for 1:00:30
//! may fire anywhere in 1:00:00–1:00:59, up to 59 s early. So the schedule is set for the
//! whole minute at or after the due time (`at(…:01:00)`), which it cannot fire before: a
//! timer fires between its due time and two minutes after. An event that arrives early all
//! the same (a scheduler that does not keep its documented precision, a clock off) is not
//! lost: the service re-arms its timer, and `due` says when that is. Creating a schedule
//! that exists (re-arming one, or an effect performed twice) updates it. Unscheduling a
//! schedule that is gone ("not found") is success.
//!
//! A timer is never created in the past: one already due when its effect is performed (an
//! outbox performed late, by a redelivery or the sweep), or whose minute is less than
//! [`LATE_LEAD`] away, is scheduled for the first whole minute at least that far on, so it
//! fires within about a minute. Its event is not put
//! on the bus by the function instead: the bus's policy refuses `cta.expired` and
//! `timer.fired` from anyone but the scheduler's role, so that no one forges an expiry. Each
//! schedule retries its target (for a day, 185 times, Scheduler's most)
//! and then sends the event to the timers' dead-letter queue (`BATON_TIMERS_DLQ_ARN`), which
//! is alarmed; a question whose expiry was lost all the same is expired by the sweep.
use std::sync::Arc;

use aws_sdk_scheduler::Client;
use aws_sdk_scheduler::error::ProvideErrorMetadata;
use aws_sdk_scheduler::types::{
    ActionAfterCompletion, DeadLetterConfig, EventBridgeParameters, FlexibleTimeWindow,
    FlexibleTimeWindowMode, RetryPolicy, Target,
};
use chrono::{DateTime, Utc};
use tracing::instrument;

use crate::sdk::{Meter, map_sdk_err};
use baton_core::error::PortError;
use baton_core::message::is_run_timer;
use baton_core::ports::{Clock, Scheduler};

/// The detail-type of a run's own timer firing (`{timerId, runId}`).
pub use baton_core::message::TIMER_FIRED;

pub struct SchedulerTimers {
    client: Client,
    group: String,
    bus_arn: String,
    role_arn: String,
    meter: Arc<Meter>,
    /// The clock that says a timer is already due ([`SchedulerTimers::not_in_the_past`]).
    clock: Option<Arc<dyn Clock>>,
    /// The timers' dead-letter queue (`BATON_TIMERS_DLQ_ARN`).
    dead_letters: Option<String>,
}

/// How long Scheduler keeps trying to deliver a fired schedule's event, and how often.
pub const RETRY_MAX_AGE_S: i32 = 86_400;
pub const RETRY_MAX_ATTEMPTS: i32 = 185;

/// How far ahead of now a schedule is set, at the least: a schedule's time is checked when
/// Scheduler receives it, so it is not set for a moment a slow request could reach after it
/// has passed. A timer whose minute is nearer (one already due, performed late) is set for
/// the first whole minute past now and this.
pub const LATE_LEAD: chrono::TimeDelta = chrono::TimeDelta::seconds(2);

/// The first whole minute at or after `at`: when a schedule for `at` is set, so that it,
/// fired anywhere in its minute, never fires before `at`.
pub fn minute_at(at: DateTime<Utc>) -> DateTime<Utc> {
    let secs = at.timestamp() + i64::from(at.timestamp_subsec_nanos() > 0);
    let minute = secs.div_euclid(60) * 60 + if secs.rem_euclid(60) > 0 { 60 } else { 0 };
    DateTime::from_timestamp(minute, 0).unwrap_or(at)
}

/// When a timer due `at` is scheduled for if it is made at `now`: `at`, unless its minute is
/// less than [`LATE_LEAD`] on (or past), then that far on (its minute is the one after).
pub fn schedule_for(at: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    if minute_at(at) < now + LATE_LEAD {
        now + LATE_LEAD
    } else {
        at
    }
}

/// `at(yyyy-mm-ddThh:mm:00)`, in UTC: [`minute_at`] of `at`.
pub fn at_expression(at: DateTime<Utc>) -> String {
    format!("at({})", minute_at(at).format("%Y-%m-%dT%H:%M:%S"))
}

impl SchedulerTimers {
    pub fn new(
        client: Client,
        group: impl Into<String>,
        bus_arn: impl Into<String>,
        role_arn: impl Into<String>,
        meter: Arc<Meter>,
    ) -> Self {
        Self {
            client,
            group: group.into(),
            bus_arn: bus_arn.into(),
            role_arn: role_arn.into(),
            meter,
            clock: None,
            dead_letters: None,
        }
    }

    /// A timer already due by `clock` is scheduled [`LATE_LEAD`] on, never in the past.
    pub fn not_in_the_past(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Each schedule's events that cannot be delivered go to this queue.
    pub fn dead_letters(mut self, queue_arn: Option<String>) -> Self {
        self.dead_letters = queue_arn;
        self
    }
}

#[async_trait::async_trait]
impl Scheduler for SchedulerTimers {
    #[instrument(skip(self))]
    async fn schedule(
        &self,
        timer_id: &str,
        run_id: &str,
        at: DateTime<Utc>,
    ) -> Result<(), PortError> {
        // A run's own timer (a plan step's timeout) is `timer.fired`; any other, a CTA's expiry.
        let due = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let (detail_type, input) = if is_run_timer(timer_id) {
            let input = serde_json::json!({"timerId": timer_id, "runId": run_id, "due": due});
            (TIMER_FIRED, input.to_string())
        } else {
            let input = serde_json::json!({"ctaId": timer_id, "runId": run_id, "due": due});
            ("cta.expired", input.to_string())
        };
        // Due already (or its minute too near): a schedule for a minute past could never fire.
        let at = match &self.clock {
            Some(clock) => schedule_for(at, clock.now()),
            None => at,
        };
        let retry = RetryPolicy::builder()
            .maximum_event_age_in_seconds(RETRY_MAX_AGE_S)
            .maximum_retry_attempts(RETRY_MAX_ATTEMPTS)
            .build();
        let target = Target::builder()
            .arn(&self.bus_arn)
            .role_arn(&self.role_arn)
            .retry_policy(retry)
            .set_dead_letter_config(
                self.dead_letters
                    .as_ref()
                    .map(|arn| DeadLetterConfig::builder().arn(arn).build()),
            )
            .input(input)
            .event_bridge_parameters(
                EventBridgeParameters::builder()
                    .detail_type(detail_type)
                    .source(super::eventbridge::SOURCE)
                    .build()
                    .map_err(|e| PortError::broken("build target", e))?,
            )
            .build()
            .map_err(|e| PortError::broken("build target", e))?;
        let window = FlexibleTimeWindow::builder()
            .mode(FlexibleTimeWindowMode::Off)
            .build()
            .map_err(|e| PortError::broken("build window", e))?;
        Meter::count(&self.meter.scheduler);
        let r = self
            .client
            .create_schedule()
            .name(timer_id)
            .group_name(&self.group)
            .schedule_expression(at_expression(at))
            .schedule_expression_timezone("UTC")
            .flexible_time_window(window.clone())
            .action_after_completion(ActionAfterCompletion::Delete)
            .target(target.clone())
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            // It exists: one that fired early and is being re-armed, or this effect
            // performed before. Either way it is to fire at `at`.
            Err(e) if e.code() == Some("ConflictException") => {
                Meter::count(&self.meter.scheduler);
                self.client
                    .update_schedule()
                    .name(timer_id)
                    .group_name(&self.group)
                    .schedule_expression(at_expression(at))
                    .schedule_expression_timezone("UTC")
                    .flexible_time_window(window)
                    .action_after_completion(ActionAfterCompletion::Delete)
                    .target(target)
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| map_sdk_err("UpdateSchedule", e))
            }
            Err(e) => Err(map_sdk_err("CreateSchedule", e)),
        }
    }

    #[instrument(skip(self))]
    async fn unschedule(&self, timer_id: &str) -> Result<(), PortError> {
        Meter::count(&self.meter.scheduler);
        match self
            .client
            .delete_schedule()
            .name(timer_id)
            .group_name(&self.group)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ResourceNotFoundException") => Ok(()),
            Err(e) => Err(map_sdk_err("DeleteSchedule", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().expect("a time")
    }

    #[test]
    fn a_schedule_is_set_for_the_first_whole_minute_at_or_after_its_time() {
        assert_eq!(
            at_expression(t("2026-11-24T10:00:30Z")),
            "at(2026-11-24T10:01:00)"
        );
        assert_eq!(
            at_expression(t("2026-11-24T10:00:00.001Z")),
            "at(2026-11-24T10:01:00)"
        );
        assert_eq!(
            at_expression(t("2026-11-24T10:00:00Z")),
            "at(2026-11-24T10:00:00)"
        );
        assert_eq!(
            at_expression(t("2026-11-24T23:59:59Z")),
            "at(2026-11-25T00:00:00)"
        );
    }

    #[test]
    fn a_timer_is_never_set_for_a_minute_too_near_or_past() {
        let now = t("2026-11-24T10:00:50Z");
        // Due later, or soon but in a minute far enough on: as it is.
        for at in ["2026-11-24T10:05:00Z", "2026-11-24T10:00:53Z"] {
            assert_eq!(schedule_for(t(at), now), t(at));
        }
        // Its minute under 2 s away, or past: the first minute at least 2 s on.
        let late = t("2026-11-24T10:00:59Z");
        assert_eq!(
            at_expression(schedule_for(late, t("2026-11-24T10:00:58.500Z"))),
            "at(2026-11-24T10:02:00)"
        );
        for due in ["2026-11-24T10:00:40Z", "2026-11-24T09:00:00Z"] {
            assert_eq!(
                at_expression(schedule_for(t(due), now)),
                "at(2026-11-24T10:01:00)"
            );
        }
    }
}
