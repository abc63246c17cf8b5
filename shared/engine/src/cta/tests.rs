//! The CTA record's rules: requests checked, changes applied, rounds and claims bounded.

use super::*;
use serde_json::json;

fn choice() -> CtaRequest {
    CtaRequest::Choice {
        prompt: "Pick".into(),
        options: vec![
            ChoiceOption {
                id: "a".into(),
                label: "A".into(),
                description: None,
            },
            ChoiceOption {
                id: "b".into(),
                label: "B".into(),
                description: None,
            },
        ],
    }
}

#[test]
fn a_raise_answers_a_budget_question_only() {
    let raise = CtaResponse::from_json(json!({"kind": "approval", "approved": true,
        "raiseUsd": 5}))
    .expect("an answer");
    assert_eq!(raise.check_raise(true), Ok(()));
    let err = raise.check_raise(false).expect_err("not a budget question");
    assert!(err.contains("budget question only"), "{err}");
    let plain =
        CtaResponse::from_json(json!({"kind": "approval", "approved": true})).expect("an answer");
    assert_eq!(plain.check_raise(false), Ok(()));
    // Past a million dollars, a raise is no answer at all.
    let err = CtaResponse::from_json(json!({"kind": "approval", "approved": true,
        "raiseUsd": 1.7e308}))
    .expect_err("too large");
    assert!(err.to_string().contains("to 1000000"), "{err}");
}

#[test]
fn requests_and_responses_are_tagged_on_kind() {
    let r: CtaRequest = serde_json::from_value(json!({"kind": "text", "prompt": "Name?"}))
        .expect("valid text request");
    assert_eq!(
        r,
        CtaRequest::Text {
            prompt: "Name?".into(),
            placeholder: None,
            required: false,
        }
    );
    let a: CtaResponse =
        serde_json::from_value(json!({"kind": "choice", "selectedId": "b"})).expect("valid");
    assert_eq!(
        a,
        CtaResponse::Choice {
            selected_id: "b".into()
        }
    );
    // A field of another kind is refused, not ignored.
    assert!(
        serde_json::from_value::<CtaResponse>(json!({"kind": "text", "approved": true})).is_err()
    );
}

#[test]
fn a_response_must_answer_its_own_request() {
    let table: Vec<(CtaRequest, serde_json::Value, bool)> = vec![
        (choice(), json!({"kind": "choice", "selectedId": "a"}), true),
        (
            choice(),
            json!({"kind": "choice", "selectedId": "z"}),
            false,
        ),
        (choice(), json!({"kind": "text", "text": "a"}), false),
        (
            CtaRequest::Approval {
                message: "ok?".into(),
            },
            json!({"kind": "approval", "approved": false, "reason": "no"}),
            true,
        ),
        (
            CtaRequest::Approval {
                message: "ok?".into(),
            },
            json!({"kind": "choice", "selectedId": "a"}),
            false,
        ),
        (
            CtaRequest::Text {
                prompt: "?".into(),
                placeholder: None,
                required: false,
            },
            json!({"kind": "text", "text": ""}),
            true,
        ),
        (
            CtaRequest::Text {
                prompt: "?".into(),
                placeholder: None,
                required: false,
            },
            json!({"kind": "approval", "approved": true}),
            false,
        ),
        (
            CtaRequest::Text {
                prompt: "?".into(),
                placeholder: None,
                required: true,
            },
            json!({"kind": "text", "text": "  "}),
            false,
        ),
    ];
    for (req, resp, ok) in table {
        let resp: CtaResponse = serde_json::from_value(resp).expect("well-formed");
        assert_eq!(
            resp.validate_against(&req).is_ok(),
            ok,
            "{req:?} / {resp:?}"
        );
    }
}

#[test]
fn requests_are_checked_beyond_their_schema() {
    let dup = CtaRequest::Choice {
        prompt: "p".into(),
        options: vec![
            ChoiceOption {
                id: "a".into(),
                label: "A".into(),
                description: None,
            },
            ChoiceOption {
                id: "a".into(),
                label: "B".into(),
                description: None,
            },
        ],
    };
    assert!(dup.validate().is_err());
    assert!(
        CtaRequest::Choice {
            prompt: "p".into(),
            options: vec![]
        }
        .validate()
        .is_err()
    );
    assert!(
        CtaRequest::Approval {
            message: " ".into()
        }
        .validate()
        .is_err()
    );
    assert!(choice().validate().is_ok());
}

