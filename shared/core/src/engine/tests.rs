//! Engine tests: every transition, no I/O. The engine is driven by the same [`decide`] loop
//! the service uses, with a scripted model; a tiny in-memory world stands in for the store
//! and the queue (it commits with [`Transition::apply`] and delivers sends and CTA
//! cancellations) so that multi-run flows read as given/when/then.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use serde_json::json;

use super::*;
use crate::agent::{AgentsFile, Catalog, Limits};
use crate::cta::Cta;
use crate::cta::{ChoiceOption, CtaRequest, CtaResponse, CtaStatus};
use crate::llm::{LlmError, LlmReply, ToolCall};
use crate::message::{ChildOutcome, Effect, Event, Input, StepMessage};
use crate::run::{ExpiryPolicy, NewRun, Run, RunStatus, Usage};
use crate::timeline::{Entry, EntryBody, ToolEntry, ToolResult};
use chrono::{DateTime, Utc};
use serde_json::Value;

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000, 0).unwrap()
}

fn catalog_with(limits: Limits) -> Catalog {
    let file: AgentsFile = serde_json::from_value(json!({"agents": {
        "worker": {"tools": ["echo"], "approval": {"echo": {"inputMatches": "danger"}}, "maxIterations": 3},
        "asker": {"tools": ["request_human_feedback", "echo"], "maxToolCallsPerTurn": 20},
        "deep": {"tools": ["spawn_subagent"]},
        "mid": {"tools": ["spawn_subagent"]},
        "quick": {"tools": ["request_human_feedback", "echo"], "ctaExpirySeconds": 60,
                  "approval": {"echo": "always"}},
        "timed": {"tools": ["request_human_feedback", "echo"], "maxWallSeconds": 60},
        "free": {"tools": ["echo"], "approvalBatch": "independent",
                 "approval": {"echo": {"inputMatches": "danger", "reason": "It says danger."}}},
        "capped": {"tools": ["echo"], "maxToolCallsPerTurn": 8, "maxIterations": 10},
        "patient": {"tools": ["spawn_subagent"], "maxWallSeconds": 60},
        "alpha": {"tools": []},
        "beta": {"tools": []},
        "gamma": {"tools": []},
        "lead": {"tools": ["agent_orchestrate"], "maxWallSeconds": 120},
        "careful_lead": {"tools": ["agent_orchestrate"],
                         "approval": {"agent_orchestrate": {"inputMatches": "code"}}}
    }}))
    .unwrap();
    Catalog::new(limits, vec![], Some(file)).unwrap()
}

fn call(name: &str, args: Value) -> ToolCall {
    ToolCall {
        id: String::new(),
        name: name.into(),
        arguments: args.to_string(),
    }
}

fn calls(calls: Vec<ToolCall>) -> LlmReply {
    LlmReply {
        text: None,
        tool_calls: calls,
        usage: Usage {
            input_tokens: 10,
            output_tokens: 2,
            total_tokens: 12,
            cached_input_tokens: 0,
        },
        model: Some("openai:gpt-4o-mini".into()),
        ..Default::default()
    }
}

fn text(t: &str) -> LlmReply {
    LlmReply {
        text: Some(t.into()),
        tool_calls: vec![],
        usage: Usage {
            input_tokens: 5,
            output_tokens: 1,
            total_tokens: 6,
            cached_input_tokens: 0,
        },
        model: Some("openai:gpt-4o-mini".into()),
        ..Default::default()
    }
}

/// Runs a future that never waits (the scripted world answers at once) to completion.
fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the scripted world never waits"),
    }
}

/// The model answers from a script; `echo` is the only tool, and its calls are recorded.
struct Scripted {
    agent: String,
    replies: Vec<LlmReply>,
    executed: Mutex<Vec<String>>,
}

impl StepIo for Scripted {
    fn listed(&self) -> crate::agent::Listed {
        crate::agent::Listed::default()
    }

    fn think(
        &self,
        think_index: u32,
        _: &[Entry],
        _: &crate::agent::Prepared,
    ) -> impl Future<Output = Result<LlmReply, LlmError>> + Send {
        let reply = self
            .replies
            .get(think_index as usize)
            .cloned()
            .unwrap_or_else(|| panic!("no reply {think_index} for {}", self.agent));
        std::future::ready(Ok(reply))
    }

    fn execute(&self, call: Execution) -> impl Future<Output = ToolOutput> + Send {
        assert_eq!(call.tool, "echo");
        self.executed
            .lock()
            .expect("not poisoned")
            .push(call.call_id.clone());
        // Echoing "chart" also returns a widget, as a tool may.
        let widgets = if call.input["text"] == "chart" {
            vec![crate::tools::Widget {
                kind: "table".into(),
                data: json!({"columns": ["x"], "rows": [[1], [2]]}),
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
        std::future::ready(ToolOutput {
            result: Ok(call.input["text"].clone()),
            widgets,
            files,
            duration_ms: None,
        })
    }

    fn settle(
        &self,
        _: Vec<String>,
    ) -> impl Future<Output = Result<HashMap<String, Cta>, crate::error::PortError>> + Send {
        // The engine tests settle CTAs through the `CancelCta` effect, after the commit.
        std::future::ready(Ok(HashMap::new()))
    }
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Done,
    Ignored,
}

struct Sim {
    catalog: Catalog,
    now: DateTime<Utc>,
    runs: BTreeMap<String, (Run, Vec<Entry>)>,
    ctas: HashMap<String, Cta>,
    queue: VecDeque<StepMessage>,
    effects: Vec<Effect>,
    script: HashMap<String, Vec<LlmReply>>,
    executed: Vec<String>,
}

impl Sim {
    fn new() -> Self {
        Self::with(Limits::default())
    }

    fn with(limits: Limits) -> Self {
        Self {
            catalog: catalog_with(limits),
            now: t0(),
            runs: BTreeMap::new(),
            ctas: HashMap::new(),
            queue: VecDeque::new(),
            effects: vec![],
            script: HashMap::new(),
            executed: vec![],
        }
    }

    fn script(&mut self, agent: &str, replies: Vec<LlmReply>) {
        self.script.insert(agent.into(), replies);
    }

    fn create(&mut self, agent: &str, prompt: &str) -> String {
        let id = format!("run_top{}", self.runs.len());
        let mut run = Run::new(NewRun {
            run_id: id.clone(),
            agent: agent.into(),
            owner: "o".into(),
            parent: None,
            depth: 0,
            on_expiry: ExpiryPolicy::End,
            sandbox_id: None,
            metadata: None,
            context: None,
            root_run_id: None,
            now: self.now,
        });
        run.next_seq = 1;
        let first = Entry {
            seq: 0,
            at: self.now,
            body: EntryBody::User {
                text: prompt.into(),
                message_id: None,
                options: Default::default(),
            },
        };
        self.runs.insert(id.clone(), (run, vec![first]));
        self.queue.push_back(StepMessage {
            run_id: id.clone(),
            id: format!("{id}:start"),
            input: Input::Start,
        });
        id
    }

    fn deliver(&mut self, msg: &StepMessage) -> Outcome {
        let (run, timeline) = self.runs.get(&msg.run_id).cloned().expect("run exists");
        let world = Scripted {
            replies: self.script.get(&run.agent).cloned().unwrap_or_default(),
            agent: run.agent.clone(),
            executed: Mutex::new(Vec::new()),
        };
        let decision = block_on(decide(
            &self.catalog,
            self.now,
            &run,
            &timeline,
            &msg.input,
            &world,
        ))
        .expect("the scripted model never fails to answer");
        self.executed
            .extend(world.executed.into_inner().expect("not poisoned"));
        // The same step on the window a host may hand it decides the same.
        let from = super::window_start(&run, &msg.input) as usize;
        let windowed = block_on(decide(
            &self.catalog,
            self.now,
            &run,
            &timeline[from.min(timeline.len())..],
            &msg.input,
            &Scripted {
                replies: self.script.get(&run.agent).cloned().unwrap_or_default(),
                agent: run.agent.clone(),
                executed: Mutex::new(Vec::new()),
            },
        ))
        .expect("the scripted model never fails to answer");
        assert_eq!(
            windowed, decision,
            "{:?} on the window from {from} decides as on the whole timeline",
            msg.input
        );
        let t = match decision {
            Decision::Ignore(_) => return Outcome::Ignored,
            Decision::Commit(t) => t,
        };
        assert_eq!(
            t.run.version,
            run.version + 1,
            "a commit bumps the version by one"
        );
        for e in &t.updated {
            assert!(
                matches!(timeline[e.seq as usize].tool(), Some(t) if t.result.is_pending()),
                "only pending results are resolved"
            );
        }
        for (i, e) in t.appended.iter().enumerate() {
            assert_eq!(e.seq, (timeline.len() + i) as u64, "seqs are dense");
        }
        let mut tl = timeline;
        t.apply(&mut tl);
        assert_eq!(t.run.next_seq, tl.len() as u64);
        self.runs.insert(t.run.run_id.clone(), (t.run.clone(), tl));
        for c in &t.new_ctas {
            self.ctas.insert(c.cta_id.clone(), c.clone());
        }
        for (child, entries) in &t.new_runs {
            self.runs
                .insert(child.run_id.clone(), (child.clone(), entries.clone()));
        }
        for e in &t.effects {
            match e {
                Effect::Send(m) => self.queue.push_back(m.clone()),
                Effect::CancelCta { cta_id } => {
                    if let Some(c) = self
                        .ctas
                        .get_mut(cta_id)
                        .filter(|c| c.status == CtaStatus::Pending)
                    {
                        c.status = CtaStatus::Cancelled;
                    }
                }
                _ => {}
            }
        }
        self.effects.extend(t.effects.iter().cloned());
        Outcome::Done
    }

    /// Delivers queued messages until none is left.
    fn run_all(&mut self) {
        while let Some(m) = self.queue.pop_front() {
            self.deliver(&m);
        }
    }

    fn send(&mut self, run_id: &str, input: Input) -> Outcome {
        self.deliver(&StepMessage {
            run_id: run_id.into(),
            id: "test".into(),
            input,
        })
    }

    /// As the service does: settle the CTA item first, then queue the resolution.
    fn answer(&mut self, cta_id: &str, response: CtaResponse) {
        let c = self.ctas.get_mut(cta_id).expect("cta");
        assert_eq!(c.status, CtaStatus::Pending);
        c.status = CtaStatus::Answered;
        let run_id = c.run_id.clone();
        self.queue.push_back(StepMessage {
            run_id,
            id: format!("{cta_id}:answered"),
            input: Input::CtaAnswered {
                cta_id: cta_id.into(),
                response,
                responder: None,
            },
        });
    }

    fn run(&self, id: &str) -> &Run {
        &self.runs[id].0
    }

    fn tools(&self, id: &str) -> Vec<ToolEntry> {
        self.runs[id]
            .1
            .iter()
            .filter_map(|e| e.tool().cloned())
            .collect()
    }

    fn pending_ctas(&self, run_id: &str) -> Vec<Cta> {
        let mut v: Vec<Cta> = self
            .ctas
            .values()
            .filter(|c| c.run_id == run_id && c.status == CtaStatus::Pending)
            .cloned()
            .collect();
        v.sort_by(|a, b| a.tool_call_id.cmp(&b.tool_call_id));
        v
    }

    fn events(&self, detail_type: &str) -> Vec<Event> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Publish(ev) if ev.detail_type == detail_type => Some(ev.clone()),
                _ => None,
            })
            .collect()
    }

