//! The console: a page that lists the CTAs waiting for the caller, answers them with typed
//! forms, follows a run's timeline live, and lists runs with their trees and figures for
//! operators. Its five files are compiled into the binary
//! (no build step, no CDN); they carry no data and need no sign-in. The page signs its API
//! calls with the token the user pastes, kept in the tab's session storage.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use crate::AppState;

const INDEX: &str = include_str!("../console/index.html");
const SCRIPT: &str = include_str!("../console/console.js");
const RUNS_SCRIPT: &str = include_str!("../console/runs.js");
const LIVE_SCRIPT: &str = include_str!("../console/live.js");
const STYLE: &str = include_str!("../console/console.css");

/// Scripts and styles from this origin only; the API from this origin only, and the live
/// channel's WebSocket where the host has one outside the process.
fn policy(channel: Option<&str>) -> String {
    let connect = match channel {
        Some(origin) => format!("'self' {origin}"),
        None => "'self'".into(),
    };
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src {connect}; \
         img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    )
}

fn asset(body: &'static str, kind: &'static str, channel: Option<&str>) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(policy) = HeaderValue::from_str(&policy(channel)) {
        h.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// The page, allowed to connect to the live channel if the host has one.
pub(crate) async fn index(State(s): State<AppState>) -> Response {
    let channel = s.watchers.as_ref().map(|w| w.channel_origin());
    asset(INDEX, "text/html; charset=utf-8", channel.as_deref())
}

pub(crate) async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8", None)
}

pub(crate) async fn runs_script() -> Response {
    asset(RUNS_SCRIPT, "text/javascript; charset=utf-8", None)
}

pub(crate) async fn live_script() -> Response {
    asset(LIVE_SCRIPT, "text/javascript; charset=utf-8", None)
}

pub(crate) async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8", None)
}

pub(crate) async fn root() -> Redirect {
    Redirect::to("/console")
}
