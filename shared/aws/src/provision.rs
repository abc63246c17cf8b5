//! Creates the resources `template.yaml` declares, with the same names, in LocalStack or
//! moto (or a real account): the table, the queues and their dead-letter queues, the bus and
//! its rule into the CTA inbox, the schedule group. Idempotent: running it twice is fine.

use aws_config::SdkConfig;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;

use crate::settings::AwsConfig;

use crate::dynamo::{GSI1, GSI2, GSI3, GSI4};
use crate::sdk::map_sdk_err;
use baton_core::error::PortError;

/// Resource names, derived from one prefix (the stack name on AWS).
#[derive(Debug, Clone)]
pub struct Names {
    pub prefix: String,
    /// Seconds a received message stays hidden (6 × the function timeout on AWS).
    pub visibility_timeout: u32,
    /// Receives before a message moves to its dead-letter queue.
    pub max_receives: u32,
}

impl Names {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            visibility_timeout: 30,
            max_receives: 5,
        }
    }
    pub fn table(&self) -> String {
        format!("{}-table", self.prefix)
    }
    pub fn steps(&self) -> String {
        format!("{}-steps.fifo", self.prefix)
    }
    pub fn subagent_steps(&self) -> String {
        format!("{}-subagent-steps.fifo", self.prefix)
    }
    pub fn cta_inbox(&self) -> String {
        format!("{}-cta-inbox", self.prefix)
    }
    pub fn bus(&self) -> String {
        format!("{}-bus", self.prefix)
    }
    pub fn schedule_group(&self) -> String {
        format!("{}-ctas", self.prefix)
    }
    /// Where the schedules send an event they could not deliver.
    pub fn timers_dlq(&self) -> String {
        format!("{}-timers-dlq", self.prefix)
    }
    /// Where questions' notifications given up on (`cta.undelivered`) are kept.
    pub fn notifications_dlq(&self) -> String {
        format!("{}-notifications-dlq", self.prefix)
    }
    /// The files bucket (S3 names are lowercase).
    pub fn bucket(&self) -> String {
        format!("{}-files", self.prefix).to_lowercase()
    }
}

/// What was created, as the functions see it in their environment.
#[derive(Debug, Clone)]
pub struct Provisioned {
    pub config: AwsConfig,
    pub cta_inbox_url: String,
    /// The dead-letter queues of steps, subagent steps and the CTA inbox, in that order.
    pub dead_letters: Vec<QueueRef>,
}

/// A queue as its consumers know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRef {
    pub url: String,
    pub arn: String,
}

fn dlq_name(queue: &str) -> String {
    match queue.strip_suffix(".fifo") {
        Some(base) => format!("{base}-dlq.fifo"),
        None => format!("{queue}-dlq"),
    }
}

/// A rule on the bus, `<prefix>-<name>`, that sends the events `pattern` matches to the
/// queue `target`.
async fn rule_into(
    eb: &aws_sdk_eventbridge::Client,
    n: &Names,
    name: &str,
    pattern: serde_json::Value,
    target: &str,
) -> Result<(), PortError> {
    let rule = format!("{}-{name}", n.prefix);
    eb.put_rule()
        .name(&rule)
        .event_bus_name(n.bus())
        .event_pattern(pattern.to_string())
        .send()
        .await
        .map_err(|e| map_sdk_err("PutRule", e))?;
    eb.put_targets()
        .rule(&rule)
        .event_bus_name(n.bus())
        .targets(
            aws_sdk_eventbridge::types::Target::builder()
                .id(name)
                .arn(target)
                .build()
                .map_err(|e| PortError::broken("build rule target", e))?,
        )
        .send()
        .await
        .map_err(|e| map_sdk_err("PutTargets", e))?;
    Ok(())
}

/// A standard queue with no dead letters of its own (a dead-letter queue itself).
async fn plain_queue(sqs: &aws_sdk_sqs::Client, name: &str) -> Result<QueueRef, PortError> {
    let created = sqs
        .create_queue()
        .queue_name(name)
        .send()
        .await
        .map_err(|e| map_sdk_err("CreateQueue", e))?;
    let url = created.queue_url().unwrap_or_default().to_owned();
    let arn = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| map_sdk_err("GetQueueAttributes", e))?
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .cloned()
        .unwrap_or_default();
    Ok(QueueRef { url, arn })
}

