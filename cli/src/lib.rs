//! `baton` as a library: the command line — the local dev server, a client for any Baton API,
//! the benchmarks, `baton new` — with a project's own tools, plugins and agents.
//!
//! Baton's own `baton` binary is [`main`] with no extensions; a project `baton new` made has a
//! `dev` binary that is [`main`] with its own (through `baton-sdk`'s `dev` feature), so that
//! `cargo run -p dev -- dev` serves the same API, console and client as `baton dev`, with the
//! project's tools in its catalog.

mod aws;
mod bench;
mod bench_aws;
mod bench_cmd;
mod client;
mod load;
mod load_aws;
mod new;
mod parked;
mod preflight;
mod preflight_bedrock;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use baton_aws::settings::AwsSettings;
use baton_core::agent::{Catalog, Extensions};
use baton_core::config::Config;
use baton_core::cost::split_model;
use baton_core::llm::Llm;
use baton_dev::{LocalOptions, LocalServer, WorkerOptions};
use baton_llm::Models;
use baton_llm::scripted::ScriptedLlm;
use clap::{ArgGroup, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "baton",
    version,
    about = "Durable AI-agent orchestration: local server, client and benchmark"
)]
struct Cli {
    /// The Baton API to talk to.
    #[arg(
        long,
        global = true,
        env = "BATON_ENDPOINT",
        default_value = "http://127.0.0.1:8787"
    )]
    endpoint: String,
    /// Bearer token (default: BATON_TOKEN, else the token `baton dev` stored in --data).
    #[arg(long, global = true, env = "BATON_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The local data directory, where `baton dev` keeps its store and token
    /// [default: .baton; `bench` uses a fresh temporary directory].
    #[arg(long, global = true)]
    data: Option<PathBuf>,
    /// Print the API's JSON instead of a human summary.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API and the worker in one process on the embedded store.
    Dev {
        #[arg(long, default_value = "127.0.0.1:8787")]
        addr: SocketAddr,
        /// Use the scripted model with this JSON file. Without it, each agent calls the model
        /// it names, else BATON_MODEL (`provider:model-id`: OpenAI-compatible with
        /// OPENAI_BASE_URL and OPENAI_API_KEY, Anthropic with ANTHROPIC_API_KEY, or Bedrock
        /// with your AWS credentials); the models are listed at start-up.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Extra agents: {"agents": {"NAME": {"system", "tools", "approval", "maxIterations"}}}.
        #[arg(long)]
        agents: Option<PathBuf>,
        /// People besides the server's owner, for questions assigned to users and groups:
        /// {"users": [{"token": "...", "user": "alice", "groups": ["ops"]}]}. A token it
        /// lists acts as that user; the server's own token stays the owner's.
        #[arg(long)]
        users: Option<PathBuf>,
        /// Run over AWS APIs instead of the embedded store: DynamoDB, SQS, EventBridge and
        /// Scheduler at AWS_ENDPOINT_URL (LocalStack or moto), with in-process event source
        /// mappings standing in for Lambda's. Resources (named from BATON_PREFIX, default
        /// `baton`) are created if missing.
        #[arg(long)]
        aws: bool,
        /// With --aws and no AWS_ENDPOINT_URL: yes, create and use resources in the AWS account
        /// the credentials belong to.
        #[arg(long, requires = "aws")]
        yes_real_aws: bool,
    },
    /// Create the AWS resources the template declares (idempotent), for LocalStack or moto,
    /// and print the environment the functions need.
    Bootstrap {
        /// Name prefix (the stack name on AWS).
        #[arg(long, env = "BATON_PREFIX", default_value = "baton")]
        prefix: String,
    },
    /// Before a deploy: whether the account's Lambda concurrency (GetAccountSettings, with
    /// your AWS credentials) holds what the template's event source mappings may run at once,
    /// with your parameter overrides, and whether the stack's name fits the names it makes.
    /// Exit codes: 0 it fits, 1 it does not (each NO line says what to change), 2 refused.
    Preflight {
        /// The stack's name (samconfig.toml's stack_name).
        #[arg(long, default_value = "baton")]
        stack_name: String,
        /// Parameters as `sam deploy` takes them: Name=Value (StepsMaxConcurrency=20).
        #[arg(long, num_args = 0..)]
        parameter_overrides: Vec<String>,
        /// The template to read (default: the one this build deploys).
        #[arg(long)]
        template: Option<PathBuf>,
    },
    /// Start a run.
    Run {
        prompt: String,
        #[arg(long)]
        agent: Option<String>,
        /// The run's sandbox (its tools and subagents work there).
        #[arg(long)]
        sandbox: Option<String>,
        /// The GitHub repository the run works on: `owner/name`, or `owner/name@ref`.
        #[arg(long)]
        github: Option<String>,
        /// Wait until the run finishes or parks on a CTA, then show it; its state changes
        /// (and a retrying step's last error) go to stderr as they happen. Exit codes:
        /// 0 completed or waiting for a human, 3 failed/expired/cancelled, 4 still going
        /// at the timeout, 2 refused, 1 unreachable.
        #[arg(long)]
        wait: bool,
        /// Follow the run as it happens (as `baton watch` does), and exit as it does.
        #[arg(long, conflicts_with_all = ["wait", "quiet"])]
        follow: bool,
        /// Seconds to wait at most with --wait.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Print only the run's id (for scripts: `RUN=$(baton run "..." -q)`).
        #[arg(short, long)]
        quiet: bool,
    },
    /// Show a run and its timeline.
    Show { run_id: String },
    /// Follow a run as it happens: the model's reply as it streams, each tool call as it
    /// starts and ends, the entries as they commit (behind API Gateway, which does not
    /// stream: the entries, polled). Exit codes: 0 completed, 3 failed/expired/cancelled,
    /// 5 waiting for a human (its questions are printed, with how to answer them), 2
    /// refused, 1 unreachable.
    Watch { run_id: String },
    /// List CTAs waiting for an answer (--all: every status; --assigned: the questions
    /// assigned to the token's user, by name or group, instead of its own runs').
    Ctas {
        #[arg(long)]
        all: bool,
        #[arg(long)]
        assigned: bool,
        /// Print only the CTAs' ids, one a line, oldest first.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Answer a CTA.
    #[command(group(ArgGroup::new("answer").required(true).args(["approve", "reject", "text", "choice"])))]
    Answer {
        cta_id: String,
        #[arg(long)]
        approve: bool,
        #[arg(long)]
        reject: bool,
        /// With --reject (or --approve): why.
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        text: Option<String>,
        /// The id of the chosen option.
        #[arg(long)]
        choice: Option<String>,
    },
    /// Cancel a run, its pending CTAs and its subagents.
    Cancel { run_id: String },
    /// Send a follow-up message to a run: it starts the run's next turn, or waits for the
    /// turn under way to end.
    Say {
        run_id: String,
        message: String,
        /// The model tier the turn asks for (the agent's `modelByTier`).
        #[arg(long, value_parser = ["normal", "high"])]
        tier: Option<String>,
        /// Keep the turn out of a conversation view (it stays in the timeline, marked).
        #[arg(long)]
        hidden: bool,
    },
    /// Start a run's next turn without a message: as a webhook or a schedule would, naming
    /// the trigger, with JSON data for the model.
    Trigger {
        run_id: String,
        name: String,
        /// JSON the model is given with the trigger (its `data`, at most 16 KB).
        #[arg(long)]
        payload: Option<String>,
    },
    /// List your runs, newest first.
    Runs {
        /// Runs a page (1 to 100).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// The page after this cursor (a previous page's `nextCursor`).
        #[arg(long)]
        cursor: Option<String>,
    },
    /// The durable-loop benchmark: N echo iterations, each committed to disk.
    Bench(bench_cmd::BenchArgs),
    /// Write a project of your own in DIR (new, or empty): a crate of your tools, plugins and
    /// agents; the five Lambda functions and a `dev` binary (this command, with your tools)
    /// over Baton's crates; the SAM template, samconfig.toml, a README, a test and a CI
    /// script. Exit codes: 0 written, 2 refused (nothing written).
    New(new::NewArgs),
    /// Print the SAM template this build of Baton deploys (a project's `template.yaml`: after
    /// an upgrade, `cargo run -p dev -- template > template.yaml`).
    Template,
}

