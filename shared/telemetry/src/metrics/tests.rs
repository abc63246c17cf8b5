//! The EMF lines against CloudWatch's specification, the dashboard against what is written,
//! the bound on model labels.
#![allow(clippy::unwrap_used)]

use super::*;
use baton_core::cost::{Spent, Usage};
use baton_core::observe::{ModelCall, StepFailure, ToolCall};
use baton_core::timeline::Operation;
use chrono::{TimeZone, Utc};
use serde_json::{Value, json};

fn report() -> StepReport {
    let at = Utc.with_ymd_and_hms(2026, 11, 26, 12, 0, 0).unwrap();
    StepReport {
        run_id: "run_1".into(),
        agent: "orchestrator".into(),
        parent: None,
        version: 4,
        seq: 5,
        attempt: 1,
        input: "cta_answered",
        started: at,
        ended: at + chrono::Duration::milliseconds(1250),
        status: RunStatus::Completed,
        ended_run: true,
        run_created: at - chrono::Duration::hours(2),
        run_total: Spent::default(),
        error: None,
        error_code: None,
        model_calls: vec![ModelCall {
            seq: 7,
            model: Some("openai:gpt-4o-mini".into()),
            operation: Operation::Think,
            usage: Usage {
                input_tokens: 1200,
                output_tokens: 300,
                total_tokens: 1500,
                cached_input_tokens: 200,
                reasoning_tokens: 0,
            },
            cost_usd: Some(0.0081),
            latency_ms: Some(900),
            finish_reason: "stop",
        }],
        tool_calls: vec![
            ToolCall {
                seq: 6,
                call_id: "c1".into(),
                name: "request_human_feedback".into(),
                server: None,
                duration_ms: None,
                outcome: Outcome::Success,
                child_run_id: None,
            },
            ToolCall {
                seq: 8,
                call_id: "c2".into(),
                name: "clock__now".into(),
                server: Some("clock".into()),
                duration_ms: Some(30),
                outcome: Outcome::Error,
                child_run_id: None,
            },
        ],
        children: vec![],
        ctas_opened: 0,
        ctas_answered: vec![7_200_000],
        ctas_expired: vec![],
        budget_questions: 0,
        budget_raised_usd: 0.0,
        plan_phases: vec![],
        plan_reviews: vec![],
        refusals: vec![],
    }
}

/// Checks `line` against CloudWatch's EMF specification: its JSON schema (draft 7, as AWS
/// publishes it on https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/
/// CloudWatch_Embedded_Metric_Format_Specification.html, kept in `tests/emf-schema.json`)
/// and the rules the schema cannot say (targets at the root, numeric metrics, string
/// dimensions, the limits).
fn check_emf(line: &Value) {
    let schema: Value = serde_json::from_str(include_str!("../../tests/emf-schema.json")).unwrap();
    let validator = jsonschema::draft7::new(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(line).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?} in {line}");
    for directive in line["_aws"]["CloudWatchMetrics"].as_array().unwrap() {
        let metrics = directive["Metrics"].as_array().unwrap();
        assert!(metrics.len() <= 100);
        for m in metrics {
            let name = m["Name"].as_str().unwrap();
            let v = &line[name];
            let numeric = v.is_number()
                || v.as_array()
                    .is_some_and(|a| a.len() <= 100 && a.iter().all(Value::is_number));
            assert!(numeric, "metric {name} is {v}");
        }
        for set in directive["Dimensions"].as_array().unwrap() {
            let set = set.as_array().unwrap();
            assert!(set.len() <= 30);
            for dim in set {
                let v = line[dim.as_str().unwrap()].as_str().unwrap();
                assert!(!v.is_empty() && v.chars().count() <= 1024, "{dim} = {v}");
            }
        }
    }
}