    fn children(&self, id: &str) -> Vec<String> {
        self.tools(id)
            .into_iter()
            .filter_map(|t| t.child_run_id)
            .collect()
    }
}

#[test]
fn a_final_answer_completes_the_run_with_usage_and_an_event() {
    let mut s = Sim::new();
    s.script("explore", vec![text("found it")]);
    let id = s.create("explore", "look");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.result.as_deref(), Some("found it"));
    assert_eq!(run.usage.total_tokens, 6);
    assert_eq!((run.thinks, run.version), (1, 1));
    let done = s.events("run.completed");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].detail["text"], "found it");
}

#[test]
fn ordinary_tools_execute_within_the_step_and_the_run_thinks_again() {
    let mut s = Sim::new();
    s.script(
        "worker",
        vec![
            LlmReply {
                text: Some("let me echo".into()),
                ..calls(vec![
                    call("echo", json!({"text": "hi"})),
                    call("echo", json!({"text": "yo"})),
                ])
            },
            text("done"),
        ],
    );
    let id = s.create("worker", "go");
    s.run_all();
    let tools = s.tools(&id);
    assert_eq!(tools.len(), 2);
    assert_eq!(
        tools[0].result,
        ToolResult::Success {
            output: json!("hi")
        }
    );
    assert_eq!(
        tools[1].result,
        ToolResult::Success {
            output: json!("yo")
        }
    );
    assert_eq!(
        tools[0].input,
        json!({"text": "hi"}),
        "input is the parsed object"
    );
    assert_eq!(s.executed, vec!["call_0_0", "call_0_1"]);
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.usage.total_tokens, 18);
    let timeline = &s.runs[&id].1;
    assert!(
        matches!(&timeline[1].body, EntryBody::Assistant { text: Some(t), .. } if t == "let me echo")
    );
}

#[test]
fn bad_calls_become_error_results_the_model_sees() {
    // (name, arguments, expected error fragment)
    let table = [
        ("echo", "{not json".to_owned(), "not valid JSON"),
        (
            "echo",
            json!({"text": 5}).to_string(),
            "invalid arguments for `echo`",
        ),
        (
            "echo",
            json!({}).to_string(),
            "\"text\" is a required property",
        ),
        ("rm_rf", json!({}).to_string(), "unknown tool `rm_rf`"),
        (
            "spawn_subagent",
            json!({"agent": "explore", "prompt": "x"}).to_string(),
            "unknown tool `spawn_subagent`",
        ),
    ];
    for (name, args, expected) in table {
        let mut s = Sim::new();
        s.script(
            "worker",
            vec![
                calls(vec![ToolCall {
                    id: "c1".into(),
                    name: name.into(),
                    arguments: args.clone(),
                }]),
                text("ok"),
            ],
        );
        let id = s.create("worker", "go");
        s.run_all();
        let t = &s.tools(&id)[0];
        match &t.result {
            ToolResult::Error { error } => {
                assert!(error.contains(expected), "{name} {args}: {error}")
            }
            r => panic!("{name} {args}: expected an error, got {r:?}"),
        }
        assert_eq!(s.run(&id).status, RunStatus::Completed, "the run recovers");
        assert!(s.executed.is_empty());
    }
}

#[test]
fn calls_of_one_reply_beyond_the_turns_cap_are_not_run() {
    let mut s = Sim::new();
    let many: Vec<ToolCall> = (0..10)
        .map(|i| call("echo", json!({"text": format!("t{i}")})))
        .collect();
    s.script("worker", vec![calls(many), text("ok")]);
    let id = s.create("worker", "go");
    s.run_all();
    let tools = s.tools(&id);
    assert_eq!(tools.len(), 10);
    assert!(
        tools[..8]
            .iter()
            .all(|t| matches!(t.result, ToolResult::Success { .. }))
    );
    assert!(
        tools[8..].iter().all(
            |t| matches!(&t.result, ToolResult::Error { error } if error.contains("limit of 8 tool calls"))
        )
    );
    assert_eq!(s.executed.len(), 8);
}

#[test]
fn approval_gated_tools_run_only_when_approved() {
    // (approved, reason, expected result)
    let table = [
        (
            true,
            None,
            ToolResult::Success {
                output: json!("danger zone"),
            },
        ),
        (
            false,
            Some("too risky"),
            ToolResult::error("a human rejected this call: too risky"),
        ),
        (false, None, ToolResult::error("a human rejected this call")),
    ];
    for (approved, reason, expected) in table {
        let mut s = Sim::new();
        s.script(
            "worker",
            vec![
                calls(vec![
                    call("echo", json!({"text": "danger zone"})),
                    call("echo", json!({"text": "safe"})),
                ]),
                text("ok"),
            ],
        );
        let id = s.create("worker", "go");
        s.run_all();
        // Given the gated call is parked and the other one waits with it (seed 003),
        assert_eq!(s.run(&id).status, RunStatus::Waiting);
        assert!(s.executed.is_empty());
        assert_eq!(
            s.tools(&id)[1].result,
            ToolResult::Pending {
                reason: DEFERRED.into()
            }
        );
        let ctas = s.pending_ctas(&id);
        assert_eq!(ctas.len(), 1);
        assert!(ctas[0].gate);
        assert!(
            matches!(&ctas[0].request, CtaRequest::Approval { message } if message.contains("danger zone"))
        );
        let state = s.events("run.state").last().unwrap().detail.clone();
        assert_eq!(state["state"], "waiting_on_user");
        assert_eq!(
            state["detail"]["ctaIds"],
            serde_json::json!([ctas[0].cta_id])
        );
        // when the human answers,
        s.answer(
            &ctas[0].cta_id,
            CtaResponse::Approval {
                approved,
                reason: reason.map(Into::into),
            },
        );
        s.run_all();
        // then the tool ran (or not), the deferred call ran either way, and the model saw
        // the outcome.
        assert_eq!(s.tools(&id)[0].result, expected);
        assert_eq!(
            s.tools(&id)[1].result,
            ToolResult::Success {
                output: json!("safe")
            }
        );
        assert_eq!(s.executed.len(), if approved { 2 } else { 1 });
        assert_eq!(
            s.tools(&id)[0].cta.as_ref().unwrap().status,
            CtaStatus::Answered
        );
        assert_eq!(s.run(&id).status, RunStatus::Completed);
    }
}

fn feedback(kind: Value) -> LlmReply {
    calls(vec![call("request_human_feedback", kind)])
}

