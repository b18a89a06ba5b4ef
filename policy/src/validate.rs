//! The validation pipeline: checks a request passes before anything is
//! spawned. Each refusal carries a stable error kind and a stable rule name.
//!
//! These checks make refusals early and explicit; they are not the boundary.
//! A program can compute a path or a host the checks never saw, and a path can
//! change between the check and the run: the kernel-side rules (mount
//! namespace, Landlock, seccomp) hold regardless.

use crate::config::PolicyConfig;
use crate::decision::{Denial, SANDBOX_PATH};
use crate::paths;
use globset::{Glob, GlobSet, GlobSetBuilder};
use palisade_protocol::wire::ErrorKind;
use regex::Regex;
use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Shells and language runtimes: given code, they run anything.
pub const INTERPRETERS: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "fish",
    "ksh",
    "ksh93",
    "mksh",
    "ash",
    "csh",
    "tcsh",
    "yash",
    "busybox",
    "python",
    "python[0-9]*",
    "pypy*",
    "node",
    "nodejs",
    "deno",
    "bun",
    "perl",
    "perl5*",
    "ruby*",
    "irb",
    "php",
    "php[0-9]*",
    "lua",
    "lua[0-9]*",
    "luajit",
    "pwsh",
    "powershell",
    "osascript",
    "tclsh*",
    "wish*",
    "expect",
    "Rscript",
    "R",
    "julia",
    "guile*",
];

/// Programs that run another program given in their arguments.
const LAUNCHERS: &[(&str, &str, usize)] = &[
    // (name, short options that take a value, positional operands before the command)
    ("env", "uCS", 0),
    ("nice", "n", 0),
    ("nohup", "", 0),
    ("timeout", "ks", 1),
    ("stdbuf", "ioe", 0),
    ("setsid", "", 0),
    ("time", "fo", 0),
    ("ionice", "cnp", 0),
    ("chrt", "", 1),
    ("taskset", "", 1),
    ("xargs", "aEdeIiLlnPs", 0),
    ("flock", "wEc", 1),
    ("unbuffer", "", 0),
];

/// Names (globs) of paths that are refused even inside an allowed root.
pub const SENSITIVE_PATHS: &[&str] = &[
    "**/.ssh",
    "**/.ssh/**",
    "**/.gnupg",
    "**/.gnupg/**",
    "**/.aws",
    "**/.aws/**",
    "**/.kube",
    "**/.kube/**",
    "**/.config/gcloud",
    "**/.config/gcloud/**",
    "**/.docker",
    "**/.docker/**",
    "**/.password-store",
    "**/.password-store/**",
    "**/.netrc",
    "**/.git-credentials",
    "**/.pypirc",
    "**/.vault-token",
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/sudoers.d/**",
    "/etc/ssh/ssh_host_*_key",
    "/etc/security/opasswd",
    "/proc/kcore",
    "/dev/mem",
];

/// The sensitive names a workspace root may hold directly (masked in Tier C,
/// refused in Tier B).
pub const SENSITIVE_NAMES: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".kube",
    ".config/gcloud",
    ".docker",
    ".password-store",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".vault-token",
];

/// Command lines refused outright (matched against the arguments joined by spaces).
const BLOCKED_PATTERNS: &[(&str, &str)] = &[
    (r"(^|[\s;&|(])(sudo|doas|pkexec|run0)(\s|$)", "privilege escalation (sudo)"),
    (r"(^|[\s;&|(])su(\s+-)?(\s+\S+)?\s*$", "privilege escalation (su)"),
    (r":\s*\(\s*\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:", "a fork bomb"),
    (r"(^|[\s;&|(/])mkfs(\.\w+)?(\s|$)", "formatting a filesystem (mkfs)"),
    (r"(^|[\s;&|(/])dd\s.*\bof=/dev/", "dd to a device"),
    (r">\s*/dev/(sd|hd|vd|xvd|nvme|mmcblk)", "overwriting a disk"),
    (r"(^|[\s;&|(])rm\s+(-\S+\s+)*(/|/\*)(\s|$)", "rm of /"),
    (r"--no-preserve-root", "rm --no-preserve-root"),
    (r"chmod\s+(-\S+\s+)*0?777\s+/(\s|$)", "chmod 777 /"),
];

