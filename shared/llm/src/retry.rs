//! What every client shares: the backoff between attempts (exponential, with jitter), and
//! a failed request described in words a user can act on.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use baton_core::config::{LLM_INITIAL_BACKOFF_MS, LLM_MAX_BACKOFF_MS};

/// The wait before a retry: `initial` doubling per attempt, at most `max`, of which a random
/// half is taken off ("equal jitter"), so that runs throttled together do not retry together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// The backoff [`longest`] counts on.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(LLM_INITIAL_BACKOFF_MS),
            max: Duration::from_millis(LLM_MAX_BACKOFF_MS),
        }
    }
}

impl Backoff {
    /// Milliseconds, for tests.
    pub fn fast() -> Self {
        Self {
            initial: Duration::from_millis(2),
            max: Duration::from_millis(20),
        }
    }
}

/// The wait before retry number `attempt + 1`: within [cap / 2, cap], cap =
/// min(initial × 2^attempt, max).
pub fn backoff(b: &Backoff, attempt: u32) -> Duration {
    let cap = b.initial.saturating_mul(1 << attempt.min(16)).min(b.max);
    // A fresh random 64-bit value: std's hasher keys are drawn from the OS per instance.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let half = cap / 2;
    half + half.mul_f64((random >> 11) as f64 / (1u64 << 53) as f64)
}

/// The longest a call of `max_retries` retries can take when each attempt times out after
/// `timeout` and each wait is at its cap (a `Retry-After` is honoured up to the same cap).
pub fn longest(timeout: Duration, max_retries: u32, b: &Backoff) -> Duration {
    let waits: Duration = (0..max_retries)
        .map(|i| b.initial.saturating_mul(1 << i.min(16)).min(b.max))
        .sum();
    timeout.saturating_mul(max_retries.saturating_add(1)) + waits
}

/// A failed request in words a user can act on: which endpoint, and the root cause
/// (`connection refused`, a DNS failure, a timeout), not only "error sending request".
pub fn describe(e: &reqwest::Error, url: &str) -> String {
    let mut root: &dyn std::error::Error = e;
    while let Some(next) = root.source() {
        root = next;
    }
    if e.is_timeout() {
        format!("no reply from {url} in time: {root}")
    } else if e.is_connect() {
        format!("cannot reach {url}: {root}")
    } else {
        format!("request to {url} failed: {root}")
    }
}

/// What one attempt of a model call came to.
pub enum Attempt<T> {
    Done(T),
    /// Worth another attempt (throttled, overloaded, a 5xx, a timeout), after `wait` if the
    /// provider said how long.
    Retry {
        why: String,
        wait: Option<Duration>,
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Another attempt will not help (auth, validation): the provider's words.
    Fatal(String),
}

/// Runs `attempt` until it is done, fatal, or `max_retries` retries are spent, waiting
/// [`backoff`] (or the provider's `Retry-After`, capped the same) between attempts.
pub async fn with_retries<T, F, Fut>(
    max_retries: u32,
    b: &Backoff,
    mut attempt: F,
) -> Result<T, baton_core::llm::LlmError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Attempt<T>>,
{
    use baton_core::llm::LlmError;
    let mut n = 0;
    loop {
        match attempt().await {
            Attempt::Done(t) => return Ok(t),
            Attempt::Fatal(message) => return Err(LlmError::fatal(message)),
            Attempt::Retry { why, wait, source } => {
                if n >= max_retries {
                    return Err(LlmError::Unavailable {
                        message: format!("gave up after {} attempts: {why}", n + 1),
                        source,
                    });
                }
                let delay = wait.unwrap_or_else(|| backoff(b, n)).min(b.max);
                tracing::warn!(attempt = n + 1, delay_ms = delay.as_millis() as u64, %why, "model call failed; retrying");
                tokio::time::sleep(delay).await;
                n += 1;
            }
        }
    }
}

/// `Retry-After` in seconds (the HTTP-date form falls back to the backoff).
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_below_it() {
        let b = Backoff::default();
        let mut seen = std::collections::HashSet::new();
        for attempt in 0..20 {
            let cap = (b.initial * (1 << attempt.min(16))).min(b.max);
            for _ in 0..10 {
                let d = backoff(&b, attempt);
                assert!(
                    d >= cap / 2 && d <= cap,
                    "attempt {attempt}: {d:?} vs {cap:?}"
                );
                seen.insert(d);
            }
        }
        assert!(seen.len() > 100, "jittered: {} distinct waits", seen.len());
    }
}