#[test]
fn each_cta_kind_parks_the_run_and_resumes_with_the_answer() {
    let choice = json!({"kind": "choice", "prompt": "Which?", "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]});
    let table = [
        (
            json!({"kind": "approval", "message": "Proceed?"}),
            CtaResponse::Approval {
                approved: true,
                reason: None,
            },
            json!({"kind": "approval", "approved": true}),
        ),
        (
            json!({"kind": "text", "prompt": "Name?", "placeholder": "e.g. Ada"}),
            CtaResponse::Text { text: "Ada".into() },
            json!({"kind": "text", "text": "Ada"}),
        ),
        (
            choice,
            CtaResponse::Choice {
                selected_id: "b".into(),
            },
            json!({"kind": "choice", "selectedId": "b"}),
        ),
    ];
    for (request, response, output) in table {
        let mut s = Sim::new();
        s.script("asker", vec![feedback(request.clone()), text("thanks")]);
        let id = s.create("asker", "ask");
        s.run_all();
        let run = s.run(&id);
        assert_eq!(run.status, RunStatus::Waiting);
        let ctas = s.pending_ctas(&id);
        assert_eq!(ctas.len(), 1, "{request}");
        let cta = &ctas[0];
        assert!(!cta.gate);
        assert_eq!(cta.expires_at, t0() + chrono::Duration::days(30));
        // The request event carries the kind's fields; an expiry timer is scheduled.
        let ev = &s.events("cta.request")[0];
        assert_eq!(ev.detail["ctaId"], cta.cta_id.as_str());
        assert_eq!(ev.detail["kind"], request["kind"]);
        for field in ["message", "prompt", "options", "placeholder"] {
            assert_eq!(ev.detail.get(field), request.get(field), "{field}");
        }
        assert!(s.effects.contains(&Effect::Schedule {
            cta_id: cta.cta_id.clone(),
            run_id: id.clone(),
            at: cta.expires_at
        }));
        // The pending result shows the CTA beside it.
        let entry = &s.tools(&id)[0];
        assert_eq!(entry.cta.as_ref().unwrap().cta_id, cta.cta_id);
        assert!(entry.result.is_pending());

        s.answer(&cta.cta_id, response);
        s.run_all();
        assert_eq!(s.tools(&id)[0].result, ToolResult::Success { output });
        assert_eq!(s.run(&id).status, RunStatus::Completed);
        assert!(s.effects.contains(&Effect::Unschedule {
            cta_id: cta.cta_id.clone()
        }));
    }
}

#[test]
fn an_invalid_response_changes_nothing() {
    let choice =
        json!({"kind": "choice", "prompt": "Which?", "options": [{"id": "a", "label": "A"}]});
    let table = [
        (
            choice.clone(),
            CtaResponse::Choice {
                selected_id: "z".into(),
            },
        ),
        (choice, CtaResponse::Text { text: "a".into() }),
        (
            json!({"kind": "text", "prompt": "?"}),
            CtaResponse::Approval {
                approved: true,
                reason: None,
            },
        ),
        (
            json!({"kind": "approval", "message": "?"}),
            CtaResponse::Choice {
                selected_id: "a".into(),
            },
        ),
    ];
    for (request, response) in table {
        let mut s = Sim::new();
        s.script("asker", vec![feedback(request)]);
        let id = s.create("asker", "ask");
        s.run_all();
        let before = s.runs[&id].clone();
        let cta_id = s.pending_ctas(&id)[0].cta_id.clone();
        assert_eq!(
            s.send(
                &id,
                Input::CtaAnswered {
                    cta_id,
                    response,
                    responder: None,
                }
            ),
            Outcome::Ignored
        );
        assert_eq!(s.runs[&id], before);
    }
}

#[test]
fn an_invalid_cta_request_is_an_error_result() {
    let mut s = Sim::new();
    s.script("asker", vec![
        feedback(json!({"kind": "choice", "prompt": "p", "options": [{"id": "a", "label": "A"}, {"id": "a", "label": "B"}]})),
        text("ok"),
    ]);
    let id = s.create("asker", "ask");
    s.run_all();
    assert!(
        matches!(&s.tools(&id)[0].result, ToolResult::Error { error } if error.contains("duplicate"))
    );
    assert!(s.ctas.is_empty());
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

fn spawn(agent: &str, prompt: &str) -> ToolCall {
    call("spawn_subagent", json!({"agent": agent, "prompt": prompt}))
}

#[test]
fn fan_in_waits_for_every_subagent_and_cta_of_the_batch() {
    let mut s = Sim::new();
    s.script(
        "orchestrator",
        vec![
            calls(vec![
                spawn("explore", "map the repo"),
                spawn("code", "fix it"),
                call(
                    "request_human_feedback",
                    json!({"kind": "text", "prompt": "Why?"}),
                ),
            ]),
            text("all done"),
        ],
    );
    s.script("explore", vec![text("mapped")]);
    s.script("code", vec![text("fixed")]);
    let id = s.create("orchestrator", "go");
    // Given the orchestrator's first step dispatched all three calls,
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    assert_eq!(s.run(&id).status, RunStatus::Waiting);
    assert_eq!(
        s.events("run.state").last().unwrap().detail["state"],
        "waiting_on_user"
    );
    let kids = s.children(&id);
    assert_eq!(kids.len(), 2);
    assert_eq!(s.run(&kids[0]).parent.as_ref().unwrap().run_id, id);
    assert_eq!(s.run(&kids[0]).depth, 1);
    // when both children finish, the run still waits for the human,
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Waiting);
    assert_eq!(s.run(&id).thinks, 1);
    let tools = s.tools(&id);
    assert_eq!(
        tools[0].result,
        ToolResult::Success {
            output: json!({
        "subagentId": kids[0], "text": "mapped", "stepCount": 1,
        "totalUsage": {"inputTokens": 5, "outputTokens": 1, "totalTokens": 6}})
        }
    );
    assert!(
        matches!(&tools[1].result, ToolResult::Success { output } if output["text"] == "fixed")
    );
    assert_eq!(
        s.events("run.state").last().unwrap().detail["state"],
        "waiting_on_user"
    );
    // and only when the human answers does it think again.
    let cta = s.pending_ctas(&id)[0].cta_id.clone();
    s.answer(
        &cta,
        CtaResponse::Text {
            text: "because".into(),
        },
    );
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.run(&id).thinks, 2);
}

#[test]
fn at_most_four_children_run_at_once_and_the_rest_wait_their_turn() {
    let mut s = Sim::new();
    let six: Vec<ToolCall> = (0..6)
        .map(|i| spawn("explore", &format!("part {i}")))
        .collect();
    s.script("orchestrator", vec![calls(six), text("merged")]);
    s.script("explore", vec![text("part done")]);
    let id = s.create("orchestrator", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    let tools = s.tools(&id);
    assert_eq!(tools.iter().filter(|t| t.child_run_id.is_some()).count(), 4);
    assert!(
        tools[4..]
            .iter()
            .all(|t| matches!(&t.result, ToolResult::Pending { reason } if reason == "queued"))
    );
    // When the first child finishes, the fifth starts.
    let first_child = s.children(&id)[0].clone();
    while let Some(m) = s.queue.pop_front() {
        let is_first = m.run_id == first_child
            || (m.run_id == id
                && matches!(&m.input, Input::ChildFinished { child_run_id, .. } if *child_run_id == first_child));
        if is_first {
            s.deliver(&m);
        } else {
            s.queue.push_back(m);
            if s.queue.iter().all(|m| m.run_id != first_child && !matches!(&m.input, Input::ChildFinished { child_run_id, .. } if *child_run_id == first_child)) {
                break;
            }
        }
    }
    assert_eq!(
        s.tools(&id)
            .iter()
            .filter(|t| t.child_run_id.is_some())
            .count(),
        5
    );
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.children(&id).len(), 6);
    assert!(
        s.tools(&id)
            .iter()
            .all(|t| matches!(t.result, ToolResult::Success { .. }))
    );
}

#[test]
fn subagents_nest_at_most_three_deep() {
    let mut s = Sim::new();
    s.script(
        "deep",
        vec![calls(vec![spawn("deep", "deeper")]), text("bottom")],
    );
    let id = s.create("deep", "go");
    s.run_all();
    // depth 0 → 1 → 2 → 3; the run at depth 3 gets an error and answers.
    let mut depth = 0;
    let mut cur = id.clone();
    while let Some(child) = s.children(&cur).first().cloned() {
        depth += 1;
        cur = child;
    }
    assert_eq!(depth, 3);
    assert_eq!(s.run(&cur).depth, 3);
    assert!(
        matches!(&s.tools(&cur)[0].result, ToolResult::Error { error } if error.contains("at most 3 deep"))
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_failed_child_is_an_error_result_for_its_parent() {
    let mut s = Sim::new();
    s.script(
        "orchestrator",
        vec![calls(vec![spawn("explore", "x")]), text("recovered")],
    );
    let id = s.create("orchestrator", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    let child = s.children(&id)[0].clone();
    s.queue.clear();
    s.send(
        &child,
        Input::Fail {
            code: "model_error".into(),
            message: "the model is down".into(),
        },
    );
    assert_eq!(s.run(&child).status, RunStatus::Failed);
    assert!(
        matches!(&s.runs[&child].1.last().unwrap().body, EntryBody::Error { code, .. } if code == "model_error")
    );
    assert_eq!(s.events("run.failed").len(), 1);
    s.run_all();
    assert!(
        matches!(&s.tools(&id)[0].result, ToolResult::Error { error } if error.contains("failed") && error.contains("the model is down"))
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn expiry_ends_the_run_by_default_and_cancels_the_rest() {
    let mut s = Sim::new();
    s.script(
        "orchestrator",
        vec![calls(vec![
            call(
                "request_human_feedback",
                json!({"kind": "approval", "message": "a?"}),
            ),
            call(
                "request_human_feedback",
                json!({"kind": "approval", "message": "b?"}),
            ),
            spawn("explore", "x"),
        ])],
    );
    let id = s.create("orchestrator", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    let child = s.children(&id)[0].clone();
    let ctas = s.pending_ctas(&id);
    s.queue.clear();
    s.ctas.get_mut(&ctas[0].cta_id).unwrap().status = CtaStatus::Expired;
    s.send(
        &id,
        Input::CtaExpired {
            cta_id: ctas[0].cta_id.clone(),
        },
    );
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Expired);
    assert_eq!(run.error.as_ref().unwrap().code, "cta_expired");
    let tools = s.tools(&id);
    assert_eq!(tools[0].cta.as_ref().unwrap().status, CtaStatus::Expired);
    assert_eq!(tools[1].cta.as_ref().unwrap().status, CtaStatus::Cancelled);
    assert!(tools.iter().all(|t| !t.result.is_pending()));
    assert_eq!(s.ctas[&ctas[1].cta_id].status, CtaStatus::Cancelled);
    assert!(
        s.queue
            .iter()
            .any(|m| m.run_id == child && matches!(m.input, Input::Cancel { .. }))
    );
    assert_eq!(s.events("run.expired").len(), 1);
    // A late answer finds nothing pending.
    assert_eq!(
        s.send(
            &id,
            Input::CtaAnswered {
                cta_id: ctas[1].cta_id.clone(),
                response: CtaResponse::Approval {
                    approved: true,
                    reason: None
                },
                responder: None,
            }
        ),
        Outcome::Ignored
    );
}

#[test]
fn a_run_may_opt_to_continue_past_an_expiry() {
    let mut s = Sim::new();
    s.script(
        "asker",
        vec![
            feedback(json!({"kind": "text", "prompt": "?"})),
            text("carried on"),
        ],
    );
    let id = s.create("asker", "ask");
    s.runs.get_mut(&id).unwrap().0.on_expiry = ExpiryPolicy::Continue;
    s.run_all();
    let cta = s.pending_ctas(&id)[0].cta_id.clone();
    s.send(&id, Input::CtaExpired { cta_id: cta });
    s.run_all();
    assert!(
        matches!(&s.tools(&id)[0].result, ToolResult::Error { error } if error.contains("expired"))
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.run(&id).result.as_deref(), Some("carried on"));
}

#[test]
fn cancellation_cancels_ctas_and_children_once() {
    let mut s = Sim::new();
    s.script(
        "orchestrator",
        vec![calls(vec![
            spawn("explore", "x"),
            call(
                "request_human_feedback",
                json!({"kind": "approval", "message": "?"}),
            ),
        ])],
    );
    s.script(
        "explore",
        vec![feedback(json!({"kind": "text", "prompt": "?"}))],
    );
    s.catalog = Catalog::new(
        Limits::default(),
        vec![],
        Some(
            serde_json::from_value(json!({"agents": {
        "explore": {"tools": ["request_human_feedback"]}}}))
            .unwrap(),
        ),
    )
    .unwrap();
    let id = s.create("orchestrator", "go");
    s.run_all();
    let child = s.children(&id)[0].clone();
    assert_eq!(s.run(&child).status, RunStatus::Waiting);
    assert_eq!(
        s.ctas
            .values()
            .filter(|c| c.status == CtaStatus::Pending)
            .count(),
        2
    );
    s.send(
        &id,
        Input::Cancel {
            reason: "stop".into(),
        },
    );
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Cancelled);
    assert_eq!(
        s.run(&child).status,
        RunStatus::Cancelled,
        "children are cancelled too"
    );
    assert!(s.ctas.values().all(|c| c.status == CtaStatus::Cancelled));
    assert_eq!(
        s.send(
            &id,
            Input::Cancel {
                reason: "again".into()
            }
        ),
        Outcome::Ignored
    );
    assert_eq!(s.events("run.cancelled").len(), 2);
}

#[test]
fn a_follow_up_message_starts_a_new_turn_on_the_same_timeline() {
    let mut s = Sim::new();
    s.script("explore", vec![text("first"), text("second")]);
    let id = s.create("explore", "one");
    s.run_all();
    let msg = Input::UserMessage {
        text: "two".into(),
        message_id: "m1".into(),
        reply_to: None,
        options: Default::default(),
    };
    assert_eq!(s.send(&id, msg.clone()), Outcome::Done);
    let run = s.run(&id);
    assert_eq!(
        (run.status, run.thinks, run.turn_thinks),
        (RunStatus::Completed, 2, 1)
    );
    assert_eq!(run.result.as_deref(), Some("second"));
    let tl = &s.runs[&id].1;
    assert!(matches!(&tl[2].body, EntryBody::User { text, .. } if text == "two"));
    assert_eq!(tl.len(), 4);
    // The same message again is a redelivery.
    assert_eq!(s.send(&id, msg), Outcome::Ignored);
}

#[test]
fn a_follow_up_that_reaches_a_cancelled_run_is_refused_there_and_the_run_stays_ended() {
    // The API refuses a follow-up to a run that ended for good; one it admitted just
    // before a cancel won the run's queue reaches a cancelled run: the writer refuses it.
    let mut s = Sim::new();
    s.script(
        "asker",
        vec![
            feedback(json!({"kind": "text", "prompt": "?"})),
            text("never"),
        ],
    );
    let id = s.create("asker", "ask");
    s.run_all();
    s.send(
        &id,
        Input::Cancel {
            reason: "stop".into(),
        },
    );
    s.run_all();
    let before = s.run(&id).thinks;
    let msg = Input::UserMessage {
        text: "are you there?".into(),
        message_id: "m9".into(),
        reply_to: None,
        options: Default::default(),
    };
    assert_eq!(s.send(&id, msg), Outcome::Done);
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Cancelled, "a cancel is final");
    assert_eq!(run.thinks, before, "no model call");
    let tl = &s.runs[&id].1;
    assert!(
        tl.iter().any(
            |e| matches!(&e.body, EntryBody::Notice { code, .. } if code == "follow_up_refused")
        ),
        "{tl:?}"
    );
}

#[test]
fn failed_and_expired_runs_refuse_follow_ups_and_triggers_and_completed_ones_take_them() {
    // The state diagram: only `completed` goes on with a follow-up; `failed` and
    // `expired` are final, as `cancelled` is (above).
    for (status, takes) in [
        (RunStatus::Failed, false),
        (RunStatus::Expired, false),
        (RunStatus::Completed, true),
    ] {
        let mut s = Sim::new();
        s.script("explore", vec![text("first"), text("second")]);
        let id = s.create("explore", "one");
        s.run_all();
        s.runs.get_mut(&id).unwrap().0.status = status;
        let msg = Input::UserMessage {
            text: "again".into(),
            message_id: "m1".into(),
            reply_to: None,
            options: Default::default(),
        };
        assert_eq!(s.send(&id, msg), Outcome::Done);
        s.run_all();
        let run = s.run(&id);
        if takes {
            assert_eq!(
                (run.status, run.thinks),
                (RunStatus::Completed, 2),
                "{status:?}"
            );
        } else {
            assert_eq!(
                (run.status, run.thinks),
                (status, 1),
                "{status:?} stays final"
            );
            let tl = &s.runs[&id].1;
            assert!(
                tl.iter().any(|e| matches!(&e.body, EntryBody::Notice { code, .. } if code == "follow_up_refused")),
                "{status:?}"
            );
        }
    }
}

#[test]
fn a_message_to_an_active_run_waits_as_a_queued_entry() {
    let mut s = Sim::new();
    s.script(
        "asker",
        vec![feedback(json!({"kind": "text", "prompt": "?"}))],
    );
    let id = s.create("asker", "ask");
    s.run_all();
    let msg = Input::UserMessage {
        text: "hey".into(),
        message_id: "m1".into(),
        reply_to: None,
        options: Default::default(),
    };
    assert_eq!(s.send(&id, msg.clone()), Outcome::Done);
    let (run, tl) = &s.runs[&id];
    assert_eq!(run.status, RunStatus::Waiting, "the turn under way goes on");
    let seq = tl.len() as u64 - 1;
    assert_eq!(run.queued, vec![seq]);
    assert!(
        matches!(&tl[seq as usize].body, EntryBody::Queued { message_id, .. } if message_id == "m1")
    );
    // A redelivery queues nothing more.
    assert_eq!(s.send(&id, msg), Outcome::Ignored);
    assert_eq!(s.runs[&id].0.queued.len(), 1);
}

#[test]
fn a_follow_up_between_a_tool_step_and_the_next_think_gets_its_own_turn() {
    // Given a run whose first step ran a tool and sent itself a continue,
    let mut s = Sim::new();
    s.script(
        "worker",
        vec![
            calls(vec![call("echo", json!({"text": "x"}))]),
            text("first turn done"),
            text("second turn done"),
        ],
    );
    let id = s.create("worker", "go");
    let start = s.queue.pop_front().unwrap();
    assert_eq!(s.deliver(&start), Outcome::Done);
    let cont = s.queue.pop_front().unwrap();
    assert!(matches!(cont.input, Input::Continue { .. }));
    // when a follow-up is queued before that continue is taken (it moves the version),
    let msg = Input::UserMessage {
        text: "and then?".into(),
        message_id: "m1".into(),
        reply_to: None,
        options: Default::default(),
    };
    assert_eq!(s.send(&id, msg), Outcome::Done);
    assert_eq!(s.run(&id).queued.len(), 1);
    // then the continue still applies: the turn ends, and the follow-up gets its own turn.
    assert_eq!(s.deliver(&cont), Outcome::Done, "the continue is not stale");
    // A redelivery of the same continue is.
    assert_eq!(s.deliver(&cont), Outcome::Ignored);
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.result.as_deref(), Some("second turn done"));
    assert!(run.queued.is_empty());
    assert_eq!(run.continue_at, None);
    let users = s.runs[&id]
        .1
        .iter()
        .filter(|e| matches!(&e.body, EntryBody::User { message_id: Some(m), .. } if m == "m1"))
        .count();
    assert_eq!(users, 1, "one turn for the follow-up");
}

#[test]
fn the_iteration_cap_force_completes_with_a_recorded_reason() {
    let mut s = Sim::new();
    let echo = || calls(vec![call("echo", json!({"text": "again"}))]);
    s.script("worker", vec![echo(), echo(), echo(), echo()]);
    let id = s.create("worker", "loop");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.thinks, 3, "worker's maxIterations is 3");
    assert_eq!(run.error.as_ref().map(|e| e.code.as_str()), None);
    assert!(
        matches!(&s.runs[&id].1.last().unwrap().body, EntryBody::Notice { code, .. } if code == "max_iterations")
    );
    assert!(run.result.as_deref().unwrap().contains("3 iterations"));
}

/// A reply of `n` echo calls.
fn echoes(n: usize) -> LlmReply {
    calls(
        (0..n)
            .map(|i| call("echo", json!({"text": format!("e{i}")})))
            .collect(),
    )
}

#[test]
fn the_tool_call_cap_counts_the_turn_and_ends_it_with_a_final_answer() {
    let mut s = Sim::new();
    // 9 calls over 3 replies, with a cap of 8: the ninth is not run, an error entry says
    // so, and the model is asked for its final answer (without tools, by the thinker).
    s.script(
        "capped",
        vec![
            echoes(3),
            echoes(3),
            echoes(3),
            text("Here is what I found."),
        ],
    );
    let id = s.create("capped", "dig");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.result.as_deref(), Some("Here is what I found."));
    assert_eq!((run.turn_tool_calls, run.tools_spent), (8, true));
    assert_eq!(s.executed.len(), 8, "eight calls ran");
    let timeline = &s.runs[&id].1;
    let not_run: Vec<&ToolEntry> = timeline
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::Tool(t) if matches!(&t.result, ToolResult::Error { error } if error.starts_with("not run")) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(not_run.len(), 1);
    let error = timeline
        .iter()
        .position(|e| matches!(&e.body, EntryBody::Error { code, .. } if code == "tool_call_limit"))
        .expect("an error entry");
    let answer = timeline
        .iter()
        .position(|e| matches!(&e.body, EntryBody::Assistant { text: Some(t), .. } if t == "Here is what I found."))
        .unwrap();
    assert!(error < answer);
    assert_eq!(s.events("run.error").len(), 1);
    // The next turn starts with its own count.
    s.script(
        "capped",
        vec![
            echoes(3),
            echoes(3),
            echoes(3),
            text("Here is what I found."),
            echoes(2),
            text("again"),
        ],
    );
    let msg = Input::UserMessage {
        text: "once more".into(),
        message_id: "m2".into(),
        reply_to: None,
        options: Default::default(),
    };
    s.send(&id, msg);
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.result.as_deref(), Some("again"));
    assert_eq!((run.turn_tool_calls, run.tools_spent), (2, false));
}