/// Compiled rules, built once per configuration.
#[derive(Debug)]
pub struct Rules {
    interpreters: GlobSet,
    interpreter_files: HashMap<(u64, u64), String>,
    interpreter_sizes: HashMap<u64, Vec<PathBuf>>,
    sensitive_absolute: GlobSet,
    sensitive_extra: Vec<String>,
    blocked: Vec<(Regex, String)>,
}

fn globset(patterns: impl IntoIterator<Item = String>) -> GlobSet {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        if let Ok(g) = Glob::new(&p) {
            b.add(g);
        }
    }
    b.build().unwrap_or_else(|_| GlobSet::empty())
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

impl Rules {
    /// Patterns were checked when the configuration was parsed.
    pub fn new(policy: &PolicyConfig) -> Rules {
        let interpreters = globset(
            INTERPRETERS
                .iter()
                .map(|s| s.to_string())
                .chain(policy.interpreters.iter().map(|s| s.get_ref().clone())),
        );
        // Every interpreter binary installed in the system PATH, by inode (a
        // hard link or symlink under another name is still the interpreter)
        // and by size (a renamed copy is compared byte for byte).
        let mut interpreter_files = HashMap::new();
        let mut interpreter_sizes: HashMap<u64, Vec<PathBuf>> = HashMap::new();
        for dir in SANDBOX_PATH.split(':') {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !interpreters.is_match(&name) {
                    continue;
                }
                if let Ok(m) = std::fs::metadata(e.path()) {
                    if m.is_file() {
                        interpreter_files.insert((m.dev(), m.ino()), name);
                        let list = interpreter_sizes.entry(m.len()).or_default();
                        if let Ok(p) = e.path().canonicalize() {
                            if !list.contains(&p) {
                                list.push(p);
                            }
                        }
                    }
                }
            }
        }
        let blocked = BLOCKED_PATTERNS
            .iter()
            .map(|(p, what)| (p.to_string(), what.to_string()))
            .chain(
                policy
                    .blocked_patterns
                    .iter()
                    .map(|p| (p.get_ref().clone(), format!("the configured pattern {:?}", p.get_ref()))),
            )
            .filter_map(|(p, what)| Regex::new(&p).ok().map(|r| (r, what)))
            .collect();
        Rules {
            interpreters,
            interpreter_files,
            interpreter_sizes,
            sensitive_absolute: globset(SENSITIVE_PATHS.iter().map(|s| s.to_string())),
            sensitive_extra: policy.sensitive_paths.iter().map(|s| s.get_ref().clone()).collect(),
            blocked,
        }
    }

    /// The interpreter `path` is (by name, inode or content), if any.
    pub fn interpreter(&self, path: &Path, argv0: &str) -> Option<String> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if self.interpreters.is_match(&name) {
            return Some(name);
        }
        if self.interpreters.is_match(basename(argv0)) {
            return Some(basename(argv0).to_string());
        }
        let m = std::fs::metadata(path).ok()?;
        if let Some(n) = self.interpreter_files.get(&(m.dev(), m.ino())) {
            return Some(n.clone());
        }
        let candidates = self.interpreter_sizes.get(&m.len())?;
        let content = read_regular(path, m.len())?;
        candidates
            .iter()
            .find(|known| read_regular(known, m.len()).as_ref() == Some(&content))
            .and_then(|known| known.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    /// The absolute sensitive patterns, built-in and configured (`~/` taken
    /// from `home`): what a granted directory must not expose.
    pub fn absolute_sensitive(&self, home: Option<&Path>) -> Vec<String> {
        let extra = self.sensitive_extra.iter().filter_map(|p| match (p.strip_prefix("~/"), home) {
            (Some(rest), Some(h)) => Some(h.join(rest).to_string_lossy().into_owned()),
            (Some(_), None) => None,
            _ => Some(p.clone()),
        });
        SENSITIVE_PATHS
            .iter()
            .map(|s| s.to_string())
            .chain(extra)
            .filter(|p| p.starts_with('/') && !p.starts_with("/proc/") && !p.starts_with("/dev/"))
            .collect()
    }

    /// Whether a resolved path is sensitive. `home` expands `~/` in the
    /// configured patterns.
    pub fn sensitive(&self, path: &Path, home: Option<&Path>) -> bool {
        if self.sensitive_absolute.is_match(path) {
            return true;
        }
        let extra = self.sensitive_extra.iter().map(|p| match (p.strip_prefix("~/"), home) {
            (Some(rest), Some(h)) => h.join(rest).to_string_lossy().into_owned(),
            _ => p.clone(),
        });
        globset(extra).is_match(path)
    }
}

