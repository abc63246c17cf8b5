use super::*;
use serde_json::json;
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn base() -> baton_core::tools::ToolContextBuilder {
    ToolContext::builder("run_1")
        .owner("o")
        .agent("ops")
        .call_id("call_7")
}

fn ctx() -> ToolContext {
    base().build()
}

fn tool(url: String) -> HttpTool {
    let spec: HttpToolSpec = serde_json::from_value(json!({
        "url": url, "description": "Looks up an order.",
        "schema": {"type": "object"},
        "headers": {"Authorization": "Bearer ${TOKEN}"}
    }))
    .expect("spec");
    HttpTool::new("lookup", &spec, &|k| (k == "TOKEN").then(|| "t0k".into())).expect("tool")
}

#[tokio::test]
async fn posts_the_input_with_the_calls_idempotency_key() {
    let server = MockServer::start().await;
    let ctx = base().idempotency_key("call_0123456789abcdef").build();
    Mock::given(method("POST"))
        .and(path("/orders"))
        .and(header("idempotency-key", "call_0123456789abcdef"))
        .and(header("authorization", "Bearer t0k"))
        .and(body_json(json!({"id": 42})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "shipped"})))
        .expect(1)
        .mount(&server)
        .await;
    let out = tool(format!("{}/orders", server.uri()))
        .execute(&ctx, json!({"id": 42}))
        .await;
    assert_eq!(out, Ok(json!({"status": "shipped"})));
}

#[tokio::test]
async fn errors_say_what_came_back() {
    let server = MockServer::start().await;
    Mock::given(path("/down"))
        .respond_with(ResponseTemplate::new(503).set_body_string("maintenance"))
        .mount(&server)
        .await;
    Mock::given(path("/html"))
        .respond_with(ResponseTemplate::new(200).set_body_string("<html>"))
        .mount(&server)
        .await;
    let err = tool(format!("{}/down", server.uri()))
        .execute(&ctx(), json!({}))
        .await
        .expect_err("503");
    assert!(
        err.message().contains("503") && err.message().contains("maintenance"),
        "{err}"
    );
    let err = tool(format!("{}/html", server.uri()))
        .execute(&ctx(), json!({}))
        .await
        .expect_err("not JSON");
    assert!(err.message().contains("not JSON"), "{err}");
    let err = tool("http://127.0.0.1:9/x".into())
        .execute(&ctx(), json!({}))
        .await
        .expect_err("refused");
    assert!(err.message().contains("cannot reach 127.0.0.1"), "{err}");
}

#[tokio::test]
async fn the_url_and_headers_name_the_calling_runs_sandbox_and_repository() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/sandboxes/sb-7/exec"))
        .and(header("x-repo", "acme/shop@main"))
        .and(header("authorization", "Bearer t0k"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true})))
        .expect(1)
        .mount(&server)
        .await;
    let spec: HttpToolSpec = serde_json::from_value(json!({
        "url": format!("{}/sandboxes/${{run.sandboxId}}/exec", server.uri()),
        "description": "Runs a command in the run's sandbox.",
        "schema": {"type": "object"},
        "headers": {"Authorization": "Bearer ${TOKEN}",
                    "X-Repo": "${run.githubRepo}@${run.githubRef}"}
    }))
    .expect("spec");
    let tool =
        HttpTool::new("exec", &spec, &|k| (k == "TOKEN").then(|| "t0k".into())).expect("tool");
    let ctx = base()
        .scope(baton_core::scope::Scope {
            sandbox_id: Some("sb-7".into()),
            github: Some(baton_core::scope::GithubRepo {
                repo: "acme/shop".into(),
                git_ref: Some("main".into()),
            }),
        })
        .build();
    assert_eq!(tool.execute(&ctx, json!({})).await, Ok(json!({"ok": true})));
    // A run without a sandbox: an error result that names what is missing, no request.
    let err = tool
        .execute(&self::ctx(), json!({}))
        .await
        .expect_err("no sandbox");
    assert!(
        err.message().contains("`exec`") && err.message().contains("${run.sandboxId}"),
        "{err}"
    );
    // One with a sandbox but no repository: the header names what it lacks.
    let ctx = base()
        .scope(baton_core::scope::Scope {
            sandbox_id: Some("sb-7".into()),
            github: None,
        })
        .build();
    let err = tool.execute(&ctx, json!({})).await.expect_err("no repo");
    assert!(
        err.message().contains("X-Repo") || err.message().contains("x-repo"),
        "{err}"
    );
    assert!(err.message().contains("${run.githubRepo}"), "{err}");
}

