//! The helper's calling convention, checked against the built binary: no
//! arguments, stdio and fds 3 and 4 open, a well-formed plan. (The sandbox
//! itself is tested from inside by the workspace's `tests` crate.)

use palisade_protocol::status::decode_records;
use palisade_protocol::{HelperRecord, Stage};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

const HELPER: &str = env!("CARGO_BIN_EXE_palisade-helper");

#[test]
fn arguments_are_refused() {
    let out = Command::new(HELPER).arg("--plan=x").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("takes no arguments"));
}

#[test]
fn missing_plan_and_status_descriptors_are_refused() {
    let mut cmd = Command::new(HELPER);
    cmd.stdin(Stdio::null());
    // SAFETY: only close, which is async-signal-safe. Whoever runs the tests
    // may have left fds 3 and 4 open; the helper must see them closed.
    unsafe {
        cmd.pre_exec(|| {
            libc::close(3);
            libc::close(4);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fd 3 is not open"), "{out:?}");
}

/// A close-on-exec pipe: only the ends the helper is handed (dup2 clears the
/// flag on the copies) reach it. (The plan's socket pair is close-on-exec
/// too: an inherited writer would keep the helper waiting for an end of file
/// that never comes.)
fn pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
}

/// Runs the helper with `plan` on fd 3 (a Unix stream socket, as the
/// convention says) and returns its status records.
fn run_with_plan(plan: &[u8]) -> (Option<i32>, Vec<HelperRecord>) {
    let (plan_w, plan_r) = std::os::unix::net::UnixStream::pair().unwrap();
    let (status_r, status_w) = pipe();
    let (p, s) = (plan_r.as_raw_fd(), status_w.as_raw_fd());
    let mut cmd = Command::new(HELPER);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: only dup2, which is async-signal-safe; the sources are above 4 or
    // moved in an order that cannot clobber them (checked below).
    unsafe {
        cmd.pre_exec(move || {
            for (from, to) in [(p, 103), (s, 104), (103, 3), (104, 4)] {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop((plan_r, status_w));
    let mut w = plan_w;
    let _ = w.write_all(plan);
    drop(w);
    let code = child.wait().unwrap().code();
    let mut bytes = Vec::new();
    std::fs::File::from(status_r).read_to_end(&mut bytes).unwrap();
    (code, decode_records(&bytes).unwrap())
}

#[test]
fn a_garbage_plan_is_refused_at_the_plan_stage() {
    let (code, records) = run_with_plan(b"not a plan at all");
    assert_eq!(code, Some(125));
    match records.as_slice() {
        [HelperRecord::Failed(f)] => {
            assert_eq!((f.stage, f.errno), (Stage::Plan, libc::EINVAL));
            assert_eq!(f.message, "not a palisade plan (bad magic)");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_oversized_plan_is_refused_without_reading_it_all() {
    let huge = vec![0u8; palisade_protocol::PLAN_MAX_BYTES + 4096];
    let (code, records) = run_with_plan(&huge);
    assert_eq!(code, Some(125));
    assert!(
        matches!(&records[..], [HelperRecord::Failed(f)] if f.stage == Stage::Plan && f.message.contains("exceeds"))
    );
}
