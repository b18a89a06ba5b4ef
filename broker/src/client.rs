//! A blocking client for the broker's socket (what the CLI uses).

use palisade_protocol::wire::{
    ClientMessage, Decoder, Encoding, ErrorReply, Hello, RunRequest, RunResult, ServerMessage, Stream, encode,
};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;

#[derive(Debug)]
pub enum ClientError {
    /// Connecting, reading or writing failed.
    Io(std::io::Error),
    /// The broker answered with an error.
    Reply(ErrorReply),
    /// The broker said something that makes no sense here.
    Protocol(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Reply(r) => write!(f, "{}: {}", r.kind, r.message),
            ClientError::Protocol(e) => write!(f, "protocol error: {e}"),
        }
    }
}

/// What a run sends before its result.
pub enum Event<'a> {
    /// A piece of output, in the client's receive buffer.
    Output(Stream, &'a [u8]),
    /// Any other message (`Started`, ...).
    Message(&'a ServerMessage),
}

pub struct Client {
    stream: UnixStream,
    decoder: Decoder,
    encoding: Encoding,
    /// The hello is sent but its answer not yet read.
    hello_pending: bool,
}

impl Client {
    /// Connects and completes the handshake.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let mut client = Client::open(path)?;
        client.finish_hello()?;
        Ok(client)
    }

    /// Connects and sends the hello without waiting for the answer, which
    /// is read before the first reply to a request: a run then costs one
    /// round trip instead of two. A refused hello still fails that request.
    pub fn open(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(ClientError::Io)?;
        let encoding = Encoding::Bincode;
        let mut client =
            Client { stream, decoder: Decoder::new(Some(encoding)), encoding, hello_pending: true };
        client.send(&ClientMessage::Hello(Hello::new(encoding)))?;
        Ok(client)
    }

    fn finish_hello(&mut self) -> Result<(), ClientError> {
        if !std::mem::take(&mut self.hello_pending) {
            return Ok(());
        }
        match self.receive()? {
            ServerMessage::Hello(_) => Ok(()),
            ServerMessage::Error(e) => Err(ClientError::Reply(e)),
            other => Err(ClientError::Protocol(format!("expected a hello, got {other:?}"))),
        }
    }

    pub fn send(&mut self, msg: &ClientMessage) -> Result<(), ClientError> {
        let bytes = encode(msg, self.encoding).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.stream.write_all(&bytes).map_err(ClientError::Io)
    }

    pub fn receive(&mut self) -> Result<ServerMessage, ClientError> {
        loop {
            if let Some(m) = self.decoder.next_message().map_err(|e| ClientError::Protocol(e.to_string()))? {
                return Ok(m);
            }
            self.read_more()?;
        }
    }

    /// One read from the broker into the decoder; its end is an error here.
    fn read_more(&mut self) -> Result<(), ClientError> {
        let n = self.decoder.read_from(&mut self.stream, 64 * 1024).map_err(ClientError::Io)?;
        if n == 0 {
            return Err(ClientError::Protocol("the broker closed the connection".into()));
        }
        Ok(())
    }

    /// Runs a command; `each` sees every message before the final one.
    pub fn run(
        &mut self,
        request: RunRequest,
        each: impl FnMut(&ServerMessage),
    ) -> Result<RunResult, ClientError> {
        // Nobody to ask: a run that needs approval is refused.
        self.run_with_approval(request, each, |_| false)
    }

    /// Runs `request`; a run that needs approval is put to `approve`, which
    /// asks a person and says whether they approved.
    pub fn run_with_approval(
        &mut self,
        request: RunRequest,
        mut each: impl FnMut(&ServerMessage),
        approve: impl FnMut(&str) -> bool,
    ) -> Result<RunResult, ClientError> {
        let on = |event: Event<'_>| match event {
            Event::Output(stream, data) => each(&ServerMessage::Output { stream, data: data.to_vec() }),
            Event::Message(m) => each(m),
        };
        self.run_events(request, on, approve)
    }

    /// Runs `request`: `on` sees each piece of output where it was received
    /// (no copy) and every other message before the final one; `approve`
    /// puts a question to a person, if the run needs one.
    pub fn run_events(
        &mut self,
        request: RunRequest,
        mut on: impl FnMut(Event<'_>),
        mut approve: impl FnMut(&str) -> bool,
    ) -> Result<RunResult, ClientError> {
        let sent = self.send(&ClientMessage::Run(request));
        // A refused hello explains a failed send (the broker hung up after refusing).
        self.finish_hello()?;
        sent?;
        loop {
            if let Some((stream, bytes)) = self.decoder.next_output() {
                on(Event::Output(stream, bytes));
                continue;
            }
            let next = self.decoder.next_message().map_err(|e| ClientError::Protocol(e.to_string()))?;
            let Some(message) = next else {
                // More bytes, then look for an output frame first again.
                self.read_more()?;
                continue;
            };
            match message {
                ServerMessage::Finished(r) => return Ok(*r),
                ServerMessage::Error(e) => return Err(ClientError::Reply(e)),
                ServerMessage::ApprovalRequired { reason } => {
                    let approved = approve(&reason);
                    self.send(&ClientMessage::Approve { approved })?;
                }
                ServerMessage::Output { stream, data } => on(Event::Output(stream, &data)),
                other => on(Event::Message(&other)),
            }
        }
    }
}
