//! Canonicalizing the paths a request names, as the kernel would resolve them.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// PATH inside the sandbox, also used to resolve a bare command name.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How many symlinks one resolution may follow (the kernel's ELOOP bound).
const MAX_LINKS: usize = 40;

/// Pushes the components of `path`, last first, onto `stack` (so that popping
/// yields them in order). `None` stands for `..`; the root is dropped.
fn queue(stack: &mut Vec<Option<OsString>>, path: &Path) {
    for c in path.components().rev() {
        match c {
            Component::Normal(n) => stack.push(Some(n.to_os_string())),
            Component::ParentDir => stack.push(None),
            _ => {}
        }
    }
}

/// Joins `path` to `cwd` (unless absolute), expands a leading `~` to `home`,
/// resolves `.` and `..`, and follows symlinks wherever the path exists. What
/// does not exist yet cannot be a symlink, so the result is where the path
/// leads at the time of the check. (The kernel-side rules, not this check,
/// are the boundary: a path that changes afterwards is still held by them.)
pub fn resolve(path: &str, cwd: &Path, home: Option<&Path>) -> PathBuf {
    let joined = match (path == "~" || path.starts_with("~/"), home) {
        (true, Some(h)) => h.join(path.trim_start_matches('~').trim_start_matches('/')),
        _ => cwd.join(path),
    };
    let mut stack = Vec::new();
    queue(&mut stack, &joined);
    let mut resolved = PathBuf::from("/");
    let mut links = 0;
    while let Some(component) = stack.pop() {
        let Some(name) = component else {
            resolved.pop();
            continue;
        };
        let next = resolved.join(&name);
        match std::fs::read_link(&next) {
            Ok(target) if links < MAX_LINKS => {
                links += 1;
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                queue(&mut stack, &target);
            }
            _ => resolved = next,
        }
    }
    resolved
}

/// Like [`resolve`] but without following symlinks: the path as written.
pub fn resolve_lexically(path: &str, cwd: &Path, home: Option<&Path>) -> PathBuf {
    let joined = match (path == "~" || path.starts_with("~/"), home) {
        (true, Some(h)) => h.join(path.trim_start_matches('~').trim_start_matches('/')),
        _ => cwd.join(path),
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Whether `path` is `root` or lies beneath it.
pub fn within(path: &Path, root: &Path) -> bool {
    path.starts_with(root)
}

/// An executable by name, as [`crate::validate::resolve_executable`] looks
/// it up, with the host's answers given: whether a path is
/// an executable file, and where it leads.
pub(crate) fn find_executable(
    name: &str,
    is_executable: &dyn Fn(&Path) -> bool,
    canonicalize: &dyn Fn(&Path) -> std::io::Result<PathBuf>,
) -> Result<PathBuf, String> {
    let found = if name.starts_with('/') {
        Some(PathBuf::from(name))
    } else if name.contains('/') {
        return Err(format!("{name}: a relative path; name a program or give an absolute path"));
    } else {
        SANDBOX_PATH.split(':').map(|d| Path::new(d).join(name)).find(|p| is_executable(p))
    };
    let path = found.ok_or_else(|| format!("{name}: not found in {SANDBOX_PATH}"))?;
    let canonical = canonicalize(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !is_executable(&canonical) {
        return Err(format!("{} is not an executable file", canonical.display()));
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_and_links_resolve_like_the_kernel() {
        let dir = std::env::temp_dir().join(format!("palisade-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ws/sub")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("ws/out")).unwrap();
        std::os::unix::fs::symlink("sub", dir.join("ws/rel")).unwrap();
        std::os::unix::fs::symlink("loop", dir.join("ws/loop")).unwrap();
        let ws = dir.join("ws").canonicalize().unwrap();
        assert_eq!(resolve("a/../b", &ws, None), ws.join("b"));
        assert_eq!(resolve("../../../../../..", &ws, None), PathBuf::from("/"));
        assert_eq!(resolve("out/passwd", &ws, None), PathBuf::from("/etc/passwd"));
        assert_eq!(resolve("rel/x", &ws, None), ws.join("sub/x"));
        assert_eq!(resolve("rel/../out", &ws, None), PathBuf::from("/etc"));
        assert_eq!(resolve("~/.ssh", &ws, Some(Path::new("/home/u"))), PathBuf::from("/home/u/.ssh"));
        assert!(resolve("loop/x", &ws, None).starts_with(&ws));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
