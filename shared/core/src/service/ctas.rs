//! The CTA side of the requests: the inbox, answers (by the API, a bus event or a one-time
//! link), expiry and timers. An answer settles its CTA in the CTA's own item and queues a
//! message for the run's one writer; it never edits the timeline.

use chrono::{DateTime, Utc};
use tracing::{info, warn};

use super::{Requests, ServiceError, Shared, Steps};
use crate::cta::{AuditEvent, Cta, CtaChange, CtaResponse, CtaStatus, Settlement, Via};
use crate::error::PortError;
use crate::message::{Input, StepMessage, is_run_timer};
use crate::ports::{Changed, CtaPosition, CtaQuery, Settled};

/// The most CTAs one page holds.
pub const MAX_CTA_PAGE: usize = 100;
/// The most bytes of CTAs one page holds, as Lambda's reply counts them
/// ([`super::enveloped_len`]), but one CTA, whatever its size (an item is at most 400 KB): with
/// the page's framing, a reply stays under Lambda's 6 MB.
pub const CTA_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// Who answered through a one-time link minted before links named their recipient, as the
/// CTA records it.
pub const LINK_RESPONDER: &str = "link";

/// Who answers a question, and through what.
#[derive(Debug, Clone)]
pub struct Answerer {
    /// Who: an API caller's id, a link's recipient, a bus event's `responder` (none: a bus
    /// event that names no one).
    pub id: Option<String>,
    /// The caller's groups (an API caller's, from its token; none through a link or the bus).
    pub groups: Vec<String>,
    pub via: Via,
}

impl Answerer {
    /// An API caller (`via`: the API, or the console).
    pub fn caller(id: impl Into<String>, groups: Vec<String>, via: Via) -> Self {
        Self {
            id: Some(id.into()),
            groups,
            via,
        }
    }

    /// Whether it may answer `cta`: its owner or an assignee. Through the bus, the sender
    /// is trusted with who it names, but a question with assignees is answered by its owner
    /// or a `user:` assignee the event names (a group's members are not known there).
    fn may_answer(&self, cta: &Cta) -> bool {
        match (&self.id, self.via) {
            (_, Via::Link) => true,
            (None, Via::Bus) => cta.assignees.is_empty(),
            (Some(id), Via::Bus) => cta.assignees.is_empty() || cta.may_answer(id, &[]),
            (Some(id), _) => cta.may_answer(id, &self.groups),
            (None, _) => false,
        }
    }
}

/// What a page of CTAs asks the store for: `limit` + 1 of `status` under `root_run_id`,
/// after `cursor` (a previous page's `next`); `None` when the page is empty by its cursor (a
/// position among another status's CTAs is before or after all of this one's).
fn page_query(
    status: Option<CtaStatus>,
    root_run_id: Option<&str>,
    cursor: Option<&str>,
    limit: usize,
) -> Result<Option<CtaQuery>, ServiceError> {
    if !(1..=MAX_CTA_PAGE).contains(&limit) {
        return Err(ServiceError::Invalid(format!(
            "`limit` must be between 1 and {MAX_CTA_PAGE}"
        )));
    }
    let mut after: Option<CtaPosition> = cursor
        .map(|c| super::decode_cursor(c, "CTAs"))
        .transpose()?;
    if let (Some(a), Some(st)) = (&after, status)
        && a.status != st
    {
        if a.status.as_str() > st.as_str() {
            return Ok(None);
        }
        after = None;
    }
    Ok(Some(CtaQuery {
        status,
        root_run_id: root_run_id.map(str::to_owned),
        after,
        limit: limit + 1,
    }))
}

