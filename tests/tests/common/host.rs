//! The two hosts a scenario drives through its API — `baton dev` ([`LocalHost`]) and
//! `baton dev --aws` over an emulator ([`AwsHost`]) — behind one trait ([`TestHost`]), and
//! one crash-scenario driver for both ([`Crash`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::failpoint;
use baton_core::ports::{Clock, ManualClock};
use baton_dev::{AwsDevOptions, AwsDevServer, LocalOptions};
use serde_json::Value;

use super::Harness;
use super::aws::{Api, Emulator};

/// A host as a scenario sees it: its API, and what a crash does to it.
pub trait TestHost {
    /// A client of the host's API as it runs now (a restart gives it a new address).
    fn api(&self) -> &Api;

    /// A crash and what follows it: the host stops with its in-flight work abandoned, then
    /// starts again over the same state, doing what its deployment does after a crash (on
    /// AWS, the sweep's tick, as its scheduled rule runs it).
    async fn restart(&mut self);

    /// Stops the host once what it holds is handled (a crash in that tail fires now).
    async fn stop(&mut self);

    /// Brings run `run_id`'s question `cta` (as the API shows it) to its expiry, as the
    /// host's timers do: `baton dev`'s worker once its clock passes `expiresAt` (the host's
    /// [`ManualClock`], moved there), the schedule's event on the bus on AWS (at its time:
    /// the emulator fires no schedule).
    async fn expire(&self, run_id: &str, cta: &Value);

    /// Fires run `run_id`'s question timer `name` (a notification's, a reminder's, an
    /// escalation's), due at `due`, as the host's timers do: `baton dev`'s worker once its
    /// clock passes `due` (the host's [`ManualClock`], moved there); on AWS the schedule's
    /// event on the bus, now (the emulator fires no schedule).
    async fn fire(&self, run_id: &str, name: &str, due: chrono::DateTime<chrono::Utc>);
}

fn expires_at(cta: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(cta["expiresAt"].as_str().expect("expiresAt"))
        .expect("an RFC 3339 time")
        .with_timezone(&chrono::Utc)
}

/// `baton dev` on a data directory, started again on the same one after a crash.
pub struct LocalHost {
    options: LocalOptions,
    harness: Option<Harness>,
    api: Api,
    /// The host's clock, when a test moves it ([`LocalHost::with_clock`]).
    clock: Option<Arc<ManualClock>>,
}

impl LocalHost {
    /// `baton dev` started with `options` (see `common::local_options`).
    pub async fn start(options: LocalOptions) -> LocalHost {
        let harness = super::start_from(options.clone()).await;
        let api = Self::api_of(&harness);
        LocalHost {
            options,
            harness: Some(harness),
            api,
            clock: None,
        }
    }

    /// `baton dev` started with `options` on `clock`, which [`TestHost::expire`] moves.
    pub async fn with_clock(mut options: LocalOptions, clock: Arc<ManualClock>) -> LocalHost {
        options.clock = clock.clone();
        LocalHost {
            clock: Some(clock),
            ..LocalHost::start(options).await
        }
    }

    /// Its API as a plain client calls it: no 503 tried again (a crash test's restart alone
    /// must repair what was written), polled every 20 ms for up to 30 s.
    fn api_of(h: &Harness) -> Api {
        let mut api = Api::new(h.server.url());
        api.retry_busy = false;
        api.patience = Duration::from_secs(30);
        api.every = Duration::from_millis(20);
        api
    }

    /// The running server, with its store.
    pub fn h(&self) -> &Harness {
        self.harness.as_ref().expect("the host is running")
    }
}

impl TestHost for LocalHost {
    fn api(&self) -> &Api {
        &self.api
    }

    async fn restart(&mut self) {
        self.stop().await;
        let harness = super::start_from(self.options.clone()).await;
        self.api = Self::api_of(&harness);
        self.harness = Some(harness);
    }

    async fn stop(&mut self) {
        if let Some(h) = self.harness.take() {
            h.server.shutdown().await;
        }
    }

    async fn expire(&self, _run_id: &str, cta: &Value) {
        let clock = self.clock.as_ref().expect("a host started with_clock");
        let past = expires_at(cta) + chrono::Duration::seconds(1) - clock.now();
        clock.advance(past.max(chrono::Duration::zero()));
    }

