//! Lambda's recursive loop detection, as the stand-in holds the functions to it. Lambda
//! counts the hops of a chain of invocations through SQS: a function invoked by a queue's
//! message that sends a message makes it one hop further along (the count rides in the
//! trace header the SDK forwards), and past about 16 hops Lambda stops invoking a function
//! whose `RecursiveLoop` is not `Allow`
//! (<https://docs.aws.amazon.com/lambda/latest/dg/invocation-recursion.html>). Here each
//! message a function sends within an invocation is counted one hop past the invocation's
//! own, by the message's id, and the event source mappings invoke no function that may not
//! loop with a record past the bound ([`crate::event_source`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use baton_core::error::PortError;
use baton_core::message::StepMessage;
use baton_core::ports::Queue;

/// Past this many hops Lambda stops invoking a function that may not loop ("about 16").
pub const MAX_HOPS: u32 = 16;

/// The most messages whose hops are kept: a long `baton dev --aws` session forgets the
/// oldest chains (their messages count from 0 again, as an API request's do).
const KEPT: usize = 100_000;

tokio::task_local! {
    /// The hops of the invocation this task runs (unset outside one: an API request).
    static HOPS: u32;
}

/// Each message's hops, by its id, as the functions sent them.
#[derive(Debug, Clone, Default)]
pub struct Lineage(Arc<Mutex<HashMap<String, u32>>>);

impl Lineage {
    /// The hops of the message a record carries (its body's `id`): 0 for one that no
    /// invocation sent.
    pub fn of(&self, body: &str) -> u32 {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(body) else {
            return 0;
        };
        let Some(id) = message["id"].as_str() else {
            return 0;
        };
        let hops = self.0.lock().unwrap_or_else(|e| e.into_inner());
        hops.get(id).copied().unwrap_or(0)
    }

    /// Runs `invocation` as one `hops` along its chain: what it sends is one further.
    pub async fn invoked<F: Future>(hops: u32, invocation: F) -> F::Output {
        HOPS.scope(hops, invocation).await
    }

    /// `queue`, with what it sends within an invocation counted.
    pub fn counting(&self, queue: Arc<dyn Queue>) -> Arc<dyn Queue> {
        Arc::new(Counting {
            queue,
            lineage: self.clone(),
        })
    }

    fn sent(&self, messages: &[StepMessage]) {
        let Ok(hops) = HOPS.try_with(|h| *h) else {
            return;
        };
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() + messages.len() > KEPT {
            kept.clear();
        }
        for m in messages {
            kept.insert(m.id.clone(), hops + 1);
        }
    }
}

/// A function's queue client, its sends counted ([`Lineage::counting`]).
struct Counting {
    queue: Arc<dyn Queue>,
    lineage: Lineage,
}

#[async_trait::async_trait]
impl Queue for Counting {
    async fn send(&self, messages: &[StepMessage]) -> Result<(), PortError> {
        self.queue.send(messages).await?;
        self.lineage.sent(messages);
        Ok(())
    }

    async fn waiting(&self, run_id: &str) -> Result<bool, PortError> {
        self.queue.waiting(run_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Sink;

    #[async_trait::async_trait]
    impl Queue for Sink {
        async fn send(&self, _: &[StepMessage]) -> Result<(), PortError> {
            Ok(())
        }
    }

    fn message(id: &str) -> StepMessage {
        StepMessage {
            run_id: "run_1".into(),
            id: id.into(),
            input: baton_core::message::Input::Start,
            owed: false,
        }
    }

    #[tokio::test]
    async fn a_message_sent_within_an_invocation_is_one_hop_past_it() {
        let lineage = Lineage::default();
        let queue = lineage.counting(Arc::new(Sink));
        // Outside an invocation (an API request): nothing counted.
        queue.send(&[message("m0")]).await.unwrap();
        let body = |id: &str| serde_json::to_string(&message(id)).unwrap();
        assert_eq!(lineage.of(&body("m0")), 0);
        let hops = lineage.of(&body("m0"));
        Lineage::invoked(hops, queue.send(&[message("m1")]))
            .await
            .unwrap();
        assert_eq!(lineage.of(&body("m1")), 1);
        let hops = lineage.of(&body("m1"));
        Lineage::invoked(hops, queue.send(&[message("m2"), message("m3")]))
            .await
            .unwrap();
        assert_eq!((lineage.of(&body("m2")), lineage.of(&body("m3"))), (2, 2));
        assert_eq!(lineage.of("not json"), 0);
    }
}