fn default_data() -> PathBuf {
    PathBuf::from(".baton")
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("baton=info,warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// A refusal (bad input, or the API said no): one line, exit 2.
fn refuse(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("baton: {message}");
    ExitCode::from(2)
}

/// The environment, read once, by the commands that use it (a client command does not):
/// every host's settings ([`Config`], which a `Settings` derefs to) and an AWS host's.
/// How many steps of one run the embedded worker takes in a row (`BATON_STEPS_IN_A_ROW`, as
/// `baton dev` reads it), for the benchmarks.
fn steps_in_a_row() -> usize {
    config()
        .ok()
        .and_then(|c| c.steps_in_a_row)
        .map_or(baton_core::service::STEPS_IN_A_ROW, |n| n as usize)
}

fn config() -> Result<Settings, ExitCode> {
    Ok(Settings {
        config: Config::from_env().map_err(refuse)?,
        aws: AwsSettings::from_env().map_err(refuse)?,
    })
}

/// What the commands read from the environment.
pub(crate) struct Settings {
    config: Config,
    /// The SDK's endpoint, the live channel, a deployment's resources.
    pub aws: AwsSettings,
}

impl std::ops::Deref for Settings {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.config
    }
}

/// The SAM template this build of Baton deploys (`baton template` prints it): a project of
/// its own deploys it as it is, its functions at the same `functions/<name>` paths.
pub const TEMPLATE: &str = baton_dev::functions::TEMPLATE;

/// The `baton` command, its catalog given `extensions` (the tools, plugins and agents of a
/// project of its own; [`Extensions::default`] for Baton's built-ins alone), on a Tokio
/// runtime of its own: a binary's `main` is one call.
pub fn main(extensions: Extensions) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run(extensions)),
        Err(e) => {
            eprintln!("baton: cannot start a Tokio runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(extensions: Extensions) -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Dev {
            addr,
            script,
            agents,
            users,
            aws: true,
            yes_real_aws,
        } => {
            init_tracing();
            let config = match config() {
                Ok(c) => c,
                Err(code) => return code,
            };
            if config.aws.sdk.endpoint.is_none() && !yes_real_aws {
                return refuse(
                    "AWS_ENDPOINT_URL is not set, so --aws would create tables, queues and a bus \
                     in your real AWS account. Point AWS_ENDPOINT_URL at an emulator (moto, \
                     LocalStack), or pass --yes-real-aws to mean it.",
                );
            }
            let users = match read_users(users.as_deref()) {
                Ok(u) => u,
                Err(e) => return refuse(e),
            };
            match aws::dev(addr, cli.token, script, agents, users, &config, &extensions).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => refuse(format!("{e:#}")),
            }
        }
        Command::Preflight {
            stack_name,
            parameter_overrides,
            template,
        } => {
            let config = match config() {
                Ok(c) => c,
                Err(code) => return code,
            };
            let params = match preflight::overrides(&parameter_overrides) {
                Ok(p) => p,
                Err(e) => return refuse(e),
            };
            let text = match &template {
                Some(path) => match std::fs::read_to_string(path) {
                    Ok(t) => t,
                    Err(e) => return refuse(format!("{}: {e}", path.display())),
                },
                None => baton_dev::functions::TEMPLATE.to_owned(),
            };
            let sdk = baton_aws::sdk::sdk_config(&config.aws.sdk).await;
            match preflight::check(&sdk, &text, &params, &stack_name).await {
                Ok(report) => {
                    for line in &report.lines {
                        println!("{line}");
                    }
                    if report.fits {
                        println!("baton preflight: the account can run this stack");
                        ExitCode::SUCCESS
                    } else {
                        println!("baton preflight: change what the NO lines say before deploying");
                        ExitCode::FAILURE
                    }
                }
                Err(e) => refuse(format!("preflight: {e:#}")),
            }
        }
        Command::Bootstrap { prefix } => match match config() {
            Ok(config) => aws::bootstrap(&prefix, &config).await,
            Err(code) => return code,
        } {
            Ok(env) => {
                println!("{env}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("baton: bootstrap failed: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Dev {
            addr,
            script,
            agents,
            users,
            aws: false,
            ..
        } => {
            init_tracing();
            let config = match config() {
                Ok(c) => c,
                Err(code) => return code,
            };
            let users = match read_users(users.as_deref()) {
                Ok(u) => u,
                Err(e) => return refuse(e),
            };
            match dev(
                addr,
                cli.data.unwrap_or_else(default_data),
                cli.token,
                script,
                agents,
                users,
                &config,
                &extensions,
            )
            .await
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => refuse(e),
            }
        }
        Command::Bench(args) => bench_cmd::run(args, cli.data).await,
        Command::New(args) => new::run(&args),
        Command::Template => {
            print!("{TEMPLATE}");
            ExitCode::SUCCESS
        }
        command => {
            let data = cli.data.unwrap_or_else(default_data);
            client::run(&cli.endpoint, cli.token, &data, cli.json, command).await
        }
    }
}