    async fn fire(&self, _run_id: &str, _name: &str, due: chrono::DateTime<chrono::Utc>) {
        let clock = self.clock.as_ref().expect("a host started with_clock");
        let past = due + chrono::Duration::milliseconds(100) - clock.now();
        clock.advance(past.max(chrono::Duration::zero()));
    }
}

/// `baton dev --aws` over an emulator (through its fault layer, if any, once the resources
/// exist), started again over the same resources after a crash.
pub struct AwsHost {
    pub aws: Arc<Emulator>,
    options: AwsDevOptions,
    server: Option<AwsDevServer>,
    api: Api,
    /// The test's own SDK configuration: straight to the emulator, never through the faults.
    pub sdk: aws_config::SdkConfig,
}

impl AwsHost {
    /// `baton dev --aws` started with `options` (see [`Emulator::dev_options`]), called as a
    /// careful client does under the fault layer: a 503 tried again with the same
    /// `Idempotency-Key`, and waits four times as long, since the layer's refusals send steps
    /// to their backoff.
    pub async fn start(aws: Arc<Emulator>, options: AwsDevOptions) -> AwsHost {
        let server = Self::start_server(&aws, options.clone()).await;
        let api = Self::api_of(&aws, &server);
        let sdk = aws.sdk().await;
        AwsHost {
            aws,
            options,
            server: Some(server),
            api,
            sdk,
        }
    }

    async fn start_server(aws: &Emulator, options: AwsDevOptions) -> AwsDevServer {
        // Creating the resources (again) meets no faults: that is CloudFormation's job.
        aws.turn_off();
        aws.dev_host_from(options).await
    }

    fn api_of(aws: &Emulator, server: &AwsDevServer) -> Api {
        let mut api = Api::new(server.url());
        api.retry_busy = aws.faulty();
        api.patience = Duration::from_secs(if aws.faulty() { 240 } else { 60 });
        api
    }

    /// The names of the resources it runs over.
    pub fn names(&self) -> &baton_aws::provision::Names {
        &self.options.names
    }

    /// The running server.
    pub fn server(&self) -> &AwsDevServer {
        self.server.as_ref().expect("the host is running")
    }

    /// The sweep's tick, as its scheduled rule runs it: a tick that meets a throttle (under
    /// the fault layer) fails, and the next tick runs it again.
    pub async fn sweep(&self) {
        for tick in 1.. {
            match self.server().sweep(chrono::Duration::zero()).await {
                Ok(_) => return,
                Err(e) if e.is_retryable() && tick < 20 => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("the sweep failed {tick} times: {e}"),
            }
        }
    }

