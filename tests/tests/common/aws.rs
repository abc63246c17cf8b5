//! The AWS the scenario tests run against. By default each test starts its own moto server
//! (`moto.rs`). Two settings make the same tests meet a harder AWS:
//!
//! - `BATON_TEST_AWS_ENDPOINT=http://127.0.0.1:4566`: an emulator already running there
//!   (LocalStack, as `tests/localstack/run.sh` starts it), shared by every test; each test's
//!   resources then get a name of their own.
//! - `BATON_TEST_FAULTS=1` (or `throttle=0.1,errors=0.02,early,drop=0.1`): the code under
//!   test talks to AWS through the fault layer (`fault.rs`), which throttles and fails that
//!   share of every operation once the resources exist, fires schedules anywhere in their
//!   minute and drops that share of firings to their dead-letter queue (`1`: 10% throttled,
//!   2% server errors, each schedule's first firing 59 s early, none dropped).
//!
//! The AWS scenarios (the `aws_*` suites, the AWS half of `plans`) start their
//! emulator with [`Emulator::scenario`]: they meet the faults of `1` unless
//! `BATON_TEST_FAULTS` says otherwise (`0`: calm), so every run of the test command holds
//! them to a throttling, failing AWS. Every other test meets faults only when it asks for
//! them, or when `BATON_TEST_FAULTS` is set.
//!
//! The test's own calls (reading what the code wrote) always go straight to the emulator.

use aws_config::SdkConfig;
use baton_aws::provision::Names;

use super::fault::{Faults, FaultyAws};
use super::moto::Moto;

pub struct Emulator {
    /// The emulator itself.
    pub url: String,
    /// The fault layer in front of it, if the test or `BATON_TEST_FAULTS` asked for one.
    pub faulty: Option<FaultyAws>,
    /// Without faults, the layer all the same, with none: DynamoDB's per-item isolation,
    /// which moto lacks (`fault.rs`).
    isolated: Option<FaultyAws>,
    /// Whether other tests share this emulator (its resources need names of their own).
    shared: bool,
    _moto: Option<Moto>,
}

impl Emulator {
    /// The emulator the settings above name, with the faults `BATON_TEST_FAULTS` names.
    pub async fn start() -> Emulator {
        Self::start_with(faults_from_env()).await
    }

    /// The emulator for an AWS scenario: with [`scenario_faults`].
    pub async fn scenario() -> Emulator {
        Self::start_with(scenario_faults()).await
    }

    /// The emulator the settings name, with these faults (or none) whatever
    /// `BATON_TEST_FAULTS` says: for the tests that are about one fault.
    pub async fn start_with(faults: Option<Faults>) -> Emulator {
        let (url, moto, shared) = match std::env::var("BATON_TEST_AWS_ENDPOINT") {
            Ok(url) if !url.is_empty() => (url.trim_end_matches('/').to_owned(), None, true),
            _ => {
                let moto = Moto::start();
                (moto.url.clone(), Some(moto), false)
            }
        };
        let faulty = match faults {
            Some(f) => Some(FaultyAws::start(&url, f).await),
            None => None,
        };
        let isolated = match faulty {
            Some(_) => None,
            None => Some(FaultyAws::start(&url, Faults::isolation_only()).await),
        };
        Emulator {
            url,
            faulty,
            isolated,
            shared,
            _moto: moto,
        }
    }

    /// For the test's own calls: straight to the emulator.
    pub async fn sdk(&self) -> SdkConfig {
        sdk_for(&self.url).await
    }

    /// For the code under test: through the fault layer (with no faults, if none).
    pub async fn host_sdk(&self) -> SdkConfig {
        match self.faulty.as_ref().or(self.isolated.as_ref()) {
            Some(f) => f.sdk().await,
            None => self.sdk().await,
        }
    }

    /// Starts or ends an outage of `service` for the code under test
    /// ([`FaultyAws::outage`]).
    pub fn outage(&self, service: &'static str, down: bool) {
        if let Some(f) = self.faulty.as_ref().or(self.isolated.as_ref()) {
            f.outage(service, down);
        }
    }

