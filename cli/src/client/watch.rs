//! `baton watch <runId>` and `baton run --follow`: a run as it happens, in a terminal. The
//! model's reply word by word as it streams, each tool call as it starts and ends, the run's
//! entries as they commit; then the outcome. On a host that streams (`baton dev`, `baton dev
//! --aws`) it follows `GET /runs/{id}/stream`. Behind API Gateway (a 501) it takes the live
//! view from the deployment's live channel (`POST /runs/{id}/watch` grants a subscription to
//! it, renewed while it watches), and with it each step's committed entries (`committed`),
//! reading `GET /runs/{id}/timeline?after=` only to catch up (when the channel connects
//! again, after a step too large for its event) and every 30 s; without a channel it polls
//! the timeline every second and shows committed entries only.
//!
//! Exit codes: 0 the run completed; 3 it failed, expired or was cancelled; 5 it waits for a
//! human's answer (the questions are printed, with how to answer them).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::time::Duration;

use baton_core::live::grant::Watch;
use baton_llm::sse::SseReader;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{Api, Failure, render_cta, seg, short};

/// How the watch ended.
pub(super) enum Outcome {
    Completed,
    Ended,
    Parked,
}

/// What the terminal shows of a run so far. Each method gives the text to print.
#[derive(Default)]
struct View {
    /// The reply being streamed: its seq and attempt.
    streaming: Option<(u64, String)>,
    /// The text streamed of each seq's reply (its entry is not printed again when it
    /// matches: a watcher that came mid-reply, or a retried call, gets the committed text).
    streamed: HashMap<u64, String>,
    /// Entries shown, by seq (a changed entry is shown again only when it settles).
    shown: HashSet<u64>,
    /// Tool calls shown with their result (their live events, if late, are not news).
    calls: HashSet<String>,
    /// The step the live channel last spoke of (its events' seq).
    live_seq: Option<u64>,
}

impl View {
    /// Ends the reply being streamed, if one is.
    fn end_reply(&mut self) -> &'static str {
        match self.streaming.take() {
            Some(_) => "\n",
            None => "",
        }
    }

    fn live(&mut self, kind: &str, e: &Value) -> String {
        match kind {
            // A reply already shown as committed (its pieces came late): nothing to add.
            "delta" | "tool_call_delta" if self.shown.contains(&e["seq"].as_u64().unwrap_or(0)) => {
                String::new()
            }
            "tool_started" | "tool_finished"
                if self.calls.contains(e["callId"].as_str().unwrap_or("")) =>
            {
                String::new()
            }
            "delta" => {
                let seq = e["seq"].as_u64().unwrap_or(0);
                let attempt = e["attempt"].as_str().unwrap_or("").to_owned();
                let mut out = match &self.streaming {
                    Some((s, a)) if *s == seq && *a == attempt => String::new(),
                    Some((s, _)) if *s == seq => {
                        self.streamed.remove(&seq);
                        "\n[the model call is tried again]\nassistant: ".to_owned()
                    }
                    _ => format!("{}assistant: ", self.end_reply()),
                };
                let piece = e["text"].as_str().unwrap_or("");
                self.streaming = Some((seq, attempt));
                self.streamed.entry(seq).or_default().push_str(piece);
                out.push_str(piece);
                out
            }
            "tool_started" => format!(
                "{}  → {} {}\n",
                self.end_reply(),
                e["tool"].as_str().unwrap_or("?"),
                short(&e["inputPreview"], 100)
            ),
            "tool_finished" => format!(
                "  {} {} ({} ms)\n",
                if e["ok"] == true { "✓" } else { "✗" },
                e["tool"].as_str().unwrap_or("?"),
                e["durationMs"]
            ),
            _ => String::new(),
        }
    }

    fn entry(&mut self, e: &Value) -> String {
        let seq = e["seq"].as_u64().unwrap_or(0);
        let pending = e["result"]["status"] == "pending";
        if pending || !self.shown.insert(seq) {
            return String::new();
        }
        let end = self.end_reply();
        let line = match e["type"].as_str().unwrap_or("") {
            "assistant" => match (e["text"].as_str(), self.streamed.remove(&seq)) {
                (Some(t), Some(s)) if s == t => String::new(),
                (Some(t), Some(_)) => format!("[as committed] assistant: {t}\n"),
                (Some(t), None) => format!("assistant: {t}\n"),
                (None, _) => String::new(),
            },
            "user" => format!("> {}\n", e["text"].as_str().unwrap_or("")),
            "tool" => {
                if let Some(id) = e["id"].as_str() {
                    self.calls.insert(id.to_owned());
                }
                let r = &e["result"];
                let what = match r["status"].as_str() {
                    Some("success") => short(&r["output"], 100),
                    Some(s) => format!("{s}: {}", short(&r["error"], 100)),
                    None => String::new(),
                };
                format!("  {} = {what}\n", e["name"].as_str().unwrap_or("?"))
            }
            "notice" | "error" => format!(
                "[{}] {}\n",
                e["code"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            ),
            "usage" => format!(
                "[turn used {} tokens, ${:.4}]\n",
                e["usage"]["totalTokens"].as_u64().unwrap_or(0),
                e["costUsd"].as_f64().unwrap_or(0.0)
            ),
            // A widget, a file, a queued follow-up, or a type newer than this client.
            _ => format!("  {}\n", super::entry_line(e)),
        };
        format!("{end}{line}")
    }
}

