//! A reply paid once, a call run once: a reply is committed with its calls before any of
//! them runs, and each call runs as its effects say (`echo`: none, `book`: idempotent,
//! `pay`: once). A process that dies between two commits (`Sim::deliver_cut`) never has the
//! model asked again for a committed reply, and never runs a `once` call twice.

use super::*;

fn pay(text: &str) -> ToolCall {
    call("pay", json!({"text": text}))
}

fn book(text: &str) -> ToolCall {
    call("book", json!({"text": text}))
}

fn results(s: &Sim, id: &str) -> Vec<ToolResult> {
    s.tools(id).into_iter().map(|t| t.result).collect()
}

fn ok(text: &str) -> ToolResult {
    ToolResult::Success {
        output: json!({"text": text}),
    }
}

#[test]
fn a_loop_of_calls_that_change_nothing_commits_once_an_iteration() {
    // Given three replies, two of them calling `echo`,
    let mut s = sim();
    s.script(
        "payer",
        vec![
            calls(vec![call("echo", json!({"text": "a"}))]),
            calls(vec![call("echo", json!({"text": "b"}))]),
            text("done"),
        ],
    );
    let id = s.create("payer", "go");
    s.run_all();
    // then each reply commits once, with the outputs of the calls before it: no checkpoint.
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!((s.commits, s.checkpoints), (3, 0));
    assert_eq!(s.asked, [0, 1, 2]);
    assert_eq!(s.executed.len(), 2);
    let echoes = s.tools(&id);
    assert!(echoes.iter().all(|t| t.effects == Some(Effects::None)));
    assert!(echoes.iter().all(|t| !t.result.is_pending()));
}

#[test]
fn a_reply_is_committed_with_its_calls_before_one_with_effects_runs() {
    let mut s = sim();
    s.script(
        "payer",
        vec![calls(vec![book("table"), pay("deposit")]), text("booked")],
    );
    let id = s.create("payer", "go");
    let start = s.queue.pop_front().unwrap();
    // Given the process dies right after its first commit,
    assert_eq!(s.deliver_cut(&start, 1), Outcome::Crashed);
    // then that commit held the reply and its calls, due, the first `once` one not marked
    // (an `idempotent` call runs before it),
    let (run, timeline) = s.runs[&id].clone();
    assert_eq!(run.counters.thinks, 1, "the think is committed");
    assert!(matches!(timeline[1].body, EntryBody::Assistant { .. }));
    let due: Vec<ToolEntry> = s.tools(&id);
    assert!(due.iter().all(ToolEntry::is_due), "{due:?}");
    assert_eq!(due[0].effects, Some(Effects::Idempotent));
    assert_eq!((due[1].effects, due[1].started), (Some(Effects::Once), 0));
    // and the reply's cost is counted once, with it.
    let cost = run.spend.usage;
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.asked, [0, 1], "the model is asked once per reply");
    assert_eq!(results(&s, &id), [ok("table"), ok("deposit")]);
    assert_eq!(
        s.run(&id).spend.usage.total_tokens,
        cost.total_tokens + text("").usage.total_tokens
    );
}