fn deny(kind: ErrorKind, rule: &'static str, reason: String) -> Denial {
    Denial { kind, rule, reason }
}

/// Command length, argument count and size, environment size, NUL bytes.
pub fn check_shape(policy: &PolicyConfig, argv: &[String], env: &[(String, String)]) -> Result<(), Denial> {
    let Some(command) = argv.first() else {
        return Err(deny(ErrorKind::InvalidRequest, "limits.empty_command", "empty command".into()));
    };
    let nul = argv.iter().chain(env.iter().flat_map(|(k, v)| [k, v])).find(|s| s.contains('\0'));
    if let Some(s) = nul {
        let shown: String = s.chars().take(40).collect::<String>().replace('\0', "\\0");
        return Err(deny(ErrorKind::InvalidRequest, "limits.nul_byte", format!("NUL byte in {shown:?}")));
    }
    if command.len() > policy.max_command_bytes {
        return Err(deny(
            ErrorKind::InvalidRequest,
            "limits.command_bytes",
            format!("the command is {} bytes; the limit is {}", command.len(), policy.max_command_bytes),
        ));
    }
    if argv.len() - 1 > policy.max_arguments {
        return Err(deny(
            ErrorKind::InvalidRequest,
            "limits.arguments",
            format!("{} arguments; the limit is {}", argv.len() - 1, policy.max_arguments),
        ));
    }
    if let Some((i, a)) = argv.iter().enumerate().skip(1).find(|(_, a)| a.len() > policy.max_argument_bytes) {
        return Err(deny(
            ErrorKind::InvalidRequest,
            "limits.argument_bytes",
            format!("argument {i} is {} bytes; the limit is {}", a.len(), policy.max_argument_bytes),
        ));
    }
    if env.len() > policy.max_env_vars {
        return Err(deny(
            ErrorKind::InvalidRequest,
            "limits.env_vars",
            format!("{} environment variables; the limit is {}", env.len(), policy.max_env_vars),
        ));
    }
    Ok(())
}

