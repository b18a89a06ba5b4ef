//! Toolchains installed under a home (pyenv, nvm, asdf, rustup and cargo,
//! uv, `~/.local`) that a command runs through: its executable and every
//! `#!` interpreter it leads to, and the directory each is installed in,
//! which the sandbox must see (read-only) for the command to start.

use crate::host::HostFiles;
use crate::validate;
use std::path::{Path, PathBuf};

/// How many `#!` interpreters deep the kernel follows a script (Linux's
/// `binfmt_script` allows four levels of nesting).
const MAX_INTERPRETERS: usize = 4;

/// The installations palisade knows: a directory named by these components
/// (anywhere in the path), and how many components below it the
/// installation's root is (its version).
const LAYOUTS: [(&[&str], usize); 9] = [
    // pyenv's shims run `pyenv exec`, which needs its whole root.
    (&[".pyenv"], 0),
    (&[".nvm", "versions", "node"], 1),
    (&[".nvm"], 0),
    (&[".asdf", "installs"], 2),
    (&[".asdf"], 0),
    (&[".rustup", "toolchains"], 1),
    (&[".rustup"], 0),
    (&[".local", "share", "uv", "python"], 1),
    (&[".local", "share", "uv", "tools"], 1),
];

/// The command's chain: `program` (canonical), then each `#!` interpreter
/// it leads to (canonical, `env NAME` looked up as the sandbox would), as
/// far as the kernel would follow; an interpreter that does not exist ends
/// it (the command fails there as it would outside).
pub(super) fn chain(files: &dyn HostFiles, program: &Path) -> Vec<PathBuf> {
    let mut chain = vec![program.to_path_buf()];
    for _ in 0..MAX_INTERPRETERS {
        let Some((next, _)) = chain.last().and_then(|at| validate::shebang(files, at)) else { break };
        if files.stat(&next).is_err() || chain.contains(&next) {
            break;
        }
        chain.push(next);
    }
    chain
}

/// The directories a run must see for the toolchain executable at `path`
/// (canonical) to start: its installation's root where palisade knows the
/// layout (`~/.cargo/bin` with `~/.rustup` beside it, `~/.local/bin` with
/// `~/.local/lib`); else, for an interpreter (`any`), the prefix its `bin/`
/// directory belongs to, unless that is `home` or holds it, or the file
/// alone. A command's own executable elsewhere gets nothing: it must lie
/// where the sandbox may execute from.
pub(super) fn roots(path: &Path, home: Option<&Path>, any: bool) -> Vec<PathBuf> {
    let parts: Vec<&std::ffi::OsStr> = path.iter().collect();
    let at = |i: usize| parts[..i].iter().collect::<PathBuf>();
    for (marker, below) in LAYOUTS {
        if let Some(i) = find(&parts, marker) {
            let end = i + marker.len() + below;
            // The root is a directory above the file.
            if end < parts.len() {
                return vec![at(end)];
            }
        }
    }
    if let Some(i) = find(&parts, &[".cargo", "bin"]) {
        return vec![at(i + 2), at(i).join(".rustup")];
    }
    if let Some(i) = find(&parts, &[".local", "bin"]) {
        return vec![at(i + 2), at(i + 1).join("lib")];
    }
    if !any {
        return Vec::new();
    }
    let prefix = path.parent().filter(|d| d.file_name().is_some_and(|n| n == "bin")).and_then(Path::parent);
    match prefix {
        Some(p) if p.parent().is_some() && home.is_none_or(|h| !h.starts_with(p)) => vec![p.to_path_buf()],
        _ => vec![path.to_path_buf()],
    }
}

