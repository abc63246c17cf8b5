//! Reading an AWS host's environment: the deployment read whole, the live channel, the SDK.

use super::*;
use std::collections::HashMap;

fn parse(vars: &[(&str, &str)]) -> Result<AwsSettings, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    AwsSettings::from_lookup(|k| map.get(k).cloned())
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
fn nothing_set_is_no_deployment_and_the_sdks_defaults() {
    let c = parse(&[]).expect("parses");
    assert_eq!(c.retention_days, 90);
    assert_eq!(c.sdk, SdkEnv::default());
    let err = c.aws().expect_err("no deployment");
    assert!(err.to_string().contains("BATON_TABLE"), "{err}");
}

#[test]
fn retention_is_a_whole_number_of_days_and_blank_values_are_unset() {
    for v in ["0", "-3"] {
        let err = parse(&[("BATON_RETENTION_DAYS", v)]).expect_err(v);
        assert!(err.to_string().contains("BATON_RETENTION_DAYS"), "{err}");
        assert!(err.to_string().contains(v), "{err}");
    }
    let c = parse(&[
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
        ("AWS_REGION", "eu-west-1"),
        ("AWS_ACCESS_KEY_ID", "  "),
    ])
    .expect("parses");
    assert_eq!(c.sdk.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
    assert!(c.sdk.region_set && !c.sdk.credentials_set);
}

#[test]
fn the_sweep_shards_are_four_unless_told_and_from_one_to_sixty_four() {
    let config = |extra: &[(&'static str, &'static str)]| {
        let vars: Vec<_> = AWS.iter().chain(extra).copied().collect();
        parse(&vars).and_then(|s| s.aws().cloned())
    };
    assert_eq!(config(&[]).expect("parses").sweep_shards, 4);
    let told = config(&[("BATON_SWEEP_SHARDS", "16")]).expect("parses");
    assert_eq!(told.sweep_shards, 16);
    for bad in ["0", "65", "four", "-1"] {
        let e = config(&[("BATON_SWEEP_SHARDS", bad)])
            .map(|_| ())
            .expect_err(bad);
        assert!(e.to_string().contains("BATON_SWEEP_SHARDS"), "{e}");
    }
}
