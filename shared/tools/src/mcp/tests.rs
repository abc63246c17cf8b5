use super::*;

#[test]
fn an_http_servers_url_may_name_the_runs_sandbox() {
    let spec: McpServerSpec = serde_json::from_value(serde_json::json!({
        "url": "${SANDBOX_HOST}/servers/${run.sandboxId}-fs/mcp"}))
    .expect("spec");
    let host = |k: &str| (k == "SANDBOX_HOST").then(|| "http://127.0.0.1:9".to_owned());
    let server = McpServer::new("fs", &spec, Host::Lambda, &host).expect("server");
    assert_eq!(server.0.vars, ["run.sandboxId"]);
    let Transport::Http { url, .. } = &server.0.transport else {
        panic!("an HTTP server")
    };
    assert_eq!(url, "http://127.0.0.1:9/servers/${run.sandboxId}-fs/mcp");
    let err = server.0.key(&Scope::default()).expect_err("no sandbox");
    assert!(err.contains("run.sandboxId"), "{err}");
    // An unset variable, or a URL that is none, is named at start-up.
    let err = McpServer::new("fs", &spec, Host::Lambda, &|_| None)
        .err()
        .expect("unset");
    assert!(err.contains("SANDBOX_HOST"), "{err}");
    let bad: McpServerSpec =
        serde_json::from_value(serde_json::json!({"url": "ftp://x/${run.sandboxId}"}))
            .expect("spec");
    assert!(McpServer::new("fs", &bad, Host::Lambda, &|_| None).is_err());
}

#[tokio::test]
async fn a_server_that_redirects_to_another_origin_is_not_followed() {
    use wiremock::matchers::path;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    // Two loopback servers: the one the file names, and another port.
    let (named, other) = (MockServer::start().await, MockServer::start().await);
    Mock::given(path("/mcp"))
        .respond_with(
            ResponseTemplate::new(307)
                .insert_header("location", format!("{}/mcp", other.uri()).as_str()),
        )
        .mount(&named)
        .await;
    let spec: McpServerSpec = serde_json::from_value(serde_json::json!({
        "url": format!("{}/mcp", named.uri()), "headers": {"X-Api-Key": "${KEY}"}}))
    .expect("spec");
    let key = |k: &str| (k == "KEY").then(|| "s3cret".to_owned());
    let server = McpServer::new("pay", &spec, Host::Lambda, &key).expect("server");
    let Err(err) = server.0.open(&Scope::default()).await else {
        panic!("connected through a redirect to another origin");
    };
    assert!(err.contains("another origin"), "{err}");
    let sent = other.received_requests().await.unwrap_or_default();
    assert!(
        sent.is_empty(),
        "the other origin was sent {} requests",
        sent.len()
    );
}

#[test]
fn images_are_kept_as_files_and_the_model_reads_their_summary() {
    use base64::Engine;
    use rmcp::model::ContentBlock as Content;
    let png = [0x89, b'P', b'N', b'G', 1, 2, 3];
    let data = base64::engine::general_purpose::STANDARD.encode(png);
    let ctx = ToolContext::builder("run_1")
        .owner("o")
        .agent("ops")
        .call_id("call_1")
        .build();
    let result = CallToolResult::success(vec![
        Content::text("the chart:"),
        Content::image(data, "image/png"),
        Content::image("not base64!", "image/png"),
    ]);
    let out = output(&ctx, "chart", result).expect("a result");
    let text = out.as_str().expect("text");
    assert!(
        text.starts_with("the chart:\n[an image (image/png, 7 bytes)"),
        "{text}"
    );
    assert!(
        text.contains("kept as the file `chart-image-2.png`"),
        "{text}"
    );
    assert!(text.contains("not kept: its data is not base64"), "{text}");
    let files = ctx.take_files();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].name, "chart-image-2.png");
    assert_eq!(files[0].media_type, "image/png");
    assert_eq!(files[0].bytes, png);
}

#[test]
fn run_variables_wait_for_the_run_and_the_rest_comes_from_the_environment() {
    let spec: McpServerSpec = serde_json::from_value(serde_json::json!({
        "command": "srv",
        "args": ["${ROOT}/${run.sandboxId}", "--repo=${run.githubRepo}@${run.githubRef}"]
    }))
    .expect("spec");
    let env = |k: &str| (k == "ROOT").then(|| "/srv".to_owned());
    let server = McpServer::new("s", &spec, Host::Dev, &env).expect("server");
    assert_eq!(
        server.0.vars,
        ["run.sandboxId", "run.githubRepo", "run.githubRef"]
    );
    let Transport::Stdio { args, .. } = &server.0.transport else {
        panic!("stdio")
    };
    let scope = Scope {
        sandbox_id: Some("sb-1".into()),
        github: Some(baton_core::scope::GithubRepo {
            repo: "acme/web".into(),
            git_ref: Some("main".into()),
        }),
    };
    let filled: Vec<String> = args
        .iter()
        .map(|a| expand_run(a, &scope).expect("fills"))
        .collect();
    assert_eq!(filled, ["/srv/sb-1", "--repo=acme/web@main"]);
    assert!(server.lists_for(&scope));
    let bare = Scope::default();
    assert!(
        !server.lists_for(&bare),
        "a run without a sandbox cannot start it"
    );
    let err = server.0.key(&bare).expect_err("needs the sandbox");
    assert!(err.contains("${run.sandboxId}"), "{err}");
    // An unknown run variable, or an unset one, is a start-up error.
    for bad in ["${run.nope}", "${MISSING}"] {
        let spec: McpServerSpec =
            serde_json::from_value(serde_json::json!({"command": "srv", "args": [bad]}))
                .expect("spec");
        assert!(
            McpServer::new("s", &spec, Host::Dev, &env).is_err(),
            "{bad}"
        );
    }
}
