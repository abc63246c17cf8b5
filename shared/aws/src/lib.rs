//! Baton on AWS: adapters for the core's ports, and provisioning.
//!
//! | module | what |
//! |---|---|
//! | [`dynamo`] | `DynamoStore`: runs, timelines and CTAs in one table |
//! | [`sqs`] | `SqsQueue`: step messages on the FIFO queues, one group per run |
//! | [`eventbridge`] | `EventBridgeBus`: events on the bus |
//! | [`scheduler`] | `SchedulerTimers`: one-time CTA expiry schedules |
//! | [`s3`] | `S3Blobs`: tool files in a bucket |
//! | [`sdk`] | one SDK config, error mapping, the request meter |
//! | [`settings`] | what an AWS host reads from the environment: resources, SDK, live channel |
//! | [`provision`] | creates what `template.yaml` declares, on an emulator |
//! | [`watch`] | `AppSyncWatchers`: watches of runs granted (a lease and a token) |
//! | `appsync` | `AppSyncLive`: live events to an AppSync Events API (feature `live`) |
//! | `channel` | a subscription to a run's channel there (feature `subscribe`) |
//! | `ses` | `SesMailer`: questions' e-mail through SES (feature `mail`) |
//!
//! [`aws_deps`] hands them to the core's service as its ports. The hosts that run it are elsewhere:
//! the Lambda functions (`baton-lambda`) and `baton dev --aws` (`baton-dev`).

#[cfg(feature = "live")]
pub mod appsync;
#[cfg(feature = "subscribe")]
pub mod channel;
pub mod dynamo;
pub mod eventbridge;
pub mod provision;
pub mod s3;
pub mod scheduler;
pub mod sdk;
#[cfg(feature = "mail")]
pub mod ses;
pub mod settings;
pub mod sqs;
pub mod watch;

use std::sync::Arc;

use crate::settings::AwsConfig;
use baton_core::llm::Llm;
use baton_core::ports::Clock;
use baton_core::service::Deps;

use crate::dynamo::DynamoStore;
use crate::eventbridge::EventBridgeBus;
use crate::scheduler::SchedulerTimers;
use crate::sdk::Meter;
use crate::sqs::SqsQueue;

/// The ports over DynamoDB, SQS, EventBridge, Scheduler and S3 from one SDK config (with
/// the host's model and clock): what a host builds its service with
/// (`Service::builder`).
pub fn aws_deps(
    cfg: &AwsConfig,
    sdk: &aws_config::SdkConfig,
    llm: Arc<dyn Llm>,
    clock: Arc<dyn Clock>,
    meter: Arc<Meter>,
) -> Deps {
    let bus: Arc<dyn baton_core::ports::Bus> = Arc::new(EventBridgeBus::new(
        aws_sdk_eventbridge::Client::new(sdk),
        &cfg.bus_name,
        meter.clone(),
    ));
    Deps {
        store: Arc::new(
            DynamoStore::new(
                aws_sdk_dynamodb::Client::new(sdk),
                &cfg.table,
                cfg.retention_days,
                meter.clone(),
            )
            .with_sweep_shards(cfg.sweep_shards),
        ),
        queue: Arc::new(SqsQueue::new(
            aws_sdk_sqs::Client::new(sdk),
            &cfg.steps_queue_url,
            &cfg.subagent_queue_url,
            meter.clone(),
        )),
        bus: bus.clone(),
        blobs: Arc::new(crate::s3::S3Blobs::new(
            aws_sdk_s3::Client::new(sdk),
            &cfg.bucket,
        )),
        scheduler: Arc::new(
            SchedulerTimers::new(
                aws_sdk_scheduler::Client::new(sdk),
                &cfg.schedule_group,
                &cfg.bus_arn,
                &cfg.scheduler_role_arn,
                meter,
            )
            .not_in_the_past(clock.clone())
            .dead_letters(cfg.timers_dead_letter_arn.clone()),
        ),
        llm,
        clock,
        sending_store: None,
    }
}
