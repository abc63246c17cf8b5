//! `http_fetch`: GET a page from an allowed host and return its text. The built-in
//! `explore` agent has it when the agents file says which hosts it may reach
//! (`"httpFetch": {"allowHosts": ["docs.rs", "*.example.com"]}`); redirects are followed
//! only to allowed hosts. Bodies are read up to `maxBytes`; HTML is reduced to its text.

use std::time::Duration;

use baton_core::agent::HTTP_FETCH;
use baton_core::agents_file::HttpFetchSpec;
use baton_core::engine::MAX_OUTPUT_BYTES;
use baton_core::tools::{Effects, Tool, ToolContext, ToolError};
use serde_json::{Value, json};

use crate::http::root;

/// Default body cap and timeout.
pub const DEFAULT_MAX_BYTES: usize = 256 * 1024;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

pub struct HttpFetch {
    allow: Vec<String>,
    max_bytes: usize,
    timeout: Duration,
    http: reqwest::Client,
}

/// Whether `host` is one of `allow` (exact, or `*.suffix` for the suffix's subdomains).
fn allowed(allow: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    allow.iter().any(|a| match a.strip_prefix("*.") {
        Some(suffix) => host.ends_with(&format!(".{suffix}")),
        None => host == *a,
    })
}

impl HttpFetch {
    pub fn new(spec: &HttpFetchSpec) -> Result<Self, String> {
        if spec.allow_hosts.is_empty() {
            return Err("`allowHosts` is empty: name the hosts `http_fetch` may reach".into());
        }
        let allow: Vec<String> = spec
            .allow_hosts
            .iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .collect();
        let for_redirects = allow.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            let ok = attempt
                .url()
                .host_str()
                .is_some_and(|h| allowed(&for_redirects, h));
            if attempt.previous().len() >= 5 {
                attempt.error("more than 5 redirects")
            } else if ok {
                attempt.follow()
            } else {
                attempt.error("redirected to a host that is not allowed")
            }
        });
        let timeout = spec
            .timeout_seconds
            .filter(|s| *s > 0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
        let http = reqwest::Client::builder()
            .redirect(policy)
            .timeout(timeout)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            allow,
            max_bytes: spec
                .max_bytes
                .filter(|b| *b > 0)
                .unwrap_or(DEFAULT_MAX_BYTES),
            timeout,
            http,
        })
    }
}

#[async_trait::async_trait]
impl Tool for HttpFetch {
    fn name(&self) -> &str {
        HTTP_FETCH
    }
    fn description(&self) -> &str {
        "Fetch a web page or document by URL (GET) and return its text. Only some hosts \
         are allowed; the error says which."
    }
    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"url": {"type": "string", "minLength": 1}},
            "required": ["url"],
            "additionalProperties": false
        })
    }
    fn timeout(&self) -> Option<Duration> {
        // The request's own timeout ends it first, with a clearer message.
        Some(self.timeout + Duration::from_secs(5))
    }
    fn effects(&self) -> Effects {
        Effects::None
    }
    async fn execute(&self, _: &ToolContext, input: Value) -> Result<Value, ToolError> {
        let out: Result<Value, String> = async move {
            let raw = input["url"].as_str().unwrap_or_default();
            let url = reqwest::Url::parse(raw).map_err(|e| format!("`{raw}` is not a URL: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(format!(
                    "only http and https URLs can be fetched, not `{raw}`"
                ));
            }
            let host = url.host_str().unwrap_or_default();
            if !allowed(&self.allow, host) {
                return Err(format!(
                    "`{host}` is not an allowed host; allowed: {}",
                    self.allow.join(", ")
                ));
            }
            let mut resp = self
                .http
                .get(url.clone())
                .send()
                .await
                .map_err(|e| format!("cannot fetch {url}: {}", root(&e)))?;
            let status = resp.status();
            let kind = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_ascii_lowercase();
            let textual = kind.is_empty()
                || kind.starts_with("text/")
                || kind.contains("json")
                || kind.contains("xml")
                || kind.contains("javascript");
            if !textual {
                return Err(format!("{url} is `{kind}`, not text"));
            }
            let mut body = Vec::new();
            let mut cut = false;
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| format!("reading {url} failed: {}", root(&e)))?
            {
                let room = self.max_bytes - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    cut = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            let raw = String::from_utf8_lossy(&body);
            let mut text = if kind.contains("html") || (kind.is_empty() && raw.contains("<html")) {
                html_text(&raw)
            } else {
                raw.into_owned()
            };
            if text.len() > MAX_OUTPUT_BYTES {
                let mut end = MAX_OUTPUT_BYTES;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
                cut = true;
            }
            Ok(json!({"url": url.as_str(), "status": status.as_u16(), "text": text, "truncated": cut}))
        }
        .await;
        out.map_err(ToolError::Model)
    }
}