async fn queue(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    n: &Names,
) -> Result<(QueueRef, QueueRef), PortError> {
    let fifo = name.ends_with(".fifo");
    let create = |qname: String, redrive: Option<String>| {
        let mut req = sqs.create_queue().queue_name(qname);
        if fifo {
            req = req.attributes(QueueAttributeName::FifoQueue, "true");
        }
        req = req.attributes(
            QueueAttributeName::VisibilityTimeout,
            n.visibility_timeout.to_string(),
        );
        if let Some(r) = redrive {
            req = req.attributes(QueueAttributeName::RedrivePolicy, r);
            if fifo {
                // As template.yaml: high-throughput FIFO, one message group per run.
                req = req
                    .attributes(QueueAttributeName::DeduplicationScope, "messageGroup")
                    .attributes(QueueAttributeName::FifoThroughputLimit, "perMessageGroupId");
            }
        }
        req.send()
    };
    let arn_of = |url: String| async move {
        let attrs = sqs
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| map_sdk_err("GetQueueAttributes", e))?;
        let arn = attrs
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .cloned()
            .unwrap_or_default();
        Ok::<_, PortError>(QueueRef { url, arn })
    };
    let dlq = create(dlq_name(name), None)
        .await
        .map_err(|e| map_sdk_err("CreateQueue", e))?;
    let dlq = arn_of(dlq.queue_url().unwrap_or_default().to_owned()).await?;
    let redrive =
        serde_json::json!({"deadLetterTargetArn": dlq.arn, "maxReceiveCount": n.max_receives})
            .to_string();
    let q = create(name.to_owned(), Some(redrive))
        .await
        .map_err(|e| map_sdk_err("CreateQueue", e))?;
    let q = arn_of(q.queue_url().unwrap_or_default().to_owned()).await?;
    Ok((q, dlq))
}

