//! An HTTP tool: `{"url", "description", "schema", "timeoutSeconds", "headers"}` in the
//! agents file. Baton POSTs the validated input as JSON with `Idempotency-Key` set to the
//! tool call's id, which is the same on every retry of the step, so a receiver can make a
//! retried call safe. A 2xx JSON body is the result; anything else is an error result that
//! says what came back.

use std::time::Duration;

use baton_core::agents_file::{HttpToolSpec, expand};
use baton_core::tools::{Tool, ToolContext};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

/// The most of a reply read; a larger one is an error result (it would be cut anyway).
pub const MAX_REPLY_BYTES: usize = 1024 * 1024;

pub struct HttpTool {
    name: String,
    description: String,
    schema: Value,
    url: reqwest::Url,
    timeout: Option<Duration>,
    http: reqwest::Client,
}

impl HttpTool {
    pub fn new(
        name: &str,
        spec: &HttpToolSpec,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let url = reqwest::Url::parse(&spec.url)
            .map_err(|e| format!("`url` {:?} is not a URL: {e}", spec.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("`url` {:?} must be http:// or https://", spec.url));
        }
        if spec.timeout_seconds == Some(0) {
            return Err("`timeoutSeconds` must be at least 1".into());
        }
        let headers = headers(&spec.headers, lookup)?;
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            name: name.to_owned(),
            description: spec.description.clone(),
            schema: spec.schema.clone(),
            url,
            timeout: spec.timeout_seconds.map(Duration::from_secs),
            http,
        })
    }
}

/// Header names and values, `${VAR}` expanded; a bad one is named.
pub fn headers(
    spec: &std::collections::BTreeMap<String, String>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (k, v) in spec {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("`{k}` is not a valid header name"))?;
        let value = expand(v, lookup).map_err(|e| format!("header `{k}`: {e}"))?;
        let value = HeaderValue::from_str(&value)
            .map_err(|_| format!("header `{k}` has characters a header cannot carry"))?;
        map.insert(name, value);
    }
    Ok(map)
}

#[async_trait::async_trait]
impl Tool for HttpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn schema(&self) -> Value {
        self.schema.clone()
    }
    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
    async fn execute(&self, ctx: &ToolContext, input: Value) -> Result<Value, String> {
        let host = self.url.host_str().unwrap_or_default().to_owned();
        let resp = self
            .http
            .post(self.url.clone())
            .header("idempotency-key", &ctx.idempotency_key)
            .json(&input)
            .send()
            .await
            .map_err(|e| format!("`{}`: cannot reach {host}: {}", self.name, root(&e)))?;
        let status = resp.status();
        let body = read_capped(resp, MAX_REPLY_BYTES)
            .await
            .map_err(|e| format!("`{}`: {e}", self.name))?;
        if !status.is_success() {
            let text: String = String::from_utf8_lossy(&body).chars().take(500).collect();
            return Err(format!("`{}` answered HTTP {status}: {text}", self.name));
        }
        serde_json::from_slice(&body).map_err(|e| {
            format!(
                "`{}` answered {status} with a body that is not JSON: {e}",
                self.name
            )
        })
    }
}

/// A body read to at most `max` bytes; more is an error.
pub async fn read_capped(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading the reply failed: {}", root(&e)))?
    {
        if body.len() + chunk.len() > max {
            return Err(format!("the reply is larger than {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The innermost cause of a request error (`connection refused`, not "error sending request").
pub fn root(e: &reqwest::Error) -> String {
    let mut root: &dyn std::error::Error = e;
    while let Some(next) = root.source() {
        root = next;
    }
    if e.is_timeout() {
        format!("timed out ({root})")
    } else {
        root.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wiremock::matchers::{body_json, header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn ctx() -> ToolContext {
        ToolContext::new("run_1", "o", "ops", "call_7")
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
        let mut ctx = ctx();
        ctx.idempotency_key = "call_0123456789abcdef".into();
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
        assert!(err.contains("503") && err.contains("maintenance"), "{err}");
        let err = tool(format!("{}/html", server.uri()))
            .execute(&ctx(), json!({}))
            .await
            .expect_err("not JSON");
        assert!(err.contains("not JSON"), "{err}");
        let err = tool("http://127.0.0.1:9/x".into())
            .execute(&ctx(), json!({}))
            .await
            .expect_err("refused");
        assert!(err.contains("cannot reach 127.0.0.1"), "{err}");
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
    }
}
