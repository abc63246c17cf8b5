//! Questions to a human (CTAs): each kind, answers, expiry, sizes.

use super::*;

#[test]
fn each_cta_kind_parks_the_run_and_resumes_with_the_answer() {
    let choice = json!({"kind": "choice", "prompt": "Which?", "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]});
    let table = [
        (
            json!({"kind": "approval", "message": "Proceed?"}),
            CtaResponse::approval(true),
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
        let mut s = sim();
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
        assert!(s.effects.contains(&Effect::Timer {
            timer_id: cta.cta_id.clone(),
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
        assert!(s.effects.contains(&Effect::CancelTimer {
            timer_id: cta.cta_id.clone()
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
            CtaResponse::approval(true),
        ),
        (
            json!({"kind": "approval", "message": "?"}),
            CtaResponse::Choice {
                selected_id: "a".into(),
            },
        ),
    ];
    for (request, response) in table {
        let mut s = sim();
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
    let mut s = sim();
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

#[test]
fn expiry_ends_the_run_by_default_and_cancels_the_rest() {
    let mut s = sim();
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
    assert_eq!(run.outcome.error.as_ref().unwrap().code, "cta_expired");
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
                response: CtaResponse::approval(true),
                responder: None,
            }
        ),
        Outcome::Ignored
    );
}

#[test]
fn a_run_may_opt_to_continue_past_an_expiry() {
    let mut s = sim();
    s.script(
        "asker",
        vec![
            feedback(json!({"kind": "text", "prompt": "?"})),
            text("carried on"),
        ],
    );
    let id = s.create("asker", "ask");
    s.runs.get_mut(&id).unwrap().0.origin.on_expiry = ExpiryPolicy::Continue;
    s.run_all();
    let cta = s.pending_ctas(&id)[0].cta_id.clone();
    s.send(&id, Input::CtaExpired { cta_id: cta });
    s.run_all();
    assert!(
        matches!(&s.tools(&id)[0].result, ToolResult::Error { error } if error.contains("expired"))
    );
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    assert_eq!(s.run(&id).outcome.result.as_deref(), Some("carried on"));
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
        let mut s = sim();
        s.script(agent, vec![calls(vec![c.clone()])]);
        let id = s.create(agent, "go");
        s.run_all();
        let ctas = s.pending_ctas(&id);
        assert_eq!(ctas.len(), 1, "{agent} {c:?}");
        let want = t0() + chrono::Duration::seconds(seconds);
        assert_eq!(ctas[0].expires_at, want, "{agent} {c:?}");
        let scheduled = s.effects.iter().any(
            |e| matches!(e, Effect::Timer { timer_id: cta_id, at, .. } if *cta_id == ctas[0].cta_id && *at == want),
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
    let mut s = sim();
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
    let mut s = sim();
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
    assert!(matches!(&before_usage(timeline).body,
        EntryBody::Assistant { text: Some(t), .. } if t.len() == long.len()));
    assert!(run.outcome.result_truncated);
    assert_eq!(run.outcome.result_seq, Some(timeline.len() as u64 - 2));
    assert_eq!(run.outcome.result.as_ref().unwrap().len(), PREVIEW_BYTES);
    // So does the event.
    let done = s
        .events("run.completed")
        .into_iter()
        .find(|e| e.detail["runId"] == child.as_str())
        .unwrap();
    assert_eq!(done.detail["text"].as_str().unwrap().len(), PREVIEW_BYTES);
    assert_eq!(done.detail["textTruncated"], true);
    assert_eq!(done.detail["resultSeq"], json!(run.outcome.result_seq));
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
    let mut s = sim();
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
fn under_on_expiry_default_a_question_expires_into_its_default_and_the_run_goes_on() {
    let choice = json!({"kind": "choice", "prompt": "Which?",
        "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]});
    // (the question, its default as the model gives it, the answer it becomes)
    let table = [
        (
            json!({"kind": "approval", "message": "Deploy?"}),
            json!({"approved": false, "reason": "nobody said yes"}),
            CtaResponse::Approval {
                raise_usd: None,
                approved: false,
                reason: Some("nobody said yes".into()),
            },
        ),
        (
            json!({"kind": "text", "prompt": "Name?"}),
            json!({"kind": "text", "text": "Ada"}),
            CtaResponse::Text { text: "Ada".into() },
        ),
        (
            choice,
            json!({"selectedId": "b"}),
            CtaResponse::Choice {
                selected_id: "b".into(),
            },
        ),
    ];
    for (question, default, answer) in table {
        let mut asked = question.clone();
        asked["default"] = default;
        let mut s = sim();
        s.script("asker", vec![feedback(asked), text("went on")]);
        let id = s.create("asker", "ask");
        s.runs.get_mut(&id).unwrap().0.origin.on_expiry = ExpiryPolicy::Default;
        s.run_all();
        let cta = s.pending_ctas(&id).remove(0);
        // The question carries its default: stored, and in its request event.
        assert_eq!(cta.default.as_ref(), Some(&answer), "{question}");
        let asked = &s.events("cta.request")[0];
        assert_eq!(asked.detail["default"], json!(answer));

        s.ctas.get_mut(&cta.cta_id).unwrap().status = CtaStatus::Expired;
        s.send(
            &id,
            Input::CtaExpired {
                cta_id: cta.cta_id.clone(),
            },
        );
        s.run_all();
        let run = s.run(&id);
        assert_eq!(run.status, RunStatus::Completed, "{question}");
        assert_eq!(run.outcome.result.as_deref(), Some("went on"));
        let tool = &s.tools(&id)[0];
        // The model was given the default, saying it is one.
        let ToolResult::Success { output } = &tool.result else {
            panic!("{question}: {:?}", tool.result);
        };
        assert_eq!(output["default"], true);
        assert_eq!(output["kind"], question["kind"]);
        assert!(output["note"].as_str().unwrap().contains("expired"));
        // The timeline keeps it as the answer, given at expiry.
        let snap = tool.cta.as_ref().unwrap();
        assert_eq!(snap.status, CtaStatus::Expired);
        assert!(snap.defaulted);
        assert_eq!(snap.response.as_ref(), Some(&answer));
        // The bus is told which default was applied.
        let told = s.events("cta.defaulted");
        assert_eq!(told.len(), 1, "{question}");
        assert_eq!(told[0].detail["ctaId"], cta.cta_id.as_str());
        assert_eq!(told[0].detail["default"], json!(answer));
        assert!(s.effects.contains(&Effect::CancelTimer {
            timer_id: cta.cta_id.clone()
        }));
    }
}

#[test]
fn a_default_applies_only_under_on_expiry_default_and_only_to_a_question_that_has_one() {
    // (the run's policy, the question, how the run ends)
    let with = json!({"kind": "text", "prompt": "Name?", "default": {"text": "Ada"}});
    let without = json!({"kind": "text", "prompt": "Name?"});
    let table = [
        (ExpiryPolicy::End, with.clone(), RunStatus::Expired),
        (ExpiryPolicy::Default, without, RunStatus::Expired),
        (ExpiryPolicy::Continue, with, RunStatus::Completed),
    ];
    for (policy, question, ends) in table {
        let mut s = sim();
        s.script("asker", vec![feedback(question.clone()), text("went on")]);
        let id = s.create("asker", "ask");
        s.runs.get_mut(&id).unwrap().0.origin.on_expiry = policy;
        s.run_all();
        let cta = s.pending_ctas(&id).remove(0);
        // A default that will never be given is not shown as the question's.
        if policy != ExpiryPolicy::Default {
            assert_eq!(cta.default, None, "{policy:?}");
        }
        s.ctas.get_mut(&cta.cta_id).unwrap().status = CtaStatus::Expired;
        s.send(&id, Input::CtaExpired { cta_id: cta.cta_id });
        s.run_all();
        assert_eq!(s.run(&id).status, ends, "{policy:?} {question}");
        let tool = &s.tools(&id)[0];
        assert!(
            matches!(&tool.result, ToolResult::Error { error } if error.contains("expired")),
            "{policy:?} {question}: {:?}",
            tool.result
        );
        assert!(!tool.cta.as_ref().unwrap().defaulted);
        assert!(s.events("cta.defaulted").is_empty());
    }

    // A tool call's approval has no default: under `default` its expiry ends the run.
    let mut s = sim();
    s.script(
        "quick",
        vec![calls(vec![call("echo", json!({"text": "gated"}))])],
    );
    let id = s.create("quick", "go");
    s.runs.get_mut(&id).unwrap().0.origin.on_expiry = ExpiryPolicy::Default;
    s.run_all();
    let cta = s.pending_ctas(&id).remove(0);
    assert!(cta.gate);
    s.ctas.get_mut(&cta.cta_id).unwrap().status = CtaStatus::Expired;
    s.send(&id, Input::CtaExpired { cta_id: cta.cta_id });
    assert_eq!(s.run(&id).status, RunStatus::Expired);
}

#[test]
fn a_default_that_does_not_answer_its_question_is_refused_to_the_model() {
    let options = json!([{"id": "a", "label": "A"}]);
    let table = [
        (
            json!({"kind": "choice", "prompt": "p", "options": options, "default": {"selectedId": "z"}}),
            "not one of the options",
        ),
        (
            json!({"kind": "text", "prompt": "p", "required": true, "default": {"text": " "}}),
            "blank",
        ),
    ];
    for (question, why) in table {
        let mut s = sim();
        s.script("asker", vec![feedback(question.clone()), text("ok")]);
        let id = s.create("asker", "ask");
        s.run_all();
        assert!(s.pending_ctas(&id).is_empty(), "{question}");
        let tool = &s.tools(&id)[0];
        assert!(
            matches!(&tool.result, ToolResult::Error { error }
                if error.contains("`default`") && error.contains(why)),
            "{question}: {:?}",
            tool.result
        );
    }
}

#[test]
fn an_expiry_delivered_again_after_its_default_was_taken_changes_nothing() {
    // The run takes the first question's default, then asks a second; the first's expiry
    // comes again (a redelivery, the sweep): the second question stays open.
    let mut s = sim();
    s.script(
        "asker",
        vec![
            feedback(json!({"kind": "text", "prompt": "a?", "default": {"text": "x"}})),
            feedback(json!({"kind": "text", "prompt": "b?"})),
            text("done"),
        ],
    );
    let id = s.create("asker", "ask");
    s.runs.get_mut(&id).unwrap().0.origin.on_expiry = ExpiryPolicy::Default;
    s.run_all();
    let first = s.pending_ctas(&id).remove(0).cta_id;
    s.ctas.get_mut(&first).unwrap().status = CtaStatus::Expired;
    let expired = Input::CtaExpired {
        cta_id: first.clone(),
    };
    s.send(&id, expired.clone());
    s.run_all();
    let second = s.pending_ctas(&id);
    assert_eq!(second.len(), 1, "the second question is asked");
    s.settle_asked.clear();
    assert_eq!(s.send(&id, expired), Outcome::Ignored);
    assert!(s.settle_asked.is_empty(), "{:?}", s.settle_asked);
    assert_eq!(s.run(&id).status, RunStatus::Waiting);
    assert_eq!(s.ctas[&second[0].cta_id].status, CtaStatus::Pending);
}
