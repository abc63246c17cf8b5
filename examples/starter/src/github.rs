//! `github_read`: a file or a directory of the calling run's GitHub repository (its
//! `github: {repo, ref?}`), read through GitHub's REST API (`GET /repos/{repo}/contents/{path}`).
//!
//! - The API is `GITHUB_API_URL` (GitHub's own variable; `https://api.github.com` unset, a
//!   GitHub Enterprise server's `/api/v3` otherwise), with `GITHUB_TOKEN` as a bearer token
//!   when set (a private repository needs one).
//! - A path that may hold secrets (`.env*`, `.github` or `secrets` and anything under them,
//!   `*.pem`, `*.key`; in any case) is read only once a human approves the call, and a
//!   symbolic link GitHub resolves to such a path is not read through (the model is told to
//!   ask for the target, which is then approved or not).
//! - GitHub's reply is read to at most [`MAX_GITHUB_RESPONSE_BYTES`]; a directory's listing gives the
//!   model at most [`MAX_LISTED`] names and its table at most what a widget holds, saying
//!   how many there were.
//! - A file's text is the result (its first 64 KiB; the model is told when there is more)
//!   and the whole file is kept beside it, as a file of the run; a card says what was read.
//!   A directory is a table of its entries.

use std::time::Duration;

use base64::Engine;
use baton_sdk::prelude::*;
use baton_sdk::{MAX_OUTPUT_BYTES, serde_json};

/// GitHub's contents API answers files of at most this size with their content.
const GITHUB_MAX_CONTENT_BYTES: usize = 1024 * 1024;

/// The most of GitHub's reply read: a 1 MB file as base64 in JSON, or a directory's listing
/// (GitHub lists at most 1,000 entries, each about 600 bytes of JSON). A larger reply is an
/// error, found without holding it.
pub const MAX_GITHUB_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// The most names of a directory the model is given.
pub const MAX_LISTED: usize = 1000;

/// The most bytes of a directory's table (a widget holds 32 KB with its envelope).
const MAX_TABLE_BYTES: usize = 30 * 1024;

