//! Turns: follow-up messages, the queue of them, cancellation, ended runs.

use super::*;

#[test]
fn cancellation_cancels_ctas_and_children_once() {
    let mut s = sim();
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
    let limits = Limits::default();
    let explore = AgentDef::new("explore", "", &["request_human_feedback"], &limits);
    s.agents = Box::new(book(limits, vec![explore]));
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
    let mut s = sim();
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
        (run.status, run.counters.thinks, run.counters.turn_thinks),
        (RunStatus::Completed, 2, 1)
    );
    assert_eq!(run.outcome.result.as_deref(), Some("second"));
    let tl = &s.runs[&id].1;
    // Each turn ends with what it spent: its prompt's seq, its one reply's tokens.
    let usage = |e: &Entry| match &e.body {
        EntryBody::Usage {
            turn_seq, usage, ..
        } => Some((*turn_seq, usage.total_tokens)),
        _ => None,
    };
    assert_eq!(usage(&tl[2]), Some((0, 6)));
    assert!(matches!(&tl[3].body, EntryBody::User { text, .. } if text == "two"));
    assert_eq!(usage(&tl[5]), Some((3, 6)));
    assert_eq!(tl.len(), 6);
    // The same message again is a redelivery.
    assert_eq!(s.send(&id, msg), Outcome::Ignored);
}

#[test]
fn a_follow_up_that_reaches_a_cancelled_run_is_refused_there_and_the_run_stays_ended() {
    // The API refuses a follow-up to a run that ended for good; one it admitted just
    // before a cancel won the run's queue reaches a cancelled run: the writer refuses it.
    let mut s = sim();
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
    let before = s.run(&id).counters.thinks;
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
    assert_eq!(run.counters.thinks, before, "no model call");
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
        let mut s = sim();
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
                (run.status, run.counters.thinks),
                (RunStatus::Completed, 2),
                "{status:?}"
            );
        } else {
            assert_eq!(
                (run.status, run.counters.thinks),
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
    let mut s = sim();
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
    assert_eq!(run.waits.queued, vec![seq]);
    assert!(
        matches!(&tl[seq as usize].body, EntryBody::Queued { message_id, .. } if message_id == "m1")
    );
    // A redelivery queues nothing more.
    assert_eq!(s.send(&id, msg), Outcome::Ignored);
    assert_eq!(s.runs[&id].0.waits.queued.len(), 1);
}

#[test]
fn a_follow_up_between_a_tool_step_and_the_next_think_gets_its_own_turn() {
    // Given a run whose first step ran a tool and sent itself a continue,
    let mut s = sim();
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
    assert_eq!(s.run(&id).waits.queued.len(), 1);
    // then the continue still applies: the turn ends, and the follow-up gets its own turn.
    assert_eq!(s.deliver(&cont), Outcome::Done, "the continue is not stale");
    // A redelivery of the same continue is.
    assert_eq!(s.deliver(&cont), Outcome::Ignored);
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.outcome.result.as_deref(), Some("second turn done"));
    assert!(run.waits.queued.is_empty());
    assert_eq!(run.waits.continue_at, None);
    let users = s.runs[&id]
        .1
        .iter()
        .filter(|e| matches!(&e.body, EntryBody::User { message_id: Some(m), .. } if m == "m1"))
        .count();
    assert_eq!(users, 1, "one turn for the follow-up");
}

#[test]
fn a_turns_usage_counts_what_its_subagents_spent() {
    let mut s = sim();
    s.script(
        "orchestrator",
        vec![calls(vec![spawn("explore", "look")]), text("seen")],
    );
    s.script("explore", vec![text("found")]);
    let id = s.create("orchestrator", "go");
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    let tl = &s.runs[&id].1;
    let EntryBody::Usage {
        turn_seq,
        usage,
        cost_usd,
    } = &tl.last().unwrap().body
    else {
        panic!("{:?}", tl.last());
    };
    // The parent's two replies (the spawn's and the answer) and the subagent's one.
    let own: u64 = tl
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::Assistant { usage, .. } => Some(usage.total_tokens),
            _ => None,
        })
        .sum();
    let child = s.children(&id)[0].clone();
    let child_total = s.run(&child).total();
    assert_eq!(*turn_seq, 0);
    assert_eq!(usage.total_tokens, own + child_total.usage.total_tokens);
    assert!(child_total.usage.total_tokens > 0);
    let total = s.run(&id).total();
    assert!(
        (cost_usd - total.cost_usd).abs() < 1e-12,
        "{cost_usd} vs {total:?}"
    );
}

/// A run of `explore` that completed its first turn, and a follow-up for its next.
fn ended_run_and_follow_up() -> (Sim, String, Input) {
    let mut s = sim();
    s.script("explore", vec![text("first"), text("second")]);
    let id = s.create("explore", "one");
    s.run_all();
    let follow_up = Input::UserMessage {
        text: "two".into(),
        message_id: "m1".into(),
        reply_to: None,
        options: Default::default(),
    };
    (s, id, follow_up)
}

/// Decides `input` for run `id` as a host under `owner`'s quotas would.
fn decide_under(s: &Sim, id: &str, input: &Input, owner: OwnerQuotas) -> Decision {
    let (run, tl) = &s.runs[id];
    let mut io = Io {
        owner,
        ..Io::new(s.agents.book())
    };
    block_on(decide(s.now, run, tl, input, &s.world(run), &mut io)).expect("decides")
}

