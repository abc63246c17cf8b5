use serde_json::json;

use super::*;

fn agents(name: &str) -> bool {
    ["explore", "code"].contains(&name)
}

fn parse(v: Value) -> Result<Plan, String> {
    Plan::parse(&v, 12, agents)
}

#[test]
fn plans_parse_as_an_object_or_a_list_of_steps() {
    let steps = json!([
        {"id": "a", "agent": "explore", "prompt": "look", "result_key": "found"},
        {"id": "p", "parallel": [
            {"id": "b", "agent": "code", "prompt": "fix {{result.found}}"},
            {"id": "c", "agent": "explore", "with": {"x": "{{result.found.n}}"}}
        ], "merge": "first_success", "result_key": "fix"},
        {"id": "d", "agent": "code", "prompt": "{{result.fix}} {{bindings.ticket}}"}
    ]);
    let plan = parse(json!({"steps": steps})).expect("valid");
    assert_eq!(parse(steps).expect("valid"), plan);
    assert_eq!(plan.agent_steps().count(), 4);
    assert!(matches!(&plan.steps[1], Step::Parallel(p) if p.merge == Merge::FirstSuccess));
}

#[test]
fn invalid_plans_say_what_is_wrong_and_where() {
    let a = |id: &str| json!({"id": id, "agent": "explore", "prompt": "p"});
    let thirteen: Vec<Value> = (0..13).map(|i| a(&format!("s{i}"))).collect();
    let table = [
        (json!({"steps": []}), "at least one step"),
        (json!("do it"), "a plan is"),
        (json!({"steps": [a("x")], "extra": 1}), "a plan is"),
        (Value::Array(thirteen), "at most 12 agent steps"),
        (json!([a("x"), a("x")]), "`x` is used twice"),
        (
            json!([a("x"), {"id": "p", "parallel": [a("x")]}]),
            "`x` is used twice",
        ),
        (json!([a("bad id")]), "not valid"),
        (
            json!([{"id": "x", "agent": "planner", "prompt": "p"}]),
            "no agent `planner`",
        ),
        (
            json!([{"id": "x", "agent": "explore"}]),
            "give the agent a `prompt`",
        ),
        (
            json!([{"id": "x", "agent": "explore", "prompt": "p", "colour": 1}]),
            "step 1 (`x`): unknown field `colour`",
        ),
        (json!([{"id": "p", "parallel": []}]), "`parallel` is empty"),
        (
            json!([{"id": "p", "parallel": [a("y")], "merge": "vote"}]),
            "unknown variant `vote`",
        ),
        (
            json!([{"id": "x", "agent": "explore", "prompt": "{{result.later}}"}]),
            "names no result of an earlier step",
        ),
        (
            json!([{"id": "p", "parallel": [
                {"id": "a", "agent": "explore", "prompt": "p", "result_key": "k"},
                {"id": "b", "agent": "explore", "prompt": "{{result.k}}"}]}]),
            "names no result of an earlier step",
        ),
        (
            json!([{"id": "x", "agent": "explore", "prompt": "{{ open"}]),
            "without its `}}`",
        ),
        (
            json!([{"id": "x", "agent": "explore", "prompt": "{{env.HOME}}"}]),
            "is not a reference",
        ),
        (
            json!([
                {"id": "x", "agent": "explore", "prompt": "p", "result_key": "k"},
                {"id": "y", "agent": "explore", "prompt": "p", "result_key": "k"}]),
            "result_key `k` is used twice",
        ),
        (
            json!([{"id": "x", "agent": "explore", "prompt": "p", "timeout_ms": 0}]),
            "timeout_ms must be at least 1",
        ),
    ];
    for (plan, want) in table {
        let err = parse(plan.clone()).expect_err(&plan.to_string());
        assert!(err.contains(want), "{plan}: {err}");
    }
}

#[test]
fn templates_fill_from_results_and_bindings_or_name_what_is_missing() {
    let results = json!({"a": {"n": 3, "list": ["x", "y"]}, "s": "text"});
    let bindings = json!({"who": "ops"});
    let scope = Scope {
        results: results.as_object().unwrap(),
        bindings: bindings.as_object().unwrap(),
    };
    let fill = |t: &str| Template::parse(t).and_then(|t| t.render(&scope));
    assert_eq!(
        fill("{{result.s}}/{{ result.a.n }}/{{result.a.list.1}}/{{bindings.who}}").unwrap(),
        "text/3/y/ops"
    );
    assert_eq!(fill("{{result.a}}").unwrap(), r#"{"list":["x","y"],"n":3}"#);
    assert_eq!(fill("no braces").unwrap(), "no braces");
    assert!(
        fill("{{result.b}}")
            .unwrap_err()
            .contains("there is no result `b`")
    );
    assert!(fill("{{result.a.m}}").unwrap_err().contains("no `m` there"));
    assert!(
        fill("{{bindings.nope}}")
            .unwrap_err()
            .contains("no binding `nope`")
    );
    // In `with`, a lone reference keeps its JSON type.
    let step: AgentStep = serde_json::from_value(json!({
        "id": "x", "agent": "explore", "prompt": "go",
        "with": {"a": "{{result.a}}", "label": "n={{result.a.n}}", "k": [1]}
    }))
    .unwrap();
    let text = step.render(&scope).unwrap();
    let input: Value = serde_json::from_str(text.split_once("Input:\n").unwrap().1).unwrap();
    assert_eq!(
        input,
        json!({"a": {"n": 3, "list": ["x", "y"]}, "label": "n=3", "k": [1]})
    );
}

#[test]
fn a_reviewers_verdict_parses_with_or_without_a_fence() {
    assert_eq!(
        parse_review("```json\n{\"approved\": true, \"notes\": \"fine\"}\n```"),
        Ok((true, "fine".into()))
    );
    assert_eq!(
        parse_review("{\"approved\": false}"),
        Ok((false, String::new()))
    );
    assert!(parse_review("looks good to me").is_err());
}