impl Requests {
    /// A page of an owner's CTAs, optionally of one status and under one top-level run
    /// (every CTA of the run and of its subagents, at any depth): at most `limit` (up to
    /// [`MAX_CTA_PAGE`]) and at most [`CTA_PAGE_BYTES`] of CTAs (one, whatever its size), after
    /// `cursor` (a previous page's `next`). Returns the page and, when more follow, the
    /// cursor of the next.
    pub async fn list_ctas(
        &self,
        owner: &str,
        status: Option<CtaStatus>,
        root_run_id: Option<&str>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Cta>, Option<String>), ServiceError> {
        let Some(query) = page_query(status, root_run_id, cursor, limit)? else {
            return Ok((Vec::new(), None));
        };
        if let Some(root) = root_run_id {
            match self.shared.deps.store.get_run(root).await? {
                Some(rec) if rec.run.owner == owner => {}
                _ => return Err(ServiceError::NotFound(format!("no run `{root}`"))),
            }
        }
        let mut ctas = self.shared.deps.store.list_ctas(owner, &query).await?;
        let next = super::cut_page(&mut ctas, limit, CTA_PAGE_BYTES, CtaPosition::of);
        Ok((ctas, next))
    }

    /// A page of the CTAs assigned to the caller `id` in `groups` (by a `user:` assignee that
    /// names it, or a `group:` one it is in), as [`Requests::list_ctas`] pages an owner's.
    pub async fn list_assigned(
        &self,
        id: &str,
        groups: &[String],
        status: Option<CtaStatus>,
        root_run_id: Option<&str>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Cta>, Option<String>), ServiceError> {
        let Some(query) = page_query(status, root_run_id, cursor, limit)? else {
            return Ok((Vec::new(), None));
        };
        let mut principals = vec![format!("user:{id}")];
        if let Some((_, sub)) = id.rsplit_once('#') {
            principals.push(format!("user:{sub}"));
        }
        principals.extend(groups.iter().map(|g| format!("group:{g}")));
        let mut ctas = self
            .shared
            .deps
            .store
            .list_assigned(&principals, &query)
            .await?;
        let next = super::cut_page(&mut ctas, limit, CTA_PAGE_BYTES, CtaPosition::of);
        Ok((ctas, next))
    }

    /// A CTA by id, if `owner`'s (any owner's for `None`).
    pub async fn get_cta(&self, owner: Option<&str>, cta_id: &str) -> Result<Cta, ServiceError> {
        self.shared.get_cta(owner, cta_id).await
    }

    /// A CTA by id, if the caller `id` in `groups` owns it or is among its assignees.
    pub async fn cta_for(
        &self,
        id: &str,
        groups: &[String],
        cta_id: &str,
    ) -> Result<Cta, ServiceError> {
        match self.shared.deps.store.get_cta(cta_id).await? {
            Some(c) if c.may_answer(id, groups) => Ok(c),
            _ => Err(ServiceError::NotFound(format!("no CTA `{cta_id}`"))),
        }
    }

    /// Accepts an answer with the CTA's own conditional write, then queues the resolution
    /// for the run's writer. `owner` is `None` for trusted callers (the bus consumer);
    /// `responder` is who answered, recorded with the answer.
    ///
    /// The answer that won, posted again by the same responder, is accepted again and
    /// changes nothing (its resolution is re-sent, deduplicated): a client that retries
    /// after a lost reply or a 503 whose write went through is told it succeeded.
    ///
    /// An approval that needs several approvers takes each approval as one of them (the
    /// same person counts once) and is returned still `pending` until the last one needed;
    /// the first rejection settles it, rejected.
    pub async fn answer_cta(
        &self,
        by: &Answerer,
        cta_id: &str,
        response: CtaResponse,
    ) -> Result<Cta, ServiceError> {
        self.shared.answer(by, cta_id, response, true).await
    }
}