#[test]
fn a_cta_serializes_flat_with_its_request_fields() {
    let now = Utc::now();
    let cta = Cta {
        cta_id: "c1".into(),
        run_id: "r1".into(),
        root_run_id: None,
        agent: None,
        run_prompt: None,
        tool_call_id: "t1".into(),
        owner: "o".into(),
        request: choice(),
        default: None,
        status: CtaStatus::Pending,
        response: None,
        gate: false,
        gated: None,
        budget: None,
        created_at: now,
        expires_at: now,
        resolved_at: None,
        defaulted: false,
        responder: None,
        link_nonce: None,
        assignees: Vec::new(),
        required: 1,
        approvals: Vec::new(),
        audit: Vec::new(),
        notify: Vec::new(),
        remind_after_seconds: None,
        escalate_after_seconds: None,
        escalate_to: Vec::new(),
        deliveries: Vec::new(),
        rev: 0,
    };
    let v = serde_json::to_value(&cta).expect("serializes");
    assert_eq!(v["kind"], "choice");
    assert_eq!(v["options"][1]["id"], "b");
    assert_eq!(v["ctaId"], "c1");
    let back: Cta = serde_json::from_value(v).expect("round-trips");
    assert_eq!(back, cta);
    // A text question's `required` and an approval's approvers needed are two fields.
    let mut text = cta.clone();
    text.request = CtaRequest::Text {
        prompt: "Why?".into(),
        placeholder: None,
        required: true,
    };
    text.required = 2;
    text.assignees = vec!["group:ops".into()];
    text.rev = 3;
    let v = serde_json::to_value(&text).expect("serializes");
    assert_eq!(
        (v["required"].clone(), v["requiredApprovals"].clone()),
        (json!(true), json!(2))
    );
    let back: Cta = serde_json::from_value(v).expect("round-trips");
    assert_eq!(back, text);
}

fn approval_for_two() -> Cta {
    let now = Utc::now();
    let v = json!({"ctaId": "c1", "runId": "r1", "toolCallId": "t1", "owner": "o",
        "kind": "approval", "message": "Ship?", "status": "pending", "createdAt": now,
        "expiresAt": now, "assignees": ["group:ops", "user:carol"], "requiredApprovals": 2});
    serde_json::from_value(v).expect("a CTA")
}

#[test]
fn two_approvers_settle_an_approval_and_one_counts_once() {
    let at = Utc::now();
    let mut cta = approval_for_two();
    let alice = CtaChange::Approve {
        by: "alice".into(),
        via: Via::Api,
    };
    assert_eq!(cta.apply(&alice, at), Applied::Changed { settled: false });
    assert_eq!(
        cta.apply(&alice, at),
        Applied::Unchanged,
        "alice counts once"
    );
    assert_eq!((cta.status, cta.rev), (CtaStatus::Pending, 1));
    let carol = CtaChange::Approve {
        by: "carol".into(),
        via: Via::Link,
    };
    assert_eq!(cta.apply(&carol, at), Applied::Changed { settled: true });
    assert_eq!(cta.status, CtaStatus::Answered);
    assert_eq!(cta.response, Some(CtaResponse::approval(true)));
    assert_eq!(cta.responder.as_deref(), Some("carol"));
    let kinds: Vec<&str> = cta.audit.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["approved", "approved", "answered"]);
    // Settled: no approval, no settlement applies; an event of its history still does.
    let bob = CtaChange::Approve {
        by: "bob".into(),
        via: Via::Api,
    };
    assert_eq!(cta.apply(&bob, at), Applied::Refused);
    assert_eq!(
        cta.apply(&CtaChange::Settle(Settlement::Expired), at),
        Applied::Refused
    );
    let noted = CtaChange::Record(AuditEvent::new("notified", at));
    assert_eq!(cta.apply(&noted, at), Applied::Changed { settled: false });
    assert_eq!(cta.rev, 3);
}

