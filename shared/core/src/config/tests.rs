//! Reading the environment: defaults, refusals by name, the deployment read whole.

use super::*;
use std::collections::HashMap;

fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| map.get(k).cloned())
}

#[test]
fn the_metrics_namespace_is_a_cloudwatch_one() {
    assert_eq!(parse(&[]).expect("parses").metrics_namespace, "Baton");
    let stack = parse(&[("BATON_METRICS_NAMESPACE", "Baton/prod-eu")]).expect("parses");
    assert_eq!(stack.metrics_namespace, "Baton/prod-eu");
    for bad in ["AWS/Lambda", "Baton{x}", &"x".repeat(256)] {
        let e = parse(&[("BATON_METRICS_NAMESPACE", bad)])
            .map(|_| ())
            .expect_err(bad);
        assert!(e.to_string().contains("BATON_METRICS_NAMESPACE"), "{e}");
    }
}

#[test]
fn the_cache_is_sized_from_the_memory_the_host_is_given() {
    const MIB: usize = 1024 * 1024;
    let c = parse(&[]).expect("parses");
    assert_eq!(c.cache_bytes(None), 64 * MIB);
    assert_eq!(
        c.cache_bytes(Some(8 * 1024)),
        1024 * MIB,
        "a laptop's quarter, capped"
    );
    let lambda = parse(&[("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")]).expect("parses");
    assert_eq!(
        lambda.cache_bytes(Some(8 * 1024)),
        128 * MIB,
        "the function's, not the machine's"
    );
    let set = parse(&[("BATON_CACHE_MB", "0")]).expect("parses");
    assert_eq!(set.cache_bytes(Some(8 * 1024)), 0);
    assert!(parse(&[("BATON_CACHE_MB", "lots")]).is_err());
}

#[test]
fn defaults_apply_when_nothing_is_set() {
    let c = parse(&[]).expect("parses");
    assert_eq!(c.model.base_url, "https://api.openai.com/v1");
    assert_eq!(c.model.model, "gpt-4o-mini");
    assert_eq!(c.model.max_retries, 4);
    assert_eq!(c.model.timeout_secs, 120);
    assert_eq!(c.prefix, "baton");
}

#[test]
fn invalid_values_are_refused_by_name() {
    let cases = [
        ("BATON_LLM_MAX_RETRIES", "many"),
        ("BATON_LLM_TIMEOUT_SECONDS", "0"),
        ("OPENAI_BASE_URL", "localhost:8080"),
        ("ANTHROPIC_BASE_URL", "api.anthropic.com"),
        ("BATON_MAX_OUTPUT_TOKENS", "0"),
    ];
    for (k, v) in cases {
        let err = parse(&[(k, v)]).expect_err(k);
        assert!(err.to_string().contains(k), "{err}");
        assert!(err.to_string().contains(v), "{err}");
    }
}

#[test]
fn blank_values_count_as_unset_and_secrets_are_not_printed() {
    let c = parse(&[
        ("BATON_MODEL", "  "),
        ("OPENAI_API_KEY", "sk-secret"),
        ("ANTHROPIC_API_KEY", "sk-ant-secret"),
    ])
    .expect("parses");
    assert_eq!(c.model.model, "gpt-4o-mini");
    assert!(!format!("{c:?}").contains("sk-secret"));
    assert!(!format!("{c:?}").contains("sk-ant-secret"));
}

#[test]
fn the_agents_file_may_come_as_json_in_the_environment() {
    let c = parse(&[(
        "BATON_AGENTS_JSON",
        r#"{"agents": {"a": {"tools": ["echo"]}}}"#,
    )])
    .expect("parses");
    let file = c.agents().expect("valid").expect("given");
    assert!(file.agents.contains_key("a"));
    let bad = parse(&[("BATON_AGENTS_JSON", "{nope")]).expect("parses");
    let err = bad.agents().expect_err("not JSON");
    assert!(err.to_string().contains("BATON_AGENTS_JSON"), "{err}");
    assert!(parse(&[]).expect("parses").agents().expect("ok").is_none());
}

