//! An HTTP tool: `{"url", "description", "schema", "timeoutSeconds", "headers", "effects"}`
//! in the agents file. Baton POSTs the validated input as JSON with `Idempotency-Key` set to
//! the call's key (derived from the run and the committed call: the same on every run of
//! that call, unique to it), so a receiver can make a repeated call safe: its effects are
//! `idempotent` unless the file says otherwise. A 2xx JSON body is the result;
//! anything else is an error result that says what came back.
//!
//! An answer of [`OUTPUTS_MEDIA_TYPE`] carries widgets and files beside its result.
//!
//! `${VAR}` in the URL and headers is read once, at start-up; `${run.sandboxId}`,
//! `${run.githubRepo}` and `${run.githubRef}` are the calling run's, filled in at each call
//! (a run without the value gets an error result naming it).

use std::collections::BTreeMap;
use std::time::Duration;

use baton_core::agents_file::{HttpToolSpec, Redirects, expand};
use baton_core::scope::RUN_VARS;
use baton_core::tools::{Effects, Tool, ToolContext, ToolError};

use crate::vars::{expand_env, expand_run, headers};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

/// The most of a reply read; a larger one is an error result (it would be cut anyway).
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

pub struct HttpTool {
    name: String,
    description: String,
    schema: Value,
    /// The URL, `${VAR}` filled in, `${run.…}` not yet.
    url: String,
    /// The headers that name a run variable, `${VAR}` filled in (the others are the
    /// client's defaults).
    run_headers: Vec<(HeaderName, String)>,
    /// The headers that do not (sent to the tool's origin only).
    fixed_headers: HeaderMap,
    timeout: Option<Duration>,
    effects: Effects,
    redirects: Redirects,
    /// Follows no redirect itself: [`HttpTool::execute`] decides each.
    http: reqwest::Client,
}

/// The most redirects a call follows.
const MAX_REDIRECTS: usize = 5;

impl HttpTool {
    pub fn new(
        name: &str,
        spec: &HttpToolSpec,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let url = expand_env(&spec.url, lookup).map_err(|e| format!("`url`: {e}"))?;
        // Checked with a stand-in for each run variable: a run's own values are plain names.
        let sample = expand(&url, &|k| RUN_VARS.contains(&k).then(|| "x".to_owned()))?;
        let parsed = reqwest::Url::parse(&sample)
            .map_err(|e| format!("`url` {:?} is not a URL: {e}", spec.url))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("`url` {:?} must be http:// or https://", spec.url));
        }
        if spec.timeout_seconds == Some(0) {
            return Err("`timeoutSeconds` must be at least 1".into());
        }
        let (per_run, fixed): (BTreeMap<_, _>, BTreeMap<_, _>) = spec
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .partition(|(_, v)| RUN_VARS.iter().any(|r| v.contains(&format!("${{{r}}}"))));
        let mut run_headers = Vec::new();
        for (k, v) in per_run {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("`{k}` is not a valid header name"))?;
            let value = expand_env(&v, lookup).map_err(|e| format!("header `{k}`: {e}"))?;
            run_headers.push((name, value));
        }
        let fixed_headers = headers(&fixed, lookup)?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            name: name.to_owned(),
            description: spec.description.clone(),
            schema: spec.schema.clone(),
            url,
            run_headers,
            fixed_headers,
            timeout: spec.timeout_seconds.map(Duration::from_secs),
            // It is sent the call's key: a receiver that deduplicates on it makes a repeat safe.
            effects: spec.effects.unwrap_or(Effects::Idempotent),
            redirects: spec.redirects,
            http,
        })
    }
}

