//! Default locations, the checks of a directory the broker keeps, and a
//! run's host directories.

use std::path::PathBuf;

/// The system socket for a broker that serves others (root, or the unit's
/// user: [`palisade_protocol::clients::SYSTEM_SOCKET`], this system's),
/// else `$XDG_RUNTIME_DIR/palisade/palisade.sock` (a user install), or
/// where there is none, `/run/user/UID/...` or the private `palisade-UID`
/// of the temporary directory ([`palisade_protocol::clients::user_socket`]);
/// on macOS `$TMPDIR/palisade/palisade.sock`.
pub fn default_socket() -> PathBuf {
    if cfg!(target_os = "macos") && !crate::host::privilege::serves_others() {
        // macOS: the user's private temporary directory.
        return std::env::temp_dir().join("palisade/palisade.sock");
    }
    if crate::host::privilege::serves_others() {
        return PathBuf::from(palisade_policy::config::SYSTEM_SOCKET);
    }
    palisade_protocol::clients::user_socket(nix::unistd::geteuid().as_raw())
}

/// Makes the private directory a user's socket falls back to (no runtime
/// directory: [`palisade_protocol::clients::user_temp_dir`]) when
/// `socket` is in it, and refuses one that is not the user's alone: the
/// CLI would not trust a socket there.
#[cfg(unix)]
pub fn fallback_socket_dir(socket: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let uid = nix::unistd::geteuid().as_raw();
    let dir = palisade_protocol::clients::user_temp_dir(uid);
    if cfg!(target_os = "macos") || socket.parent() != Some(dir.as_path()) {
        return Ok(());
    }
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot make the socket's directory {}: {e}", dir.display())),
    }
    if !palisade_protocol::clients::private_to(&dir, uid) {
        return Err(format!(
            "{} is not a directory of uid {uid} closed to others (someone else made it, or its mode \
             lets others in), so no client would trust a socket there: remove it, or name a socket \
             with --socket or [broker] socket",
            dir.display()
        ));
    }
    Ok(())
}

/// Where per-run host directories go (Tier B's private /tmp and temporary
/// workspace, the /etc snapshot), made and checked: `temp_root` as
/// configured, else `/run/palisade/runs` for root (`/var/run/palisade/runs`
/// on macOS; root's own CLI `/run/palisade-root/runs`, never the system
/// broker's), else `$XDG_RUNTIME_DIR/palisade/runs` (where that can be
/// made), else a directory of a name nobody can predict in the temporary directory
/// (`palisade-UID-XXXXXX/runs`, removed with the broker). It must be the
/// broker's own, that nobody else can write to or swap: anything else (a
/// directory another user made first, say) is an error naming it.
pub fn temp_root(configured: Option<&std::path::Path>) -> Result<TempRoot, String> {
    use std::os::unix::fs::DirBuilderExt;
    let root = crate::host::privilege::serves_others();
    let (path, ephemeral) = match configured {
        Some(p) => (p.to_path_buf(), None),
        None if root => {
            // Root's own runs (the CLI's) apart from the system broker's, whose
            // directory the unit's user must find its own.
            let run = if cfg!(target_os = "macos") { "/var/run" } else { "/run" };
            let own = if crate::host::privilege::system_paths() { "palisade" } else { "palisade-root" };
            (PathBuf::from(format!("{run}/{own}/runs")), None)
        }
        None => {
            let runtime = std::env::var_os("XDG_RUNTIME_DIR").filter(|r| !r.is_empty());
            let runtime = runtime.map(|r| PathBuf::from(r).join("palisade/runs"));
            // A runtime directory that cannot hold it (none, or unusable) is
            // not the user's to rely on: a private one of its own instead.
            match runtime.filter(|r| std::fs::DirBuilder::new().recursive(true).mode(0o700).create(r).is_ok())
            {
                Some(r) => (r, None),
                None => in_temp_dir(&std::env::temp_dir())?,
            }
        }
    };
    let made = TempRoot { path: canonical_prefix(&path), ephemeral };
    // A root broker hands sandboxes other uids, which must reach the /etc
    // snapshot inside: 0711 (the runs' own directories inside are 0700).
    let mode = if root { 0o711 } else { 0o700 };
    create_dirs(&made.path, mode)
        .map_err(|e| format!("temp_root {}: cannot create it: {e}", made.path.display()))?;
    if root && configured.is_none() {
        // The default one is the broker's whatever it was before.
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&made.path, std::fs::Permissions::from_mode(0o711));
    }
    check_private(&made.path).map_err(|e| format!("temp_root: {e}"))?;
    Ok(made)
}