/// Reads the run's repository (see the module's documentation).
pub struct RepoFiles {
    api: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl RepoFiles {
    /// Against `api` (GitHub's REST API's base URL), with `token` if any.
    pub fn new(api: &str, token: Option<String>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .user_agent("baton-github-read")
            .build()
            .unwrap_or_default();
        Self {
            api: api.trim_end_matches('/').to_owned(),
            token,
            http,
        }
    }

    /// Against `GITHUB_API_URL` (default `https://api.github.com`), with `GITHUB_TOKEN`.
    pub fn from_env() -> Self {
        let api = std::env::var("GITHUB_API_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "https://api.github.com".into());
        let token = std::env::var("GITHUB_TOKEN").ok().filter(|t| !t.is_empty());
        Self::new(&api, token)
    }
}

/// `path` as a path within the repository: its segments between `/`s (none: the root),
/// each a plain name. `.`, `..`, an empty segment and `\`, `%`, `?`, `#` or a control
/// character are refused: a URL parser would read them as another path (or query), and
/// [`sensitive`] must see the path GitHub is asked for.
pub fn segments(path: &str) -> Result<Vec<&str>, String> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    trimmed
        .split('/')
        .map(|s| {
            let plain = !s.is_empty()
                && s != "."
                && s != ".."
                && !s
                    .chars()
                    .any(|c| matches!(c, '\\' | '%' | '?' | '#') || c.is_control());
            plain
                .then_some(s)
                .ok_or_else(|| format!("`{path}` is not a path within the repository (`{s}`)"))
        })
        .collect()
}

/// Whether `path` may hold secrets (a human approves reading it). A path that is not one
/// within the repository ([`segments`]) is refused when read, asked about or not.
/// Names are compared in any case: `.ENV` and `Secrets/` hold what `.env` and `secrets/` do
/// (and on a case-insensitive checkout they are the same files).
pub fn sensitive(path: &str) -> bool {
    let Ok(segments) = segments(path) else {
        return false;
    };
    let lower: Vec<String> = segments.iter().map(|s| s.to_lowercase()).collect();
    let file = lower.last().map(String::as_str).unwrap_or_default();
    lower.first().is_some_and(|s| s == ".github")
        || lower.iter().any(|s| s == "secrets")
        || file.starts_with(".env")
        || file.ends_with(".pem")
        || file.ends_with(".key")
}

/// A reply's body, read to at most `max` bytes: a larger one is an error, found as it
/// arrives (it is never held whole).
async fn read_capped(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("GitHub's reply broke off: {e}"))?
    {
        if body.len() + chunk.len() > max {
            return Err(format!(
                "GitHub's reply is larger than {max} bytes: not read"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `github_read`'s input: one path of the run's repository.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Read {
    /// Relative to the repository's root ("" for the root).
    #[schemars(length(max = 1024))]
    pub path: String,
}

impl TypedTool for RepoFiles {
    type Input = Read;
    type Output = Value;

    fn name(&self) -> &str {
        "github_read"
    }

    fn description(&self) -> &str {
        "Read a file, or list a directory, of the run's GitHub repository at its ref. \
         `path` is relative to the repository's root (\"\" for the root)."
    }

    fn effects(&self) -> Effects {
        Effects::None
    }

    fn needs_approval(&self, input: &Read) -> bool {
        sensitive(&input.path)
    }

    fn approval_reason(&self, input: &Read) -> Option<String> {
        let path = &input.path;
        sensitive(path).then(|| format!("`{path}` may hold secrets"))
    }

    async fn call(&self, ctx: &ToolContext, input: Read) -> Result<Value, ToolError> {
        let github = ctx.scope().github.as_ref().ok_or(
            "this run has no GitHub repository: start it (or its parent's spawn_subagent call) \
             with `github: {repo, ref}`",
        )?;
        let parts = segments(&input.path)?;
        let path = parts.join("/");
        let path = path.as_str();
        // Built segment by segment (each percent-encoded as it needs), never by splicing text.
        let mut url = reqwest::Url::parse(&self.api)
            .map_err(|e| format!("GITHUB_API_URL {:?} is not a URL: {e}", self.api))?;
        url.path_segments_mut()
            .map_err(|()| format!("GITHUB_API_URL {:?} cannot have a path", self.api))?
            .pop_if_empty()
            .push("repos")
            .extend(github.repo.split('/'))
            .push("contents")
            .extend(&parts);
        if let Some(r) = &github.git_ref {
            url.query_pairs_mut().append_pair("ref", r);
        }
        let mut request = self
            .http
            .get(url)
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28");
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let at = format!(
            "{}@{}",
            github.repo,
            github.git_ref.as_deref().unwrap_or("HEAD")
        );
        // GitHub unreachable: it may answer a moment later, and a read is safe to run again,
        // so the step is tried again rather than the model told.
        let resp = request.send().await.map_err(|e| {
            ToolError::retry(format!("GitHub did not answer for `{path}` in {at}: {e}"))
        })?;
        let status = resp.status();
        let body = read_capped(resp, MAX_GITHUB_RESPONSE_BYTES)
            .await
            .map_err(|e| format!("`{path}` in {at}: {e}"))?;
        let body: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("GitHub answered {status} without JSON: {e}"))?;
        if !status.is_success() {
            let why = body["message"].as_str().unwrap_or("no message");
            let said = format!("GitHub answered {status} for `{path}` in {at}: {why}");
            // Its own trouble (a 5xx) may pass; a 404 or a 403 is the model's to hear.
            return Err(match status.is_server_error() {
                true => ToolError::retry(said),
                false => ToolError::model(said),
            });
        }
        if let Some(entries) = body.as_array() {
            let mut rows = Vec::new();
            let mut bytes = 0;
            for e in entries {
                let row = json!([e["name"], e["type"], e["size"]]);
                bytes += row.to_string().len() + 1;
                if bytes > MAX_TABLE_BYTES {
                    break;
                }
                rows.push(row);
            }
            let mut table = json!({"columns": ["name", "type", "size"], "rows": rows});
            if rows_cut(&table, entries.len()) {
                table["note"] = json!(format!(
                    "the first {} of {} entries",
                    table["rows"].as_array().map_or(0, Vec::len),
                    entries.len()
                ));
            }
            ctx.widget("table", table)?;
            let names: Vec<&Value> = entries
                .iter()
                .take(MAX_LISTED)
                .map(|e| &e["name"])
                .collect();
            let mut out = json!({"path": path, "ref": at, "entries": names});
            if entries.len() > MAX_LISTED {
                out["truncated"] = json!(true);
                out["note"] = json!(format!(
                    "the first {MAX_LISTED} of {} entries: read a subdirectory for the rest",
                    entries.len()
                ));
            }
            return Ok(out);
        }
        // GitHub answers a symbolic link to a file with that file: its `path` is the
        // target's. One that may hold secrets is read only when asked for by its own path,
        // which is approved (or not) as such.
        let resolved = body["path"].as_str().unwrap_or(path);
        if resolved != path && sensitive(resolved) && !sensitive(path) {
            return Err(format!(
                "`{path}` in {at} is a link to `{resolved}`, which may hold secrets: not read \
                 through the link (ask for `{resolved}` itself, which a human approves)"
            )
            .into());
        }
        if body["type"] == "symlink" {
            let target = body["target"].as_str().unwrap_or_default();
            return Ok(json!({"path": path, "ref": at, "symlink": target}));
        }
        if body["type"] != "file" {
            return Err(format!("`{path}` in {at} is a {}, not a file", body["type"]).into());
        }
        let size = body["size"].as_u64().unwrap_or(0) as usize;
        if size > GITHUB_MAX_CONTENT_BYTES || body["encoding"] != "base64" {
            return Err(format!(
                "`{path}` in {at} is {size} bytes: larger than the contents API returns"
            )
            .into());
        }
        let packed: String = body["content"]
            .as_str()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(packed)
            .map_err(|e| format!("GitHub sent `{path}` in a form that does not decode: {e}"))?;
        let name = path.rsplit('/').next().unwrap_or(path);
        let summary = format!("`{path}` of {at}, {} bytes", bytes.len());
        ctx.widget(
            "card",
            json!({"path": path, "ref": at, "bytes": bytes.len(), "sha": body["sha"]}),
        )?;
        let text =
            String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_OUTPUT_BYTES)]).into_owned();
        let cut = bytes.len() > MAX_OUTPUT_BYTES;
        ctx.file(name, media_type(name), bytes, &summary)?;
        Ok(json!({"path": path, "ref": at, "text": text, "truncated": cut}))
    }
}

/// Whether a table holds fewer rows than there were entries.
fn rows_cut(table: &Value, entries: usize) -> bool {
    table["rows"].as_array().map_or(0, Vec::len) < entries
}

/// The media type a file is kept as, by its extension.
fn media_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, e)| e) {
        Some("md") => "text/markdown",
        Some("json") => "application/json",
        Some("csv") => "text/csv",
        Some("html") => "text/html",
        Some("png") => "image/png",
        Some("rs" | "py" | "js" | "ts" | "toml" | "yaml" | "yml" | "txt" | "sh") => "text/plain",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_sdk::{GithubRepo, Scope};
    use wiremock::matchers::{header, method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    #[test]
    fn its_schema_is_derived_from_its_input_type() {
        let tool = Typed(RepoFiles::new("http://127.0.0.1:9", None));
        assert_eq!(
            tool.schema(),
            json!({"type": "object", "description": "`github_read`'s input: one path of the run's repository.",
                   "properties": {"path": {"type": "string", "maxLength": 1024,
                       "description": "Relative to the repository's root (\"\" for the root)."}},
                   "required": ["path"], "additionalProperties": false})
        );
        assert!(tool.needs_approval(&json!({"path": ".env"})));
        // An input that does not parse is refused before any approval is asked.
        assert!(!tool.needs_approval(&json!({"path": 7})));
    }

    fn ctx(git_ref: Option<&str>) -> ToolContext {
        ToolContext::builder("run_1")
            .agent("explore")
            .call_id("call_1")
            .scope(Scope {
                github: Some(GithubRepo {
                    repo: "acme/shop".into(),
                    git_ref: git_ref.map(str::to_owned),
                }),
                ..Scope::default()
            })
            .build()
    }

    /// A stand-in of GitHub's contents API, as GitHub documents its answers.
    async fn github() -> MockServer {
        let server = MockServer::start().await;
        let readme = base64::engine::general_purpose::STANDARD.encode("# Shop\nSells things.\n");
        // GitHub wraps the base64 at 60 columns.
        let wrapped = format!("{}\n{}", &readme[..20], &readme[20..]);
        Mock::given(method("GET"))
            .and(path("/repos/acme/shop/contents/README.md"))
            .and(query_param("ref", "main"))
            .and(header("authorization", "Bearer t0k"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "type": "file", "encoding": "base64", "size": 21, "name": "README.md",
                "path": "README.md", "sha": "3d21ec53a331a6f037a91c368710b99387d012c1",
                "content": wrapped})))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/repos/acme/shop/contents/src"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!([
                {"type": "file", "name": "main.rs", "path": "src/main.rs", "size": 120},
                {"type": "dir", "name": "api", "path": "src/api", "size": 0}])))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/repos/acme/shop/contents/nope"))
            .respond_with(ResponseTemplate::new(404).set_body_json(json!({
                "message": "Not Found",
                "documentation_url": "https://docs.github.com/rest/repos/contents#get-repository-content"})))
            .mount(&server)
            .await;
        server
    }

    #[tokio::test]
    async fn a_file_is_its_text_with_a_card_and_the_whole_file_beside_it() {
        let server = github().await;
        let tool = Typed(RepoFiles::new(&server.uri(), Some("t0k".into())));
        let ctx = ctx(Some("main"));
        let out = tool
            .execute(&ctx, json!({"path": "README.md"}))
            .await
            .expect("read");
        assert_eq!(out["text"], "# Shop\nSells things.\n");
        assert_eq!(out["ref"], "acme/shop@main");
        assert_eq!(out["truncated"], false);
        let (widgets, files) = (ctx.take_widgets(), ctx.take_files());
        assert_eq!(widgets.len(), 1);
        assert_eq!(widgets[0].kind, "card");
        assert_eq!(widgets[0].data["bytes"], 21);
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].name, "README.md");
        assert_eq!(files[0].media_type, "text/markdown");
        assert_eq!(files[0].bytes, b"# Shop\nSells things.\n");
    }

    #[tokio::test]
    async fn a_directory_is_a_table_and_errors_say_what_github_answered() {
        let server = github().await;
        let tool = Typed(RepoFiles::new(&server.uri(), None));
        let ctx = ctx(None);
        let out = tool
            .execute(&ctx, json!({"path": "/src/"}))
            .await
            .expect("list");
        assert_eq!(out["entries"], json!(["main.rs", "api"]));
        assert_eq!(out["ref"], "acme/shop@HEAD");
        let widgets = ctx.take_widgets();
        assert_eq!(widgets[0].kind, "table");
        assert_eq!(widgets[0].data["rows"][1], json!(["api", "dir", 0]));
        let err = tool
            .execute(&ctx, json!({"path": "nope"}))
            .await
            .unwrap_err();
        assert!(
            err.message().contains("404") && err.message().contains("Not Found"),
            "{err}"
        );
        // A 404 is the model's to hear: it asked for what is not there.
        assert!(matches!(err, ToolError::Model(_)), "{err:?}");
        // Paths a URL parser would read as another repository's, or as a query: refused
        // before any request.
        for p in [
            "a/../../etc",
            "..\\..\\other\\private\\contents\\x",
            "%2e%2e/%2e%2e/other/private/contents/x",
            "./.github/x",
            "a?ref=evil",
            "a#b",
            "a//b",
        ] {
            let err = tool.execute(&ctx, json!({"path": p})).await.unwrap_err();
            assert!(
                err.message().contains("not a path within the repository"),
                "{p}: {err}"
            );
        }
        let no_repo = ToolContext::builder("run_1")
            .owner("o")
            .agent("explore")
            .call_id("call_1")
            .build();
        let err = tool
            .execute(&no_repo, json!({"path": "x"}))
            .await
            .unwrap_err();
        assert!(err.message().contains("no GitHub repository"), "{err}");
    }

    #[test]
    fn paths_that_may_hold_secrets_need_an_approval() {
        let tool = Typed(RepoFiles::new("http://127.0.0.1:9", None));
        for p in [
            ".env",
            "app/.env.local",
            ".github/workflows/ci.yml",
            "secrets/db",
            "tls/server.pem",
        ] {
            assert!(tool.needs_approval(&json!({"path": p})), "{p}");
            assert!(
                tool.approval_reason(&json!({"path": p}))
                    .is_some_and(|r| r.contains(p))
            );
        }
        for p in ["README.md", "src/env.rs", "docs/secrets.md"] {
            assert!(!tool.needs_approval(&json!({"path": p})), "{p}");
        }
        // In any case, and the directories themselves (a listing names what they hold).
        for p in [
            ".ENV",
            "App/.Env.Local",
            "Secrets/db",
            "SECRETS",
            ".github",
            ".GitHub/x",
            "deploy/secrets",
            "TLS/SERVER.PEM",
        ] {
            assert!(tool.needs_approval(&json!({"path": p})), "{p}");
        }
    }

    #[tokio::test]
    async fn a_link_to_a_secret_is_not_read_through_and_a_huge_listing_is_cut() {
        let server = MockServer::start().await;
        // GitHub answers a symbolic link to a file with the file: its `path` is the target.
        let env = base64::engine::general_purpose::STANDARD.encode("DB_PASSWORD=hunter2\n");
        Mock::given(path("/repos/acme/shop/contents/config/app.txt"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "type": "file", "encoding": "base64", "size": 20, "name": ".env",
                "path": ".env", "sha": "x", "content": env})))
            .mount(&server)
            .await;
        let entries: Vec<Value> = (0..10_000)
            .map(|i| {
                json!({"type": "file", "name": format!("file-{i:05}.txt"),
                "path": format!("big/file-{i:05}.txt"), "size": i})
            })
            .collect();
        Mock::given(path("/repos/acme/shop/contents/big"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!(entries)))
            .mount(&server)
            .await;
        Mock::given(path("/repos/acme/shop/contents/huge.bin"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_string("x".repeat(MAX_GITHUB_RESPONSE_BYTES + 1)),
            )
            .mount(&server)
            .await;
        let tool = Typed(RepoFiles::new(&server.uri(), None));
        let ctx = ctx(None);
        let err = tool
            .execute(&ctx, json!({"path": "config/app.txt"}))
            .await
            .unwrap_err();
        assert!(
            err.message().contains("a link to `.env`") && !err.message().contains("hunter2"),
            "{err}"
        );
        assert!(ctx.take_files().is_empty() && ctx.take_widgets().is_empty());

        let out = tool
            .execute(&ctx, json!({"path": "big"}))
            .await
            .expect("a listing");
        assert_eq!(out["entries"].as_array().map(Vec::len), Some(MAX_LISTED));
        assert_eq!(out["truncated"], true);
        assert!(
            out["note"]
                .as_str()
                .is_some_and(|n| n.contains("of 10000 entries")),
            "{out}"
        );
        let widgets = ctx.take_widgets();
        assert_eq!(widgets.len(), 1, "the table fits a widget");
        assert!(widgets[0].data.to_string().len() <= 32 * 1024);
        assert!(
            widgets[0].data["note"]
                .as_str()
                .is_some_and(|n| n.contains("of 10000"))
        );

        let err = tool
            .execute(&ctx, json!({"path": "huge.bin"}))
            .await
            .unwrap_err();
        assert!(err.message().contains("larger than"), "{err}");
    }

    /// GitHub's own trouble (unreachable, a 5xx) may pass: the step is tried again, not the
    /// model told (the tool only reads, so running it again is safe).
    #[tokio::test]
    async fn githubs_own_trouble_is_retried_not_told() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(
                ResponseTemplate::new(503).set_body_json(json!({"message": "Unavailable"})),
            )
            .mount(&server)
            .await;
        let tool = Typed(RepoFiles::new(&server.uri(), None));
        let err = tool
            .execute(&ctx(None), json!({"path": "README.md"}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::Retry(_)), "{err:?}");
        // Nothing listens: the same.
        let gone = Typed(RepoFiles::new("http://127.0.0.1:9", None));
        let err = gone
            .execute(&ctx(None), json!({"path": "README.md"}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::Retry(_)), "{err:?}");
    }
}
