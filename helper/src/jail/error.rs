//! `(stage, errno)` errors and the status channel they are reported on.

use nix::errno::Errno;
use palisade_protocol::status::encode_record;
use palisade_protocol::{HelperFailure, HelperRecord, Stage};
use std::os::fd::{BorrowedFd, RawFd};

/// The status channel: a pipe (or file) from the caller, close-on-exec.
pub const STATUS_FD: i32 = 4;

/// Exit status of a helper that failed before exec.
pub const EXIT_HELPER_FAILED: i32 = 125;

#[derive(Debug)]
pub struct HelperError {
    pub stage: Stage,
    pub errno: Errno,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, HelperError>;

/// A failure that no system call reported (a bad plan, a failed check).
pub fn fail(stage: Stage, errno: Errno, message: impl Into<String>) -> HelperError {
    HelperError { stage, errno, message: message.into() }
}

/// Attaches the stage and a description of the attempt to a failed call;
/// the message becomes `"<what>: <ERRNO>"`.
pub trait Context<T> {
    fn at(self, stage: Stage, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for nix::Result<T> {
    fn at(self, stage: Stage, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|errno| HelperError { stage, errno, message: format!("{}: {errno:?}", what()) })
    }
}

impl<T> Context<T> for std::io::Result<T> {
    fn at(self, stage: Stage, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| {
            let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
            let detail = if errno == Errno::UnknownErrno { e.to_string() } else { format!("{errno:?}") };
            HelperError { stage, errno, message: format!("{}: {detail}", what()) }
        })
    }
}

/// The status channel, fd 4, which no step of the helper ever closes.
pub fn status_channel() -> BorrowedFd<'static> {
    // SAFETY: fd 4 is the status channel by the helper's calling convention;
    // `fds::check_conventions` verified it is open before anything else ran.
    unsafe { BorrowedFd::borrow_raw(STATUS_FD) }
}

/// Writes one record on the status channel with a single `write`.
pub fn send(record: &HelperRecord) {
    let bytes = encode_record(record);
    if nix::unistd::write(status_channel(), &bytes) != Ok(bytes.len()) {
        // Nothing else can carry the report: the caller will see the exit status alone.
        eprintln!("palisade-helper: cannot write to the status channel: {record:?}");
    }
}

/// Writes one record with descriptors attached, in order, in one message.
pub fn send_with_fds(record: &HelperRecord, fds: &[RawFd]) -> nix::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let bytes = encode_record(record);
    let sent = sendmsg::<()>(
        STATUS_FD,
        &[std::io::IoSlice::new(&bytes)],
        &[ControlMessage::ScmRights(fds)],
        MsgFlags::empty(),
        None,
    )?;
    if sent == bytes.len() { Ok(()) } else { Err(Errno::EIO) }
}

/// Reports a failure on the status channel.
pub fn report(err: &HelperError) {
    let errno = err.errno as i32;
    send(&HelperRecord::Failed(HelperFailure {
        stage: err.stage,
        errno,
        errno_name: if errno == 0 { "-".into() } else { format!("{:?}", err.errno) },
        message: err.message.clone(),
    }));
}