impl Shared {
    pub(super) async fn get_cta(
        &self,
        owner: Option<&str>,
        cta_id: &str,
    ) -> Result<Cta, ServiceError> {
        match self.deps.store.get_cta(cta_id).await? {
            Some(c) if owner.is_none_or(|o| o == c.owner) => Ok(c),
            _ => Err(ServiceError::NotFound(format!("no CTA `{cta_id}`"))),
        }
    }
    /// [`Requests::answer_cta`]; with `again: false`, only the write that settles the CTA is
    /// accepted (a one-time link answers once: the winning answer posted again is refused).
    pub(super) async fn answer(
        &self,
        by: &Answerer,
        cta_id: &str,
        response: CtaResponse,
        again: bool,
    ) -> Result<Cta, ServiceError> {
        let cta = match self.deps.store.get_cta(cta_id).await? {
            Some(c) => c,
            None => return Err(ServiceError::NotFound(format!("no CTA `{cta_id}`"))),
        };
        if !by.may_answer(&cta) {
            // A caller with no part in it is not told it exists (ids are not guessable).
            if by.via != Via::Bus
                && by.id.as_deref() != Some(&cta.owner)
                && cta.assignees.is_empty()
            {
                return Err(ServiceError::NotFound(format!("no CTA `{cta_id}`")));
            }
            return Err(ServiceError::Forbidden {
                code: "not_assignee",
                message: format!(
                    "CTA `{cta_id}` is answered by its run's owner or its assignees ({}) alone",
                    cta.assignees.join(", ")
                ),
            });
        }
        let responder = by.id.clone();
        if cta.status != CtaStatus::Pending {
            if !again {
                return Err(self.settled_error(&cta).await);
            }
            return self
                .settled_again(cta, &response, responder.as_deref())
                .await;
        }
        // A well-formed answer that does not fit this CTA (another kind, an option it does
        // not offer, a blank required text) conflicts with the CTA as it is: 409, not 400.
        response
            .validate_against(&cta.request)
            .map_err(|e| ServiceError::Conflict {
                code: "answer_mismatch",
                message: e.to_string(),
            })?;
        response
            .check_raise(cta.budget.is_some())
            .map_err(|message| ServiceError::Conflict {
                code: "answer_mismatch",
                message,
            })?;
        let now = self.deps.clock.now();
        if now >= cta.expires_at {
            self.expire_cta(cta_id).await?;
            return Err(ServiceError::Gone(format!(
                "CTA `{cta_id}` expired at {}",
                cta.expires_at.to_rfc3339()
            )));
        }
        // One approval of several: counted by the record's own conditional write.
        let approves = matches!(response, CtaResponse::Approval { approved: true, .. });
        let change = match (&responder, approves && cta.required > 1) {
            (Some(who), true) => CtaChange::Approve {
                by: who.clone(),
                via: by.via,
            },
            (None, true) => {
                return Err(ServiceError::Invalid(format!(
                    "CTA `{cta_id}` needs {} distinct approvers: an approval must name who gives it",
                    cta.required
                )));
            }
            (_, false) => CtaChange::Settle(Settlement::Answered {
                response: response.clone(),
                responder: responder.clone(),
                via: Some(by.via),
            }),
        };
        match self.deps.store.change_cta(cta_id, &change, now).await? {
            Changed::Applied { cta, settled: true } => {
                crate::failpoint::hit("answer.after_settle")?;
                self.send_resolution(&cta).await?;
                info!(cta_id, run_id = %cta.run_id, "CTA answered");
                Ok(cta)
            }
            // One approval of several, or the same person's again: still waiting.
            Changed::Applied {
                cta,
                settled: false,
            } => {
                info!(
                    cta_id,
                    approvals = cta.approvals.len(),
                    required = cta.required,
                    "CTA approved: waiting for more approvers"
                );
                Ok(cta)
            }
            Changed::Unchanged(cta) if !again => Err(self.settled_error(&cta).await),
            Changed::Unchanged(cta) => Ok(cta),
            Changed::Refused(cta) if !again => Err(self.settled_error(&cta).await),
            Changed::Refused(cta) => {
                self.settled_again(cta, &response, responder.as_deref())
                    .await
            }
            Changed::NotFound => Err(ServiceError::NotFound(format!("no CTA `{cta_id}`"))),
        }
    }

    /// An answer to a CTA already settled: the same as the answer that won (same response,
    /// same responder) is that answer again; anything else is refused.
    async fn settled_again(
        &self,
        cta: Cta,
        response: &CtaResponse,
        responder: Option<&str>,
    ) -> Result<Cta, ServiceError> {
        // An approver of several, approving again after the last approval settled it.
        let approver = matches!(response, CtaResponse::Approval { approved: true, .. })
            && responder.is_some_and(|r| cta.approvals.iter().any(|a| a.by == r));
        let same = cta.status == CtaStatus::Answered
            && (approver
                || (cta.response.as_ref() == Some(response)
                    && cta.responder.as_deref() == responder));
        if same {
            self.send_resolution(&cta).await?;
            info!(cta_id = %cta.cta_id, "the answer that won, posted again: accepted");
            return Ok(cta);
        }
        Err(self.settled_error(&cta).await)
    }

