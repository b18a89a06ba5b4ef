//! Who is asking.

/// Who is asking: the peer's credentials from the socket (SO_PEERCRED, or
/// getpeereid and its pid on macOS) and its groups (SO_PEERGROUPS on
/// Linux), or the CLI's own.
#[derive(Debug, Clone)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
    pub groups: Vec<u32>,
}
