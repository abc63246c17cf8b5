//! Replies cut at their output limit (`maxOutputTokens`): marked on their entry; a cut
//! text is no answer (the model is asked again), and a call being written is not run.

use super::*;

fn cut(reply: LlmReply) -> LlmReply {
    LlmReply {
        cut: Some("length".into()),
        ..reply
    }
}

#[test]
fn a_cut_text_is_marked_and_the_model_is_asked_again() {
    let mut s = sim();
    s.script(
        "worker",
        vec![cut(text("The answer is")), text("The answer is 42.")],
    );
    let id = s.create("worker", "what is it?");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.outcome.result.as_deref(), Some("The answer is 42."));
    assert_eq!(run.counters.thinks, 2);
    let timeline = &s.runs[&id].1;
    let EntryBody::Assistant {
        truncated,
        stop_reason,
        text,
        ..
    } = &timeline[1].body
    else {
        panic!("{:?}", timeline[1]);
    };
    assert!(*truncated);
    assert_eq!(stop_reason.as_deref(), Some("length"));
    assert_eq!(text.as_deref(), Some("The answer is"));
    // The model is told why it is asked again; a conversation view leaves that out.
    let EntryBody::User { text, options, .. } = &timeline[2].body else {
        panic!("{:?}", timeline[2]);
    };
    assert!(text.contains("cut off at its output limit"), "{text}");
    assert!(!options.visible);
    let chat = baton_engine::project::project("", timeline);
    assert!(serde_json::to_string(&chat).unwrap().contains("cut off"));
    // A whole reply is not marked.
    assert!(matches!(
        &timeline[3].body,
        EntryBody::Assistant {
            truncated: false,
            stop_reason: None,
            ..
        }
    ));
}

#[test]
fn a_call_the_cut_reply_was_writing_is_not_run() {
    let mut s = sim();
    s.script(
        "worker",
        vec![
            cut(calls(vec![
                call("echo", json!({"text": "whole"})),
                call("echo", json!({"text": "cut"})),
            ])),
            text("done"),
        ],
    );
    let id = s.create("worker", "go");
    s.run_all();
    assert_eq!(s.run(&id).status, RunStatus::Completed);
    let tools = s.tools(&id);
    assert!(matches!(&tools[0].result, ToolResult::Success { output } if output == "whole"));
    assert!(
        matches!(&tools[1].result, ToolResult::Error { error } if error.contains("cut off at its output limit")),
        "{:?}",
        tools[1].result
    );
    assert_eq!(s.executed.len(), 1, "only the whole call ran");
}

#[test]
fn a_reply_cut_every_time_ends_at_the_iteration_cap() {
    let mut s = sim();
    // `worker` may think 3 times a turn.
    s.script(
        "worker",
        vec![cut(text("a")), cut(text("b")), cut(text("c"))],
    );
    let id = s.create("worker", "go");
    s.run_all();
    let run = s.run(&id);
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.counters.thinks, 3);
    let result = run.outcome.result.as_deref().unwrap_or_default();
    assert!(result.starts_with("stopped after 3 iterations"), "{result}");
}