impl HttpTool {
    /// POSTs `input` to `url` with `headers`, following redirects as the tool allows: within
    /// the URL's origin as sent; to another origin only when its `redirects` is `any`, and
    /// then with none of `headers` (its secrets, per-run values and key stay with the origin
    /// the agents file named). A 303, or a 301 or 302 (as browsers do), goes on as a GET
    /// without the body; a 307 or 308 repeats the POST.
    async fn send(
        &self,
        mut url: reqwest::Url,
        mut headers: HeaderMap,
        input: &Value,
    ) -> Result<reqwest::Response, String> {
        let name = &self.name;
        let mut post = true;
        for _ in 0..=MAX_REDIRECTS {
            let host = url.host_str().unwrap_or_default().to_owned();
            let request = if post {
                self.http.post(url.clone()).json(input)
            } else {
                self.http.get(url.clone())
            };
            let resp = request
                .headers(headers.clone())
                .send()
                .await
                .map_err(|e| format!("`{name}`: cannot reach {host}: {}", root(&e)))?;
            let status = resp.status();
            let location = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok());
            let (true, Some(location)) = (status.is_redirection(), location) else {
                return Ok(resp);
            };
            let next = url.join(location).map_err(|e| {
                format!("`{name}` answered HTTP {status} with a Location that is not a URL: {e}")
            })?;
            if !matches!(next.scheme(), "http" | "https") {
                return Err(format!(
                    "`{name}` answered HTTP {status} to a {} URL: not followed",
                    next.scheme()
                ));
            }
            if next.origin() != url.origin() {
                let to = next.origin().ascii_serialization();
                if self.redirects != Redirects::Any {
                    return Err(format!(
                        "`{name}` answered HTTP {status} to another origin ({to}): not followed \
                         (an HTTP tool follows redirects within its URL's origin unless its \
                         `redirects` is \"any\")"
                    ));
                }
                headers.clear();
            }
            if status.as_u16() != 307 && status.as_u16() != 308 {
                post = false;
            }
            url = next;
        }
        Err(format!(
            "`{name}`: more than {MAX_REDIRECTS} redirects: not followed"
        ))
    }
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
    fn effects(&self) -> Effects {
        self.effects
    }
    async fn execute(&self, ctx: &ToolContext, input: Value) -> Result<Value, ToolError> {
        let out: Result<Value, String> = async move {
            let name = &self.name;
            let url =
                expand_run(&self.url, ctx.scope()).map_err(|e| format!("`{name}`: `url`: {e}"))?;
            // (The URL is not shown: a `${VAR}` in it may be a secret.)
            let url = reqwest::Url::parse(&url).map_err(|e| {
                format!("`{name}`: its url, filled in for this run, is not a URL: {e}")
            })?;
            let mut sent = self.fixed_headers.clone();
            sent.insert(
                HeaderName::from_static("idempotency-key"),
                HeaderValue::from_str(ctx.idempotency_key())
                    .map_err(|_| format!("`{name}`: its idempotency key cannot be a header"))?,
            );
            for (header, value) in &self.run_headers {
                let value = expand_run(value, ctx.scope())
                    .map_err(|e| format!("`{name}`: header `{header}`: {e}"))?;
                let value = HeaderValue::from_str(&value)
                    .map_err(|_| format!("`{name}`: header `{header}` cannot carry {value:?}"))?;
                sent.insert(header.clone(), value);
            }
            let resp = self.send(url, sent, &input).await?;
            let status = resp.status();
            let outputs = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|t| t.starts_with(OUTPUTS_MEDIA_TYPE));
            let max = if outputs {
                MAX_OUTPUTS_BYTES
            } else {
                MAX_RESPONSE_BYTES
            };
            let body = read_capped(resp, max)
                .await
                .map_err(|e| format!("`{}`: {e}", self.name))?;
            if !status.is_success() {
                let text: String = String::from_utf8_lossy(&body).chars().take(500).collect();
                return Err(format!("`{}` answered HTTP {status}: {text}", self.name));
            }
            let body: Value = serde_json::from_slice(&body).map_err(|e| {
                format!(
                    "`{}` answered {status} with a body that is not JSON: {e}",
                    self.name
                )
            })?;
            if !outputs {
                return Ok(body);
            }
            let outputs: Outputs = serde_json::from_value(body).map_err(|e| {
                format!("`{name}` answered `{OUTPUTS_MEDIA_TYPE}` that does not read: {e}")
            })?;
            // All of them checked first, on a scratch context: an answer one of whose outputs is
            // refused is an error result with none of them kept.
            let scratch = ToolContext::default();
            for w in outputs.widgets {
                match &w.fallback {
                    Some(text) => scratch.widget_with_fallback(&w.kind, w.data, text),
                    None => scratch.widget(&w.kind, w.data),
                }
                .map_err(|e| format!("`{name}`: widget `{}`: {e}", w.kind))?;
            }
            for f in outputs.files {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(f.content_base64.trim())
                    .map_err(|e| format!("`{name}`: file `{}` is not base64: {e}", f.name))?;
                scratch
                    .file(&f.name, &f.media_type, bytes, &f.summary)
                    .map_err(|e| format!("`{name}`: file `{}`: {e}", f.name))?;
            }
            for w in scratch.take_widgets() {
                match &w.fallback {
                    Some(text) => ctx.widget_with_fallback(&w.kind, w.data, text)?,
                    None => ctx.widget(&w.kind, w.data)?,
                }
            }
            for f in scratch.take_files() {
                ctx.file(&f.name, &f.media_type, f.bytes, &f.summary)?;
            }
            Ok(outputs.result)
        }
        .await;
        out.map_err(ToolError::Model)
    }
}

/// The media type of an answer that carries widgets and files beside its result:
/// `{"result": any, "widgets"?: [{"kind", "data", "fallback"?}], "files"?: [{"name", "mediaType",
/// "contentBase64", "summary"}]}`. Any other JSON answer is the result itself.
pub const OUTPUTS_MEDIA_TYPE: &str = "application/vnd.baton.tool-result+json";

/// The most of such an answer read: four files of 5 MB, as base64, and the rest.
pub const MAX_OUTPUTS_BYTES: usize = 28 * 1024 * 1024;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Outputs {
    result: Value,
    #[serde(default)]
    widgets: Vec<OutputWidget>,
    #[serde(default)]
    files: Vec<OutputFile>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputWidget {
    kind: String,
    data: Value,
    #[serde(default)]
    fallback: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct OutputFile {
    name: String,
    media_type: String,
    content_base64: String,
    summary: String,
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
mod tests;
