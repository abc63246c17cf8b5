//! A question's notifications: each assignee told through each of its agent's channels
//! (`notifiers`), with a one-time link of their own; reminders and an escalation. All run on
//! the question's own durable timers (as its expiry does), by name: `ntf-<ctaId>` delivers
//! what is owed and tries again what failed (with backoff, up to
//! [`MAX_DELIVERY_ATTEMPTS`]), `rmd-<ctaId>` reminds, `esc-<ctaId>` escalates. What is owed
//! and what came of each try is on the question's record, written as any change to it is
//! ([`Cta::apply`]): a timer fired twice owes nothing twice. The run's step cancels the
//! timers when the question settles (one that fires all the same finds it settled and does
//! nothing).

use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tracing::{info, warn};

use super::{ServiceError, Shared};
use crate::agents_file::{NotifierKind, NotifierSpec};
use crate::cta::{
    AuditEvent, Cta, CtaChange, CtaStatus, Delivery, ESCALATE_TIMER, Lease, MAX_DELIVERY_ATTEMPTS,
    NOTIFY_TIMER, REMIND_TIMER, Tried, cta_timer,
};
use crate::message::Event;
use crate::ports::{Changed, Mail};

/// The header a webhook's deliveries are signed in: `t=<unix seconds>,v1=<hex of
/// HMAC-SHA256(secret, "<t>.<body>")>`.
pub const SIGNATURE_HEADER: &str = "Baton-Signature";
/// The header that names a delivery (`<round>:<channel>:<recipient>`): a receiver
/// deduplicates on it.
pub const DELIVERY_HEADER: &str = "Baton-Delivery";

/// How long a deliverer holds its claim on a try (a try takes at most
/// `DELIVERY_TIMEOUT`, 10 s, each).
const LEASE: chrono::Duration = chrono::Duration::seconds(60);

/// A failed delivery is tried again 30 s after its claim ends, then 1, 2, 4 and 8 minutes.
fn backoff(attempts: u32) -> chrono::Duration {
    chrono::Duration::seconds(30 << attempts.saturating_sub(1).min(6))
}

impl Shared {
    /// A question's own timer fired: its expiry (named by the question alone), or one of its
    /// notifications'.
    pub(super) async fn cta_timer(&self, name: &str) -> Result<(), ServiceError> {
        match cta_timer(name) {
            (Some(NOTIFY_TIMER), cta_id) => self.deliver(cta_id).await,
            (Some(REMIND_TIMER), cta_id) => self.remind(cta_id).await,
            (Some(ESCALATE_TIMER), cta_id) => self.escalate(cta_id).await,
            (_, cta_id) => self.expire_cta(cta_id).await,
        }
    }

    /// A pending question, or nothing to do.
    async fn waiting(&self, cta_id: &str) -> Result<Option<Cta>, ServiceError> {
        match self.deps.store.get_cta(cta_id).await? {
            Some(c) if c.status == CtaStatus::Pending => Ok(Some(c)),
            Some(_) => Ok(None),
            None => Err(ServiceError::NotFound(format!("no CTA `{cta_id}`"))),
        }
    }

