//! The workspace after `palisade run CMD` is what it would be after `CMD`
//! alone: a differential suite. Each case's command runs on a fresh copy of
//! the same workspace, at the same path, twice without a sandbox (what
//! differs between those two is the command's own nondeterminism, left out
//! of the comparison) and once through each broker: embedded, the user's
//! own daemon, and a root daemon acting for the user (as root; the two
//! others then run as the unprivileged test user). Each tree is compared
//! entry by entry: the file list, kinds, contents, permission bits,
//! symbolic link targets, hard-link groups, holes (allocated against
//! apparent size), empty directories, FIFOs and sockets, and user extended
//! attributes. Every case must come out the same, with the run exiting as
//! the command did.

use palisade_tests::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// One entry of a tree, as the comparison sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    kind: char,
    mode: u32,
    size: u64,
    /// A file's sha256 (`None` for other kinds).
    sha: Option<String>,
    target: Option<Vec<u8>>,
    /// Its allocated blocks are fewer than its size takes: it has holes.
    sparse: bool,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The first path (in byte order) of the file it is a name of, if it has several.
    group: Option<Vec<u8>>,
}

type Tree = BTreeMap<Vec<u8>, Node>;

/// A JSON document's text with every object's keys in order: tools write
/// maps in the order of a hash (cargo's `.rustc_info.json`), which is no
/// difference in what the file says.
fn canonical_json(bytes: &[u8]) -> Option<Vec<u8>> {
    fn sorted(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(map) => {
                let mut pairs: Vec<(String, serde_json::Value)> =
                    map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Array(pairs.into_iter().map(|(k, v)| serde_json::json!([k, v])).collect())
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sorted).collect())
            }
            other => other,
        }
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    serde_json::to_vec(&sorted(value)).ok()
}

/// A file's sha256 (of a `.json` file of at most 1 MiB that parses, its
/// canonical text's: see [`canonical_json`]).
fn sha256(path: &Path) -> String {
    use sha2::Digest;
    use std::io::Read;
    let json = path.extension().is_some_and(|e| e == "json");
    if json && std::fs::metadata(path).is_ok_and(|m| m.len() <= 1 << 20) {
        if let Some(canonical) = std::fs::read(path).ok().and_then(|b| canonical_json(&b)) {
            let digest = sha2::Sha256::digest(&canonical);
            return format!("json:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>());
        }
    }
    let mut hash = sha2::Sha256::new();
    // Not as root, a file closed to its owner is compared by all but its contents.
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return "unreadable".into(),
        Err(e) => panic!("{}: {e}", path.display()),
    };
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf).unwrap() {
            0 => break,
            n => hash.update(&buf[..n]),
        }
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn user_xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: the path is NUL-terminated and `names` is valid for its length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return vec![];
    }
    let mut out = Vec::new();
    for name in names[..n as usize].split(|b| *b == 0).filter(|n| n.starts_with(b"user.")) {
        let cname = std::ffi::CString::new(name).unwrap();
        let mut value = vec![0u8; 65536];
        // SAFETY: both strings are NUL-terminated and `value` is valid for its length.
        let len =
            unsafe { libc::lgetxattr(c.as_ptr(), cname.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
        value.truncate(len.max(0) as usize);
        out.push((name.to_vec(), value));
    }
    out.sort();
    out
}

/// Every entry under `root` (read as root, or as this process's user).
fn snapshot(root: &Path) -> Tree {
    let mut tree = Tree::new();
    let mut inodes: HashMap<u64, Vec<Vec<u8>>> = HashMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else { continue };
        for e in entries.flatten() {
            let rel = rel.join(e.file_name());
            let path = root.join(&rel);
            let m = std::fs::symlink_metadata(&path).unwrap();
            let t = m.file_type();
            let kind = match () {
                _ if t.is_dir() => 'd',
                _ if t.is_symlink() => 'l',
                _ if t.is_fifo() => 'p',
                _ if t.is_socket() => 's',
                _ if t.is_file() => 'f',
                _ => '?',
            };
            let key = rel.as_os_str().as_bytes().to_vec();
            if kind == 'd' {
                stack.push(rel.clone());
            }
            if kind == 'f' && m.nlink() > 1 {
                inodes.entry(m.ino()).or_default().push(key.clone());
            }
            let node = Node {
                kind,
                mode: m.mode() & 0o7777,
                size: if kind == 'f' { m.len() } else { 0 },
                sha: (kind == 'f').then(|| sha256(&path)),
                target: (kind == 'l')
                    .then(|| std::fs::read_link(&path).unwrap().as_os_str().as_bytes().to_vec()),
                sparse: kind == 'f' && m.blocks() * 512 < m.len(),
                xattrs: if matches!(kind, 'f' | 'd') { user_xattrs(&path) } else { vec![] },
                group: None,
            };
            tree.insert(key, node);
        }
    }
    for names in inodes.values() {
        let first = names.iter().min().cloned();
        for n in names {
            tree.get_mut(n).unwrap().group = first.clone();
        }
    }
    tree
}