/// The text of an HTML page: no scripts, styles or tags, entities decoded, blank runs
/// collapsed, block elements on lines of their own.
pub fn html_text(html: &str) -> String {
    let lower = html.to_ascii_lowercase();
    let mut out = String::with_capacity(html.len() / 2);
    let mut i = 0;
    while i < html.len() {
        let rest = &html[i..];
        if rest.starts_with("<!--") {
            i += rest.find("-->").map_or(rest.len(), |e| e + 3);
            continue;
        }
        if rest.starts_with('<') {
            let end = rest.find('>').map_or(rest.len(), |e| e + 1);
            let tag = lower[i + 1..i + end.saturating_sub(1).max(1)]
                .trim_start_matches('/')
                .split(|c: char| c.is_whitespace() || c == '/' || c == '>')
                .next()
                .unwrap_or("")
                .to_owned();
            i += end;
            if matches!(tag.as_str(), "script" | "style" | "noscript" | "template")
                && !rest.starts_with("</")
            {
                let close = format!("</{tag}");
                i = lower[i..].find(&close).map_or(html.len(), |e| i + e);
                continue;
            }
            let block = matches!(
                tag.as_str(),
                "p" | "div"
                    | "br"
                    | "li"
                    | "tr"
                    | "h1"
                    | "h2"
                    | "h3"
                    | "h4"
                    | "h5"
                    | "h6"
                    | "section"
                    | "article"
                    | "header"
                    | "footer"
                    | "pre"
                    | "table"
                    | "ul"
                    | "ol"
                    | "title"
            );
            out.push(if block { '\n' } else { ' ' });
            continue;
        }
        let next = rest.find('<').unwrap_or(rest.len());
        out.push_str(&decode(&rest[..next]));
        i += next;
    }
    let mut text = String::with_capacity(out.len());
    for line in out.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if !words.is_empty() {
            text.push_str(&words.join(" "));
            text.push('\n');
        }
    }
    text.trim_end().to_owned()
}

fn decode(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    s.replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use wiremock::matchers::path;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn ctx() -> ToolContext {
        ToolContext::builder("r")
            .owner("o")
            .agent("explore")
            .call_id("c")
            .build()
    }

    #[test]
    fn html_becomes_its_text() {
        let html = "<html><head><title>T</title><style>p{}</style><script>var x = '<p>';</script>\
                    </head><body><h1>Hello &amp; welcome</h1><!-- no --><p>One\n  two</p>\
                    <ul><li>a</li><li>b</li></ul></body></html>";
        assert_eq!(html_text(html), "T\nHello & welcome\nOne\ntwo\na\nb");
    }

    #[test]
    fn hosts_match_exactly_or_by_wildcard() {
        let allow = vec!["docs.rs".to_owned(), "*.example.com".to_owned()];
        assert!(allowed(&allow, "docs.rs") && allowed(&allow, "DOCS.RS."));
        assert!(allowed(&allow, "a.example.com") && !allowed(&allow, "example.com"));
        assert!(!allowed(&allow, "evil-docs.rs") && !allowed(&allow, "example.com.evil"));
    }

    #[tokio::test]
    async fn fetches_allowed_pages_and_refuses_the_rest() {
        let server = MockServer::start().await;
        Mock::given(path("/page"))
            .respond_with(ResponseTemplate::new(200).set_body_raw("<p>Baton docs</p>", "text/html"))
            .mount(&server)
            .await;
        Mock::given(path("/big"))
            .respond_with(ResponseTemplate::new(200).set_body_string("x".repeat(5000)))
            .mount(&server)
            .await;
        Mock::given(path("/away"))
            .respond_with(
                ResponseTemplate::new(302).insert_header("location", "http://localhost:9/x"),
            )
            .mount(&server)
            .await;
        Mock::given(path("/img"))
            .respond_with(ResponseTemplate::new(200).insert_header("content-type", "image/png"))
            .mount(&server)
            .await;
        let spec: HttpFetchSpec = serde_json::from_value(json!({
            "allowHosts": ["127.0.0.1"], "maxBytes": 1000
        }))
        .expect("spec");
        let fetch = HttpFetch::new(&spec).expect("tool");
        let ctx = ctx();
        let get = |p: &str| fetch.execute(&ctx, json!({"url": format!("{}{p}", server.uri())}));
        let page = get("/page").await.expect("fetched");
        assert_eq!(page["text"], "Baton docs");
        assert_eq!(page["status"], 200);
        let big = get("/big").await.expect("fetched");
        assert_eq!(big["text"].as_str().map(str::len), Some(1000));
        assert_eq!(big["truncated"], true);
        let away = get("/away").await.expect_err("redirect off the list");
        assert!(away.message().contains("not allowed"), "{away}");
        assert!(
            get("/img")
                .await
                .is_err_and(|e| e.message().contains("not text"))
        );
        let other = fetch
            .execute(&ctx, json!({"url": "http://localhost:1/"}))
            .await
            .expect_err("host");
        assert!(
            other
                .message()
                .contains("`localhost` is not an allowed host"),
            "{other}"
        );
    }
}