/// `temp_root` in the system's temporary directory (macOS's per-user
/// `$TMPDIR`, or `/tmp`): `palisade-<uid>/runs`, the same for every broker
/// of this user, so that the next one finds and ends what a dead one left
/// there; where that name is taken by something not privately ours (a
/// shared `/tmp`), a fresh directory of a name nobody could predict,
/// removed when the broker is done (what a dead broker leaves there is
/// found by none).
fn in_temp_dir(tmp: &std::path::Path) -> Result<(PathBuf, Option<PathBuf>), String> {
    use std::os::unix::fs::DirBuilderExt;
    let uid = nix::unistd::geteuid();
    let stable = tmp.join(format!("palisade-{uid}"));
    let made = match std::fs::DirBuilder::new().mode(0o700).create(&stable) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
    };
    let real_dir = std::fs::symlink_metadata(&stable).is_ok_and(|m| m.is_dir());
    if made && real_dir && private_to_us(&stable) {
        return Ok((stable.join("runs"), None));
    }
    tracing::warn!(path = %stable.display(), "not a private directory of this user: temp_root is a fresh one");
    let template = tmp.join(format!("palisade-{uid}-XXXXXX"));
    let made = nix::unistd::mkdtemp(&template)
        .map_err(|e| format!("cannot make a directory like {}: {e}", template.display()))?;
    Ok((made.join("runs"), Some(made)))
}

/// Creates `dir` and each missing directory on the way with `mode`, set
/// explicitly (`chmod`): what a umask takes from a mode at creation (a
/// unit's `UMask=0077` takes everything from others) is not what the
/// directory must be. Directories that exist keep their mode.
pub fn create_dirs(dir: &std::path::Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let missing: Vec<&std::path::Path> = dir.ancestors().take_while(|a| !a.exists()).collect();
    for d in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(mode).create(d) {
            Ok(()) => std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))?,
            // Made meanwhile by another (a second broker starting): its mode is its maker's.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The directory per-run host directories go in; one of a name nobody
/// could predict is removed when the broker is done with it.
pub struct TempRoot {
    pub path: PathBuf,
    ephemeral: Option<PathBuf>,
}

impl Drop for TempRoot {
    fn drop(&mut self) {
        if let Some(dir) = &self.ephemeral {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The variable that names the broker's state directory instead of the default.
pub const STATE_ENV: &str = "PALISADE_STATE";
/// The secret store's directory under the state directory (the plugins'
/// secrets, and the credentials of inspected requests).
#[cfg(target_os = "linux")]
pub const SECRETS_DIR: &str = "secrets";

/// Where the broker keeps what must outlive it (the audit journal, the
/// tools' trust stages, the held change sets, the skills and secrets):
/// `$PALISADE_STATE` (absolute), else `/var/lib/palisade` for root (a
/// system install), else `$XDG_STATE_HOME/palisade` (default
/// `~/.local/state/palisade`).
/// Never a temporary directory: with neither variable set (nor absolute),
/// the caller must be given a path.
pub fn default_state_dir() -> Result<PathBuf, String> {
    if let Some(state) = std::env::var_os(STATE_ENV).map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Ok(state);
    }
    if crate::host::privilege::system_paths() {
        return Ok(PathBuf::from("/var/lib/palisade"));
    }
    let absolute = |var: &str| std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(state) = absolute("XDG_STATE_HOME") {
        return Ok(state.join("palisade"));
    }
    absolute("HOME")
        .map(|home| home.join(".local/state/palisade"))
        .ok_or_else(|| "neither XDG_STATE_HOME nor HOME is set to an absolute path".to_string())
}

/// The helper installed next to the running binary.
#[cfg(target_os = "linux")]
pub fn default_helper() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("palisade-helper")))
        .unwrap_or_else(|| PathBuf::from("palisade-helper"))
}