    /// Tells its recipients again, as reminder `n` (`n` counted from its creation, so that a
    /// timer fired twice is one reminder), and sets the next one.
    async fn remind(&self, cta_id: &str) -> Result<(), ServiceError> {
        let Some(cta) = self.waiting(cta_id).await? else {
            return Ok(());
        };
        let Some(every) = cta.remind_after_seconds.filter(|s| *s > 0) else {
            return Ok(());
        };
        let now = self.deps.clock.now();
        let every_ms = i64::try_from(every.saturating_mul(1000)).unwrap_or(i64::MAX);
        let n = ((now - cta.created_at).num_milliseconds() / every_ms).max(1);
        let round = format!("reminder-{n}");
        let mut event = AuditEvent::new("reminded", now);
        event.detail = Some(round.clone());
        if !cta
            .audit
            .iter()
            .any(|e| e.kind == "reminded" && e.detail == event.detail)
        {
            let change = CtaChange::Round {
                event,
                assignees: Vec::new(),
                deliveries: cta.round(&round, &cta.recipients()),
            };
            if let Changed::Applied { cta, .. } =
                self.deps.store.change_cta(cta_id, &change, now).await?
            {
                self.publish("cta.reminded", &cta, &round, json!({"reminder": n}), now)
                    .await?;
            }
        }
        let next = cta.created_at + chrono::Duration::milliseconds(every_ms.saturating_mul(n + 1));
        if next < cta.expires_at {
            let name = format!("{REMIND_TIMER}{cta_id}");
            self.deps
                .scheduler
                .schedule(&name, &cta.run_id, next)
                .await?;
        }
        self.deliver(cta_id).await
    }

    /// Adds its `escalateTo` to its assignees and tells them (once).
    async fn escalate(&self, cta_id: &str) -> Result<(), ServiceError> {
        let Some(cta) = self.waiting(cta_id).await? else {
            return Ok(());
        };
        if !cta.audit.iter().any(|e| e.kind == "escalated") && !cta.escalate_to.is_empty() {
            let now = self.deps.clock.now();
            let added: Vec<String> = cta
                .escalate_to
                .iter()
                .filter(|p| !cta.assignees.contains(p))
                .cloned()
                .collect();
            let mut event = AuditEvent::new("escalated", now);
            event.detail = Some(cta.escalate_to.join(", "));
            let change = CtaChange::Round {
                event,
                assignees: cta.escalate_to.clone(),
                deliveries: cta.round("escalated", &added),
            };
            if let Changed::Applied { cta, .. } =
                self.deps.store.change_cta(cta_id, &change, now).await?
            {
                info!(cta_id, added = ?added, "question escalated");
                self.publish(
                    "cta.escalated",
                    &cta,
                    "escalated",
                    json!({"added": added}),
                    now,
                )
                .await?;
            }
        }
        self.deliver(cta_id).await
    }