fn is_executable(p: &Path) -> bool {
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A bare name is looked up in the sandbox's PATH; a path must be absolute.
/// The result is canonical (symlinks resolved).
pub fn resolve_executable(name: &str) -> Result<PathBuf, String> {
    let found = if name.starts_with('/') {
        Some(PathBuf::from(name))
    } else if name.contains('/') {
        return Err(format!("{name}: a relative path; name a program or give an absolute path"));
    } else {
        SANDBOX_PATH.split(':').map(|d| Path::new(d).join(name)).find(|p| is_executable(p))
    };
    let path = found.ok_or_else(|| format!("{name}: not found in {SANDBOX_PATH}"))?;
    let canonical = path.canonicalize().map_err(|e| format!("{}: {e}", path.display()))?;
    if !is_executable(&canonical) {
        return Err(format!("{} is not an executable file", canonical.display()));
    }
    Ok(canonical)
}

/// The executable allow-list, when the profile has one.
pub fn check_allowed(program: &Path, allowed: &[PathBuf]) -> Result<(), Denial> {
    if allowed.is_empty() || allowed.iter().any(|a| a == program) {
        return Ok(());
    }
    Err(deny(
        ErrorKind::PolicyDenied,
        "executables.not_allowed",
        format!("{} is not on the executable allow-list", program.display()),
    ))
}

/// The command a launcher (env, nice, timeout, ...) would run, and its arguments.
fn through_launchers(argv: &[String]) -> (String, Vec<String>) {
    let mut argv: Vec<String> = argv.to_vec();
    for _ in 0..8 {
        let name = basename(&argv[0]).to_string();
        let args: &[String] = if name == "busybox" {
            &argv[1..]
        } else if let Some((_, value_flags, operands)) = LAUNCHERS.iter().find(|(n, _, _)| *n == name) {
            let mut i = 1;
            let mut skipped_operands = 0;
            let mut split: Option<Vec<String>> = None;
            while i < argv.len() {
                let a = &argv[i];
                if name == "env" && (a == "-S" || a.starts_with("--split-string")) {
                    // env -S 'python3 -c ...': the string is the command line.
                    let s = if a == "-S" {
                        argv.get(i + 1).cloned()
                    } else {
                        a.split_once('=').map(|(_, v)| v.to_string())
                    };
                    split = s.map(|s| s.split_whitespace().map(String::from).collect());
                    break;
                }
                if a == "--" {
                    i += 1;
                    break;
                }
                if let Some(opt) = a.strip_prefix('-').filter(|o| !o.is_empty()) {
                    let takes_value = opt.len() == 1 && value_flags.contains(opt);
                    i += if takes_value { 2 } else { 1 };
                    continue;
                }
                if name == "env" && a.contains('=') {
                    i += 1;
                    continue;
                }
                if skipped_operands < *operands {
                    skipped_operands += 1;
                    i += 1;
                    continue;
                }
                break;
            }
            if let Some(s) = split.filter(|s| !s.is_empty()) {
                argv = s;
                continue;
            }
            &argv[i.min(argv.len())..]
        } else {
            break;
        };
        if args.is_empty() {
            break;
        }
        argv = args.to_vec();
    }
    let first = argv[0].clone();
    (first, argv[1..].to_vec())
}

/// Up to `max` bytes of `path`, if it is a regular file. Opened without
/// blocking (a FIFO swapped in for a program would otherwise hold the
/// decision, and the thread deciding, until someone writes to it) and read
/// only once `fstat` says it is a regular file.
pub fn read_regular(path: &Path, max: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut out = Vec::new();
    file.take(max).read_to_end(&mut out).ok()?;
    Some(out)
}

/// The interpreter named on a script's `#!` line (through `env`).
fn shebang(path: &Path) -> Option<(PathBuf, String)> {
    let head = read_regular(path, 256)?;
    let line = head.strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line.split(|b| *b == b'\n').next()?).into_owned();
    let mut words = line.split_whitespace();
    let interp = words.next()?.to_string();
    if basename(&interp) == "env" {
        let next = words.find(|w| !w.starts_with('-'))?.to_string();
        return resolve_executable(&next).ok().map(|p| (p, next));
    }
    Some((PathBuf::from(&interp).canonicalize().unwrap_or_else(|_| PathBuf::from(&interp)), interp))
}

#[derive(Clone, Copy, PartialEq)]
enum Family {
    Shell,
    Python,
    Node,
    Deno,
    Perl,
    Ruby,
    Php,
    Lua,
    Pwsh,
    Osascript,
    Tcl,
    R,
    Julia,
    Guile,
}

fn family(name: &str) -> Family {
    let n = name.to_ascii_lowercase();
    let starts = |p: &str| n.starts_with(p);
    if starts("python") || starts("pypy") {
        Family::Python
    } else if starts("node") || n == "bun" {
        Family::Node
    } else if n == "deno" {
        Family::Deno
    } else if starts("perl") {
        Family::Perl
    } else if starts("ruby") || n == "irb" {
        Family::Ruby
    } else if starts("php") {
        Family::Php
    } else if starts("lua") {
        Family::Lua
    } else if n == "pwsh" || n == "powershell" {
        Family::Pwsh
    } else if n == "osascript" {
        Family::Osascript
    } else if starts("tclsh") || starts("wish") || n == "expect" {
        Family::Tcl
    } else if n == "rscript" || n == "r" {
        Family::R
    } else if n == "julia" {
        Family::Julia
    } else if starts("guile") {
        Family::Guile
    } else {
        Family::Shell
    }
}

