//! Paths the host executes: files that a person's tools run outside any
//! sandbox without being asked to run the project's code (git's hooks and
//! the commands git's configuration names, direnv's `.envrc`, an editor's
//! tasks and settings, a shell's start-up files, an agent's configuration),
//! and the places of credentials and keys. A run may write them inside its
//! sandbox, but its change to one is never applied to the host by itself:
//! it is held for a person (`palisade changes apply --host-executed`).
//!
//! A path is checked as the granted directory's relative path and as the
//! host path both. Inside a git directory only the data git keeps (objects,
//! refs, logs, the index, ...) is ordinary; anything else there (hooks,
//! `commondir`, `gitdir`, files git does not write) is held, and a change to
//! its configuration is held unless it changes only keys that run nothing
//! (`GIT_SAFE_KEYS`). The built-in globs are [`HOST_EXECUTED`];
//! `[policy] host_executed` adds more.

use globset::{GlobSet, GlobSetBuilder};

mod in_place;
pub use in_place::{InPlace, InTree, git_code_paths, normal};
use std::path::{Component, Path, PathBuf};

/// Globs (relative to a granted directory, or of the host path; `**/` for
/// any depth) of files a host runs, or whose settings make it run something.
pub const HOST_EXECUTED: &[&str] = &[
    // direnv, mise and devcontainers run what these say when a shell or an editor opens the project.
    "**/.envrc",
    "**/mise.toml",
    "**/.mise.toml",
    "**/.devcontainer/**",
    "**/.devcontainer.json",
    "**/mise.local.toml",
    "**/.mise.local.toml",
    "**/.mise/**",
    "**/.envrc.local",
    // git hook managers and the hooks they install.
    "**/.husky/**",
    "**/.pre-commit-config.yaml",
    "**/lefthook.yml",
    "**/lefthook.yaml",
    "**/.lefthook.yml",
    "**/.lefthook.yaml",
    "**/lefthook-local.yml",
    "**/lefthook-local.yaml",
    // Run by an installed hook at every commit: lint-staged's, simple-git-hooks', overcommit's commands.
    "**/.lintstagedrc",
    "**/.lintstagedrc.*",
    "**/lint-staged.config.*",
    "**/.simple-git-hooks.*",
    "**/simple-git-hooks.*",
    "**/.overcommit.yml",
    // Editors run tasks, launch configurations and the commands their settings name.
    "**/.vscode/**",
    "**/*.code-workspace",
    "**/.idea/**",
    "**/.zed/**",
    // Editors that run a project's own start-up file when they open it.
    "**/.nvim.lua",
    "**/.nvimrc",
    "**/.exrc",
    // Shells, desktops and editors run their start-up files (a home used as a workspace).
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".bash_aliases",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".xprofile",
    ".xinitrc",
    ".pam_environment",
    ".inputrc",
    ".vimrc",
    ".emacs",
    ".emacs.d/**",
    ".gitconfig",
    ".config/git/**",
    ".config/fish/**",
    ".config/nvim/**",
    ".config/autostart/**",
    ".config/systemd/user/**",
    ".config/environment.d/**",
    ".local/bin/**",
    ".cargo/bin/**",
    // Agents start the servers and run the hooks their configuration names.
    "**/.mcp.json",
    "**/.claude/**",
    "**/.cursor/**",
    "**/.codex/**",
    "**/.gemini/**",
    "**/.continue/**",
    "**/.opencode/**",
    "**/opencode.json",
    "**/opencode.jsonc",
    "**/.kiro/**",
    "**/.roo/**",
    "**/.windsurf/**",
    "**/.amazonq/**",
    "**/.junie/**",
    "**/.qwen/**",
    "**/.crush.json",
    "**/crush.json",
    "**/.aider.conf.yml",
];

/// git's configuration keys whose change runs nothing and points git at no
/// other code (lower case; `*` is any subsection): a change to any other key
/// is held. An allow-list, since git keeps adding keys that run commands.
const GIT_SAFE_KEYS: &[&str] = &[
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
    "core.autocrlf",
    "core.eol",
    "core.safecrlf",
    "core.quotepath",
    "core.checkstat",
    "core.trustctime",
    "remote.*.url",
    "remote.*.pushurl",
    "remote.*.fetch",
    "remote.*.push",
    "remote.*.tagopt",
    "remote.*.prune",
    "branch.*.remote",
    "branch.*.merge",
    "branch.*.rebase",
    "branch.*.pushremote",
    "branch.*.description",
    "user.name",
    "user.email",
    "init.defaultbranch",
    "pull.rebase",
    "pull.ff",
    "push.default",
    "push.autosetupremote",
    "fetch.prune",
    "merge.ff",
    "rebase.autostash",
    "rebase.autosquash",
    "gc.auto",
    "index.version",
    "extensions.objectformat",
    "submodule.*.url",
    "submodule.*.active",
];