    /// Claims every delivery still owed (each one's next try is this call's alone), sets the
    /// timer that tries again what fails (or what a deliverer that died left), makes the
    /// tries, and records what came of each.
    async fn deliver(&self, cta_id: &str) -> Result<(), ServiceError> {
        let Some(cta) = self.waiting(cta_id).await? else {
            return Ok(());
        };
        let now = self.deps.clock.now();
        if !cta.deliveries.iter().any(|d| d.owed(now)) {
            return Ok(());
        }
        let lease = Lease {
            token: uuid::Uuid::new_v4().simple().to_string(),
            until: now + LEASE,
        };
        let cta = match self
            .deps
            .store
            .change_cta(cta_id, &CtaChange::Claim(lease.clone()), now)
            .await?
        {
            Changed::Applied { cta, .. } => cta,
            _ => return Ok(()),
        };
        let claimed: Vec<&Delivery> = cta
            .deliveries
            .iter()
            .filter(|d| d.lease.as_ref() == Some(&lease))
            .collect();
        // Set before the tries: a deliverer that dies mid-way leaves its claims to it. What
        // this claim left for later (past MAX_CLAIMED) goes with the next firing, a second
        // on (on AWS, Scheduler's next minute); the claim that takes it sets the timer again.
        let retry = claimed
            .iter()
            .filter(|d| d.attempts < MAX_DELIVERY_ATTEMPTS)
            .map(|d| d.attempts)
            .min()
            .map(|fewest| lease.until + backoff(fewest));
        let next = if cta.deliveries.iter().any(|d| d.owed(now)) {
            Some(now + chrono::Duration::seconds(1))
        } else {
            retry
        };
        if let Some(at) = next.filter(|at| *at < cta.expires_at) {
            let name = format!("{NOTIFY_TIMER}{cta_id}");
            self.deps.scheduler.schedule(&name, &cta.run_id, at).await?;
        }
        // All at once: a round takes one try's time (at most 10 s), however many it tells.
        let outcomes = futures_util::future::join_all(claimed.iter().map(|d| async {
            match self.catalog.notifier(&d.channel) {
                None => Err(format!(
                    "channel `{}` is no longer in the agents file",
                    d.channel
                )),
                Some(spec) => self.send(&cta, d, spec, now).await,
            }
        }))
        .await;
        let mut tried = Vec::new();
        for (d, outcome) in claimed.iter().zip(outcomes) {
            let (ok, outcome) = match outcome {
                Ok(status) => (true, format!("delivered ({status})")),
                Err(why) => {
                    warn!(
                        cta_id,
                        delivery = d.id,
                        error = why,
                        "a notification failed"
                    );
                    (false, format!("failed: {why}"))
                }
            };
            tried.push(Tried {
                id: d.id.clone(),
                ok,
                outcome,
            });
        }
        let given_up: Vec<&str> = claimed
            .iter()
            .zip(&tried)
            .filter(|(d, t)| !t.ok && d.attempts >= MAX_DELIVERY_ATTEMPTS)
            .map(|(d, _)| d.id.as_str())
            .collect();
        // What came of the tries, written with a few more chances than a change usually
        // gets: a write lost here leaves the tries claimed until their lease ends.
        let mut left = 3;
        let written = loop {
            match self
                .deps
                .store
                .change_cta(cta_id, &CtaChange::Tried(tried.clone()), now)
                .await
            {
                Err(e) if e.is_retryable() && left > 0 => {
                    left -= 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                other => break other?,
            }
        };
        let Changed::Applied { cta, .. } = written else {
            return Ok(());
        };
        // Given up on now: said on the bus, where an alarm or a person can take it up.
        if !given_up.is_empty() {
            warn!(cta_id, deliveries = ?given_up, "notifications given up");
            let detail = json!({"deliveries": given_up, "attempts": MAX_DELIVERY_ATTEMPTS});
            self.publish("cta.undelivered", &cta, "undelivered", detail, now)
                .await?;
        }
        Ok(())
    }

    /// One delivery: the recipient's message (with a one-time link of theirs, when links
    /// are on) through its channel.
    async fn send(
        &self,
        cta: &Cta,
        d: &Delivery,
        spec: &NotifierSpec,
        now: DateTime<Utc>,
    ) -> Result<String, String> {
        let link = self.recipient_link(cta, &d.recipient).await;
        let url = spec.url.as_deref().unwrap_or_default();
        let body = match spec.kind {
            NotifierKind::Webhook => webhook_body(cta, d, link.as_deref()),
            NotifierKind::Slack => slack_body(cta, d, link.as_deref()),
            NotifierKind::Email => {
                let Some(mailer) = &self.mailer else {
                    return Err("this host sends no e-mail".into());
                };
                let Some(to) = spec.to.get(&d.recipient) else {
                    return Err(format!("no address in `to` for {}", d.recipient));
                };
                let (subject, text) = mail_text(cta, d, link.as_deref());
                let mail = Mail {
                    from: spec.from.clone().unwrap_or_default(),
                    to: to.clone(),
                    subject,
                    text,
                    delivery_id: d.id.clone(),
                };
                return mailer.send(&mail).await;
            }
        };
        let Some(notifier) = &self.notifier else {
            return Err("this host sends no notifications".into());
        };
        let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
        let mut headers = vec![
            ("Content-Type".to_owned(), "application/json".to_owned()),
            (DELIVERY_HEADER.to_owned(), d.id.clone()),
        ];
        if let Some(secret) = &spec.secret {
            headers.push((
                SIGNATURE_HEADER.to_owned(),
                sign(secret, now.timestamp(), &body),
            ));
        }
        let status = notifier.post(url, &headers, body).await?;
        Ok(status.to_string())
    }

    /// A link minted for `recipient`: a `user:` assignee answers as that user; a group, or
    /// the owner, as itself.
    async fn recipient_link(&self, cta: &Cta, recipient: &str) -> Option<String> {
        self.links.as_ref()?;
        let id = recipient.strip_prefix("user:").unwrap_or(recipient);
        match self.link_for(cta, id).await {
            Ok((url, _)) => Some(url),
            Err(e) => {
                warn!(cta_id = %cta.cta_id, error = %e, "no link for a notification");
                None
            }
        }
    }

    /// Says what happened to a question's notifications on the bus (`cta.reminded`,
    /// `cta.escalated`, `cta.undelivered`), with an id of its own that a redelivery repeats.
    async fn publish(
        &self,
        detail_type: &str,
        cta: &Cta,
        round: &str,
        extra: Value,
        now: DateTime<Utc>,
    ) -> Result<(), ServiceError> {
        let mut detail = json!({
            "ctaId": cta.cta_id,
            "runId": cta.run_id,
            "assignees": cta.assignees,
            "expiresAt": cta.expires_at,
        });
        if let (Value::Object(d), Value::Object(e)) = (&mut detail, extra) {
            d.extend(e);
        }
        let event = Event {
            id: format!("{}:{round}", cta.cta_id),
            detail_type: detail_type.into(),
            detail,
            time: now,
        };
        Ok(self.deps.bus.publish(&[event]).await?)
    }
}

/// What a message of a reminder or an escalation starts with, for a person.
fn lead(d: &Delivery) -> &'static str {
    match event_type(d) {
        "cta.reminded" => "Reminder: ",
        "cta.escalated" => "Escalated to you: ",
        _ => "",
    }
}