    /// The refusal for a CTA that is no longer pending. An answered CTA's resolution is
    /// sent again on the way (deduplicated), which repairs a send lost after the write.
    async fn settled_error(&self, cta: &Cta) -> ServiceError {
        match cta.status {
            CtaStatus::Expired => ServiceError::Gone(format!("CTA `{}` expired", cta.cta_id)),
            CtaStatus::Cancelled => ServiceError::Conflict {
                code: "cta_cancelled",
                message: format!("CTA `{}` was cancelled with its run", cta.cta_id),
            },
            _ => {
                if let Err(e) = self.send_resolution(cta).await {
                    warn!(cta_id = %cta.cta_id, error = %e, "re-sending a resolution failed");
                }
                ServiceError::AlreadyAnswered(Box::new(cta.clone()))
            }
        }
    }

    /// Tells the run how its CTA was settled, then marks the CTA's outbox done. A crash in
    /// between leaves the resolution outstanding: the sweep sends it again (deduplicated by
    /// id, and ignored by a run that applied it already).
    pub(super) async fn send_resolution(&self, cta: &Cta) -> Result<(), PortError> {
        self.queue_resolution(cta).await?;
        crate::failpoint::hit("resolution.after_send")?;
        self.deps.store.clear_resolution(&cta.cta_id).await
    }

    async fn queue_resolution(&self, cta: &Cta) -> Result<(), PortError> {
        let input = match (&cta.status, &cta.response) {
            (CtaStatus::Answered, Some(r)) => Input::CtaAnswered {
                cta_id: cta.cta_id.clone(),
                response: r.clone(),
                responder: cta.responder.clone(),
            },
            (CtaStatus::Expired, _) => Input::CtaExpired {
                cta_id: cta.cta_id.clone(),
            },
            _ => return Ok(()),
        };
        let id = format!("{}:{}", cta.cta_id, cta.status.as_str());
        self.deps
            .queue
            .send(&[StepMessage {
                run_id: cta.run_id.clone(),
                id,
                input,
                owed: false,
            }])
            .await
    }
}

impl Steps {
    /// A timer fired: a run's own timer (named [`crate::message::TIMER_PREFIX`]…, a plan step's timeout)
    /// goes to its run, whose step decides whether it is still due; any other is a CTA's
    /// expiry (`expire_cta`).
    ///
    /// `due`, when the timer says it (a schedule's event does), is when it was set for: one
    /// that fires early (a scheduler keeps its time to the minute) is set again for then,
    /// not handed to the run, which would find it not due and drop it.
    pub async fn fire_timer(
        &self,
        name: &str,
        run_id: &str,
        due: Option<DateTime<Utc>>,
    ) -> Result<(), ServiceError> {
        if !is_run_timer(name) {
            return self.shared.cta_timer(name).await;
        }
        if self.shared.deps.store.get_run(run_id).await?.is_none() {
            return Err(ServiceError::NotFound(format!("no run `{run_id}`")));
        }
        if let Some(due) = due.filter(|due| self.shared.early(*due)) {
            info!(timer = name, run_id, due = %due.to_rfc3339(), "timer fired early: set again");
            return Ok(self
                .shared
                .deps
                .scheduler
                .schedule(name, run_id, due)
                .await?);
        }
        Ok(self
            .shared
            .deps
            .queue
            .send(&[StepMessage {
                run_id: run_id.into(),
                id: format!("{name}:fired"),
                input: Input::Timer {
                    timer_id: name.into(),
                },
                owed: false,
            }])
            .await?)
    }
}