#[tokio::test]
async fn an_answer_of_baton_s_media_type_returns_widgets_and_files_beside_its_result() {
    let server = MockServer::start().await;
    let report = json!({
        "result": {"total": 42},
        "widgets": [{"kind": "card", "data": {"total": 42}}],
        "files": [{"name": "sales.csv", "mediaType": "text/csv",
                   "contentBase64": "cmVnaW9uLHNhbGVzCmV1LDEyCg==", "summary": "1 region"}]});
    Mock::given(path("/report"))
        .respond_with(
            ResponseTemplate::new(200).set_body_raw(report.to_string(), OUTPUTS_MEDIA_TYPE),
        )
        .mount(&server)
        .await;
    // The same body as plain JSON is the result itself.
    Mock::given(path("/plain"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"files": []})))
        .mount(&server)
        .await;
    Mock::given(path("/bad"))
        .respond_with(
            ResponseTemplate::new(200).set_body_raw(
                json!({"result": 1, "widgets": [{"kind": "card", "data": {}}],
                       "files": [{"name": "x", "mediaType": "text/plain",
                    "contentBase64": "%%%", "summary": "s"}]})
                .to_string(),
                OUTPUTS_MEDIA_TYPE,
            ),
        )
        .mount(&server)
        .await;
    let ctx = ctx();
    let out = tool(format!("{}/report", server.uri()))
        .execute(&ctx, json!({}))
        .await;
    assert_eq!(out, Ok(json!({"total": 42})));
    let widgets = ctx.take_widgets();
    assert_eq!(
        (widgets[0].kind.as_str(), &widgets[0].data),
        ("card", &json!({"total": 42}))
    );
    let files = ctx.take_files();
    assert_eq!(files[0].name, "sales.csv");
    assert_eq!(files[0].bytes, b"region,sales\neu,12\n");
    assert_eq!(files[0].summary, "1 region");
    let plain = tool(format!("{}/plain", server.uri()))
        .execute(&ctx, json!({}))
        .await;
    assert_eq!(plain, Ok(json!({"files": []})));
    let err = tool(format!("{}/bad", server.uri()))
        .execute(&ctx, json!({}))
        .await
        .expect_err("not base64");
    assert!(err.message().contains("`x` is not base64"), "{err}");
    // Its widget, before the refused file, was not kept either.
    assert!(ctx.take_widgets().is_empty());
}

#[test]
fn bad_specs_are_named() {
    let spec = |v: Value| serde_json::from_value::<HttpToolSpec>(v).expect("spec");
    let none = |_: &str| None;
    let base = json!({"url": "ftp://x", "description": "d", "schema": {}});
    assert!(HttpTool::new("t", &spec(base), &none).is_err_and(|e| e.contains("http")));
    let unset = json!({"url": "http://x", "description": "d", "schema": {},
                       "headers": {"X-Key": "${MISSING}"}});
    assert!(HttpTool::new("t", &spec(unset), &none).is_err_and(|e| e.contains("MISSING")));
    // Only the run's own variables wait for a run; an unknown one is named at start-up.
    let unknown = json!({"url": "http://x/${run.sandbox}", "description": "d", "schema": {}});
    assert!(HttpTool::new("t", &spec(unknown), &none).is_err_and(|e| e.contains("run.sandbox")));
}

/// A tool whose URL is on `server`, with a secret header and a per-run one, following
/// `redirects`.
fn redirecting(server: &MockServer, redirects: &str) -> HttpTool {
    let spec: HttpToolSpec = serde_json::from_value(json!({
        "url": format!("{}/pay", server.uri()), "description": "Pays.",
        "schema": {"type": "object"}, "redirects": redirects,
        "headers": {"X-Api-Key": "${KEY}", "X-Sandbox": "${run.sandboxId}"}
    }))
    .expect("spec");
    HttpTool::new("pay", &spec, &|k| (k == "KEY").then(|| "s3cret".into())).expect("tool")
}