    /// Turns the faults on, once the resources exist (creating them is CloudFormation's
    /// job on AWS, not the code's).
    pub fn turn_on(&self) {
        if let Some(f) = &self.faulty {
            f.turn_on();
        }
    }

    /// Turns them off while a test sets up again (a restarted host's resources).
    pub fn turn_off(&self) {
        if let Some(f) = &self.faulty {
            f.turn_off();
        }
    }

    /// Whether faults are in play (the test's clients then retry a 503, as careful
    /// clients do).
    pub fn faulty(&self) -> bool {
        self.faulty.is_some()
    }

    /// Names for the resources of `prefix`: the prefix itself on an emulator of the test's
    /// own, one no other test (nor an earlier run) uses on a shared one.
    /// Lets SES send from `address` (as verifying it does on AWS; both emulators refuse a
    /// sender that is not).
    pub async fn verify_sender(&self, address: &str) {
        aws_sdk_ses::Client::new(&self.sdk().await)
            .verify_email_identity()
            .email_address(address)
            .send()
            .await
            .expect("VerifyEmailIdentity");
    }

    /// The e-mail SES has sent, each as `{from, to: [..], subject, text}`: moto's record of
    /// its messages (`/moto-api/data.json`), or LocalStack's (`/_aws/ses`).
    pub async fn sent_mail(&self) -> Vec<serde_json::Value> {
        let http = reqwest::Client::new();
        let get = async |path: &str| -> Option<serde_json::Value> {
            let r = http.get(format!("{}{path}", self.url)).send().await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            r.json().await.ok()
        };
        if let Some(data) = get("/moto-api/data.json").await {
            return data["ses"]["Message"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    serde_json::json!({"from": m["source"], "to": m["destinations"]["ToAddresses"],
                        "subject": m["subject"], "text": m["body"]})
                })
                .collect();
        }
        let data = get("/_aws/ses").await.expect("the emulator's sent e-mail");
        data["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                serde_json::json!({"from": m["Source"], "to": m["Destination"]["ToAddresses"],
                    "subject": m["Subject"], "text": m["Body"]["text_part"]})
            })
            .collect()
    }

    pub fn names(&self, prefix: &str) -> Names {
        if !self.shared {
            return Names::new(prefix);
        }
        let unique = uuid::Uuid::new_v4().simple().to_string();
        Names::new(format!("{prefix}-{}", &unique[..10]))
    }
}

/// An SDK config for an emulator at `url` (moto, or the fault layer in front of it).
pub async fn sdk_for(url: &str) -> SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(url)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "test", "test", None, None, "moto",
        ))
        .load()
        .await
}

/// `BATON_TEST_FAULTS`, read as above; unset, empty or `0` is none. A setting it cannot
/// read stops the test, saying so.
pub fn faults_from_env() -> Option<Faults> {
    parse_faults(&std::env::var("BATON_TEST_FAULTS").unwrap_or_default())
}

/// The faults an AWS scenario meets: `BATON_TEST_FAULTS`'s when it is set (`0`: none), else
/// those of `1`.
pub fn scenario_faults() -> Option<Faults> {
    match std::env::var("BATON_TEST_FAULTS") {
        Ok(spec) if !spec.trim().is_empty() => parse_faults(&spec),
        _ => parse_faults("1"),
    }
}

fn parse_faults(spec: &str) -> Option<Faults> {
    let spec = spec.trim();
    if spec.is_empty() || spec == "0" {
        return None;
    }
    if spec == "1" {
        return Some(Faults {
            throttle: 0.10,
            server_error: 0.02,
            early_first_firing: true,
            ..Faults::default()
        });
    }
    let mut f = Faults::default();
    for part in spec.split(',').map(str::trim) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let rate = || {
            v.parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .unwrap_or_else(|| panic!("BATON_TEST_FAULTS: `{part}` needs a rate in 0..=1"))
        };
        match k {
            "throttle" => f.throttle = rate(),
            "errors" => f.server_error = rate(),
            "early" => f.early_first_firing = true,
            "drop" => f.drop_firings = rate(),
            "seed" => {
                f.seed = v
                    .parse()
                    .unwrap_or_else(|_| panic!("BATON_TEST_FAULTS: `{part}`"))
            }
            _ => panic!(
                "BATON_TEST_FAULTS: unknown `{part}` (throttle=, errors=, early, drop=, seed=)"
            ),
        }
    }
    Some(f)
}

