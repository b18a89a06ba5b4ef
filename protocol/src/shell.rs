//! A session's shell: commands given as shell lines whose working
//! directory and exported variables persist from one to the next, as in
//! an agent's shell tool (docs/protocol.md, "Sessions"). Each line is an
//! ordinary command of the session, `/bin/sh -c SCRIPT palisade-shell
//! LINE`, decided by the policy as any `sh -c` (it needs
//! `allow_interpreters` and `allow_inline_code`), with its own result; the
//! state lives in the session's own `/tmp`, which its commands share, and
//! ends with it. What lives only in a shell's process (functions,
//! aliases, variables not exported, options) does not persist.

/// The script that runs a line: it restores the state the previous line
/// left (the exported variables exactly: what that line unset is unset),
/// runs the line with `eval`, and saves the state as the line exits (its
/// exit status is the line's). A line killed (its deadline, a cancel)
/// saves nothing.
pub const SCRIPT: &str = r#"__p=/tmp/.palisade-shell
if [ -f "$__p.env" ]; then
  while IFS= read -r __l; do case $__l in "export "*) __l=${__l#export }; unset "${__l%%=*}" 2>/dev/null;; esac; done <<__PALISADE__
$(export -p)
__PALISADE__
  . "$__p.env"
fi
if [ -f "$__p.cwd" ]; then IFS= read -r __l < "$__p.cwd" && cd "$__l" 2>/dev/null; fi
unset __l
trap 'pwd > "$__p.cwd"; export -p > "$__p.env"' EXIT
eval "$1""#;

/// The command that runs `line` in the session's shell.
pub fn argv(line: &str) -> Vec<String> {
    ["/bin/sh", "-c", SCRIPT, "palisade-shell", line].map(String::from).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `line` as a session would, with the state in `/tmp` (as the
    /// session's own `/tmp` holds it).
    fn line(line: &str) -> (i32, String) {
        let argv = argv(line);
        let out = std::process::Command::new(&argv[0]).args(&argv[1..]).env("DROPPED", "1").output().unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    #[cfg(unix)]
    fn the_directory_and_the_exported_variables_persist() {
        // This test's own state: the script's path in /tmp is fixed, so
        // nothing else here runs it.
        let _ = std::fs::remove_file("/tmp/.palisade-shell.env");
        let _ = std::fs::remove_file("/tmp/.palisade-shell.cwd");
        assert_eq!(line("cd /usr && export KEPT='a b' && unset DROPPED; LOCAL=1; exit 3").0, 3);
        let (code, out) = line("pwd; echo \"[$KEPT] [${DROPPED-unset}] [${LOCAL-unset}]\"");
        assert_eq!((code, out.as_str()), (0, "/usr\n[a b] [unset] [unset]\n"));
        let _ = std::fs::remove_file("/tmp/.palisade-shell.env");
        let _ = std::fs::remove_file("/tmp/.palisade-shell.cwd");
        // Counter-test: without the state, a fresh shell.
        let (_, out) = line("pwd; echo \"[${KEPT-unset}] [$DROPPED]\"");
        assert_ne!(out, "/usr\n[a b] [unset]\n", "{out}");
        let _ = std::fs::remove_file("/tmp/.palisade-shell.env");
        let _ = std::fs::remove_file("/tmp/.palisade-shell.cwd");
    }
}