/// The first delivery of a reply `[book, pay]` commits three times: the reply; `book`'s
/// output with `pay` marked started; `pay`'s output with the next think's message. A
/// process that dies before each of those commits, then restarts:
#[test]
fn a_crash_between_any_two_commits_asks_no_reply_again_and_runs_no_once_call_twice() {
    // (commits made before the crash, book's runs, pay's runs, pay's result)
    let unknown = |r: &ToolResult| matches!(r, ToolResult::Error { error } if error.starts_with("outcome_unknown: `pay` was started"));
    let paid = |r: &ToolResult| *r == ok("deposit");
    type Check = fn(&ToolResult) -> bool;
    let table: [(usize, usize, usize, Check); 4] = [
        // The reply is lost with its process: asked again (one reply, one cost).
        (0, 1, 1, paid),
        // `book` ran, its output lost: it runs again, under its key; `pay` was never marked.
        (1, 2, 1, paid),
        // `pay` was marked and ran, its output lost: not run again, the model is told.
        (2, 1, 1, unknown),
        // Done: the redelivery is stale.
        (3, 1, 1, paid),
    ];
    for (cut, books, pays, pay_result) in table {
        let mut s = sim();
        s.script(
            "payer",
            vec![calls(vec![book("table"), pay("deposit")]), text("ok")],
        );
        let id = s.create("payer", "go");
        let start = s.queue.pop_front().unwrap();
        s.deliver_cut(&start, cut);
        if cut == 3 {
            // Its process died before the message was deleted.
            s.queue.push_front(start.clone());
        }
        s.run_all();
        assert_eq!(s.run(&id).status, RunStatus::Completed, "cut {cut}");
        // The model was asked for each reply once, whatever the cut (the first think only
        // ran again when its reply was never committed).
        let firsts = if cut == 0 { 2 } else { 1 };
        assert_eq!(
            s.asked.iter().filter(|&&i| i == 0).count(),
            firsts,
            "cut {cut}"
        );
        assert_eq!(s.run(&id).counters.thinks, 2, "cut {cut}: two replies");
        let ran = |name: &str| {
            s.executed
                .iter()
                .zip(&s.keys)
                .filter(|(call, _)| {
                    s.tools(&id)
                        .iter()
                        .any(|t| &t.id == *call && t.name == name)
                })
                .map(|(_, key)| key.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ran("book").len(), books, "cut {cut}: book");
        assert_eq!(ran("pay").len(), pays, "cut {cut}: pay");
        // Every run of a call is under the one key of the committed call.
        let keys: std::collections::BTreeSet<_> = ran("book").into_iter().collect();
        assert_eq!(keys.len(), 1, "cut {cut}");
        let r = results(&s, &id);
        assert_eq!(r[0], ok("table"), "cut {cut}");
        assert!(pay_result(&r[1]), "cut {cut}: {:?}", r[1]);
    }
}

#[test]
fn a_once_call_cut_off_is_asked_about_when_its_agent_says_so() {
    for approved in [true, false] {
        let mut s = sim();
        s.script(
            "careful_payer",
            vec![calls(vec![pay("deposit")]), text("ok")],
        );
        let id = s.create("careful_payer", "go");
        let start = s.queue.pop_front().unwrap();
        // Given `pay` ran and its process died before its output was committed,
        s.deliver_cut(&start, 1);
        assert_eq!(s.executed.len(), 1);
        s.run_all();
        // then it is not run again: a person is asked, shown the call and its input,
        assert_eq!(s.executed.len(), 1);
        assert_eq!(s.run(&id).status, RunStatus::Waiting);
        let ctas = s.pending_ctas(&id);
        assert_eq!(ctas.len(), 1);
        assert!(ctas[0].gate);
        let CtaRequest::Approval { message } = &ctas[0].request else {
            panic!("an approval")
        };
        assert!(
            message.contains("may or may not have taken effect"),
            "{message}"
        );
        assert!(message.contains("deposit"), "{message}");
        let gated = ctas[0].gated.as_ref().expect("the call it gates");
        assert_eq!(gated.tool, "pay");
        // and their answer decides.
        s.answer(
            &ctas[0].cta_id,
            CtaResponse::Approval {
                approved,
                reason: None,
                raise_usd: None,
            },
        );
        s.run_all();
        assert_eq!(s.run(&id).status, RunStatus::Completed);
        assert_eq!(s.asked, [0, 1], "the model is asked once per reply");
        let pay = &s.tools(&id)[0];
        if approved {
            // Run again under the same key, marked started again first.
            assert_eq!(s.executed.len(), 2);
            assert_eq!(s.keys[0], s.keys[1]);
            assert_eq!(pay.result, ok("deposit"));
            assert_eq!(pay.started, 1);
        } else {
            assert_eq!(s.executed.len(), 1);
            assert!(
                matches!(&pay.result, ToolResult::Error { error } if error.starts_with("outcome_unknown")),
                "{:?}",
                pay.result
            );
        }
    }
}

#[test]
fn calls_that_do_not_fit_the_invocation_are_deferred_without_their_reply() {
    // Given an invocation with no time for `book` (an `echo` before it runs),
    let mut s = sim();
    s.script(
        "payer",
        vec![
            calls(vec![call("echo", json!({"text": "x"})), book("table")]),
            text("ok"),
        ],
    );
    s.no_time_for = Some("book".into());
    let id = s.create("payer", "go");
    let start = s.queue.pop_front().unwrap();
    assert_eq!(s.deliver(&start), Outcome::Deferred);
    // then the reply and `echo`'s output are committed, `book` is left due,
    let tools = s.tools(&id);
    assert_eq!(tools[0].result, ToolResult::Success { output: json!("x") });
    assert!(tools[1].is_due());
    // and the next invocation runs it, without thinking or running `echo` again.
    s.no_time_for = None;
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.asked, [0, 1]);
    assert_eq!(s.executed.len(), 2);
    assert_eq!(results(&s, &id)[1], ok("table"));

    // A `once` call marked started for a run that did not fit is not taken for cut off.
    let mut s = sim();
    s.script("payer", vec![calls(vec![pay("deposit")]), text("ok")]);
    s.no_time_for = Some("pay".into());
    let id = s.create("payer", "go");
    let start = s.queue.pop_front().unwrap();
    assert_eq!(s.deliver(&start), Outcome::Deferred);
    assert_eq!(s.tools(&id)[0].started, 0, "its start never happened");
    s.no_time_for = None;
    s.run_all();
    assert_eq!(results(&s, &id), [ok("deposit")]);
    assert_eq!(
        (s.executed.len(), s.asked.as_slice()),
        (1, [0, 1].as_slice())
    );
}

