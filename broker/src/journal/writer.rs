//! The writer thread: takes every append waiting, writes them as one batch,
//! syncs once, answers each. Before a batch it checks the free-space floor
//! (what starts something new waits for space; what is under way is
//! written), puts in the summaries of the refusal periods that ended, and
//! bounds every record's size. Ends when every `Journal` is dropped, after
//! the summaries still held.

use super::rate::RefusalRate;
use super::record::Entry;
use super::store::Store;
use super::{Event, JournalError, Receipt, bound, fields};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

/// The most appends one batch takes (each its own events).
const MAX_BATCH: usize = 256;

/// What the writer answers an append with.
pub(super) type Outcome = Result<Vec<Receipt>, JournalError>;

/// What an append is for, which decides how the floor treats it and how
/// long its records may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// Records of what is under way (a run's end, an approval, the
    /// broker's start): written while the disk has room.
    Ongoing,
    /// Records that start a run: refused below the free-space floor.
    Start,
    /// A refused request's records: refused below the floor, and bounded
    /// by [`bound::REFUSAL_RECORD_BYTES`].
    Refusal,
    /// The broker's last record: every refusal still counted is summarized first.
    Last,
}

impl Class {
    fn held_by_floor(self) -> bool {
        matches!(self, Class::Start | Class::Refusal)
    }

    fn limit(self) -> usize {
        match self {
            Class::Refusal => bound::REFUSAL_RECORD_BYTES,
            _ => bound::MAX_RECORD_BYTES,
        }
    }
}

/// Appends waiting for the writer, and how to answer each.
pub(super) struct Pending {
    pub events: Vec<Event>,
    pub durable: bool,
    pub class: Class,
    pub reply: Reply,
}

impl Pending {
    /// Nothing to write: wakes the writer to look at when refusal periods end.
    pub fn wake() -> Pending {
        Pending { events: vec![], durable: false, class: Class::Ongoing, reply: Reply::Nobody }
    }
}

/// Where an append waits: a task, or a thread that may block (even one
/// that drives a runtime, as the CLI's decision does).
pub(super) enum Reply {
    Task(tokio::sync::oneshot::Sender<Outcome>),
    Thread(mpsc::SyncSender<Outcome>),
    Nobody,
}

impl Reply {
    fn send(self, outcome: Outcome) {
        let _ = match self {
            Reply::Task(t) => t.send(outcome).map_err(drop),
            Reply::Thread(t) => t.send(outcome).map_err(drop),
            Reply::Nobody => Ok(()),
        };
    }
}

pub(super) struct Writer {
    pub store: Store,
    pub rate: Arc<RefusalRate>,
    /// `[journal] min_free_bytes`; 0: no floor.
    pub min_free_bytes: u64,
    /// Refusals below the floor, logged a few at a time.
    pub below_floor: crate::logs::refusals::Refusals,
}

impl Writer {
    pub fn run(mut self, queue: mpsc::Receiver<Pending>) {
        loop {
            let first = match self.rate.next_due() {
                Some(due) => match queue.recv_timeout(due.saturating_duration_since(Instant::now())) {
                    Ok(p) => Some(p),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                },
                None => match queue.recv() {
                    Ok(p) => Some(p),
                    Err(_) => break,
                },
            };
            let mut batch: Vec<Pending> = first.into_iter().collect();
            while !batch.is_empty() && batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(p) => batch.push(p),
                    Err(_) => break,
                }
            }
            let last = batch.iter().any(|p| p.class == Class::Last);
            let summaries = self.rate.take(Instant::now(), last);
            self.write(batch, summaries);
        }
        let summaries = self.rate.take(Instant::now(), true);
        self.write(vec![], summaries);
    }

    /// Writes `summaries` and the appends of `batch` the floor lets
    /// through, in one batch, and answers each.
    fn write(&mut self, batch: Vec<Pending>, summaries: Vec<Event>) {
        let batch = self.hold_below_floor(batch);
        if batch.iter().all(|p| p.events.is_empty()) && summaries.is_empty() {
            batch.into_iter().for_each(|p| p.reply.send(Ok(vec![])));
            return;
        }
        let durable = !summaries.is_empty() || batch.iter().any(|p| p.durable);
        let mut entries: Vec<Entry> = summaries
            .iter()
            .map(|e| Entry {
                fields: bound::bounded(fields(e), bound::REFUSAL_RECORD_BYTES),
                answered: false,
            })
            .collect();
        let mut counts = Vec::with_capacity(batch.len());
        for p in &batch {
            counts.push(p.events.len());
            let limit = p.class.limit();
            entries.extend(
                p.events.iter().map(|e| Entry { fields: bound::bounded(fields(e), limit), answered: true }),
            );
        }
        let written = self.store.append(entries, durable);
        if let Err(e) = &written {
            tracing::error!("{e}");
            // Written with the next batch that can be.
            self.rate.restore(summaries);
        }
        let mut receipts = written.as_ref().map(|r| r.iter()).ok();
        for (p, n) in batch.into_iter().zip(counts) {
            let answer = match &mut receipts {
                Some(r) => {
                    Ok(r.by_ref().take(n).map(|h| Receipt { seq: h.seq, hash: h.hash.clone() }).collect())
                }
                None => Err(written.as_ref().err().cloned().unwrap_or(JournalError::Stopped)),
            };
            p.reply.send(answer);
        }
    }

    /// Answers the appends that start something new with
    /// [`JournalError::BelowFloor`] when the journal's filesystem is below
    /// its floor; the others, to be written.
    fn hold_below_floor(&self, batch: Vec<Pending>) -> Vec<Pending> {
        if self.min_free_bytes == 0 || !batch.iter().any(|p| p.class.held_by_floor()) {
            return batch;
        }
        let free = match self.store.free_bytes() {
            Ok(free) => free,
            Err(e) => {
                // Not known to be below it: the write itself finds a full disk.
                tracing::warn!("journal: cannot read the free space of its filesystem: {e}");
                return batch;
            }
        };
        if free >= self.min_free_bytes {
            return batch;
        }
        let (held, kept): (Vec<Pending>, Vec<Pending>) =
            batch.into_iter().partition(|p| p.class.held_by_floor());
        let error = JournalError::BelowFloor {
            dir: self.store.dir().display().to_string(),
            free,
            floor: self.min_free_bytes,
        };
        if let Some(unlogged) = self.below_floor.note(Instant::now()) {
            tracing::warn!("{error}{}", crate::logs::refusals::unlogged_suffix(unlogged));
        }
        held.into_iter().for_each(|p| p.reply.send(Err(error.clone())));
        kept
    }
}