/// Prints `text` at once (a reply comes piece by piece).
fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The outcome a run's state means, if it is one.
fn outcome(run: &Value) -> Option<Outcome> {
    let parked = run["state"] == "waiting_on_user"
        || run["waitingCtas"].as_array().is_some_and(|c| !c.is_empty());
    match run["status"].as_str().unwrap_or("") {
        "completed" => Some(Outcome::Completed),
        "waiting" if parked => Some(Outcome::Parked),
        "queued" | "running" | "waiting" => None,
        _ => Some(Outcome::Ended),
    }
}

/// Follows `run_id` until it completes, ends otherwise, or waits for a human.
pub(super) async fn watch(api: &Api, run_id: &str) -> Result<Outcome, Failure> {
    let id = seg(run_id)?;
    // A stream stays open as long as the run goes: no overall timeout.
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| Failure::Broken(format!("cannot build an HTTP client: {e}")))?;
    let url = format!(
        "{}/runs/{id}/stream?follow=true",
        api.base.trim_end_matches('/')
    );
    let mut rb = http.get(&url).header("accept", "text/event-stream");
    if let Some(t) = api.token.get() {
        rb = rb.bearer_auth(t);
    }
    let mut resp = rb
        .send()
        .await
        .map_err(|e| Failure::Broken(format!("cannot reach {url}: {e}")))?;
    let mut view = View::default();
    if resp.status() == StatusCode::NOT_IMPLEMENTED {
        return poll(api, id, &mut view).await;
    }
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        return Err(super::failure(status, &text));
    }
    let mut reader = SseReader::default();
    loop {
        let chunk = resp
            .chunk()
            .await
            .map_err(|e| Failure::Broken(format!("the stream broke: {e}")))?;
        let Some(bytes) = chunk else {
            return Err(Failure::Broken("the server ended the stream".into()));
        };
        for event in reader.push(&bytes) {
            let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
                continue;
            };
            match event.event.as_deref().unwrap_or("") {
                "entry" => emit(&view.entry(&data)),
                "run" => {
                    if let Some(o) = outcome(&data)
                        && let Some(o) = finish(api, &mut view, id, o).await?
                    {
                        return Ok(o);
                    }
                }
                "error" => {
                    return Err(Failure::Broken(format!(
                        "the stream ended: {}",
                        data["error"]["message"].as_str().unwrap_or("")
                    )));
                }
                kind => emit(&view.live(kind, &data)),
            }
        }
    }
}

/// A subscription to the run's live channel, and when to renew its grant.
struct Channel {
    sub: baton_aws::channel::Subscription,
    renew: tokio::time::Instant,
    every: Duration,
    /// The grant says the run's steps publish what they commit.
    carries: bool,
}