    /// Waits until the CTA inbox queue holds nothing, visible or in flight.
    pub async fn inbox_drained(&self) {
        use aws_sdk_sqs::types::QueueAttributeName as Q;
        let sqs = aws_sdk_sqs::Client::new(&self.sdk);
        let url = self.server().provisioned.cta_inbox_url.clone();
        self.api
            .wait("the inbox to drain", async |_: &Api| {
                let attrs = sqs
                    .get_queue_attributes()
                    .queue_url(&url)
                    .attribute_names(Q::All)
                    .send()
                    .await
                    .expect("the inbox's attributes");
                let a = attrs.attributes()?;
                let n = |k| a.get(&k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                (n(Q::ApproximateNumberOfMessages) + n(Q::ApproximateNumberOfMessagesNotVisible)
                    == 0)
                    .then_some(Value::Null)
            })
            .await;
        // The handler may still be committing what it received.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    /// Posts an event to the Baton bus, as a user's own system would.
    pub async fn put_event(&self, detail_type: &str, detail: Value) {
        let eb = aws_sdk_eventbridge::Client::new(&self.sdk);
        let out = eb
            .put_events()
            .entries(
                aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                    .event_bus_name(&self.server().provisioned.config.bus_name)
                    .source("my.app")
                    .detail_type(detail_type)
                    .detail(detail.to_string())
                    .build(),
            )
            .send()
            .await
            .expect("the bus takes the event");
        assert_eq!(out.failed_entry_count(), 0);
    }
}

impl TestHost for AwsHost {
    fn api(&self) -> &Api {
        &self.api
    }

    async fn restart(&mut self) {
        // What the stopped host received and did not finish goes back to its queue.
        self.stop().await;
        let server = Self::start_server(&self.aws, self.options.clone()).await;
        self.api = Self::api_of(&self.aws, &server);
        self.server = Some(server);
        self.sweep().await;
    }

    async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }

    async fn expire(&self, run_id: &str, cta: &Value) {
        let due = expires_at(cta);
        let wait = (due - chrono::Utc::now()).to_std().unwrap_or_default();
        tokio::time::sleep(wait + Duration::from_millis(50)).await;
        let due = due.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let fire = serde_json::json!({"ctaId": cta["ctaId"], "runId": run_id, "due": due});
        self.put_event("cta.expired", fire).await;
    }

    async fn fire(&self, run_id: &str, name: &str, due: chrono::DateTime<chrono::Utc>) {
        let due = due.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let fire = serde_json::json!({"ctaId": name, "runId": run_id, "due": due});
        self.put_event("cta.expired", fire).await;
    }
}

/// A scenario that may crash at the armed failpoint `fp`, on either host: once it has fired,
/// the host is restarted (once), and the scenario goes on against the restarted host. A
/// request that hit it is not sent again: the restart alone must repair what was written.
pub struct Crash<H: TestHost> {
    pub host: H,
    pub fp: String,
    pub restarted: bool,
}

impl<H: TestHost> Crash<H> {
    /// The scenario on `host`, with `fp` armed after `skip` passes (`""`: none, the
    /// fault-free run).
    pub fn arm(host: H, fp: &str, skip: u32) -> Self {
        if !fp.is_empty() {
            failpoint::arm(fp, skip);
        }
        Crash {
            host,
            fp: fp.to_owned(),
            restarted: false,
        }
    }

    pub fn api(&self) -> &Api {
        self.host.api()
    }

    pub fn fired(&self) -> bool {
        failpoint::fired(&self.fp)
    }

    /// Restarts the host if the failpoint fired and it was not restarted yet; whether it did.
    pub async fn restart_if_fired(&mut self) -> bool {
        if self.fired() && !self.restarted {
            self.host.restart().await;
            self.restarted = true;
            return true;
        }
        false
    }

    /// Starts a run; its id. A crash before the reply restarts the host, and the run is found
    /// through its first question (the restart alone started it).
    pub async fn create(&mut self, body: Value) -> String {
        let (code, v) = self.api().post("/runs", body).await;
        if code == 202 {
            return v["runId"].as_str().expect("runId").to_owned();
        }
        assert!(self.fired(), "{}: {code} {v}", self.fp);
        self.restart_if_fired().await;
        let cta = self
            .api()
            .wait("the restarted run's question", async |api: &Api| {
                let (_, v) = api.get("/ctas?status=all").await;
                v["ctas"].as_array().and_then(|c| c.first().cloned())
            })
            .await;
        cta["runId"].as_str().expect("runId").to_owned()
    }

    /// Sends a request; one that hit the failpoint (the host "died" before replying) restarts
    /// the host. Its status.
    pub async fn request(&mut self, path: &str, body: Value) -> u16 {
        let (code, v) = self.api().post(path, body).await;
        if code == 503 {
            assert!(self.fired(), "{}: {v}", self.fp);
            self.restart_if_fired().await;
        } else {
            assert_eq!(code, 202, "{}: {v}", self.fp);
        }
        code
    }

    /// Polls the run, restarting the host once the failpoint has fired, until `done` says so
    /// (and a crash that happened was restarted from).
    pub async fn until(&mut self, run_id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + self.api().patience;
        loop {
            self.restart_if_fired().await;
            let (code, run) = self.api().get(&format!("/runs/{run_id}")).await;
            assert_eq!(code, 200, "{run}");
            if done(&run) && self.fired() == self.restarted {
                return run;
            }
            assert!(Instant::now() < deadline, "{}: stuck: {run:#}", self.fp);
            tokio::time::sleep(self.api().every).await;
        }
    }
}
