//! The byte tunnel between the sandbox and an origin: both directions at
//! once, large buffers, each buffer counted against the run's quota, closed
//! when idle, when the quota is used up, or at the run's end (by dropping).

use super::account::{Flow, count};
use super::limits::Quota;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Bytes read and written at once in each direction: large enough that a
/// 100 MiB download costs few system calls, small enough for many
/// connections.
pub const TUNNEL_BUFFER: usize = 128 * 1024;

/// How a tunnel ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Both sides closed.
    Closed,
    /// A side failed (reset, broken pipe).
    Failed(String),
    /// No byte either way for the idle timeout.
    Idle,
    /// The run's quota was used up.
    Quota,
}

/// The last time a byte passed, in milliseconds since `start`.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    async fn idle(&self, timeout: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            if Instant::now() >= last + timeout {
                return;
            }
            tokio::time::sleep_until(last + timeout).await;
        }
    }
}

/// Sends `prefix` (bytes already read from the sandbox: the rest of a
/// request head, a ClientHello) to the origin, then tunnels both ways.
pub async fn relay(
    client: &mut TcpStream,
    origin: &mut TcpStream,
    prefix: &[u8],
    quota: &Quota,
    flow: &Flow<'_>,
    idle: Duration,
) -> End {
    let _ = client.set_nodelay(true);
    let _ = origin.set_nodelay(true);
    if !prefix.is_empty() {
        let room = quota.take(prefix.len());
        if let Err(e) = origin.write_all(&prefix[..room]).await {
            return End::Failed(e.to_string());
        }
        count(&flow.out, room);
        if room < prefix.len() {
            return End::Quota;
        }
    }
    let activity = Activity { start: Instant::now(), last_ms: AtomicU64::new(0) };
    let (mut client_read, mut client_write) = client.split();
    let (mut origin_read, mut origin_write) = origin.split();
    let up = pump(&mut client_read, &mut origin_write, quota, &flow.out, &activity);
    let down = pump(&mut origin_read, &mut client_write, quota, &flow.inbound, &activity);
    tokio::select! {
        ended = async { tokio::try_join!(up, down) } => match ended {
            Ok(_) => End::Closed,
            Err(PumpEnd::Quota) => End::Quota,
            Err(PumpEnd::Io(e)) => End::Failed(e.to_string()),
        },
        () = quota.reached() => End::Quota,
        () = activity.idle(idle) => End::Idle,
    }
}

enum PumpEnd {
    Quota,
    Io(std::io::Error),
}

/// One direction: read a buffer, take its room in the quota, write it.
/// At the end of input, the other side's writing half is shut down (a
/// half-close passes through).
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    quota: &Quota,
    counter: &AtomicU64,
    activity: &Activity,
) -> Result<(), PumpEnd>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; TUNNEL_BUFFER];
    loop {
        let n = from.read(&mut buf).await.map_err(PumpEnd::Io)?;
        activity.touch();
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        let room = quota.take(n);
        to.write_all(&buf[..room]).await.map_err(PumpEnd::Io)?;
        count(counter, room);
        activity.touch();
        if room < n {
            return Err(PumpEnd::Quota);
        }
    }
}
