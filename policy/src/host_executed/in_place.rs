//! What a run writing its tree in place (`disk = "direct"`) must find
//! read-only there: each path the host executes, held by a mount over
//! itself; the directories on the way to one, each a mount point of its own
//! so that none is renamed aside with what it holds; and the paths git's
//! configuration names as code (a hooks directory, an included file), for
//! what the run makes there when it ends.

use super::{Check, HostExecuted, parse_git_config};
use crate::host::{FileKind, HostFiles};
use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// A git configuration read is at most this large (a larger one names
/// nothing here; its repository is held read-only whole all the same).
const GIT_CONFIG_MAX_BYTES: u64 = 1 << 20;
/// Included configurations followed from one, at most.
const INCLUDE_DEPTH: usize = 10;

/// What a tree written in place holds of what the host executes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InPlace {
    /// Each path the host executes there (a directory whole), to be bound
    /// read-only over itself.
    pub read_only: Vec<PathBuf>,
    /// The directories between the tree and one of those, to be bound over
    /// themselves as they are (writable): a mount point is never renamed
    /// nor removed.
    pub pinned: Vec<PathBuf>,
    /// What git's configurations name as code inside the tree, there or
    /// not (hooks directories, included files).
    pub code: Vec<PathBuf>,
}

/// Why a tree cannot be written in place with what the host executes in
/// it held read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InTree {
    /// The tree is itself a place the host executes from: what it is.
    Itself(&'static str),
    /// A symbolic link where the host executes (or on the way to it): a
    /// mount over it would hold what it names, never the link itself.
    Link(PathBuf),
    /// A file the host executes with another name: the run could write it
    /// through that one.
    Linked(PathBuf),
    /// A name a plan cannot carry (not UTF-8).
    Name(PathBuf),
    /// More mounts than this many.
    TooMany(usize),
}

/// `path` with `.` and `..` resolved by its names (no link followed).
pub fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What the git configuration `text` names as code, as absolute paths:
/// its hooks directory (`core.hooksPath`, relative to `worktree`, where
/// hooks run) and the files it includes (`include.path`,
/// `includeIf.*.path`, relative to `dir`, the directory holding it); `~/`
/// is `home`. Returned with whether each is an included configuration.
pub fn git_code_paths(text: &str, dir: &Path, worktree: &Path, home: Option<&Path>) -> Vec<(PathBuf, bool)> {
    let settings = parse_git_config(text).unwrap_or_default();
    let mut out = Vec::new();
    for (key, value) in settings {
        let include = key == "include.path" || key.starts_with("includeif.") && key.ends_with(".path");
        if key != "core.hookspath" && !include {
            continue;
        }
        let path = match value.strip_prefix("~/") {
            Some(rest) => match home {
                Some(h) => h.join(rest),
                None => continue,
            },
            None if include => dir.join(&value),
            None => worktree.join(&value),
        };
        out.push((normal(&path), include));
    }
    out
}

impl HostExecuted {
    /// What a run writing `root` in place must find read-only there (see
    /// [`InPlace`]): at most `max` mounts, sorted, parents first. Read
    /// through `files`, with no symbolic link followed; `home`: the
    /// requester's, whose git configuration counts too.
    pub fn in_tree(
        &self,
        files: &dyn HostFiles,
        root: &Path,
        home: Option<&Path>,
        max: usize,
    ) -> Result<InPlace, InTree> {
        if let Check::Withhold(what) = self.check(root, Path::new(""), true, false, &[]) {
            return Err(InTree::Itself(what));
        }
        let mut walk =
            Walk { he: self, files, root, home, found: BTreeSet::new(), repos: Vec::new(), code: Vec::new() };
        for config in walk.global_configs() {
            walk.config(&config, Path::new("/"), 0);
        }
        walk.tree();
        walk.code_of_repos();
        if walk.code.iter().any(|c| c == root) {
            return Err(InTree::Itself("a repository's hooks directory (core.hooksPath)"));
        }
        walk.code_found();
        walk.finish(max)
    }
}