/// What git writes in a git directory that is data, not code: relative to
/// the git directory, a name or a directory of names.
const GIT_DATA: &[&str] = &[
    "objects",
    "refs",
    "logs",
    "info",
    "lfs",
    "index",
    "packed-refs",
    "shallow",
    "description",
    "HEAD",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_RR",
    "AUTO_MERGE",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
    "BISECT_LOG",
    "BISECT_START",
    "BISECT_TERMS",
    "BISECT_NAMES",
    "BISECT_EXPECTED_REV",
    "COMMIT_EDITMSG",
    "TAG_EDITMSG",
    "rr-cache",
    "gitk.cache",
    // Remotes' URLs by an older layout (what `git init` makes): as safe as `remote.*.url`.
    "branches",
];

/// What a path the run changed is, for the copy-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// An ordinary file: applied.
    Apply,
    /// A path the host executes, or a credential's place: held, with what it is.
    Withhold(&'static str),
    /// A git configuration file: held when it changes other keys than
    /// [`GIT_SAFE_KEYS`] (see [`config_changes_commands`]), applied otherwise.
    GitConfig,
}

/// The built-in list and the configured globs, compiled.
#[derive(Debug)]
pub struct HostExecuted {
    globs: GlobSet,
}

impl HostExecuted {
    /// `extra`: `[policy] host_executed`, checked when the configuration was parsed.
    pub fn new(extra: &[String]) -> HostExecuted {
        let mut b = GlobSetBuilder::new();
        for p in HOST_EXECUTED.iter().map(|s| s.to_string()).chain(extra.iter().cloned()) {
            if let Ok(g) = globset::GlobBuilder::new(&p).literal_separator(true).build() {
                b.add(g);
            }
        }
        HostExecuted { globs: b.build().unwrap_or_else(|_| GlobSet::empty()) }
    }

    /// What `rel` (relative to the granted directory `root`) is. `is_dir`
    /// says whether the run left a directory there (the copy-back asks
    /// before it descends: a held directory is held whole); `beside_head`
    /// whether the directory holding it has a `HEAD` (a bare repository's
    /// layout); `hooks`: the host's own hooks directories (`core.hooksPath`),
    /// relative to `root`.
    pub fn check(
        &self,
        root: &Path,
        rel: &Path,
        is_dir: bool,
        beside_head: bool,
        hooks: &[PathBuf],
    ) -> Check {
        let full = root.join(rel);
        if hooks.iter().any(|h| rel.starts_with(h)) {
            return Check::Withhold("git hooks (the repository's core.hooksPath)");
        }
        if crate::validate::names_a_credential(rel) || crate::validate::names_a_credential(&full) {
            return Check::Withhold("a place of credentials or keys");
        }
        // Checked on the host path too: a granted directory may lie inside a repository.
        for path in [rel, full.as_path()] {
            match git_check(path, is_dir, beside_head) {
                Check::Apply => {}
                held => return held,
            }
        }
        // Not a directory, a name whose contents would be held is held too:
        // a link `.claude -> elsewhere` would move the files an agent runs.
        let inside = |p: &Path| self.globs.is_match(p) || self.globs.is_match(p.join("_"));
        let matches = if is_dir {
            self.globs.is_match(rel) || self.globs.is_match(&full)
        } else {
            inside(rel) || inside(&full)
        };
        if matches {
            return Check::Withhold("a file the host runs (direnv, an editor, a shell, an agent)");
        }
        Check::Apply
    }
}

impl HostExecuted {
    /// Whether everything the directory `rel` (in `root`) could hold is a
    /// path the host executes (`.vscode/`, `.claude/`, ...): held whole.
    pub fn holds_whole(&self, root: &Path, rel: &Path) -> bool {
        self.globs.is_match(rel.join("_")) || self.globs.is_match(root.join(rel).join("_"))
    }
}

/// The names of `path`, as strings (a name that is not UTF-8 is none of those checked).
fn names(path: &Path) -> Vec<&str> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_str().unwrap_or("\u{fffd}")),
            _ => None,
        })
        .collect()
}

