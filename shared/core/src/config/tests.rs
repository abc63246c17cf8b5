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

const AWS: &[(&str, &str)] = &[
    ("BATON_TABLE", "t"),
    ("BATON_STEPS_QUEUE_URL", "q1"),
    ("BATON_SUBAGENT_QUEUE_URL", "q2"),
    ("BATON_BUS_NAME", "b"),
    ("BATON_BUS_ARN", "arn:b"),
    ("BATON_SCHEDULE_GROUP", "g"),
    ("BATON_SCHEDULER_ROLE_ARN", "arn:r"),
    ("BATON_BUCKET", "files"),
];

#[test]
fn the_live_channel_is_set_by_both_domains_or_neither() {
    let aws = parse(&[
        (
            "BATON_LIVE_HTTP_DOMAIN",
            "abc.appsync-api.us-east-1.amazonaws.com",
        ),
        (
            "BATON_LIVE_REALTIME_DOMAIN",
            "abc.appsync-realtime-api.us-east-1.amazonaws.com",
        ),
    ])
    .expect("parses");
    assert_eq!(
        aws.live,
        Some(LiveConfig {
            publish_url: "https://abc.appsync-api.us-east-1.amazonaws.com/event".into(),
            realtime_url: "wss://abc.appsync-realtime-api.us-east-1.amazonaws.com/event/realtime"
                .into(),
            http_host: "abc.appsync-api.us-east-1.amazonaws.com".into(),
        })
    );
    let local = parse(&[
        ("BATON_LIVE_HTTP_DOMAIN", "http://127.0.0.1:4510/"),
        ("BATON_LIVE_REALTIME_DOMAIN", "ws://127.0.0.1:4510"),
    ])
    .expect("parses")
    .live
    .expect("set");
    assert_eq!(local.publish_url, "http://127.0.0.1:4510/event");
    assert_eq!(local.realtime_url, "ws://127.0.0.1:4510/event/realtime");
    assert_eq!(local.http_host, "127.0.0.1:4510");
    assert_eq!(parse(&[]).expect("parses").live, None);
    let half = parse(&[("BATON_LIVE_HTTP_DOMAIN", "x")])
        .map(|_| ())
        .expect_err("refused");
    assert!(
        half.to_string().contains("BATON_LIVE_REALTIME_DOMAIN"),
        "{half}"
    );
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
    assert_eq!(c.retention_days(), 90);
    assert_eq!(c.sdk, SdkEnv::default());
    let err = c.aws().expect_err("no deployment");
    assert!(err.to_string().contains("BATON_TABLE"), "{err}");
}

#[test]
fn a_deployment_is_read_whole_and_names_what_is_missing() {
    let mut vars = AWS.to_vec();
    vars.push(("BATON_RETENTION_DAYS", "7"));
    vars.push(("BATON_DEAD_LETTER_QUEUE_ARN", "arn:dlq"));
    let c = parse(&vars).expect("parses");
    let aws = c.aws().expect("complete");
    assert_eq!(aws.table, "t");
    assert_eq!(aws.retention_days, 7);
    assert_eq!(aws.dead_letter_queue_arn().expect("set"), "arn:dlq");
    for missing in AWS.iter().map(|(k, _)| *k) {
        let vars: Vec<_> = AWS.iter().copied().filter(|(k, _)| *k != missing).collect();
        let err = parse(&vars).expect("parses").aws().expect_err(missing);
        assert!(err.to_string().contains(missing), "{err}");
    }
    let err = parse(AWS)
        .expect("parses")
        .aws()
        .expect("complete")
        .dead_letter_queue_arn()
        .expect_err("unset");
    assert!(err.to_string().contains("BATON_DEAD_LETTER_QUEUE_ARN"));
}

#[test]
fn invalid_values_are_refused_by_name() {
    let cases = [
        ("BATON_LLM_MAX_RETRIES", "many"),
        ("BATON_LLM_TIMEOUT_SECONDS", "0"),
        ("BATON_RETENTION_DAYS", "0"),
        ("BATON_RETENTION_DAYS", "-3"),
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
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
        ("AWS_REGION", "eu-west-1"),
    ])
    .expect("parses");
    assert_eq!(c.model.model, "gpt-4o-mini");
    assert!(!format!("{c:?}").contains("sk-secret"));
    assert!(!format!("{c:?}").contains("sk-ant-secret"));
    assert_eq!(c.sdk.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
    assert!(c.sdk.region_set && !c.sdk.credentials_set);
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
