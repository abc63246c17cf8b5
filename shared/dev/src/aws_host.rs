//! `baton dev --aws`: the same API, with the Lambda handlers fed by in-process event source
//! mappings, over AWS APIs (an emulator at `AWS_ENDPOINT_URL`, or an account). Resources are
//! created on start if missing.

use std::net::SocketAddr;
use std::sync::Arc;

use baton_api::{AppState, Authenticator, BearerToken};
use baton_core::agent::Catalog;
use baton_core::error::PortError;
use baton_core::links::Links;
use baton_core::llm::Llm;
use baton_core::ports::Clock;
use baton_core::service::Service;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

use crate::host::{LOCAL_OWNER, StartError};

/// `baton dev --aws`: the same API and in-process event source mappings, over AWS APIs (an emulator at
/// `AWS_ENDPOINT_URL`, or an account). Resources are created on start if missing.
#[derive(Clone)]
pub struct AwsDevOptions {
    /// Each owner's quotas (`BATON_MAX_ACTIVE_RUNS_PER_OWNER`,
    /// `BATON_MAX_DAILY_COST_USD_PER_OWNER`).
    pub quotas: baton_core::service::Quotas,
    pub sdk: aws_config::SdkConfig,
    pub names: baton_aws::provision::Names,
    pub scheduler_role_arn: String,
    pub addr: SocketAddr,
    pub token: String,
    pub llm: Arc<dyn Llm>,
    pub catalog: Arc<Catalog>,
    pub clock: Arc<dyn Clock>,
    /// Deliver every message twice (to prove duplicates change nothing).
    pub duplicate: bool,
    /// The functions as a stack's template gives them (their timeouts, memory, mappings and
    /// whether they may loop); `None`: as this build's `template.yaml` deploys them.
    pub functions: Option<crate::functions::Functions>,
    /// Every function's timeout shortened to at most this (`BATON_DEV_FUNCTION_TIMEOUT_S`);
    /// `None`: each function's own, from `template.yaml`.
    pub function_timeout: Option<std::time::Duration>,
    /// How many runs of a batch the step functions step at once (`BATON_STEPS_AT_ONCE`);
    /// `None`: what each function's memory allows (`steps_at_once`).
    pub steps_at_once: Option<usize>,
    /// How many steps of one run the step functions take in a row (`BATON_STEPS_IN_A_ROW`);
    /// `None`: `STEPS_IN_A_ROW`.
    pub steps_in_a_row: Option<usize>,
    /// The live channel as on AWS (an AppSync Events API, or a stand-in of one), with the
    /// signer of its watch tokens; `None` keeps live events in this process.
    pub live: Option<(
        baton_aws::settings::LiveConfig,
        baton_core::live::grant::Grants,
    )>,
    /// One-time answer links (`BATON_LINK_KEY`, at least 32 bytes; `BATON_PUBLIC_URL`, else
    /// this server's own address), set up before the first request is served; `None`:
    /// links are off (`POST /ctas/{id}/link` answers 409 `links_off`). A key shorter than
    /// 32 bytes fails the start.
    pub links: Option<(String, Option<String>)>,
    /// Where the step functions' spans are exported (`OTEL_EXPORTER_OTLP_ENDPOINT`), as
    /// `baton dev` does.
    pub traces: Option<Arc<baton_telemetry::Traces>>,
    /// The users of `--users FILE`, as `baton dev` takes them.
    pub users: Vec<baton_api::TokenUser>,
}

impl AwsDevOptions {
    /// `baton dev --aws` on loopback (any free port) over the resources `names` names, with
    /// `sdk`, serving `token`, its timers run by `scheduler_role_arn`: each function as
    /// `template.yaml` deploys it, the system clock, no links, live channel, traces or
    /// quotas. Set the rest on what it returns.
    pub fn new(
        sdk: aws_config::SdkConfig,
        names: baton_aws::provision::Names,
        scheduler_role_arn: impl Into<String>,
        token: impl Into<String>,
        llm: Arc<dyn Llm>,
        catalog: Arc<Catalog>,
    ) -> Self {
        Self {
            quotas: Default::default(),
            sdk,
            names,
            scheduler_role_arn: scheduler_role_arn.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: token.into(),
            llm,
            catalog,
            clock: Arc::new(baton_core::ports::SystemClock),
            duplicate: false,
            functions: None,
            function_timeout: None,
            steps_at_once: None,
            steps_in_a_row: None,
            live: None,
            links: None,
            traces: None,
            users: Vec::new(),
        }
    }
}

