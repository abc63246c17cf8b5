//! The client commands: talk to a Baton API, print a summary (or the JSON with --json).
//!
//! Exit codes: 0 done, 2 bad input or a request the API refused (4xx), 1 anything else
//! (unreachable server, 5xx); `run --wait` and `watch` add theirs (3 the run ended without
//! completing, 4 still going at the timeout, 5 waiting for a human).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::{Command, refuse};

mod render;
mod watch;

use render::{entry_line, progress, render_cta, render_run, short};

struct Api {
    http: reqwest::Client,
    base: String,
    /// `--token` or `BATON_TOKEN`, else read from this file (`baton dev`'s) at each request:
    /// a server started a moment ago (`baton dev &`) may not have written it yet.
    token: Token,
}

enum Token {
    Given(String),
    File(std::path::PathBuf),
}

impl Token {
    fn get(&self) -> Option<String> {
        match self {
            Self::Given(t) => Some(t.clone()),
            Self::File(path) => std::fs::read_to_string(path)
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty()),
        }
    }
}

enum Failure {
    /// 4xx: the request was refused; the message is the API's.
    Refused(String),
    /// Unreachable, 5xx, or an unreadable answer.
    Broken(String),
    /// `run --wait`: the run ended without completing (failed, expired, cancelled).
    Ended,
    /// `run --wait`: the run was still going when the timeout came.
    TimedOut(String),
    /// `watch`, `run --follow`: the run waits for a human's answer.
    Parked,
}

impl Api {
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Failure> {
        let url = format!("{}{}", self.base.trim_end_matches('/'), path);
        // A server on this machine may be starting (`baton dev &`, then a command): give it
        // a few seconds to listen before saying it cannot be reached.
        let local = reqwest::Url::parse(&url)
            .is_ok_and(|u| matches!(u.host_str(), Some("127.0.0.1" | "localhost" | "[::1]")));
        let deadline = Instant::now() + Duration::from_secs(if local { 10 } else { 0 });
        let resp = loop {
            let mut rb = self.http.request(method.clone(), &url);
            if let Some(t) = self.token.get() {
                rb = rb.bearer_auth(t);
            }
            if let Some(b) = &body {
                rb = rb.json(b);
            }
            match rb.send().await {
                Err(e) if e.is_connect() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => break other,
            }
        }
        .map_err(|e| Failure::Broken(format!("cannot reach {url}: {e}")))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| Failure::Broken(format!("reading the answer failed: {e}")))?;
        if status.is_success() {
            return Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)));
        }
        Err(failure(status, &text))
    }
}

/// What a refused or failed request's answer says.
fn failure(status: StatusCode, text: &str) -> Failure {
    let value: Value = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into()));
    let message = match &value["error"] {
        Value::Object(e) => format!(
            "{} ({}): {}",
            status.as_u16(),
            e.get("code").and_then(Value::as_str).unwrap_or("error"),
            e.get("message").and_then(Value::as_str).unwrap_or("")
        ),
        _ => format!("{status}: {value}"),
    };
    if status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT {
        Failure::Refused(message)
    } else {
        Failure::Broken(message)
    }
}

pub async fn run(
    endpoint: &str,
    token: Option<String>,
    data: &Path,
    json: bool,
    command: Command,
) -> ExitCode {
    let token = match token {
        Some(t) => Token::Given(t),
        None => Token::File(baton_dev::token_path(data)),
    };
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            eprintln!("baton: cannot build an HTTP client: {e}");
            return ExitCode::FAILURE;
        }
    };
    let api = Api {
        http,
        base: endpoint.to_owned(),
        token,
    };
    match execute(&api, json, command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Refused(m)) => refuse(m),
        Err(Failure::Broken(m)) => {
            eprintln!("baton: {m}");
            ExitCode::FAILURE
        }
        Err(Failure::Ended) => ExitCode::from(3),
        Err(Failure::Parked) => ExitCode::from(5),
        Err(Failure::TimedOut(m)) => {
            eprintln!("baton: {m}");
            ExitCode::from(4)
        }
    }
}

fn seg(id: &str) -> Result<&str, Failure> {
    let ok = !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(id)
    } else {
        Err(Failure::Refused(format!("`{id}` is not a valid id")))
    }
}