#[test]
fn the_owners_quotas_decide_what_each_commit_takes_and_spends() {
    let (s, id, follow_up) = ended_run_and_follow_up();
    // Under a limit, the follow-up that starts the ended run's next turn takes its slot in
    // that commit, up to the limit; its spending of the day is kept when an allowance is.
    let limited = OwnerQuotas {
        active_runs: Some(3),
        daily_spend: true,
    };
    let Decision::Commit(t) = decide_under(&s, &id, &follow_up, limited) else {
        panic!("a follow-up to an ended run commits its turn first");
    };
    assert!(t.take_slot && t.run.active_slot);
    assert_eq!((t.slot_limit, t.daily_spend), (Some(3), true));
    // With no limit no count is kept, and with no allowance no spending.
    let free = OwnerQuotas::default();
    let (Decision::Commit(t) | Decision::Checkpoint(t, _)) =
        decide_under(&s, &id, &follow_up, free)
    else {
        panic!("commits");
    };
    assert!(!t.take_slot && !t.run.active_slot);
    assert_eq!((t.slot_limit, t.daily_spend), (None, false));
}

#[test]
fn an_ignored_follow_up_frees_its_place_unless_the_first_still_waits() {
    let (mut s, id, follow_up) = ended_run_and_follow_up();
    assert_eq!(s.send(&id, follow_up.clone()), Outcome::Done);
    // Posted again once its turn ran (a client's retry, admitted again): ignored, and the
    // place it was admitted to is given back.
    let Decision::Ignore { effects, .. } =
        decide_under(&s, &id, &follow_up, OwnerQuotas::default())
    else {
        panic!("a redelivery is ignored");
    };
    assert_eq!(
        effects,
        vec![Effect::ReleaseFollowUps {
            run_id: id.clone(),
            message_ids: vec!["m1".into()],
        }]
    );

    // One that still waits in an active run's queue keeps its place: it is that one's.
    s.script(
        "asker",
        vec![feedback(json!({"kind": "text", "prompt": "?"}))],
    );
    let asker = s.create("asker", "ask");
    s.run_all();
    assert_eq!(s.send(&asker, follow_up.clone()), Outcome::Done);
    let Decision::Ignore { effects, .. } =
        decide_under(&s, &asker, &follow_up, OwnerQuotas::default())
    else {
        panic!("a redelivery is ignored");
    };
    assert_eq!(effects, vec![]);
}

#[test]
fn a_follow_ups_turn_whose_model_fails_for_good_fails_the_completed_run() {
    let (s, id, follow_up) = ended_run_and_follow_up();
    let (run, tl) = &s.runs[&id];
    assert_eq!(run.status, RunStatus::Completed);
    let io = Io {
        model_error: Some("the model refused".into()),
        ..Io::new(s.agents.book())
    };
    // One commit takes the run from `completed` to `failed` (the status table allows it:
    // the engine asserts every commit against it).
    let Step::Done(t) = step(s.now, run, tl, &follow_up, &io) else {
        panic!("the turn's failure commits");
    };
    assert_eq!(t.run.status, RunStatus::Failed);
    assert!(run.status.may_become(t.run.status));
    assert_eq!(t.run.outcome.error.as_ref().unwrap().code, "model_error");
    assert!(
        t.appended
            .iter()
            .any(|e| matches!(&e.body, EntryBody::User { text, .. } if text == "two")),
        "the follow-up is in the timeline before the error"
    );
}

/// A blank prompt, then a blank follow-up, are answered with the agent's clarifying reply
/// without the model (nothing is scripted for them: a model call would fail the run); a
/// follow-up with words goes to the model.
#[test]
fn a_blank_turn_is_answered_with_the_clarifying_reply_without_the_model() {
    let mut s = sim();
    let limits = Limits::default();
    let mut asker = AgentDef::new("asker", "", &[], &limits);
    asker.clarifying_reply = "Which release?".into();
    s.agents = Box::new(book(limits, vec![asker]));
    let id = s.create("asker", " \n\t ");
    s.run_all();
    let (run, timeline) = s.runs[&id].clone();
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.outcome.result.as_deref(), Some("Which release?"));
    assert_eq!(run.spend.usage.total_tokens, 0);
    let replies: Vec<&EntryBody> = timeline
        .iter()
        .map(|e| &e.body)
        .filter(|b| matches!(b, EntryBody::Assistant { .. }))
        .collect();
    assert!(
        matches!(replies[..], [EntryBody::Assistant { text: Some(t), model: None, .. }] if t == "Which release?"),
        "{replies:?}"
    );
    assert_eq!(s.events("run.completed").len(), 1);

    let follow_up = |text: &str, id: &str| Input::UserMessage {
        text: text.into(),
        message_id: id.into(),
        reply_to: None,
        options: Default::default(),
    };
    s.send(&id, follow_up("", "m1"));
    s.run_all();
    assert_eq!(s.run(&id).outcome.result.as_deref(), Some("Which release?"));
    s.script("asker", vec![text("v2, shipped.")]);
    s.send(&id, follow_up("Ship v2", "m2"));
    s.run_all();
    let run = s.run(&id);
    assert_eq!(
        (run.status, run.outcome.result.as_deref()),
        (RunStatus::Completed, Some("v2, shipped."))
    );
}