impl Channel {
    /// The run's live channel, if the host has one outside the process and it can be
    /// reached (else the watch goes on with committed entries, and says so).
    async fn open(api: &Api, id: &str) -> Option<Self> {
        let grant = api
            .call(Method::POST, &format!("/runs/{id}/watch"), None)
            .await
            .ok()?;
        let watch: Watch = serde_json::from_value(grant).ok()?;
        match baton_aws::channel::subscribe(&watch).await {
            Ok(sub) => {
                let every = Duration::from_secs(watch.renew_after_seconds.max(10).unsigned_abs());
                Some(Self {
                    sub,
                    renew: tokio::time::Instant::now() + every,
                    every,
                    carries: watch.committed,
                })
            }
            Err(e) => {
                eprintln!("baton watch: no live view ({e}); showing entries as they commit");
                None
            }
        }
    }
}

/// What the live channel said while a watch listened.
enum Heard {
    /// Nothing (the wait ran out).
    Nothing,
    /// The first live event of a new step, unshown: what committed before the step
    /// (polled, a second behind the channel) is to be shown first. Only while the channel
    /// carries no committed entries.
    Held(Value),
    /// A step committed: its entries are shown; its `{status, state}`.
    Committed(Value),
    /// The timeline must be read after the cursor: the channel connected again, or a
    /// step's entries were too large to come with its `committed` event.
    CatchUp,
}

/// Shows what the live channel sends for `wait`, renewing its grant when due.
async fn live_for(
    api: &Api,
    id: &str,
    channel: &mut Option<Channel>,
    view: &mut View,
    wait: Duration,
    cursor: &mut Cursor,
) -> Heard {
    let until = tokio::time::Instant::now() + wait;
    let Some(ch) = channel else {
        tokio::time::sleep_until(until).await;
        return Heard::Nothing;
    };
    if tokio::time::Instant::now() >= ch.renew {
        // The lease and the grant go on; a refusal only ends the live view when it lapses.
        let _ = api
            .call(Method::POST, &format!("/runs/{id}/watch"), None)
            .await;
        ch.renew += ch.every;
    }
    loop {
        tokio::select! {
            e = ch.sub.next() => match e {
                Some(e) if e["type"] == "committed" => {
                    cursor.pushed = true;
                    // Too large to carry its entries, or past what is shown (a commit
                    // before it was not published): the timeline has them.
                    let next = cursor.seen.map_or(0, |s| s + 1);
                    if e["truncated"] == true || e["from"].as_u64().is_some_and(|f| f > next) {
                        return Heard::CatchUp;
                    }
                    for x in e["entries"].as_array().into_iter().flatten() {
                        emit(&view.entry(x));
                        cursor.settle(x);
                    }
                    return Heard::Committed(e);
                }
                Some(e) => {
                    let seq = e["seq"].as_u64();
                    if !cursor.pushed && seq.is_some() && seq != view.live_seq {
                        view.live_seq = seq;
                        // A step that publishes this will publish its commit too: after
                        // the read that shows what committed before it (a step under way
                        // when the watch began may not have), the channel has the rest.
                        cursor.pushed = ch.carries;
                        return Heard::Held(e);
                    }
                    view.live_seq = seq;
                    emit(&view.live(e["type"].as_str().unwrap_or(""), &e));
                }
                None => {
                    // AppSync ends a connection at its time limit, and networks drop: one
                    // connection again, with a fresh grant, at most once a poll (without
                    // one, the watch goes on with entries as they commit).
                    eprintln!("baton watch: the live channel closed; connecting again");
                    *channel = Channel::open(api, id).await;
                    // Until a step is heard from on the new subscription.
                    cursor.pushed = false;
                    tokio::time::sleep_until(until).await;
                    return Heard::CatchUp;
                }
            },
            () = tokio::time::sleep_until(until) => return Heard::Nothing,
        }
    }
}

/// Where a polling watch is in the timeline: the last seq before any entry that may still
/// change (a pending result), the last seq shown, and whether the live channel now carries
/// every commit.
#[derive(Default)]
struct Cursor {
    after: Option<u64>,
    open: bool,
    seen: Option<u64>,
    pushed: bool,
}

impl Cursor {
    fn settle(&mut self, e: &Value) {
        self.seen = self.seen.max(e["seq"].as_u64());
        self.open |= e["result"]["status"] == "pending";
        let next = self.after.map_or(0, |a| a + 1);
        if !self.open && e["seq"].as_u64() == Some(next) {
            self.after = Some(next);
        }
    }
}