/// What a path in or around a git directory is.
fn git_check(path: &Path, is_dir: bool, beside_head: bool) -> Check {
    let names = names(path);
    let Some((last, parents)) = names.split_last() else { return Check::Apply };
    // Not a directory, `.git` names a repository elsewhere (`gitdir: PATH`).
    if *last == ".git" && !is_dir {
        return Check::Withhold("a .git file or link (it names the repository git uses)");
    }
    // A bare repository's files, by the HEAD beside them (a `.git`
    // directory's, below, are looked at one by one).
    if beside_head && parents.last() != Some(&".git") {
        match *last {
            "hooks" => return Check::Withhold("git hooks"),
            "commondir" | "gitdir" => return Check::Withhold("a git directory's pointer to another"),
            "config" | "config.worktree" if !is_dir => return Check::GitConfig,
            _ => {}
        }
    }
    let Some(at) = parents.iter().rposition(|n| *n == ".git") else { return Check::Apply };
    in_git_dir(&names[at + 1..], is_dir)
}

/// What `inside` (names below a git directory) is: data, the configuration,
/// or anything else (held). `modules/NAME/` and `worktrees/NAME/` are git
/// directories of their own.
fn in_git_dir(inside: &[&str], is_dir: bool) -> Check {
    match inside {
        [] => Check::Apply,
        ["modules" | "worktrees"] if is_dir => Check::Apply,
        ["modules" | "worktrees", _] if is_dir => Check::Apply,
        ["modules" | "worktrees", _, rest @ ..] => in_git_dir(rest, is_dir),
        ["config" | "config.worktree"] if !is_dir => Check::GitConfig,
        [first, ..] if GIT_DATA.contains(first) => Check::Apply,
        // The directory runs nothing itself: each file made in it is looked
        // at, and git runs no hook named `*.sample` (what `git init` writes).
        ["hooks"] if is_dir => Check::Apply,
        ["hooks", name] if !is_dir && name.ends_with(".sample") => Check::Apply,
        ["hooks", ..] => Check::Withhold("git hooks"),
        ["commondir" | "gitdir", ..] => Check::Withhold("a git directory's pointer to another"),
        // A rebase's or a cherry-pick's pending steps: `exec` lines run when it goes on.
        ["sequencer" | "rebase-merge" | "rebase-apply", ..] => {
            Check::Withhold("git's pending rebase or sequencer steps (they may name commands)")
        }
        _ => Check::Withhold("a file in a git directory that is not git's data"),
    }
}

/// Whether the git configuration `theirs` (the run's) changes a key other
/// than [`GIT_SAFE_KEYS`] from `ours` (the host's; empty when there is
/// none), or either is not one git would read as such.
pub fn config_changes_commands(theirs: &str, ours: &str) -> bool {
    let (Some(mut a), Some(mut b)) = (parse_git_config(theirs), parse_git_config(ours)) else { return true };
    a.sort();
    b.sort();
    let differ = a.iter().filter(|e| !b.contains(e)).chain(b.iter().filter(|e| !a.contains(e)));
    differ.map(|(k, _)| k).any(|k| !safe_key(k))
}

fn safe_key(key: &str) -> bool {
    let parts: Vec<&str> = key.split('.').collect();
    GIT_SAFE_KEYS.iter().any(|pattern| {
        let p: Vec<&str> = pattern.split('.').collect();
        match (p.as_slice(), parts.as_slice()) {
            ([s, k], [ks, kk]) => s == ks && k == kk,
            ([s, "*", k], [ks, .., kk]) => s == ks && k == kk && parts.len() >= 3,
            _ => false,
        }
    })
}