async fn execute(api: &Api, json: bool, command: Command) -> Result<(), Failure> {
    let print = |v: &Value, human: String| {
        if json {
            println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
        } else {
            println!("{human}");
        }
    };
    match command {
        Command::Run {
            prompt,
            agent,
            sandbox,
            github,
            wait,
            follow,
            timeout,
            quiet,
        } => {
            let print = |v: &Value, human: String| match quiet {
                true => println!("{}", v["runId"].as_str().unwrap_or_default()),
                false => print(v, human),
            };
            let mut body = json!({"prompt": prompt});
            if let Some(a) = agent {
                body["agent"] = json!(a);
            }
            if let Some(s) = sandbox {
                body["sandboxId"] = json!(s);
            }
            if let Some(g) = github {
                body["github"] = match g.split_once('@') {
                    Some((repo, r)) => json!({"repo": repo, "ref": r}),
                    None => json!({"repo": g}),
                };
            }
            if follow {
                // Watched from its creation: its first reply streams here too.
                body["watch"] = json!(true);
            }
            let created = api.call(Method::POST, "/runs", Some(body)).await?;
            let run_id = created["runId"].as_str().unwrap_or_default().to_owned();
            if follow {
                println!("run {run_id}");
                return watched(watch::watch(api, &run_id).await);
            }
            if !wait {
                print(
                    &created,
                    format!("{run_id} {}", created["status"].as_str().unwrap_or("")),
                );
                return Ok(());
            }
            let deadline = Instant::now() + Duration::from_secs(timeout);
            let mut said = String::new();
            loop {
                let run = api
                    .call(Method::GET, &format!("/runs/{}", seg(&run_id)?), None)
                    .await?;
                let status = run["status"].as_str().unwrap_or("");
                // Each change of state on stderr, a retrying step's trouble included.
                let now = progress(&run);
                if now != said {
                    eprintln!("{run_id}: {now}");
                    said = now;
                }
                let parked_on_human = status == "waiting" && run["state"] == "waiting_on_user";
                if parked_on_human || status == "completed" {
                    print(&run, render_run(&run));
                    return Ok(());
                }
                if !matches!(status, "queued" | "running" | "waiting") {
                    print(&run, render_run(&run));
                    return Err(Failure::Ended);
                }
                if Instant::now() >= deadline {
                    return Err(Failure::TimedOut(format!(
                        "run {run_id} is still {status} after {timeout}s"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Command::Watch { run_id } => return watched(watch::watch(api, &run_id).await),
        Command::Show { run_id } => {
            let id = seg(&run_id)?;
            let mut run = api.call(Method::GET, &format!("/runs/{id}"), None).await?;
            // A long timeline comes in pages: follow them to the end.
            let mut next = run["timelineNext"].as_u64();
            while let Some(after) = next {
                let page = api
                    .call(
                        Method::GET,
                        &format!("/runs/{id}/timeline?after={after}"),
                        None,
                    )
                    .await?;
                let entries = page["entries"].as_array().cloned().unwrap_or_default();
                next = page["next"]
                    .as_u64()
                    .filter(|n| *n > after && !entries.is_empty());
                if let Some(Value::Array(t)) = run.get_mut("timeline") {
                    t.extend(entries);
                }
            }
            if let Value::Object(m) = &mut run {
                m.remove("timelineNext");
            }
            print(&run, render_run(&run));
        }
        Command::Ctas {
            all,
            assigned,
            quiet,
        } => {
            let q = if all { "all" } else { "pending" };
            let q = if assigned {
                format!("{q}&assigned=me")
            } else {
                q.to_owned()
            };
            // Every page, in the API's order (by status, oldest first).
            let mut ctas = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let after = cursor.map(|c| format!("&cursor={c}")).unwrap_or_default();
                let page = api
                    .call(
                        Method::GET,
                        &format!("/ctas?status={q}&limit=100{after}"),
                        None,
                    )
                    .await?;
                ctas.extend(page["ctas"].as_array().cloned().unwrap_or_default());
                cursor = page["nextCursor"].as_str().map(str::to_owned);
                if cursor.is_none() {
                    break;
                }
            }
            let v = serde_json::json!({ "ctas": ctas });
            if quiet {
                for c in &ctas {
                    println!("{}", c["ctaId"].as_str().unwrap_or_default());
                }
                return Ok(());
            }
            let human = if ctas.is_empty() {
                let whose = if assigned { " assigned to you" } else { "" };
                format!("no {} CTAs{whose}", if all { "" } else { "pending" }).replace("  ", " ")
            } else {
                ctas.iter().map(render_cta).collect::<Vec<_>>().join("\n")
            };
            print(&v, human);
        }
        Command::Answer {
            cta_id,
            approve,
            reject,
            reason,
            text,
            choice,
        } => {
            let body = if approve || reject {
                let mut b = json!({"kind": "approval", "approved": approve});
                if let Some(r) = reason {
                    b["reason"] = json!(r);
                }
                b
            } else if let Some(t) = text {
                json!({"kind": "text", "text": t})
            } else if let Some(c) = choice {
                json!({"kind": "choice", "selectedId": c})
            } else {
                return Err(Failure::Refused(
                    "give one of --approve, --reject, --text, --choice".into(),
                ));
            };
            let v = api
                .call(
                    Method::POST,
                    &format!("/ctas/{}/response", seg(&cta_id)?),
                    Some(body),
                )
                .await?;
            print(
                &v,
                format!(
                    "{cta_id} answered (run {})",
                    v["runId"].as_str().unwrap_or("")
                ),
            );
        }
        Command::Cancel { run_id } => {
            let v = api
                .call(
                    Method::POST,
                    &format!("/runs/{}/cancel", seg(&run_id)?),
                    None,
                )
                .await?;
            print(&v, format!("{run_id} cancellation requested"));
        }
        Command::Say {
            run_id,
            message,
            tier,
            hidden,
        } => {
            let mut body = json!({"text": message, "tier": tier});
            if hidden {
                body["visible"] = json!(false);
            }
            let path = format!("/runs/{}/messages", seg(&run_id)?);
            let v = api.call(Method::POST, &path, Some(body)).await?;
            print(&v, format!("message sent to {run_id}"));
        }
        Command::Trigger {
            run_id,
            name,
            payload,
        } => {
            let data: Option<serde_json::Value> = match payload.as_deref().map(serde_json::from_str)
            {
                None => None,
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => {
                    return Err(Failure::Refused(format!("--payload is not JSON: {e}")));
                }
            };
            let body = json!({"trigger": {"name": name, "data": data}});
            let path = format!("/runs/{}/messages", seg(&run_id)?);
            let v = api.call(Method::POST, &path, Some(body)).await?;
            print(&v, format!("trigger `{name}` sent to {run_id}"));
        }
        Command::Runs { limit, cursor } => {
            // A cursor is URL-safe base64: what is not is refused, never sent mangled.
            let after = match &cursor {
                Some(c) => format!("&cursor={}", seg(c)?),
                None => String::new(),
            };
            let v = api
                .call(Method::GET, &format!("/runs?limit={limit}{after}"), None)
                .await?;
            let runs = v["runs"].as_array().cloned().unwrap_or_default();
            let mut human: Vec<String> = runs
                .iter()
                .map(|r| {
                    format!(
                        "{}  {:<9}  {}  ${:.6}  {}",
                        r["runId"].as_str().unwrap_or(""),
                        r["status"].as_str().unwrap_or(""),
                        r["agent"].as_str().unwrap_or(""),
                        r["total"]["costUsd"].as_f64().unwrap_or(0.0),
                        r["prompt"].as_str().unwrap_or("").replace('\n', " ")
                    )
                })
                .collect();
            if runs.is_empty() {
                human.push("no runs".into());
            }
            if let Some(next) = v["nextCursor"].as_str() {
                human.push(format!("more: baton runs --cursor {next}"));
            }
            print(&v, human.join("\n"));
        }
        Command::Dev { .. }
        | Command::Bench { .. }
        | Command::New { .. }
        | Command::Template
        | Command::Bootstrap { .. }
        | Command::Preflight { .. } => {
            unreachable!("handled in main")
        }
    }
    Ok(())
}

/// A watch's outcome as the command's result.
fn watched(o: Result<watch::Outcome, Failure>) -> Result<(), Failure> {
    match o? {
        watch::Outcome::Completed => Ok(()),
        watch::Outcome::Ended => Err(Failure::Ended),
        watch::Outcome::Parked => Err(Failure::Parked),
    }
}