/// How long a watch whose channel carries committed entries waits between reads of the
/// timeline (a safety net: it reads it at once when the channel connects again).
const PUSHED_POLL: Duration = Duration::from_secs(30);

/// Without a stream: the committed entries, polled — or, while the live channel carries
/// them, pushed — and the live channel's view if there is one.
async fn poll(api: &Api, id: &str, view: &mut View) -> Result<Outcome, Failure> {
    let mut cursor = Cursor::default();
    let mut channel = Channel::open(api, id).await;
    // A live event held until the entries before it are shown.
    let mut held: Option<Value> = None;
    let mut read = true;
    loop {
        let mut full = false;
        if read {
            let path = match cursor.after {
                Some(a) => format!("/runs/{id}/timeline?after={a}"),
                None => format!("/runs/{id}/timeline"),
            };
            let page = api.call(Method::GET, &path, None).await?;
            cursor.open = false;
            for e in page["entries"].as_array().into_iter().flatten() {
                emit(&view.entry(e));
                cursor.settle(e);
            }
            full = page["entries"].as_array().is_some_and(|e| e.len() >= 1000);
        }
        if let Some(e) = held.take() {
            emit(&view.live(e["type"].as_str().unwrap_or(""), &e));
        }
        if full {
            continue;
        }
        let run = api.call(Method::GET, &format!("/runs/{id}"), None).await?;
        if let Some(o) = outcome(&run)
            && let Some(o) = finish(api, view, id, o).await?
        {
            return Ok(o);
        }
        // Listen: while the channel carries committed entries, until the next safety read;
        // else a second, then the timeline again.
        read = true;
        let started = tokio::time::Instant::now();
        loop {
            let wait = if cursor.pushed && channel.is_some() {
                PUSHED_POLL.saturating_sub(started.elapsed())
            } else {
                Duration::from_secs(1)
            };
            match live_for(api, id, &mut channel, view, wait, &mut cursor).await {
                Heard::Held(e) => held = Some(e),
                Heard::Committed(e) => {
                    if outcome(&e).is_none() {
                        continue;
                    }
                    // It may have ended or parked: the run says (the timeline is not read).
                    read = false;
                }
                Heard::Nothing | Heard::CatchUp => {}
            }
            break;
        }
    }
}