/// How `got` differs from `want`, leaving out what differs between `want`
/// and `again` (the same command, run again without a sandbox).
fn differences(want: &Tree, again: &Tree, got: &Tree) -> Vec<String> {
    let shown = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    let parent = |p: &[u8]| {
        Path::new(std::ffi::OsStr::from_bytes(p)).parent().map(|d| d.as_os_str().as_bytes().to_vec())
    };
    let unstable: BTreeSet<&Vec<u8>> =
        want.keys().chain(again.keys()).filter(|p| want.get(*p) != again.get(*p)).collect();
    let unstable_dirs: BTreeSet<Vec<u8>> = unstable
        .iter()
        .filter(|p| want.contains_key(**p) != again.contains_key(**p))
        .filter_map(|p| parent(p))
        .collect();
    let mut out = Vec::new();
    for p in want.keys().chain(got.keys()).collect::<BTreeSet<_>>() {
        let (w, g) = (want.get(p), got.get(p));
        let loose = unstable.contains(p);
        match (w, g) {
            // Missing, unless the command itself makes it only now and then.
            (Some(_), None) if !loose || again.contains_key(p) => out.push(format!("missing {}", shown(p))),
            (None, Some(_)) if !parent(p).is_some_and(|d| unstable_dirs.contains(&d)) => {
                out.push(format!("extra {}", shown(p)))
            }
            // What the command itself varies: only its kind and mode are held to either bare run's.
            (Some(w), Some(g))
                if loose
                    && (w.kind, w.mode) != (g.kind, g.mode)
                    && again.get(p).is_none_or(|a| (a.kind, a.mode) != (g.kind, g.mode)) =>
            {
                out.push(format!("{}: {w:?} != {g:?}", shown(p)));
            }
            (Some(_), Some(_)) if loose => {}
            (Some(w), Some(g)) => {
                // A hard-link group is compared where all its names are stable.
                let group_ok = w.group == g.group || w.group.as_ref().is_some_and(|f| unstable.contains(f));
                let (mut w, mut g) = (w.clone(), g.clone());
                (w.group, g.group) = (None, None);
                if w != g || !group_ok {
                    out.push(format!("{}: {w:?} != {g:?}", shown(p)));
                }
            }
            _ => {}
        }
    }
    out
}

/// Where a run goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Mode {
    Embedded,
    UserDaemon,
    RootDaemon,
}

/// A case's workspace, its copy to start from, and what runs it.
pub(crate) struct Fixture {
    base: TempDir,
    pub(crate) ws: PathBuf,
    initial: PathBuf,
    /// The unprivileged user the commands run as (as root), or `None` (this process's user).
    user: Option<nix::unistd::User>,
    policy: PathBuf,
    daemons: Vec<(Mode, Daemon)>,
}

/// The profile every run of a case names (`--profile fidelity`): shells
/// and inline code, `read_only` paths besides the probe's, and `extra` keys.
fn profile(read_only: &[&Path], extra: &str) -> String {
    let mut ro: Vec<String> = vec![bin("probe").parent().unwrap().to_string_lossy().into_owned()];
    ro.extend(read_only.iter().map(|p| p.to_string_lossy().into_owned()));
    format!(
        "[profiles.fidelity]\nread_only = {ro:?}\nallow_interpreters = true\nallow_inline_code = true\n\
         max_execution_time = 900\nmax_memory_mb = 2048\n{extra}"
    )
}

impl Fixture {
    /// A workspace made by `setup` (as this process), given to the user the commands run as.
    fn new(tag: &str, read_only: &[&Path], setup: impl FnOnce(&Path)) -> Fixture {
        Fixture::with_profile(tag, read_only, "", setup)
    }