fn scoped() -> ToolContext {
    base()
        .idempotency_key("call_0123456789abcdef")
        .scope(baton_core::scope::Scope {
            sandbox_id: Some("sb-1".into()),
            github: None,
        })
        .build()
}

/// What `server` was sent: each request's path, and whether it carried any of the
/// tool's headers or a body.
async fn seen(server: &MockServer) -> Vec<(String, bool, bool)> {
    let requests = server.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .map(|r| {
            let carried = ["x-api-key", "x-sandbox", "idempotency-key"]
                .iter()
                .any(|h| r.headers.contains_key(*h));
            (r.url.path().to_owned(), carried, !r.body.is_empty())
        })
        .collect()
}

/// `server` answers `/pay` with a redirect of `status` to `to`, and nothing else.
async fn redirect(server: &MockServer, status: u16, to: &str) {
    server.reset().await;
    Mock::given(path("/pay"))
        .respond_with(ResponseTemplate::new(status).insert_header("location", to))
        .mount(server)
        .await;
}

#[tokio::test]
async fn a_redirect_to_another_origin_is_not_followed_and_carries_no_secret() {
    // Two loopback servers: the tool's, and another port (another origin).
    let (ours, other) = (MockServer::start().await, MockServer::start().await);
    Mock::given(path("/steal"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"paid": "elsewhere"})))
        .mount(&other)
        .await;
    for status in [301, 302, 303, 307, 308] {
        redirect(&ours, status, &format!("{}/steal", other.uri())).await;
        let err = redirecting(&ours, "sameOrigin")
            .execute(&scoped(), json!({"amount": 5}))
            .await
            .expect_err("not followed");
        assert!(
            err.message().contains("another origin") && err.message().contains(&other.uri()),
            "{status}: {err}"
        );
        assert!(!err.message().contains("s3cret"), "{err}");
    }
    assert_eq!(
        seen(&other).await,
        vec![],
        "the other origin was sent nothing"
    );

    // Allowed: followed, with none of the tool's headers nor its key; a 307 keeps the
    // body (HTTP says so), a 303 does not.
    for (status, body) in [(307, true), (303, false)] {
        other.reset().await;
        Mock::given(path("/steal"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"paid": "there"})))
            .mount(&other)
            .await;
        redirect(&ours, status, &format!("{}/steal", other.uri())).await;
        let out = redirecting(&ours, "any")
            .execute(&scoped(), json!({"amount": 5}))
            .await;
        assert_eq!(out, Ok(json!({"paid": "there"})), "{status}");
        assert_eq!(
            seen(&other).await,
            vec![("/steal".into(), false, body)],
            "{status}"
        );
    }
}

#[tokio::test]
async fn a_redirect_within_the_origin_keeps_the_tools_headers() {
    let server = MockServer::start().await;
    Mock::given(path("/pay"))
        .respond_with(ResponseTemplate::new(308).insert_header("location", "/v2/pay"))
        .mount(&server)
        .await;
    Mock::given(path("/v2/pay"))
        .and(header("x-api-key", "s3cret"))
        .and(header("x-sandbox", "sb-1"))
        .and(header("idempotency-key", "call_0123456789abcdef"))
        .and(body_json(json!({"amount": 5})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"paid": true})))
        .expect(1)
        .mount(&server)
        .await;
    let out = redirecting(&server, "sameOrigin")
        .execute(&scoped(), json!({"amount": 5}))
        .await;
    assert_eq!(out, Ok(json!({"paid": true})));
    // A loop is cut off.
    server.reset().await;
    Mock::given(path("/pay"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", "/pay"))
        .mount(&server)
        .await;
    let err = redirecting(&server, "sameOrigin")
        .execute(&scoped(), json!({}))
        .await
        .expect_err("loop");
    assert!(err.message().contains("more than 5 redirects"), "{err}");
}
