//! The run's status table (`RunStatus::CHANGES`) against what the engine does. Every commit
//! of every test is checked against it (the engine asserts it, and so does the world's
//! commit); here every change it lists is made by some scenario, so that it lists no change
//! the engine never makes.

use super::*;

use std::collections::BTreeSet;

fn ask() -> LlmReply {
    feedback(json!({"kind": "approval", "message": "?"}))
}

fn echo() -> LlmReply {
    calls(vec![call("echo", json!({"text": "x"}))])
}

fn fail() -> Input {
    Input::Fail {
        code: "test".into(),
        message: "failed by the test".into(),
    }
}

fn cancel() -> Input {
    Input::Cancel {
        reason: "cancelled by the test".into(),
    }
}

/// A follow-up turn for `id`, then every message that follows it.
fn follow_up(s: &mut Sim, id: &str) {
    let msg = Input::UserMessage {
        text: "again".into(),
        message_id: format!("m{}", s.commits),
        reply_to: None,
        options: Default::default(),
    };
    s.send(id, msg);
    s.run_all();
}

/// Takes `id`'s first step alone (the start's delivery).
fn start(s: &mut Sim) {
    let first = s.queue.pop_front().expect("the start");
    s.deliver(&first);
}

/// Expires `id`'s pending question, as its timer does.
fn expire(s: &mut Sim, id: &str) {
    let cta = s.pending_ctas(id).remove(0);
    s.ctas.get_mut(&cta.cta_id).unwrap().status = CtaStatus::Expired;
    s.send(id, Input::CtaExpired { cta_id: cta.cta_id });
}

fn answer(s: &mut Sim, id: &str) {
    let cta = s.pending_ctas(id).remove(0);
    s.answer(&cta.cta_id, CtaResponse::approval(true));
    s.run_all();
}

#[test]
fn every_change_the_status_table_lists_is_one_the_engine_makes() {
    type Then = fn(&mut Sim, &str);
    let scenarios: Vec<(Vec<LlmReply>, Option<u32>, Then)> = vec![
        // queued → completed; completed → running → completed (a follow-up that calls).
        (vec![text("a"), echo(), text("b")], None, |s, id| {
            s.run_all();
            follow_up(s, id);
        }),
        // queued → waiting → running → completed; completed → waiting (a follow-up asks).
        (vec![ask(), echo(), text("a"), ask()], None, |s, id| {
            s.run_all();
            answer(s, id);
            follow_up(s, id);
        }),
        // waiting → completed; completed → failed (the follow-up's model fails for good).
        (vec![ask(), text("a")], Some(2), |s, id| {
            s.run_all();
            answer(s, id);
            follow_up(s, id);
        }),
        // queued → running → waiting → expired.
        (vec![echo(), ask()], None, |s, id| {
            s.run_all();
            expire(s, id);
        }),
        // queued → cancelled, queued → failed.
        (vec![text("a")], None, |s, id| {
            s.queue.clear();
            s.send(id, cancel());
        }),
        (vec![text("a")], None, |s, id| {
            s.queue.clear();
            s.send(id, fail());
        }),
        // running → cancelled, running → failed (the model fails for good), running →
        // completed.
        (vec![echo(), text("a")], None, |s, id| {
            start(s);
            s.send(id, cancel());
        }),
        (vec![echo()], Some(1), |s, _| s.run_all()),
        (vec![echo(), text("a")], None, |s, _| s.run_all()),
        // running → expired: the question of a reply that also calls expires before the
        // call has run (its delivery died after the reply's commit).
        (
            vec![
                calls(vec![
                    call(
                        "request_human_feedback",
                        json!({"kind": "approval", "message": "?"}),
                    ),
                    call("echo", json!({"text": "x"})),
                ]),
                text("a"),
            ],
            None,
            |s, id| {
                let first = s.queue.pop_front().expect("the start");
                s.deliver_cut(&first, 1);
                // The expiry comes before the start's redelivery.
                s.queue.clear();
                expire(s, id);
            },
        ),
        // waiting → cancelled, waiting → failed.
        (vec![ask()], None, |s, id| {
            s.run_all();
            s.send(id, cancel());
        }),
        (vec![ask()], None, |s, id| {
            s.run_all();
            s.send(id, fail());
        }),
    ];
    let mut seen = BTreeSet::new();
    for (replies, fails_at, then) in scenarios {
        let mut s = sim();
        s.script("asker", replies);
        if let Some(think) = fails_at {
            s.model_fails.insert("asker".into(), think);
        }
        let id = s.create("asker", "go");
        then(&mut s, &id);
        seen.extend(s.changes.iter().copied());
    }
    let listed: BTreeSet<(RunStatus, RunStatus)> = RunStatus::CHANGES.iter().copied().collect();
    let never: Vec<_> = listed.difference(&seen).collect();
    assert!(never.is_empty(), "listed, never made: {never:?}");
    assert!(seen.is_subset(&listed), "{seen:?}");
}