/// Per family: short option letters that carry code, letters after which the
/// rest of a cluster is a value, long options that carry code, and short
/// options whose next argument is a value (not the script).
fn code_options(f: Family) -> (&'static str, &'static str, &'static [&'static str], &'static str) {
    match f {
        Family::Shell => ("c", "oO", &["--command"], "oO"),
        Family::Python => ("c", "WXQm", &[], "WXQm"),
        Family::Node => ("ep", "r", &["--eval", "--print"], "r"),
        Family::Deno => ("", "", &["eval"], ""),
        Family::Perl => ("eE", "IMmxidCl0", &[], "IMm"),
        Family::Ruby => ("e", "IrCExFKT", &[], "IrC"),
        Family::Php => ("rRBE", "cdzf", &[], "cdzf"),
        Family::Lua => ("e", "l", &[], "l"),
        Family::Pwsh => ("c", "", &["-command", "-encodedcommand", "-ec", "-commandwithargs"], ""),
        Family::Osascript => ("e", "l", &[], "l"),
        Family::Tcl => ("c", "", &[], ""),
        Family::R => ("e", "", &["--eval"], ""),
        Family::Julia => ("eE", "JCLp", &["--eval", "--print"], "JCLp"),
        Family::Guile => ("c", "L", &[], "L"),
    }
}

/// Whether the arguments of an interpreter hand it code inline (`-c`, `-e`,
/// `--eval`, ...), or on stdin (`-`, or no script operand with stdin given).
fn inline_code(f: Family, args: &[String], stdin_given: bool) -> Option<String> {
    let (letters, stop, long, valued) = code_options(f);
    let mut i = 0;
    let mut operand = None;
    while i < args.len() {
        let a = &args[i];
        let lower = a.to_ascii_lowercase();
        if a == "-" {
            return Some("- (a script on stdin)".into());
        }
        if long.iter().any(|l| lower == *l || lower.starts_with(&format!("{l}="))) {
            return Some(a.clone());
        }
        if f == Family::Deno && i == 0 && a == "eval" {
            return Some(a.clone());
        }
        if let Some(cluster) = a.strip_prefix('-').filter(|c| !c.starts_with('-') && !c.is_empty()) {
            for ch in cluster.chars() {
                if letters.contains(ch) {
                    return Some(a.clone());
                }
                if stop.contains(ch) {
                    break;
                }
            }
            if f == Family::Shell && cluster.contains('s') {
                return Some(format!("{a} (commands on stdin)"));
            }
            let last = cluster.chars().last().unwrap_or(' ');
            i += if cluster.len() == 1 && valued.contains(last) { 2 } else { 1 };
            continue;
        }
        if a == "--" {
            operand = args.get(i + 1).cloned();
            break;
        }
        if a.starts_with("--") {
            i += 1;
            continue;
        }
        operand = Some(a.clone());
        break;
    }
    match (operand, stdin_given) {
        (None, true) => Some("no script operand, code on stdin".into()),
        _ => None,
    }
}

/// The interpreter deny-list, and with interpreters allowed, inline code.
pub fn check_interpreters(
    rules: &Rules,
    program: &Path,
    argv: &[String],
    stdin_given: bool,
    allow_interpreters: bool,
    allow_inline_code: bool,
) -> Result<(), Denial> {
    // What will really run: through launchers, and through a script's #! line.
    let (command, args) = through_launchers(argv);
    let effective = if command == argv[0] {
        program.to_path_buf()
    } else {
        resolve_executable(&command).unwrap_or_else(|_| PathBuf::from(&command))
    };
    let (interpreter, args) = match rules.interpreter(&effective, &command) {
        Some(name) => (Some(name), args),
        None => match shebang(&effective) {
            Some((path, name)) => (rules.interpreter(&path, &name), args),
            None => (None, args),
        },
    };
    let Some(name) = interpreter else { return Ok(()) };
    if !allow_interpreters {
        return Err(deny(
            ErrorKind::PolicyDenied,
            "interpreters.denied",
            format!(
                "{} runs the interpreter {name}; interpreters are not allowed by this policy",
                effective.display()
            ),
        ));
    }
    if allow_inline_code {
        return Ok(());
    }
    match inline_code(family(&name), &args, stdin_given) {
        Some(how) => Err(deny(
            ErrorKind::PolicyDenied,
            "interpreters.inline_code",
            format!("{name} would run inline code ({how}); inline code is not allowed by this policy"),
        )),
        None => Ok(()),
    }
}

