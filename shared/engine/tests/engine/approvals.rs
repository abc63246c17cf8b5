//! Tools gated on a human's approval: when they run, and the calls beside them.

use super::*;

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
        let mut s = sim();
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
                raise_usd: None,
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

#[test]
fn an_approval_carries_its_reason_tool_and_input_and_independent_calls_run_at_once() {
    let mut s = sim();
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
    s.answer(&cta.cta_id, CtaResponse::approval(true));
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}

#[test]
fn deferred_calls_wait_for_every_approval_of_the_reply() {
    let mut s = sim();
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
    s.answer(&ctas[0].cta_id, CtaResponse::approval(true));
    s.run_all();
    // One approval settled, one still waits: the safe call still waits with it.
    assert_eq!(s.executed, vec!["call_0_0"]);
    assert_eq!(
        s.tools(&id)[2].result,
        ToolResult::Pending {
            reason: DEFERRED.into()
        }
    );
    s.answer(&ctas[1].cta_id, CtaResponse::approval(true));
    s.run_all();
    assert_eq!(s.executed, vec!["call_0_0", "call_0_1", "call_0_2"]);
    assert_eq!(s.run(&id).status, RunStatus::Completed);
}