    /// [`Fixture::new`], with `extra` keys in the profile.
    pub(crate) fn with_profile(
        tag: &str,
        read_only: &[&Path],
        extra: &str,
        setup: impl FnOnce(&Path),
    ) -> Fixture {
        use std::os::unix::fs::PermissionsExt;
        let base = TempDir::new(tag);
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (ws, initial) = (base.join("ws"), base.join("initial"));
        std::fs::create_dir(&initial).unwrap();
        setup(&initial);
        let user = is_root().then(test_user);
        if let Some(u) = &user {
            let o = Command::new("chown")
                .args(["-R", &format!("{}:{}", u.uid, u.gid)])
                .arg(&initial)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", text(&o.stderr));
        }
        let policy = base.join("policy.toml");
        let config = profile(read_only, extra);
        std::fs::write(&policy, test_config(&config)).unwrap();
        std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut daemons = vec![];
        daemons.push((
            Mode::UserDaemon,
            Daemon::start_with(DaemonOptions {
                config: config.clone(),
                user: user.clone(),
                ..Default::default()
            }),
        ));
        if let Some(u) = &user {
            let root = format!("{config}[broker]\nallowed_uids = [{}]\nsocket_mode = 0o666\n", u.uid);
            daemons.push((Mode::RootDaemon, Daemon::start(&root)));
        }
        Fixture { base, ws, initial, user, policy, daemons }
    }

    pub(crate) fn modes(&self) -> Vec<Mode> {
        let mut modes = vec![Mode::Embedded];
        modes.extend(self.daemons.iter().map(|(m, _)| *m));
        if self.user.is_none() {
            skipped("not root: no root daemon acting for a user to compare");
        }
        modes
    }

    /// The workspace as the case made it, again.
    pub(crate) fn reset(&self) {
        if self.ws.exists() {
            let o = Command::new("rm").arg("-rf").arg(&self.ws).output().unwrap();
            assert!(o.status.success(), "{}", text(&o.stderr));
        }
        let o = Command::new("cp").arg("-a").arg(&self.initial).arg(&self.ws).output().unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
    }

    /// `argv` as the user, with a clean environment (and `env`), in the workspace.
    pub(crate) fn as_user(&self, env: &[(&str, &Path)], argv: &[&str]) -> Command {
        let mut all: Vec<String> = self.user.as_ref().map(as_user).unwrap_or_default();
        all.extend(["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"].map(String::from));
        // Beside the workspace, not in it: a home holds what the broker keeps
        // (the user's configuration), which no workspace written in place may.
        all.push(format!("HOME={}", self.ws.with_file_name("home").display()));
        all.extend(env.iter().map(|(k, v)| format!("{k}={}", v.display())));
        all.extend(argv.iter().map(|a| a.to_string()));
        let mut c = Command::new(&all[0]);
        c.args(&all[1..]).current_dir(&self.ws).stdin(Stdio::null());
        c
    }

    /// `script` run by `sh -c` in a fresh workspace, without a sandbox: the tree it leaves.
    fn bare(&self, script: &str) -> Tree {
        self.reset();
        let o = self.as_user(&[], &["sh", "-c", script]).output().unwrap();
        assert!(o.status.success(), "bare: {}\n{}", text(&o.stdout), text(&o.stderr));
        snapshot(&self.ws)
    }

    /// `script` through `palisade run` in a fresh workspace: its output and the tree it leaves.
    fn sandboxed(&self, mode: Mode, script: &str) -> (Output, Tree) {
        self.sandboxed_with(mode, &[], script)
    }

    /// `palisade ARGS` as the user, with the state `mode`'s runs keep (embedded).
    pub(crate) fn palisade(&self, mode: Mode, args: &[&str]) -> Output {
        let state = self.base.join(&format!("state-{mode:?}"));
        let journal = state.join("journal");
        let env = [("PALISADE_STATE", state.as_path()), ("PALISADE_JOURNAL", journal.as_path())];
        let palisade = bin("palisade").to_string_lossy().into_owned();
        let argv: Vec<&str> = [palisade.as_str()].into_iter().chain(args.iter().copied()).collect();
        self.as_user(&env, &argv).output().unwrap()
    }