#[test]
fn the_agents_file_may_come_from_s3_and_the_dev_function_timeout_is_a_number() {
    let c = parse(&[("BATON_AGENTS_S3_URI", "s3://my-bucket/baton/agents.json")]).unwrap();
    assert_eq!(
        c.agents_s3_uri.as_deref(),
        Some("s3://my-bucket/baton/agents.json")
    );
    for bad in [
        "my-bucket/agents.json",
        "s3://my-bucket",
        "s3:///agents.json",
        "s3://b/",
    ] {
        let err = parse(&[("BATON_AGENTS_S3_URI", bad)]).unwrap_err();
        assert!(
            err.to_string().contains("BATON_AGENTS_S3_URI"),
            "{bad}: {err}"
        );
    }
    assert_eq!(parse(&[]).unwrap().dev_function_timeout_s, None);
    let c = parse(&[("BATON_DEV_FUNCTION_TIMEOUT_S", "20")]).unwrap();
    assert_eq!(c.dev_function_timeout_s, Some(20));
    for bad in ["0", "twenty", "-1"] {
        assert!(
            parse(&[("BATON_DEV_FUNCTION_TIMEOUT_S", bad)]).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn quotas_are_off_unless_set_above_zero_and_bad_values_are_named() {
    let none = parse(&[]).expect("parses");
    assert_eq!(none.max_active_runs_per_owner, None);
    assert_eq!(none.max_daily_cost_usd_per_owner, None);
    let zero = parse(&[
        ("BATON_MAX_ACTIVE_RUNS_PER_OWNER", "0"),
        ("BATON_MAX_DAILY_COST_USD_PER_OWNER", "0"),
    ])
    .expect("parses");
    assert_eq!(zero.max_active_runs_per_owner, None, "0 is no limit");
    assert_eq!(zero.max_daily_cost_usd_per_owner, None, "0 is no limit");
    let set = parse(&[
        ("BATON_MAX_ACTIVE_RUNS_PER_OWNER", "10"),
        ("BATON_MAX_DAILY_COST_USD_PER_OWNER", "2.5"),
    ])
    .expect("parses");
    assert_eq!(set.max_active_runs_per_owner, Some(10));
    assert_eq!(set.max_daily_cost_usd_per_owner, Some(2.5));
    for (var, bad) in [
        ("BATON_MAX_ACTIVE_RUNS_PER_OWNER", "-1"),
        ("BATON_MAX_ACTIVE_RUNS_PER_OWNER", "ten"),
        ("BATON_MAX_DAILY_COST_USD_PER_OWNER", "-0.5"),
        ("BATON_MAX_DAILY_COST_USD_PER_OWNER", "NaN"),
        ("BATON_MAX_DAILY_COST_USD_PER_OWNER", "inf"),
        ("BATON_MAX_DAILY_COST_USD_PER_OWNER", "1e300"),
        ("BATON_MAX_DAILY_COST_USD_PER_OWNER", "1000000.01"),
        // Too small for DynamoDB's numbers to add costs to (it takes 1e-130 and up).
        ("BATON_MAX_DAILY_COST_USD_PER_OWNER", "1e-200"),
    ] {
        let e = parse(&[(var, bad)]).map(|_| ()).expect_err(bad);
        assert!(e.to_string().contains(var), "{e}");
    }
}

#[test]
fn the_budget_is_a_quarter_of_the_memory_within_bounds() {
    assert_eq!(super::budget_for(256), 64 * 1024 * 1024);
    assert_eq!(super::budget_for(1024), 256 * 1024 * 1024);
    assert_eq!(
        super::budget_for(16 * 1024),
        1024 * 1024 * 1024,
        "at most 1 GiB"
    );
    assert_eq!(super::budget_for(32), 16 * 1024 * 1024, "at least 16 MiB");
}