/// How long a scenario may wait for what it expects: `calm`, or four times that under
/// [`scenario_faults`] (a step that meets a throttle the SDK's own retries did not absorb
/// waits out its backoff, 30 s the first time).
pub fn patience(calm: std::time::Duration) -> std::time::Duration {
    if scenario_faults().is_some() {
        calm * 4
    } else {
        calm
    }
}

/// One call to the API at `base`, as a careful client makes it when `retry_busy`: a 503
/// ("busy; try again") is tried again, up to five times, with the same `Idempotency-Key`,
/// so a retried request never does its work twice.
pub async fn api_call(
    http: &reqwest::Client,
    base: &str,
    retry_busy: bool,
    method: reqwest::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    api_call_as(super::TOKEN, http, base, retry_busy, method, path, body).await
}

/// [`api_call`] with the bearer token `token`.
pub async fn api_call_as(
    token: &str,
    http: &reqwest::Client,
    base: &str,
    retry_busy: bool,
    method: reqwest::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let key = format!("test-{}-{n}", std::process::id());
    let mut attempt = 0;
    loop {
        let mut rb = http
            .request(method.clone(), format!("{base}{path}"))
            .bearer_auth(token)
            .header("Idempotency-Key", &key);
        if let Some(b) = body {
            rb = rb.json(b);
        }
        let r = rb.send().await.expect("the API answers");
        let code = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        attempt += 1;
        if code == 503 && retry_busy && attempt < 5 {
            tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
            continue;
        }
        let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        return (code, v);
    }
}

impl Emulator {
    /// `baton dev --aws` over this emulator (through its fault layer, if any, once the
    /// resources exist), its resources named by `prefix`, thinking with `llm`.
    pub async fn dev_host(
        &self,
        prefix: &str,
        llm: std::sync::Arc<dyn baton_core::llm::Llm>,
        catalog: std::sync::Arc<baton_core::agent::Catalog>,
    ) -> baton_dev::AwsDevServer {
        self.dev_host_named(self.names(prefix), llm, catalog).await
    }

    /// [`Emulator::dev_host`] over the resources `names` name (a host started again).
    pub async fn dev_host_named(
        &self,
        names: Names,
        llm: std::sync::Arc<dyn baton_core::llm::Llm>,
        catalog: std::sync::Arc<baton_core::agent::Catalog>,
    ) -> baton_dev::AwsDevServer {
        self.dev_host_at(names, llm, catalog, 0).await
    }

    /// [`Emulator::dev_host_named`] on loopback port `port` (0: any free one).
    pub async fn dev_host_at(
        &self,
        names: Names,
        llm: std::sync::Arc<dyn baton_core::llm::Llm>,
        catalog: std::sync::Arc<baton_core::agent::Catalog>,
        port: u16,
    ) -> baton_dev::AwsDevServer {
        let options = self.dev_options(names, llm, catalog, port).await;
        self.dev_host_from(options).await
    }

    /// How the tests start `baton dev --aws` over the resources `names` name, on loopback
    /// port `port` (0: any free one), with the test token and a link key.
    pub async fn dev_options(
        &self,
        names: Names,
        llm: std::sync::Arc<dyn baton_core::llm::Llm>,
        catalog: std::sync::Arc<baton_core::agent::Catalog>,
        port: u16,
    ) -> baton_dev::AwsDevOptions {
        let role = format!("arn:aws:iam::123456789012:role/{}-scheduler", names.prefix);
        baton_dev::AwsDevOptions {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            links: Some(("a-link-key-of-at-least-thirty-two-bytes".into(), None)),
            users: super::test_users(),
            ..baton_dev::AwsDevOptions::new(
                self.host_sdk().await,
                names,
                role,
                super::TOKEN,
                llm,
                catalog,
            )
        }
    }