impl Requests {
    /// A one-time answer link to a pending CTA, minted for the caller `id` (its owner or an
    /// assignee: the answer is recorded as theirs), and when it stops working.
    pub async fn mint_link(
        &self,
        id: &str,
        groups: &[String],
        cta_id: &str,
    ) -> Result<(String, chrono::DateTime<chrono::Utc>), ServiceError> {
        let cta = self.cta_for(id, groups, cta_id).await?;
        self.shared.link_for(&cta, id).await
    }

    /// The CTA a one-time link opens, while the link may still answer it, and records that
    /// it was opened. A link to a CTA that is settled says how, even past the CTA's expiry:
    /// used (`link_used`), answered another way (`cta_answered`), cancelled
    /// (`cta_cancelled`) or expired (`link_expired`). Only a token this deployment did not
    /// sign is `link_invalid`.
    pub async fn cta_by_link(&self, token: &str) -> Result<Cta, ServiceError> {
        let (cta, claims) = self.open_link(token).await?;
        let opened = AuditEvent::new("link_opened", self.shared.deps.clock.now())
            .by(claims.recipient.as_deref(), Some(Via::Link));
        match self
            .shared
            .deps
            .store
            .change_cta(
                &cta.cta_id,
                &CtaChange::Record(opened),
                self.shared.deps.clock.now(),
            )
            .await
        {
            Ok(Changed::Applied { cta, .. }) => Ok(cta),
            Ok(_) => Ok(cta),
            // The history is the record's: a page that opens shows the question even if
            // the note that it was opened could not be written.
            Err(e) => {
                warn!(cta_id = %cta.cta_id, error = %e, "recording a link's opening failed");
                Ok(cta)
            }
        }
    }

    /// [`Requests::cta_by_link`] without recording anything: the CTA and the token's claims.
    async fn open_link(&self, token: &str) -> Result<(Cta, crate::links::Claims), ServiceError> {
        let refuse = |code: &'static str, message: &str| ServiceError::Link {
            code,
            message: message.into(),
        };
        let invalid = || refuse("link_invalid", "this link is not valid");
        let expired = || {
            refuse(
                "link_expired",
                "this link has expired: the question stopped waiting for an answer",
            )
        };
        let links = self.shared.links.as_ref().ok_or_else(invalid)?;
        let now = self.shared.deps.clock.now();
        // The signature alone (checked as at the earliest instant, so that it passes past
        // the expiry too): how a settled CTA was settled says more than that its link expired.
        let claims = links
            .verify(token, chrono::DateTime::<chrono::Utc>::MIN_UTC)
            .map_err(|_| invalid())?;
        let past = now.timestamp() >= claims.expires_at;
        let Some(cta) = self
            .shared
            .deps
            .store
            .get_cta(&claims.cta_id)
            .await?
            .filter(|c| c.link_nonce.as_deref() == Some(claims.nonce.as_str()))
        else {
            // Signed here, for a CTA no longer kept (past the retention period).
            return Err(if past { expired() } else { invalid() });
        };
        // This link answered: its recipient's answer (or approval) through a link, or, for a
        // link that names no one, any answer through one.
        let by = claims.recipient.as_deref().unwrap_or(LINK_RESPONDER);
        let used = cta.audit.iter().any(|e| {
            matches!(e.kind.as_str(), "answered" | "approved")
                && e.via == Some(Via::Link)
                && e.by.as_deref() == Some(by)
        }) || (cta.status == CtaStatus::Answered
            && claims.recipient.is_none()
            && cta.responder.as_deref() == Some(LINK_RESPONDER));
        match cta.status {
            _ if used => Err(refuse(
                "link_used",
                "this link was already used: its answer is recorded",
            )),
            CtaStatus::Answered => {
                Err(refuse("cta_answered", "this question was already answered"))
            }
            CtaStatus::Cancelled => Err(refuse(
                "cta_cancelled",
                "this question was cancelled: its run ended before it was answered",
            )),
            CtaStatus::Expired => Err(expired()),
            CtaStatus::Pending if past || now >= cta.expires_at => Err(expired()),
            CtaStatus::Pending => Ok((cta, claims)),
        }
    }

    /// Answers through a one-time link, as its recipient: the first answer wins, as through
    /// the API.
    pub async fn answer_by_link(
        &self,
        token: &str,
        response: CtaResponse,
    ) -> Result<Cta, ServiceError> {
        let (cta, claims) = self.open_link(token).await?;
        let by = Answerer {
            id: Some(claims.recipient.unwrap_or_else(|| LINK_RESPONDER.into())),
            groups: Vec::new(),
            via: Via::Link,
        };
        // One conditional write decides: of any number of posts, only the one whose write
        // settled the question (or counted its recipient's approval) is accepted; the rest
        // are told the link was used.
        let answered = self.shared.answer(&by, &cta.cta_id, response, false).await;
        match answered {
            // Settled meanwhile (another use of the link, another answer, a cancel, the
            // expiry): said as the link says it.
            Err(
                e @ (ServiceError::AlreadyAnswered(_)
                | ServiceError::Gone(_)
                | ServiceError::Conflict {
                    code: "cta_cancelled",
                    ..
                }),
            ) => Err(self.open_link(token).await.err().unwrap_or(e)),
            other => other,
        }
    }
}