/// The agents and the model `baton dev` runs with: scripted, or every provider routed by
/// `provider:model-id`. The agents file is `--agents`, else `BATON_AGENTS_FILE`; its MCP
/// servers, HTTP tools and `httpFetch` are built here (stdio servers allowed: this is dev),
/// beside the project's own tools, plugins and agents (`extensions`), as its Lambda functions
/// have them.
pub(crate) async fn model_and_agents(
    script: Option<&std::path::Path>,
    agents: Option<&std::path::Path>,
    config: &Settings,
    extensions: &Extensions,
) -> anyhow::Result<(Arc<dyn Llm>, Arc<Catalog>)> {
    let catalog = Arc::new(baton_tools::load_catalog(
        agents,
        config,
        baton_tools::Host::Dev,
        extensions,
    )?);
    let llm: Arc<dyn Llm> = match script {
        Some(path) => {
            println!("baton dev: scripted model from {}", path.display());
            Arc::new(ScriptedLlm::load(path)?.priced_as(&config.model.model))
        }
        None => {
            let providers = catalog.providers(&config.model.model);
            say_models(config, &catalog);
            // Bedrock needs the AWS SDK's config (credentials, region): loaded only when a
            // model is Bedrock's, so that `baton dev` never waits on an AWS lookup otherwise.
            let bedrock = match providers.contains("bedrock") {
                true => Some(aws_sdk_bedrockruntime::config::Builder::from(
                    &baton_aws::sdk::sdk_config(&config.aws.sdk).await,
                )),
                false => None,
            };
            Arc::new(Models::for_providers(
                &config.model,
                &providers,
                bedrock.as_ref(),
                None,
            )?)
        }
    };
    Ok((llm, catalog))
}

