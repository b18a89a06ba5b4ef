//! The broker's core, shared by palisaded and the CLI's embedded broker:
//! decide by policy, then execute.

use crate::run::{Engine, Sink};
use palisade_policy::{Config, Context, Decision, decide};
use palisade_protocol::wire::{ErrorKind, ErrorReply, RunRequest, RunResult};
use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

pub struct Broker {
    pub engine: Engine,
    pub config: Config,
    pub context: Context,
}

/// Who is asking: the peer's credentials from SO_PEERCRED (or the CLI's own).
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

impl Broker {
    pub async fn run<S: Sink + Send>(
        &self,
        peer: Peer,
        request: &RunRequest,
        sink: &mut S,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<RunResult, ErrorReply> {
        let resolved = match decide(&self.config, &self.context, request) {
            Decision::Allow(r) => r,
            Decision::Deny(d) => return Err(ErrorReply { kind: d.kind, message: d.reason }),
            Decision::NeedsApproval { reason } => {
                return Err(ErrorReply { kind: ErrorKind::NeedsApproval, message: reason });
            }
        };
        self.check_ownership(peer, &resolved.writable)?;
        self.engine.execute(&resolved, request, sink, cancel).await
    }

    /// A broker serving other users must not lend them its own access: every
    /// writable path must belong to the peer (root peers excepted).
    fn check_ownership(&self, peer: Peer, writable: &[PathBuf]) -> Result<(), ErrorReply> {
        if peer.uid == self.context.uid || peer.uid == 0 {
            return Ok(());
        }
        for path in writable {
            let owner = std::fs::metadata(path).map(|m| m.uid()).unwrap_or(u32::MAX);
            if owner != peer.uid {
                return Err(ErrorReply {
                    kind: ErrorKind::WorkspaceScopeDenied,
                    message: format!(
                        "{} is not owned by uid {} (the requesting peer)",
                        path.display(),
                        peer.uid
                    ),
                });
            }
        }
        Ok(())
    }
}
