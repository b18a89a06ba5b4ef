//! The sandbox's ids, and no capabilities in any set.

use crate::error::{Context, Result, fail};
use caps::{CapSet, Capability};
use nix::errno::Errno;
use nix::unistd::{Gid, Uid, setresgid, setresuid};
use palisade_protocol::Stage;

/// Drops the bounding set (while CAP_SETPCAP may still be held), switches to
/// the plan's ids, then clears every other set and checks that it is empty.
pub fn switch_ids_and_drop_capabilities(uid: u32, gid: u32) -> Result<()> {
    drop_bounding_set()?;
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    setresgid(gid, gid, gid).at(Stage::Ids, || format!("setresgid {gid}"))?;
    setresuid(uid, uid, uid).at(Stage::Ids, || format!("setresuid {uid}"))?;
    clear_sets()
}

/// Empties the bounding set (when allowed) and every other set, then verifies.
pub fn drop_capabilities() -> Result<()> {
    drop_bounding_set()?;
    clear_sets()
}

fn clear_sets() -> Result<()> {
    for set in [CapSet::Ambient, CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set).map_err(|e| caps_error(&format!("clear the {set:?} capability set"), e))?;
    }
    for set in [CapSet::Ambient, CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        let left = caps::read(None, set).map_err(|e| caps_error(&format!("read the {set:?} set"), e))?;
        if !left.is_empty() {
            return Err(fail(Stage::Capabilities, Errno::EPERM, format!("{set:?} set still holds {left:?}")));
        }
    }
    Ok(())
}

/// Dropping the bounding set needs CAP_SETPCAP. A process without it (Tier B
/// run by an ordinary user) has empty permitted, inheritable and ambient sets
/// and no_new_privs, so no exec can give it anything the bounding set would
/// have to stop.
fn drop_bounding_set() -> Result<()> {
    let may = caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)
        .map_err(|e| caps_error("read the effective set", e))?;
    if may {
        caps::clear(None, CapSet::Bounding).map_err(|e| caps_error("clear the bounding set", e))?;
        let left = caps::read(None, CapSet::Bounding).map_err(|e| caps_error("read the bounding set", e))?;
        if !left.is_empty() {
            return Err(fail(
                Stage::Capabilities,
                Errno::EPERM,
                format!("bounding set still holds {left:?}"),
            ));
        }
    }
    Ok(())
}

fn caps_error(what: &str, e: caps::errors::CapsError) -> crate::error::HelperError {
    let errno = Errno::last();
    fail(Stage::Capabilities, errno, format!("{what}: {e}"))
}