/// What the caller's environment says of its toolchains: the absolute
/// entries of its `PATH`, in order (where a bare name is looked up, as
/// its shell would), the installations they lead to that the sandbox must
/// see read-only for a command to use them however it is started (`sh -c`,
/// make, a script), and the variables those tools need to find themselves
/// once `HOME` is not the caller's.
#[derive(Debug, Default)]
pub(super) struct CallerTools {
    pub path: Vec<PathBuf>,
    /// Each entry of `path` with its links resolved, where it exists.
    pub canonical: Vec<Option<PathBuf>>,
    pub roots: Vec<PathBuf>,
    pub env: Vec<(&'static str, PathBuf)>,
}

/// The variables a toolchain reads to find its installation, and where
/// it is in a home when the caller sets none: rustup's toolchains, pyenv's
/// root, nvm's, and where `pip --user` installed (its `lib`, with `bin`).
const HOME_VARIABLES: [(&str, &str); 4] =
    [("RUSTUP_HOME", ".rustup"), ("PYENV_ROOT", ".pyenv"), ("NVM_DIR", ".nvm"), ("PYTHONUSERBASE", ".local")];

impl CallerTools {
    /// From the caller's `env` (its `PATH`, `HOME` and the toolchains'
    /// variables): each absolute `PATH` entry; for each that is a known
    /// installation's (see [`roots`]), an npm prefix's `bin` (beside
    /// `lib/node_modules`) or Go's `~/go/bin`, what to show; and the
    /// variables of [`HOME_VARIABLES`] (the caller's value, else the
    /// home's directory where it exists) and `NPM_CONFIG_PREFIX` (an npm
    /// prefix on the `PATH`), when what they name is shown. A variable's
    /// directory and an npm prefix count only strictly inside the caller's
    /// home, which must be one: not `/`, nor a directory that holds the
    /// home of a user of `homes` (the users' of /etc/passwd) but its own.
    pub fn of(
        files: &dyn HostFiles,
        env: &std::collections::BTreeMap<String, String>,
        homes: &[PathBuf],
    ) -> CallerTools {
        let home = env.get("HOME").map(PathBuf::from).filter(|h| h.is_absolute());
        // A home, not what holds others' (`/`, `/home`).
        let home = home.and_then(|h| files.canonicalize(&h).ok()).filter(|h| {
            h.parent().is_some() && !homes.iter().any(|other| other != h && other.starts_with(h))
        });
        let mut tools = CallerTools::default();
        let path = env.get("PATH").map(String::as_str).unwrap_or_default();
        tools.path = path.split(':').map(PathBuf::from).filter(|p| p.is_absolute()).collect();
        tools.canonical = tools.path.iter().map(|d| files.canonicalize(d).ok()).collect();
        for dir in tools.canonical.iter().flatten() {
            let dir = dir.clone();
            let known = roots(&dir.join("palisade-x"), home.as_deref(), false);
            if !known.is_empty() {
                tools.roots.extend(known);
            } else if dir.ends_with("bin")
                && dir.parent().is_some_and(|p| {
                    is_npm_prefix(files, p) && home.as_ref().is_some_and(|h| p.starts_with(h) && p != h)
                })
            {
                let prefix = dir.parent().unwrap_or(&dir).to_path_buf();
                tools.env.push(("NPM_CONFIG_PREFIX", prefix.clone()));
                tools.roots.push(prefix);
            } else if home.as_ref().is_some_and(|h| dir == h.join("go/bin")) {
                tools.roots.push(dir);
            }
        }
        for (var, in_home) in HOME_VARIABLES {
            let given = env.get(var).map(PathBuf::from).filter(|p| p.is_absolute());
            let dir = given.or_else(|| home.as_ref().map(|h| h.join(in_home)));
            // Only ever inside the home (and not the home itself).
            let in_home = |d: &PathBuf| home.as_ref().is_some_and(|h| d.starts_with(h) && d != h);
            let Some(dir) = dir.and_then(|d| files.canonicalize(&d).ok()).filter(in_home) else { continue };
            if var == "PYTHONUSERBASE" {
                // What pip --user installed: its libraries, beside its scripts.
                if files.stat(&dir.join("lib")).is_ok_and(|m| m.is_dir()) {
                    tools.roots.extend([dir.join("lib"), dir.join("bin")]);
                    tools.env.push((var, dir));
                }
            } else if tools.roots.iter().any(|r| r.starts_with(&dir) || dir.starts_with(r)) {
                tools.env.push((var, dir));
            }
        }
        tools.roots.sort();
        tools.roots.dedup();
        // The first of each variable: the PATH's first npm prefix.
        let mut seen = Vec::new();
        tools.env.retain(|(k, _)| {
            !seen.contains(k) && {
                seen.push(*k);
                true
            }
        });
        tools
    }
}

/// Whether `dir` is an npm prefix: `lib/node_modules` in it.
fn is_npm_prefix(files: &dyn HostFiles, dir: &Path) -> bool {
    files.stat(&dir.join("lib/node_modules")).is_ok_and(|m| m.is_dir())
}

/// Where `marker`'s components start in `parts`, the first time.
fn find(parts: &[&std::ffi::OsStr], marker: &[&str]) -> Option<usize> {
    parts.windows(marker.len()).position(|w| w.iter().zip(marker).all(|(a, b)| *a == *b))
}

#[cfg(test)]
mod tests {
    use super::roots;
    use std::path::{Path, PathBuf};