/// Prints the outcome (and the questions a parked run waits on). `None`: not parked after
/// all (its questions were answered since; the run is about to go on).
async fn finish(
    api: &Api,
    view: &mut View,
    id: &str,
    o: Outcome,
) -> Result<Option<Outcome>, Failure> {
    let mut questions = String::new();
    if let Outcome::Parked = o {
        let ctas = api
            .call(
                Method::GET,
                &format!("/ctas?status=pending&rootRunId={id}"),
                None,
            )
            .await?;
        let pending = ctas["ctas"].as_array().map_or(&[][..], Vec::as_slice);
        if pending.is_empty() {
            return Ok(None);
        }
        for c in pending {
            let how = match c["kind"].as_str() {
                Some("approval") => "--approve | --reject [--reason TEXT]",
                Some("choice") => "--choice ID",
                _ => "--text TEXT",
            };
            questions.push_str(&format!(
                "{}\n  answer: baton answer {} {how}\n",
                render_cta(c),
                c["ctaId"].as_str().unwrap_or("")
            ));
        }
    }
    let run = api.call(Method::GET, &format!("/runs/{id}"), None).await?;
    let summary = super::render_run(&run);
    let first = summary.lines().next().unwrap_or_default();
    emit(&format!("{}{first}\n{questions}", view.end_reply()));
    Ok(Some(o))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn delta(seq: u64, attempt: &str, text: &str) -> Value {
        json!({"seq": seq, "attempt": attempt, "text": text})
    }

    fn assistant(seq: u64, text: &str) -> Value {
        json!({"seq": seq, "type": "assistant", "text": text})
    }

    #[test]
    fn a_streamed_reply_is_printed_once_and_the_committed_text_wins() {
        let mut v = View::default();
        let mut out = String::new();
        out += &v.live("delta", &delta(3, "a.1", "Let me "));
        out += &v.live("delta", &delta(3, "a.1", "look."));
        out += &v.entry(&assistant(3, "Let me look."));
        assert_eq!(out, "assistant: Let me look.\n");
        // Joined mid-reply: what streamed is followed by the reply as committed.
        out.clear();
        out += &v.live("delta", &delta(5, "b.1", "done."));
        out += &v.entry(&assistant(5, "All done."));
        assert_eq!(
            out,
            "assistant: done.\n[as committed] assistant: All done.\n"
        );
        // A call tried again starts its text over.
        out.clear();
        out += &v.live("delta", &delta(7, "c.1", "Hal"));
        out += &v.live("delta", &delta(7, "c.2", "Hello."));
        out += &v.entry(&assistant(7, "Hello."));
        assert_eq!(
            out,
            "assistant: Hal\n[the model call is tried again]\nassistant: Hello.\n"
        );
        // Pieces that come after their reply committed (the live channel lags the
        // timeline): nothing more.
        assert_eq!(v.live("delta", &delta(7, "c.2", "late")), "");
        // An entry sent again (it changed) is not printed twice; a pending one waits.
        assert_eq!(v.entry(&assistant(7, "Hello.")), "");
        let pending =
            json!({"seq": 8, "type": "tool", "name": "echo", "result": {"status": "pending"}});
        assert_eq!(v.entry(&pending), "");
        let done = json!({"seq": 8, "type": "tool", "name": "echo", "result": {"status": "success", "output": "hi"}});
        assert_eq!(v.entry(&done), "  echo = hi\n");
        // A tool's live events after its entry (the channel lagging): not shown.
        let done = json!({"seq": 9, "type": "tool", "id": "call_9", "name": "echo", "result": {"status": "success", "output": "hi"}});
        assert_eq!(v.entry(&done), "  echo = hi\n");
        assert_eq!(
            v.live("tool_started", &json!({"callId": "call_9", "tool": "echo"})),
            ""
        );
    }

    #[test]
    fn a_widget_a_file_and_a_queued_follow_up_have_lines_too() {
        let mut v = View::default();
        let widget = json!({"seq": 1, "type": "widget", "callId": "c1", "kind": "table", "data": {"rows": 2}});
        assert_eq!(v.entry(&widget), "  widget table: {\"rows\":2}\n");
        let queued = json!({"seq": 2, "type": "queued", "text": "and tag it", "messageId": "m1"});
        assert_eq!(v.entry(&queued), "  queued follow-up: and tag it\n");
    }

    #[test]
    fn a_tool_is_shown_starting_and_finishing() {
        let mut v = View::default();
        let mut out = v.live("delta", &delta(1, "a.1", "Checking."));
        out += &v.live(
            "tool_started",
            &json!({"tool": "echo", "inputPreview": "{\"text\":\"hi\"}"}),
        );
        out += &v.live(
            "tool_finished",
            &json!({"tool": "echo", "ok": true, "durationMs": 12}),
        );
        assert_eq!(
            out,
            "assistant: Checking.\n  → echo {\"text\":\"hi\"}\n  ✓ echo (12 ms)\n"
        );
    }

    #[test]
    fn outcomes_by_status_and_state() {
        let o = |v: Value| match outcome(&v) {
            Some(Outcome::Completed) => "completed",
            Some(Outcome::Ended) => "ended",
            Some(Outcome::Parked) => "parked",
            None => "going",
        };
        assert_eq!(o(json!({"status": "completed"})), "completed");
        assert_eq!(o(json!({"status": "failed"})), "ended");
        assert_eq!(o(json!({"status": "cancelled"})), "ended");
        assert_eq!(o(json!({"status": "running"})), "going");
        assert_eq!(
            o(json!({"status": "waiting", "state": "waiting_on_subagents"})),
            "going"
        );
        assert_eq!(
            o(json!({"status": "waiting", "state": "waiting_on_user"})),
            "parked"
        );
        assert_eq!(
            o(
                json!({"status": "waiting", "state": "waiting_on_subagents", "waitingCtas": [{"ctaId": "c"}]})
            ),
            "parked"
        );
    }
}
