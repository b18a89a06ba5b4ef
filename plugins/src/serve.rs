//! `palisade-plugin-host`'s loop: frames from the broker on stdin (read by
//! a thread of their own, so a wait for a host function's answer can end at
//! the call's deadline), answers on stdout, one call at a time.

use std::io::{self, Read, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::Instant;

use palisade_protocol::plugin::{self, FromHost, HostFn, PLUGIN_FRAME_MAX, ToHost};

use crate::host_fns::{HostCallError, HostCalls};
use crate::runtime::Runtime;

/// What the reader thread saw on stdin.
pub enum Inbound {
    Message(ToHost),
    /// A frame whose body did not decode: the stream is still in sync.
    Malformed(String),
    /// The end of stdin.
    End,
    /// A read failed or a length was out of bounds: the stream is lost.
    Broken(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("stdin: {0}")]
    Input(String),
    #[error("stdout: {0}")]
    Output(#[from] io::Error),
    #[error("starting the reader thread: {0}")]
    Thread(io::Error),
}

/// Reads frames from `input` on a thread of its own until its end or a loss of sync.
pub fn spawn_reader(mut input: impl Read + Send + 'static) -> Result<Receiver<Inbound>, ServeError> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("frame-reader".into())
        .spawn(move || {
            loop {
                let inbound = next_frame(&mut input);
                let last = matches!(inbound, Inbound::End | Inbound::Broken(_));
                if tx.send(inbound).is_err() || last {
                    return;
                }
            }
        })
        .map_err(ServeError::Thread)?;
    Ok(rx)
}

fn next_frame(input: &mut impl Read) -> Inbound {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Inbound::End,
        Err(e) => return Inbound::Broken(e.to_string()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > PLUGIN_FRAME_MAX {
        return Inbound::Broken(format!("a frame of {len} bytes exceeds {PLUGIN_FRAME_MAX}"));
    }
    let mut body = vec![0u8; len];
    if let Err(e) = input.read_exact(&mut body) {
        return Inbound::Broken(format!("a frame's body: {e}"));
    }
    match plugin::decode_body(&body) {
        Ok(m) => Inbound::Message(m),
        Err(e) => Inbound::Malformed(e),
    }
}

/// Writes one frame and flushes it.
pub fn send(out: &mut impl Write, message: &FromHost) -> io::Result<()> {
    let frame = plugin::encode_frame(message).map_err(io::Error::other)?;
    out.write_all(&frame)?;
    out.flush()
}

/// Serves until the end of input (`Ok`) or a broken stream (`Err`).
pub fn serve(
    runtime: &mut Runtime,
    inbox: &Receiver<Inbound>,
    out: &mut impl Write,
) -> Result<(), ServeError> {
    send(out, &FromHost::Ready { engine: runtime.engine_digest().to_string() })?;
    while let Ok(inbound) = inbox.recv() {
        match inbound {
            Inbound::Message(ToHost::Compile { id, module }) => {
                let answer = match runtime.compile(&module) {
                    Ok(artifact) => FromHost::Compiled { id, artifact },
                    Err(e) => FromHost::Failed { id, message: e.to_string() },
                };
                send_or_fail(out, id, &answer)?;
            }
            Inbound::Message(ToHost::Call(call)) => {
                let mut link = BrokerLink { inbox, out: &mut *out, call_id: call.id, broken: None };
                let answer = match runtime.call(&call, &mut link) {
                    Ok(done) => FromHost::Done(done),
                    Err(e) => FromHost::Failed { id: call.id, message: e.to_string() },
                };
                let broken = link.broken.take();
                send_or_fail(out, call.id, &answer)?;
                if let Some(why) = broken {
                    return Err(ServeError::Input(why));
                }
            }
            Inbound::Message(ToHost::HostReply { id, .. }) => {
                eprintln!("palisade-plugin-host: a reply for {id} after its call ended: discarded");
            }
            Inbound::Malformed(why) => {
                send(out, &FromHost::Failed { id: 0, message: format!("a malformed frame: {why}") })?
            }
            Inbound::End => return Ok(()),
            Inbound::Broken(why) => return Err(ServeError::Input(why)),
        }
    }
    Ok(())
}

/// Sends `answer`, or `Failed` if it does not fit in a frame.
fn send_or_fail(out: &mut impl Write, id: u64, answer: &FromHost) -> io::Result<()> {
    match plugin::encode_frame(answer) {
        Ok(_) => send(out, answer),
        Err(e) => send(out, &FromHost::Failed { id, message: e }),
    }
}

/// A running call's way to the broker: `HostCall` out, `HostReply` back.
struct BrokerLink<'a, W: Write> {
    inbox: &'a Receiver<Inbound>,
    out: &'a mut W,
    call_id: u64,
    broken: Option<String>,
}

impl<W: Write> BrokerLink<'_, W> {
    fn broke(&mut self, why: String) -> HostCallError {
        self.broken = Some(why.clone());
        HostCallError::Broken(why)
    }
}

impl<W: Write> HostCalls for BrokerLink<'_, W> {
    fn call(&mut self, function: HostFn, args: &[u8], deadline: Instant) -> Result<Vec<u8>, HostCallError> {
        let ask = FromHost::HostCall { id: self.call_id, function, args: args.to_vec() };
        if let Err(e) = send(self.out, &ask) {
            return Err(self.broke(format!("stdout: {e}")));
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let inbound = match self.inbox.recv_timeout(left) {
                Ok(inbound) => inbound,
                Err(RecvTimeoutError::Timeout) => return Err(HostCallError::DeadlinePassed),
                Err(RecvTimeoutError::Disconnected) => return Err(self.broke("the reader is gone".into())),
            };
            let busy =
                |id| FromHost::Failed { id, message: format!("busy: call {} is running", self.call_id) };
            let refusal = match inbound {
                Inbound::Message(ToHost::HostReply { id, result }) if id == self.call_id => {
                    return result.map_err(HostCallError::Failed);
                }
                Inbound::Message(ToHost::HostReply { id, .. }) => {
                    eprintln!(
                        "palisade-plugin-host: a reply for {id} during call {}: discarded",
                        self.call_id
                    );
                    continue;
                }
                Inbound::Message(ToHost::Compile { id, .. }) => busy(id),
                Inbound::Message(ToHost::Call(c)) => busy(c.id),
                Inbound::Malformed(why) => {
                    FromHost::Failed { id: 0, message: format!("a malformed frame: {why}") }
                }
                Inbound::End => return Err(self.broke("the end of stdin".into())),
                Inbound::Broken(why) => return Err(self.broke(why)),
            };
            if let Err(e) = send(self.out, &refusal) {
                return Err(self.broke(format!("stdout: {e}")));
            }
        }
    }
}