/// Creates (or finds) everything. `scheduler_role_arn` is the role Scheduler assumes to put
/// the expiry event on the bus (emulators accept any well-formed ARN).
pub async fn ensure(
    sdk: &SdkConfig,
    n: &Names,
    scheduler_role_arn: &str,
) -> Result<Provisioned, PortError> {
    let ddb = aws_sdk_dynamodb::Client::new(sdk);
    let key = |name: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(t)
            .build()
    };
    let attr = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
    };
    let build =
        |e: aws_sdk_dynamodb::error::BuildError| PortError::broken("build table definition", e);
    // Every index is keyed `<name>PK` / `<name>SK`: GSI1 and GSI4 list CTAs by owner and by
    // top-level run (all attributes); GSI2 and GSI3 are the sweep's, and need only the keys.
    let index = |name: &str, projection: ProjectionType| -> Result<_, PortError> {
        let mut attrs = Vec::new();
        for suffix in ["PK", "SK"] {
            attrs.push(attr(&format!("{name}{suffix}")).map_err(build)?);
        }
        let gsi = GlobalSecondaryIndex::builder()
            .index_name(name)
            .key_schema(key(&format!("{name}PK"), KeyType::Hash).map_err(build)?)
            .key_schema(key(&format!("{name}SK"), KeyType::Range).map_err(build)?)
            .projection(Projection::builder().projection_type(projection).build())
            .build()
            .map_err(build)?;
        Ok((attrs, gsi))
    };
    let mut create = ddb
        .create_table()
        .table_name(n.table())
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("PK").map_err(build)?)
        .attribute_definitions(attr("SK").map_err(build)?)
        .key_schema(key("PK", KeyType::Hash).map_err(build)?)
        .key_schema(key("SK", KeyType::Range).map_err(build)?);
    for (name, projection) in [
        (GSI1, ProjectionType::All),
        (GSI2, ProjectionType::KeysOnly),
        (GSI3, ProjectionType::KeysOnly),
        (GSI4, ProjectionType::All),
    ] {
        let (attrs, gsi) = index(name, projection)?;
        for a in attrs {
            create = create.attribute_definitions(a); // appends
        }
        create = create.global_secondary_indexes(gsi);
    }
    let created = create.send().await;
    match created {
        Ok(_) => {
            let ttl = TimeToLiveSpecification::builder()
                .attribute_name("ttl")
                .enabled(true)
                .build()
                .map_err(build)?;
            ddb.update_time_to_live()
                .table_name(n.table())
                .time_to_live_specification(ttl)
                .send()
                .await
                .map_err(|e| map_sdk_err("UpdateTimeToLive", e))?;
        }
        Err(e) if e.code() == Some("ResourceInUseException") => {
            // A table made by an earlier version: add the indexes it lacks.
            let table = ddb
                .describe_table()
                .table_name(n.table())
                .send()
                .await
                .map_err(|e| map_sdk_err("DescribeTable", e))?
                .table;
            let has = |name: &str| {
                table.as_ref().is_some_and(|t| {
                    t.global_secondary_indexes()
                        .iter()
                        .any(|g| g.index_name() == Some(name))
                })
            };
            if !has(GSI4) {
                let (attrs, gsi) = index(GSI4, ProjectionType::All)?;
                let create = aws_sdk_dynamodb::types::CreateGlobalSecondaryIndexAction::builder()
                    .index_name(GSI4)
                    .set_key_schema(Some(gsi.key_schema().to_vec()))
                    .set_projection(gsi.projection().cloned())
                    .build()
                    .map_err(build)?;
                ddb.update_table()
                    .table_name(n.table())
                    .set_attribute_definitions(Some(attrs))
                    .global_secondary_index_updates(
                        aws_sdk_dynamodb::types::GlobalSecondaryIndexUpdate::builder()
                            .create(create)
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(|e| map_sdk_err("UpdateTable", e))?;
            }
        }
        Err(e) => return Err(map_sdk_err("CreateTable", e)),
    }

    let sqs = aws_sdk_sqs::Client::new(sdk);
    let (steps, steps_dlq) = queue(&sqs, &n.steps(), n).await?;
    let (sub, sub_dlq) = queue(&sqs, &n.subagent_steps(), n).await?;
    let (inbox, inbox_dlq) = queue(&sqs, &n.cta_inbox(), n).await?;
    let timers_dlq = plain_queue(&sqs, &n.timers_dlq()).await?.arn;
    let notifications_dlq = plain_queue(&sqs, &n.notifications_dlq()).await?;

    let eb = aws_sdk_eventbridge::Client::new(sdk);
    match eb.create_event_bus().name(n.bus()).send().await {
        Ok(_) => {}
        Err(e) if e.code() == Some("ResourceAlreadyExistsException") => {}
        Err(e) => return Err(map_sdk_err("CreateEventBus", e)),
    }
    let bus_arn = eb
        .describe_event_bus()
        .name(n.bus())
        .send()
        .await
        .map_err(|e| map_sdk_err("DescribeEventBus", e))?
        .arn
        .unwrap_or_default();
    rule_into(
        &eb,
        n,
        "cta-inbox",
        serde_json::json!({"detail-type": ["cta.response", "cta.expired", "timer.fired"]}),
        &inbox.arn,
    )
    .await?;
    // Notifications given up on, kept in a queue of their own (the template's
    // CtaUndeliveredRule).
    rule_into(
        &eb,
        n,
        "cta-undelivered",
        serde_json::json!({"source": [crate::eventbridge::SOURCE], "detail-type": ["cta.undelivered"]}),
        &notifications_dlq.arn,
    )
    .await?;

    let sch = aws_sdk_scheduler::Client::new(sdk);
    match sch
        .create_schedule_group()
        .name(n.schedule_group())
        .send()
        .await
    {
        Ok(_) => {}
        Err(e) if e.code() == Some("ConflictException") => {}
        Err(e) => return Err(map_sdk_err("CreateScheduleGroup", e)),
    }

    let s3 = aws_sdk_s3::Client::new(sdk);
    match s3.create_bucket().bucket(n.bucket()).send().await {
        Ok(_) => {}
        Err(e)
            if matches!(
                e.code(),
                Some("BucketAlreadyOwnedByYou" | "BucketAlreadyExists")
            ) => {}
        Err(e) => return Err(map_sdk_err("CreateBucket", e)),
    }

    Ok(Provisioned {
        config: AwsConfig {
            table: n.table(),
            steps_queue_url: steps.url,
            subagent_queue_url: sub.url,
            bus_name: n.bus(),
            bus_arn,
            schedule_group: n.schedule_group(),
            scheduler_role_arn: scheduler_role_arn.into(),
            bucket: n.bucket(),
            retention_days: 90,
            sweep_shards: crate::dynamo::SWEEP_SHARDS,
            dead_letter_queue_arn: None,
            timers_dead_letter_arn: Some(timers_dlq).filter(|a| !a.is_empty()),
        },
        cta_inbox_url: inbox.url,
        dead_letters: vec![steps_dlq, sub_dlq, inbox_dlq],
    })
}
