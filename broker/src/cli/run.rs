//! `palisade run`'s broker side: the embedded broker's profile edited by
//! the flags, and a run's messages shown as they come. The arguments, the
//! request and how a run is shown are the CLI's own (`palisade_cli`).

use crate::engine::stream::{Piece, Sink, StdinPieces};
pub use palisade_cli::args::{RunArgs, SandboxArgs, own_umask, request};
pub use palisade_cli::render::{EXIT_PALISADE, Render, approved_line, fail, summary};
use palisade_protocol::wire::{KeepChanges, RunRequest, ServerMessage, Stream};

/// The embedded broker's policy, edited: the profile grants what the
/// flags ask for (the person running the CLI owns it).
pub fn edit(
    flags: &SandboxArgs,
    config: &mut palisade_policy::Config,
    cwd: &std::path::Path,
) -> Result<(), String> {
    use palisade_policy::capabilities::NetworkCapability;
    // The person running the CLI owns this policy: its refusals name the flags.
    config.own = true;
    // Strict egress's ports and refused addresses are `[egress]`'s, for every profile.
    for port in &flags.allow_ports {
        if !config.egress.ports.contains(port) {
            config.egress.ports.push(*port);
        }
    }
    let addresses = flags.allow_addresses.iter().map(|a| toml::Spanned::new(0..0, a.clone()));
    config.egress.allow_addresses.extend(addresses);
    let profile = profile_mut(config, flags.profile.as_deref())?;
    profile.allow_interpreters |= flags.allow_interpreters;
    profile.allow_inline_code |= flags.allow_inline_code;
    if !flags.allow_domains.is_empty() {
        let mut domains = match &profile.network {
            NetworkCapability::AllowDomains(d) => d.clone(),
            _ => vec![],
        };
        domains.extend(flags.allow_domains.iter().cloned());
        if profile.network != NetworkCapability::AllowAll {
            profile.network = NetworkCapability::AllowDomains(domains);
        }
        profile.egress = palisade_policy::egress::EgressMode::Strict;
    }
    profile.read_only.extend(flags.read_only.iter().map(|p| cwd.join(p)));
    profile.read_write.extend(flags.read_write.iter().map(|p| cwd.join(p)));
    profile.pass_env.extend(flags.env.iter().map(|e| e.split('=').next().unwrap_or(e).to_string()));
    profile.max_memory_mb = flags.memory.unwrap_or(profile.max_memory_mb);
    profile.max_processes = flags.processes.unwrap_or(profile.max_processes);
    profile.no_fork |= flags.no_fork;
    profile.toolchains &= !flags.no_toolchains;
    if flags.hold_changes {
        profile.keep_changes = KeepChanges::AlwaysHold;
    }
    profile.on_conflict = flags.on_conflict.unwrap_or(profile.on_conflict);
    if flags.direct {
        profile.disk = palisade_policy::config::DiskMode::Direct;
    }
    Ok(())
}

/// The embedded broker's profile, its deadline and output quota raised to
/// what `--timeout` and `--max-output` ask (the person running the CLI owns
/// it), up to the profile's ceilings (`timeout_ceiling_secs`,
/// `max_output_ceiling_bytes`); past one, or 0, the run is refused, naming
/// the ceiling. Never capped silently.
pub fn raise_limits(args: &RunArgs, config: &mut palisade_policy::Config) -> Result<(), String> {
    // A declared tool keeps its own limits: its request is checked against them.
    if args.tool.is_some() {
        return Ok(());
    }
    let profile = profile_mut(config, args.sandbox.profile.as_deref())?;
    let table = args.sandbox.profile.as_ref().map_or("[defaults]".to_string(), |p| format!("[profiles.{p}]"));
    for (flag, asked, value, ceiling, key) in [
        (
            "--timeout",
            args.timeout,
            &mut profile.max_execution_time,
            profile.timeout_ceiling_secs,
            "timeout_ceiling_secs",
        ),
        (
            "--max-output",
            args.max_output,
            &mut profile.max_output_bytes,
            profile.max_output_ceiling_bytes,
            "max_output_ceiling_bytes",
        ),
    ] {
        match asked {
            Some(0) => return Err(format!("{flag} 0: must be at least 1")),
            Some(a) if a > ceiling => {
                return Err(format!(
                    "{flag} {a} is above the profile's ceiling of {ceiling} ({table} {key}); raise it there"
                ));
            }
            Some(a) if a > *value => *value = a,
            _ => {}
        }
    }
    Ok(())
}

/// The profile `--profile` names (`[defaults]` without it), to edit.
fn profile_mut<'a>(
    config: &'a mut palisade_policy::Config,
    name: Option<&str>,
) -> Result<&'a mut palisade_policy::config::DefaultProfile, String> {
    match name {
        None => Ok(&mut config.defaults),
        Some(name) => config
            .profiles
            .get_mut(name)
            .ok_or_else(|| format!("--profile {name}: the policy declares no [profiles.{name}]")),
    }
}

