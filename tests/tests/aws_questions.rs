//! Questions over AWS wire protocols: expiry timers on EventBridge Scheduler (kept to the
//! minute, fired early, dropped or performed late), and defaults taken at expiry.

use crate::aws_flow::{Env, start_env};
use crate::common;

use std::time::{Duration, Instant};

use common::fault::Faults;
use common::host::TestHost;
use common::*;
use serde_json::{Value, json};

/// A run whose orchestrator asks a text question that expires after 5 s (the server's AWS
/// calls through the fault layer, if `faults`; with none, the test fires the expiry by
/// hand): the environment, the run's id and the question.
pub(super) async fn five_second_question(faults: Option<Faults>) -> (Env, String, Value) {
    question_expiring_in(5, faults).await
}

/// A run asking a text question that expires in `secs` seconds, and the question.
pub(super) async fn question_expiring_in(
    secs: u64,
    faults: Option<Faults>,
) -> (Env, String, Value) {
    let script = r#"{"orchestrator": [{"tool_calls": [{"name": "request_human_feedback", "arguments": {"kind": "text", "prompt": "Name?"}}]}]}"#;
    let mut agents = common::mock_openai::named_agents();
    agents["agents"]["orchestrator"]["ctaExpirySeconds"] = json!(secs);
    let env = start_env(script, false, catalog(Some(agents)), faults).await;
    let (run_id, cta) = env.ask().await;
    (env, run_id, cta)
}

