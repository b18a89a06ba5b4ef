//! Paths the host executes: files that a person's tools run outside any
//! sandbox without being asked to run the project's code (git's hooks and
//! the commands git's configuration names, direnv's `.envrc`, an editor's
//! tasks and settings, a shell's start-up files, an agent's configuration).
//! A run may write them inside its sandbox, but its change to one is never
//! applied to the host by itself: the copy-back withholds it, and says so.
//!
//! Paths are relative to the granted directory the run wrote in. The
//! built-in list is [`HOST_EXECUTED`]; `[policy] host_executed` adds globs.

use globset::{GlobSet, GlobSetBuilder};
use std::path::{Component, Path};

/// Globs (relative to a granted directory; `**/` for any depth) of files a
/// host runs, or whose settings make it run something.
pub const HOST_EXECUTED: &[&str] = &[
    // direnv runs `.envrc` when a shell enters the directory.
    "**/.envrc",
    // Editors run tasks, launch configurations and the commands their settings name.
    "**/.vscode/tasks.json",
    "**/.vscode/launch.json",
    "**/.vscode/settings.json",
    "**/.vscode/mcp.json",
    "**/.idea/**",
    // Shells run their start-up files (a home used as a workspace).
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".config/fish/**",
    // Agents start the servers and run the hooks their configuration names.
    "**/.mcp.json",
    "**/.claude/**",
    "**/.cursor/**",
    "**/.codex/**",
    "**/.gemini/**",
    "**/.continue/**",
];

/// git's configuration keys that name a command git runs, or move where it
/// finds one (lower case: git's section and key names are not case-sensitive).
/// `*` stands for any subsection.
const GIT_RUNS: &[&str] = &[
    "core.hookspath",
    "core.fsmonitor",
    "core.sshcommand",
    "core.editor",
    "core.pager",
    "core.askpass",
    "core.gitproxy",
    "core.worktree",
    "sequence.editor",
    "diff.external",
    "diff.*.textconv",
    "diff.*.command",
    "merge.*.driver",
    "filter.*.clean",
    "filter.*.smudge",
    "filter.*.process",
    "credential.helper",
    "credential.*.helper",
    "gpg.program",
    "gpg.*.program",
    "uploadpack.packobjectshook",
    "remote.*.uploadpack",
    "remote.*.receivepack",
    "difftool.*.cmd",
    "mergetool.*.cmd",
    "web.browser",
    "browser.*.cmd",
    "man.*.cmd",
];

/// git's configuration sections any key of which matters: aliases run
/// commands (`!cmd`), includes bring in a file of settings, pagers per
/// command run commands.
const GIT_RUNS_SECTIONS: &[&str] = &["alias", "include", "includeif", "pager"];

/// What a path the run changed is, for the copy-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// An ordinary file: applied.
    Apply,
    /// A path the host executes: withheld, with what it is.
    Withhold(&'static str),
    /// A git configuration file: withheld when the commands it names differ
    /// from the host's (see [`git_commands`]); applied otherwise.
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

    /// What `rel` (relative to a granted directory) is. `is_dir` says
    /// whether the run left a directory there (the copy-back asks before
    /// it descends: a withheld directory is withheld whole); `beside_head`
    /// whether the directory holding it has a `HEAD` (a bare repository).
    pub fn check(&self, rel: &Path, is_dir: bool, beside_head: bool) -> Check {
        let names: Vec<&str> = rel
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => n.to_str(),
                _ => None,
            })
            .collect();
        let Some((last, parents)) = names.split_last() else { return Check::Apply };
        let in_git = parents.contains(&".git");
        // Not a directory, `.git` names a repository elsewhere (`gitdir: PATH`).
        if *last == ".git" && !is_dir {
            return Check::Withhold("a .git file or link (it names the repository git uses)");
        }
        if *last == "hooks" && (in_git || beside_head) {
            return Check::Withhold("git hooks");
        }
        if !is_dir && matches!(*last, "config" | "config.worktree") && (in_git || beside_head) {
            return Check::GitConfig;
        }
        if self.globs.is_match(rel) {
            return Check::Withhold("a file the host runs (direnv, an editor, a shell, an agent)");
        }
        Check::Apply
    }
}

/// The settings of a git configuration text that make git run a command,
/// as `(section[.subsection].key, value)`, sorted; `None` when the text is
/// not one git would read as such (then it is withheld whole).
pub fn git_commands(text: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut section: Option<(String, Option<String>)> = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let mut line = line.trim().to_string();
        // A value continued on the next line.
        while line.ends_with('\\') && !line.ends_with("\\\\") {
            line.pop();
            line.push_str(lines.next()?.trim());
        }
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let (header, after) = rest.split_once(']')?;
            let after = after.trim();
            if !after.is_empty() && !after.starts_with('#') && !after.starts_with(';') {
                // `[section] key = value` on one line: read the key too.
                section = Some(parse_header(header)?);
                out.extend(entry(section.as_ref()?, after)?);
                continue;
            }
            section = Some(parse_header(header)?);
            continue;
        }
        out.extend(entry(section.as_ref()?, &line)?);
    }
    out.sort();
    Some(out)
}

