//! Questions that reach the right people, on each host through its HTTP API alone: an agent
//! whose questions are assigned to a group and a user and need two approvers. Who may see and
//! answer them (403 `not_assignee` for anyone else, nothing changed), an assignee's inbox,
//! two approvals racing to settle one outcome, the same person counted once, a link minted
//! for an assignee answering as them, the first rejection settling the question, and the
//! history of each (`GET /ctas/{id}/audit`). And the same questions told to their people:
//! through a signed webhook and Slack's format, each with a link of the recipient's own, a
//! failed delivery tried again, by e-mail (SMTP on `baton dev`, SES over AWS APIs), a
//! reminder, and an escalation that fires after a restart.

use crate::common;

use std::sync::Arc;

use common::aws::{Api, Emulator};
use common::host::{AwsHost, LocalHost, TestHost};
use common::*;
use serde_json::{Value, json};

/// The agents: the orchestrator's questions go to `ops` and `carol`, two of whom approve.
fn agents() -> Arc<baton_core::agent::Catalog> {
    catalog(Some(json!({"agents": {"orchestrator": {
        "system": "agent:orchestrator",
        "tools": ["request_human_feedback"],
        "questions": {"assignees": ["group:ops", "user:carol"], "required": 2}
    }}})))
}

/// Each run asks one approval, then says it is done (the first run's is approved, the
/// second's rejected).
const SCRIPT: &str = r#"{"orchestrator": [
  {"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "approval", "message": "Ship it?"}}]},
  {"text": "Shipped."}
]}"#;

#[tokio::test]
async fn local() {
    let dir = tempfile::tempdir().unwrap();
    let options = local_options(
        dir.path(),
        scripted(SCRIPT),
        agents(),
        Arc::new(baton_core::ports::SystemClock),
    );
    let mut host = LocalHost::start(options).await;
    questions_reach_their_assignees(&mut host).await;
    host.stop().await;
}

#[tokio::test]
async fn aws() {
    let aws = Arc::new(Emulator::start_with(common::aws::scenario_faults()).await);
    let (_mock, llm) = common::mock_openai::start(SCRIPT).await;
    let options = aws.dev_options(aws.names("asg"), llm, agents(), 0).await;
    let mut host = AwsHost::start(aws, options).await;
    questions_reach_their_assignees(&mut host).await;
    host.stop().await;
}

/// The secret the test webhook's deliveries are signed with.
const HOOK_SECRET: &str = "a-webhook-secret-of-some-length";

/// The agents, told through `hook` (a webhook) and `slack` at `base`, and by e-mail from
/// `from`: the orchestrator's questions go to `ops`, are reminded after 200 s and escalated
/// to `dave` after 300 s.
fn notified_agents(base: &str, from: &str) -> Arc<baton_core::agent::Catalog> {
    catalog(Some(json!({
        "notifiers": {
            "hook": {"type": "webhook", "url": format!("{base}/hook"), "secret": HOOK_SECRET},
            "slack": {"type": "slack", "url": format!("{base}/slack")},
            "mail": {"type": "email", "from": from,
                     "to": {"group:ops": "ops@example.com", "user:dave": "dave@example.com"}}
        },
        "agents": {"orchestrator": {
            "system": "agent:orchestrator",
            "tools": ["request_human_feedback"],
            "questions": {"assignees": ["group:ops"], "notify": ["hook", "slack", "mail"],
                          "remindAfterSeconds": 200, "escalateAfterSeconds": 300,
                          "escalateTo": ["user:dave"]}
        }}
    })))
}

/// What the receivers got: each request's path, signature header and body. The webhook
/// refuses its first request (503), so that a retry is seen.
#[derive(Clone, Default)]
struct Received(Arc<std::sync::Mutex<Vec<Request>>>);

/// A request a receiver got: its path, its signature header, its body.
type Request = (String, Option<String>, Value);