/// What kind of message a round is, as its `type` says.
fn event_type(d: &Delivery) -> &'static str {
    match d.round.as_str() {
        "asked" => "cta.request",
        "escalated" => "cta.escalated",
        _ => "cta.reminded",
    }
}

/// A webhook's JSON: the question, its context, its recipient and their link.
fn webhook_body(cta: &Cta, d: &Delivery, link: Option<&str>) -> Value {
    let mut body = json!({
        "type": event_type(d),
        "deliveryId": d.id,
        "attempt": d.attempts,
        "ctaId": cta.cta_id,
        "runId": cta.run_id,
        "rootRunId": cta.root_run_id,
        "agent": cta.agent,
        "runPrompt": cta.run_prompt,
        "assignees": cta.assignees,
        "requiredApprovals": cta.required,
        "recipient": d.recipient,
        "expiresAt": cta.expires_at,
    });
    if let (Value::Object(b), Ok(Value::Object(r))) =
        (&mut body, serde_json::to_value(&cta.request))
    {
        b.extend(r);
    }
    if let Some(g) = &cta.gated {
        body["gated"] = json!(g);
    }
    if let Some(link) = link {
        body["link"] = json!(link);
    }
    body
}

/// Slack's incoming-webhook message: the question, its context, and a button holding the
/// recipient's link.
fn slack_body(cta: &Cta, d: &Delivery, link: Option<&str>) -> Value {
    let lead = lead(d);
    let agent = cta.agent.as_deref().unwrap_or("an agent");
    let question = cta.request.question();
    let mut context = format!(
        "Run `{}` · for {} · answer by {}",
        cta.run_id,
        d.recipient,
        cta.expires_at.format("%Y-%m-%d %H:%M UTC")
    );
    if let Some(g) = &cta.gated {
        context.push_str(&format!(" · tool `{}`", g.tool));
    }
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "mrkdwn",
            "text": format!("{lead}*{agent}* asks: {question}")}}),
        json!({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]}),
    ];
    if let Some(link) = link {
        blocks.push(json!({"type": "actions", "elements": [{"type": "button",
            "text": {"type": "plain_text", "text": "Answer"}, "url": link,
            "action_id": "baton-answer"}]}));
    }
    json!({"text": format!("{lead}{agent} asks: {question}"), "blocks": blocks})
}

