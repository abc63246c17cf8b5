//! `baton preflight`: whether an account's Lambda and Bedrock quotas can run the stack.

use super::*;

use std::process::Command;

/// A stand-in of Lambda's `GetAccountSettings` (moto has none), answering as AWS documents
/// it: an account of `total` concurrent executions, `unreserved` of them not reserved.
async fn lambda_account(total: u32, unreserved: u32) -> wiremock::MockServer {
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers};
    let server = MockServer::start().await;
    Mock::given(matchers::method("GET"))
        .and(matchers::path_regex("^/2016-08-19/account-settings/?$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "AccountLimit": {"TotalCodeSize": 80530636800u64, "CodeSizeUnzipped": 262144000,
                             "CodeSizeZipped": 52428800, "ConcurrentExecutions": total,
                             "UnreservedConcurrentExecutions": unreserved},
            "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": 0}})))
        .mount(&server)
        .await;
    server
}

/// Service Quotas (awsJson 1.1) on `server`: Bedrock's quotas as the account has them (its
/// tokens-per-minute quota lowered to 400,000) and AWS's defaults.
async fn bedrock_quotas(server: &wiremock::MockServer) {
    use wiremock::{Mock, ResponseTemplate, matchers};
    let quota = |name: &str, code: &str, value: f64| {
        serde_json::json!({"ServiceCode": "bedrock", "ServiceName": "Amazon Bedrock",
            "QuotaName": name, "QuotaCode": code, "Value": value, "Unit": "None",
            "Adjustable": true, "GlobalQuota": false,
            "QuotaArn": format!("arn:aws:servicequotas:us-east-1:123456789012:bedrock/{code}")})
    };
    let tpm = "Cross-Region InvokeModel tokens per minute for Anthropic Claude Haiku 4.5";
    let rpm = "Cross-Region InvokeModel requests per minute for Anthropic Claude Haiku 4.5";
    let other = "On-demand InvokeModel tokens per minute for Anthropic Claude Haiku 4.5";
    for (target, quotas) in [
        ("ListServiceQuotas", vec![quota(tpm, "L-TPM", 400_000.0)]),
        (
            "ListAWSDefaultServiceQuotas",
            vec![
                quota(tpm, "L-TPM", 4_000_000.0),
                quota(rpm, "L-RPM", 800.0),
                quota(other, "L-OD", 4_000_000.0),
            ],
        ),
    ] {
        Mock::given(matchers::method("POST"))
            .and(matchers::header(
                "x-amz-target",
                format!("ServiceQuotasV20190624.{target}").as_str(),
            ))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("content-type", "application/x-amz-json-1.1")
                    .set_body_json(serde_json::json!({"Quotas": quotas})),
            )
            .mount(server)
            .await;
    }
}

#[tokio::test]
async fn preflight_says_whether_the_account_can_run_the_stack() {
    let preflight = |url: String, args: &[&str]| {
        let out = Command::new(BIN)
            .arg("preflight")
            .args(args)
            .env("AWS_ENDPOINT_URL", url)
            .env("AWS_REGION", "us-east-1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (
            out.status.code(),
            text + &String::from_utf8_lossy(&out.stderr),
        )
    };
    // An established account: 1,000, none reserved. The defaults' 156 fit.
    let big = lambda_account(1000, 1000).await;
    let (code, text) = preflight(big.uri(), &[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("may run 156 invocations at once"), "{text}");
    assert!(
        text.contains("OrchestratorFunction") && text.contains("52"),
        "{text}"
    );
    // A new account's 10: not even the mappings' least fit; it says what to do.
    let new = lambda_account(10, 10).await;
    let (code, text) = preflight(
        new.uri(),
        &["--parameter-overrides", "StepsMaxConcurrency=2"],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("NO") && text.contains("higher quota"),
        "{text}"
    );
    // Too many asked of a large account; a reservation that leaves Lambda less than 100.
    let (code, text) = preflight(
        big.uri(),
        &["--parameter-overrides", "StepsMaxConcurrency=400"],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("may run 1206 invocations"), "{text}");
    let (code, text) = preflight(
        big.uri(),
        &[
            "--parameter-overrides",
            "ReservedConcurrency=460",
            "StepsMaxConcurrency=50",
        ],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("at most 450"), "{text}");
    let (code, text) = preflight(
        big.uri(),
        &["--parameter-overrides", "ReservedConcurrency=40"],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("give it at least 52"), "{text}");
    // A stack name whose queue names would pass SQS's 80 characters.
    let long = "a".repeat(57);
    let (code, text) = preflight(big.uri(), &["--stack-name", &long]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("at most 56"), "{text}");
    // An agent thinking with Bedrock: the model's per-minute quotas (Service Quotas, the
    // account's value over the default) against the step functions' invocations at once.
    let bedrock = lambda_account(1000, 1000).await;
    bedrock_quotas(&bedrock).await;
    let model = "Model=bedrock:global.anthropic.claude-haiku-4-5-20251001-v1:0";
    let (code, text) = preflight(bedrock.uri(), &["--parameter-overrides", model]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("NO   Bedrock `Cross-Region InvokeModel tokens per minute")
            && text.contains("(L-TPM) is 400000")
            && text.contains("104 invocations"),
        "{text}"
    );
    let (code, text) = preflight(
        bedrock.uri(),
        &["--parameter-overrides", model, "StepsMaxConcurrency=20"],
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("ok   Bedrock") && text.contains("(L-RPM) is 800"),
        "{text}"
    );
    // Without Bedrock, its quotas are not read.
    let (_, text) = preflight(big.uri(), &[]);
    assert!(text.contains("its quotas not read"), "{text}");
    // Bad input: exit 2, said.
    for bad in [
        &["--parameter-overrides", "NoSuchParameter=1"][..],
        &["--parameter-overrides", "=1"],
    ] {
        let (code, text) = preflight(big.uri(), bad);
        assert_eq!(code, Some(2), "{bad:?}: {text}");
    }
}