impl Received {
    async fn start(&self) -> String {
        use axum::extract::State;
        use axum::http::{HeaderMap, StatusCode, Uri};
        async fn take(
            State(r): State<Received>,
            uri: Uri,
            headers: HeaderMap,
            body: axum::body::Bytes,
        ) -> StatusCode {
            let sig = headers
                .get("baton-signature")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let mut seen = r.0.lock().unwrap();
            let first_hook = uri.path() == "/hook" && !seen.iter().any(|(p, ..)| p == "/hook");
            // The signature is checked as a receiver would, with its own HMAC.
            if let Some(sig) = &sig {
                assert!(
                    verify(sig, &body),
                    "a signature that does not verify: {sig}"
                );
            }
            let body: Value = serde_json::from_slice(&body).expect("JSON");
            seen.push((uri.path().to_owned(), sig, body));
            if first_hook {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::NO_CONTENT
            }
        }
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(take))
            .route("/slack", axum::routing::post(take))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn all(&self) -> Vec<Request> {
        self.0.lock().unwrap().clone()
    }

    /// The bodies received at `path` of messages of `kind` (`cta.request`, ...).
    fn bodies(&self, path: &str, kind: &str) -> Vec<Value> {
        self.all()
            .into_iter()
            .filter(|(p, _, b)| p == path && (b["type"] == kind || path == "/slack"))
            .map(|(_, _, b)| b)
            .collect()
    }
}

/// A `Baton-Signature` (`t=<unix>,v1=<hex>`) checked against the body with the secret: an
/// HMAC-SHA256 of `<t>.<body>`, as docs/http-api.md tells a receiver to.
fn verify(header: &str, body: &[u8]) -> bool {
    use hmac::{KeyInit, Mac};
    let Some((t, v1)) = header
        .split_once(',')
        .and_then(|(t, v)| Some((t.strip_prefix("t=")?, v.strip_prefix("v1=")?)))
    else {
        return false;
    };
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(HOOK_SECRET.as_bytes()).unwrap();
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    let want: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    want == v1
}

/// Where a host's e-mail is read back: the SMTP server `baton dev` sends through, or SES's
/// record on the emulator.
enum Mailbox {
    Smtp(common::python::SmtpSink),
    /// SES's record, of the messages from this sender (the emulator may be shared).
    Ses(Arc<Emulator>, String),
}

impl Mailbox {
    /// Every message sent to `to`, as `{from, to, subject, text}`.
    async fn to(&self, to: &str) -> Vec<Value> {
        let all = match self {
            Mailbox::Smtp(sink) => sink.taken(),
            Mailbox::Ses(aws, from) => {
                let mut all = aws.sent_mail().await;
                all.retain(|m| m["from"] == from.as_str());
                all
            }
        };
        all.into_iter()
            .filter(|m| m["to"].as_array().is_some_and(|t| t.contains(&json!(to))))
            .collect()
    }
}

#[tokio::test]
async fn notified_local() {
    let received = Received::default();
    let base = received.start().await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(baton_core::ports::ManualClock::new(chrono::Utc::now()));
    let sink = common::python::SmtpSink::start();
    let mut options = local_options(
        dir.path(),
        scripted(SCRIPT),
        notified_agents(&base, "baton@example.com"),
        clock.clone(),
    );
    options.smtp_url = Some(sink.url.clone());
    let mut host = LocalHost::with_clock(options, clock).await;
    let mailbox = Mailbox::Smtp(sink);
    questions_are_told_to_their_people(&mut host, &received, &mailbox).await;
    host.stop().await;
}

#[tokio::test]
async fn notified_aws() {
    let received = Received::default();
    let base = received.start().await;
    let aws = Arc::new(Emulator::start_with(common::aws::scenario_faults()).await);
    let (_mock, llm) = common::mock_openai::start(SCRIPT).await;
    let names = aws.names("ntf");
    // A sender of this test's own (the emulator may be shared), verified as SES asks.
    let from = format!("baton@{}.example.com", names.prefix.to_lowercase());
    aws.verify_sender(&from).await;
    let options = aws
        .dev_options(names, llm, notified_agents(&base, &from), 0)
        .await;
    let mut host = AwsHost::start(aws.clone(), options).await;
    let mailbox = Mailbox::Ses(aws, from);
    questions_are_told_to_their_people(&mut host, &received, &mailbox).await;
    host.stop().await;
}

