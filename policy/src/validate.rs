//! The validation pipeline: checks a request passes before anything is
//! spawned. Each refusal carries a stable error kind and a stable rule name.
//!
//! These checks make refusals early and explicit; they are not the boundary.
//! A program can compute a path or a host the checks never saw, and a path can
//! change between the check and the run: the kernel-side rules (mount
//! namespace, Landlock, seccomp) hold regardless.

use crate::config::PolicyConfig;
use crate::denial::Denial;
use crate::host::{FileStat, HostFiles};
use crate::paths;
use crate::paths::{SANDBOX_PATH, find_executable};
use crate::sensitive::globset;
pub use crate::sensitive::{
    HOME_SENSITIVE_NAMES, SENSITIVE_NAMES, SENSITIVE_PATHS, Sensitive, names_a_credential,
};
use globset::GlobSet;
use palisade_protocol::wire::ErrorKind;
use regex::Regex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How much of a script is read for its `#!` line (Linux reads 256 bytes of it).
const SHEBANG_BYTES: u64 = 256;
/// How much of an ELF file is read for its loader: the program headers and
/// `PT_INTERP` of an ordinary executable lie in its first page.
const ELF_HEAD_BYTES: u64 = 4096;
/// How many launchers (`env nice timeout ...`) are looked through, nested:
/// more than any real command line holds.
const MAX_LAUNCHERS: usize = 8;
/// How much of an argument holding a NUL byte a refusal shows.
const SHOWN_CHARS: usize = 40;

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
    // script(1) runs a shell: `script -c CMD`, or one reading stdin.
    "script",
    // Dynamic loaders run whatever program they are given
    // (`ld-linux-x86-64.so.2 /usr/bin/bash -c ...`), past every check of it.
    "ld-*.so*",
    "ld.so*",
    "ld64.so*",
];

/// git configuration whose value git runs (as a shell command or a
/// program), lowercase, `*` for any subsection; `alias.*` only with a value
/// starting with `!`. `include.path` reads more configuration, which may set
/// any of them.
const GIT_COMMAND_KEYS: [&str; 27] = [
    "alias.*",
    "core.sshcommand",
    "core.pager",
    "core.editor",
    "core.askpass",
    "core.fsmonitor",
    "core.hookspath",
    "core.gitproxy",
    "core.alternaterefscommand",
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
    "pager.*",
    "difftool.*.cmd",
    "mergetool.*.cmd",
    "include.path",
    "includeif.*.path",
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

/// Command lines refused outright (matched against the arguments joined by
/// spaces), each with words of which every match contains one: a pattern is
/// compiled only for a command line that holds one of its words (compiling
/// them all took about a millisecond, most of a one-run CLI's decision).
const BLOCKED_PATTERNS: &[(&str, &str, &[&str])] = &[
    (
        r"(^|[\s;&|(])(sudo|doas|pkexec|run0)(\s|$)",
        "privilege escalation (sudo)",
        &["sudo", "doas", "pkexec", "run0"],
    ),
    (r"(^|[\s;&|(])su(\s+-)?(\s+\S+)?\s*$", "privilege escalation (su)", &["su"]),
    (r":\s*\(\s*\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:", "a fork bomb", &[":"]),
    (r"(^|[\s;&|(/])mkfs(\.\w+)?(\s|$)", "formatting a filesystem (mkfs)", &["mkfs"]),
    (r"(^|[\s;&|(/])dd\s.*\bof=/dev/", "dd to a device", &["of=/dev/"]),
    (r">\s*/dev/(sd|hd|vd|xvd|nvme|mmcblk)", "overwriting a disk", &["/dev/"]),
    (r"(^|[\s;&|(])rm\s+(-\S+\s+)*(/|/\*)(\s|$)", "rm of /", &["rm"]),
    (r"--no-preserve-root", "rm --no-preserve-root", &["--no-preserve-root"]),
    (r"chmod\s+(-\S+\s+)*0?777\s+/(\s|$)", "chmod 777 /", &["777"]),
];

/// A blocked pattern, compiled at its first use.
#[derive(Debug)]
struct Blocked {
    pattern: String,
    what: String,
    /// Every match contains one of these; empty: no such words are known
    /// (a configured pattern), it is always tried.
    words: &'static [&'static str],
    compiled: OnceLock<Option<Regex>>,
}