    /// `baton dev --aws` started with `options`, its faults then turned on.
    pub async fn dev_host_from(
        &self,
        options: baton_dev::AwsDevOptions,
    ) -> baton_dev::AwsDevServer {
        let host = baton_dev::AwsDevServer::start(options)
            .await
            .expect("baton dev --aws starts");
        self.turn_on();
        host
    }
}

/// A client of either host's API, with the test token (a 503 tried again, see [`api_call`]).
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
    /// The bearer token (the tests' own unless set).
    pub token: String,
    /// Whether a 503 is tried again (as a careful client does under the fault layer).
    pub retry_busy: bool,
    /// How long a wait may take.
    pub patience: std::time::Duration,
    /// How often a wait asks again.
    pub every: std::time::Duration,
}

impl Api {
    pub fn new(base: String) -> Self {
        Self {
            base,
            http: reqwest::Client::new(),
            token: super::TOKEN.into(),
            retry_busy: true,
            patience: std::time::Duration::from_secs(60),
            every: std::time::Duration::from_millis(100),
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        api_call_as(
            &self.token,
            &self.http,
            &self.base,
            self.retry_busy,
            method,
            path,
            body.as_ref(),
        )
        .await
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// A POST with `key` as its `Idempotency-Key`, once (a 503 is the answer): its status
    /// and body.
    pub async fn post_keyed(
        &self,
        path: &str,
        body: serde_json::Value,
        key: &str,
    ) -> (u16, serde_json::Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
            .await
            .expect("the API answers");
        let code = r.status().as_u16();
        (code, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// Asks `f` every [`Api::every`] until it answers, for up to [`Api::patience`].
    pub async fn wait<T>(&self, what: &str, mut f: impl AsyncFnMut(&Api) -> Option<T>) -> T {
        super::wait_for(what, self.patience, self.every, async || f(self).await).await
    }

    /// A GET that must answer 200; its body.
    pub async fn get_ok(&self, path: &str) -> serde_json::Value {
        let (code, v) = self.get(path).await;
        assert_eq!(code, 200, "GET {path}: {v}");
        v
    }

    /// A POST that must be accepted (202); its body.
    pub async fn post_ok(&self, path: &str, body: serde_json::Value) -> serde_json::Value {
        let (code, v) = self.post(path, body).await;
        assert_eq!(code, 202, "POST {path}: {v}");
        v
    }

    /// The first question of `kind` waiting for an answer, once there is one.
    pub async fn pending(&self, kind: &str) -> serde_json::Value {
        self.wait(kind, async |api: &Api| {
            let (_, v) = api.get("/ctas?status=pending").await;
            v["ctas"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["kind"] == kind).cloned())
        })
        .await
    }

    /// The first question waiting for an answer, once there is one.
    pub async fn pending_cta(&self) -> serde_json::Value {
        self.wait("a question", async |api: &Api| {
            let (_, v) = api.get("/ctas?status=pending").await;
            v["ctas"].as_array().and_then(|c| c.first().cloned())
        })
        .await
    }

    /// The run once it has `status`.
    pub async fn status(&self, run_id: &str, status: &str) -> serde_json::Value {
        let path = format!("/runs/{run_id}");
        self.wait(status, async |api: &Api| {
            let (_, run) = api.get(&path).await;
            (run["status"] == status).then_some(run)
        })
        .await
    }
}

/// A service over the AWS adapters, as a function builds one (without its links, live
/// channel or observers).
pub fn aws_service(
    cfg: &baton_aws::settings::AwsConfig,
    sdk: &aws_config::SdkConfig,
    llm: std::sync::Arc<dyn baton_core::llm::Llm>,
    catalog: std::sync::Arc<baton_core::agent::Catalog>,
    clock: std::sync::Arc<dyn baton_core::ports::Clock>,
    meter: std::sync::Arc<baton_aws::sdk::Meter>,
) -> std::sync::Arc<baton_core::service::Service> {
    let deps = baton_aws::aws_deps(cfg, sdk, llm, clock, meter);
    std::sync::Arc::new(baton_core::service::Service::builder(deps, catalog).build())
}
