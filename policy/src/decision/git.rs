//! The requester's git identity for a run: the sandbox's home is the
//! workspace, so the requester's `~/.gitconfig` is not there and `git
//! commit` would fail ("Author identity unknown"). Two keys are read, in
//! plain `[user]` sections of the global configuration: `user.name` and
//! `user.email`. No `include` is followed and nothing else is taken (a
//! credential helper, a signing key, a URL rewrite): the run gets the
//! identity as git's own variables, which a request's `--env` overrides.

use crate::host::HostFiles;
use std::path::Path;

/// The most of a configuration file read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;
/// The longest name or address taken.
const MAX_VALUE_BYTES: usize = 256;

/// The variables that give a run the identity of the git configuration
/// under `home` (`$XDG_CONFIG_HOME/git/config`, `xdg` or `~/.config`, then
/// `~/.gitconfig`, which wins, as git reads them), read with the
/// requester's credentials: `GIT_AUTHOR_*` and `GIT_COMMITTER_*`.
pub(super) fn identity(files: &dyn HostFiles, home: &Path, xdg: Option<&Path>) -> Vec<(String, String)> {
    let xdg = xdg.map_or_else(|| home.join(".config"), Path::to_path_buf);
    let (mut name, mut email) = (None, None);
    for file in [xdg.join("git/config"), home.join(".gitconfig")] {
        let Some(text) = files.read_head(&file, MAX_CONFIG_BYTES) else { continue };
        let (n, e) = user(&String::from_utf8_lossy(&text));
        name = n.or(name);
        email = e.or(email);
    }
    let mut vars = Vec::new();
    for (value, who) in [(name, "NAME"), (email, "EMAIL")] {
        if let Some(v) = value {
            vars.push((format!("GIT_AUTHOR_{who}"), v.clone()));
            vars.push((format!("GIT_COMMITTER_{who}"), v));
        }
    }
    vars
}

/// Adds the requester's identity to a run's `env` (see [`identity`]): the
/// configuration under the request's `HOME`; a variable `env` has already
/// (passed by the request) stays.
pub(super) fn add_identity(
    env: &mut Vec<(String, String)>,
    files: &dyn HostFiles,
    req_env: &std::collections::BTreeMap<String, String>,
) {
    let Some(home) = req_env.get("HOME").map(Path::new).filter(|h| h.is_absolute()) else { return };
    let xdg = req_env.get("XDG_CONFIG_HOME").map(Path::new).filter(|x| x.is_absolute());
    for (key, value) in identity(files, home, xdg) {
        if !env.iter().any(|(k, _)| *k == key) {
            env.push((key, value));
        }
    }
}

/// `user.name` and `user.email` of a git configuration's text: the last of
/// each in a `[user]` section (no subsection), unquoted; a value with a
/// control character, or too long, is not taken.
fn user(text: &str) -> (Option<String>, Option<String>) {
    let (mut in_user, mut name, mut email) = (false, None, None);
    for line in text.lines().map(str::trim) {
        if let Some(section) = line.strip_prefix('[') {
            let header = section.split(']').next().unwrap_or("").trim();
            in_user = header.eq_ignore_ascii_case("user");
            continue;
        }
        let Some((key, value)) = line.split_once('=').filter(|_| in_user) else { continue };
        let value = value.trim();
        let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
        if value.is_empty() || value.len() > MAX_VALUE_BYTES || value.chars().any(char::is_control) {
            continue;
        }
        match key.trim().to_ascii_lowercase().as_str() {
            "name" => name = Some(value.to_string()),
            "email" => email = Some(value.to_string()),
            _ => {}
        }
    }
    (name, email)
}

#[cfg(test)]
mod tests {
    use super::user;

    #[test]
    fn only_the_user_sections_name_and_email_are_taken() {
        let text = "[core]\n\tname = not-this\n[user]\n\tname = Ada Lovelace\n\temail = \"ada@example.org\"\n\
                    [credential]\n\thelper = store\n[include]\n\tpath = ~/.other\n\
                    [user \"work\"]\n\temail = work@example.org\n[User]\n  Name=Ada L.\n\tsigningkey = ABC\n";
        assert_eq!(user(text), (Some("Ada L.".into()), Some("ada@example.org".into())));
        assert_eq!(user("[credential]\nhelper = store\n"), (None, None));
        let control = "[user]\nname = a\u{7}b\nemail = x@y\n";
        assert_eq!(user(control), (None, Some("x@y".into())));
    }
}
