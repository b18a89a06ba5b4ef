//! `palisade run` in its common forms, read without clap: building clap's
//! parser is a good part of a short run's start (see bench/README.md).

use crate::args::{RunArgs, SandboxArgs};
use crate::{Cli, Command};
use std::path::PathBuf;

/// `palisade run` in its common forms, read without clap: building clap's
/// parser is a good part of a short run's start (its code and allocations
/// fault in pages that nothing else touches). Anything else, a help request,
/// a repeated or unknown option, a malformed value, is `None`: clap parses
/// it, and explains what is wrong. Gives what clap would.
pub fn parse_common_run(args: &[std::ffi::OsString]) -> Option<Cli> {
    let args: Vec<&str> = args.iter().map(|a| a.to_str()).collect::<Option<_>>()?;
    let (&"run", rest) = args.get(1..)?.split_first()? else { return None };
    let split = rest.iter().position(|a| *a == "--")?;
    let (options, command) = (&rest[..split], &rest[split + 1..]);
    if command.is_empty() {
        return None;
    }
    let mut run = RunArgs {
        socket: None,
        workspace: None,
        policy: None,
        timeout: None,
        max_output: None,
        json: false,
        no_stdin: false,
        tty: false,
        no_tty: false,
        tool: None,
        params: vec![],
        sandbox: SandboxArgs::default(),
        command: command.iter().map(|c| c.to_string()).collect(),
    };
    let mut i = 0;
    while i < options.len() {
        let (name, inline) = match options[i].split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v)),
            _ => (options[i], None),
        };
        let flag = |set: &mut bool| (!std::mem::replace(set, true) && inline.is_none()).then_some(());
        match name {
            "-n" | "--no-stdin" => flag(&mut run.no_stdin)?,
            "-t" | "--tty" if !run.no_tty => flag(&mut run.tty)?,
            "-T" | "--no-tty" if !run.tty => flag(&mut run.no_tty)?,
            "--json" => flag(&mut run.json)?,
            "--socket" | "--workspace" | "--timeout" | "--max-output" => {
                let value = match inline {
                    Some(v) => v,
                    None => {
                        i += 1;
                        options.get(i).copied()?
                    }
                };
                // A value that looks like an option is clap's to judge.
                if value.is_empty() || value.starts_with('-') {
                    return None;
                }
                let path = Some(PathBuf::from(value));
                match name {
                    "--socket" if run.socket.is_none() => run.socket = path,
                    "--workspace" if run.workspace.is_none() => run.workspace = path,
                    "--timeout" if run.timeout.is_none() => run.timeout = Some(value.parse().ok()?),
                    "--max-output" if run.max_output.is_none() => run.max_output = Some(value.parse().ok()?),
                    _ => return None,
                }
            }
            _ => return None,
        }
        i += 1;
    }
    Some(Cli { command: Command::Run(run) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn argv(words: &[&str]) -> Vec<std::ffi::OsString> {
        std::iter::once("palisade").chain(words.iter().copied()).map(Into::into).collect()
    }

    /// Every sequence of up to four of these words before `-- cmd`: whenever
    /// the common form is recognized, clap reads the same; common forms are.
    #[test]
    fn the_common_run_forms_read_as_clap_reads_them() {
        let words = [
            "-n",
            "--no-stdin",
            "--json",
            "--json=1",
            "--socket",
            "/s",
            "--socket=/s",
            "--socket=",
            "--workspace",
            "w",
            "--timeout",
            "5",
            "--timeout=x",
            "--max-output",
            "-1",
            "10",
            "-h",
            "--tool",
            "t",
            "run",
            "--",
        ];
        let mut sequences: Vec<Vec<&str>> = vec![vec![]];
        for _ in 0..4 {
            let longer: Vec<Vec<&str>> = sequences
                .iter()
                .filter(|s| s.len() == sequences.last().map_or(0, Vec::len))
                .flat_map(|s| words.iter().map(move |w| [s.clone(), vec![*w]].concat()))
                .collect();
            sequences.extend(longer);
        }
        let mut recognized = 0;
        for options in &sequences {
            for command in [&["cmd", "--json"][..], &[][..]] {
                let line: Vec<&str> =
                    ["run"].iter().chain(options).chain(&["--"]).chain(command).copied().collect();
                let args = argv(&line);
                if let Some(fast) = parse_common_run(&args) {
                    recognized += 1;
                    let clap =
                        Cli::try_parse_from(&args).map(|c| format!("{c:?}")).map_err(|e| e.to_string());
                    assert_eq!(Ok(format!("{fast:?}")), clap, "{line:?}");
                }
            }
        }
        assert!(recognized > 1000, "only {recognized} forms recognized");
        for common in [
            &["run", "--", "true"][..],
            &["run", "-n", "--socket", "/run/p.sock", "--", "ls", "-la"],
            &["run", "--json", "--timeout=30", "--max-output", "1000", "--workspace", "ws", "--", "make"],
        ] {
            assert!(parse_common_run(&argv(common)).is_some(), "{common:?}");
        }
        for other in [
            &["run", "--help"][..],
            &["run", "--policy", "p.toml", "--", "true"],
            &["run", "--tool", "t", "--", "true"],
            &["run", "true"],
            &["run", "--"],
            &["explain", "--", "true"],
            &["--version"],
        ] {
            assert!(parse_common_run(&argv(other)).is_none(), "{other:?}");
        }
    }
}
