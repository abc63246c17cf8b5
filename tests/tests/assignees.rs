//! Questions that reach the right people, on each host through its HTTP API alone: an agent
//! whose questions are assigned to a group and a user and need two approvers. Who may see and
//! answer them (403 `not_assignee` for anyone else, nothing changed), an assignee's inbox,
//! two approvals racing to settle one outcome, the same person counted once, a link minted
//! for an assignee answering as them, the first rejection settling the question, and the
//! history of each (`GET /ctas/{id}/audit`).

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
    let run_id = owner.post_ok("/runs", json!({"prompt": "Ship"})).await["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cta = owner.pending("approval").await;
    let id = cta["ctaId"].as_str().unwrap().to_owned();
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