/// The walk of one tree.
struct Walk<'a> {
    he: &'a HostExecuted,
    files: &'a dyn HostFiles,
    root: &'a Path,
    home: Option<&'a Path>,
    /// Absolute paths the host executes.
    found: BTreeSet<PathBuf>,
    /// Each repository's git directory and work tree (absolute).
    repos: Vec<(PathBuf, PathBuf)>,
    /// What git's configurations name as code (absolute, normal).
    code: Vec<PathBuf>,
}

impl Walk<'_> {
    /// The system's and the requester's own git configurations.
    fn global_configs(&self) -> Vec<PathBuf> {
        let mut configs = vec![PathBuf::from("/etc/gitconfig")];
        if let Some(h) = self.home {
            configs.extend([h.join(".gitconfig"), h.join(".config/git/config")]);
        }
        configs
    }

    /// A repository whose git directory is `git_dir` (if it is one).
    fn repo(&mut self, git_dir: PathBuf, worktree: PathBuf) {
        if self.files.lstat(&git_dir).is_ok_and(|s| s.is_dir())
            && !self.repos.iter().any(|(g, _)| *g == git_dir)
        {
            self.repos.push((git_dir, worktree));
        }
    }

    /// What the configuration file `config` names, and what its includes do.
    fn config(&mut self, config: &Path, worktree: &Path, depth: usize) {
        let Some(text) = self.files.read_head(config, GIT_CONFIG_MAX_BYTES) else { return };
        let dir = config.parent().unwrap_or(Path::new("/"));
        for (path, include) in git_code_paths(&String::from_utf8_lossy(&text), dir, worktree, self.home) {
            if !self.code.contains(&path) {
                self.code.push(path.clone());
            }
            if include && depth < INCLUDE_DEPTH {
                self.config(&path, worktree, depth + 1);
            }
        }
    }

    /// The code every repository found names, and what the global
    /// configurations name in it (a relative hooks directory is the work
    /// tree's).
    fn code_of_repos(&mut self) {
        for (git_dir, worktree) in self.repos.clone() {
            for config in self.global_configs().into_iter().chain([git_dir.join("config")]) {
                self.config(&config, &worktree, 0);
            }
        }
    }

    /// The hooks directories and included files found so far, relative to the tree.
    fn code_inside(&self) -> Vec<PathBuf> {
        let inside = self.code.iter().filter_map(|c| c.strip_prefix(self.root).ok());
        inside.filter(|rel| !rel.as_os_str().is_empty()).map(Path::to_path_buf).collect()
    }

    /// Every path the host executes in the tree, by the list and as a
    /// change set's capture judges it.
    fn tree(&mut self) {
        let mut dirs = vec![PathBuf::new()];
        while let Some(dir) = dirs.pop() {
            let names = self.files.list_dir(&self.root.join(&dir));
            let beside_head = names.iter().any(|n| n == "HEAD");
            if beside_head && !dir.as_os_str().is_empty() {
                // A bare repository: its hooks and configuration are its own.
                self.repo(self.root.join(&dir), self.root.join(&dir));
            }
            let hooks = self.code_inside();
            for name in names {
                let rel = dir.join(&name);
                let full = self.root.join(&rel);
                let Ok(st) = self.files.lstat(&full) else { continue };
                let is_dir = st.is_dir();
                if name == ".git" {
                    match is_dir {
                        true => self.repo(full.clone(), self.root.join(&dir)),
                        false => self.gitfile(&full, &dir),
                    }
                }
                let whole = is_dir && (name == ".git" || self.he.holds_whole(self.root, &rel));
                if whole || self.he.check(self.root, &rel, is_dir, beside_head, &hooks) != Check::Apply {
                    self.found.insert(full);
                } else if is_dir {
                    dirs.push(rel);
                }
            }
        }
    }

    /// A `.git` file in `dir`: the git directory it names is a repository
    /// of the work tree `dir`.
    fn gitfile(&mut self, file: &Path, dir: &Path) {
        let Some(text) = self.files.read_head(file, 4096) else { return };
        let text = String::from_utf8_lossy(&text);
        let Some(target) = text.lines().next().and_then(|l| l.strip_prefix("gitdir: ")) else { return };
        let git_dir = normal(&file.parent().unwrap_or(Path::new("/")).join(target.trim()));
        if git_dir.starts_with(self.root) && self.files.lstat(&git_dir).is_ok() {
            self.found.insert(git_dir.clone());
        }
        self.repo(git_dir, self.root.join(dir));
    }

    /// The code paths found in configurations that exist in the tree.
    fn code_found(&mut self) {
        for code in self.code.clone() {
            if code.starts_with(self.root) && code != self.root && self.files.lstat(&code).is_ok() {
                self.found.insert(code);
            }
        }
    }

    /// The mounts, checked: nothing inside another of them, no link on
    /// the way, no file with another name, every name UTF-8.
    fn finish(self, max: usize) -> Result<InPlace, InTree> {
        let inside_another = |p: &PathBuf| self.found.iter().any(|o| o != p && p.starts_with(o));
        let found: Vec<PathBuf> = self.found.iter().filter(|p| !inside_another(p)).cloned().collect();
        let mut pinned = BTreeSet::new();
        for path in &found {
            let mut at = path.parent();
            while let Some(dir) = at.filter(|d| d.starts_with(self.root) && *d != self.root) {
                pinned.insert(dir.to_path_buf());
                at = dir.parent();
            }
        }
        if found.len() + pinned.len() > max {
            return Err(InTree::TooMany(max));
        }
        for path in found.iter().chain(&pinned) {
            let st = self.files.lstat(path).map_err(|_| InTree::Link(path.clone()))?;
            if st.kind == FileKind::Symlink {
                return Err(InTree::Link(path.clone()));
            }
            if path.to_str().is_none() {
                return Err(InTree::Name(path.clone()));
            }
        }
        for path in &found {
            self.no_other_names(path)?;
        }
        let code = self.code.iter().filter(|c| c.starts_with(self.root)).cloned().collect();
        Ok(InPlace { read_only: found, pinned: pinned.into_iter().collect(), code })
    }

    /// `path` (a file, or a directory and what it holds but a repository's
    /// objects, which are data) has no file with another name.
    fn no_other_names(&self, path: &Path) -> Result<(), InTree> {
        let mut stack = vec![path.to_path_buf()];
        while let Some(p) = stack.pop() {
            let Ok(st) = self.files.lstat(&p) else { continue };
            match st.kind {
                FileKind::Dir => {
                    let repo = self.files.lstat(&p.join("HEAD")).is_ok();
                    let data = |n: &std::ffi::OsString| repo && (n == "objects" || n == "lfs");
                    stack.extend(self.files.list_dir(&p).into_iter().filter(|n| !data(n)).map(|n| p.join(n)));
                }
                FileKind::File if st.nlink > 1 => return Err(InTree::Linked(p)),
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_names_its_hooks_directory_and_includes_in_every_form() {
        let (dir, worktree, home) = (Path::new("/w/.git"), Path::new("/w"), Path::new("/home/u"));
        let config = "[core]\n\thooksPath = ./.githooks/../hooks\n[include]\n\tpath = ../shared.gitconfig\n\
                      [includeIf \"gitdir:/w/\"]\n\tpath = ~/extra.gitconfig\n[user]\n\tname = x\n";
        let got = git_code_paths(config, dir, worktree, Some(home));
        assert_eq!(
            got,
            [
                (PathBuf::from("/w/hooks"), false),
                (PathBuf::from("/w/shared.gitconfig"), true),
                (PathBuf::from("/home/u/extra.gitconfig"), true)
            ]
        );
        // Absolute, and `~/` with no home known (named nowhere).
        let got =
            git_code_paths("[core]\n\thooksPath = /w/h\n[include]\n\tpath = ~/x\n", dir, worktree, None);
        assert_eq!(got, [(PathBuf::from("/w/h"), false)]);
        assert_eq!(normal(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
    }
}
