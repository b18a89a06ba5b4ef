//! The plan-to-Windows translation: job limits of decided runs, command
//! lines split back as Windows splits them, environment blocks.

use super::{CommandError, JobLimits, check_program, command_line, environment_block, job_limits};
use crate::config::Config;
use crate::decision::table::{Fixture, On, context};
use crate::decision::{Decision, Policy, Resolved};
use palisade_protocol::wire::RunRequest;
use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn allowed(tag: &str, request: impl FnOnce(&Fixture) -> RunRequest) -> Resolved {
    let f = Fixture::new(tag);
    std::fs::create_dir_all(f.root.join("proj")).unwrap();
    let config = Config::parse("", Path::new("windows.toml")).unwrap();
    let host = f.host(On::Seatbelt);
    match Policy::new(config, &*host.files).decide(&host, &context(On::Seatbelt), &request(&f)) {
        Decision::Allow(r) => *r,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_runs_limits_become_the_jobs() {
    let r = allowed("windows-limits", |f| {
        let mut r = f.request_in("proj", &["ls"]);
        (r.max_memory_mb, r.max_processes) = (Some(64), Some(8));
        r
    });
    let limits = job_limits(&r);
    let rl = &r.plan.rlimits;
    assert_eq!(
        limits,
        JobLimits {
            active_processes: 8,
            process_memory: Some(rl.data.hard),
            job_memory: Some(64 * MIB),
            process_cpu: Some(Duration::from_secs(rl.cpu_seconds.hard)),
        }
    );
    assert_eq!(rl.processes.hard, 8, "the process count is the plan's RLIMIT_NPROC");
    assert!(rl.data.hard <= 64 * MIB, "each process within the run's memory: {}", rl.data.hard);
}

#[test]
fn a_run_that_may_not_fork_is_one_process() {
    let r = allowed("windows-nofork", |f| {
        let mut r = f.request_in("proj", &["ls"]);
        r.no_fork = true;
        r
    });
    assert!(r.capabilities.process.no_fork);
    assert_eq!(job_limits(&r).active_processes, 1);
    let mut forking = r.clone();
    forking.capabilities.process.no_fork = false;
    assert!(job_limits(&forking).active_processes > 1);
}

#[test]
fn unlimited_rlimits_are_no_job_limit() {
    let mut r = allowed("windows-unlimited", |f| f.request_in("proj", &["ls"]));
    r.plan.rlimits.data.hard = u64::MAX;
    r.plan.rlimits.cpu_seconds.hard = u64::MAX;
    r.plan.rlimits.processes.hard = u64::MAX;
    r.capabilities.process.max_memory_mb = 0;
    let limits = job_limits(&r);
    assert_eq!((limits.process_memory, limits.job_memory, limits.process_cpu), (None, None, None));
    assert_eq!(limits.active_processes, u32::MAX);
}

/// How the Microsoft C runtime splits a command line into arguments (the
/// rules of `CommandLineToArgvW`): the first read to the next space, or
/// when quoted to the next quote, with no escapes; then each other.
fn split(line: &str) -> Vec<String> {
    let mut chars = line.chars().peekable();
    let argv0: String = if chars.peek() == Some(&'"') {
        chars.next();
        chars.by_ref().take_while(|c| *c != '"').collect()
    } else {
        chars.by_ref().take_while(|c| *c != ' ' && *c != '\t').collect()
    };
    let mut args = vec![argv0];
    loop {
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
        if chars.peek().is_none() {
            return args;
        }
        let (mut arg, mut quoted, mut backslashes) = (String::new(), false, 0usize);
        while let Some(&c) = chars.peek() {
            match c {
                '\\' => backslashes += 1,
                '"' => {
                    arg.extend(std::iter::repeat_n('\\', backslashes / 2));
                    if backslashes % 2 == 1 {
                        arg.push('"');
                    } else if quoted && chars.clone().nth(1) == Some('"') {
                        arg.push('"');
                        chars.next();
                    } else {
                        quoted = !quoted;
                    }
                    backslashes = 0;
                }
                ' ' | '\t' if !quoted => break,
                _ => {
                    arg.extend(std::iter::repeat_n('\\', backslashes));
                    arg.push(c);
                    backslashes = 0;
                }
            }
            chars.next();
        }
        arg.extend(std::iter::repeat_n('\\', backslashes));
        args.push(arg);
    }
}

#[test]
fn command_lines_split_back_into_their_arguments() {
    let cases: &[&[&str]] = &[
        &["prog", "a b", "", "plain"],
        &["prog", "a\"b", "\"", "\\\"", "a\\\\\"b"],
        &["C:\\Program Files\\x.exe", "C:\\dir with space\\", "C:\\dir\\", "\\\\server\\share"],
        &["prog", "tab\there", "new\nline", "trailing\\\\", "é ü"],
        // The program's name is read without escapes: a backslash before its closing quote stays one.
        &["C:\\odd dir\\", "x"],
        &["C:\\a\\b.exe"],
    ];
    for argv in cases {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let line = command_line(&argv).unwrap();
        assert_eq!(split(&line), argv, "{line}");
    }
    let plain = command_line(&["prog".into(), "a\\b".into(), "x".into()]).unwrap();
    assert_eq!(plain, "\"prog\" a\\b x", "an argument without spaces or quotes is left as it is");
    assert_eq!(command_line(&["p".into(), "d\\".into(), "e f\\".into()]).unwrap(), "\"p\" d\\ \"e f\\\\\"");
}

#[test]
fn commands_windows_cannot_take_are_refused() {
    assert_eq!(command_line(&[]), Err(CommandError::Empty));
    // A quote in the program's name would turn the rest of the line's quoting around.
    assert!(matches!(command_line(&["C:\\a\" b".into(), "c".into()]), Err(CommandError::Argv0(_))));
    let same_but_case = [("Path".to_string(), "a".to_string()), ("PATH".into(), "b".into())];
    assert!(matches!(environment_block(&same_but_case), Err(CommandError::Duplicate(..))));
    assert!(matches!(command_line(&["a\0b".into()]), Err(CommandError::Nul(_))));
    assert!(matches!(environment_block(&[("A=B".into(), "x".into())]), Err(CommandError::Name(_))));
    assert!(matches!(environment_block(&[(String::new(), "x".into())]), Err(CommandError::Name(_))));
    assert!(matches!(environment_block(&[("A".into(), "x\0".into())]), Err(CommandError::Nul(_))));
}

#[test]
fn the_environment_block_is_sorted_and_ends_with_two_nuls() {
    let env = [
        ("path".to_string(), "C:\\bin".to_string()),
        ("HOME".into(), "h".into()),
        ("=C:".into(), "C:\\".into()),
    ];
    let block = environment_block(&env).unwrap();
    let text = String::from_utf16(&block).unwrap();
    assert_eq!(text, "=C:=C:\\\0HOME=h\0path=C:\\bin\0\0");
    assert_eq!(String::from_utf16(&environment_block(&[]).unwrap()).unwrap(), "\0\0");
}

#[test]
fn only_absolute_programs_that_are_not_batch_files_are_started() {
    for ok in ["C:\\Windows\\System32\\cmd.exe", "c:/tools/git.exe", "\\\\server\\share\\x.exe", "C:\\a.cmdx"]
    {
        assert_eq!(check_program(ok), Ok(()), "{ok}");
    }
    for relative in ["git.exe", "tools\\git.exe", "\\git.exe", "C:git.exe", ""] {
        assert!(matches!(check_program(relative), Err(CommandError::Relative(_))), "{relative}");
    }
    // What Windows would normalize into another name before deciding what it runs.
    for odd in [
        "C:\\x\\run.bat\\.",
        "c:/x/run.bat/.",
        "C:\\x\\run.bat\\y\\..",
        "C:\\",
        "C:\\x\\",
        "\\\\?\\C:\\x.exe",
        "\\\\.\\C:\\x.exe",
    ] {
        assert!(matches!(check_program(odd), Err(CommandError::NotPlain(_))), "{odd}");
    }
    for batch in ["C:\\x\\build.bat", "C:\\x\\BUILD.CMD", "C:\\x\\run.bat. . ", "C:\\x\\a.Cmd"] {
        assert!(matches!(check_program(batch), Err(CommandError::Batch(_))), "{batch}");
    }
    assert!(matches!(check_program("C:\\a\0.exe"), Err(CommandError::Nul(_))));
}

#[test]
fn names_are_ascii_sorted_without_regard_to_case() {
    let env = [("b".to_string(), "2".to_string()), ("A_b".into(), "1".into()), ("_".into(), "3".into())];
    let text = String::from_utf16(&environment_block(&env).unwrap()).unwrap();
    // `_` (0x5F) sorts after the upper-case letters, as Windows sorts it, not before `b` as lower case.
    assert_eq!(text, "A_b=1\0b=2\0_=3\0\0");
    for name in ["é", "aé", "ſ"] {
        assert!(
            matches!(environment_block(&[(name.into(), "x".into())]), Err(CommandError::Name(_))),
            "{name}"
        );
    }
}
