//! Progress notifications for a call whose client asked for them (its
//! request carries a `progressToken`): while the run goes on, at most one a
//! second, the amount of output so far and its latest lines (bounded), and
//! at once, what a run waiting for an approval waits for.

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The latest lines a notification carries, and the characters of each.
const LINES: usize = 5;
const LINE_CHARS: usize = 200;
/// How often new output is reported, at most.
const EVERY: Duration = Duration::from_secs(1);

/// A call's progress: nothing when its client did not ask for it.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<Shared>>);

struct Shared {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    runtime: tokio::runtime::Handle,
    tail: Mutex<Tail>,
}

/// The output seen so far: its size, its last whole lines and the line
/// being written.
#[derive(Default)]
struct Tail {
    bytes: u64,
    lines: VecDeque<String>,
    partial: String,
    /// Output arrived since the last notification.
    changed: bool,
    /// Notifications sent: their `progress`, which only grows.
    sent: u64,
}

impl Tail {
    fn push(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        self.changed = true;
        for piece in String::from_utf8_lossy(data).split_inclusive('\n') {
            let room = LINE_CHARS.saturating_sub(self.partial.chars().count());
            self.partial.extend(piece.trim_end_matches('\n').chars().take(room));
            if piece.ends_with('\n') {
                self.lines.push_back(std::mem::take(&mut self.partial));
                if self.lines.len() > LINES {
                    self.lines.pop_front();
                }
            }
        }
    }

    /// What the next notification says of the output.
    fn message(&self) -> String {
        let mut latest: Vec<&str> = self.lines.iter().map(String::as_str).collect();
        if !self.partial.is_empty() {
            latest.push(&self.partial);
        }
        let skip = latest.len().saturating_sub(LINES);
        format!("{} bytes of output so far; latest:\n{}", self.bytes, latest[skip..].join("\n"))
    }
}

impl Progress {
    /// The progress of the call `context` answers, if its client asked.
    pub fn of(context: &RequestContext<RoleServer>) -> Progress {
        let Some(token) = context.meta.get_progress_token() else { return Progress(None) };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return Progress(None) };
        let tail = Mutex::new(Tail::default());
        Progress(Some(Arc::new(Shared { peer: context.peer.clone(), token, runtime, tail })))
    }

    /// A piece of the run's output (called on the call's blocking thread).
    pub fn output(&self, data: &[u8]) {
        if let Some(shared) = &self.0
            && let Ok(mut tail) = shared.tail.lock()
        {
            tail.push(data);
        }
    }

    /// Says `message` now (any thread).
    pub fn say(&self, message: String) {
        if let Some(shared) = &self.0 {
            let progress = shared.tail.lock().map(|mut t| next(&mut t)).unwrap_or(0.0);
            shared.runtime.spawn(send(shared.clone(), progress, message));
        }
    }

    /// Reports new output each [`EVERY`] until the returned guard is dropped.
    pub fn reporting(&self) -> Option<Reporting> {
        let shared = self.0.clone()?;
        let task = shared.runtime.clone().spawn(async move {
            loop {
                tokio::time::sleep(EVERY).await;
                let due =
                    shared.tail.lock().ok().and_then(|mut t| {
                        std::mem::take(&mut t.changed).then(|| (next(&mut t), t.message()))
                    });
                if let Some((progress, message)) = due {
                    send(shared.clone(), progress, message).await;
                }
            }
        });
        Some(Reporting(task.abort_handle()))
    }
}

/// The task that reports a call's output: stopped when this is dropped.
pub struct Reporting(tokio::task::AbortHandle);

impl Drop for Reporting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The next notification's `progress`.
fn next(tail: &mut Tail) -> f64 {
    tail.sent += 1;
    tail.sent as f64
}

async fn send(shared: Arc<Shared>, progress: f64, message: String) {
    let mut param = ProgressNotificationParam::new(shared.token.clone(), progress);
    param.message = Some(message);
    if let Err(e) = shared.peer.notify_progress(param).await {
        tracing::debug!("progress notification: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_lines_each_bounded() {
        let mut tail = Tail::default();
        tail.push(b"one\ntwo\nthr");
        tail.push(b"ee\n");
        tail.push(&[b'x'; 1000]);
        assert_eq!(tail.bytes, 1014);
        let message = tail.message();
        assert!(message.starts_with("1014 bytes of output so far; latest:\none\ntwo\nthree\n"), "{message}");
        assert!(message.ends_with(&format!("\n{}", "x".repeat(LINE_CHARS))), "{message}");
        // A line written in pieces is bounded as a whole.
        let mut pieces = Tail::default();
        (0..3).for_each(|_| pieces.push(&[b'y'; 150]));
        assert_eq!(pieces.partial.chars().count(), LINE_CHARS);
        for i in 0..20 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        let message = tail.message();
        assert!(message.ends_with("line 15\nline 16\nline 17\nline 18\nline 19"), "{message}");
        assert!(!message.contains("line 14"), "{message}");
    }
}