    /// [`Fixture::sandboxed`], with `flags` for `palisade run`.
    pub(crate) fn sandboxed_with(&self, mode: Mode, flags: &[&str], script: &str) -> (Output, Tree) {
        self.reset();
        let state = self.base.join(&format!("state-{mode:?}"));
        if !state.exists() {
            match &self.user {
                Some(u) => owned_dir(&state, u, 0o700),
                None => std::fs::create_dir(&state).unwrap(),
            }
        }
        let palisade = bin("palisade").to_string_lossy().into_owned();
        let mut argv = vec![palisade.as_str(), "run"];
        let (policy, socket);
        match mode {
            Mode::Embedded => {
                policy = self.policy.to_string_lossy().into_owned();
                argv.extend(["--policy", &policy]);
            }
            _ => {
                let d = &self.daemons.iter().find(|(m, _)| *m == mode).unwrap().1;
                socket = d.socket.to_string_lossy().into_owned();
                argv.extend(["--socket", &socket]);
            }
        }
        argv.extend(["--profile", "fidelity"]);
        argv.extend(flags);
        argv.extend(["--", "sh", "-c", script]);
        let journal = state.join("journal");
        let env = [("PALISADE_STATE", state.as_path()), ("PALISADE_JOURNAL", journal.as_path())];
        let o = self.as_user(&env, &argv).output().unwrap();
        (o, snapshot(&self.ws))
    }
}

/// The workspace `setup` makes, with `script` run in it bare twice and
/// through every broker: each tree the same, each run exiting 0.
fn differential(tag: &str, read_only: &[&Path], setup: impl FnOnce(&Path), script: &str) {
    let f = Fixture::new(tag, read_only, setup);
    // The two bare runs start at least two seconds apart: what a command
    // stamps with the clock (cargo's cache tracker keeps a time in seconds,
    // a zip's are of two) differs between them and is then known for the
    // command's own doing, which it would not be were both in one second.
    let started = std::time::Instant::now();
    let want = f.bare(script);
    std::thread::sleep(std::time::Duration::from_millis(2100).saturating_sub(started.elapsed()));
    let again = f.bare(script);
    for mode in f.modes() {
        let (o, got) = f.sandboxed(mode, script);
        assert_eq!(o.status.code(), Some(0), "{tag} {mode:?}: {}\n{}", text(&o.stdout), text(&o.stderr));
        let diff = differences(&want, &again, &got);
        assert!(diff.is_empty(), "{tag} {mode:?}: {} differences:\n{}", diff.len(), diff.join("\n"));
        assert!(!got.is_empty() || want.is_empty(), "{tag} {mode:?}: nothing written");
    }
}

#[test]
fn hard_links_holes_fifos_sockets_xattrs_and_modes_land_as_they_are() {
    let setup = |ws: &Path| {
        std::fs::write(ws.join("existing.txt"), "host\n").unwrap();
        std::fs::write(ws.join("private.txt"), "p\n").unwrap();
        std::fs::create_dir_all(ws.join("keep/empty")).unwrap();
    };
    let script = r#"set -e
echo one > a; ln a b
ln existing.txt existing-link
truncate -s 400M sparse
printf head > holes; printf tail | dd of=holes bs=1 seek=104857600 conv=notrunc 2>/dev/null
truncate -s 300K small-sparse
mkfifo pipe
mkdir -p made/empty another/deep/empty
chmod 600 private.txt; chmod 700 made; mkdir closed; chmod 000 closed
echo x > ro; chmod 444 ro; echo s > secret; chmod 000 secret; echo w > write-only; chmod 200 write-only
mkdir search-only; echo in > search-only/in; chmod 300 search-only
ln -s a relative-link; ln -s /etc/hostname absolute-link; ln -s missing dangling
python3 - <<'PY'
import os, socket
os.setxattr("a", "user.origin", b"from the run")
os.setxattr("made", "user.dir", b"d")
s = socket.socket(socket.AF_UNIX); s.bind("listening.sock"); s.close()
PY
"#;
    differential("fidelity-kinds", &[], setup, script);
}

#[test]
fn renames_removals_and_replacements_land_as_they_are() {
    let setup = |ws: &Path| {
        for d in ["tree/a/b", "moved-dir/sub", "replaced-dir/x", "gone/deep/er"] {
            std::fs::create_dir_all(ws.join(d)).unwrap();
        }
        for f in [
            "tree/a/b/f",
            "moved-dir/sub/f",
            "replaced-dir/x/f",
            "gone/deep/er/f",
            "rename-me",
            "over",
            "to-dir",
        ] {
            std::fs::write(ws.join(f), format!("{f}\n")).unwrap();
        }
    };
    let script = r#"set -e
mv rename-me renamed
mv moved-dir dir-moved
mv over-target over 2>/dev/null || true
echo new > new; mv new over
rm -rf gone
rm -rf replaced-dir; echo now-a-file > replaced-dir
rm to-dir; mkdir to-dir; echo inner > to-dir/inner
mv tree/a tree/renamed-a
"#;
    differential("fidelity-renames", &[], setup, script);
}