#[test]
fn a_model_that_calls_tools_past_the_cap_fails_the_run() {
    let mut s = Sim::new();
    s.script("capped", vec![echoes(5), echoes(5), echoes(1)]);
    let id = s.create("capped", "dig");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(
        run.error.as_ref().map(|e| e.code.as_str()),
        Some("tool_call_limit")
    );
    assert_eq!(s.executed.len(), 8);
}

#[test]
fn redelivered_and_stale_messages_do_nothing() {
    let mut s = Sim::new();
    s.script(
        "worker",
        vec![calls(vec![call("echo", json!({"text": "x"}))]), text("ok")],
    );
    let id = s.create("worker", "go");
    let start = s.queue.pop_front().unwrap();
    assert_eq!(s.deliver(&start), Outcome::Done);
    assert_eq!(s.deliver(&start), Outcome::Ignored);
    let cont = s.queue.pop_front().unwrap();
    assert_eq!(s.deliver(&cont), Outcome::Done);
    assert_eq!(s.deliver(&cont), Outcome::Ignored);
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    let tail = StepMessage {
        run_id: id.clone(),
        id: "x".into(),
        input: Input::ChildFinished {
            child_run_id: "run_nope".into(),
            tool_call_id: "call_0_0".into(),
            outcome: ChildOutcome::Completed {
                text: "x".into(),
                step_count: 1,
                total_usage: Usage::default(),
            },
            spent: Default::default(),
            breakdown: vec![],
        },
    };
    assert_eq!(s.deliver(&tail), Outcome::Ignored);
    assert_eq!(
        s.send(
            &id,
            Input::Fail {
                code: "x".into(),
                message: "y".into()
            }
        ),
        Outcome::Ignored
    );
}

