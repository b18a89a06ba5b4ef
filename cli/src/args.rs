//! The arguments of `palisade run` and `palisade explain`, and the request
//! they make: what the CLI and the broker's side of it (`palisaded cli`)
//! both read.

use clap::Args as ClapArgs;
use palisade_protocol::wire::{KeepChanges, OnConflict, ParamValue, RunRequest};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub struct RunArgs {
    /// Broker socket [default: $PALISADE_SOCKET, else your broker's, else
    /// the system broker's; an embedded broker runs when none answers,
    /// unless the system configuration requires the system broker].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The writable workspace [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Policy file: run with an embedded broker under this policy.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Deadline in seconds. Through a daemon it can only lower the
    /// policy's; an embedded broker's is raised to it, up to the profile's
    /// timeout_ceiling_secs (above that, or 0: refused).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Output quota in bytes, stdout and stderr together. Through a daemon
    /// it can only lower the policy's; an embedded broker's is raised to
    /// it, up to the profile's max_output_ceiling_bytes (above that, or 0:
    /// refused).
    #[arg(long = "max-output", value_name = "BYTES")]
    pub max_output: Option<u64>,
    /// Print the result and its attestation as one JSON object: "result"
    /// (or "error" for a refusal or failure), "broker" (which ran it),
    /// and each stream as "stdout"/"stderr" text when it is UTF-8, else
    /// its bytes as "stdout_base64"/"stderr_base64".
    #[arg(long)]
    pub json: bool,
    /// Give the command an empty stdin. Without it, palisade's stdin, when it
    /// is not a terminal or /dev/null, is streamed to the command while it
    /// runs (any size, at the pace it reads; code on it is inline code).
    #[arg(short = 'n', long = "no-stdin")]
    pub no_stdin: bool,
    /// Run the command in a terminal of its own, this terminal's size
    /// (the default, on Linux, when stdin and stdout are terminals and
    /// neither --json nor --no-stdin is given): its output is what a
    /// person sees, keys (Ctrl-C, Ctrl-Z) and resizes reach it.
    #[arg(short = 't', long = "tty", conflicts_with = "no_tty")]
    pub tty: bool,
    /// No terminal: stdin, stdout and stderr stay pipes.
    #[arg(short = 'T', long = "no-tty")]
    pub no_tty: bool,
    /// Run as a tool declared in the policy.
    #[arg(long, value_name = "NAME")]
    pub tool: Option<String>,
    /// A tool parameter, NAME=PATH (repeat NAME for a list).
    #[arg(long = "param", value_name = "NAME=PATH")]
    pub params: Vec<String>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What the sandbox may do. With an embedded broker, or the user's own
/// daemon (`[broker] owner_widens`), the person running the CLI owns the
/// policy: these flags edit the profile (`[defaults]`, or `--profile`'s)
/// before the run. Through the system broker, a request can only narrow
/// its policy: a flag that would widen it is refused, naming the flag and
/// the key an operator would change.
#[derive(ClapArgs, Debug, Default, Clone)]
#[command(
    next_help_heading = "Sandbox (embedded or your own daemon: edits the profile; the system broker: may only narrow it)"
)]
pub struct SandboxArgs {
    /// Use the profile the configuration declares as [profiles.NAME] instead of [defaults].
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Let interpreters run (shells, python3, node, ...).
    #[arg(long)]
    pub allow_interpreters: bool,
    /// Let inline code run (`sh -c`, `python3 -c`, a script on stdin).
    #[arg(long)]
    pub allow_inline_code: bool,
    /// Let the command reach this host name, exact or *.suffix (repeatable):
    /// through the egress proxy, enforced by the kernel (strict egress).
    #[arg(long = "allow-domain", value_name = "NAME")]
    pub allow_domains: Vec<String>,
    /// Let strict egress connect to PORT too, beside `[egress] ports`
    /// (443 and 80 unless set) (repeatable).
    #[arg(long = "allow-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub allow_ports: Vec<u16>,
    /// Let strict egress connect to ADDR, an IP address or CIDR range it
    /// otherwise refuses as loopback, private, link-local, multicast or
    /// unspecified (a dev server's 127.0.0.1, say), beside `[egress]
    /// allow_addresses` (repeatable).
    #[arg(long = "allow-address", value_name = "ADDR")]
    pub allow_addresses: Vec<String>,
    /// Make PATH visible read-only (repeatable).
    #[arg(long = "read-only", value_name = "PATH")]
    pub read_only: Vec<PathBuf>,
    /// Make PATH writable, as the workspace is (repeatable; it must exist).
    #[arg(long = "read-write", value_name = "PATH")]
    pub read_write: Vec<PathBuf>,
    /// Pass variable NAME to the command: its value here, or VALUE (repeatable).
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// Memory limit in MiB.
    #[arg(long, value_name = "MB")]
    pub memory: Option<u64>,
    /// Limit on the number of processes.
    #[arg(long, value_name = "N")]
    pub processes: Option<u64>,
    /// No new processes: fork and clone are refused.
    #[arg(long)]
    pub no_fork: bool,
    /// Do not make the command's toolchain visible (its `#!` interpreters
    /// and where they are installed under a home: pyenv, nvm, rustup, ...).
    #[arg(long)]
    pub no_toolchains: bool,
    /// Hold the run's writes as a change set for review instead of applying
    /// them (palisade changes show ID, apply ID, discard ID).
    #[arg(long)]
    pub hold_changes: bool,
    /// A path someone else changed in the workspace while the run ran:
    /// keep_host (the default: the run's version is held), hold (apply
    /// nothing), overwrite (the run's version wins).
    #[arg(long, value_name = "WHAT", value_parser = on_conflict)]
    pub on_conflict: Option<OnConflict>,
    /// Write the workspace in place, live (no change set: nothing to review,
    /// no conflict found); the profile must allow it (allow_direct). What
    /// the host executes there (git directories, .envrc, ...) stays
    /// read-only, and what the run makes of it is held (exit 123).
    #[arg(long)]
    pub direct: bool,
}