/// Says which models `baton dev` will call, where, and for which agents; warns (on stderr)
/// for each provider whose key is not set.
fn say_models(config: &Config, catalog: &Catalog) {
    let m = &config.model;
    let mut missing = std::collections::BTreeSet::new();
    for (model, agents) in catalog.models(&m.model) {
        let (provider, _) = split_model(&model);
        let r#where = match provider {
            "anthropic" => {
                if m.anthropic_api_key.is_none() {
                    missing.insert((
                        "ANTHROPIC_API_KEY",
                        "Anthropic refuses every call without one",
                    ));
                }
                m.anthropic_base_url.clone()
            }
            "bedrock" => "Amazon Bedrock, with your AWS credentials".to_owned(),
            _ => {
                if m.api_key.is_none() {
                    missing.insert((
                        "OPENAI_API_KEY",
                        "fine for a local server (Ollama, vLLM); OpenAI refuses every call without one",
                    ));
                }
                m.base_url.clone()
            }
        };
        let default = agents
            .iter()
            .any(|a| catalog.agent(a).is_some_and(|d| d.model.is_none()));
        println!(
            "baton dev: model {model} at {where}{} for {}",
            if default { " (BATON_MODEL)" } else { "" },
            agents.join(", ")
        );
    }
    for (var, why) in missing {
        eprintln!("baton dev: warning: {var} is not set ({why})");
    }
}

