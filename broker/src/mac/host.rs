//! What the policy knows of a Mac: Seatbelt, no user namespaces, Landlock
//! or cgroups, and a root laid out as macOS lays it out.

use palisade_policy::{Host, HostCapabilities, Layout};
use std::path::{Path, PathBuf};

/// The system directories a command may read and execute from, where they
/// exist: the base system (`/System` holds the frameworks, without the
/// other volumes mounted in `/System/Volumes`; the dyld shared cache is in
/// the OS cryptex since macOS 13), `/usr` without `/usr/local` (Homebrew's
/// and palisade's own files), the command line tools `git` and `cc` run
/// from, and the time zone data `localtime` reads.
pub const SYSTEM_DIRS: [&str; 12] = [
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/libexec",
    "/usr/share",
    "/System/Volumes/Preboot/Cryptexes/OS",
    "/bin",
    "/sbin",
    "/System",
    "/Library/Developer/CommandLineTools",
    "/private/var/db/timezone",
    "/private/var/select",
];

/// The entries of `/private/etc` (where `/etc` points) a command may read.
pub const ETC_ENTRIES: [&str; 6] = [
    "/private/etc/passwd",
    "/private/etc/group",
    "/private/etc/hosts",
    "/private/etc/localtime",
    "/private/etc/resolv.conf",
    "/private/etc/ssl",
];

/// The devices a command may read and write.
pub const DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"];

/// The links of a Mac's root into `/private`.
pub const LINKS: [(&str, &str); 3] =
    [("/etc", "private/etc"), ("/tmp", "private/tmp"), ("/var", "private/var")];

/// This Mac, read now (what the broker keeps is the broker's to add: see
/// [`crate::seatbelt::executor::Macos`]'s `host`).
pub fn gather(launcher: &Path) -> Host {
    Host {
        capabilities: capabilities(launcher.is_file()),
        homes: homes(),
        layout: layout(&|p| Path::new(p).exists()),
        files: crate::host::files::files(),
        owned: Vec::new().into(),
    }
}

/// Seatbelt where its launcher is installed; nothing else of Linux's.
pub fn capabilities(seatbelt: bool) -> HostCapabilities {
    HostCapabilities {
        user_namespaces: false,
        landlock_abi: 0,
        seatbelt,
        cgroup: Err("macOS has no cgroups".into()),
    }
}

/// The layout, with what exists as `exists` says.
pub fn layout(exists: &dyn Fn(&str) -> bool) -> Layout {
    let present =
        |all: &[&str]| -> Vec<String> { all.iter().filter(|p| exists(p)).map(|p| p.to_string()).collect() };
    let real = present(&SYSTEM_DIRS);
    Layout {
        links: LINKS.iter().map(|(l, t)| (l.to_string(), t.to_string())).collect(),
        canonical: real.iter().map(PathBuf::from).collect(),
        real,
        etc: present(&ETC_ENTRIES),
        devices: present(&DEVICES),
    }
}

/// The users' home directories: those under /Users, and root's.
fn homes() -> Vec<PathBuf> {
    let users = std::fs::read_dir("/Users").into_iter().flatten().flatten();
    let mut homes: Vec<PathBuf> = users
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && e.file_name() != "Shared")
        .filter_map(|e| e.path().canonicalize().ok())
        .chain(Path::new("/var/root").canonicalize().ok())
        .collect();
    homes.sort();
    homes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_holds_what_exists_and_nothing_else() {
        let present = ["/usr/bin", "/bin", "/System", "/private/etc/passwd", "/dev/null", "/dev/urandom"];
        let l = layout(&|p| present.contains(&p));
        assert_eq!(l.real, ["/usr/bin", "/bin", "/System"]);
        assert_eq!(l.canonical, [PathBuf::from("/usr/bin"), PathBuf::from("/bin"), PathBuf::from("/System")]);
        assert_eq!(
            (l.etc.as_slice(), l.devices.as_slice()),
            (
                &["/private/etc/passwd".to_string()][..],
                &["/dev/null".to_string(), "/dev/urandom".to_string()][..]
            )
        );
        assert!(l.links.contains(&("/etc".into(), "private/etc".into())));
        // Seatbelt only where its launcher is; never Linux's mechanisms.
        let c = capabilities(true);
        assert!(c.seatbelt && !c.user_namespaces && c.landlock_abi == 0 && c.cgroup.is_err());
        assert!(!capabilities(false).seatbelt);
    }
}