#[test]
fn a_parent_can_continue_its_finished_subagent_by_id() {
    let mut s = Sim::new();
    // The child's id is derived from the parent and the seq of the spawning call (2).
    let child = derive_id("sub", "run_top0", 2);
    s.script("explore", vec![text("first look"), text("second look")]);
    s.script(
        "orchestrator",
        vec![
            calls(vec![spawn("explore", "look")]),
            calls(vec![call(
                "spawn_subagent",
                json!({"subagentId": child, "prompt": "look again"}),
            )]),
            text("done"),
        ],
    );
    let id = s.create("orchestrator", "go");
    s.run_all();
    let tools = s.tools(&id);
    assert_eq!(s.children(&id), vec![child.clone(), child.clone()]);
    assert!(
        matches!(&tools[0].result, ToolResult::Success { output } if output["text"] == "first look")
    );
    assert!(
        matches!(&tools[1].result, ToolResult::Success { output } if output["text"] == "second look" && output["stepCount"] == 2)
    );
    assert_eq!(s.run(&child).thinks, 2);
    assert_eq!(
        s.run(&child).parent.as_ref().unwrap().tool_call_id,
        tools[1].id
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_run_cannot_continue_someone_elses_subagent() {
    let mut s = Sim::new();
    s.script("explore", vec![text("mine")]);
    s.script(
        "orchestrator",
        vec![
            calls(vec![call(
                "spawn_subagent",
                json!({"subagentId": "run_top0", "prompt": "leak"}),
            )]),
            text("ok"),
        ],
    );
    let victim = s.create("explore", "secret");
    s.run_all();
    let id = s.create("orchestrator", "go");
    s.run_all();
    assert!(
        matches!(&s.tools(&id)[0].result, ToolResult::Error { error } if error.contains("no such subagent"))
    );
    assert_eq!(
        s.run(&victim).thinks,
        1,
        "the other run did not take a turn"
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn ids_are_derived_so_a_retried_step_mints_the_same_ones() {
    assert_eq!(derive_id("cta", "run_a", 3), derive_id("cta", "run_a", 3));
    assert_ne!(derive_id("cta", "run_a", 3), derive_id("cta", "run_a", 4));
    assert_ne!(derive_id("cta", "run_a", 3), derive_id("run", "run_a", 3));
    assert!(derive_id("cta", "run_a", 3).starts_with("cta_"));
    let choice = CtaRequest::Choice {
        prompt: "p".into(),
        options: vec![ChoiceOption {
            id: "a".into(),
            label: "A".into(),
            description: None,
        }],
    };
    assert_eq!(choice.kind(), "choice");
}

#[test]
fn a_fatal_model_error_fails_the_run_after_applying_the_input() {
    let mut s = Sim::new();
    s.script("orchestrator", vec![calls(vec![spawn("explore", "x")])]);
    s.script("explore", vec![text("found")]);
    let id = s.create("orchestrator", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    let child = s.children(&id)[0].clone();
    let child_start = s.queue.pop_front().unwrap();
    s.deliver(&child_start);
    let finished = s.queue.pop_front().unwrap();
    // The parent's next think fails for good: the child's result is still recorded.
    let (run, timeline) = s.runs[&id].clone();
    let io = Io {
        model_error: Some("the model refused".into()),
        ..Io::default()
    };
    let Step::Done(t) = step(&s.catalog, s.now, &run, &timeline, &finished.input, &io) else {
        panic!("expected a transition")
    };
    assert_eq!(t.run.status, RunStatus::Failed);
    assert_eq!(t.run.error.as_ref().unwrap().code, "model_error");
    let resolved = t.updated[0].tool().unwrap();
    assert_eq!(resolved.child_run_id.as_deref(), Some(child.as_str()));
    assert!(
        matches!(&resolved.result, ToolResult::Success { output } if output["text"] == "found")
    );
}

#[test]
fn oversized_tool_outputs_are_cut_with_a_marker() {
    let big = "x".repeat(MAX_OUTPUT_BYTES + 10);
    let mut s = Sim::new();
    s.script(
        "worker",
        vec![calls(vec![call("echo", json!({"text": big}))]), text("ok")],
    );
    let id = s.create("worker", "go");
    s.run_all();
    match &s.tools(&id)[0].result {
        ToolResult::Success { output } => {
            assert_eq!(output["truncated"], true);
            assert_eq!(output["originalBytes"], MAX_OUTPUT_BYTES + 10);
            assert!(output["preview"].as_str().unwrap().ends_with(&format!(
                "[truncated: {MAX_OUTPUT_BYTES} of {} bytes kept]",
                MAX_OUTPUT_BYTES + 10
            )));
        }
        r => panic!("{r:?}"),
    }
    assert!(s.children(&id).is_empty());
    assert!(derive_id("sub", "run_a", 1).starts_with("sub_"));
}

#[test]
fn a_cta_waits_as_long_as_its_agent_allows_or_the_call_asks_for_less() {
    // (agent, the call the model makes, seconds until the CTA expires)
    let ask = |extra: Value| {
        let mut v = json!({"kind": "text", "prompt": "name?"});
        if let (Value::Object(o), Value::Object(e)) = (&mut v, extra) {
            o.extend(e);
        }
        call("request_human_feedback", v)
    };
    let table = [
        ("asker", ask(json!({})), 30 * 24 * 3600),
        ("asker", ask(json!({"expiresInSeconds": 5})), 5),
        ("quick", ask(json!({})), 60),
        ("quick", ask(json!({"expiresInSeconds": 5})), 5),
        ("quick", ask(json!({"expiresInSeconds": 600})), 60),
        ("quick", call("echo", json!({"text": "gated"})), 60),
    ];
    for (agent, c, seconds) in table {
        let mut s = Sim::new();
        s.script(agent, vec![calls(vec![c.clone()])]);
        let id = s.create(agent, "go");
        s.run_all();
        let ctas = s.pending_ctas(&id);
        assert_eq!(ctas.len(), 1, "{agent} {c:?}");
        let want = t0() + chrono::Duration::seconds(seconds);
        assert_eq!(ctas[0].expires_at, want, "{agent} {c:?}");
        let scheduled = s.effects.iter().any(
            |e| matches!(e, Effect::Schedule { cta_id, at, .. } if *cta_id == ctas[0].cta_id && *at == want),
        );
        assert!(
            scheduled,
            "the timer fires exactly at expiresAt: {agent} {c:?}"
        );
        let request = s.events("cta.request");
        assert_eq!(request[0].detail["expiresAt"], json!(want), "{agent} {c:?}");
        let snap = s.tools(&id)[0].cta.clone().expect("snapshot");
        assert_eq!(snap.expires_at, want);
        if let CtaRequest::Text { .. } = snap.request {
            assert!(
                !serde_json::to_string(&snap)
                    .unwrap()
                    .contains("expiresInSeconds"),
                "the wait is not part of the question"
            );
        }
    }
}

#[test]
fn the_responder_of_an_answer_is_recorded_beside_it() {
    let mut s = Sim::new();
    s.script(
        "asker",
        vec![
            calls(vec![call(
                "request_human_feedback",
                json!({"kind": "text", "prompt": "name?"}),
            )]),
            text("thanks"),
        ],
    );
    let id = s.create("asker", "go");
    s.run_all();
    let cta_id = s.pending_ctas(&id)[0].cta_id.clone();
    s.send(
        &id,
        Input::CtaAnswered {
            cta_id,
            response: CtaResponse::Text { text: "Ada".into() },
            responder: Some("ops@example.com".into()),
        },
    );
    let snap = s.tools(&id)[0].cta.clone().expect("snapshot");
    assert_eq!(snap.status, CtaStatus::Answered);
    assert_eq!(snap.responder.as_deref(), Some("ops@example.com"));
}

#[test]
fn a_long_answer_is_whole_in_the_timeline_and_a_preview_everywhere_else() {
    let long = "word ".repeat(100_000); // 500 KB
    let mut s = Sim::new();
    s.script(
        "deep",
        vec![
            calls(vec![call(
                "spawn_subagent",
                json!({"agent": "explore", "prompt": "write a lot"}),
            )]),
            text("done"),
        ],
    );
    s.script("explore", vec![text(&long)]);
    let id = s.create("deep", "go");
    s.run_all();
    let child = s.children(&id)[0].clone();
    let (run, timeline) = &s.runs[&child];
    // The reply entry holds it all; the run item a preview and where the rest is.
    assert!(matches!(&timeline.last().unwrap().body,
        EntryBody::Assistant { text: Some(t), .. } if t.len() == long.len()));
    assert!(run.result_truncated);
    assert_eq!(run.result_seq, Some(timeline.len() as u64 - 1));
    assert_eq!(run.result.as_ref().unwrap().len(), PREVIEW_BYTES);
    // So does the event.
    let done = s
        .events("run.completed")
        .into_iter()
        .find(|e| e.detail["runId"] == child.as_str())
        .unwrap();
    assert_eq!(done.detail["text"].as_str().unwrap().len(), PREVIEW_BYTES);
    assert_eq!(done.detail["textTruncated"], true);
    assert_eq!(done.detail["resultSeq"], json!(run.result_seq));
    // The parent gets what a tool output may be, with a marker.
    let out = s.tools(&id)[0].result.clone();
    let ToolResult::Success { output } = out else {
        panic!("{out:?}")
    };
    let t = output["text"].as_str().unwrap();
    assert!(t.len() < MAX_OUTPUT_BYTES + 100, "{}", t.len());
    assert!(t.ends_with(&format!(
        "[truncated: {MAX_OUTPUT_BYTES} of {} bytes kept]",
        long.len()
    )));
}

#[test]
fn an_oversized_question_is_an_error_the_model_sees() {
    let mut s = Sim::new();
    let huge = "?".repeat(MAX_CTA_REQUEST_BYTES + 1);
    s.script(
        "asker",
        vec![
            calls(vec![call(
                "request_human_feedback",
                json!({"kind": "text", "prompt": huge}),
            )]),
            text("I will ask less"),
        ],
    );
    let id = s.create("asker", "go");
    s.run_all();
    assert!(s.pending_ctas(&id).is_empty());
    assert!(matches!(&s.tools(&id)[0].result,
        ToolResult::Error { error } if error.contains("bytes; ask in at most")));
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn every_call_is_priced_and_subagents_report_what_they_spent_once() {
    let mut s = Sim::new();
    let child = derive_id("sub", "run_top0", 2);
    s.script("explore", vec![text("first look"), text("second look")]);
    s.script(
        "orchestrator",
        vec![
            calls(vec![spawn("explore", "look")]),
            calls(vec![call(
                "spawn_subagent",
                json!({"subagentId": child, "prompt": "look again"}),
            )]),
            text("done"),
        ],
    );
    let id = s.create("orchestrator", "go");
    s.run_all();
    // gpt-4o-mini: $0.15 in, $0.60 out per million tokens.
    let price = |input: f64, output: f64| (input * 0.15 + output * 0.60) / 1e6;
    let near = |a: f64, b: f64| (a - b).abs() < 1e-12;
    let kid = s.run(&child);
    assert!(near(kid.cost_usd, price(10.0, 2.0)), "{}", kid.cost_usd);
    let parent = s.run(&id);
    assert!(
        near(parent.cost_usd, price(25.0, 5.0)),
        "{}",
        parent.cost_usd
    );
    // The child finished twice; each time it reported only what it spent since.
    assert_eq!(parent.children.usage.input_tokens, 10);
    assert!(near(parent.children.cost_usd, kid.cost_usd));
    assert_eq!(parent.total().usage.total_tokens, 30 + 12);
    let replies: Vec<Option<f64>> = s.runs[&id]
        .1
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::Assistant {
                cost_usd,
                model,
                operation,
                ..
            } => {
                assert_eq!(model.as_deref(), Some("openai:gpt-4o-mini"));
                assert_eq!(*operation, crate::timeline::Operation::Think);
                Some(*cost_usd)
            }
            _ => None,
        })
        .collect();
    assert_eq!(replies.len(), 3);
    assert!(near(replies[2].expect("priced"), price(5.0, 1.0)));
    let done = s.events("run.completed");
    let last = &done.last().expect("completed").detail;
    assert!(near(
        last["total"]["costUsd"].as_f64().expect("total cost"),
        parent.total().cost_usd
    ));
}

#[test]
fn a_run_past_its_wall_time_fails_naming_the_limit_and_human_waits_do_not_count() {
    let mut s = Sim::new();
    s.script(
        "timed",
        vec![
            feedback(json!({"kind": "approval", "message": "Go?"})),
            calls(vec![call("echo", json!({"text": "a"}))]),
            calls(vec![call("echo", json!({"text": "b"}))]),
            text("never"),
        ],
    );
    let id = s.create("timed", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    assert_eq!(s.run(&id).state.as_deref(), Some("waiting_on_user"));
    // Ten days pass before the human answers: that wait is not the run's working time.
    s.now += chrono::Duration::days(10);
    let cta = s.pending_ctas(&id)[0].cta_id.clone();
    s.answer(
        &cta,
        CtaResponse::Approval {
            approved: true,
            reason: None,
        },
    );
    let answered = s.queue.pop_front().unwrap();
    s.deliver(&answered);
    assert_eq!(s.run(&id).status, RunStatus::Running, "thought and echoed");
    assert_eq!(s.run(&id).human_wait_ms, 10 * 24 * 3600 * 1000);
    // Then it works past its 60 s: the next iteration ends it.
    s.now += chrono::Duration::seconds(61);
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.as_ref().expect("error");
    assert_eq!(error.code, "deadline_exceeded");
    assert!(
        error.message.contains("maxWallSeconds = 60"),
        "{}",
        error.message
    );
    assert_eq!(s.tools(&id).len(), 2, "the third think never happened");
}

/// The deadline timers a run has had armed: (id, when), and those cancelled.
fn deadline_timers(
    s: &Sim,
    run: &str,
) -> (Vec<(String, chrono::DateTime<chrono::Utc>)>, Vec<String>) {
    let mut armed = Vec::new();
    let mut cancelled = Vec::new();
    for e in &s.effects {
        match e {
            Effect::Timer {
                timer_id,
                run_id,
                at,
            } if run_id == run && timer_id.contains("deadline") => {
                armed.push((timer_id.clone(), *at));
            }
            Effect::CancelTimer { timer_id } if timer_id.contains("deadline") => {
                cancelled.push(timer_id.clone());
            }
            _ => {}
        }
    }
    (armed, cancelled)
}

#[test]
fn idle_time_between_turns_is_not_work() {
    let mut s = Sim::new();
    s.script("timed", vec![text("first"), text("second")]);
    let id = s.create("timed", "go");
    s.now += chrono::Duration::seconds(10);
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    // Two hours idle, far past its 60 s: a follow-up still runs.
    s.now += chrono::Duration::hours(2);
    let msg = Input::UserMessage {
        text: "and now?".into(),
        message_id: "m1".into(),
        reply_to: None,
        options: Default::default(),
    };
    s.send(&id, msg);
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(run.result.as_deref(), Some("second"));
    assert!(run.working_time(s.now).num_seconds() < 60);
}

#[test]
fn a_subagents_wait_for_a_human_is_not_its_parents_work() {
    let mut s = Sim::new();
    s.script(
        "patient",
        vec![calls(vec![spawn("asker", "check")]), text("parent done")],
    );
    s.script(
        "asker",
        vec![
            feedback(json!({"kind": "approval", "message": "Ok?"})),
            text("checked"),
        ],
    );
    let id = s.create("patient", "go");
    s.run_all();
    let child = s.children(&id)[0].clone();
    assert_eq!(s.run(&child).state.as_deref(), Some("waiting_on_user"));
    assert!(!s.run(&id).waiting_ctas.is_empty());
    // Armed while the parent waited on its subagent's work, cancelled when that became a
    // wait for a human: the parent's clock stopped.
    let (armed, cancelled) = deadline_timers(&s, &id);
    assert_eq!(
        (armed.len(), cancelled.len()),
        (1, 1),
        "{armed:?} {cancelled:?}"
    );
    assert_eq!(s.run(&id).working_since, None);
    // Three days later the human answers: the parent goes on and completes.
    s.now += chrono::Duration::days(3);
    let cta = s.pending_ctas(&child)[0].cta_id.clone();
    s.answer(
        &cta,
        CtaResponse::Approval {
            approved: true,
            reason: None,
        },
    );
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(run.result.as_deref(), Some("parent done"));
    assert!(run.working_time(s.now).num_seconds() < 60);
    // Every deadline timer armed was cancelled by the end.
    let (armed, cancelled) = deadline_timers(&s, &id);
    assert_eq!(armed.len(), cancelled.len(), "{armed:?} {cancelled:?}");
}

#[test]
fn a_run_waiting_on_a_slow_subagent_is_stopped_at_its_deadline() {
    let mut s = Sim::new();
    s.script(
        "patient",
        vec![calls(vec![spawn("alpha", "take your time")])],
    );
    let id = s.create("patient", "go");
    let start = s.queue.pop_front().unwrap();
    s.deliver(&start);
    // The child's messages are never delivered: it is slow.
    s.queue.clear();
    assert_eq!(s.run(&id).status, RunStatus::Waiting);
    let (armed, _) = deadline_timers(&s, &id);
    let [(timer_id, at)] = armed.as_slice() else {
        panic!("one deadline timer: {armed:?}");
    };
    assert_eq!(*at, s.now + chrono::Duration::seconds(60));
    let fire = |t: &str| Input::Timer { timer_id: t.into() };
    // Another timer id is not the deadline's.
    assert_eq!(s.send(&id, fire("tmr_other")), Outcome::Ignored);
    s.now = *at;
    assert_eq!(s.send(&id, fire(timer_id)), Outcome::Done);
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.as_ref().expect("error");
    assert_eq!(error.code, "deadline_exceeded");
    assert!(error.message.contains("subagents"), "{}", error.message);
    // Its subagent is told to stop.
    let child = s.children(&id)[0].clone();
    assert!(
        s.queue
            .iter()
            .any(|m| m.run_id == child && matches!(m.input, Input::Cancel { .. })),
        "{:?}",
        s.queue
    );
    // A stale firing after the end changes nothing more.
    let version = s.run(&id).version;
    s.send(&id, fire(timer_id));
    assert_eq!(s.run(&id).version, version);
}

/// A plugin that reads an index (async) for whether `echo` is on, counts its activations
/// in its state, and says the count in the system prompt. `flip` turns the index over after
/// each read, as a source that changes while the model thinks.
struct Skills {
    on: std::sync::Arc<std::sync::atomic::AtomicBool>,
    flip: bool,
}

#[derive(serde::Serialize, serde::Deserialize, Default)]
struct SkillState {
    activations: u32,
}

#[async_trait::async_trait]
impl crate::agent::Plugin for Skills {
    type State = SkillState;

    fn name(&self) -> &str {
        "skills"
    }

    async fn prepare(
        &self,
        _: &Run,
        _: &[Entry],
        state: &mut SkillState,
    ) -> Result<crate::agent::Prepared, String> {
        use std::sync::atomic::Ordering::SeqCst;
        let on = if self.flip {
            self.on.fetch_xor(true, SeqCst)
        } else {
            self.on.load(SeqCst)
        };
        state.activations += 1;
        Ok(crate::agent::Prepared {
            tools: if on { vec!["echo".into()] } else { vec![] },
            context: Some(format!("activation {}", state.activations)),
        })
    }
}

#[test]
fn a_plugin_adds_tools_and_context_and_keeps_typed_state_committed_with_each_think() {
    let on = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut s = Sim::new();
    let skills = Skills {
        on: on.clone(),
        flip: false,
    };
    s.catalog = std::mem::replace(&mut s.catalog, catalog_with(Limits::default()))
        .with_plugin("deep", skills);
    let echo = || calls(vec![call("echo", json!({"text": "x"}))]);
    s.script("deep", vec![echo(), text("ok")]);
    let id = s.create("deep", "go");
    s.run_all();
    // The index said no to echo: the call is refused; the state counted both thinks.
    assert!(
        matches!(&s.tools(&id)[0].result, ToolResult::Error { error } if error.contains("unknown tool"))
    );
    assert_eq!(s.run(&id).plugin_state["skills"], json!({"activations": 2}));
    on.store(true, std::sync::atomic::Ordering::SeqCst);
    let (run, timeline) = s.runs[&id].clone();
    let agent = s.catalog.agent("deep").expect("deep");
    let p = block_on(agent.prepare(&run, &timeline)).expect("prepares");
    assert_eq!(p.prepared.tools, ["echo"]);
    assert_eq!(
        p.states["skills"],
        json!({"activations": 3}),
        "from the committed state"
    );
    assert!(
        agent
            .system_prompt(&run, &p.prepared)
            .ends_with("activation 3")
    );
}

#[test]
fn what_the_plugins_answered_is_the_steps_input_however_their_source_moves() {
    // The index turns over right after it is read: the model was offered `echo`, and its
    // call is checked against that offer, not against a second reading.
    let on = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut s = Sim::new();
    let skills = Skills {
        on: on.clone(),
        flip: true,
    };
    s.catalog = std::mem::replace(&mut s.catalog, catalog_with(Limits::default()))
        .with_plugin("deep", skills);
    let id = s.create("deep", "go");
    let (run, timeline) = s.runs[&id].clone();
    let world = Scripted {
        agent: "deep".into(),
        replies: vec![calls(vec![call("echo", json!({"text": "x"}))])],
        executed: Mutex::new(Vec::new()),
    };
    let decision = block_on(driver::decide(
        &s.catalog,
        s.now,
        &run,
        &timeline,
        &Input::Start,
        &world,
    ))
    .expect("decides");
    assert!(
        !on.load(std::sync::atomic::Ordering::SeqCst),
        "the source moved"
    );
    assert_eq!(
        world.executed.lock().expect("not poisoned").len(),
        1,
        "echo ran"
    );
    let driver::Decision::Commit(t) = decision else {
        panic!("commits")
    };
    assert_eq!(t.run.plugin_state["skills"], json!({"activations": 1}));
}

#[test]
fn context_guidance_joins_the_system_prompt_by_the_contexts_type() {
    let file: AgentsFile = serde_json::from_value(json!({"agents": {"reader": {
        "system": "You read.", "tools": [],
        "contextGuidance": {"document": "Quote the document."}
    }}}))
    .unwrap();
    let catalog = Catalog::new(Limits::default(), vec![], Some(file)).unwrap();
    let agent = catalog.agent("reader").unwrap();
    let mut run = Run::new(NewRun {
        run_id: "r".into(),
        agent: "reader".into(),
        owner: "o".into(),
        parent: None,
        depth: 0,
        on_expiry: ExpiryPolicy::End,
        sandbox_id: None,
        metadata: None,
        context: Some(json!({"type": "document", "id": "doc-7"})),
        root_run_id: None,
        now: t0(),
    });
    let none = crate::agent::Prepared::default();
    let system = agent.system_prompt(&run, &none);
    assert!(system.starts_with("You read.\n\nQuote the document.\n\nContext (document):"));
    assert!(system.contains("doc-7"));
    run.context = Some(json!({"type": "ticket"}));
    assert!(!agent.system_prompt(&run, &none).contains("Quote"));
    run.context = None;
    assert_eq!(agent.system_prompt(&run, &none), "You read.");
}

#[test]
fn widgets_are_timeline_entries_the_model_never_sees() {
    let mut s = Sim::new();
    s.script(
        "worker",
        vec![
            calls(vec![call("echo", json!({"text": "chart"}))]),
            text("drawn"),
        ],
    );
    let id = s.create("worker", "draw");
    s.run_all();
    let timeline = s.runs[&id].1.clone();
    let widget = timeline
        .iter()
        .find_map(|e| match &e.body {
            EntryBody::Widget {
                call_id,
                kind,
                data,
            } => Some((call_id.clone(), kind.clone(), data.clone())),
            _ => None,
        })
        .expect("a widget entry");
    assert_eq!(widget.0, s.tools(&id)[0].id);
    assert_eq!(widget.1, "table");
    assert_eq!(widget.2["rows"][1][0], 2);
    let seen = crate::llm::project("", &timeline);
    assert!(
        !seen.iter().any(|m| format!("{m:?}").contains("rows")),
        "the model's projection leaves widgets out: {seen:?}"
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_files_summary_is_all_the_model_sees_of_it() {
    let mut s = Sim::new();
    s.script(
        "worker",
        vec![
            calls(vec![call("echo", json!({"text": "report"}))]),
            text("sent"),
        ],
    );
    let id = s.create("worker", "report");
    s.run_all();
    let timeline = s.runs[&id].1.clone();
    let file = timeline
        .iter()
        .find_map(|e| match &e.body {
            EntryBody::File(f) => Some(f.clone()),
            _ => None,
        })
        .expect("a file entry");
    assert_eq!(file.call_id, s.tools(&id)[0].id);
    assert_eq!(
        (file.name.as_str(), file.size, file.file_id.as_str()),
        ("report.csv", 2048, "file_1")
    );
    let seen = crate::llm::project("", &timeline);
    let result = seen
        .iter()
        .find_map(|m| match m {
            crate::llm::ChatMessage::Tool { content, .. } => Some(content.clone()),
            _ => None,
        })
        .expect("the call's result");
    assert_eq!(
        result,
        "report\n[file `report.csv` (text/csv, 2048 bytes): 12 rows of sales by region]"
    );
    assert!(!format!("{seen:?}").contains("file_1"), "no id, no bytes");
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn a_parent_hears_when_a_subagent_at_any_depth_waits_for_a_human() {
    let mut s = Sim::new();
    s.script(
        "deep",
        vec![calls(vec![spawn("mid", "delegate")]), text("done")],
    );
    s.script(
        "mid",
        vec![calls(vec![spawn("asker", "ask")]), text("relayed")],
    );
    s.script(
        "asker",
        vec![
            feedback(json!({"kind": "text", "prompt": "Which branch?"})),
            text("on main"),
        ],
    );
    let id = s.create("deep", "go");
    s.run_all();
    let mid = s.children(&id)[0].clone();
    let asker = s.children(&mid)[0].clone();
    let cta = s.pending_ctas(&asker)[0].clone();
    assert_eq!(
        cta.root_run_id.as_deref(),
        Some(id.as_str()),
        "the CTA knows its root"
    );
    for (run, child) in [(&id, &mid), (&mid, &asker)] {
        let r = s.run(run);
        assert_eq!(r.state.as_deref(), Some("waiting_on_subagents"));
        let detail = r.state_detail.clone().expect("details");
        assert_eq!(detail["subagents"], serde_json::json!([child]), "{detail}");
        assert_eq!(r.waiting_ctas.len(), 1, "{run}");
        assert_eq!(r.waiting_ctas[0].cta_id, cta.cta_id);
        assert_eq!(r.waiting_ctas[0].run_id, asker);
        assert_eq!(&r.waiting_ctas[0].child_run_id, child);
        let notice = s.runs[run.as_str()]
            .1
            .iter()
            .find_map(|e| match &e.body {
                EntryBody::Notice { code, message } if code == "subagent_waiting" => {
                    Some(message.clone())
                }
                _ => None,
            })
            .expect("a notice");
        assert!(
            notice.contains("Which branch?")
                && notice.contains(&cta.cta_id)
                && notice.contains(&asker),
            "{notice}"
        );
    }
    // A redelivered notice changes nothing.
    let again = StepMessage {
        run_id: id.clone(),
        id: "again".into(),
        input: Input::ChildWaiting {
            child_run_id: mid.clone(),
            asker_run_id: asker.clone(),
            cta_id: cta.cta_id.clone(),
            question: "Which branch?".into(),
        },
    };
    assert_eq!(s.deliver(&again), Outcome::Ignored);
    s.answer(
        &cta.cta_id,
        CtaResponse::Text {
            text: "main".into(),
        },
    );
    s.run_all();
    assert!(s.run(&id).waiting_ctas.is_empty());
    assert!(s.run(&mid).waiting_ctas.is_empty());
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn an_orchestrator_may_let_a_built_in_subagent_ask_the_human() {
    let mut s = Sim::new();
    let ask = |who: &str| {
        call(
            "spawn_subagent",
            json!({"agent": who, "prompt": "check with the human", "askHuman": true}),
        )
    };
    s.script(
        "orchestrator",
        vec![calls(vec![ask("explore")]), text("done")],
    );
    s.script(
        "explore",
        vec![
            feedback(json!({"kind": "approval", "message": "Read the logs?"})),
            text("read"),
        ],
    );
    // `deep` cannot grant what it does not have.
    s.script("deep", vec![calls(vec![ask("explore")]), text("alone")]);
    let id = s.create("orchestrator", "go");
    let refused = s.create("deep", "go");
    s.run_all();
    let explore = s.children(&id)[0].clone();
    assert_eq!(s.run(&explore).granted, vec!["request_human_feedback"]);
    let cta = s.pending_ctas(&explore)[0].clone();
    assert_eq!(cta.request.question(), "Read the logs?");
    s.answer(
        &cta.cta_id,
        CtaResponse::Approval {
            approved: true,
            reason: None,
        },
    );
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert!(s.children(&refused).is_empty());
    assert!(matches!(&s.tools(&refused)[0].result,
        ToolResult::Error { error } if error.contains("does not have itself")));
}

#[test]
fn an_approval_carries_its_reason_tool_and_input_and_independent_calls_run_at_once() {
    let mut s = Sim::new();
    s.script(
        "free",
        vec![
            calls(vec![
                call("echo", json!({"text": "danger zone"})),
                call("echo", json!({"text": "safe"})),
            ]),
            text("ok"),
        ],
    );
    let id = s.create("free", "go");
    s.run_all();
    assert_eq!(
        s.executed,
        vec!["call_0_1"],
        "independent: the other call ran"
    );
    let cta = s.pending_ctas(&id)[0].clone();
    let gated = cta.gated.clone().expect("the gated call");
    assert_eq!(gated.tool, "echo");
    assert_eq!(gated.input, json!({"text": "danger zone"}));
    assert_eq!(gated.reason.as_deref(), Some("It says danger."));
    let event = s
        .events("cta.request")
        .last()
        .cloned()
        .expect("event")
        .detail;
    assert_eq!(event["tool"], "echo");
    assert_eq!(event["input"]["text"], "danger zone");
    assert_eq!(event["reason"], "It says danger.");
    s.answer(
        &cta.cta_id,
        CtaResponse::Approval {
            approved: true,
            reason: None,
        },
    );
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn deferred_calls_wait_for_every_approval_of_the_reply() {
    let mut s = Sim::new();
    s.script(
        "worker",
        vec![
            calls(vec![
                call("echo", json!({"text": "danger one"})),
                call("echo", json!({"text": "danger two"})),
                call("echo", json!({"text": "safe"})),
            ]),
            text("ok"),
        ],
    );
    let id = s.create("worker", "go");
    s.run_all();
    let ctas = s.pending_ctas(&id);
    assert_eq!(ctas.len(), 2);
    s.answer(
        &ctas[0].cta_id,
        CtaResponse::Approval {
            approved: true,
            reason: None,
        },
    );
    s.run_all();
    // One approval settled, one still waits: the safe call still waits with it.
    assert_eq!(s.executed, vec!["call_0_0"]);
    assert_eq!(
        s.tools(&id)[2].result,
        ToolResult::Pending {
            reason: DEFERRED.into()
        }
    );
    s.answer(
        &ctas[1].cta_id,
        CtaResponse::Approval {
            approved: true,
            reason: None,
        },
    );
    s.run_all();
    assert_eq!(s.executed, vec!["call_0_0", "call_0_1", "call_0_2"]);
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

mod plans;

/// An MCP server that lists one tool, `calc__ping`, and counts how often it was asked.
struct Calc(std::sync::atomic::AtomicU32);

struct Ping;

#[async_trait::async_trait]
impl crate::tools::Tool for Ping {
    fn name(&self) -> &str {
        "calc__ping"
    }
    fn description(&self) -> &str {
        "ping"
    }
    fn schema(&self) -> Value {
        json!({"type": "object"})
    }
    async fn execute(&self, _: &crate::tools::ToolContext, _: Value) -> Result<Value, String> {
        Ok(json!("pong"))
    }
}

#[async_trait::async_trait]
impl crate::tools::ToolServer for Calc {
    async fn list(&self) -> Result<Vec<std::sync::Arc<dyn crate::tools::Tool>>, String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(vec![std::sync::Arc::new(Ping)])
    }
}

/// The world of one step whose MCP server gets listed while the step is under way (as a
/// concurrent step of another run would list it).
struct ListedMidStep<'a> {
    catalog: &'a Catalog,
    listed: crate::agent::Listed,
}

impl StepIo for ListedMidStep<'_> {
    fn listed(&self) -> crate::agent::Listed {
        self.listed.clone()
    }

    fn think(
        &self,
        think_index: u32,
        _: &[Entry],
        _: &crate::agent::Prepared,
    ) -> impl Future<Output = Result<LlmReply, LlmError>> + Send {
        let ops = self.catalog.agent("ops").expect("ops");
        block_on(
            self.catalog
                .list_servers(ops, &crate::agent::Prepared::default()),
        );
        std::future::ready(Ok(match think_index {
            0 => calls(vec![call("calc__ping", json!({}))]),
            _ => text("done"),
        }))
    }

    fn execute(&self, call: Execution) -> impl Future<Output = ToolOutput> + Send {
        assert_eq!(call.tool, "calc__ping", "only the listed tool runs");
        std::future::ready(ToolOutput::from(Ok(json!("pong"))))
    }

    fn settle(
        &self,
        _: Vec<String>,
    ) -> impl Future<Output = Result<HashMap<String, Cta>, crate::error::PortError>> + Send {
        std::future::ready(Ok(HashMap::new()))
    }
}

#[test]
fn a_step_sees_the_tools_listed_when_it_began_and_the_next_step_sees_new_ones() {
    let server = std::sync::Arc::new(Calc(Default::default()));
    let file: AgentsFile = serde_json::from_value(
        json!({"mcpServers": {"calc": {"url": "http://127.0.0.1:9/mcp"}},
            "agents": {"ops": {"tools": ["mcp:calc"]}}}),
    )
    .unwrap();
    let toolbox = crate::agent::Toolbox {
        tools: vec![],
        servers: BTreeMap::from([(
            "calc".to_owned(),
            server.clone() as std::sync::Arc<dyn crate::tools::ToolServer>,
        )]),
    };
    let catalog = Catalog::build(Limits::default(), toolbox, Some(file)).unwrap();
    let start = |id: &str| {
        let mut run = Run::new(NewRun {
            run_id: id.into(),
            agent: "ops".into(),
            owner: "o".into(),
            parent: None,
            depth: 0,
            on_expiry: ExpiryPolicy::End,
            sandbox_id: None,
            metadata: None,
            context: None,
            root_run_id: None,
            now: t0(),
        });
        run.next_seq = 1;
        let first = Entry {
            seq: 0,
            at: t0(),
            body: EntryBody::User {
                text: "ping it".into(),
                message_id: None,
                options: Default::default(),
            },
        };
        (run, vec![first])
    };
    let result_of = |world: &ListedMidStep, id: &str| {
        let (run, timeline) = start(id);
        let decision = block_on(decide(
            &catalog,
            t0(),
            &run,
            &timeline,
            &Input::Start,
            world,
        ))
        .expect("decides");
        let Decision::Commit(t) = decision else {
            panic!("commits")
        };
        t.appended
            .iter()
            .find_map(|e| e.tool().cloned())
            .expect("a tool entry")
            .result
    };
    // Given a step that began before the server was listed, when the server is listed
    // during its think, then the step's call is checked against what it began with.
    let world = ListedMidStep {
        catalog: &catalog,
        listed: catalog.listed(),
    };
    let first = result_of(&world, "run_a");
    assert!(
        matches!(&first, ToolResult::Error { error } if error.contains("unknown tool `calc__ping`")),
        "{first:?}"
    );
    assert_eq!(server.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The next step takes the listing as it now is.
    let world = ListedMidStep {
        catalog: &catalog,
        listed: catalog.listed(),
    };
    let next = result_of(&world, "run_b");
    assert_eq!(
        next,
        ToolResult::Success {
            output: json!("pong")
        }
    );
}

/// What a step of the loop reads is its batch, however long the run: after twelve tool
/// iterations, the answer to the question the run waits on needs the entries from the
/// question's reply on (every step of the loop is also checked to decide alike on its
/// window and on the whole timeline: `Sim::deliver`). A follow-up reads the whole timeline.
#[test]
fn a_steps_window_is_its_batch_whatever_the_runs_length() {
    let mut s = Sim::new();
    let mut replies: Vec<LlmReply> = (0..12)
        .map(|i| calls(vec![call("echo", json!({"text": format!("{i}")}))]))
        .collect();
    replies.push(feedback(json!({"kind": "text", "prompt": "Name?"})));
    replies.push(text("thanks"));
    s.script("asker", replies);
    let id = s.create("asker", "ask");
    s.run_all();
    let run = s.run(&id).clone();
    assert_eq!(run.status, RunStatus::Waiting);
    let timeline = s.runs[&id].1.clone();
    assert!(timeline.len() > 25, "{} entries", timeline.len());
    let cta_id = s.ctas.keys().next().unwrap().clone();
    let answer = Input::CtaAnswered {
        cta_id,
        response: CtaResponse::Text { text: "Ada".into() },
        responder: None,
    };
    let from = super::window_start(&run, &answer);
    assert!(
        matches!(
            timeline[from as usize - 1].body,
            EntryBody::Assistant { .. }
        ),
        "the window starts after the last reply"
    );
    assert_eq!(timeline.len() as u64 - from, 1, "the question's call alone");
    let follow_up = Input::UserMessage {
        text: "again".into(),
        message_id: "m1".into(),
        reply_to: None,
        options: Default::default(),
    };
    assert_eq!(super::window_start(&run, &follow_up), 0);
}