fn on_conflict(s: &str) -> Result<OnConflict, String> {
    match s {
        "keep_host" => Ok(OnConflict::KeepHost),
        "hold" => Ok(OnConflict::Hold),
        "overwrite" => Ok(OnConflict::Overwrite),
        other => Err(format!("{other:?}: one of keep_host, hold, overwrite")),
    }
}

impl SandboxArgs {
    /// The flags a declared tool's run carries where these are a server's
    /// for all its calls (`palisade mcp`): a tool runs as declared, under
    /// its own table rather than `--profile`'s (a request naming both is
    /// refused) and never widened, so of the rest only what can only make
    /// its run smaller or keep its writes off the host goes with it:
    /// `--hold-changes`, `--no-fork` and `--no-toolchains`.
    pub fn for_tool(&self) -> SandboxArgs {
        SandboxArgs {
            hold_changes: self.hold_changes,
            no_fork: self.no_fork,
            no_toolchains: self.no_toolchains,
            ..SandboxArgs::default()
        }
    }

    /// The request's asks: what the daemon checks against its policy.
    pub fn ask(&self, req: &mut RunRequest, cwd: &std::path::Path) -> Result<(), String> {
        let absolute = |paths: &[PathBuf]| -> Vec<String> {
            paths.iter().map(|p| cwd.join(p).to_string_lossy().into_owned()).collect()
        };
        req.profile = self.profile.clone();
        req.allow_interpreters = self.allow_interpreters;
        req.allow_inline_code = self.allow_inline_code;
        req.allow_domains = (!self.allow_domains.is_empty()).then(|| self.allow_domains.clone());
        req.allow_ports = self.allow_ports.clone();
        req.allow_addresses = self.allow_addresses.clone();
        req.read_only = absolute(&self.read_only);
        req.read_write = absolute(&self.read_write);
        req.max_memory_mb = self.memory;
        req.max_processes = self.processes;
        req.no_fork = self.no_fork;
        req.no_toolchains = self.no_toolchains;
        req.keep_changes = self.hold_changes.then_some(KeepChanges::AlwaysHold);
        req.on_conflict = self.on_conflict;
        req.direct = self.direct;
        for spec in &self.env {
            let (name, value) = match spec.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (spec.as_str(), None),
            };
            if name.is_empty() {
                return Err(format!("--env {spec}: expected NAME or NAME=VALUE"));
            }
            match value {
                Some(v) => {
                    req.env.insert(name.into(), v.into());
                }
                None if !req.env.contains_key(name) => {
                    return Err(format!("--env {name}: {name} is not set here (give it as {name}=VALUE)"));
                }
                None => {}
            }
            req.pass_env.push(name.into());
        }
        Ok(())
    }
}

pub fn params(pairs: &[String]) -> Result<std::collections::BTreeMap<String, ParamValue>, String> {
    let mut out: std::collections::BTreeMap<String, ParamValue> = Default::default();
    for p in pairs {
        let (k, v) = p.split_once('=').ok_or_else(|| format!("--param {p}: expected NAME=PATH"))?;
        let value = match out.remove(k) {
            None => ParamValue::One(v.into()),
            Some(ParamValue::One(first)) => ParamValue::Many(vec![first, v.into()]),
            Some(ParamValue::Many(mut all)) => {
                all.push(v.into());
                ParamValue::Many(all)
            }
        };
        out.insert(k.into(), value);
    }
    Ok(out)
}

/// Whether `palisade run` gives the command its own stdin, streamed while
/// it runs: unless `--no-stdin`, or the stdin is a terminal, `/dev/null`
/// or closed (the command's is then empty: no code on stdin to judge).
pub fn streams_stdin(args: &RunArgs) -> bool {
    let stdin = std::io::stdin();
    !args.no_stdin && !stdin.is_terminal() && !is_dev_null(&stdin)
}

/// The most one piece of a streamed stdin holds.
pub const STDIN_PIECE_BYTES: usize = 64 * 1024;