#[test]
fn a_round_keeps_only_what_is_still_owed() {
    let at = Utc::now();
    let mut cta = approval_for_two();
    cta.notify = vec!["hook".into()];
    for n in 1..=100 {
        let round = format!("reminder-{n}");
        let change = CtaChange::Round {
            event: AuditEvent::new("reminded", at),
            assignees: Vec::new(),
            deliveries: cta.round(&round, &cta.recipients()),
        };
        assert_eq!(cta.apply(&change, at), Applied::Changed { settled: false });
        let tried = cta
            .deliveries
            .iter()
            .map(|d| Tried {
                id: d.id.clone(),
                ok: true,
                outcome: "delivered (204)".into(),
            })
            .collect();
        cta.apply(&CtaChange::Tried(tried), at);
    }
    // Two recipients, one channel: the last round's two, not a hundred rounds' worth.
    assert_eq!(cta.deliveries.len(), 2, "{:?}", cta.deliveries);
    assert!(cta.deliveries.iter().all(|d| d.round == "reminder-100"));
}

#[test]
fn a_claim_takes_at_most_sixteen_deliveries_and_the_next_the_rest() {
    let at = Utc::now();
    let mut cta = approval_for_two();
    let people: Vec<String> = (0..10).map(|i| format!("user:u{i}")).collect();
    cta.notify = vec!["hook".into(), "mail".into()];
    let change = CtaChange::Round {
        event: AuditEvent::new("asked", at),
        assignees: Vec::new(),
        deliveries: cta.round("asked", &people),
    };
    cta.apply(&change, at);
    assert_eq!(cta.deliveries.len(), 20);
    let lease = |token: &str| {
        CtaChange::Claim(Lease {
            token: token.into(),
            until: at + chrono::Duration::seconds(60),
        })
    };
    let held = |cta: &Cta, token: &str| {
        cta.deliveries
            .iter()
            .filter(|d| d.lease.as_ref().is_some_and(|l| l.token == token))
            .count()
    };
    assert_eq!(
        cta.apply(&lease("a"), at),
        Applied::Changed { settled: false }
    );
    assert_eq!(held(&cta, "a"), MAX_CLAIMED);
    assert!(
        cta.deliveries.iter().any(|d| d.owed(at)),
        "the rest are owed"
    );
    assert_eq!(
        cta.apply(&lease("b"), at),
        Applied::Changed { settled: false }
    );
    assert_eq!(held(&cta, "b"), 20 - MAX_CLAIMED);
    assert_eq!(
        cta.apply(&lease("c"), at),
        Applied::Unchanged,
        "nothing left"
    );
}

#[test]
fn the_first_rejection_settles_and_the_history_is_bounded() {
    let at = Utc::now();
    let mut cta = approval_for_two();
    let reject = CtaChange::Settle(Settlement::Answered {
        response: CtaResponse::Approval {
            approved: false,
            reason: Some("no".into()),
            raise_usd: None,
        },
        responder: Some("alice".into()),
        via: Some(Via::Console),
    });
    assert_eq!(cta.apply(&reject, at), Applied::Changed { settled: true });
    let last = cta.audit.last().expect("an event");
    assert_eq!(
        (
            last.kind.as_str(),
            last.outcome.as_deref(),
            last.detail.as_deref(),
            last.via
        ),
        ("answered", Some("rejected"), Some("no"), Some(Via::Console))
    );
    cta.audit.insert(0, AuditEvent::new("created", at));
    for _ in 0..MAX_AUDIT + 10 {
        cta.record(AuditEvent::new("link_opened", at));
    }
    assert_eq!(cta.audit.len(), MAX_AUDIT);
    assert_eq!(cta.audit[0].kind, "created", "the first event is kept");
}

#[test]
fn assignees_name_users_and_groups_and_required_fits_them() {
    assert!(names("user:alice", "alice", &[]));
    assert!(names("user:alice", "https://idp#alice", &[]));
    assert!(!names("user:alice", "https://idp#alicia", &[]));
    assert!(names("group:ops", "bob", &["ops".into()]));
    assert!(!names("group:ops", "ops", &[]));
    assert!(!names("ops", "ops", &["ops".into()]));
    assert!(check_assignment(&["user:a".into(), "group:g".into()], 5).is_ok());
    let err = check_assignment(&["user:a".into(), "user:b".into()], 3).expect_err("3 > 2");
    assert!(err.contains("more than the 2"), "{err}");
    assert!(
        check_assignment(&[], 2).is_err(),
        "the owner alone is one person"
    );
    assert!(check_assignment(&["team:x".into()], 1).is_err());
    assert!(check_assignment(&["user: ".into()], 1).is_err());
    assert!(check_assignment(&["user:a".into()], 0).is_err());
}