impl Blocked {
    fn matches(&self, line: &str) -> bool {
        if !self.words.is_empty() && !self.words.iter().any(|w| line.contains(w)) {
            return false;
        }
        // Patterns were checked when the configuration was parsed (the built-in ones by a test).
        let compiled = self.compiled.get_or_init(|| Regex::new(&self.pattern).ok());
        compiled.as_ref().is_some_and(|re| re.is_match(line))
    }
}

/// Compiled rules, built once per configuration.
#[derive(Debug)]
pub struct Rules {
    interpreters: GlobSet,
    installed: Installed,
    sensitive: Sensitive,
    blocked: Vec<Blocked>,
}

/// The interpreters installed on the host, by inode (a hard link or symlink
/// under another name is still the interpreter) and by size (a renamed copy
/// is compared byte for byte).
#[derive(Debug, Default)]
struct Installed {
    by_inode: HashMap<(u64, u64), String>,
    by_size: HashMap<u64, Vec<PathBuf>>,
}

impl Installed {
    fn add(&mut self, m: FileStat, name: String, canonical: Option<PathBuf>) {
        self.by_inode.insert((m.dev, m.ino), name);
        let list = self.by_size.entry(m.len).or_default();
        if let Some(p) = canonical.filter(|p| !list.contains(p)) {
            list.push(p);
        }
    }
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

impl Rules {
    /// Patterns were checked when the configuration was parsed. The
    /// interpreters installed on the host are not known yet (see
    /// [`Rules::with_installed`]): until then they are recognised by name.
    pub fn new(policy: &PolicyConfig) -> Rules {
        let interpreters = globset(
            INTERPRETERS
                .iter()
                .map(|s| s.to_string())
                .chain(policy.interpreters.iter().map(|s| s.get_ref().clone())),
        );
        let blocked =
            BLOCKED_PATTERNS
                .iter()
                .map(|(p, what, words)| (p.to_string(), what.to_string(), *words))
                .chain(policy.blocked_patterns.iter().map(|p| {
                    (p.get_ref().clone(), format!("the configured pattern {:?}", p.get_ref()), &[][..])
                }))
                .map(|(pattern, what, words)| Blocked { pattern, what, words, compiled: OnceLock::new() })
                .collect();
        Rules {
            interpreters,
            installed: Installed::default(),
            sensitive: Sensitive::new(policy.sensitive_paths.iter().map(|s| s.get_ref().clone())),
            blocked,
        }
    }

    /// With the interpreters installed on the host: every one in the
    /// system PATH, and the host's dynamic loaders.
    pub fn with_installed(mut self, files: &dyn HostFiles) -> Rules {
        let mut installed = Installed::default();
        let mut listed = Vec::new();
        for dir in SANDBOX_PATH.split(':').map(Path::new) {
            // /bin and /sbin are /usr's on most systems now: each directory once.
            match files.canonicalize(dir) {
                Ok(c) if listed.contains(&c) => continue,
                Ok(c) => listed.push(c),
                Err(_) => {}
            }
            for name in files.list_dir(dir) {
                let name = name.to_string_lossy().into_owned();
                if !self.interpreters.is_match(&name) {
                    continue;
                }
                let path = dir.join(&name);
                if let Some(m) = files.stat(&path).ok().filter(FileStat::is_file) {
                    installed.add(m, name, files.canonicalize(&path).ok());
                }
            }
        }
        // A copy of a loader under another name is still one.
        for loader in loaders(files) {
            let name = loader.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if let Ok(m) = files.stat(&loader) {
                installed.add(m, name, Some(loader));
            }
        }
        self.installed = installed;
        self
    }

