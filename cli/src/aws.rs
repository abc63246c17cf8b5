//! `baton dev --aws` and `baton bootstrap`: Baton over AWS APIs from this machine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use baton::adapters::provision::{self, Names};
use baton::local::{AwsDevOptions, AwsDevServer};
use baton::ports::SystemClock;

fn names(prefix: &str) -> Names {
    Names::new(prefix)
}

fn scheduler_role(prefix: &str) -> String {
    std::env::var("BATON_SCHEDULER_ROLE_ARN")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| format!("arn:aws:iam::000000000000:role/{prefix}-scheduler"))
}

fn prefix() -> String {
    std::env::var("BATON_PREFIX")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "baton".into())
}

/// Creates the resources and returns the environment the functions read, as `export` lines.
pub async fn bootstrap(prefix: &str) -> anyhow::Result<String> {
    let sdk = baton::adapters::aws::sdk_config().await;
    let p = provision::ensure(&sdk, &names(prefix), &scheduler_role(prefix)).await?;
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
) -> anyhow::Result<()> {
    if std::env::var("AWS_ENDPOINT_URL").is_err() {
        eprintln!("baton dev --aws: AWS_ENDPOINT_URL is not set; talking to AWS itself");
    }
    let (llm, catalog) = crate::model_and_agents(script.as_deref(), agents.as_deref())?;
    let (token, made) = match token.filter(|t| !t.trim().is_empty()) {
        Some(t) => (t, false),
        None => (format!("btn_{}", uuid::Uuid::new_v4().simple()), true),
    };
    let prefix = prefix();
    let server = AwsDevServer::start(AwsDevOptions {
        sdk: baton::adapters::aws::sdk_config().await,
        names: names(&prefix),
        scheduler_role_arn: scheduler_role(&prefix),
        addr,
        token: token.clone(),
        llm,
        catalog,
        clock: Arc::new(SystemClock),
        duplicate: false,
    })
    .await?;
    println!(
        "baton dev --aws: listening on {} (table {}, bus {})",
        server.url(),
        server.provisioned.config.table,
        server.provisioned.config.bus_name
    );
    if made {
        println!("baton dev --aws: new token {token} (set BATON_TOKEN to choose one)");
    }
    let _ = tokio::signal::ctrl_c().await;
    server.shutdown().await;
    Ok(())
}