/// The settings of a git configuration text, as `(section[.subsection].key,
/// value)` (section and key in lower case, as git compares them); `None`
/// when git would not read it as written. Read as git's own `config.c`
/// does: comments (`#`, `;`) end at the line's end and are never
/// continued, a backslash at a line's end continues a value only, quotes
/// keep `#`, `;` and spaces, escapes are `\\`, `\"`, `\n`, `\t`, `\b`.
pub fn parse_git_config(text: &str) -> Option<Vec<(String, String)>> {
    let mut p = Parser { s: text.as_bytes(), i: 0 };
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    loop {
        p.skip_blank_lines();
        match p.peek() {
            None => return Some(out),
            Some(b'#' | b';') => p.skip_line(),
            Some(b'[') => section = Some(p.header()?),
            Some(c) if c.is_ascii_alphabetic() => {
                let key = p.key()?;
                let value = p.value()?;
                out.push((format!("{}.{key}", section.as_ref()?), value));
            }
            Some(_) => return None,
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_blank_lines(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.i += 1;
        }
    }

    fn skip_spaces(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r')) {
            self.i += 1;
        }
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.peek() {
            self.i += 1;
            if c == b'\n' {
                break;
            }
        }
    }

    /// `[name]`, `[name "sub"]` or the old `[name.sub]`; keys may follow on its line.
    fn header(&mut self) -> Option<String> {
        self.i += 1;
        let start = self.i;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'-' || c == b'.') {
            self.i += 1;
        }
        let name = std::str::from_utf8(&self.s[start..self.i]).ok()?.to_ascii_lowercase();
        if name.is_empty() {
            return None;
        }
        self.skip_spaces();
        let mut sub = None;
        if self.peek() == Some(b'"') {
            self.i += 1;
            let mut v = Vec::new();
            loop {
                match self.peek()? {
                    b'"' => break,
                    b'\n' => return None,
                    b'\\' => {
                        self.i += 1;
                        v.push(self.peek()?);
                    }
                    c => v.push(c),
                }
                self.i += 1;
            }
            self.i += 1;
            sub = Some(String::from_utf8(v).ok()?);
        }
        if self.peek()? != b']' {
            return None;
        }
        self.i += 1;
        Some(match sub {
            Some(sub) => format!("{name}.{sub}"),
            None => name,
        })
    }

    fn key(&mut self) -> Option<String> {
        let start = self.i;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'-') {
            self.i += 1;
        }
        Some(std::str::from_utf8(&self.s[start..self.i]).ok()?.to_ascii_lowercase())
    }

    /// After a key: `= value`, or nothing (a boolean true) before the line's
    /// end or a comment.
    fn value(&mut self) -> Option<String> {
        self.skip_spaces();
        match self.peek() {
            None | Some(b'\n') => return Some("true".into()),
            Some(b'#' | b';') => {
                self.skip_line();
                return Some("true".into());
            }
            Some(b'=') => self.i += 1,
            Some(_) => return None,
        }
        self.skip_spaces();
        let (mut v, mut quoted, mut kept) = (Vec::new(), false, 0);
        loop {
            let Some(c) = self.peek() else {
                return if quoted { None } else { text(v, kept) };
            };
            self.i += 1;
            match c {
                b'\n' if quoted => return None,
                b'\n' => return text(v, kept),
                b'#' | b';' if !quoted => {
                    self.skip_line();
                    return text(v, kept);
                }
                b'"' => quoted = !quoted,
                b'\\' => match self.peek()? {
                    b'\n' => self.i += 1,
                    e => {
                        self.i += 1;
                        v.push(match e {
                            b'n' => b'\n',
                            b't' => b'\t',
                            b'b' => 8,
                            b'\\' | b'"' => e,
                            _ => return None,
                        });
                    }
                },
                b' ' | b'\t' | b'\r' if !quoted => {
                    v.push(c);
                    continue;
                }
                c => v.push(c),
            }
            kept = v.len();
        }
    }
}