#[test]
fn a_redelivered_message_leaves_calls_that_change_nothing_to_the_next_think() {
    let mut s = sim();
    s.script(
        "payer",
        vec![calls(vec![call("echo", json!({"text": "a"}))]), text("ok")],
    );
    let id = s.create("payer", "go");
    let start = s.queue.pop_front().unwrap();
    assert_eq!(s.deliver(&start), Outcome::Done);
    // The start again (a duplicate): its `continue` is on its way, and runs the call.
    assert_eq!(s.deliver(&start), Outcome::Ignored);
    assert!(s.executed.is_empty());
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.executed.len(), 1);
}

#[test]
fn a_reply_that_also_asks_a_person_waits_for_the_answer_once_its_calls_ran() {
    // Given a reply that asks a question beside a call of each kind,
    for first in [
        call("echo", json!({"text": "a"})),
        book("table"),
        pay("deposit"),
    ] {
        let name = first.name.clone();
        let mut s = sim();
        let ask = call(
            "request_human_feedback",
            json!({"kind": "approval", "message": "go on?"}),
        );
        s.script("asking_payer", vec![calls(vec![first, ask]), text("ok")]);
        let id = s.create("asking_payer", "go");
        s.run_all();
        // then the call runs, and the run waits for the answer without thinking again,
        assert_eq!(s.run(&id).status, RunStatus::Waiting, "{name}");
        assert_eq!(s.asked, [0], "{name}");
        assert_eq!(s.executed.len(), 1, "{name}");
        assert!(!s.tools(&id)[0].result.is_pending(), "{name}");
        // and thinks once it has it.
        let cta = s.pending_ctas(&id).remove(0);
        s.answer(&cta.cta_id, CtaResponse::approval(true));
        s.run_all();
        assert_eq!(s.run(&id).status, RunStatus::Completed, "{name}");
        assert_eq!(s.asked, [0, 1], "{name}");
    }
}
