//! The scripted world of one step: a model that answers from a script, tools that answer
//! as `echo` does, and a record of what the step asked of them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use serde_json::json;

use super::{Agents, KeyFn};
use crate::cta::{Cta, CtaStatus};
use crate::engine::*;
use crate::llm::{LlmError, LlmReply};
use crate::run::Run;
use crate::timeline::Entry;

/// The model answers from a script; `echo` is the only tool, and its calls are recorded.
pub struct Scripted<'a> {
    pub agents: &'a dyn Agents,
    /// How a call's idempotency key is made (the host's function).
    pub key: KeyFn,
    /// The run it steps (the calls' keys are its).
    pub run_id: String,
    pub agent: String,
    pub replies: Vec<LlmReply>,
    /// The ids of the calls run, each with the key it ran under.
    pub executed: Mutex<Vec<String>>,
    pub keys: Mutex<Vec<String>>,
    /// The thinks the model was asked for, by index.
    pub asked: Mutex<Vec<u32>>,
    /// A tool whose calls do not fit in what the invocation has left.
    pub no_time_for: Option<String>,
    /// The think the model fails for good at, if any.
    pub fails_at: Option<u32>,
    pub settled: Mutex<Vec<String>>,
    /// The CTA records as the store holds them when the step starts.
    pub ctas: HashMap<String, Cta>,
    /// The run tree's budget ledger, as the store would hold it.
    pub ledger: Option<crate::budget::Ledger>,
}

impl StepIo for Scripted<'_> {
    fn book(&self) -> crate::agent::Book {
        self.agents.book()
    }

    fn prepare(
        &self,
        run: &Run,
        timeline: &[Entry],
        changed: &[Entry],
    ) -> impl Future<Output = Result<crate::agent::Preparation, crate::agent::PluginError>> + Send
    {
        let seen = crate::timeline::overlay(timeline, changed);
        async move { self.agents.prepare(run, seen).await }
    }

    fn think(
        &self,
        think_index: u32,
        _: &[Entry],
        _: &crate::agent::Prepared,
    ) -> impl Future<Output = Result<LlmReply, LlmError>> + Send {
        self.asked.lock().expect("not poisoned").push(think_index);
        if self.fails_at == Some(think_index) {
            return std::future::ready(Err(LlmError::fatal("the model refused")));
        }
        let reply = self
            .replies
            .get(think_index as usize)
            .cloned()
            .unwrap_or_else(|| panic!("no reply {think_index} for {}", self.agent));
        std::future::ready(Ok(reply))
    }

    fn execute(
        &self,
        call: Execution,
    ) -> impl Future<Output = Result<ToolOutput, crate::error::PortError>> + Send {
        // `echo`, or a test's tool that answers as it does (`plugins.rs`'s `guarded`).
        assert!(
            matches!(call.tool.as_str(), "echo" | "guarded" | "book" | "pay"),
            "{}",
            call.tool
        );
        self.executed
            .lock()
            .expect("not poisoned")
            .push(call.call_id.clone());
        let key = (self.key)(&self.run_id, call.seq, &call.call_id, &call.input);
        self.keys.lock().expect("not poisoned").push(key);
        if call.tool != "echo" && call.tool != "guarded" {
            return std::future::ready(Ok(ToolOutput::from(Ok(call.input.clone()))));
        }
        // Echoing "chart" also returns a widget, as a tool may.
        let widgets = if call.input["text"] == "chart" {
            vec![crate::tools::Widget {
                kind: "table".into(),
                data: json!({"columns": ["x"], "rows": [[1], [2]]}),
                fallback: None,
            }]
        } else {
            vec![]
        };
        // Echoing "report" also returns a file (stored already, as the service does).
        let files = if call.input["text"] == "report" {
            vec![crate::timeline::FileRef {
                call_id: call.call_id.clone(),
                file_id: "file_1".into(),
                name: "report.csv".into(),
                media_type: "text/csv".into(),
                size: 2048,
                summary: "12 rows of sales by region".into(),
            }]
        } else {
            vec![]
        };
        std::future::ready(Ok(ToolOutput {
            result: Ok(call.input["text"].clone()),
            widgets,
            files,
            duration_ms: None,
            states: Default::default(),
        }))
    }

    fn fits(&self, call: &Execution) -> Result<(), OutOfTime> {
        match &self.no_time_for {
            Some(tool) if *tool == call.tool => Err(OutOfTime(format!("no time for {tool}"))),
            _ => Ok(()),
        }
    }

    fn ledger(
        &self,
        _: &str,
    ) -> impl Future<Output = Result<Option<crate::budget::Ledger>, crate::error::PortError>> + Send
    {
        std::future::ready(Ok(self.ledger.clone()))
    }

    fn settle(
        &self,
        ids: Vec<String>,
    ) -> impl Future<Output = Result<HashMap<String, Cta>, crate::error::PortError>> + Send {
        // As a store settles them: a pending CTA is cancelled (its first write), any other
        // stays as it is; what a step asked to settle is kept, for the tests to see (and
        // the simulation writes the cancellations after the step).
        let records = ids
            .iter()
            .filter_map(|id| {
                let mut c = self.ctas.get(id)?.clone();
                if c.status == CtaStatus::Pending {
                    c.status = CtaStatus::Cancelled;
                }
                Some((id.clone(), c))
            })
            .collect();
        self.settled.lock().expect("not poisoned").extend(ids);
        std::future::ready(Ok(records))
    }
}

/// What a step asked of its world: the thinks, the calls run and their keys, the CTAs settled.
pub struct Done {
    pub asked: Vec<u32>,
    pub executed: Vec<String>,
    pub keys: Vec<String>,
    pub settled: Vec<String>,
}

impl Scripted<'_> {
    /// What the step asked of this world, once it is done with it.
    pub fn done(self) -> Done {
        let take = |m: Mutex<Vec<String>>| m.into_inner().expect("not poisoned");
        Done {
            asked: self.asked.into_inner().expect("not poisoned"),
            executed: take(self.executed),
            keys: take(self.keys),
            settled: take(self.settled),
        }
    }
}