/// An e-mail's subject and plain text: the question, its context, how to answer (the
/// recipient's link, or the API), and when it expires.
fn mail_text(cta: &Cta, d: &Delivery, link: Option<&str>) -> (String, String) {
    let lead = lead(d);
    let agent = cta.agent.as_deref().unwrap_or("an agent");
    let question = cta.request.question();
    // One line, cut at a character, so a subject never carries a header of its own.
    let line: String = question
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(120)
        .collect();
    let subject = format!("{lead}{agent} asks: {line}");
    let mut text = format!("{lead}{agent} asks:\n\n{question}\n\n");
    if let crate::cta::CtaRequest::Choice { options, .. } = &cta.request {
        for o in options {
            text.push_str(&format!("  - {} ({})\n", o.label, o.id));
        }
        text.push('\n');
    }
    if let Some(g) = &cta.gated {
        text.push_str(&format!(
            "It is asked before tool `{}` runs with:\n{}\n\n",
            g.tool, g.input
        ));
    }
    if let Some(prompt) = &cta.run_prompt {
        text.push_str(&format!("The run was asked: {prompt}\n"));
    }
    text.push_str(&format!(
        "Run {} · for {} · answer by {}\n\n",
        cta.run_id,
        d.recipient,
        cta.expires_at.format("%Y-%m-%d %H:%M UTC")
    ));
    match link {
        Some(link) => text.push_str(&format!(
            "Answer here (this link is yours, and works once):\n{link}\n"
        )),
        None => text.push_str(&format!(
            "Answer through Baton's console or its API: POST /ctas/{}/response\n",
            cta.cta_id
        )),
    }
    text.push_str(&format!("\n-- \nBaton delivery {}\n", d.id));
    (subject, text)
}

/// `t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub fn sign(secret: &str, t: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("t={t},v1={hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_e_mail_s_subject_is_one_line_and_its_text_holds_the_link() {
        let now = Utc::now();
        let cta: Cta = serde_json::from_value(json!({"ctaId": "c1", "runId": "r1",
            "toolCallId": "t1", "owner": "o", "kind": "approval",
            "message": "Pay?\r\nBcc: everyone@example.com", "status": "pending",
            "createdAt": now, "expiresAt": now}))
        .expect("a CTA");
        let d = Delivery::new("asked", "mail", "user:dave");
        let (subject, text) = mail_text(&cta, &d, Some("https://b.example.com/console#/link/t"));
        assert!(!subject.contains(['\r', '\n']), "{subject:?}");
        assert!(
            subject.ends_with("asks: Pay?  Bcc: everyone@example.com"),
            "{subject}"
        );
        assert!(text.contains("for user:dave"), "{text}");
        assert!(
            text.contains("\nhttps://b.example.com/console#/link/t\n"),
            "{text}"
        );
        let (_, text) = mail_text(&cta, &d, None);
        assert!(text.contains("POST /ctas/c1/response"), "{text}");
    }

    #[test]
    fn a_signature_covers_the_time_and_the_body() {
        let s = sign("a-secret-of-16-chars", 1_700_000_000, b"{\"a\":1}");
        assert!(s.starts_with("t=1700000000,v1="), "{s}");
        assert_eq!(s.len(), "t=1700000000,v1=".len() + 64);
        assert_ne!(s, sign("a-secret-of-16-chars", 1_700_000_001, b"{\"a\":1}"));
        assert_ne!(s, sign("a-secret-of-16-chars", 1_700_000_000, b"{\"a\":2}"));
        assert_ne!(s, sign("another-secret-16ch", 1_700_000_000, b"{\"a\":1}"));
    }

    #[test]
    fn retries_back_off() {
        let waits: Vec<i64> = (1..=5).map(|a| backoff(a).num_seconds()).collect();
        assert_eq!(waits, [30, 60, 120, 240, 480]);
    }
}
