//! Failpoints: the named places where a crash would hurt, for the crash suite.
//!
//! Built only with the `failpoints` feature (the tests turn it on; release builds never
//! do), where a test arms a point and the next pass through it fails as a crash would:
//! the call returns an error, so nothing after it happens, and the caller gives up the
//! way it does when the process dies (a step's message is retried, an API request gets an
//! error). A test may instead `pause` a point that async code passes through ([`pass`]):
//! the next pass waits there until the test releases it, so the test can act between two
//! writes (post a follow-up right after a commit, say). Without the feature, [`hit`] is an empty
//! function.
//!
//! | point | where |
//! |---|---|
//! | `create.after_insert` | a run created, its start not yet sent |
//! | `fork.after_insert` | a fork created, its first message (an answer, or its start) not yet sent |
//! | `answer.after_settle` | an answer written on the CTA, not yet sent to the run |
//! | `resolution.after_send` | a resolution sent, the CTA's outbox not yet cleared |
//! | `message.after_admit` | a follow-up admitted under its run's cap, not yet sent |
//! | `message.after_claim` | a follow-up's claim on an ended run's next turn written, the follow-up not yet sent |
//! | `message.after_queue` | a follow-up message queued, the reply not yet sent |
//! | `cancel.after_queue` | a cancel queued, the reply not yet sent |
//! | `step.before_think` | a step about to call the model |
//! | `step.after_think` | a reply committed with its calls, none of them run |
//! | `step.before_tool` | a step about to run a tool |
//! | `step.after_tool` | a tool's output in hand, not committed |
//! | `step.before_commit` / `step.after_commit` | around each conditional commit (a reply in hand and not committed: before it) |
//! | `step.after_checkpoint` | a checkpoint committed (a reply, a call's start or output) and performed, the step not done |
//! | `store.after_tail_copy` | DynamoDB: a run item's tail copied to its segment, the commit that drops it not yet written |
//! | `effect.after_send`, `effect.after_publish`, `effect.after_schedule`, `effect.after_unschedule` | after each kind of effect |
//! | `step.before_ack` | a step done, its message not yet deleted |
//! | `host.before_links` | a host starting: its port bound, nothing set up or served yet |

use crate::error::PortError;

#[cfg(feature = "failpoints")]
mod armed {
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Armed points, with how many passes to let through before failing.
    pub(super) static ARMED: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);
    /// Every point that fired, in order.
    pub(super) static FIRED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    pub(super) static PAUSED: Mutex<Option<Paused>> = Mutex::new(None);
    /// Paused points, with how many passes to let through before holding one.
    pub(super) type Paused = HashMap<String, (u32, std::sync::Arc<super::Gate>)>;
}

/// A pass through a paused point: reached, then held until released. It waits as a task
/// (never blocking its thread, which would stall the tasks queued behind it there).
#[cfg(feature = "failpoints")]
#[derive(Debug, Default)]
pub struct Gate {
    reached: std::sync::atomic::AtomicBool,
    released: std::sync::atomic::AtomicBool,
    changed: tokio::sync::Notify,
}

#[cfg(feature = "failpoints")]
impl Gate {
    async fn until(&self, flag: &std::sync::atomic::AtomicBool) {
        loop {
            // Created before the flag is read, so a change in between is not missed.
            let changed = self.changed.notified();
            if flag.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            changed.await;
        }
    }

    /// Waits until a pass reaches the point.
    pub async fn reached(&self) {
        self.until(&self.reached).await
    }

    /// Lets the held pass go on.
    pub fn release(&self) {
        self.released
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Called by the pass: says it is here, and waits to be released.
    async fn hold(&self) {
        self.reached
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.changed.notify_waiters();
        self.until(&self.released).await
    }
}

/// Stops the `skip + 1`-th pass from now through `name`, where the pass goes through
/// [`pass`], until the returned gate is released.
#[cfg(feature = "failpoints")]
pub fn pause(name: &str, skip: u32) -> std::sync::Arc<Gate> {
    let gate = std::sync::Arc::new(Gate::default());
    armed::PAUSED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(Default::default)
        .insert(name.to_owned(), (skip, gate.clone()));
    gate
}

/// [`hit`], where a test may also [`pause`] the code (an async caller).
#[cfg(feature = "failpoints")]
pub async fn pass(name: &str) -> Result<(), PortError> {
    let held = {
        let mut paused = armed::PAUSED.lock().unwrap_or_else(|e| e.into_inner());
        match paused.as_mut().and_then(|m| m.get_mut(name)) {
            Some((skip, _)) if *skip > 0 => {
                *skip -= 1;
                None
            }
            Some(_) => paused.as_mut().and_then(|m| m.remove(name)),
            None => None,
        }
    };
    if let Some((_, gate)) = held {
        tracing::warn!(failpoint = name, "failpoint: paused here");
        gate.hold().await;
    }
    hit(name)
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn pass(_name: &str) -> Result<(), PortError> {
    Ok(())
}

/// Fails if `name` is armed (once; the point then disarms itself).
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) -> Result<(), PortError> {
    let mut armed = armed::ARMED.lock().unwrap_or_else(|e| e.into_inner());
    let Some(skip) = armed.as_mut().and_then(|m| m.get_mut(name)) else {
        return Ok(());
    };
    if *skip > 0 {
        *skip -= 1;
        return Ok(());
    }
    armed.as_mut().map(|m| m.remove(name));
    armed::FIRED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(name.to_owned());
    tracing::warn!(failpoint = name, "failpoint: crashing here");
    Err(PortError::Unavailable {
        message: format!("failpoint `{name}`"),
        source: None,
    })
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) -> Result<(), PortError> {
    Ok(())
}

/// Whether `e` is a failpoint's crash: what fails so stands for a dead process, which tries
/// nothing again.
pub fn is_crash(e: &PortError) -> bool {
    cfg!(feature = "failpoints")
        && matches!(e, PortError::Unavailable { message, source: None } if message.starts_with("failpoint `"))
}

/// Arms `name` to fail on its `skip + 1`-th pass from now.
#[cfg(feature = "failpoints")]
pub fn arm(name: &str, skip: u32) {
    armed::ARMED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(Default::default)
        .insert(name.to_owned(), skip);
}

/// Disarms every point and forgets what fired.
#[cfg(feature = "failpoints")]
pub fn reset() {
    *armed::ARMED.lock().unwrap_or_else(|e| e.into_inner()) = None;
    *armed::PAUSED.lock().unwrap_or_else(|e| e.into_inner()) = None;
    armed::FIRED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
}

/// Whether `name` fired since the last [`reset`].
#[cfg(feature = "failpoints")]
pub fn fired(name: &str) -> bool {
    armed::FIRED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|f| f == name)
}