/// A CTA whose schedule fires 59 s before its time (EventBridge Scheduler keeps time to the
/// minute; the fault layer fires a schedule's first firing that early) is not lost: it is
/// set again, and the question expires between its `expiresAt` and two minutes after.
#[tokio::test]
async fn a_cta_whose_schedule_fires_59_s_early_still_expires_within_two_minutes() {
    let faults = Faults {
        early_first_firing: true,
        ..Faults::default()
    };
    let (mut env, run_id, cta) = five_second_question(Some(faults)).await;
    let run = env.host.api().status(&run_id, "expired").await;
    assert_eq!(run["error"]["code"], "cta_expired");
    let (_, c) = env
        .host
        .api()
        .call(
            reqwest::Method::GET,
            &format!("/ctas/{}", cta["ctaId"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(c["status"], "expired");
    let time = |k: &str| {
        chrono::DateTime::parse_from_rfc3339(c[k].as_str().unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc)
    };
    let late = time("resolvedAt") - time("expiresAt");
    assert!(
        late >= chrono::Duration::zero() && late <= chrono::Duration::seconds(120),
        "expired {late} after its time"
    );
    let stats = &env.host.aws.faulty.as_ref().unwrap().stats;
    assert!(
        stats.fired_early.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "the scheduler fired early at least once"
    );
    env.host.stop().await;
}

#[tokio::test]
async fn a_five_second_cta_is_scheduled_on_the_minute_re_arms_an_early_expiry_and_expires_on_time()
{
    let (mut env, run_id, cta) = five_second_question(None).await;
    let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
    let expires = chrono::DateTime::parse_from_rfc3339(cta["expiresAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);

    // The stored schedule: named by the CTA, at() the whole minute at or after its expiry
    // (Scheduler fires anywhere in that minute), onto the bus, deleting itself.
    let c = &env.host.server().provisioned.config;
    let sch = aws_sdk_scheduler::Client::new(&env.host.sdk);
    // The CTA is stored with the step's commit; its schedule is an effect performed after
    // it, so a loaded machine can show the one before the other.
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        match sch
            .get_schedule()
            .name(&cta_id)
            .group_name(&c.schedule_group)
            .send()
            .await
        {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let missing = e
                    .as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception());
                assert!(missing, "GetSchedule: {e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the CTA's schedule never appeared: {e:?}"),
        }
    };
    let created = chrono::DateTime::parse_from_rfc3339(cta["createdAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    assert_eq!(expires - created, chrono::Duration::seconds(5));
    let expected_at = baton_aws::scheduler::at_expression(created + chrono::Duration::seconds(5));
    assert_eq!(s.schedule_expression(), Some(expected_at.as_str()));
    assert_eq!(s.schedule_expression_timezone(), Some("UTC"));
    assert_eq!(s.flexible_time_window().unwrap().mode().as_str(), "OFF");
    let target = s.target().unwrap();
    assert_eq!(target.arn(), c.bus_arn);
    assert_eq!(target.role_arn(), c.scheduler_role_arn);
    assert_eq!(
        target.event_bridge_parameters().unwrap().detail_type(),
        "cta.expired"
    );
    let input: Value = serde_json::from_str(target.input().unwrap()).unwrap();
    let due = (created + chrono::Duration::seconds(5))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    assert_eq!(input, json!({"ctaId": cta_id, "runId": run_id, "due": due}));
    assert_eq!(
        s.action_after_completion().map(|a| a.as_str()),
        Some("DELETE")
    );

    // The emulator does not fire schedules: deliver the schedule's input ourselves, early,
    // as a scheduler keeping its time to the minute may, and as the schedule deletes itself
    // once fired. The question stays open, and its schedule is set again: not lost.
    sch.delete_schedule()
        .name(&cta_id)
        .group_name(&c.schedule_group)
        .send()
        .await
        .unwrap();
    env.host.put_event("cta.expired", input.clone()).await;
    env.host.inbox_drained().await;
    let (_, c) = env
        .host
        .api()
        .call(reqwest::Method::GET, &format!("/ctas/{cta_id}"), None)
        .await;
    assert_eq!(c["status"], "pending", "{c}");
    assert!(chrono::Utc::now() < expires, "the early event was early");
    let again = sch
        .get_schedule()
        .name(&cta_id)
        .group_name(&env.host.server().provisioned.config.schedule_group)
        .send()
        .await
        .expect("the expiry is scheduled again");
    assert_eq!(again.schedule_expression(), Some(expected_at.as_str()));

    // At its time, as the schedule would fire it, it ends the run.
    let wait = (expires - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
    env.host.put_event("cta.expired", input).await;
    let run = env.host.api().status(&run_id, "expired").await;
    assert_eq!(run["error"]["code"], "cta_expired");

    // Too late: 410 through the API, dropped from the bus.
    let (code, v) = env
        .host
        .api()
        .call(
            reqwest::Method::POST,
            &format!("/ctas/{cta_id}/response"),
            Some(json!({"kind": "text", "text": "Ada"})),
        )
        .await;
    assert_eq!(code, 410, "{v}");
    env.host
        .put_event(
            "cta.response",
            json!({"ctaId": cta_id, "kind": "text", "text": "Ada"}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, c2) = env
        .host
        .api()
        .call(reqwest::Method::GET, &format!("/ctas/{cta_id}"), None)
        .await;
    assert_eq!(c2["status"], "expired");
    let (_, after) = env
        .host
        .api()
        .call(reqwest::Method::GET, &format!("/runs/{run_id}"), None)
        .await;
    assert_eq!(after["status"], "expired");
    env.host.stop().await;
}

/// The schedule of `cta_id`, once the step's effects have made it; then deleted, as an
/// outbox not yet performed has made none.
async fn dropped_schedule(
    env: &Env,
    cta_id: &str,
) -> aws_sdk_scheduler::operation::get_schedule::GetScheduleOutput {
    let made = made_schedule(env, cta_id).await;
    aws_sdk_scheduler::Client::new(&env.host.sdk)
        .delete_schedule()
        .name(cta_id)
        .group_name(&env.host.server().provisioned.config.schedule_group)
        .send()
        .await
        .unwrap();
    made
}

/// The schedule of `cta_id`, once the step's effects have made it.
async fn made_schedule(
    env: &Env,
    cta_id: &str,
) -> aws_sdk_scheduler::operation::get_schedule::GetScheduleOutput {
    let sch = aws_sdk_scheduler::Client::new(&env.host.sdk);
    let group = &env.host.server().provisioned.config.schedule_group;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match sch
            .get_schedule()
            .name(cta_id)
            .group_name(group)
            .send()
            .await
        {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the CTA's schedule never appeared: {e:?}"),
        }
    }
}

/// Sleeps until just past the question's `expiresAt`; returns it.
async fn past_expiry(cta: &Value) -> chrono::DateTime<chrono::Utc> {
    let expires = chrono::DateTime::parse_from_rfc3339(cta["expiresAt"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let wait = (expires - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
    expires
}

/// Timers that cannot be lost. Each schedule retries for a day and then dead-letters; a
/// question whose schedule's firing Scheduler dropped (the fault layer drops every one here,
/// to the timers' dead-letter queue) is expired by the sweep's next tick; and an expiry
/// whose effect is performed after its time (an outbox performed late) is never scheduled in
/// the past, where it could not fire: its event goes on the bus at once.
///
/// The questions expire in 30 s, not 5: a schedule is made only while its time is ahead
/// (else the event goes on the bus at once), and on a loaded machine a step can perform its
/// effects seconds after the commit that dated its question (CI, four tests at a time on two
/// cores, failed this test once with 5 s questions).
#[tokio::test]
async fn a_dropped_expiry_and_one_performed_late_still_expire_their_questions() {
    let faults = Faults {
        drop_firings: 1.0,
        ..Faults::default()
    };
    let (mut env, run_id, cta) = question_expiring_in(30, Some(faults)).await;
    let c = env.host.server().provisioned.config.clone();
    let cta_id = cta["ctaId"].as_str().unwrap().to_owned();
    let s = made_schedule(&env, &cta_id).await;
    let target = s.target().unwrap();
    let retry = target.retry_policy().expect("a retry policy");
    assert_eq!(retry.maximum_event_age_in_seconds(), Some(86_400));
    assert_eq!(retry.maximum_retry_attempts(), Some(185));
    let dlq = target.dead_letter_config().and_then(|d| d.arn());
    assert!(
        dlq.is_some() && dlq == c.timers_dead_letter_arn.as_deref(),
        "{dlq:?}"
    );

    // Dropped: at its time (within the minute after `expiresAt`) the firing goes to the
    // dead-letter queue, and the question is still open. The sweep's tick expires it.
    let stats = env.host.aws.faulty.as_ref().unwrap().stats.clone();
    let deadline = Instant::now() + Duration::from_secs(210);
    while stats.dropped.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the firing was never dropped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sqs = aws_sdk_sqs::Client::new(&env.host.sdk);
    let dlq_name = dlq.unwrap().rsplit(':').next().unwrap();
    let url = sqs
        .get_queue_url()
        .queue_name(dlq_name)
        .send()
        .await
        .unwrap();
    let dead = sqs
        .receive_message()
        .queue_url(url.queue_url().unwrap())
        .wait_time_seconds(10)
        .send()
        .await
        .unwrap();
    let dead = dead
        .messages()
        .first()
        .expect("the dead-letter queue holds it");
    let body: Value = serde_json::from_str(dead.body().unwrap()).unwrap();
    assert_eq!(
        body["ctaId"],
        cta_id.as_str(),
        "the dropped expiry, dead-lettered"
    );
    let (_, pending) = env
        .host
        .api()
        .call(reqwest::Method::GET, &format!("/ctas/{cta_id}"), None)
        .await;
    assert_eq!(pending["status"], "pending", "nothing expired it yet");
    let repaired = env
        .host
        .server()
        .sweep(chrono::Duration::zero())
        .await
        .unwrap();
    assert!(repaired >= 1, "the sweep expired it");
    let run = env.host.api().status(&run_id, "expired").await;
    assert_eq!(run["error"]["code"], "cta_expired");

    env.host.stop().await;

    // Late: a question whose expiry is performed only once it is due (on a host whose
    // firings are not dropped: its schedule is deleted, as an outbox not yet performed has
    // made none), by the function that performs outboxes late. Its timer is scheduled a
    // little ahead, never in the past, and never put on the bus by the function: the bus's
    // policy refuses a `cta.expired` from any role but the scheduler's.
    let (mut env, late_run, cta) = question_expiring_in(30, Some(Faults::default())).await;
    let c = env.host.server().provisioned.config.clone();
    let late_cta = cta["ctaId"].as_str().unwrap().to_owned();
    dropped_schedule(&env, &late_cta).await;
    let expires = past_expiry(&cta).await;
    let performed = chrono::Utc::now();
    env.host
        .server()
        .events_service()
        .deps()
        .scheduler
        .schedule(&late_cta, &late_run, expires)
        .await
        .unwrap();
    let made = aws_sdk_scheduler::Client::new(&env.host.sdk)
        .get_schedule()
        .name(&late_cta)
        .group_name(&c.schedule_group)
        .send()
        .await
        .expect("a late timer is scheduled");
    let expression = made.schedule_expression().unwrap_or_default();
    let at = chrono::NaiveDateTime::parse_from_str(expression, "at(%Y-%m-%dT%H:%M:%S)")
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
        .and_utc();
    assert!(
        at >= performed + baton_aws::scheduler::LATE_LEAD
            && at <= performed + chrono::Duration::seconds(75),
        "scheduled at {at}, performed at {performed}: ahead of now, within a minute"
    );
    // It fires (the fault layer fires it as Scheduler would, in its minute) and expires the
    // question.
    let mut api = common::aws::Api::new(env.host.api().base.clone());
    api.patience = Duration::from_secs(150);
    let run = api.status(&late_run, "expired").await;
    assert_eq!(run["error"]["code"], "cta_expired");
    env.host.stop().await;
}