/// The value read, without the blanks it ended with outside quotes.
fn text(mut v: Vec<u8>, kept: usize) -> Option<String> {
    v.truncate(kept);
    String::from_utf8(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(p: &str, dir: bool) -> Check {
        HostExecuted::new(&["tools/run-on-open.sh".into()]).check(
            Path::new("/w"),
            Path::new(p),
            dir,
            false,
            &[],
        )
    }

    #[test]
    fn hooks_git_files_and_listed_paths_are_held_and_ordinary_files_applied() {
        for held in [
            (".git/hooks/pre-commit", false),
            (".git/hooks/pre-commit.sample/x", false),
            ("sub/.git/hooks", false),
            (".git/modules/lib/hooks/post-checkout", false),
            (".git/modules/lib/commondir", false),
            (".git/worktrees/w/gitdir", false),
            (".git/commondir", false),
            (".git/unknown-file", false),
            (".git", false),
            (".envrc", false),
            ("app/.vscode/tasks.json", false),
            (".bashrc", false),
            (".mcp.json", false),
            (".claude/settings.json", false),
            (".claude", false),
            (".husky/pre-commit", false),
            (".ssh/authorized_keys", false),
            (".aws/config", false),
            ("tools/run-on-open.sh", false),
            (".roo/mcp.json", false),
            (".kiro/settings/mcp.json", false),
            (".amazonq/mcp.json", false),
            (".junie/mcp/mcp.json", false),
            ("opencode.json", false),
            (".crush.json", false),
            (".aider.conf.yml", false),
            ("lefthook.yml", false),
            (".lintstagedrc", false),
            (".lintstagedrc.json", false),
            ("lint-staged.config.js", false),
        ] {
            assert!(matches!(check(held.0, held.1), Check::Withhold(_)), "{held:?}");
        }
        assert_eq!(check(".git/config", false), Check::GitConfig);
        assert_eq!(check(".git/worktrees/w/config.worktree", false), Check::GitConfig);
        // Counter-tests: data beside them.
        for (ordinary, dir) in [
            (".git", true),
            (".git/objects/ab/cdef", false),
            (".git/refs/heads/main", false),
            (".git/HEAD", false),
            (".git/index", false),
            (".git/modules/lib/objects/x", false),
            (".claude", true),
            ("src/main.rs", false),
            ("docs/.bashrc", false),
            ("config", false),
            ("hooks", true),
            // The hooks directory itself runs nothing, and git runs no `*.sample` (`git init`'s).
            (".git/hooks", true),
            (".git/hooks/pre-commit.sample", false),
            (".git/modules/lib/hooks", true),
            (".git/branches", true),
        ] {
            assert_eq!(check(ordinary, dir), Check::Apply, "{ordinary}");
        }
        // A bare repository's hooks, pointers and configuration, by the HEAD beside them.
        let h = HostExecuted::new(&[]);
        assert_eq!(h.check(Path::new("/w"), Path::new("bare/config"), false, true, &[]), Check::GitConfig);
        assert!(matches!(
            h.check(Path::new("/w"), Path::new("bare/hooks"), true, true, &[]),
            Check::Withhold(_)
        ));
        assert!(matches!(
            h.check(Path::new("/w"), Path::new("bare/commondir"), false, true, &[]),
            Check::Withhold(_)
        ));
        // A granted directory inside a repository: the host path says so.
        let inside = h.check(Path::new("/r/.git/hooks"), Path::new("pre-commit"), false, false, &[]);
        assert!(matches!(inside, Check::Withhold(_)), "{inside:?}");
        // The host's own hooks directory (core.hooksPath).
        let hooks = [PathBuf::from(".githooks")];
        assert!(matches!(
            h.check(Path::new("/w"), Path::new(".githooks/pre-push"), false, false, &hooks),
            Check::Withhold(_)
        ));
    }

    #[test]
    fn git_configuration_is_read_as_git_reads_it() {
        let base = "[core]\n\trepositoryformatversion = 0\n\tbare = false\n[remote \"origin\"]\n\turl = x\n";
        let read = parse_git_config(base).unwrap();
        assert_eq!(read[2], ("remote.origin.url".into(), "x".into()));
        // A comment never continues; a value does.
        let sneaky = "[core]\n# note \\\n\tfsmonitor = /evil\n\tbare = false ; x \\\n\teditor = evil\n";
        let read = parse_git_config(sneaky).unwrap();
        let keys: Vec<&str> = read.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["core.fsmonitor", "core.bare", "core.editor"], "{read:?}");
        assert_eq!(parse_git_config("[core]\n\teditor = vi \\\n  -x\n").unwrap()[0].1, "vi   -x");
        assert_eq!(
            parse_git_config("[a]\n\tk = \"q # not a comment\" # one\n").unwrap()[0].1,
            "q # not a comment"
        );
        assert_eq!(parse_git_config("[CORE] HooksPath = h\n").unwrap()[0].0, "core.hookspath");
        assert_eq!(parse_git_config("[alias]\n\tst\n").unwrap()[0], ("alias.st".into(), "true".into()));
        for bad in ["[core\nx = 1\n", "fsmonitor = x\n", "[a]\n\tk = \"open\n", "[a]\n\tk = \\q\n"] {
            assert_eq!(parse_git_config(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_changes_to_keys_that_run_nothing_are_ordinary() {
        let base = "[core]\n\trepositoryformatversion = 0\n";
        let plus = |s: &str| format!("{base}{s}");
        assert!(!config_changes_commands(&plus("[user]\n\temail = a@b\n"), base));
        assert!(!config_changes_commands(
            &plus("[branch \"x\"]\n\tremote = origin\n\tmerge = refs/heads/x\n"),
            base
        ));
        assert!(!config_changes_commands(base, ""), "a new repository's configuration");
        for runs in [
            "[core]\n\tfsmonitor = ./x\n",
            "[protocol \"ext\"]\n\tallow = always\n",
            "[gpg \"ssh\"]\n\tdefaultKeyCommand = x\n",
            "[submodule \"a\"]\n\tupdate = !x\n",
            "[alias]\n\tst = !x\n",
            "[include]\n\tpath = x\n",
            "[core]\n# c \\\n\tfsmonitor = x\n",
        ] {
            assert!(config_changes_commands(&plus(runs), base), "{runs:?}");
        }
        // A key the host has that the run removed is a change too.
        assert!(config_changes_commands(base, &plus("[core]\n\thooksPath = h\n")));
        assert!(config_changes_commands("[core\n", base));
    }
}