/// The path-like parts of an argument: the argument itself, the value of
/// `--flag=value` and of `key=value` (`dd if=/dev/sda`), and a path glued to
/// a short option or a cluster of them (`-I/usr/include`, `-xf/srv/a.tar`).
/// URLs and `user@host:path` forms are left to the egress check.
fn path_candidates(arg: &str) -> Vec<&str> {
    let path_like = |s: &str| {
        !s.is_empty()
            && (s.starts_with('/') || s.starts_with('~') || s.starts_with('.') || s.contains('/'))
            && !s.contains("://")
            && !s.split('/').next().unwrap_or("").contains('@')
    };
    let mut out = Vec::new();
    if arg.starts_with('-') {
        if let Some((_, v)) = arg.split_once('=') {
            if path_like(v) {
                out.push(v);
            }
        } else if !arg.starts_with("--") && arg.len() > 2 {
            // `-I../include`, `-o/out`: a path glued to a one-letter option.
            if path_like(&arg[2..]) {
                out.push(&arg[2..]);
            }
            // `-xf/srv/a.tar`: an absolute path glued to a cluster of options.
            if let Some(at) = arg[2..].find(['/', '~']).map(|i| i + 2) {
                if at > 2 && path_like(&arg[at..]) {
                    out.push(&arg[at..]);
                }
            }
        }
    } else {
        if path_like(arg) {
            out.push(arg);
        }
        // `if=/dev/sda`, `PREFIX=/opt/x`: the value is a path of its own.
        if let Some((k, v)) = arg.split_once('=') {
            let key = |k: &str| {
                k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            };
            if key(k) && path_like(v) && !v.contains(char::is_whitespace) {
                out.push(v);
            }
        }
    }
    out
}

/// Every path-like argument, canonicalized, must lie inside an allowed root
/// and outside the sensitive paths (deny beats allow). `private` roots are the
/// sandbox's own (a tmpfs /tmp): a path there is accepted only if it does not
/// lead into something that exists on the host, which the sandbox cannot see.
pub fn check_scope(
    rules: &Rules,
    argv: &[String],
    cwd: &Path,
    home: Option<&Path>,
    roots: &[PathBuf],
    private: &[PathBuf],
) -> Result<(), Denial> {
    for arg in argv.iter().skip(1) {
        let mut candidates = path_candidates(arg);
        // A bare name is a path when it exists (it may be a symlink out): the
        // argument itself, or an option's value (`--file=link`, `-flink`, `if=link`).
        let bare = [
            Some(arg.as_str()).filter(|a| !a.starts_with('-')),
            arg.split_once('=').map(|(_, v)| v),
            arg.strip_prefix('-').filter(|a| !a.starts_with('-')).and_then(|a| a.get(1..)),
        ];
        for name in bare.into_iter().flatten() {
            if !name.is_empty()
                && !candidates.contains(&name)
                && std::fs::symlink_metadata(cwd.join(name)).is_ok()
            {
                candidates.push(name);
            }
        }
        for candidate in candidates {
            let resolved = paths::resolve(candidate, cwd, home);
            let raw = paths::resolve_lexically(candidate, cwd, home);
            if rules.sensitive(&resolved, home) || rules.sensitive(&raw, home) {
                return Err(deny(
                    ErrorKind::WorkspaceScopeDenied,
                    "scope.sensitive_path",
                    format!("{candidate} ({}) is a sensitive path", resolved.display()),
                ));
            }
            // The private /tmp itself is the sandbox's; in it, a name the host
            // has (its first component exists there) would refer to something
            // the sandbox cannot see.
            let in_private = || {
                private.iter().any(|r| match resolved.strip_prefix(r).map(|rest| rest.components().next()) {
                    Ok(None) => true,
                    Ok(Some(c)) => std::fs::symlink_metadata(r.join(c)).is_err(),
                    Err(_) => false,
                })
            };
            if !roots.iter().any(|r| paths::within(&resolved, r)) && !in_private() {
                return Err(deny(
                    ErrorKind::WorkspaceScopeDenied,
                    "scope.outside_roots",
                    format!("{candidate} resolves to {}, outside the allowed roots", resolved.display()),
                ));
            }
        }
    }
    Ok(())
}