    fn of(path: &str) -> Vec<String> {
        roots(Path::new(path), Some(Path::new("/home/u")), true)
            .iter()
            .map(|p| p.display().to_string())
            .collect()
    }

    #[test]
    fn each_known_layout_gives_its_installation_root() {
        assert_eq!(of("/home/u/.pyenv/versions/3.12.1/bin/python3.12"), ["/home/u/.pyenv"]);
        assert_eq!(of("/home/u/.pyenv/shims/python"), ["/home/u/.pyenv"]);
        assert_eq!(
            of("/home/u/.nvm/versions/node/v20.11.0/bin/node"),
            ["/home/u/.nvm/versions/node/v20.11.0"]
        );
        assert_eq!(
            of("/home/u/.asdf/installs/python/3.12.1/bin/python3"),
            ["/home/u/.asdf/installs/python/3.12.1"]
        );
        assert_eq!(of("/home/u/.asdf/shims/python"), ["/home/u/.asdf"]);
        assert_eq!(
            of("/home/u/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/bin/cargo"),
            ["/home/u/.rustup/toolchains/stable-x86_64-unknown-linux-gnu"]
        );
        assert_eq!(of("/home/u/.cargo/bin/cargo"), ["/home/u/.cargo/bin", "/home/u/.rustup"]);
        assert_eq!(
            of("/home/u/.local/share/uv/python/cpython-3.12.1-linux-x86_64-gnu/bin/python3.12"),
            ["/home/u/.local/share/uv/python/cpython-3.12.1-linux-x86_64-gnu"]
        );
        assert_eq!(of("/home/u/.local/bin/black"), ["/home/u/.local/bin", "/home/u/.local/lib"]);
    }

    #[test]
    fn elsewhere_the_prefix_of_bin_never_a_home_or_what_holds_one() {
        assert_eq!(of("/opt/python-3.12/bin/python3"), ["/opt/python-3.12"]);
        assert_eq!(of("/home/u/toolchain/bin/zig"), ["/home/u/toolchain"]);
        // ~/bin's prefix is the home: the file alone.
        assert_eq!(of("/home/u/bin/tool"), ["/home/u/bin/tool"]);
        // /home/bin's prefix holds the home.
        assert_eq!(of("/home/bin/tool"), ["/home/bin/tool"]);
        assert_eq!(of("/srv/tools/run"), ["/srv/tools/run"]);
        assert_eq!(roots(Path::new("/bin/x"), None, true), [PathBuf::from("/bin/x")]);
        // A command's own executable gets no more than a known layout.
        assert!(roots(Path::new("/opt/python-3.12/bin/python3"), None, false).is_empty());
        assert_eq!(roots(Path::new("/home/u/.local/bin/black"), None, false).len(), 2);
    }
}