/// The EMF lines `m` wrote so far, as JSON.
fn emf_lines(m: &Metrics) -> Vec<Value> {
    String::from_utf8(m.take_emf())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_step_is_one_emf_line_that_follows_the_specification() {
    let m = Metrics::emf_in_memory();
    m.step(&report());
    let mut quiet = report();
    quiet.model_calls.clear();
    quiet.ctas_answered.clear();
    quiet.ended_run = false;
    m.step(&quiet);
    let lines = emf_lines(&m);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        check_emf(line);
        let d = &line["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(d["Namespace"], "Baton");
        assert_eq!(d["Dimensions"], json!([["Agent", "Model"], ["Agent"], []]));
    }
    let first = &lines[0];
    assert_eq!(first["Agent"], "orchestrator");
    assert_eq!(first["Model"], "openai:gpt-4o-mini");
    assert_eq!(first["Steps"].as_f64(), Some(1.0));
    assert_eq!(first["StepLatency"].as_f64(), Some(1250.0));
    assert_eq!(first["ModelLatency"].as_f64(), Some(900.0));
    assert_eq!(first["InputTokens"].as_f64(), Some(1200.0));
    assert_eq!(first["CostUSD"].as_f64(), Some(0.0081));
    assert_eq!(first["ToolErrors"].as_f64(), Some(1.0));
    assert_eq!(first["CtaWait"].as_f64(), Some(7_200_000.0));
    assert_eq!(first["RunsCompleted"].as_f64(), Some(1.0));
    // A figure the step did not count (a zero) is left out of its line.
    assert!(first.get("RunsDeadLettered").is_none(), "{first}");
    assert_eq!(
        first["_aws"]["Timestamp"],
        report().ended.timestamp_millis()
    );
    // A step without a model call has the model `none`, and no latency or wait to report.
    assert_eq!(lines[1]["Model"], NO_MODEL);
    assert!(lines[1].get("ModelLatency").is_none(), "{}", lines[1]);
    assert!(lines[1].get("CtaWait").is_none(), "{}", lines[1]);
    // A record that breaks the specification is caught by the check (it can fail).
    let mut bad = lines[0].clone();
    bad["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"] = json!("USD");
    assert!(std::panic::catch_unwind(|| check_emf(&bad)).is_err());
}

fn failure() -> StepFailure {
    let r = report();
    StepFailure {
        run_id: r.run_id,
        agent: r.agent,
        parent: None,
        version: 4,
        attempt: 2,
        input: "continue",
        started: r.started,
        ended: r.ended,
        error: "the model did not answer".into(),
    }
}

/// A failed step is an EMF line of its own (`StepFailures` by agent) and a Prometheus
/// counter; it counts no step.
#[test]
fn a_failed_step_is_counted_by_agent() {
    let m = Metrics::emf_in_memory();
    m.step_failed(&failure());
    m.step_failed(&failure());
    let lines = emf_lines(&m);
    assert_eq!(lines.len(), 2, "{lines:?}");
    check_emf(&lines[0]);
    let d = &lines[0]["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(d["Dimensions"], json!([["Agent"], []]));
    assert_eq!(d["Metrics"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(lines[0]["Agent"], "orchestrator");
    assert_eq!(lines[0]["StepFailures"].as_f64(), Some(1.0));
    assert!(lines[0].get("Steps").is_none(), "{}", lines[0]);
    let text = m.prometheus_text();
    assert!(
        text.contains("baton_step_failures_total{agent=\"orchestrator\"} 2"),
        "{text}"
    );
    assert!(!text.contains("baton_steps_total{"), "{text}");
}

#[test]
fn the_dashboard_graphs_metrics_the_steps_write() {
    let m = Metrics::emf_in_memory();
    m.step(&report());
    m.step_failed(&failure());
    // Steps that count what `report()` does not (a step's line carries only what it counted).
    for status in [RunStatus::Failed, RunStatus::Cancelled, RunStatus::Expired] {
        let mut other = report();
        other.status = status;
        other.ctas_opened = 1;
        other.ctas_expired = vec![60_000];
        m.step(&other);
    }
    let lines = emf_lines(&m);
    let written: Vec<String> = lines
        .iter()
        .flat_map(|line| {
            line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["Name"].as_str().unwrap().to_owned())
        })
        .collect();
    let template = include_str!("../../../../template.yaml");
    let body = &template[template.find("DashboardBody").unwrap()..];
    let named = regex::Regex::new(
        r#"MetricName=\\"(\w+)\\"|\["(?:Baton/\$\{AWS::StackName\}|\.)", "(\w+)""#,
    )
    .unwrap();
    let graphed: Vec<&str> = named
        .captures_iter(body)
        .filter_map(|c| c.get(1).or(c.get(2)))
        .map(|m| m.as_str())
        .collect();
    assert!(graphed.len() >= 16, "{graphed:?}");
    assert!(graphed.contains(&"StepFailures"), "{graphed:?}");
    for name in &graphed {
        assert!(
            written.iter().any(|w| w == name),
            "the dashboard graphs {name}, which no step writes"
        );
    }
    // Each stack's own namespace (`BATON_METRICS_NAMESPACE`, set by the template alike).
    let ns = "Baton/${AWS::StackName}";
    assert!(
        body.contains(&format!("{{{ns},Agent,Model}}"))
            && body.contains(&format!("{{{ns},Agent}}"))
    );
    assert!(template.contains(&format!("BATON_METRICS_NAMESPACE: !Sub {ns}")));
    assert!(!body.contains("{Baton,") && !body.contains("[\"Baton\","));
}

#[test]
fn models_past_the_bound_are_counted_as_other() {
    let m = Metrics::prometheus();
    for i in 0..MAX_MODELS + 3 {
        let mut r = report();
        r.model_calls[0].model = Some(format!("openai:m{i}"));
        m.step(&r);
    }
    let text = m.prometheus_text();
    assert!(text.contains("model=\"openai:m0\""), "{text}");
    assert!(text.contains("model=\"other\""), "{text}");
    assert!(
        !text.contains(&format!("model=\"openai:m{}\"", MAX_MODELS)),
        "{text}"
    );
    assert!(
        text.contains("baton_runs_ended_total{agent=\"orchestrator\",kind=\"completed\"} 35"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn a_run_ended_by_a_dead_letter_is_counted_and_no_other_failure_is() {
    let m = Metrics::emf_in_memory();
    let mut dead = report();
    dead.status = RunStatus::Failed;
    dead.error_code = Some("dead_letter".into());
    m.step(&dead);
    let mut failed = dead.clone();
    failed.error_code = Some("step_error".into());
    m.step(&failed);
    // A dead letter sent back to its queue commits nothing; one for a run already failed
    // ends nothing.
    let mut again = dead.clone();
    again.ended_run = false;
    m.step(&again);
    let lines = emf_lines(&m);
    let counted: Vec<f64> = lines
        .iter()
        .map(|l| l["RunsDeadLettered"].as_f64().unwrap_or(0.0))
        .collect();
    assert_eq!(counted, [1.0, 0.0, 0.0]);
    // The template's dead-letter alarm watches this metric in the stack's namespace.
    let template = include_str!("../../../../template.yaml");
    let alarm: Vec<&str> = template
        .lines()
        .skip_while(|l| *l != "  RunsDeadLetteredAlarm:")
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .collect();
    let alarm = alarm.join("\n");
    assert!(alarm.contains("MetricName: RunsDeadLettered"), "{alarm}");
    assert!(
        alarm.contains("Namespace: !Sub Baton/${AWS::StackName}"),
        "{alarm}"
    );
}

#[test]
fn budget_questions_raises_and_exhausted_runs_are_counted() {
    let m = Metrics::emf_in_memory();
    let mut asked = report();
    asked.ended_run = false;
    asked.status = RunStatus::Waiting;
    asked.budget_questions = 1;
    m.step(&asked);
    let mut raised = asked.clone();
    raised.budget_questions = 0;
    raised.budget_raised_usd = 2.5;
    m.step(&raised);
    let mut exhausted = report();
    exhausted.status = RunStatus::Failed;
    exhausted.error_code = Some("budget_exhausted".into());
    m.step(&exhausted);
    let lines = emf_lines(&m);
    let figure = |name: &str| -> Vec<f64> {
        lines
            .iter()
            .map(|l| l[name].as_f64().unwrap_or(0.0))
            .collect()
    };
    assert_eq!(figure("BudgetQuestions"), [1.0, 0.0, 0.0]);
    assert_eq!(figure("BudgetRaisedUSD"), [0.0, 2.5, 0.0]);
    assert_eq!(figure("RunsBudgetExhausted"), [0.0, 0.0, 1.0]);
    let text = m.prometheus_text();
    assert!(
        text.contains("baton_budget_total{agent=\"orchestrator\",kind=\"asked\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("baton_budget_total{agent=\"orchestrator\",kind=\"exhausted\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("baton_budget_raised_usd_total{agent=\"orchestrator\"} 2.5"),
        "{text}"
    );
}

#[test]
fn plan_reviews_phases_and_depth_refusals_are_counted() {
    let m = Metrics::emf_in_memory();
    let mut reviewed = report();
    reviewed.ended_run = false;
    reviewed.status = RunStatus::Waiting;
    reviewed.plan_reviews = vec![
        ("agent".into(), "sent_back".into()),
        ("human".into(), "approved".into()),
    ];
    reviewed.plan_phases = vec![
        ("-".into(), "awaiting_approval".into()),
        ("awaiting_approval".into(), "running".into()),
    ];
    m.step(&reviewed);
    let mut refused = reviewed.clone();
    refused.plan_reviews = vec![("conversation".into(), "answered_in_conversation".into())];
    refused.plan_phases = vec![];
    refused.refusals = vec!["depth".into()];
    m.step(&refused);
    let lines = emf_lines(&m);
    let figure = |name: &str| -> Vec<f64> {
        lines
            .iter()
            .map(|l| l[name].as_f64().unwrap_or(0.0))
            .collect()
    };
    assert_eq!(figure("PlanReviewsSentBack"), [1.0, 0.0]);
    assert_eq!(figure("PlanReviewsApproved"), [1.0, 0.0]);
    assert_eq!(figure("PlanReviewsRejected"), [0.0, 0.0]);
    assert_eq!(figure("PlanReviewsInConversation"), [0.0, 1.0]);
    assert_eq!(figure("PlanPhaseChanges"), [2.0, 0.0]);
    assert_eq!(figure("DepthRefusals"), [0.0, 1.0]);
    let text = m.prometheus_text();
    for line in [
        "baton_plan_reviews_total{agent=\"orchestrator\",by=\"agent\",outcome=\"sent_back\"} 1",
        "baton_plan_reviews_total{agent=\"orchestrator\",by=\"conversation\",outcome=\"answered_in_conversation\"} 1",
        "baton_plan_phase_changes_total{agent=\"orchestrator\",from=\"-\",to=\"awaiting_approval\"} 1",
        "baton_refusals_total{agent=\"orchestrator\",kind=\"depth\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// What an echo step writes (a think and a tool call, nothing else): only the figures it
/// counted, so that its line is short (CloudWatch Logs bills the bytes).
#[test]
fn an_echo_steps_line_carries_only_what_it_counted() {
    let m = Metrics::emf_in_memory();
    let mut echo = report();
    echo.ctas_answered.clear();
    echo.ended_run = false;
    echo.tool_calls.truncate(1);
    echo.tool_calls[0].outcome = Outcome::Success;
    m.step(&echo);
    let bytes = m.take_emf();
    let line: Value = serde_json::from_slice(&bytes).unwrap();
    check_emf(&line);
    eprintln!("an echo step's EMF line: {} bytes", bytes.len());
    for zero in [
        "ToolErrors",
        "CtasOpened",
        "CtasAnswered",
        "RunsCompleted",
        "RunsDeadLettered",
        "PlanPhaseChanges",
        "DepthRefusals",
        "BudgetQuestions",
    ] {
        assert!(line.get(zero).is_none(), "{zero}: {line}");
    }
    let declared = line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap();
    assert!(
        declared
            .iter()
            .all(|d| line.get(d["Name"].as_str().unwrap()).is_some())
    );
    assert!(bytes.len() < 900, "{} bytes: {line}", bytes.len());
}
