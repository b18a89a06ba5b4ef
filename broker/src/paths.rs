//! Default locations, the checks of a directory the broker keeps, and a
//! run's host directories.

use std::path::PathBuf;

/// `/run/palisade/palisade.sock` for root (a system install), else
/// `$XDG_RUNTIME_DIR/palisade/palisade.sock` (a user install); on macOS
/// `/var/run/palisade/palisade.sock` and `$TMPDIR/palisade/palisade.sock`.
pub fn default_socket() -> PathBuf {
    if cfg!(target_os = "macos") {
        // macOS: /var/run for root, else the user's private temporary directory.
        return match nix::unistd::geteuid().is_root() {
            true => PathBuf::from("/var/run/palisade/palisade.sock"),
            false => std::env::temp_dir().join("palisade/palisade.sock"),
        };
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/palisade/palisade.sock");
    }
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("/run/user/{}", nix::unistd::geteuid())));
    runtime.join("palisade/palisade.sock")
}

/// Where per-run host directories go: `/run/palisade/runs` for root
/// (`/var/run/palisade/runs` on macOS), else
/// `$XDG_RUNTIME_DIR/palisade/runs` (or a per-uid directory in /tmp).
pub fn default_temp_root() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        let run = if cfg!(target_os = "macos") { "/var/run" } else { "/run" };
        return PathBuf::from(format!("{run}/palisade/runs"));
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(r) => PathBuf::from(r).join("palisade/runs"),
        None => std::env::temp_dir().join(format!("palisade-{}/runs", nix::unistd::geteuid())),
    }
}

/// Where the broker keeps what must outlive it (the audit journal, the
/// tools' trust stages): `/var/lib/palisade` for root (a system install),
/// else `$XDG_STATE_HOME/palisade` (default `~/.local/state/palisade`).
/// Never a temporary directory: with neither variable set (nor absolute),
/// the caller must be given a path.
pub fn default_state_dir() -> Result<PathBuf, String> {
    if nix::unistd::geteuid().is_root() {
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
pub fn default_helper() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("palisade-helper")))
        .unwrap_or_else(|| PathBuf::from("palisade-helper"))
}

/// Refuses a helper that is missing, not executable, or setuid/setgid:
/// palisade-helper must never carry privilege of its own.
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
    if private_to_us(dir) {
        return Ok(());
    }
    Err(format!(
        "{} must be a directory owned by uid {} that nobody else can write to, on a path only it or root can change",
        dir.display(),
        nix::unistd::geteuid()
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
    /// Creates them for the sandbox's host ids: a root broker's Tier B
    /// command runs as the sandbox's uid, which must own them.
    pub fn create(dirs: &[PathBuf], (uid, gid): (u32, u32)) -> std::io::Result<HostDirs> {
        use std::os::unix::fs::DirBuilderExt;
        let made = HostDirs(dirs.to_vec());
        let chown = uid != nix::unistd::geteuid().as_raw();
        for d in dirs {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d)?;
            if chown {
                std::os::unix::fs::chown(d, Some(uid), Some(gid))?;
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
    use super::HostDirs;

    #[test]
    fn a_runs_host_directories_are_private_and_removed_afterwards() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("palisade-hostdirs-{}", std::process::id()));
        let run = base.join("run-1");
        let dirs = [run.clone(), run.join("tmp"), run.join("workspace")];
        let me = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let made = HostDirs::create(&dirs, me).unwrap();
        std::fs::write(run.join("workspace/left"), "x").unwrap();
        assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o700);
        drop(made);
        assert!(!run.exists(), "the run's directory outlived the run");
        let _ = std::fs::remove_dir_all(&base);
    }
}