impl Shared {
    /// A one-time link to `cta` (pending) for `recipient`, and when it stops working.
    pub(super) async fn link_for(
        &self,
        cta: &Cta,
        recipient: &str,
    ) -> Result<(String, chrono::DateTime<chrono::Utc>), ServiceError> {
        let Some(links) = self.links.as_ref() else {
            return Err(ServiceError::Conflict {
                code: "links_off",
                message: "one-time links are not set up on this deployment (BATON_LINK_KEY)".into(),
            });
        };
        if cta.status != CtaStatus::Pending {
            return Err(self.settled_error(cta).await);
        }
        let Some(nonce) = &cta.link_nonce else {
            return Err(ServiceError::Conflict {
                code: "links_off",
                message: format!("CTA `{}` was raised before links existed", cta.cta_id),
            });
        };
        let token = links.token_for(&cta.cta_id, nonce, cta.expires_at, recipient);
        Ok((links.url(&token), cta.expires_at))
    }
}

impl Shared {
    /// Whether a timer due at `due` fires early by this service's clock. No skew is
    /// tolerated: a question must not expire while an answer posted before `expiresAt` may
    /// still be on its way. (Re-arming cannot loop: the schedule is set for the first whole
    /// minute at or after `due`, which is after now.)
    fn early(&self, due: DateTime<Utc>) -> bool {
        self.deps.clock.now() < due
    }

    /// An expiry timer fired: settle the CTA as expired if nobody answered first.
    ///
    /// An expiry before the CTA's `expiresAt` (a scheduler keeps its time to the minute; or
    /// a forged event) does not settle it: its schedule is set again for `expiresAt`, so
    /// that it is not lost.
    pub(super) async fn expire_cta(&self, cta_id: &str) -> Result<(), ServiceError> {
        let now = self.deps.clock.now();
        let Some(cta) = self.deps.store.get_cta(cta_id).await? else {
            return Err(ServiceError::NotFound(format!("no CTA `{cta_id}`")));
        };
        if cta.status == CtaStatus::Pending && self.early(cta.expires_at) {
            info!(cta_id, run_id = %cta.run_id, expires_at = %cta.expires_at.to_rfc3339(),
                "expiry fired early: set again");
            return Ok(self
                .deps
                .scheduler
                .schedule(cta_id, &cta.run_id, cta.expires_at)
                .await?);
        }
        match self
            .deps
            .store
            .settle_cta(cta_id, &Settlement::Expired, now)
            .await?
        {
            Settled::Won(cta) => {
                info!(cta_id, run_id = %cta.run_id, "CTA expired");
                Ok(self.send_resolution(&cta).await?)
            }
            // Fired again after it settled the CTA (its send failed, or a scheduler
            // delivered twice): the resolution is sent again (deduplicated by its id), so a
            // run is not left waiting for the sweep.
            Settled::Lost(cta) if cta.status == CtaStatus::Expired => {
                Ok(self.send_resolution(&cta).await?)
            }
            Settled::Lost(_) | Settled::NotFound => Ok(()),
        }
    }
}
