//! The engine's I/O for one step of one run ([`StepIo`]): the agent's plugins, the model
//! (given as much of the conversation as its context budget holds), the catalog's tools,
//! and the settling of CTAs.

use std::collections::BTreeMap;

use tracing::warn;

use super::Deps;
use super::cache::Window;
use crate::agent::{Book, Listed, PluginError, Preparation};
use crate::cta::{Cta, Settlement};
use crate::engine::{Execution, OutOfTime, StepIo, ToolOutput};
use crate::error::PortError;
use crate::failpoint;
use crate::llm::{ChatRequest, LlmError, LlmReply, fit, model_bytes, starts_group};
use crate::ports::Settled;
use crate::run::Run;
use crate::timeline::{Entry, overlay};
use crate::tools::{Effects, ToolContext, ToolError};

/// The engine's I/O for one step of one run: the plugins, the model, the catalog's tools,
/// the store's reads and CTA settlements. It holds the ports it uses, not the `Service`:
/// the step pipeline (`steps.rs`) builds one per pass, hands it to the engine, then commits.
pub(super) struct StepWorld<'a> {
    /// The ports: the model, the store, the clock, the blob store.
    pub(super) deps: &'a Deps,
    pub(super) catalog: &'a crate::agent::Catalog,
    /// The owner's daily allowance, if the host sets one.
    pub(super) daily_cost_usd: Option<f64>,
    /// The live channel, when someone watches this run.
    pub(super) live: Option<&'a std::sync::Arc<dyn crate::live::Live>>,
    /// The longest a model call may take, all its attempts timing out.
    pub(super) longest_think: std::time::Duration,
    pub(super) run: &'a Run,
    /// What the step read: the timeline from seq `base` on, and the run's first entry when
    /// `base` is past it (if the cache kept it).
    pub(super) window: &'a Window,
    /// What a think read back before the window for a model that reads history (with the
    /// window after it): cached from then on.
    pub(super) read: std::sync::OnceLock<Window>,
    /// The MCP servers' tools as listed when the step started: what a call executes.
    pub(super) listed: Listed,
    /// The step's book of agents and tools, taken from `listed`: what the engine checks
    /// a call against.
    pub(super) book: Book,
    /// When the host's invocation ends, if it does: no tool call runs past it.
    pub(super) deadline: Option<super::StepDeadline>,
    /// The plugins' states as this step last prepared them: what its tools read.
    pub(super) plugin_states: std::sync::Mutex<Option<BTreeMap<String, serde_json::Value>>>,
}

/// The first read back from a step's timeline, in entries; each next one is twice as long.
const FIRST_READ_BACK: u64 = 16;