/// The plugin-host's path: `[plugins] host`, else next to the helper.
#[cfg(target_os = "linux")]
pub fn plugin_host(config: &palisade_policy::config::PluginsConfig, helper: &std::path::Path) -> PathBuf {
    config.host.clone().unwrap_or_else(|| helper.with_file_name(palisade_policy::plugins::PLUGIN_HOST_NAME))
}

/// Refuses a helper that is missing, not executable, or setuid/setgid:
/// palisade-helper must never carry privilege of its own.
#[cfg(target_os = "linux")]
pub fn check_helper(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| {
        format!("helper {}: {e} (build it: cargo build --release -p palisade-helper)", path.display())
    })?;
    let mode = meta.permissions().mode();
    if !meta.is_file() || mode & 0o111 == 0 {
        return Err(format!("helper {} is not an executable file", path.display()));
    }
    if mode & 0o6000 != 0 {
        return Err(format!("helper {} is setuid or setgid: refusing to use it", path.display()));
    }
    Ok(())
}

/// `path` with its longest existing ancestor made canonical (symlinks
/// resolved) and the rest as written: the run directories under `temp_root`
/// are opened with no symlink allowed on the way.
pub fn canonical_prefix(path: &std::path::Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut p = path;
    loop {
        if let Ok(c) = p.canonicalize() {
            return rest.iter().rev().fold(c, |acc, name| acc.join(name));
        }
        match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                p = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Refuses `dir` unless [`private_to_us`]: the audit journal's directory
/// must be the broker's alone, on a path nobody else can swap.
pub fn check_private(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if private_to_us(dir) {
        return Ok(());
    }
    let me = nix::unistd::geteuid();
    let owner = std::fs::metadata(dir).ok().map(|m| m.uid()).filter(|o| *o != me.as_raw());
    let fix = match owner {
        Some(o) => format!(
            "; it is uid {o}'s (another broker's, or what a palisade of that user made before this one \
             started): if none of theirs uses it, give it to this broker (chown -R {me} {}), or name \
             another in the configuration",
            dir.display()
        ),
        None => String::new(),
    };
    Err(format!(
        "{} must be a directory owned by uid {me} that nobody else can write to, on a path only it or root can change{fix}",
        dir.display(),
    ))
}

/// Whether `dir` is the broker's own directory, writable by it alone, on a
/// path that nobody but the broker and root can change (a sticky directory
/// such as /tmp on the way is fine).
pub fn private_to_us(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let Ok(dir) = dir.canonicalize() else { return false };
    let own = std::fs::metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == me && m.mode() & 0o022 == 0);
    own && dir.ancestors().skip(1).all(|a| {
        std::fs::metadata(a).is_ok_and(|m| {
            (m.uid() == me || m.uid() == 0) && (m.mode() & 0o022 == 0 || m.mode() & 0o1000 != 0)
        })
    })
}

/// A run's host directories (Tier B's private /tmp and temporary workspace),
/// removed with everything in them when the run is over.
pub struct HostDirs(Vec<PathBuf>);

impl HostDirs {
    /// Creates them for the sandbox's host ids (a root broker's Tier B
    /// command runs as the sandbox's uid, which must own them): each one
    /// new (an existing one is an error: nobody may have prepared it), in
    /// `temp_root`, which [`temp_root`] checked is the broker's own, and
    /// checked through its descriptor once made.
    pub fn create(dirs: &[PathBuf], (uid, gid): (u32, u32)) -> std::io::Result<HostDirs> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
        let mut made = HostDirs(Vec::new());
        let me = nix::unistd::geteuid().as_raw();
        for d in dirs {
            std::fs::DirBuilder::new().mode(0o700).create(d).map_err(|e| {
                std::io::Error::new(e.kind(), format!("{}: {e} (a run directory must be new)", d.display()))
            })?;
            made.0.push(d.clone());
            let dir = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(d)?;
            if uid != me {
                std::os::unix::fs::fchown(&dir, Some(uid), Some(gid))?;
            }
            let m = dir.metadata()?;
            if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
                return Err(std::io::Error::other(format!(
                    "{}: not the run directory just made",
                    d.display()
                )));
            }
        }
        Ok(made)
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        // The first is the run's own directory; the others live inside it.
        if let Some(root) = self.0.first() {
            if let Err(e) = std::fs::remove_dir_all(root) {
                tracing::warn!("cannot remove {}: {e}", root.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// A directory of another uid is refused, naming the fix.
    #[test]
    fn a_directory_of_another_uid_is_refused_naming_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("palisade-other-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(4242)), None).unwrap();
        let e = super::check_private(&dir).unwrap_err();
        std::fs::remove_dir(&dir).unwrap();
        assert!(
            e.contains("it is uid 4242's") && e.contains(&format!("chown -R 0 {}", dir.display())),
            "{e}"
        );
    }

    use super::{HostDirs, in_temp_dir};

    /// Every broker of a user finds the same temp_root in a temporary
    /// directory (what a dead one left is found); a name someone else made
    /// there, or one anybody may write, is not used.
    #[test]
    fn temp_root_in_a_temporary_directory_is_the_same_for_every_broker_unless_taken() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = std::env::temp_dir().join(format!("palisade-tmpdir-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let (first, ephemeral) = in_temp_dir(&tmp).unwrap();
        assert_eq!(ephemeral, None);
        assert_eq!(in_temp_dir(&tmp).unwrap(), (first.clone(), None), "the next broker finds the same");
        let stable = first.parent().unwrap().to_path_buf();
        assert_eq!(std::fs::metadata(&stable).unwrap().permissions().mode() & 0o777, 0o700);
        // Taken: writable by anybody; then a link to a directory of ours.
        std::fs::set_permissions(&stable, std::fs::Permissions::from_mode(0o777)).unwrap();
        let (fresh, ephemeral) = in_temp_dir(&tmp).unwrap();
        assert!(ephemeral.is_some() && fresh != first, "{fresh:?}");
        std::fs::remove_dir_all(&stable).unwrap();
        let ours = tmp.join("ours");
        std::fs::create_dir(&ours).unwrap();
        std::os::unix::fs::symlink(&ours, &stable).unwrap();
        let (fresh, ephemeral) = in_temp_dir(&tmp).unwrap();
        assert!(ephemeral.is_some() && !fresh.starts_with(&stable), "{fresh:?}");
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn a_runs_host_directories_are_private_and_removed_afterwards() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("palisade-hostdirs-{}", std::process::id()));
        let run = base.join("run-1");
        // temp_root, where a run's directories go: it is there before them.
        std::fs::create_dir_all(&base).unwrap();
        let dirs = [run.clone(), run.join("tmp"), run.join("workspace")];
        let me = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        // temp_root exists (paths::temp_root made it); the run's directories are new in it.
        std::fs::create_dir_all(&base).unwrap();
        let made = HostDirs::create(&dirs, me).unwrap();
        std::fs::write(run.join("workspace/left"), "x").unwrap();
        assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o700);
        // One that exists already (made by anyone) is never used.
        let again = HostDirs::create(&dirs, me).err().expect("an existing run directory refused");
        assert!(again.to_string().contains("must be new"), "{again}");
        drop(made);
        assert!(!run.exists(), "the run's directory outlived the run");
        let _ = std::fs::remove_dir_all(&base);
    }
}