/// `baton dev` with an e-mail channel and no SMTP server to send through refuses to start,
/// naming the channel.
#[tokio::test]
async fn an_e_mail_channel_needs_an_smtp_server_on_baton_dev() {
    let dir = tempfile::tempdir().unwrap();
    let options = local_options(
        dir.path(),
        scripted(SCRIPT),
        notified_agents("http://127.0.0.1:9", "baton@example.com"),
        Arc::new(baton_core::ports::SystemClock),
    );
    let Err(e) = baton_dev::LocalServer::start(options).await else {
        panic!("started without an SMTP server");
    };
    let e = e.to_string();
    assert!(
        e.contains("e-mail channels (`mail`)") && e.contains("BATON_SMTP_URL"),
        "{e}"
    );
}

fn at(cta: &Value, seconds: i64) -> chrono::DateTime<chrono::Utc> {
    let created = chrono::DateTime::parse_from_rfc3339(cta["createdAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    created + chrono::Duration::seconds(seconds)
}

async fn questions_are_told_to_their_people(
    host: &mut impl TestHost,
    received: &Received,
    mailbox: &Mailbox,
) {
    let owner = host.api().clone();
    let (run_id, cta, id) = asked(&owner).await;
    let wait = async |what: &str, path: &str, kind: &str, n: usize| {
        owner
            .wait(what, async |_: &Api| {
                let got = received.bodies(path, kind);
                (got.len() >= n).then_some(got)
            })
            .await
    };

    // Asked: ops is told through both channels; the webhook's first try fails and is tried
    // again after its backoff.
    host.fire(&run_id, &format!("ntf-{id}"), at(&cta, 0)).await;
    let slack = wait("the Slack message", "/slack", "", 1).await;
    let blocks = slack[0]["blocks"].as_array().unwrap();
    assert!(
        blocks[0]["text"]["text"]
            .as_str()
            .unwrap()
            .contains("Ship it?"),
        "{slack:?}"
    );
    let button = &blocks[2]["elements"][0];
    assert_eq!(button["type"], "button");
    assert!(button["url"].as_str().unwrap().contains("/console#/link/"));
    wait("the webhook's first try", "/hook", "cta.request", 1).await;
    // Its outcome recorded (until then its claim holds it: a timer that fires sooner finds
    // nothing owed), it is retried 30 s after the first try's claim (60 s) ended.
    owner
        .wait("the failed try's record", async |api: &Api| {
            let audit = api.get_ok(&format!("/ctas/{id}/audit")).await;
            audit["events"].as_array()?.iter().find(|e| {
                e["type"] == "notified"
                    && e["outcome"]
                        .as_str()
                        .is_some_and(|o| o.starts_with("failed"))
            })?;
            Some(())
        })
        .await;
    host.fire(&run_id, &format!("ntf-{id}"), at(&cta, 91)).await;
    let hooks = wait("the webhook's retry", "/hook", "cta.request", 2).await;
    let asked = &hooks[1];
    assert_eq!(
        (
            asked["recipient"].as_str(),
            asked["ctaId"].as_str(),
            asked["kind"].as_str()
        ),
        (Some("group:ops"), Some(id.as_str()), Some("approval"))
    );
    assert_eq!(asked["message"], "Ship it?");
    assert_eq!(asked["attempt"], 2);
    assert_eq!(
        hooks[0]["deliveryId"], hooks[1]["deliveryId"],
        "the same delivery, again"
    );
    assert!(
        received
            .all()
            .iter()
            .filter(|(p, ..)| p == "/hook")
            .all(|(_, s, _)| s.is_some())
    );

    // And ops is told by e-mail: the question, and its link.
    let mail = owner
        .wait("the e-mail to ops", async |_: &Api| {
            mailbox.to("ops@example.com").await.first().cloned()
        })
        .await;
    assert!(
        mail["subject"].as_str().unwrap().contains("Ship it?"),
        "{mail}"
    );
    let text = mail["text"].as_str().unwrap();
    assert!(text.contains("/console#/link/"), "{text}");
    assert!(text.contains("for group:ops"), "{text}");

    // Reminded after 200 s; then a restart, and the escalation fires after it: dave is an
    // assignee, told with a link of his own, and finds it in his inbox.
    host.fire(&run_id, &format!("rmd-{id}"), at(&cta, 200))
        .await;
    let reminded = wait("the reminder", "/hook", "cta.reminded", 1).await;
    assert_eq!(reminded[0]["recipient"], "group:ops");
    host.restart().await;
    let owner = host.api().clone();
    host.fire(&run_id, &format!("esc-{id}"), at(&cta, 300))
        .await;
    let escalated = owner
        .wait("the escalation", async |_: &Api| {
            let got = received.bodies("/hook", "cta.escalated");
            got.first().cloned()
        })
        .await;
    assert_eq!(escalated["recipient"], "user:dave");
    assert_eq!(escalated["assignees"], json!(["group:ops", "user:dave"]));
    let dave = as_user(&owner, "dave");
    let inbox = dave.get_ok("/ctas?assigned=me&status=pending").await;
    assert_eq!(inbox["ctas"][0]["ctaId"], id, "{inbox}");

    assert!(
        escalated["link"]
            .as_str()
            .unwrap()
            .contains("/console#/link/")
    );

    // Dave is told by e-mail too, and answers through the link in it: the answer is his,
    // through the link.
    let mail = owner
        .wait("the e-mail to dave", async |_: &Api| {
            mailbox.to("dave@example.com").await.first().cloned()
        })
        .await;
    assert!(
        mail["subject"]
            .as_str()
            .unwrap()
            .starts_with("Escalated to you"),
        "{mail}"
    );
    let text = mail["text"].as_str().unwrap();
    let link = text
        .lines()
        .find(|l| l.contains("/console#/link/"))
        .unwrap_or_else(|| panic!("a link in {text}"));
    let token = link.trim().rsplit('/').next().unwrap();
    let approve = json!({"kind": "approval", "approved": true});
    owner
        .post_ok(&format!("/links/{token}/response"), approve)
        .await;
    let run = owner.status(&run_id, "completed").await;
    assert_eq!(run["result"], "Shipped.");
    let settled = owner.get_ok(&format!("/ctas/{id}")).await;
    assert_eq!(settled["responder"], "dave");

    // Settled: a reminder that fires all the same tells no one.
    let told = async || {
        let mails =
            mailbox.to("ops@example.com").await.len() + mailbox.to("dave@example.com").await.len();
        (received.all().len(), mails)
    };
    let before = told().await;
    host.fire(&run_id, &format!("rmd-{id}"), at(&cta, 400))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(told().await, before, "nothing after the answer");

    let audit = owner.get_ok(&format!("/ctas/{id}/audit")).await;
    let events = audit["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for kind in ["created", "notified", "reminded", "escalated", "answered"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    let failed = events
        .iter()
        .find(|e| e["type"] == "notified" && e["outcome"].as_str().unwrap().starts_with("failed"))
        .expect("the failed try, recorded");
    assert_eq!(
        (failed["channel"].as_str(), failed["recipient"].as_str()),
        (Some("hook"), Some("group:ops"))
    );
    let mailed = events
        .iter()
        .filter(|e| e["type"] == "notified" && e["channel"] == "mail")
        .map(|e| e["recipient"].as_str().unwrap())
        .collect::<Vec<_>>();
    assert!(
        mailed.contains(&"group:ops") && mailed.contains(&"user:dave"),
        "{events:?}"
    );
    // (A try's outcome may be recorded after the answer: the answer is not the last event.)
    let answered = events.iter().find(|e| e["type"] == "answered").unwrap();
    assert_eq!(
        (answered["by"].as_str(), answered["via"].as_str()),
        (Some("dave"), Some("link"))
    );
}

/// A run started (`Ship`) and its approval asked: the run's id, the question as the API
/// shows it, and its id.
async fn asked(owner: &Api) -> (String, Value, String) {
    let run_id = owner.post_ok("/runs", json!({"prompt": "Ship"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cta = owner.pending("approval").await;
    let id = cta["ctaId"].as_str().unwrap().to_owned();
    (run_id, cta, id)
}

/// The host's API as test user `user`.
fn as_user(api: &Api, user: &str) -> Api {
    let mut api = api.clone();
    api.token = user_token(user);
    api
}

async fn questions_reach_their_assignees(host: &mut impl TestHost) {
    let owner = host.api().clone();
    let (alice, bob, carol, dave) = (
        as_user(&owner, "alice"),
        as_user(&owner, "bob"),
        as_user(&owner, "carol"),
        as_user(&owner, "dave"),
    );
    let (run_id, cta, id) = asked(&owner).await;
    assert_eq!(cta["assignees"], json!(["group:ops", "user:carol"]));
    assert_eq!(cta["requiredApprovals"], 2);

    // An assignee's inbox lists it, by group or by name; the owner's own inbox is its
    // owner's, and nobody else's lists it.
    for who in [&alice, &carol] {
        let inbox = who.get_ok("/ctas?assigned=me&status=pending").await;
        let ids: Vec<&str> = inbox["ctas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["ctaId"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [id.as_str()], "{inbox}");
    }
    assert_eq!(
        dave.get_ok("/ctas?assigned=me").await["ctas"],
        json!([]),
        "not dave's"
    );
    assert_eq!(owner.get_ok("/ctas?assigned=me").await["ctas"], json!([]));
    let (code, v) = alice.get("/ctas?assigned=you").await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
    // An assignee sees the question, not the rest of the owner's run.
    assert_eq!(alice.get_ok(&format!("/ctas/{id}")).await["ctaId"], id);
    assert_eq!(alice.get(&format!("/runs/{run_id}")).await.0, 404);

    // Anyone else is refused, and nothing changes.
    let approve = json!({"kind": "approval", "approved": true});
    let (code, v) = dave.post(&answer_path(&cta), approve.clone()).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (403, Some("not_assignee")),
        "{v}"
    );
    assert_eq!(dave.get(&format!("/ctas/{id}")).await.0, 404);
    assert_eq!(dave.get(&format!("/ctas/{id}/audit")).await.0, 404);
    assert_eq!(
        owner.get_ok(&format!("/ctas/{id}")).await["status"],
        "pending"
    );

    // Two approvals at once: both count, and the second one settles it.
    let path = answer_path(&cta);
    let (a, b) = tokio::join!(
        alice.post(&path, approve.clone()),
        bob.post(&path, approve.clone()),
    );
    assert_eq!((a.0, b.0), (202, 202), "{} / {}", a.1, b.1);
    let settled = owner.get_ok(&format!("/ctas/{id}")).await;
    assert_eq!(settled["status"], "answered", "{settled}");
    let mut approvers: Vec<&str> = settled["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["by"].as_str().unwrap())
        .collect();
    approvers.sort_unstable();
    assert_eq!(approvers, ["alice", "bob"]);
    // One of them was told it waits for one more, the other that it is answered.
    let statuses = [a.1["status"].as_str(), b.1["status"].as_str()];
    assert!(
        statuses.contains(&Some("pending")) && statuses.contains(&Some("answered")),
        "{statuses:?}"
    );
    // An approver's retry is accepted again; a third approver is too late.
    assert_eq!(alice.post(&answer_path(&cta), approve.clone()).await.0, 202);
    let (code, v) = carol.post(&answer_path(&cta), approve.clone()).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("cta_answered")),
        "{v}"
    );
    let run = owner.status(&run_id, "completed").await;
    assert_eq!(run["result"], "Shipped.");

    let audit = carol.get_ok(&format!("/ctas/{id}/audit")).await;
    let kinds: Vec<&str> = audit["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["created", "approved", "approved", "answered"],
        "{audit}"
    );
    let answered = &audit["events"][3];
    assert_eq!(answered["via"], "api");
    assert_eq!(answered["outcome"], "approved");
    assert!(["alice", "bob"].contains(&answered["by"].as_str().unwrap()));

    // The second run: carol approves through a link minted for her, the same person
    // counts once, then alice rejects, which settles it.
    let run_id = owner.post_ok("/runs", json!({"prompt": "Again"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cta = owner
        .wait("the second question", async |api: &Api| {
            let (_, v) = api.get("/ctas?status=pending").await;
            v["ctas"].as_array().and_then(|c| c.first().cloned())
        })
        .await;
    let id = cta["ctaId"].as_str().unwrap().to_owned();
    let (code, link) = carol.post(&format!("/ctas/{id}/link"), json!({})).await;
    if code == 409 && link["error"]["code"] == "links_off" {
        panic!("the test hosts mint links: {link}");
    }
    assert_eq!(code, 200, "{link}");
    let token = link["url"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let opened = carol.get_ok(&format!("/links/{token}")).await;
    assert_eq!(
        (
            opened["requiredApprovals"].as_u64(),
            opened["approved"].as_u64()
        ),
        (Some(2), Some(0))
    );
    let by_link = carol
        .post_ok(&format!("/links/{token}/response"), approve.clone())
        .await;
    assert_eq!(by_link["status"], "pending", "{by_link}");
    assert_eq!(by_link["approvals"], json!(["carol"]));
    // The link answers once; carol's own approval again counts once.
    let (code, v) = carol
        .post(&format!("/links/{token}/response"), approve.clone())
        .await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("link_used")),
        "{v}"
    );
    let again = carol.post_ok(&answer_path(&cta), approve.clone()).await;
    assert_eq!(again["approvals"], json!(["carol"]));
    let reject = json!({"kind": "approval", "approved": false, "reason": "not today"});
    let rejected = alice.post_ok(&answer_path(&cta), reject).await;
    assert_eq!(rejected["status"], "answered");
    let run = owner.status(&run_id, "completed").await;
    let tool = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool")
        .cloned()
        .unwrap();
    assert_eq!(
        tool["result"]["output"],
        json!({"kind": "approval", "approved": false, "reason": "not today"}),
        "the model hears the rejection"
    );
    let audit = owner.get_ok(&format!("/ctas/{id}/audit")).await;
    let events = audit["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["created", "link_opened", "approved", "answered"],
        "{audit}"
    );
    assert_eq!(
        (events[1]["by"].as_str(), events[1]["via"].as_str()),
        (Some("carol"), Some("link"))
    );
    assert_eq!(
        (events[2]["by"].as_str(), events[2]["via"].as_str()),
        (Some("carol"), Some("link"))
    );
    assert_eq!(
        (
            events[3]["by"].as_str(),
            events[3]["outcome"].as_str(),
            events[3]["detail"].as_str()
        ),
        (Some("alice"), Some("rejected"), Some("not today"))
    );
}

fn answer_path(cta: &Value) -> String {
    format!("/ctas/{}/response", cta["ctaId"].as_str().unwrap())
}

/// Through the bus, the sender is trusted with whom it names, but a question with assignees
/// is answered by its owner or a `user:` assignee the event names (a group's members are
/// not known there): anyone else's answer changes nothing; the named ones count.
#[tokio::test]
async fn bus_answers_name_an_assignee() {
    let aws = Arc::new(Emulator::start_with(None).await);
    let (_mock, llm) = common::mock_openai::start(SCRIPT).await;
    let options = aws.dev_options(aws.names("asgbus"), llm, agents(), 0).await;
    let mut host = AwsHost::start(aws, options).await;
    let owner = host.api().clone();
    let (run_id, _, id) = asked(&owner).await;
    let answer = |responder: &str| json!({"ctaId": id, "kind": "approval", "approved": true, "responder": responder});
    // alice is in ops, but the bus cannot know it; mallory is no one's.
    for stranger in ["mallory", "alice"] {
        host.put_event("cta.response", answer(stranger)).await;
    }
    host.put_event("cta.response", answer("carol")).await;
    let one = owner
        .wait("carol's approval", async |api: &Api| {
            let c = api.get_ok(&format!("/ctas/{id}")).await;
            (c["approvals"].as_array().is_some_and(|a| !a.is_empty())).then_some(c)
        })
        .await;
    assert_eq!(one["status"], "pending");
    host.put_event("cta.response", answer("local")).await;
    owner.status(&run_id, "completed").await;
    let settled = owner.get_ok(&format!("/ctas/{id}")).await;
    let by: Vec<&str> = settled["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["by"].as_str().unwrap())
        .collect();
    assert_eq!(
        by,
        ["carol", "local"],
        "the strangers' answers counted for nothing"
    );
    let audit = owner.get_ok(&format!("/ctas/{id}/audit")).await;
    assert!(
        audit["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "approved")
            .all(|e| e["via"] == "bus"),
        "{audit}"
    );
    host.stop().await;
}

/// On AWS a notification given up on (five failed tries) lands in the notifications'
/// dead-letter queue, through the bus's rule as the template routes it: a message that
/// names the question and its delivery.
#[tokio::test]
async fn a_notification_given_up_on_lands_in_its_dead_letter_queue_on_aws() {
    use axum::http::StatusCode;
    let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = tries.clone();
    let app = axum::Router::new().route(
        "/down",
        axum::routing::post(async move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            StatusCode::INTERNAL_SERVER_ERROR
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let down = format!("http://{}/down", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let agents = catalog(Some(json!({
        "notifiers": {"hook": {"type": "webhook", "url": down, "secret": HOOK_SECRET}},
        "agents": {"orchestrator": {
            "system": "agent:orchestrator",
            "tools": ["request_human_feedback"],
            "questions": {"assignees": ["group:ops"], "notify": ["hook"]}
        }}
    })));
    let aws = Arc::new(Emulator::start_with(None).await);
    let (_mock, llm) = common::mock_openai::start(SCRIPT).await;
    let names = aws.names("ntfdlq");
    let dlq = names.notifications_dlq();
    let options = aws.dev_options(names, llm, agents, 0).await;
    let mut host = AwsHost::start(aws.clone(), options).await;
    let owner = host.api().clone();
    let (run_id, cta, id) = asked(&owner).await;
    // Each firing of the notification timer tries again once the last try is recorded.
    for n in 1..=5usize {
        host.fire(&run_id, &format!("ntf-{id}"), at(&cta, 0)).await;
        owner
            .wait("the try's record", async |api: &Api| {
                let audit = api.get_ok(&format!("/ctas/{id}/audit")).await;
                let failed = audit["events"]
                    .as_array()?
                    .iter()
                    .filter(|e| e["type"] == "notified")
                    .count();
                (failed >= n).then_some(())
            })
            .await;
    }
    assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 5);

    let sqs = aws_sdk_sqs::Client::new(&aws.sdk().await);
    let url = sqs
        .get_queue_url()
        .queue_name(&dlq)
        .send()
        .await
        .expect("the notifications' dead-letter queue")
        .queue_url
        .unwrap();
    let message = owner
        .wait("the dead letter", async |_: &Api| {
            let got = sqs
                .receive_message()
                .queue_url(&url)
                .wait_time_seconds(1)
                .send()
                .await
                .ok()?;
            got.messages?.into_iter().next()?.body
        })
        .await;
    let event: Value = serde_json::from_str(&message).unwrap();
    assert_eq!(event["detail-type"], "cta.undelivered", "{event}");
    assert_eq!(event["detail"]["ctaId"], id.as_str(), "{event}");
    assert_eq!(
        event["detail"]["deliveries"],
        json!(["asked:hook:group:ops"]),
        "{event}"
    );
    // A sixth firing tries nothing more.
    host.fire(&run_id, &format!("ntf-{id}"), at(&cta, 0)).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 5);
    host.stop().await;
}

/// A round that tells more people than one claim takes (16 deliveries) is sent in claims
/// of its own, the next one a second on: ten people through two channels are all told,
/// each once, by the timer's firing and the one the first claim set.
#[tokio::test]
async fn a_round_for_many_people_reaches_all_of_them_on_baton_dev() {
    let received = Received::default();
    let base = received.start().await;
    let people: Vec<String> = (0..10).map(|i| format!("user:u{i}")).collect();
    let agents = catalog(Some(json!({
        "notifiers": {
            "hook": {"type": "webhook", "url": format!("{base}/hook"), "secret": HOOK_SECRET},
            "slack": {"type": "slack", "url": format!("{base}/slack")}
        },
        "agents": {"orchestrator": {
            "system": "agent:orchestrator",
            "tools": ["request_human_feedback"],
            "questions": {"assignees": people, "notify": ["hook", "slack"]}
        }}
    })));
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(baton_core::ports::ManualClock::new(chrono::Utc::now()));
    let options = local_options(dir.path(), scripted(SCRIPT), agents, clock.clone());
    let mut host = LocalHost::with_clock(options, clock).await;
    let owner = host.api().clone();
    let (run_id, cta, id) = asked(&owner).await;
    host.fire(&run_id, &format!("ntf-{id}"), at(&cta, 0)).await;
    owner
        .wait("the first claim's sixteen", async |_: &Api| {
            (received.all().len() >= 16).then_some(())
        })
        .await;
    // The rest on the timer the first claim set, a second on.
    host.fire(&run_id, &format!("ntf-{id}"), at(&cta, 2)).await;
    let told = owner
        .wait("all twenty messages", async |_: &Api| {
            let all = received.all();
            (all.len() >= 20).then_some(all)
        })
        .await;
    // The webhook's very first request is refused (503) and tried again later: 19 in.
    let mut recipients: Vec<String> = told
        .iter()
        .filter(|(p, ..)| p == "/hook")
        .map(|(_, _, b)| b["recipient"].as_str().unwrap().to_owned())
        .collect();
    recipients.sort();
    recipients.dedup();
    assert_eq!(recipients.len(), 10, "{recipients:?}");
    assert_eq!(told.iter().filter(|(p, ..)| p == "/slack").count(), 10);
    host.stop().await;
}

/// A question for more people than DynamoDB's transaction takes items (100) is raised all
/// the same: its inbox pointers are written ahead of the step's commit, and an assignee's
/// inbox lists it.
#[tokio::test]
async fn a_question_for_a_hundred_and_twenty_people_reaches_their_inboxes_on_aws() {
    let mut people: Vec<String> = (0..119).map(|i| format!("user:p{i}")).collect();
    people.push("user:alice".into());
    let agents = catalog(Some(json!({"agents": {"orchestrator": {
        "system": "agent:orchestrator",
        "tools": ["request_human_feedback"],
        "questions": {"assignees": people}
    }}})));
    let aws = Arc::new(Emulator::start_with(None).await);
    let (_mock, llm) = common::mock_openai::start(SCRIPT).await;
    let options = aws.dev_options(aws.names("asgmany"), llm, agents, 0).await;
    let mut host = AwsHost::start(aws, options).await;
    let owner = host.api().clone();
    owner.post_ok("/runs", json!({"prompt": "Ship"})).await;
    let cta = owner.pending("approval").await;
    assert_eq!(cta["assignees"].as_array().unwrap().len(), 120);
    let inbox = as_user(&owner, "alice")
        .get_ok("/ctas?assigned=me&status=pending")
        .await;
    assert_eq!(inbox["ctas"][0]["ctaId"], cta["ctaId"], "{inbox}");
    host.stop().await;
}