/// Blocked command patterns, over the whole command line.
pub fn check_patterns(rules: &Rules, argv: &[String]) -> Result<(), Denial> {
    let mut line = String::new();
    for (i, a) in argv.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        line.push_str(if i == 0 { basename(a) } else { a });
    }
    for (re, what) in &rules.blocked {
        if re.is_match(&line) {
            return Err(deny(
                ErrorKind::PolicyDenied,
                "patterns.blocked",
                format!("the command line contains {what}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// Every interpreter the deny-list names is recognised by name alone: no
    /// installed binary is needed (the pipeline tests cover installed ones).
    #[test]
    fn interpreters_are_recognised_by_name() {
        let rules = Rules::new(&PolicyConfig::default());
        for name in [
            "sh",
            "bash",
            "dash",
            "zsh",
            "fish",
            "ksh",
            "busybox",
            "python",
            "python3",
            "python3.12",
            "pypy3",
            "node",
            "nodejs",
            "deno",
            "bun",
            "perl",
            "perl5.36",
            "ruby",
            "ruby3.1",
            "irb",
            "php",
            "php8.2",
            "lua",
            "lua5.4",
            "luajit",
            "pwsh",
            "powershell",
            "osascript",
            "tclsh8.6",
            "wish",
            "expect",
            "Rscript",
            "R",
            "julia",
            "guile3.0",
        ] {
            let path = PathBuf::from(format!("/nonexistent/{name}"));
            assert_eq!(rules.interpreter(&path, name).as_deref(), Some(name), "{name}");
        }
        for name in ["ls", "cat", "grep", "git", "cargo", "make", "gcc", "rustc", "shellcheck", "nodemon-x"] {
            let path = PathBuf::from(format!("/nonexistent/{name}"));
            assert_eq!(rules.interpreter(&path, name), None, "{name}");
        }
    }

    #[test]
    fn inline_code_is_found_in_every_family() {
        let inline = [
            ("bash", &["-c", "id"][..], false),
            ("sh", &["-ec", "id"], false),
            ("zsh", &["-c", "id"], false),
            ("fish", &["--command", "id"], false),
            ("bash", &["-s"], false),
            ("bash", &["-"], false),
            ("bash", &[], true),
            ("python3", &["-c", "print(1)"], false),
            ("python3", &["-Bc", "print(1)"], false),
            ("python3", &[], true),
            ("node", &["-e", "1"], false),
            ("node", &["--eval=1"], false),
            ("node", &["-p", "1"], false),
            ("deno", &["eval", "1"], false),
            ("perl", &["-e", "1"], false),
            ("perl", &["-ne", "print"], false),
            ("perl", &["-E", "say 1"], false),
            ("ruby", &["-e", "1"], false),
            ("php", &["-r", "echo 1;"], false),
            ("lua", &["-e", "x=1"], false),
            ("pwsh", &["-Command", "Get-Item"], false),
            ("pwsh", &["-EncodedCommand", "ZQBjAGgAbwA="], false),
            ("osascript", &["-e", "beep"], false),
            ("tclsh", &[], true),
            ("Rscript", &["-e", "1"], false),
            ("julia", &["-e", "1"], false),
            ("guile", &["-c", "1"], false),
        ];
        for (name, a, stdin) in inline {
            assert!(inline_code(family(name), &args(a), stdin).is_some(), "{name} {a:?} stdin={stdin}");
        }
        let scripts = [
            ("bash", &["build.sh"][..], false),
            ("bash", &["-x", "build.sh"], true),
            ("sh", &["-o", "errexit", "build.sh"], false),
            ("python3", &["-m", "pytest"], false),
            ("python3", &["-W", "ignore", "tool.py"], true),
            ("node", &["-r", "ts-node/register", "app.ts"], false),
            ("perl", &["-I", "lib", "script.pl"], false),
            ("ruby", &["script.rb"], false),
            ("php", &["artisan"], false),
            ("deno", &["run", "main.ts"], false),
            ("Rscript", &["analysis.R"], false),
        ];
        for (name, a, stdin) in scripts {
            assert_eq!(inline_code(family(name), &args(a), stdin), None, "{name} {a:?} stdin={stdin}");
        }
    }
}
