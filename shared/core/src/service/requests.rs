//! The request side for runs: what the HTTP API asks of the service about a run (create,
//! read, cancel, its files; follow-ups are in `follow_ups.rs`). None of these edit a run's
//! timeline: they validate, write what is theirs to write (a run item on create), and queue
//! a message for the run's one writer. CTAs' requests are in `ctas.rs`.

use tracing::info;

use super::{CreateRun, MAX_METADATA_BYTES, Requests, RunView, ServiceError};
use crate::message::{Effect, Input, StepMessage};
use crate::ports::{Created, RunPosition, RunQuery, RunRecord};
use crate::run::RunStatus;
use crate::run::{NewRun, Run, check_context_size};
use crate::timeline::{Entry, EntryBody};

/// Files up to this size are sent in the API's reply; larger ones, where the store can, by
/// a short-lived URL (a 302): a Lambda reply is at most 6 MB, base64 makes a 4.5 MB file 6.
pub const INLINE_FILE_BYTES: u64 = 1024 * 1024;
/// The most runs one page of `list_runs` holds.
pub const MAX_RUN_PAGE: usize = 100;
/// The most bytes of runs one page holds, as Lambda's reply counts them (but one run: a run
/// item is at most 400 KB): with the page's framing, a reply stays under Lambda's 6 MB. A
/// run item is a few KB (its prompt and result are previews, its metadata at most 4 KB), so
/// a page is far below it.
pub const RUN_PAGE_BYTES: usize = 4 * 1024 * 1024;
/// The most runs a run's tree reads under its top-level run, and how many a read asks for.
pub const MAX_TREE_RUNS: usize = 500;
const TREE_PAGE: usize = 100;
/// How far back through forks of forks a file is looked for.
const MAX_FORK_HOPS: usize = 8;
/// How long a file's URL serves it.
pub const FILE_LINK_TTL: std::time::Duration = std::time::Duration::from_secs(300);

/// Which runs a list keeps: of a status, of an agent, created in a span (`since`
/// inclusive, `until` exclusive).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub agent: Option<String>,
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

impl RunFilter {
    fn keeps(&self, run: &Run) -> bool {
        self.status.is_none_or(|s| s == run.status)
            && self.agent.as_deref().is_none_or(|a| a == run.agent)
    }
}

/// A run and the runs under it ([`Requests::run_tree`]).
#[derive(Debug, Clone)]
pub struct RunTree {
    pub run: Run,
    /// Oldest first, each one's parent (the run, or one of these) before it.
    pub descendants: Vec<Run>,
    /// More runs are under its top-level run than were read.
    pub truncated: bool,
}