/// `section`, `section "sub"` or the old `section.sub`.
fn parse_header(header: &str) -> Option<(String, Option<String>)> {
    let header = header.trim();
    if let Some((name, sub)) = header.split_once(char::is_whitespace) {
        let sub = sub.trim().strip_prefix('"')?.strip_suffix('"')?;
        return Some((name.to_ascii_lowercase(), Some(sub.replace("\\\"", "\"").replace("\\\\", "\\"))));
    }
    match header.split_once('.') {
        Some((name, sub)) => Some((name.to_ascii_lowercase(), Some(sub.to_ascii_lowercase()))),
        None => Some((header.to_ascii_lowercase(), None)),
    }
}

/// One `key = value` line: the setting, if it is one that runs a command.
fn entry(section: &(String, Option<String>), line: &str) -> Option<Option<(String, String)>> {
    let (key, value) = match line.split_once('=') {
        Some((k, v)) => (k.trim(), v.trim()),
        // A key alone is a boolean true.
        None => (line.trim(), "true"),
    };
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return None;
    }
    let key = key.to_ascii_lowercase();
    let (name, sub) = section;
    let runs = GIT_RUNS_SECTIONS.contains(&name.as_str())
        || GIT_RUNS.iter().any(|pattern| {
            let parts: Vec<&str> = pattern.split('.').collect();
            match (parts.as_slice(), sub) {
                ([s, k], None) => s == name && *k == key,
                ([s, "*", k], Some(_)) => s == name && *k == key,
                _ => false,
            }
        });
    let full = match sub {
        Some(s) => format!("{name}.{s}.{key}"),
        None => format!("{name}.{key}"),
    };
    Some(runs.then(|| (full, value.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_git_files_and_listed_paths_are_withheld_and_ordinary_files_applied() {
        let h = HostExecuted::new(&["tools/run-on-open.sh".into()]);
        let check = |p: &str, dir: bool| h.check(Path::new(p), dir, false);
        assert!(matches!(check(".git/hooks", true), Check::Withhold(_)));
        assert!(matches!(check("sub/.git/hooks", false), Check::Withhold(_)));
        assert!(matches!(check(".git/modules/lib/hooks", true), Check::Withhold(_)));
        assert!(matches!(check(".git", false), Check::Withhold(_)));
        assert_eq!(check(".git/config", false), Check::GitConfig);
        assert_eq!(check(".git/worktrees/w/config.worktree", false), Check::GitConfig);
        assert!(matches!(check(".envrc", false), Check::Withhold(_)));
        assert!(matches!(check("app/.vscode/tasks.json", false), Check::Withhold(_)));
        assert!(matches!(check(".bashrc", false), Check::Withhold(_)));
        assert!(matches!(check(".mcp.json", false), Check::Withhold(_)));
        assert!(matches!(check(".claude", true), Check::Apply));
        assert!(matches!(check(".claude/settings.json", false), Check::Withhold(_)));
        assert!(matches!(check("tools/run-on-open.sh", false), Check::Withhold(_)));
        // Counter-tests: data beside them.
        for ordinary in [
            ".git",
            "src/main.rs",
            ".git/objects/ab/cdef",
            ".git/refs/heads/main",
            ".git/HEAD",
            "docs/.bashrc",
            "config",
        ] {
            assert_eq!(check(ordinary, ordinary == ".git"), Check::Apply, "{ordinary}");
        }
        assert_eq!(check("hooks", true), Check::Apply);
        // A bare repository's hooks and configuration, by the HEAD beside them.
        assert_eq!(h.check(Path::new("bare/config"), false, true), Check::GitConfig);
        assert!(matches!(h.check(Path::new("bare/hooks"), true, true), Check::Withhold(_)));
    }

    #[test]
    fn git_settings_that_run_commands_are_found_in_every_spelling() {
        let plain = "[core]\n\trepositoryformatversion = 0\n\tbare = false\n[remote \"origin\"]\n\turl = x\n";
        assert_eq!(git_commands(plain), Some(vec![]));
        let text = "[core]\n\tfsmonitor = ./evil\n[Alias]\n\tst = !sh -c x\n[filter \"lfs\"]\n\tsmudge = y\n\
                    [include]\n\tpath = ../x\n[CORE] HooksPath = h\n[diff \"a\"]\n\ttextconv = z\n";
        let found = git_commands(text).unwrap();
        let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "alias.st",
                "core.fsmonitor",
                "core.hookspath",
                "diff.a.textconv",
                "filter.lfs.smudge",
                "include.path"
            ]
        );
        // A continued line is one value; a malformed file is no git configuration.
        assert_eq!(git_commands("[core]\n\teditor = vi \\\n  -x\n").unwrap()[0].1, "vi -x");
        assert_eq!(git_commands("[core\nfsmonitor = x\n"), None);
        assert_eq!(git_commands("fsmonitor = x\n"), None);
    }
}