    /// The interpreter `path` is (by name, inode or content), if any: a
    /// shell, a language runtime, or a dynamic loader.
    pub fn interpreter(&self, files: &dyn HostFiles, path: &Path, argv0: &str) -> Option<String> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if self.interpreters.is_match(&name) {
            return Some(name);
        }
        if self.interpreters.is_match(basename(argv0)) {
            return Some(basename(argv0).to_string());
        }
        let m = files.stat(path).ok()?;
        if let Some(n) = self.installed.by_inode.get(&(m.dev, m.ino)) {
            return Some(n.clone());
        }
        let candidates = self.installed.by_size.get(&m.len)?;
        let content = files.read_head(path, m.len)?;
        candidates
            .iter()
            .find(|known| files.read_head(known, m.len).as_ref() == Some(&content))
            .and_then(|known| known.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    /// The absolute sensitive patterns, built-in and configured (`~/` taken
    /// from `home`): what a granted directory must not expose.
    pub fn absolute_sensitive(&self, home: Option<&Path>) -> Vec<String> {
        let extra = self.sensitive.extra.iter().filter_map(|p| match (p.strip_prefix("~/"), home) {
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
        self.sensitive.matches(path, home)
    }
}

/// The dynamic loaders of this host: the `PT_INTERP` of its shell and of
/// `env` (where the system's programs say their loader is), and glibc's
/// `ld.so`, canonical.
fn loaders(files: &dyn HostFiles) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["/bin/sh", "/usr/bin/env", "/usr/bin/ld.so"]
        .iter()
        .filter_map(|p| {
            let head = files.read_head(Path::new(p), ELF_HEAD_BYTES);
            let interp = head.and_then(|head| elf_interpreter(&head));
            interp.map(PathBuf::from).or_else(|| p.ends_with("ld.so").then(|| PathBuf::from(p)))
        })
        .filter_map(|p| files.canonicalize(&p).ok())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The `PT_INTERP` path of a 64-bit little-endian ELF file, from its first
/// bytes (`head`), if it names one there.
fn elf_interpreter(head: &[u8]) -> Option<String> {
    // Offsets in the ELF64 file header and program header (elf(5)).
    const E_PHOFF: usize = 0x20;
    const E_PHENTSIZE: usize = 0x36;
    const E_PHNUM: usize = 0x38;
    const P_OFFSET: usize = 8;
    const P_FILESZ: usize = 32;
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| Some(u16::from_le_bytes(head.get(at..at + 2)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(head.get(at..at + 8)?.try_into().ok()?));
    // ELF, 64-bit, little-endian.
    if head.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (phoff, phentsize, phnum) =
        (u64_at(E_PHOFF)? as usize, usize::from(u16_at(E_PHENTSIZE)?), usize::from(u16_at(E_PHNUM)?));
    (0..phnum).find_map(|i| {
        let ph = phoff + i * phentsize;
        if u32::from_le_bytes(head.get(ph..ph + 4)?.try_into().ok()?) != PT_INTERP {
            return None;
        }
        let (offset, size) = (u64_at(ph + P_OFFSET)? as usize, u64_at(ph + P_FILESZ)? as usize);
        let path = head.get(offset..offset + size)?;
        Some(String::from_utf8_lossy(path.strip_suffix(b"\0").unwrap_or(path)).into_owned())
    })
}

/// The setting of git's command line that makes it run a command, if any:
/// `-c key=value` (or `--config-env=key=var`, `clone --config key=value`)
/// with a key of [`GIT_COMMAND_KEYS`], or `--upload-pack` / `--receive-pack`.
fn git_runs_command(args: &[String]) -> Option<String> {
    let matches = |key: &str, value: Option<&str>| {
        let key = key.to_ascii_lowercase();
        GIT_COMMAND_KEYS.iter().any(|pattern| {
            let hit = match pattern.split_once('*') {
                Some((start, end)) => {
                    key.starts_with(start) && key.ends_with(end) && key.len() > start.len() + end.len()
                }
                None => key == *pattern,
            };
            hit && (*pattern != "alias.*" || value.is_some_and(|v| v.starts_with('!')))
        })
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if ["--upload-pack", "--receive-pack", "--exec"]
            .iter()
            .any(|o| arg == o || arg.starts_with(&format!("{o}=")))
        {
            return Some(arg.clone());
        }
        let setting = match arg.as_str() {
            "-c" | "--config" => it.next().map(String::as_str),
            a => a.strip_prefix("--config-env=").or_else(|| a.strip_prefix("--config=")),
        };
        let Some(setting) = setting else { continue };
        let (key, value) = setting.split_once('=').map_or((setting, None), |(k, v)| (k, Some(v)));
        // --config-env's value names a variable: what git runs is out of sight.
        let value = if arg.starts_with("--config-env") { Some("!") } else { value };
        if matches(key, value) {
            return Some(format!("-c {setting}"));
        }
    }
    None
}

fn deny(kind: ErrorKind, rule: &'static str, reason: String) -> Denial {
    Denial::new(kind, rule, reason)
}

/// A request past a bound of its shape: the bound, its key of `[policy]`,
/// and the value that would hold this request.
fn over(d: Denial, key: &str, limit: usize, needed: usize) -> Denial {
    let reason = format!("{}; the limit is {limit} (`[policy] {key}`)", d.reason);
    Denial { reason, ..d }.with_fix(None, format!("[policy] {key} = {needed}"))
}

/// Command length, argument count and size, environment size, NUL bytes.
pub fn check_shape(policy: &PolicyConfig, argv: &[String], env: &[(String, String)]) -> Result<(), Denial> {
    let Some(command) = argv.first() else {
        return Err(deny(ErrorKind::InvalidRequest, "limits.empty_command", "empty command".into()));
    };
    let nul = argv.iter().chain(env.iter().flat_map(|(k, v)| [k, v])).find(|s| s.contains('\0'));
    if let Some(s) = nul {
        let shown: String = s.chars().take(SHOWN_CHARS).collect::<String>().replace('\0', "\\0");
        return Err(deny(ErrorKind::InvalidRequest, "limits.nul_byte", format!("NUL byte in {shown:?}")));
    }
    let invalid = |rule, what| deny(ErrorKind::InvalidRequest, rule, what);
    if command.len() > policy.max_command_bytes {
        let d = invalid("limits.command_bytes", format!("the command is {} bytes", command.len()));
        return Err(over(d, "max_command_bytes", policy.max_command_bytes, command.len()));
    }
    if argv.len() - 1 > policy.max_arguments {
        let d = invalid("limits.arguments", format!("{} arguments", argv.len() - 1));
        return Err(over(d, "max_arguments", policy.max_arguments, argv.len() - 1));
    }
    if let Some((i, a)) = argv.iter().enumerate().skip(1).find(|(_, a)| a.len() > policy.max_argument_bytes) {
        let d = invalid("limits.argument_bytes", format!("argument {i} is {} bytes", a.len()));
        return Err(over(d, "max_argument_bytes", policy.max_argument_bytes, a.len()));
    }
    if env.len() > policy.max_env_vars {
        let d = invalid("limits.env_vars", format!("{} environment variables", env.len()));
        return Err(over(d, "max_env_vars", policy.max_env_vars, env.len()));
    }
    Ok(())
}

/// A bare name is looked up in the sandbox's PATH; a path must be absolute.
/// The result is canonical (symlinks resolved).
pub fn resolve_executable(files: &dyn HostFiles, name: &str) -> Result<PathBuf, String> {
    let is_executable = |p: &Path| files.stat(p).is_ok_and(|m| m.is_executable());
    find_executable(name, &is_executable, &|p| files.canonicalize(p))
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
    )
    .with_fix(None, format!("allowed_executables = [..., \"{}\"]", program.display())))
}

/// The command a launcher (env, nice, timeout, ...) would run, and its arguments.
pub(crate) fn through_launchers(argv: &[String]) -> (String, Vec<String>) {
    let mut argv: Vec<String> = argv.to_vec();
    for _ in 0..MAX_LAUNCHERS {
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

/// The interpreter named on a script's `#!` line (through `env`).
pub(crate) fn shebang(files: &dyn HostFiles, path: &Path) -> Option<(PathBuf, String)> {
    let head = files.read_head(path, SHEBANG_BYTES)?;
    let line = head.strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line.split(|b| *b == b'\n').next()?).into_owned();
    let mut words = line.split_whitespace();
    let interp = words.next()?.to_string();
    if basename(&interp) == "env" {
        let next = words.find(|w| !w.starts_with('-'))?.to_string();
        return resolve_executable(files, &next).ok().map(|p| (p, next));
    }
    Some((files.canonicalize(Path::new(&interp)).unwrap_or_else(|_| PathBuf::from(&interp)), interp))
}

#[derive(Clone, Copy, PartialEq)]
enum Family {
    Shell,
    Script,
    Loader,
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
    if n == "script" {
        Family::Script
    } else if starts("ld-") || starts("ld.so") || starts("ld64.so") {
        Family::Loader
    } else if starts("python") || starts("pypy") {
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
        Family::Script => ("c", "IOBTmEo", &["--command"], "IOBTmEo"),
        Family::Loader => ("", "", &[], ""),
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

/// Python modules that, run with `-m`, read code from their stdin: a REPL.
const PYTHON_REPL_MODULES: &[&str] =
    &["code", "pdb", "asyncio", "idlelib", "IPython", "ipython", "ptpython", "bpython", "jupyter_console"];

/// Whether the arguments of an interpreter hand it code inline (`-c`, `-e`,
/// `--eval`, ...), or on stdin (`-`, or no script operand with stdin given).
fn inline_code(f: Family, args: &[String], stdin_given: bool) -> Option<String> {
    if f == Family::Loader {
        return Some("whatever program it is given".into());
    }
    let (letters, stop, long, valued) = code_options(f);
    let mut i = 0;
    let mut operand = None;
    'args: while i < args.len() {
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
            for (at, ch) in cluster.char_indices() {
                if letters.contains(ch) {
                    return Some(a.clone());
                }
                // `python -m MODULE`: the module is the script, whatever follows
                // is its; but a REPL's module reads code from its stdin.
                if f == Family::Python && ch == 'm' {
                    let module = &cluster[at + 1..];
                    operand = if module.is_empty() { args.get(i + 1).cloned() } else { Some(module.into()) };
                    let root = operand.as_deref().map(|m| m.split('.').next().unwrap_or(m));
                    if stdin_given && root.is_some_and(|r| PYTHON_REPL_MODULES.contains(&r)) {
                        return Some(format!(
                            "-m {} (a REPL reading code on stdin)",
                            operand.unwrap_or_default()
                        ));
                    }
                    break 'args;
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
        // script(1)'s operand is the file it logs to; the shell it starts reads stdin.
        (Some(_), true) if f == Family::Script => Some("a shell reading stdin".into()),
        _ => None,
    }
}

/// The interpreter deny-list, and with interpreters allowed, inline code.
pub fn check_interpreters(
    rules: &Rules,
    files: &dyn HostFiles,
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
        resolve_executable(files, &command).unwrap_or_else(|_| PathBuf::from(&command))
    };
    if basename(&command) == "git" || effective.file_name().is_some_and(|n| n == "git") {
        if let Some(setting) = git_runs_command(&args) {
            return check_command_in_arguments(
                &format!("git {setting}"),
                allow_interpreters,
                allow_inline_code,
            );
        }
    }
    let (interpreter, args) = match rules.interpreter(files, &effective, &command) {
        Some(name) => (Some(name), args),
        None => match shebang(files, &effective) {
            Some((path, name)) => (rules.interpreter(files, &path, &name), args),
            None => (None, args),
        },
    };
    let Some(name) = interpreter else { return Ok(()) };
    if family(&name) == Family::Loader && !(allow_interpreters && allow_inline_code) {
        return Err(deny(
            ErrorKind::PolicyDenied,
            "interpreters.loader",
            format!(
                "{} is the dynamic loader {name}, which runs whatever program it is given, past the checks of \
                 that program; loaders run only where interpreters and inline code are both allowed",
                effective.display()
            ),
        ));
    }
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

/// A program told on its command line to run a command (`git -c
/// alias.x=!cmd`): an interpreter given inline code.
fn check_command_in_arguments(
    what: &str,
    allow_interpreters: bool,
    allow_inline_code: bool,
) -> Result<(), Denial> {
    if !allow_interpreters {
        return Err(deny(
            ErrorKind::PolicyDenied,
            "interpreters.denied",
            format!(
                "{what} runs a command given on the command line; interpreters are not allowed by this policy"
            ),
        ));
    }
    if !allow_inline_code {
        return Err(deny(
            ErrorKind::PolicyDenied,
            "interpreters.inline_code",
            format!(
                "{what} runs a command given on the command line; inline code is not allowed by this policy"
            ),
        ));
    }
    Ok(())
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
    files: &dyn HostFiles,
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
            if !name.is_empty() && !candidates.contains(&name) && files.lstat(&cwd.join(name)).is_ok() {
                candidates.push(name);
            }
        }
        for candidate in candidates {
            let resolved = paths::resolve(candidate, cwd, home);
            let raw = paths::resolve_lexically(candidate, cwd, home);
            if rules.sensitive(&resolved, home) || rules.sensitive(&raw, home) {
                // An inline script is not a path: the word of it that names one.
                let what = if !candidate.contains(char::is_whitespace) {
                    format!("{candidate} ({}) is a sensitive path", resolved.display())
                } else if let Some(word) = sensitive_word(rules, candidate, cwd, home) {
                    format!("the inline script names {word}, a sensitive path")
                } else {
                    "an inline script names a sensitive path".to_string()
                };
                let why = format!("{what}: sensitive paths are never granted, by any flag or key");
                return Err(deny(ErrorKind::WorkspaceScopeDenied, "scope.sensitive_path", why));
            }
            // The private /tmp itself is the sandbox's; in it, a name the host
            // has (its first component exists there) would refer to something
            // the sandbox cannot see.
            let in_private = || {
                private.iter().any(|r| match resolved.strip_prefix(r).map(|rest| rest.components().next()) {
                    Ok(None) => true,
                    Ok(Some(c)) => files.lstat(&r.join(c)).is_err(),
                    Err(_) => false,
                })
            };
            if !roots.iter().any(|r| paths::within(&resolved, r)) && !in_private() {
                let p = resolved.display();
                let why = format!("{candidate} resolves to {p}, outside the allowed roots");
                let flag = format!("--read-only {p}");
                let denial = deny(ErrorKind::WorkspaceScopeDenied, "scope.outside_roots", why);
                return Err(denial.with_fix(Some(flag), format!("read_only = [\"{p}\"]")));
            }
        }
    }
    Ok(())
}

/// The word of an argument holding whitespace (an inline script, a
/// sentence) that names a sensitive path, if one does by itself.
fn sensitive_word<'a>(rules: &Rules, arg: &'a str, cwd: &Path, home: Option<&Path>) -> Option<&'a str> {
    let mut words = arg.split(|c: char| c.is_whitespace() || ";|&<>()'\"`=".contains(c));
    words.find(|w| {
        !w.is_empty()
            && (rules.sensitive(&paths::resolve(w, cwd, home), home)
                || rules.sensitive(&paths::resolve_lexically(w, cwd, home), home))
    })
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
    if let Some(b) = rules.blocked.iter().find(|b| b.matches(&line)) {
        return Err(deny(
            ErrorKind::PolicyDenied,
            "patterns.blocked",
            format!(
                "the command line contains {}, a blocked pattern (built in, or [policy] blocked_patterns): no flag lifts it",
                b.what
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::{FakeFiles, elf_with_interpreter};

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// The names compared by component say what their globs `**/NAME` and
    /// `**/NAME/**` said, for each name where it is, under it, and beside it.
    #[test]
    fn sensitive_names_by_component_as_by_glob() {
        let globs = globset(SENSITIVE_NAMES.iter().flat_map(|n| [format!("**/{n}"), format!("**/{n}/**")]));
        let rules = Rules::new(&PolicyConfig::default());
        for n in SENSITIVE_NAMES {
            for p in [
                n.to_string(),
                format!("/{n}"),
                format!("/home/u/{n}"),
                format!("/home/u/{n}/key"),
                format!("/w/p/{n}/a/b"),
                format!("/home/u/x{n}"),
                format!("/home/u/{n}x/key"),
                format!("/home/u/{n}.bak"),
                format!("/{}", n.rsplit('/').next().unwrap_or(n)),
            ] {
                let path = Path::new(&p);
                let by_component = rules.sensitive.holds_name(path);
                assert_eq!(by_component, globs.is_match(path), "{p}");
            }
        }
    }

    /// Each built-in pattern compiles, and every command line it matches
    /// holds one of its words (what lets a line without them skip it); the
    /// lazily compiled rules refuse and pass the same lines.
    #[test]
    fn blocked_patterns_hold_their_words() {
        let refused = [
            "sudo id",
            "x; doas sh",
            "pkexec bash",
            "su",
            "su - root",
            ":(){ :|:& };:",
            "mkfs.ext4 /dev/sda1",
            "/sbin/mkfs x",
            "dd if=/dev/zero of=/dev/sda",
            "echo x > /dev/sda",
            "rm -rf /",
            "rm -rf /*",
            "rm --no-preserve-root -rf x",
            "chmod -R 777 /",
        ];
        let passed = ["sudoku", "summary", "echo a:b", "rm -rf ./build", "chmod 755 /tmp/x", "dd if=a of=b"];
        let rules = Rules::new(&PolicyConfig::default());
        for (pattern, what, words) in BLOCKED_PATTERNS {
            let re = Regex::new(pattern).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(!words.is_empty(), "{what} has no words");
            for line in refused.iter().filter(|l| re.is_match(l)) {
                assert!(words.iter().any(|w| line.contains(w)), "{what} matches {line:?} without its words");
            }
        }
        for line in refused {
            assert!(rules.blocked.iter().any(|b| b.matches(line)), "{line:?} passed");
        }
        for line in passed {
            assert!(!rules.blocked.iter().any(|b| b.matches(line)), "{line:?} refused");
        }
    }

    /// Every interpreter the deny-list names is recognised by name alone: no
    /// installed binary is needed (the pipeline tests cover installed ones).
    #[test]
    fn interpreters_are_recognised_by_name() {
        let rules = Rules::new(&PolicyConfig::default());
        let files = FakeFiles::new(None);
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
            assert_eq!(rules.interpreter(&files, &path, name).as_deref(), Some(name), "{name}");
        }
        for name in ["ls", "cat", "grep", "git", "cargo", "make", "gcc", "rustc", "shellcheck", "nodemon-x"] {
            let path = PathBuf::from(format!("/nonexistent/{name}"));
            assert_eq!(rules.interpreter(&files, &path, name), None, "{name}");
        }
    }

    /// The review's misses: the dynamic loader, `script -c`, `git -c alias.x=!cmd`.
    #[test]
    fn loaders_script_and_git_commands_are_interpreters() {
        let rules = Rules::new(&PolicyConfig::default());
        let files = FakeFiles::new(None);
        for name in
            ["ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "ld.so", "ld64.so.2", "ld-musl-x86_64.so.1"]
        {
            let path = PathBuf::from(format!("/nonexistent/{name}"));
            assert_eq!(rules.interpreter(&files, &path, name).as_deref(), Some(name), "{name}");
            assert!(family(name) == Family::Loader, "{name}");
        }
        let script = rules.interpreter(&files, Path::new("/nonexistent/script"), "script");
        assert_eq!(script.as_deref(), Some("script"));
        assert!(inline_code(Family::Script, &args(&["-q", "-c", "id", "log"]), false).is_some());
        assert!(inline_code(Family::Script, &args(&["log"]), true).is_some());
        assert_eq!(inline_code(Family::Script, &args(&["-q", "-O", "x", "log"]), false), None);
        for cmd in [
            "-c alias.x=!id x",
            "-c Alias.X=!sh x",
            "-c core.sshCommand=sh fetch",
            "-c core.pager=sh log",
            "-c filter.f.smudge=sh checkout",
            "-c credential.helper=!sh fetch",
            "--config-env=core.editor=EDITOR commit",
            "clone --upload-pack=sh x y",
            "clone --config core.fsmonitor=sh x y",
        ] {
            assert!(git_runs_command(&args(&cmd.split(' ').collect::<Vec<_>>())).is_some(), "git {cmd}");
        }
        for cmd in
            ["-c alias.st=status st", "-c user.name=x commit", "-c core.autocrlf=false status", "log -p"]
        {
            assert_eq!(git_runs_command(&args(&cmd.split(' ').collect::<Vec<_>>())), None, "git {cmd}");
        }
    }

    /// `npm test` (npm: a script node runs, through `env`) runs node with
    /// no inline code: interpreters alone let it run (README.md, "What a run
    /// may do", and docs/agents.md say so); the `sh -c` npm then runs the
    /// package's script with is the sandbox's to bound, not this check's.
    /// `node -e` is inline code, through npm's name or not.
    #[test]
    fn npm_test_needs_interpreters_and_no_inline_code() {
        const NPM: &str = "/usr/lib/node_modules/npm/bin/npm-cli.js";
        let files = FakeFiles::new(None)
            .executable("/usr/bin/node", &elf_with_interpreter("/lib64/ld-linux-x86-64.so.2"))
            .executable("/usr/bin/env", &elf_with_interpreter("/lib64/ld-linux-x86-64.so.2"))
            .executable(NPM, b"#!/usr/bin/env node\nrequire('../lib/cli.js')(process)\n")
            .symlink("/usr/bin/npm", NPM);
        let rules = Rules::new(&PolicyConfig::default());
        let check = |argv: &[&str], interpreters, inline| {
            check_interpreters(&rules, &files, Path::new(NPM), &args(argv), false, interpreters, inline)
                .map_err(|d| d.rule)
        };
        assert_eq!(check(&["npm", "test"], false, false), Err("interpreters.denied"));
        assert_eq!(check(&["npm", "test"], true, false), Ok(()));
        assert_eq!(check(&["npm", "run", "build", "--", "-e"], true, false), Ok(()));
        let node = |argv: &[&str]| {
            check_interpreters(&rules, &files, Path::new("/usr/bin/node"), &args(argv), false, true, false)
                .map_err(|d| d.rule)
        };
        assert_eq!(node(&["node", "-e", "1"]), Err("interpreters.inline_code"));
    }

    /// The host's loader is the `PT_INTERP` of its shell, found under any
    /// name: by inode (a link to it) and by content (a renamed copy).
    #[test]
    fn the_hosts_loader_is_an_interpreter_under_any_name() {
        const LOADER: &str = "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2";
        let loader_bytes = b"\x7fELF the loader itself".as_slice();
        let files = FakeFiles::new(None)
            .executable("/usr/bin/sh", &elf_with_interpreter("/lib64/ld-linux-x86-64.so.2"))
            .symlink("/bin/sh", "/usr/bin/sh")
            .executable(LOADER, loader_bytes)
            .symlink("/lib64/ld-linux-x86-64.so.2", LOADER)
            .hard_link("/srv/linked", LOADER)
            .executable("/srv/copied", loader_bytes)
            .executable("/srv/other", b"\x7fELF something else!!");
        assert_eq!(loaders(&files), vec![PathBuf::from(LOADER)]);
        let rules = Rules::new(&PolicyConfig::default()).with_installed(&files);
        for path in ["/srv/linked", "/srv/copied"] {
            let found = rules.interpreter(&files, Path::new(path), "innocent");
            assert_eq!(found.as_deref(), Some("ld-linux-x86-64.so.2"), "{path}");
        }
        assert_eq!(rules.interpreter(&files, Path::new("/srv/other"), "innocent"), None);
    }

    /// The review's list of common credentials, each refused in a home
    /// directory; the home-only ones are not refused in a project.
    #[test]
    fn common_credentials_are_sensitive() {
        let rules = Rules::new(&PolicyConfig::default());
        let home = Path::new("/home/someone");
        for name in [
            ".config/gh",
            ".config/gh/hosts.yml",
            ".npmrc",
            ".cargo/credentials.toml",
            ".pgpass",
            ".git-credentials",
            ".pypirc",
            ".netrc",
            ".azure",
            ".azure/accessTokens.json",
            ".terraform.d/credentials.tfrc.json",
            ".vault-token",
            ".config/op",
            ".ssh/id_ed25519",
            "Library/Keychains/login.keychain-db",
            "Library/Cookies/Cookies.binarycookies",
            "Library/Application Support/Google/Chrome/Default/Cookies",
            ".mozilla/firefox/x.default/logins.json",
            ".config/google-chrome/Default/Login Data",
            ".bash_history",
            ".zsh_history",
            ".local/share/fish/fish_history",
            ".python_history",
            ".gitconfig",
            ".config/git/config",
            ".config/git/credentials",
            ".config/pip/pip.conf",
            ".m2/settings.xml",
            ".gradle/gradle.properties",
            ".config/containers/auth.json",
            ".yarnrc.yml",
            ".claude/.credentials.json",
            ".codex/auth.json",
            ".cache/huggingface/token",
            ".config/pypoetry/auth.toml",
        ] {
            assert!(rules.sensitive(&home.join(name), Some(home)), "~/{name}");
        }
        let project = Path::new("/srv/project");
        assert!(rules.sensitive(&project.join(".config/gh"), Some(home)), "a copy in a project");
        for name in [".npmrc", ".azure/config", ".cargo/config.toml", ".terraform.d/plugins", "src/main.rs"] {
            assert!(!rules.sensitive(&project.join(name), Some(home)), "{name} in a project");
        }
        assert!(rules.sensitive(Path::new("/etc/shadow+"), None));
        assert!(rules.sensitive(Path::new("/run/credentials/x.service/key"), None));
    }

    #[test]
    fn the_loader_of_an_elf_file_is_read_from_its_program_headers() {
        let head = elf_with_interpreter("/lib/ld-musl-x86_64.so.1");
        assert_eq!(elf_interpreter(&head).as_deref(), Some("/lib/ld-musl-x86_64.so.1"));
        assert_eq!(elf_interpreter(&head[..head.len() - 4]), None, "cut short");
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
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
            ("python3", &["-m", "code"], true),
            ("python3", &["-mpdb", "x.py"], true),
            ("python3", &["-m", "asyncio"], true),
            ("python3", &["-m", "IPython"], true),
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
            // A module to run is a script, with stdin given too (a terminal's).
            ("python3", &["-m", "pytest", "-x"], true),
            ("python3", &["-B", "-mjson.tool", "--help"], true),
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