impl StepWorld<'_> {
    /// How long a call of `tool` may run: its own timeout, or the catalog's.
    fn tool_limit(&self, tool: &str) -> std::time::Duration {
        let catalog = &self.catalog;
        catalog
            .tool(&self.listed, tool)
            .and_then(|def| def.timeout)
            .unwrap_or(catalog.limits.tool_timeout)
    }

    /// The agent's context budget ([`fit`]).
    fn budget(&self) -> usize {
        self.catalog
            .agent(&self.run.agent)
            .map_or(self.catalog.limits.context_bytes, |a| a.context_bytes)
    }

    /// What the model is given: for a model that reads history, as much of the timeline
    /// as its budget holds ([`fit`]), read backwards from what the step holds until that is
    /// over the budget (about `budget` bytes, whatever the run's length); else the step's
    /// window.
    ///
    /// `changed` (what the step resolved or added before thinking) goes over what was read.
    async fn history(&self, changed: &[Entry]) -> Result<Vec<Entry>, PortError> {
        if !self.deps.llm.reads_history() {
            return Ok(overlay(&self.window.entries, changed));
        }
        let budget = self.budget();
        let mut bytes: usize = self.window.entries.iter().map(model_bytes).sum();
        let mut grouped = self.window.entries.iter().any(starts_group);
        // The run's first message is always given, so a step that starts past it reads it
        // too (once: the cache keeps it), even when what it holds is over the budget.
        let short = bytes <= budget || !grouped || self.window.head.is_none();
        if self.read.get().is_none() && self.window.base > 0 && short {
            let store = &self.deps.store;
            let run_id = &self.run.run_id;
            let (mut lo, mut chunk, mut before) = (self.window.base, FIRST_READ_BACK, Vec::new());
            while lo > 0 && (bytes <= budget || !grouped) {
                let from = lo.saturating_sub(chunk);
                let want = usize::try_from(lo - from).unwrap_or(usize::MAX);
                let mut got = store
                    .entries_after(run_id, from.checked_sub(1), want)
                    .await?;
                if got.len() != want || got.first().is_some_and(|e| e.seq != from) {
                    return Err(PortError::Unavailable {
                        message: format!(
                            "run `{run_id}`: read {} entries from seq {from}, expected {want}",
                            got.len()
                        ),
                        source: None,
                    });
                }
                bytes += got.iter().map(model_bytes).sum::<usize>();
                grouped |= got.iter().any(starts_group);
                got.append(&mut before);
                before = got;
                lo = from;
                chunk = chunk.saturating_mul(2).min(1024);
            }
            let head = match (&self.window.head, lo) {
                (_, 0) => None,
                (Some(h), _) => Some(h.clone()),
                (None, _) => store.entries_after(run_id, None, 1).await?.pop(),
            };
            before.extend_from_slice(&self.window.entries);
            let _ = self.read.set(Window::new(lo, before, head));
        }
        let (head, span) = match self.read.get() {
            Some(r) => (r.head.as_ref(), r.entries.as_slice()),
            None => (self.window.head.as_ref(), self.window.entries.as_slice()),
        };
        Ok(fit(head, &overlay(span, changed), budget).into_owned())
    }

    /// The model's reply to a think of the step's run at the turn's `tier`: `history` is what
    /// the model is given, `prepared` what the agent's plugins answered for the step.
    async fn call_model(
        &self,
        prepared: &crate::agent::Prepared,
        tier: Option<crate::timeline::Tier>,
        history: &[Entry],
        think_index: u32,
        seq: u64,
    ) -> Result<LlmReply, LlmError> {
        let (book, run) = (&self.book, self.run);
        let agent = book
            .agent(&run.agent)
            .ok_or_else(|| LlmError::fatal(format!("agent `{}` is not defined", run.agent)))?;
        let mut tools = book.specs(agent, prepared);
        let mut system = agent.system_prompt(run, prepared);
        if run.counters.tools_spent {
            // The turn's tool calls are spent: a final answer, without tools.
            warn!(
                run_id = %run.run_id,
                limit = agent.max_tool_calls_per_turn,
                "the turn's tool calls are spent: asking the model for its final answer without tools"
            );
            tools.clear();
            system.push_str(&format!(
                "\n\nThis turn has made the {} tool calls it may. Answer now, with what you \
                 have: no tool can be called.",
                agent.max_tool_calls_per_turn
            ));
        } else if tools.is_empty() {
            // Said, so that the model does not answer with a call nobody offered it.
            system.push_str(NO_TOOLS);
        }
        let model = agent.model_for(run.context_type(), tier);
        let live = self
            .live
            .map(|l| crate::live::StepLive::new(l.clone(), &run.run_id, seq));
        let controls = agent.controls(
            run.counters.turn_thinks,
            !tools.is_empty(),
            run.origin.action.as_deref(),
        );
        // A model that sees is given the images of the history's tools, the newest first.
        let images = match agent.vision {
            true => self.images(history).await?,
            false => Vec::new(),
        };
        let mut request = ChatRequest {
            run_id: &run.run_id,
            agent: &agent.name,
            think_index,
            model,
            system: &system,
            tools: &tools,
            history,
            deltas: live.as_ref().map(|l| l as &dyn crate::llm::Deltas),
            max_output_tokens: agent.max_output_tokens,
            controls: &controls,
            images: &images,
        };
        let started = std::time::Instant::now();
        // The agent's model, then each of its `fallbackModels` while the one before fails
        // retryably past its retries (and the invocation has time for another call).
        let mut fallbacks = Vec::new();
        let mut next = agent.fallback_models.iter().map(String::as_str);
        let reply = loop {
            if let Some(live) = &live {
                live.publish(crate::live::LiveKind::State {
                    state: "thinking".into(),
                    detail: serde_json::json!({"model": request.model, "iteration": think_index}),
                });
            }
            let reply = self.deps.llm.complete(&request).await;
            let (Err(LlmError::Unavailable { message, .. }), Some(fallback)) =
                (&reply, next.next())
            else {
                break reply;
            };
            let longest = self.deps.llm.longest_call().unwrap_or_default();
            if self.deadline.is_some_and(|d| d.left() < longest) {
                warn!(run_id = %run.run_id, %message, "the model failed and the invocation has no time for a fallback");
                break reply;
            }
            let failed = request.model.unwrap_or(DEPLOYMENT_MODEL).to_owned();
            warn!(run_id = %run.run_id, model = %failed, %fallback, %message, "the model failed: trying the agent's next fallback");
            fallbacks.push(crate::llm::Fallback {
                model: failed,
                error: message.clone(),
            });
            request.model = Some(fallback);
        };
        let reply = reply.map(|mut r| {
            r.latency_ms = Some(crate::live::millis(started.elapsed()));
            r.first_token_ms = live.as_ref().and_then(|l| l.first_piece_ms());
            r.fallbacks = fallbacks;
            r
        });
        if let Err(LlmError::Fatal { message, .. }) = &reply {
            warn!(run_id = %run.run_id, %message, "model call failed for good");
        }
        reply
    }
}

