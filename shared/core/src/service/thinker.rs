//! The engine's I/O for one step of one run ([`StepIo`]): the model (given the whole
//! conversation when it reads it), the catalog's tools, and the settling of CTAs.

use tracing::warn;

use super::Service;
use crate::agent::Listed;
use crate::cta::{Cta, Settlement};
use crate::engine::{Execution, StepIo, ToolOutput};
use crate::error::PortError;
use crate::failpoint;
use crate::llm::{LlmError, LlmReply};
use crate::ports::Settled;
use crate::run::Run;
use crate::timeline::Entry;
use crate::tools::{ToolContext, ToolKind};

/// The engine's I/O for one step of one run: the model, and the catalog's tools.
pub(super) struct Thinker<'a> {
    pub(super) service: &'a Service,
    pub(super) run: &'a Run,
    /// What the step read: the timeline from seq `base` on.
    pub(super) timeline: &'a [Entry],
    pub(super) base: u64,
    /// The whole timeline, once a think has read it for a model that reads history.
    pub(super) whole: std::sync::OnceLock<Vec<Entry>>,
    /// The MCP servers' tools as listed when the step started.
    pub(super) listed: Listed,
    /// A failpoint that fired where no error can be returned (after a tool's output).
    pub(super) crashed: std::sync::Mutex<Option<PortError>>,
}

impl Thinker<'_> {
    /// What the model is given: the whole timeline for a model that reads it (the entries
    /// before the window read once, here), else the window.
    async fn history(&self) -> Result<&[Entry], PortError> {
        if self.base == 0 || !self.service.deps.llm.reads_history() {
            return Ok(self.timeline);
        }
        if self.whole.get().is_none() {
            let before = usize::try_from(self.base).unwrap_or(usize::MAX);
            let mut whole = self
                .service
                .deps
                .store
                .entries_after(&self.run.run_id, None, before)
                .await?;
            if whole.len() != before || whole.last().is_some_and(|e| e.seq + 1 != self.base) {
                return Err(PortError::Unavailable {
                    message: format!(
                        "run `{}`: {} entries before seq {}, expected {before}",
                        self.run.run_id,
                        whole.len(),
                        self.base
                    ),
                    source: None,
                });
            }
            whole.extend_from_slice(self.timeline);
            let _ = self.whole.set(whole);
        }
        Ok(self.whole.get().map_or(self.timeline, Vec::as_slice))
    }
}

impl StepIo for Thinker<'_> {
    fn listed(&self) -> Listed {
        self.listed.clone()
    }

    async fn think(&self, think_index: u32) -> Result<LlmReply, LlmError> {
        failpoint::pass("step.before_think")
            .await
            .map_err(|e| LlmError::Unavailable {
                message: e.to_string(),
                source: None,
            })?;
        let history = self.history().await.map_err(|e| LlmError::Unavailable {
            message: format!("reading the run's history: {e}"),
            source: Some(Box::new(e)),
        })?;
        let reply = self
            .service
            .think(&self.listed, self.run, self.timeline, history, think_index)
            .await?;
        failpoint::hit("step.after_think").map_err(|e| LlmError::Unavailable {
            message: e.to_string(),
            source: None,
        })?;
        Ok(reply)
    }

    async fn execute(&self, call: Execution) -> ToolOutput {
        if let Err(e) = failpoint::pass("step.before_tool").await {
            *self.crashed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
        let catalog = &self.service.catalog;
        let ctx = ToolContext::new(
            &self.run.run_id,
            &self.run.owner,
            &self.run.agent,
            &call.call_id,
        );
        let result = match catalog.tool(&self.listed, &call.tool) {
            Some(def) => match &def.kind {
                ToolKind::Exec(tool) => {
                    let limit = def.timeout.unwrap_or(catalog.limits.tool_timeout);
                    match tokio::time::timeout(limit, tool.execute(&ctx, call.input)).await {
                        Ok(out) => out,
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
                _ => Err(format!("`{}` is not an executable tool", call.tool)),
            },
            None => Err(format!(
                "`{}` is not available (its MCP server has not listed it)",
                call.tool
            )),
        };
        // A crash here loses the output; the redelivered step executes the tool again.
        if let Err(e) = failpoint::hit("step.after_tool") {
            *self.crashed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
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
            if let Err(e) = self.service.deps.blobs.put(&key, &blob).await {
                // The step fails and is retried, the tool with it: no entry names a file
                // that is not stored.
                *self.crashed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                break;
            }
            files.push(crate::timeline::FileRef {
                call_id: call.call_id.clone(),
                file_id,
                name: f.name,
                media_type: f.media_type,
                size: blob.bytes.len() as u64,
                summary: f.summary,
            });
        }
        ToolOutput {
            result,
            widgets: ctx.take_widgets(),
            files,
        }
    }

    async fn settle(
        &self,
        cta_ids: Vec<String>,
    ) -> Result<std::collections::HashMap<String, Cta>, PortError> {
        let now = self.service.deps.clock.now();
        let mut out = std::collections::HashMap::new();
        for id in cta_ids {
            match self
                .service
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
