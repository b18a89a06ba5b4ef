//! interface shim: replaced by the journal branch at merge.
//!
//! The broker's audit journal as the rest of the broker calls it: events
//! appended, each given a sequence number. This stand-in keeps nothing on
//! disk: a counter for the sequence and a placeholder hash.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The broker's audit journal; cheap to clone (an Arc inside).
#[derive(Clone, Default)]
pub struct Journal {
    next: Arc<AtomicU64>,
}

/// Where a record landed: its sequence number and its hash (lowercase hex sha256).
#[derive(Debug, Clone)]
pub struct Receipt {
    pub seq: u64,
    pub hash: String,
}

/// One event; serialized as the record's fields, with `"event": "<snake_case variant name>"`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A run was put to a person (the requester and/or the approvers).
    ApprovalAsked { approval: u64, run_id: u64, uid: u32, tool: Option<String>, reason: String },
    /// The answer: `by_uid` None when nobody answered (expired, client gone).
    ApprovalAnswered { approval: u64, run_id: u64, by_uid: Option<u32>, approved: bool, why: String },
    /// A tool moved between trust stages ("draft", "trial", "verified").
    TrustChanged {
        tool: String,
        from: String,
        to: String,
        reason: String,
        by_uid: Option<u32>,
        capabilities_sha256: String,
    },
}

/// Why an event could not be recorded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JournalError(String);

impl Journal {
    /// Appends `event` and returns once it is recorded. An error means the
    /// event is NOT recorded: the caller refuses what it was about to do
    /// with `BrokerError::JournalUnavailable(message)`.
    pub async fn append(&self, event: Event) -> Result<Receipt, JournalError> {
        self.append_blocking(event)
    }

    /// The same, for code that may block (no runtime needed).
    pub fn append_blocking(&self, event: Event) -> Result<Receipt, JournalError> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            seq,
            "journal: {}",
            serde_json::to_string(&event).map_err(|e| JournalError(e.to_string()))?
        );
        Ok(Receipt { seq, hash: "0".repeat(64) })
    }
}