#[test]
fn names_with_spaces_newlines_other_bytes_and_255_bytes_land_as_they_are() {
    let script = r#"python3 - <<'PY'
import os
for name in [b"with space", b"new\nline", b"latin-\xe9-\xff", b"x" * 255, b"dir with space"]:
    if name.startswith(b"dir"):
        os.makedirs(name + b"/" + b"y" * 255)
    else:
        with open(name, "wb") as f:
            f.write(name)
PY
"#;
    differential("fidelity-names", &[], |_| {}, script);
}

#[test]
fn make_of_a_c_file_lands_as_it_does_without_a_sandbox() {
    let setup = |ws: &Path| {
        std::fs::write(
            ws.join("hello.c"),
            "#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n",
        )
        .unwrap();
        std::fs::write(
            ws.join("Makefile"),
            "hello: hello.o\n\tcc -o $@ $^\nhello.o: hello.c\n\tcc -c -o $@ $<\n",
        )
        .unwrap();
    };
    differential("fidelity-make", &[], setup, "set -e; make -s; ./hello > out.txt");
}

#[test]
fn git_init_add_commit_and_gc_land_as_they_do_without_a_sandbox() {
    let script = r#"set -e
export GIT_AUTHOR_NAME=A GIT_AUTHOR_EMAIL=author GIT_COMMITTER_NAME=A GIT_COMMITTER_EMAIL=author
export GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z' GIT_CONFIG_NOSYSTEM=1
git init -q -b main repo; cd repo
for i in 1 2 3; do echo "line $i" > "f$i"; git add "f$i"; git commit -q -m "c$i"; done
git branch side; git gc -q
git count-objects -v > ../objects.txt
"#;
    differential("fidelity-git", &[], |_| {}, script);
}

/// The comparison sees a difference where there is one: the same case with
/// its writes held (not applied) differs from the bare run, and the run says so.
#[test]
fn a_run_whose_writes_are_held_differs_and_says_so() {
    let f = Fixture::new("fidelity-held", &[], |ws| std::fs::write(ws.join("kept.txt"), "k\n").unwrap());
    let script = "set -e; echo changed > kept.txt; echo new > new.txt";
    let (want, again) = (f.bare(script), f.bare(script));
    assert!(differences(&want, &again, &want).is_empty());
    f.reset();
    let before = snapshot(&f.ws);
    let diff = differences(&want, &again, &before);
    assert!(diff.iter().any(|d| d.starts_with("missing new.txt")), "{diff:?}");
    assert!(diff.iter().any(|d| d.starts_with("kept.txt")), "{diff:?}");
    let (o, got) = f.sandboxed_with(Mode::Embedded, &["--hold-changes"], script);
    assert_eq!(o.status.code(), Some(123), "held, and said: {}", text(&o.stderr));
    assert_eq!(differences(&want, &again, &got), diff, "nothing applied");
    // Counter-test: the same run applied is the same as the bare one.
    let (o, got) = f.sandboxed(Mode::Embedded, script);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(differences(&want, &again, &got).is_empty());
}

/// A Rust toolchain the test user can read: the sysroot's `bin` and `lib`
/// linked into `dir` (root's own is under its home, closed to others), or,
/// not as root, the sysroot itself.
#[cfg(feature = "slow")]
fn toolchain(dir: &Path) -> PathBuf {
    let o = Command::new("rustc").args(["--print", "sysroot"]).output().expect("rustc");
    let sysroot = PathBuf::from(text(&o.stdout).trim());
    if !is_root() {
        return sysroot;
    }
    let to = dir.join("toolchain");
    std::fs::create_dir_all(&to).unwrap();
    for part in ["bin", "lib"] {
        let linked = Command::new("cp").arg("-al").arg(sysroot.join(part)).arg(&to).output().unwrap();
        if !linked.status.success() {
            let copied = Command::new("cp").arg("-a").arg(sysroot.join(part)).arg(&to).output().unwrap();
            assert!(copied.status.success(), "{}", text(&copied.stderr));
        }
    }
    to
}