/// Reads `source` in pieces of at most [`STDIN_PIECE_BYTES`], each passed
/// to `each` as it comes (`false` from it: stop there). `Ok(true)`: read
/// to its end; `Ok(false)`: stopped; a read error (an interruption is
/// retried) ends it.
pub fn read_pieces(
    source: &mut dyn std::io::Read,
    mut each: impl FnMut(&[u8]) -> bool,
) -> std::io::Result<bool> {
    let mut buf = vec![0u8; STDIN_PIECE_BYTES];
    loop {
        match source.read(&mut buf) {
            Ok(0) => return Ok(true),
            Ok(n) if !each(&buf[..n]) => return Ok(false),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Whether `stdin` is `/dev/null` (or closed: nothing to read either).
#[cfg(unix)]
pub(crate) fn is_dev_null(stdin: &std::io::Stdin) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let own = std::os::fd::AsFd::as_fd(stdin)
        .try_clone_to_owned()
        .and_then(|fd| std::fs::File::from(fd).metadata());
    let Ok(own) = own else { return true };
    let null = std::fs::metadata("/dev/null");
    own.file_type().is_char_device() && null.is_ok_and(|n| n.rdev() == own.rdev())
}

#[cfg(not(unix))]
pub(crate) fn is_dev_null(_: &std::io::Stdin) -> bool {
    false
}

/// The terminal a run asks for (see `tty::wanted`): none where palisade
/// has no terminal to give.
#[cfg(unix)]
fn terminal(args: &RunArgs) -> Option<palisade_protocol::wire::WindowSize> {
    crate::tty::wanted(args.tty, args.no_tty, args.json || args.no_stdin)
}

#[cfg(not(unix))]
fn terminal(_: &RunArgs) -> Option<palisade_protocol::wire::WindowSize> {
    None
}

/// The run `args` ask for; its stdin is not part of it: it is streamed
/// where [`streams_stdin`] says so (`stdin_streamed`), and always in a
/// terminal (its keyboard).
pub fn request(args: &RunArgs) -> Result<RunRequest, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let terminal = terminal(args);
    let mut req = RunRequest {
        argv: args.command.clone(),
        env: std::env::vars().collect(),
        cwd: Some(cwd.to_string_lossy().into_owned()),
        workspace: args.workspace.as_ref().map(|w| cwd.join(w).to_string_lossy().into_owned()),
        stdin_streamed: terminal.is_some() || streams_stdin(args),
        terminal,
        timeout_secs: args.timeout,
        max_output_bytes: args.max_output,
        tool: args.tool.clone(),
        params: params(&args.params)?,
        umask: own_umask(),
        ..RunRequest::default()
    };
    args.sandbox.ask(&mut req, &cwd)?;
    Ok(req)
}

/// This process's umask, which a request carries so that what the command
/// creates gets the modes it would get here: read from `/proc/self/status`
/// (Linux 4.7 and later), which changes nothing (setting it to read it
/// back would change it for every thread meanwhile). `None` where it cannot
/// be read: the broker's own umask applies.
pub fn own_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(field.trim(), 8).ok()
}

#[derive(ClapArgs, Debug)]
pub struct ExplainArgs {
    /// Broker socket to ask [default: $PALISADE_SOCKET, else your broker's,
    /// else the system broker's; the built-in policy decides when none
    /// answers, unless the system configuration requires the system broker].
    #[arg(long, value_name = "PATH", conflicts_with = "policy")]
    pub socket: Option<PathBuf>,
    /// Policy file: decide with it here, instead of asking a running broker.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The writable workspace [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// A tool declared in the policy.
    #[arg(long, value_name = "NAME")]
    pub tool: Option<String>,
    /// A tool parameter, NAME=PATH (repeat NAME for a list).
    #[arg(long = "param", value_name = "NAME=PATH")]
    pub params: Vec<String>,
    /// Print the decision as one JSON object (docs/protocol.md, "Explain",
    /// and `by`: which broker decided); an error as `{"error": ...}`.
    #[arg(long)]
    pub json: bool,
    /// Deadline in seconds, as `palisade run --timeout`.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Output quota in bytes, as `palisade run --max-output`.
    #[arg(long = "max-output", value_name = "BYTES")]
    pub max_output: Option<u64>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The run `palisade explain` asks about: `args`' flags, as `palisade run`
/// takes them, with no stdin and no terminal.
pub fn explain_run(args: ExplainArgs) -> RunArgs {
    RunArgs {
        socket: args.socket,
        workspace: args.workspace,
        policy: args.policy,
        timeout: args.timeout,
        max_output: args.max_output,
        json: args.json,
        no_stdin: true,
        tty: false,
        no_tty: true,
        tool: args.tool,
        params: args.params,
        sandbox: args.sandbox,
        command: args.command,
    }
}

/// Where the approval and tool commands find the broker.
#[derive(ClapArgs, Debug)]
pub struct BrokerArgs {
    /// Broker socket [default: $PALISADE_SOCKET, else your broker's, else the
    /// system broker's].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}