/// What a fallback record calls the deployment's model (`BATON_MODEL`), when the agent
/// names none.
pub const DEPLOYMENT_MODEL: &str = "(BATON_MODEL)";

/// What a model offered no tools is told, after its system prompt.
pub const NO_TOOLS: &str = "\n\nYou have no tools in this conversation: answer from what you \
     know and what you are given.";

impl StepIo for StepWorld<'_> {
    async fn ledger(&self, root_run_id: &str) -> Result<Option<crate::budget::Ledger>, PortError> {
        self.deps.store.ledger(root_run_id).await
    }

    async fn day_spend(&self, owner: &str) -> Result<Option<crate::engine::DaySpend>, PortError> {
        let Some(limit_usd) = self.daily_cost_usd else {
            return Ok(None);
        };
        let day = self.deps.clock.now().date_naive();
        let spent_usd = self.deps.store.spent_on(owner, day).await?;
        Ok(Some(crate::engine::DaySpend {
            spent_usd,
            limit_usd,
        }))
    }

    fn book(&self) -> Book {
        self.book.clone()
    }

    async fn prepare(
        &self,
        run: &Run,
        timeline: &[Entry],
        changed: &[Entry],
    ) -> Result<Preparation, PluginError> {
        let catalog = &self.catalog;
        // A plugin reads what the step changed over what it read (copied only for one).
        let seen = match changed.is_empty() || !catalog.has_plugins(&run.agent) {
            true => std::borrow::Cow::Borrowed(timeline),
            false => std::borrow::Cow::Owned(overlay(timeline, changed)),
        };
        let preparation = catalog.prepare(&run.agent, run, &seen).await?;
        let mut states = run.plugin_state.clone();
        states.extend(preparation.states.clone());
        *self.plugin_states.lock().unwrap_or_else(|e| e.into_inner()) = Some(states);
        Ok(preparation)
    }

    async fn think(
        &self,
        think_index: u32,
        changed: &[Entry],
        prepared: &crate::agent::Prepared,
    ) -> Result<LlmReply, LlmError> {
        failpoint::pass("step.before_think")
            .await
            .map_err(|e| LlmError::Unavailable {
                message: e.to_string(),
                source: None,
            })?;
        let history = self
            .history(changed)
            .await
            .map_err(|e| LlmError::Unavailable {
                message: format!("reading the run's history: {e}"),
                source: Some(Box::new(e)),
            })?;
        // The seq the reply's entry takes: after what the step read and what it added.
        let seq = changed
            .iter()
            .chain(self.window.entries.last())
            .map(|e| e.seq + 1)
            .fold(self.run.next_seq, u64::max);
        // A turn that began in this step asks for its own tier (the run read has the last).
        let tier = changed
            .iter()
            .rev()
            .find_map(|e| match &e.body {
                crate::timeline::EntryBody::User { options, .. } => Some(options.tier),
                _ => None,
            })
            .unwrap_or(self.run.origin.tier);
        self.call_model(prepared, tier, &history, think_index, seq)
            .await
    }

    fn executing(&self, calls: &[Execution]) {
        if let Some(live) = self.live {
            let tools: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
            crate::live::StepLive::new(live.clone(), &self.run.run_id, self.run.next_seq).publish(
                crate::live::LiveKind::State {
                    state: "executing_tools".into(),
                    detail: serde_json::json!({"tools": tools}),
                },
            );
        }
    }

    /// In an invocation that ends ([`super::StepDeadline`]), a call runs only if it fits, to
    /// its timeout, in the time left; else the step stops before it, commits what ran, and
    /// is delivered again to a fresh invocation, which runs the calls still due before
    /// anything else (a call is never cut off half-done because an invocation ended under
    /// it). A call that would not fit even in a fresh invocation runs now, cut off at the
    /// invocation's deadline at the latest ([`StepIo::execute`]).
    fn fits(&self, call: &Execution) -> Result<(), OutOfTime> {
        let Some(d) = &self.deadline else {
            return Ok(());
        };
        let need = self.tool_limit(&call.tool);
        let left = d.left();
        if need <= left {
            return Ok(());
        }
        if need <= d.window {
            return Err(OutOfTime(format!(
                "`{}` needs up to {:.1} s and the invocation has {:.1} s left",
                call.tool,
                need.as_secs_f64(),
                left.as_secs_f64()
            )));
        }
        warn!(
            run_id = %self.run.run_id,
            tool = %call.tool,
            need_s = need.as_secs_f64(),
            window_s = d.window.as_secs_f64(),
            "the tool's timeout is longer than the function's allows: it is cut off at the invocation's deadline"
        );
        Ok(())
    }

    /// A model call, every attempt of it timing out, fits in what the invocation has left.
    fn think_fits(&self) -> Result<(), OutOfTime> {
        let Some(d) = &self.deadline else {
            return Ok(());
        };
        let (need, left) = (self.longest_think, d.left());
        if need <= left || need > d.window {
            return Ok(());
        }
        Err(OutOfTime(format!(
            "a model call needs up to {:.1} s and the invocation has {:.1} s left",
            need.as_secs_f64(),
            left.as_secs_f64()
        )))
    }

    async fn execute(&self, call: Execution) -> Result<ToolOutput, PortError> {
        failpoint::pass("step.before_tool").await?;
        let catalog = &self.catalog;
        let live = self
            .live
            .map(|l| crate::live::StepLive::new(l.clone(), &self.run.run_id, self.run.next_seq));
        if let Some(live) = &live {
            live.publish(crate::live::LiveKind::ToolStarted {
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                input_preview: crate::live::preview(&call.input),
            });
        }
        let started = std::time::Instant::now();
        let ctx = ToolContext::builder(&self.run.run_id)
            .owner(&self.run.owner)
            .agent(&self.run.agent)
            .call_id(&call.call_id)
            .idempotency_key(crate::tools::idempotency_key(
                &self.run.run_id,
                call.seq,
                &call.call_id,
                &call.input,
            ))
            .scope(self.run.scope())
            .plugins(catalog.plugin_names(&self.run.agent))
            .plugin_states(
                self.plugin_states
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_else(|| self.run.plugin_state.clone()),
            )
            .build();
        let result = match catalog.tool(&self.listed, &call.tool) {
            Some(def) => match &def.exec {
                Some(tool) => {
                    let own = def.timeout.unwrap_or(catalog.limits.tool_timeout);
                    // Never past the invocation's deadline: a call cut off there is an
                    // error result the model sees, not an invocation ended under it.
                    let left = self.deadline.map(|d| d.left());
                    let limit = left.map_or(own, |l| own.min(l));
                    match tokio::time::timeout(limit, tool.execute(&ctx, call.input)).await {
                        Ok(Ok(out)) => Ok(out),
                        Ok(Err(ToolError::Retry(why))) if call.effects != Effects::Once => {
                            // Transient, the tool says, and safe to run again: the step is
                            // tried again (nothing of this call is kept).
                            warn!(run_id = %self.run.run_id, tool = %call.tool, error = %why, "tool asked for a retry");
                            return Err(PortError::Unavailable {
                                message: format!(
                                    "`{}` failed, to be tried again: {why}",
                                    call.tool
                                ),
                                source: None,
                            });
                        }
                        Ok(Err(ToolError::Retry(why))) => Err(format!(
                            "{why} (a transient failure; `{}` runs at most once, so it was not tried again)",
                            call.tool
                        )),
                        Ok(Err(e)) => Err(e.message().to_owned()),
                        Err(_) if limit < own => {
                            warn!(run_id = %self.run.run_id, tool = %call.tool, "tool cut off at the invocation's deadline");
                            let cut = format!(
                                "`{}` did not finish in the {:.1} s its function's invocation had left (its own timeout is {} s, longer than the function's)",
                                call.tool,
                                limit.as_secs_f64(),
                                own.as_secs_f64()
                            );
                            Err(match call.effects {
                                // It may have taken effect: no one can say.
                                Effects::Once => format!(
                                    "{}: {cut}; it may or may not have taken effect",
                                    crate::engine::OUTCOME_UNKNOWN
                                ),
                                _ => cut,
                            })
                        }
                        Err(_) => {
                            warn!(run_id = %self.run.run_id, tool = %call.tool, "tool timed out");
                            Err(format!(
                                "`{}` did not finish within its {} s timeout",
                                call.tool,
                                limit.as_secs_f64()
                            ))
                        }
                    }
                }
                None => Err(format!("`{}` is not an executable tool", call.tool)),
            },
            None => Err(match catalog.mcp_server_of(&call.tool) {
                Some(server) => format!(
                    "`{}` is not available (MCP server `{server}` has not listed it)",
                    call.tool
                ),
                None => format!("`{}` is not a tool in the agents file now", call.tool),
            }),
        };
        let duration_ms = crate::live::millis(started.elapsed());
        if let Some(live) = &live {
            live.publish(crate::live::LiveKind::ToolFinished {
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                duration_ms,
                ok: result.is_ok(),
            });
        }
        // A crash here loses the output: a call with effects was committed to run (and a
        // `once` call marked started) before it ran, and the redelivery knows it.
        failpoint::hit("step.after_tool")?;
        // Files go to the blob store before the step commits the entries that name them (a
        // crash in between leaves bytes no entry names; the retried step puts them again).
        let mut files = Vec::new();
        for (i, f) in ctx.take_files().into_iter().enumerate() {
            let file_id = crate::engine::derive_id(
                "file",
                &format!("{}/{}", self.run.run_id, call.call_id),
                i as u64,
            );
            let blob = crate::ports::Blob {
                name: f.name.clone(),
                media_type: f.media_type.clone(),
                bytes: f.bytes,
            };
            let key = format!("{}/{file_id}", self.run.run_id);
            // On failure the step fails and is retried, the tool with it: no entry names a
            // file that is not stored.
            self.deps.blobs.put(&key, &blob).await?;
            files.push(crate::timeline::FileRef {
                call_id: call.call_id.clone(),
                file_id,
                name: f.name,
                media_type: f.media_type,
                size: blob.bytes.len() as u64,
                summary: f.summary,
            });
        }
        // What the call set of its plugins' states: the next call of the step reads it too.
        let states = ctx.take_plugin_states();
        if !states.is_empty() {
            let mut seen = self.plugin_states.lock().unwrap_or_else(|e| e.into_inner());
            seen.get_or_insert_with(|| self.run.plugin_state.clone())
                .extend(states.clone());
        }
        Ok(ToolOutput {
            result,
            widgets: ctx.take_widgets(),
            files,
            states,
            duration_ms: Some(duration_ms),
        })
    }

    async fn settle(
        &self,
        cta_ids: Vec<String>,
    ) -> Result<std::collections::HashMap<String, Cta>, PortError> {
        let now = self.deps.clock.now();
        let mut out = std::collections::HashMap::new();
        for id in cta_ids {
            match self
                .deps
                .store
                .settle_cta(&id, &Settlement::Cancelled, now)
                .await?
            {
                Settled::Won(c) | Settled::Lost(c) => {
                    out.insert(id, c);
                }
                Settled::NotFound => {}
            }
        }
        Ok(out)
    }
}
