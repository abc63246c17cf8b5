//! `SchedulerTimers`: one-time EventBridge Scheduler schedules for CTA expiry.
//!
//! The schedule is named by the CTA id (so creating it twice is harmless: "already exists"
//! is success), fires `at(<UTC time>)` with no flexible window, deletes itself afterwards,
//! and puts a `cta.expired` event `{ctaId, runId}` on the Baton bus. A run's own timer (a plan
//! step's timeout, named `tmr_…`) puts `timer.fired` `{timerId, runId}` instead. Unscheduling
//! a schedule that is gone ("not found") is success.

use std::sync::Arc;

use aws_sdk_scheduler::Client;
use aws_sdk_scheduler::error::ProvideErrorMetadata;
use aws_sdk_scheduler::types::{
    ActionAfterCompletion, EventBridgeParameters, FlexibleTimeWindow, FlexibleTimeWindowMode,
    Target,
};
use chrono::{DateTime, Utc};
use tracing::instrument;

use crate::sdk::{Meter, map_sdk_err};
use baton_core::error::PortError;
use baton_core::message::TIMER_PREFIX;
use baton_core::ports::Scheduler;

/// The detail-type of a run's own timer firing (`{timerId, runId}`).
pub use baton_core::message::TIMER_FIRED;

pub struct SchedulerTimers {
    client: Client,
    group: String,
    bus_arn: String,
    role_arn: String,
    meter: Arc<Meter>,
}

/// `at(yyyy-mm-ddThh:mm:ss)`, in UTC (seconds rounded up, so it never fires early).
pub fn at_expression(at: DateTime<Utc>) -> String {
    let secs = at.timestamp() + i64::from(at.timestamp_subsec_nanos() > 0);
    let t = DateTime::from_timestamp(secs, 0).unwrap_or(at);
    format!("at({})", t.format("%Y-%m-%dT%H:%M:%S"))
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
        }
    }
}

#[async_trait::async_trait]
impl Scheduler for SchedulerTimers {
    #[instrument(skip(self))]
    async fn schedule(
        &self,
        cta_id: &str,
        run_id: &str,
        at: DateTime<Utc>,
    ) -> Result<(), PortError> {
        // A run's own timer (a plan step's timeout) is `timer.fired`; any other, a CTA's expiry.
        let (detail_type, input) = if cta_id.starts_with(TIMER_PREFIX) {
            let input = serde_json::json!({"timerId": cta_id, "runId": run_id});
            (TIMER_FIRED, input.to_string())
        } else {
            let input = serde_json::json!({"ctaId": cta_id, "runId": run_id});
            ("cta.expired", input.to_string())
        };
        let target = Target::builder()
            .arn(&self.bus_arn)
            .role_arn(&self.role_arn)
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
        Meter::count(&self.meter.scheduler);
        let r = self
            .client
            .create_schedule()
            .name(cta_id)
            .group_name(&self.group)
            .schedule_expression(at_expression(at))
            .schedule_expression_timezone("UTC")
            .flexible_time_window(
                FlexibleTimeWindow::builder()
                    .mode(FlexibleTimeWindowMode::Off)
                    .build()
                    .map_err(|e| PortError::broken("build window", e))?,
            )
            .action_after_completion(ActionAfterCompletion::Delete)
            .target(target)
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ConflictException") => Ok(()),
            Err(e) => Err(map_sdk_err("CreateSchedule", e)),
        }
    }

    #[instrument(skip(self))]
    async fn unschedule(&self, cta_id: &str) -> Result<(), PortError> {
        Meter::count(&self.meter.scheduler);
        match self
            .client
            .delete_schedule()
            .name(cta_id)
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