/// The users of `--users FILE`, checked (none without one).
fn read_users(path: Option<&std::path::Path>) -> anyhow::Result<Vec<baton_api::TokenUser>> {
    let Some(path) = path else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--users {}: {e}", path.display()))?;
    let file = baton_api::UsersFile::parse(&text, baton_dev::LOCAL_OWNER)
        .map_err(|e| anyhow::anyhow!("--users {}: {e}", path.display()))?;
    Ok(file.users)
}

/// With a users file, every assignee the agents name (who answers their questions, and whom
/// they escalate to) is someone in it: the server's owner, a user it lists, or a group one
/// of them is in. A name that matches no one would leave a question nobody but its owner can
/// answer: a start-up error naming it.
pub(crate) fn check_assignees(
    catalog: &baton_core::agent::Catalog,
    users: &[baton_api::TokenUser],
) -> anyhow::Result<()> {
    if users.is_empty() {
        return Ok(());
    }
    for name in catalog.agent_names() {
        let Some(agent) = catalog.agent(name) else {
            continue;
        };
        let policies = agent
            .approval
            .values()
            .filter_map(|p| p.assignment.as_ref())
            .chain([&agent.questions]);
        for principal in policies.flat_map(|q| q.assignees.iter().chain(&q.escalate_to)) {
            let known = match principal.split_once(':') {
                Some(("user", u)) => {
                    u == baton_dev::LOCAL_OWNER || users.iter().any(|x| x.user == u)
                }
                Some(("group", g)) => users.iter().any(|x| x.groups.iter().any(|have| have == g)),
                _ => false,
            };
            if !known {
                anyhow::bail!(
                    "agent `{name}` assigns questions to `{principal}`, whom the users file does \
                     not know (its users: {})",
                    users
                        .iter()
                        .map(|u| u.user.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn dev(
    addr: SocketAddr,
    data: PathBuf,
    token: Option<String>,
    script: Option<PathBuf>,
    agents: Option<PathBuf>,
    users: Vec<baton_api::TokenUser>,
    config: &Settings,
    extensions: &Extensions,
) -> anyhow::Result<()> {
    let (llm, catalog) =
        model_and_agents(script.as_deref(), agents.as_deref(), config, extensions).await?;
    check_assignees(&catalog, &users)?;
    // Traces go to OTEL_EXPORTER_OTLP_ENDPOINT when it is set; none are made otherwise.
    let traces = baton_telemetry::Traces::from_env("baton-dev")?;
    let server = LocalServer::start(LocalOptions {
        addr,
        token,
        worker: WorkerOptions {
            in_a_row: config
                .steps_in_a_row
                .map_or(baton_core::service::STEPS_IN_A_ROW, |n| n as usize),
            ..WorkerOptions::default()
        },
        link_key: config.link_key.clone(),
        public_url: config.public_url.clone(),
        cache_bytes: config.cache_bytes(baton_dev::machine_memory_mb()),
        traces: traces.map(Arc::new),
        quotas: baton_core::service::Quotas {
            active_runs: config.max_active_runs_per_owner,
            daily_cost_usd: config.max_daily_cost_usd_per_owner,
        },
        users,
        smtp_url: config.smtp_url.clone(),
        ..LocalOptions::new(data.clone(), llm, catalog)
    })
    .await?;
    println!(
        "baton dev: listening on {} (data in {})",
        server.url(),
        data.display()
    );
    if server.token_created {
        println!(
            "baton dev: new token {} (stored in {})",
            server.token,
            baton_dev::token_path(&data).display()
        );
    }
    server.serve_until_signal().await;
    Ok(())
}
