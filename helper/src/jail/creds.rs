//! The sandbox's ids, and no capabilities in any set.
//!
//! Plain syscalls, one per set where the kernel allows it: the bounding set
//! is dropped capability by capability (there is no call for all of it), the
//! ambient set is cleared at once, and one capset empties the rest.

use super::error::{Context, Result, fail};
use nix::errno::Errno;
use nix::unistd::{Gid, Uid, geteuid, getgroups, setgroups, setresgid, setresuid};
use palisade_protocol::{HostIds, Stage};

/// Drops the bounding set (while CAP_SETPCAP may still be held), switches to
/// the plan's ids, then clears every other set and checks that it is empty.
pub fn switch_ids_and_drop_capabilities(uid: u32, gid: u32) -> Result<()> {
    drop_bounding_set()?;
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    setresgid(gid, gid, gid).at(Stage::Ids, || format!("setresgid {gid}"))?;
    setresuid(uid, uid, uid).at(Stage::Ids, || format!("setresuid {uid}"))?;
    clear_sets()
}

/// A helper started by a system broker becomes the plan's unprivileged host
/// ids, its supplementary groups dropped and with no capability left: no
/// process of the sandbox is ever host root or holds the broker's power.
/// Leaving uid 0 clears every capability; a helper started by a dedicated
/// user with ambient capabilities keeps them across `setresuid`, so they are
/// cleared here explicitly, and checked, either way.
pub fn become_host_ids(ids: HostIds) -> Result<()> {
    let (uid, gid) = (Uid::from_raw(ids.uid), Gid::from_raw(ids.gid));
    setgroups(&[]).at(Stage::HostIds, || "drop supplementary groups".into())?;
    setresgid(gid, gid, gid).at(Stage::HostIds, || format!("setresgid {gid}"))?;
    setresuid(uid, uid, uid).at(Stage::HostIds, || format!("setresuid {uid}"))?;
    clear_sets()?;
    // Changing ids made us non-dumpable, which leaves /proc/self owned by
    // root and our own uid and gid maps unwritable to us.
    nix::sys::prctl::set_dumpable(true).at(Stage::HostIds, || "PR_SET_DUMPABLE".into())
}

/// Whether the effective set holds `cap` (one of the first 32).
fn holds(cap: u32) -> Result<bool> {
    Ok(capget()?[0] & (1 << cap) != 0)
}

const CAP_SETGID: u32 = 6;

/// Leaves every supplementary group, where the helper may (it runs as root,
/// or holds CAP_SETGID, in Tier B): the command's new uid must not keep the
/// broker's groups. An ordinary user cannot drop theirs (README:
/// supplementary groups).
pub fn drop_supplementary_groups() -> Result<()> {
    if !geteuid().is_root() && !holds(CAP_SETGID)? {
        return Ok(());
    }
    setgroups(&[]).at(Stage::Ids, || "drop supplementary groups".into())?;
    let left = getgroups().at(Stage::Ids, || "getgroups".into())?;
    if !left.is_empty() {
        return Err(fail(Stage::Ids, Errno::EPERM, format!("supplementary groups still held: {left:?}")));
    }
    Ok(())
}

/// Empties the bounding set (when allowed) and every other set, then verifies.
pub fn drop_capabilities() -> Result<()> {
    drop_bounding_set()?;
    clear_sets()
}

const CAP_SETPCAP: u32 = 8;

/// The effective, permitted and inheritable sets as two 32-bit words each.
type Sets = [libc::c_uint; 6];

fn header() -> [u32; 2] {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    [LINUX_CAPABILITY_VERSION_3, 0]
}

fn capget() -> Result<Sets> {
    let mut hdr = header();
    let mut data: Sets = [0; 6];
    // SAFETY: a version-3 header and room for two capability data structs
    // (three u32 each), both valid for the call.
    let rc = unsafe { libc::syscall(libc::SYS_capget, hdr.as_mut_ptr(), data.as_mut_ptr()) };
    Errno::result(rc).at(Stage::Capabilities, || "capget".into())?;
    Ok(data)
}

fn clear_sets() -> Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) };
    Errno::result(rc).at(Stage::Capabilities, || "clear the ambient set".into())?;
    let mut hdr = header();
    let data: Sets = [0; 6];
    // SAFETY: a version-3 header and two zeroed capability data structs, valid for the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, hdr.as_mut_ptr(), data.as_ptr()) };
    Errno::result(rc)
        .at(Stage::Capabilities, || "clear the effective, permitted and inheritable sets".into())?;
    // The ambient set is a subset of permitted ∩ inheritable, so this covers it too.
    let left = capget()?;
    if left != [0; 6] {
        return Err(fail(Stage::Capabilities, Errno::EPERM, format!("capability sets still hold {left:x?}")));
    }
    Ok(())
}

/// Dropping the bounding set needs CAP_SETPCAP. A process without it (Tier B
/// run by an ordinary user) has empty permitted, inheritable and ambient sets
/// and no_new_privs, so no exec can give it anything the bounding set would
/// have to stop.
fn drop_bounding_set() -> Result<()> {
    let effective = capget()?;
    if effective[0] & (1 << CAP_SETPCAP) == 0 {
        return Ok(());
    }
    // Every capability the kernel knows: PR_CAPBSET_DROP answers EINVAL past the last.
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        match Errno::result(rc) {
            Err(Errno::EINVAL) if cap > 0 => return Ok(()),
            done => {
                done.at(Stage::Capabilities, || format!("drop capability {cap} from the bounding set"))?
            }
        };
    }
    Ok(())
}
