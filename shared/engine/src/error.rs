//! Errors of the ports, split the way a durable system must split them: retryable
//! (the message goes back to the queue) versus terminal (record it, fail the run, acknowledge).

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a port (store, queue, bus, scheduler) can fail with.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// A conditional write lost: the item moved on (another writer, or a redelivery).
    #[error("conditional write failed: the item has changed")]
    Conflict,
    /// The backend is unavailable, throttled or timed out: try again later.
    #[error("{message}")]
    Unavailable {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    /// The store's disk is full: nothing was written. Retryable: writes succeed again once
    /// space is freed (a host retries such a step soon, and does not count it as a failure).
    #[error("{message}")]
    StorageFull {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    /// A quota's conditional write refused: the owner already has `limit` active runs
    /// (`current`, as read after the refusal). Nothing was written.
    #[error("{limit} active runs is this owner's limit (it has {current})")]
    QuotaExceeded { limit: u64, current: u64 },
    /// The owner has spent its day's allowance (`spent_usd` of `limit_usd`, this UTC day).
    /// Nothing was written.
    #[error("this owner spent ${spent_usd:.4} of its ${limit_usd:.4} today")]
    DailyCostExceeded { limit_usd: f64, spent_usd: f64 },
    /// Stored data or a request is broken; retrying will not help.
    #[error("{message}")]
    Broken {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
}

impl PortError {
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }
    pub fn broken(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Broken {
            message: message.into(),
            source: Some(source.into()),
        }
    }
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. } | Self::Conflict | Self::StorageFull { .. }
        )
    }

    /// Whether the backend is unavailable for now (a throttle, an outage, a timeout): the
    /// same write may go through if sent again.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether the store's disk is full (see [`PortError::StorageFull`]).
    pub fn is_storage_full(&self) -> bool {
        matches!(self, Self::StorageFull { .. })
    }
}