pub struct AwsDevServer {
    pub addr: SocketAddr,
    pub token: String,
    /// The `api` function's service (the others share its table, queues and bus).
    pub service: Arc<Service>,
    /// The step functions' services (`orchestrator`, `subagent`), observed by one set of
    /// counters (`GET /metrics`) and, with [`AwsDevOptions::traces`], one exporter.
    steps: [Arc<Service>; 2],
    /// The `events` function's service (answers from the bus, expiries, timers, the sweep).
    events: Arc<Service>,
    /// The grants of watches on the live channel, when it is outside the process (the
    /// `api` function's, for a router served as API Gateway serves it).
    pub watchers: Option<Arc<dyn baton_core::live::grant::Watchers>>,
    pub provisioned: baton_aws::provision::Provisioned,
    pub meter: Arc<baton_aws::sdk::Meter>,
    stop: watch::Sender<bool>,
    server: JoinHandle<std::io::Result<()>>,
    pump: JoinHandle<()>,
    /// The event source mappings, for [`AwsDevServer::add_pollers`].
    sources: crate::event_source::EventSources,
    pollers: Vec<JoinHandle<()>>,
    exports: Vec<JoinHandle<()>>,
}

impl AwsDevServer {
    pub async fn start(opts: AwsDevOptions) -> Result<Self, StartError> {
        use crate::event_source::{Consumer, EventSource, EventSources, Feeds};
        let provisioned =
            baton_aws::provision::ensure(&opts.sdk, &opts.names, &opts.scheduler_role_arn).await?;
        let meter = baton_aws::sdk::Meter::shared();
        // As each function does at its cold start: a table a newer release wrote is refused.
        baton_aws::dynamo::DynamoStore::new(
            aws_sdk_dynamodb::Client::new(&opts.sdk),
            &provisioned.config.table,
            provisioned.config.retention_days,
            meter.clone(),
        )
        .claim_format()
        .await?;
        // Everything is set up before the first request is served and the first message is
        // taken: the port is bound first (its address is the links' base), then each
        // function's service is built with its links, live channel and observers, then the
        // mappings, and only then the server.
        let bound = baton_api::Bound::bind(opts.addr).map_err(StartError::Io)?;
        let addr = bound.addr;
        // (The crash suite holds a start here, its port bound, to show nothing is served.)
        let _ = baton_core::failpoint::pass("host.before_links").await;
        let links = match &opts.links {
            None => None,
            Some((key, public_url)) => {
                let base = public_url
                    .clone()
                    .unwrap_or_else(|| format!("http://{addr}"));
                let links = Links::new(key.as_bytes(), &base).map_err(|e| {
                    StartError::Io(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("BATON_LINK_KEY: {e}"),
                    ))
                })?;
                info!(base = %links.base_url, "one-time answer links on");
                Some(links)
            }
        };
        // The step functions' live events reach the API's streams in this process, or go
        // through the live channel as on AWS.
        let step_functions = ["OrchestratorFunction", "SubagentFunction"];
        let (step_live, live, watchers) = match &opts.live {
            None => {
                let hub = baton_api::live::Hub::new();
                let step_live: Vec<Arc<dyn baton_core::live::Live>> =
                    vec![hub.clone(), hub.clone()];
                (step_live, Some(hub), None)
            }
            Some((live, grants)) => {
                let mut step_live: Vec<Arc<dyn baton_core::live::Live>> = Vec::new();
                for name in step_functions {
                    let sdk = as_function(&opts.sdk, name);
                    let (Some(credentials), Some(region)) =
                        (sdk.credentials_provider(), sdk.region())
                    else {
                        return Err(StartError::Io(std::io::Error::other(
                            "the live channel needs credentials and a region",
                        )));
                    };
                    step_live.push(baton_aws::appsync::AppSyncLive::start(
                        baton_aws::appsync::Publisher {
                            url: live.publish_url.clone(),
                            region: region.to_string(),
                            credentials,
                        },
                    ));
                }
                let sdk = as_function(&opts.sdk, "ApiFunction");
                let watchers: Arc<dyn baton_core::live::grant::Watchers> =
                    Arc::new(baton_aws::watch::AppSyncWatchers {
                        store: baton_aws::dynamo::DynamoStore::new(
                            aws_sdk_dynamodb::Client::new(&sdk),
                            &provisioned.config.table,
                            provisioned.config.retention_days,
                            meter.clone(),
                        ),
                        grants: grants.clone(),
                        live: live.clone(),
                    });
                (step_live, None, Some(watchers))
            }
        };
        // On Lambda each step function writes EMF lines; here, as `baton dev`, counters.
        let metrics = Arc::new(baton_telemetry::Metrics::prometheus());
        // As on Lambda, each function has its own clients and its own service (caches
        // included); its AWS calls carry its name in their user agent (`app/ApiFunction`;
        // on Lambda, the function's name): a proxy in front of the emulator can tell which
        // function called what (the tests check that against the function's IAM policy).
        // What each function sends, counted along its chain of invocations (Lambda's
        // recursive loop detection: `loops.rs`).
        let lineage = crate::loops::Lineage::default();
        let notifier = crate::host::notifier()?;
        let function = |name: &str, live: Option<Arc<dyn baton_core::live::Live>>| {
            let sdk = as_function(&opts.sdk, name);
            let mut deps = baton_aws::aws_deps(
                &provisioned.config,
                &sdk,
                opts.llm.clone(),
                opts.clock.clone(),
                meter.clone(),
            );
            deps.queue = lineage.counting(deps.queue);
            // Every function counts: the step functions their steps, every one the effects
            // that failed after a commit, the events function the outboxes a sweep could
            // not repair (on Lambda, EMF lines: `baton-lambda`'s `OutboxMetrics`).
            let mut service = Service::builder(deps, opts.catalog.clone())
                .quotas(opts.quotas)
                .notifier(notifier.clone())
                .links(links.clone())
                .live(live)
                .observer(metrics.clone());
            // As on Lambda, questions' e-mail goes out through SES where their timers fire.
            if name == "EventsFunction" {
                service = service.mailer(Arc::new(baton_aws::ses::SesMailer::new(&sdk)));
            }
            if step_functions.contains(&name)
                && let Some(traces) = &opts.traces
            {
                service = service.observer(traces.clone());
            }
            Consumer {
                sqs: aws_sdk_sqs::Client::new(&sdk),
                service: Arc::new(service.build()),
            }
        };
        let mut step_live = step_live.into_iter();
        let api = function("ApiFunction", None);
        let orchestrator = function(step_functions[0], step_live.next());
        let subagent = function(step_functions[1], step_live.next());
        let events = function("EventsFunction", None);
        // Each function as the template deploys it (its timeout, memory and mappings).
        let mut functions = match opts.functions.clone() {
            Some(f) => f,
            None => crate::functions::Functions::deployed()?,
        };
        if let Some(t) = opts.function_timeout {
            functions = functions.timeouts_at_most(t);
        }
        let c = &provisioned.config;
        let mut queues = Vec::new();
        for (url, feeds, by, queue) in [
            (
                c.steps_queue_url.as_str(),
                Feeds::Steps,
                &orchestrator,
                "StepsQueue",
            ),
            (
                c.subagent_queue_url.as_str(),
                Feeds::Steps,
                &subagent,
                "SubagentStepsQueue",
            ),
            (
                provisioned.cta_inbox_url.as_str(),
                Feeds::CtaInbox,
                &events,
                "CtaInboxQueue",
            ),
        ] {
            let function = functions.fed_by(queue)?;
            queues.push((
                EventSources::queue(&by.sqs, url, feeds, function).await?,
                by.clone(),
            ));
        }
        // The step functions also read their dead-letter queues (the inbox's is kept).
        for ((dlq, by), queue) in provisioned.dead_letters[..2]
            .iter()
            .zip([&orchestrator, &subagent])
            .zip(["StepsDeadLetterQueue", "SubagentStepsDeadLetterQueue"])
        {
            let source = EventSource {
                url: dlq.url.clone(),
                arn: dlq.arn.clone(),
                feeds: Feeds::DeadLetters,
                visibility: None,
                function: functions.fed_by(queue)?,
            };
            queues.push((source, by.clone()));
        }
        let sources = EventSources::each(queues)
            .counting_hops(lineage)
            .duplicating(opts.duplicate)
            .stepping_at_once(opts.steps_at_once)
            .stepping_in_a_row(opts.steps_in_a_row);
        let pump = sources.clone();
        let service = api.service;
        let steps = [orchestrator.service, subagent.service];
        let events = events.service;
        let (stop, stop_rx) = watch::channel(false);
        let pump = tokio::spawn(pump.run(stop_rx.clone()));
        let exports = opts
            .traces
            .map(|t| vec![crate::host::export_spans(t, stop_rx.clone())])
            .unwrap_or_default();
        let auth: Arc<dyn Authenticator> = Arc::new(
            BearerToken::new(opts.token.clone(), LOCAL_OWNER).with_users(opts.users.clone()),
        );
        let app = baton_api::router(AppState {
            service: service.clone(),
            auth: auth.clone(),
            streams: true,
            stop: Some(stop_rx.clone()),
            live,
            watchers: watchers.clone(),
        })
        .merge(crate::host::metrics_route(metrics, auth));
        let server = bound.serve(app, stop_rx);
        info!(%addr, table = %provisioned.config.table, "baton dev --aws listening");
        Ok(Self {
            addr,
            token: opts.token,
            service,
            steps,
            events,
            watchers,
            provisioned,
            meter,
            stop,
            server,
            pump,
            sources,
            pollers: Vec::new(),
            exports,
        })
    }

    /// Polls each step queue with `n` more pollers, as Lambda's event source mappings scale
    /// out with the number of message groups waiting (one poller over every queue is what
    /// `baton dev --aws` needs; `baton bench --aws --runs` runs many runs at once).
    pub fn add_pollers(&mut self, n: usize) {
        for pump in self.sources.pollers_of_steps(n) {
            self.pollers
                .push(tokio::spawn(pump.run(self.stop.subscribe())));
        }
    }

    /// How many invocations were ended at their function's timeout so far.
    pub fn invocations_ended(&self) -> u64 {
        self.sources.invocations_ended()
    }

    /// How many invocations Lambda's recursive loop detection would have stopped so far.
    pub fn loops_stopped(&self) -> u64 {
        self.sources.loops_stopped()
    }

    /// What the functions' invocations so far would be billed on Lambda, with their
    /// mappings' SQS requests.
    pub fn billed(&self) -> crate::event_source::Billed {
        self.sources.billed()
    }

    /// The steps the step functions have taken so far: (warm, cold), as their caches saw
    /// them.
    pub fn steps_taken(&self) -> (u64, u64) {
        self.steps.iter().fold((0, 0), |(w, c), s| {
            let (sw, sc) = s.steps().cache_use();
            (w + sw, c + sc)
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `events` function's service: the one that performs an outbox late (a test acts
    /// as it, with its role's grants).
    pub fn events_service(&self) -> &Arc<Service> {
        &self.events
    }

    /// The sweep, as its scheduled rule has the `events` function run it: performs the
    /// outboxes outstanding for longer than `older_than`.
    pub async fn sweep(&self, older_than: chrono::Duration) -> Result<usize, PortError> {
        self.events.steps().sweep(older_than).await
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
        let _ = self.pump.await;
        for p in self.pollers.into_iter().chain(self.exports) {
            let _ = p.await;
        }
    }
}

/// `sdk` for the function `name`: its calls say so in their user agent.
fn as_function(sdk: &aws_config::SdkConfig, name: &str) -> aws_config::SdkConfig {
    match aws_config::AppName::new(name.to_owned()) {
        Ok(app) => sdk.to_builder().app_name(app).build(),
        Err(_) => sdk.clone(),
    }
}