impl Requests {
    pub async fn create_run(
        &self,
        owner: &str,
        req: CreateRun,
        idempotency_key: Option<&str>,
    ) -> Result<Run, ServiceError> {
        let agent = req
            .agent
            .unwrap_or_else(|| crate::agent::ORCHESTRATOR.to_owned());
        if let Some(context) = &req.context {
            let typed = context
                .get("type")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|t| !t.is_empty());
            if !typed {
                return Err(ServiceError::Invalid(
                    "`context` must be an object with a non-empty string `type`, e.g. \
                     {\"type\": \"document\", \"id\": \"...\"}"
                        .into(),
                ));
            }
            check_context_size("context", context).map_err(|e| {
                ServiceError::Invalid(format!("{e} (it is sent with every model call)"))
            })?;
        }
        if let Some(id) = &req.sandbox_id {
            crate::scope::check_sandbox_id(id).map_err(ServiceError::Invalid)?;
        }
        if let Some(github) = &req.github {
            crate::scope::check_github(github).map_err(ServiceError::Invalid)?;
        }
        if let Some(metadata) = &req.metadata {
            let size = metadata.to_string().len();
            if size > MAX_METADATA_BYTES {
                return Err(ServiceError::Invalid(format!(
                    "`metadata` is {size} bytes as JSON; at most {MAX_METADATA_BYTES} are \
                     allowed (it labels the run and is stored with it at every step)"
                )));
            }
        }
        let Some(def) = self.shared.catalog.agent(&agent) else {
            return Err(ServiceError::Invalid(format!(
                "unknown agent `{agent}`; known agents: {}",
                self.shared.catalog.agent_names().join(", ")
            )));
        };
        let on_expiry = req.on_expiry.or(def.on_expiry).unwrap_or_default();
        let budget = match (req.budget_usd, def.max_cost_usd) {
            (Some(usd), max) => {
                crate::budget::check_amount("budgetUsd", usd).map_err(ServiceError::Invalid)?;
                if let Some(max) = max.filter(|m| usd > *m) {
                    return Err(ServiceError::Invalid(format!(
                        "`budgetUsd` is {usd}; agent `{agent}` allows at most {max}                          (its maxCostUsd)"
                    )));
                }
                Some(usd)
            }
            (None, max) => max,
        };
        let now = self.shared.deps.clock.now();
        let mut run = Run::new(NewRun {
            run_id: format!("run_{}", uuid::Uuid::new_v4().simple()),
            agent,
            owner: owner.to_owned(),
            parent: None,
            depth: 0,
            on_expiry,
            sandbox_id: req.sandbox_id,
            metadata: req.metadata,
            context: req.context,
            root_run_id: None,
            now,
        });
        run.origin.github = req.github;
        run.origin.budget = budget.map(|budget_usd| crate::budget::Budget { budget_usd });
        run.next_seq = 1;
        run.set_prompt(&req.prompt);
        run.origin.tier = req.options.tier;
        let first = Entry {
            seq: 0,
            at: now,
            body: EntryBody::User {
                text: req.prompt,
                message_id: None,
                options: req.options,
            },
        };
        let start = vec![Effect::Send(StepMessage {
            run_id: run.run_id.clone(),
            id: format!("{}:start", run.run_id),
            input: Input::Start,
            owed: false,
        })];
        let admission = self.shared.admission();
        run.active_slot = admission.is_some_and(|a| a.active_runs.is_some());
        let record = match self
            .shared
            .deps
            .store
            .create_run(&run, &[first], &start, idempotency_key, admission.as_ref())
            .await?
        {
            Created::Created => RunRecord { run, outbox: start },
            Created::Existing(rec) => retried(*rec, "start"),
        };
        crate::failpoint::hit("create.after_insert")?;
        if req.watch {
            self.expect_watcher(&record.run.run_id).await?;
        }
        self.shared.perform(&record.run, &record.outbox).await?;
        info!(run_id = %record.run.run_id, agent = %record.run.agent, "run created");
        Ok(record.run)
    }

    /// Someone will watch `run_id`: leased to watchers (where the store keeps leases) and
    /// expected by the live channel, for as long as a watch grant lasts, before the message
    /// that starts its turn is sent (so that the turn's first reply streams).
    pub(super) async fn expect_watcher(&self, run_id: &str) -> Result<(), ServiceError> {
        let until = self.shared.deps.clock.now()
            + chrono::Duration::seconds(crate::live::grant::GRANT_SECONDS);
        // The API function on AWS has no channel of its own; its steps read the lease.
        self.shared.deps.store.lease_watch(run_id, until).await?;
        if let Some(live) = &self.shared.live {
            live.expect(run_id, until);
        }
        Ok(())
    }

    /// Who started a run, if it exists (for an operator's reads).
    pub async fn run_owner(&self, run_id: &str) -> Result<Option<String>, ServiceError> {
        Ok(self
            .shared
            .deps
            .store
            .get_run(run_id)
            .await?
            .map(|r| r.run.owner))
    }

    pub(super) async fn owned_run(&self, owner: &str, run_id: &str) -> Result<Run, ServiceError> {
        match self.shared.deps.store.get_run(run_id).await? {
            Some(r) if r.run.owner == owner => Ok(r.run),
            _ => Err(ServiceError::NotFound(format!("no run `{run_id}`"))),
        }
    }

    /// A page of the owner's top-level runs, newest first, that `filter` keeps: at most
    /// `limit` (up to [`MAX_RUN_PAGE`]) and at most [`RUN_PAGE_BYTES`] of runs (but one),
    /// after `cursor` (a previous page's `next`). Returns the page and, when more may
    /// follow, the next cursor. A page reads `limit` runs created in the filter's span and
    /// keeps those of its status and agent: a page may hold fewer than `limit`, or none,
    /// and still have a next. (An empty span, `since` not before `until`, holds none.)
    pub async fn list_runs(
        &self,
        owner: &str,
        filter: &RunFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Run>, Option<String>), ServiceError> {
        if !(1..=MAX_RUN_PAGE).contains(&limit) {
            return Err(ServiceError::Invalid(format!(
                "`limit` must be between 1 and {MAX_RUN_PAGE}"
            )));
        }
        let after: Option<RunPosition> = cursor
            .map(|c| super::decode_cursor(c, "runs"))
            .transpose()?;
        // An empty span holds no run (and DynamoDB refuses a range whose ends are reversed).
        if let (Some(since), Some(until)) = (filter.since, filter.until)
            && since >= until
        {
            return Ok((Vec::new(), None));
        }
        let query = RunQuery {
            after,
            since: filter.since,
            until: filter.until,
            limit: limit + 1,
        };
        let page = self.shared.deps.store.list_runs(owner, &query).await?;
        let mut runs = page.runs;
        // One more than a page was asked for, to know whether more follow; the page is the
        // first `limit` read, less those the filter leaves out. Fewer read and a `next` (a
        // listing whose run is gone): more may follow that.
        let last_read = if runs.len() > limit {
            runs.truncate(limit);
            runs.last().map(RunPosition::of)
        } else {
            page.next
        };
        runs.retain(|r| filter.keeps(r));
        let next = super::cut_page(&mut runs, limit, RUN_PAGE_BYTES, RunPosition::of)
            .or_else(|| last_read.map(|p| super::encode_cursor(&p)));
        Ok((runs, next))
    }

    /// A run and the runs under it (its subagents, theirs, its plans' steps' runs), oldest
    /// first: read from the list of runs under its top-level run, at most [`MAX_TREE_RUNS`]
    /// of them (`truncated` says when there were more).
    pub async fn run_tree(&self, owner: &str, run_id: &str) -> Result<RunTree, ServiceError> {
        let run = self.owned_run(owner, run_id).await?;
        let root = run
            .origin
            .root_run_id
            .clone()
            .unwrap_or_else(|| run.run_id.clone());
        let mut all = Vec::new();
        let mut after = None;
        // Listings read (a page goes on past one whose run is gone, within this bound).
        let mut read = 0;
        let truncated = loop {
            let want = TREE_PAGE.min(MAX_TREE_RUNS - read);
            let page = self
                .shared
                .deps
                .store
                .list_descendants(&root, after.as_ref(), want)
                .await?;
            read += want;
            all.extend(page.runs.into_iter().filter(|r| r.owner == owner));
            match page.next {
                None => break false,
                Some(_) if read >= MAX_TREE_RUNS => break true,
                next => after = next,
            }
        };
        // The runs under this one: those whose parent is it or under it. Oldest first, a
        // parent comes before its children, but for two created in the same millisecond:
        // read again until no run joins.
        let mut under = std::collections::HashSet::from([run.run_id.clone()]);
        let mut descendants = Vec::new();
        loop {
            let before = descendants.len();
            all.retain(|r| {
                let parent = r.origin.parent.as_ref().map(|p| p.run_id.as_str());
                if parent.is_some_and(|p| under.contains(p)) {
                    under.insert(r.run_id.clone());
                    descendants.push(r.clone());
                    false
                } else {
                    true
                }
            });
            if descendants.len() == before {
                break;
            }
        }
        Ok(RunTree {
            run,
            descendants,
            truncated,
        })
    }

    /// The run, its first `first` timeline entries (reading no more than that: a long
    /// history is paged with [`Requests::timeline`]), and the entry its truncated result
    /// preview comes from, if any.
    pub async fn get_run(
        &self,
        owner: &str,
        run_id: &str,
        first: usize,
    ) -> Result<RunView, ServiceError> {
        let run = self.owned_run(owner, run_id).await?;
        let store = &self.shared.deps.store;
        // Entries committed after the run was read belong to a later version: left out.
        let mut entries = store.entries_after(run_id, None, first).await?;
        entries.retain(|e| e.seq < run.next_seq);
        let result_entry = match run.outcome.result_seq {
            Some(seq) if run.outcome.result_truncated => {
                match entries.iter().find(|e| e.seq == seq) {
                    Some(e) => Some(e.clone()),
                    None => store
                        .entries_after(run_id, seq.checked_sub(1), 1)
                        .await?
                        .into_iter()
                        .find(|e| e.seq == seq),
                }
            }
            _ => None,
        };
        let more = run.next_seq > entries.len() as u64;
        // A ledger that does not read back is reported beside the run, not in its place: a
        // run's reads never fail on one stored figure.
        let ledger = match run.origin.budget {
            Some(b) => Some(match store.ledger(run.root()).await {
                Ok(l) => Ok(l.unwrap_or_else(|| crate::budget::Ledger::new(b))),
                Err(e @ crate::error::PortError::Broken { .. }) => {
                    let why = match std::error::Error::source(&e) {
                        Some(cause) => format!("{e}: {cause}"),
                        None => e.to_string(),
                    };
                    tracing::error!(run_id, error = %why, "budget ledger unreadable");
                    Err(why)
                }
                Err(e) => return Err(e.into()),
            }),
            None => None,
        };
        Ok(RunView {
            run,
            entries,
            more,
            result_entry,
            ledger,
        })
    }

    pub async fn timeline(
        &self,
        owner: &str,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<(Run, Vec<Entry>), ServiceError> {
        let run = self.owned_run(owner, run_id).await?;
        let entries = self
            .shared
            .deps
            .store
            .entries_after(run_id, after, limit)
            .await?;
        Ok((run, entries))
    }

    /// Queues a cancellation; the run's writer cancels its CTAs and children. Each cancel's
    /// message has an id of its own (from the request's `Idempotency-Key`, when it has one,
    /// so that a client's retry is one cancel): a queue that deduplicates by id never drops
    /// a later cancel as a repeat of an earlier one.
    pub async fn cancel(
        &self,
        owner: &str,
        run_id: &str,
        idempotency_key: Option<&str>,
    ) -> Result<Run, ServiceError> {
        let run = self.owned_run(owner, run_id).await?;
        if run.status.is_terminal() {
            return Err(ServiceError::Conflict {
                code: "run_ended",
                message: format!("run already ended ({})", run.status.as_str()),
            });
        }
        let id = match idempotency_key {
            Some(key) => {
                let name = format!("{}/{owner}/{run_id}/cancel/{key}", key.len());
                uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes())
            }
            None => uuid::Uuid::new_v4(),
        };
        self.shared
            .deps
            .queue
            .send(&[StepMessage {
                run_id: run_id.into(),
                id: format!("{run_id}:cancel:{}", id.simple()),
                input: Input::Cancel {
                    reason: "cancelled by the user".into(),
                },
                owed: false,
            }])
            .await?;
        crate::failpoint::hit("cancel.after_queue")?;
        Ok(run)
    }

    /// A file a tool of the owner's run returned.
    pub async fn file(
        &self,
        owner: &str,
        run_id: &str,
        file_id: &str,
    ) -> Result<crate::ports::Download, ServiceError> {
        let mut run = self.owned_run(owner, run_id).await?;
        let valid = file_id.starts_with("file_")
            && file_id[5..].chars().all(|c| c.is_ascii_hexdigit())
            && file_id.len() == 37;
        let missing = || ServiceError::NotFound(format!("no file `{file_id}` in run `{run_id}`"));
        if !valid {
            return Err(missing());
        }
        // A fork shares its history's files with the run it came from (and that one's).
        for _ in 0..MAX_FORK_HOPS {
            let key = format!("{}/{file_id}", run.run_id);
            if let Some(d) = self
                .shared
                .deps
                .blobs
                .download(&key, INLINE_FILE_BYTES, FILE_LINK_TTL)
                .await?
            {
                return Ok(d);
            }
            match run.origin.forked_from.take() {
                Some(from) => match self.shared.deps.store.get_run(&from.run_id).await? {
                    Some(r) if r.run.owner == run.owner => run = r.run,
                    _ => break,
                },
                None => break,
            }
        }
        Err(missing())
    }
}

/// The run a retried create found, with only what the create itself committed left to
/// perform: the message that starts the run (`<run_id>:<first>`), while its outbox still
/// holds it. The rest of that outbox is a step's (its questions' timers, its events): the
/// step or the sweep performs it, with grants the API function does not have.
pub(super) fn retried(mut rec: RunRecord, first: &str) -> RunRecord {
    let id = format!("{}:{first}", rec.run.run_id);
    rec.outbox
        .retain(|e| matches!(e, Effect::Send(m) if m.id == id));
    rec
}