/// A run's messages, shown by `Render` as the embedded broker sends them;
/// and its stdin, when this process's own is streamed to it ([`own_input`]).
pub struct RenderSink<'a> {
    render: &'a mut Render,
    stdin: Option<StdinPieces>,
    /// The run is in a terminal: this one is in raw mode from its start.
    terminal: bool,
    #[cfg(unix)]
    raw: Option<palisade_cli::tty::Raw>,
}

impl<'a> RenderSink<'a> {
    pub fn new(render: &'a mut Render, stdin: Option<StdinPieces>, terminal: bool) -> RenderSink<'a> {
        RenderSink {
            render,
            stdin,
            terminal,
            #[cfg(unix)]
            raw: None,
        }
    }
}

/// This process's stdin as a run's streamed input (`request.stdin_streamed`),
/// read by a thread of its own from [`OwnInput::start`] on, at the pace the
/// command takes it (any size: it is never held whole); with `no_stdin`,
/// none. In a terminal, its end is said (the terminal takes no more input)
/// and this terminal's resizes follow from now: call it before any other
/// thread starts (see `tty::on_resize`).
pub fn own_input(request: &RunRequest, no_stdin: bool) -> Option<OwnInput> {
    if !request.stdin_streamed {
        return None;
    }
    let (tx, rx) = tokio::sync::mpsc::channel(OWN_STDIN_PIECES_QUEUED);
    let terminal = request.terminal.is_some();
    #[cfg(unix)]
    if terminal {
        let resizes = tx.clone();
        palisade_cli::tty::on_resize(move |size| resizes.blocking_send(Piece::Resize(size)).is_ok());
    }
    Some(OwnInput { tx, rx, no_stdin, terminal })
}

/// This process's stdin, to be read for a run (see [`own_input`]).
pub struct OwnInput {
    tx: tokio::sync::mpsc::Sender<Piece>,
    rx: StdinPieces,
    no_stdin: bool,
    terminal: bool,
}

impl OwnInput {
    /// Reads this process's stdin from now on (not before: an approval's
    /// question is answered on the terminal first), as the run's pieces.
    pub fn start(self) -> StdinPieces {
        let OwnInput { tx, rx, no_stdin, terminal } = self;
        std::thread::spawn(move || {
            let sent = |piece: &[u8]| tx.blocking_send(Piece::Data(piece.to_vec())).is_ok();
            // Unreadable: said, and the command reads end of file there.
            let read = match no_stdin {
                true => Ok(true),
                false => palisade_cli::args::read_pieces(&mut std::io::stdin().lock(), sent),
            };
            if let Err(e) = read {
                eprintln!("palisade: reading stdin: {e}: the command's stdin ends here");
            }
            if terminal {
                let _ = tx.blocking_send(Piece::End);
            }
        });
        rx
    }
}

/// How many pieces of this process's stdin wait for the command ahead of
/// its reading.
const OWN_STDIN_PIECES_QUEUED: usize = 4;

impl Sink for RenderSink<'_> {
    fn take_stdin(&mut self) -> Option<StdinPieces> {
        self.stdin.take()
    }

    async fn send(&mut self, msg: ServerMessage) -> bool {
        match msg {
            ServerMessage::Output { stream, data } => self.send_output(stream, &data).await,
            other => {
                #[cfg(unix)]
                if self.terminal && matches!(other, ServerMessage::Started { .. }) {
                    self.raw = palisade_cli::tty::Raw::enter();
                }
                self.render.on(&other);
                true
            }
        }
    }

    /// Written asynchronously (tokio writes the standard streams from its
    /// blocking pool): a reader of ours that stalls must not stall the run's
    /// deadline with it.
    async fn send_output(&mut self, stream: Stream, data: &[u8]) -> bool {
        use tokio::io::AsyncWriteExt;
        if self.render.json() {
            self.render.output(stream, data);
            return true;
        }
        // tokio hands the bytes to a blocking thread: the flush waits until they
        // are written (in order across the two streams, and before exit).
        async fn write(mut out: impl tokio::io::AsyncWrite + Unpin, data: &[u8]) -> std::io::Result<()> {
            out.write_all(data).await?;
            out.flush().await
        }
        match stream {
            // The reader of stdout gone (EPIPE: `palisade run ... | head`)
            // ends the run (cancelled, its writes held), as SIGPIPE ends a
            // command whose reader left; Render says so and exits as SIGPIPE would.
            Stream::Stdout => match write(tokio::io::stdout(), data).await {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    self.render.reader_gone();
                    false
                }
                _ => true,
            },
            Stream::Stderr => {
                let _ = write(tokio::io::stderr(), data).await;
                true
            }
        }
    }
}