#[cfg(feature = "slow")]
#[test]
fn cargo_new_and_cargo_build_of_a_crate_with_dependencies_land_as_they_do_without_a_sandbox() {
    let tools = TempDir::new("fidelity-rust");
    std::fs::set_permissions(tools.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let rust = toolchain(tools.path());
    let setup = |ws: &Path| {
        let deps = "[dependencies]\nliba = { path = \"../liba\" }\nlibb = { path = \"../libb\" }\n";
        for (name, deps, src, file) in [
            ("app", deps, "fn main() { println!(\"{} {}\", liba::a(), libb::b()); }\n", "main.rs"),
            ("liba", "", "pub fn a() -> &'static str { \"a\" }\n", "lib.rs"),
            ("libb", "", "pub fn b() -> &'static str { \"b\" }\n", "lib.rs"),
        ] {
            std::fs::create_dir_all(ws.join(name).join("src")).unwrap();
            let manifest =
                format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n{deps}");
            std::fs::write(ws.join(name).join("Cargo.toml"), manifest).unwrap();
            std::fs::write(ws.join(name).join("src").join(file), src).unwrap();
        }
    };
    let script = format!(
        "set -e; export PATH={}/bin:$PATH CARGO_HOME=$PWD/.cargo-home CARGO_INCREMENTAL=0\n\
         (cd app && echo '// edit' >> src/main.rs && cargo build -q && ./target/debug/app > ../ran.txt)\n\
         cargo new -q --vcs none fresh && (cd fresh && cargo build -q)",
        rust.display()
    );
    differential("fidelity-cargo", &[&rust], setup, &script);
}

/// A wheel of one pure-Python module, made with the standard library.
#[cfg(feature = "slow")]
fn wheel(dir: &Path) {
    let script = r#"
import base64, hashlib, sys, zipfile
path = sys.argv[1] + "/hello-1.0-py3-none-any.whl"
files = {
    "hello.py": b"def hello():\n    return 'hello'\n",
    "hello-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hello\nVersion: 1.0\n",
    "hello-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: fidelity\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append("hello-1.0.dist-info/RECORD,,")
files["hello-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
with zipfile.ZipFile(path, "w") as z:
    for name, data in files.items():
        z.writestr(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), data)
"#;
    let o = Command::new("/usr/bin/python3").args(["-c", script]).arg(dir).output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[cfg(feature = "slow")]
#[test]
fn a_venv_with_pip_install_of_a_local_wheel_lands_as_it_does_without_a_sandbox() {
    let script = "set -e; /usr/bin/python3 -m venv .venv\n\
                  .venv/bin/pip install -q --no-index --no-cache-dir --disable-pip-version-check ./hello-1.0-py3-none-any.whl\n\
                  .venv/bin/python -c 'import hello; print(hello.hello())' > ran.txt";
    differential("fidelity-pip", &[], wheel, script);
}

/// A package of one module, packed by npm.
#[cfg(feature = "slow")]
fn npm_package(dir: &Path) {
    let pkg = dir.join("pkg");
    std::fs::create_dir(&pkg).unwrap();
    std::fs::write(pkg.join("package.json"), r#"{"name": "hello", "version": "1.0.0", "main": "index.js"}"#)
        .unwrap();
    std::fs::write(pkg.join("index.js"), "module.exports = () => 'hello';\n").unwrap();
    let o = Command::new("npm")
        .args(["pack", "--silent", "--pack-destination", ".."])
        .current_dir(&pkg)
        .env("HOME", dir.join(".pack-home"))
        .output()
        .expect("npm");
    assert!(o.status.success(), "{}", text(&o.stderr));
    std::fs::remove_dir_all(&pkg).unwrap();
    std::fs::remove_dir_all(dir.join(".pack-home")).ok();
    std::fs::write(dir.join("package.json"), r#"{"name": "app", "version": "1.0.0", "private": true}"#)
        .unwrap();
}

#[cfg(feature = "slow")]
#[test]
fn npm_install_of_a_local_tarball_lands_as_it_does_without_a_sandbox() {
    let script = "set -e; npm install --offline --no-audit --no-fund --loglevel=error --cache $PWD/.npm-cache ./hello-1.0.0.tgz\n\
                  node -e 'console.log(require(\"hello\")())' > ran.txt";
    differential("fidelity-npm", &[], npm_package, script);
}

#[cfg(feature = "slow")]
#[test]
fn twenty_thousand_small_files_and_a_300_mb_file_land_as_they_do_without_a_sandbox() {
    let script = "set -e; python3 -c \"import os\nos.makedirs('many/deeper')\n\
                  for i in range(20000): open('many/f%05d' % i, 'w').write(str(i))\n\
                  for i in range(500): open('f%03d' % i, 'w').write(str(i))\"\n\
                  head -c 300M /dev/zero > big";
    differential("fidelity-volume", &[], |_| {}, script);
}
