//! `baton dev --aws` and `baton bootstrap`: Baton over AWS APIs from this machine.

use baton_core::live::grant::Grants;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use baton_aws::provision::{self, Names};
use baton_aws::sdk::sdk_config;
use baton_core::config::Config;
use baton_dev::{AwsDevOptions, AwsDevServer};

/// The role Scheduler assumes: `BATON_SCHEDULER_ROLE_ARN`, else a well-formed placeholder
/// (emulators accept any).
fn scheduler_role(config: &Config, prefix: &str) -> String {
    config
        .scheduler_role_arn
        .clone()
        .unwrap_or_else(|| format!("arn:aws:iam::000000000000:role/{prefix}-scheduler"))
}

/// Creates the resources and returns the environment the functions read, as `export` lines.
pub async fn bootstrap(prefix: &str, config: &crate::Settings) -> anyhow::Result<String> {
    let sdk = sdk_config(&config.aws.sdk).await;
    let p = provision::ensure(&sdk, &Names::new(prefix), &scheduler_role(config, prefix)).await?;
    let c = &p.config;
    Ok([
        ("BATON_TABLE", c.table.as_str()),
        ("BATON_STEPS_QUEUE_URL", &c.steps_queue_url),
        ("BATON_SUBAGENT_QUEUE_URL", &c.subagent_queue_url),
        ("BATON_CTA_INBOX_URL", &p.cta_inbox_url),
        ("BATON_BUS_NAME", &c.bus_name),
        ("BATON_BUS_ARN", &c.bus_arn),
        ("BATON_SCHEDULE_GROUP", &c.schedule_group),
        ("BATON_SCHEDULER_ROLE_ARN", &c.scheduler_role_arn),
        (
            "BATON_TIMERS_DLQ_ARN",
            c.timers_dead_letter_arn.as_deref().unwrap_or_default(),
        ),
        ("BATON_BUCKET", &c.bucket),
        // The step functions' own dead-letter queue (the orchestrator's here; the
        // subagent function's is the second one the stack creates).
        ("BATON_DEAD_LETTER_QUEUE_ARN", &p.dead_letters[0].arn),
    ]
    .iter()
    .map(|(k, v)| format!("export {k}='{v}'"))
    .collect::<Vec<_>>()
    .join("\n"))
}

pub async fn dev(
    addr: SocketAddr,
    token: Option<String>,
    script: Option<PathBuf>,
    agents: Option<PathBuf>,
    users: Vec<baton_api::TokenUser>,
    config: &crate::Settings,
    extensions: &baton_core::agent::Extensions,
) -> anyhow::Result<()> {
    if config.aws.sdk.endpoint.is_none() {
        eprintln!(
            "baton dev --aws: AWS_ENDPOINT_URL is not set; using your AWS account (--yes-real-aws)"
        );
    }
    let (llm, catalog) =
        crate::model_and_agents(script.as_deref(), agents.as_deref(), config, extensions).await?;
    crate::check_assignees(&catalog, &users)?;
    let (token, made) = match token.filter(|t| !t.trim().is_empty()) {
        Some(t) => (t, false),
        None => (format!("btn_{}", uuid::Uuid::new_v4().simple()), true),
    };
    let prefix = &config.prefix;
    // Traces go to OTEL_EXPORTER_OTLP_ENDPOINT when it is set; none are made otherwise.
    let traces = baton_telemetry::Traces::from_env("baton-dev")?;
    let server = AwsDevServer::start(AwsDevOptions {
        addr,
        function_timeout: config
            .dev_function_timeout_s
            .map(|s| std::time::Duration::from_secs(s.into())),
        steps_at_once: config.steps_at_once.map(|n| n as usize),
        steps_in_a_row: config.steps_in_a_row.map(|n| n as usize),
        live: match (&config.aws.live, &config.link_key) {
            (None, _) => None,
            (Some(live), Some(key)) => Some((
                live.clone(),
                Grants::new(key.as_bytes()).map_err(|e| anyhow::anyhow!("BATON_LINK_KEY: {e}"))?,
            )),
            (Some(_), None) => anyhow::bail!(
                "BATON_LIVE_HTTP_DOMAIN is set: the live channel's watch tokens are signed with \
                 BATON_LINK_KEY (at least 32 characters), which is not set"
            ),
        },
        links: config
            .link_key
            .clone()
            .map(|key| (key, config.public_url.clone())),
        traces: traces.map(Arc::new),
        quotas: baton_core::service::Quotas {
            active_runs: config.max_active_runs_per_owner,
            daily_cost_usd: config.max_daily_cost_usd_per_owner,
        },
        users,
        ..AwsDevOptions::new(
            sdk_config(&config.aws.sdk).await,
            Names::new(prefix),
            scheduler_role(config, prefix),
            token.clone(),
            llm,
            catalog,
        )
    })
    .await?;
    if config.link_key.is_none() {
        println!(
            "baton dev --aws: one-time answer links are off: set BATON_LINK_KEY (at least 32 \
             characters) to sign them"
        );
    }
    println!(
        "baton dev --aws: listening on {} (table {}, bus {})",
        server.url(),
        server.provisioned.config.table,
        server.provisioned.config.bus_name
    );
    if made {
        println!("baton dev --aws: new token {token} (set BATON_TOKEN to choose one)");
    }
    baton_dev::host::stop_signal().await;
    server.shutdown().await;
    Ok(())
}
