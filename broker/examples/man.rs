//! Writes palisade's manual pages from the CLI's own definitions (the clap
//! structs of `palisade` and `palisaded`): palisade(1), a page for each of
//! its subcommands (palisade-run(1), palisade-audit-verify(1), ...), and
//! palisaded(8). scripts/build-deb.sh installs them, gzipped; an example, so
//! that the generator is never linked into the binaries.
//!
//!   cargo run -p palisade-broker --example man -- OUT_DIR [--date YYYY-MM-DD]
//!
//! The date (the pages' last change, in their header) is the caller's, so
//! that the same tree gives the same pages; none by default.

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    match pages::write_all(std::env::args_os().skip(1).collect()) {
        Ok(written) => {
            println!("man: {written} pages");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("man: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The pages describe the Linux binaries, the only ones the package ships.
#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    eprintln!("man: the manual pages describe palisade on Linux; generate them there");
    std::process::ExitCode::FAILURE
}

#[cfg(target_os = "linux")]
mod pages {
    use clap::CommandFactory;
    use clap_mangen::Man;
    use clap_mangen::roff::{Roff, bold, italic, roman};
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};

    /// What every page's header names as its source and manual.
    const MANUAL: &str = "palisade manual";
    /// Where the package installs the documents the pages point to.
    const DOC_DIR: &str = "/usr/share/doc/palisade";

    struct Options {
        out: PathBuf,
        date: String,
    }

    fn options(args: Vec<OsString>) -> Result<Options, String> {
        let usage = "usage: man OUT_DIR [--date YYYY-MM-DD]";
        let mut out = None;
        let mut date = String::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--date" {
                let value = args.next().ok_or("--date needs a value")?;
                date = value.into_string().map_err(|_| "--date: not UTF-8")?;
                let shape = date.len() == 10
                    && date
                        .bytes()
                        .enumerate()
                        .all(|(i, b)| if i == 4 || i == 7 { b == b'-' } else { b.is_ascii_digit() });
                if !shape {
                    return Err(format!("--date {date}: not YYYY-MM-DD"));
                }
            } else if out.is_none() && !arg.to_string_lossy().starts_with('-') {
                out = Some(PathBuf::from(arg));
            } else {
                return Err(format!("unexpected argument {}; {usage}", arg.to_string_lossy()));
            }
        }
        Ok(Options { out: out.ok_or(usage)?, date })
    }

    /// Writes every page into the output directory; how many.
    pub fn write_all(args: Vec<OsString>) -> Result<usize, String> {
        let options = options(args)?;
        std::fs::create_dir_all(&options.out).map_err(|e| format!("{}: {e}", options.out.display()))?;
        let mut cli = palisade_broker::cli::Cli::command().disable_help_subcommand(true);
        cli.build();
        let mut written = 0;
        write_tree(&cli, None, &options, &mut written)?;
        let mut daemon = palisade_broker::serve::daemon::Args::command();
        daemon.build();
        let sections = [files(), environment(), see_also(&["palisade(1)"])];
        write_page(&daemon, "8", &sections, &options)?;
        Ok(written + 1)
    }

    /// The page of `cmd` (section 1) and those of its subcommands.
    fn write_tree(
        cmd: &clap::Command,
        parent: Option<&str>,
        options: &Options,
        written: &mut usize,
    ) -> Result<(), String> {
        let name = page_name(cmd);
        let subcommands: Vec<&clap::Command> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
        let mut related: Vec<String> = parent.map(|p| format!("{p}(1)")).into_iter().collect();
        related.extend(subcommands.iter().map(|s| format!("{}(1)", page_name(s))));
        related.push("palisaded(8)".into());
        let related: Vec<&str> = related.iter().map(String::as_str).collect();
        let mut sections = vec![];
        if parent.is_none() {
            sections.push(environment());
        }
        sections.push(see_also(&related));
        write_page(cmd, "1", &sections, options)?;
        *written += 1;
        for sub in subcommands {
            write_tree(sub, Some(&name), options, written)?;
        }
        Ok(())
    }

    /// `palisade-audit-verify` for `palisade audit verify` (clap's display name).
    fn page_name(cmd: &clap::Command) -> String {
        cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_string()
    }

    /// clap_mangen's page of `cmd`, then the sections it cannot know.
    fn write_page(
        cmd: &clap::Command,
        section: &str,
        extra: &[Roff],
        options: &Options,
    ) -> Result<(), String> {
        let version = cmd.get_version().unwrap_or(env!("CARGO_PKG_VERSION"));
        let man = Man::new(cmd.clone())
            .section(section)
            .date(options.date.as_str())
            .source(format!("palisade {version}"))
            .manual(MANUAL);
        let path = options.out.join(man.get_filename());
        let mut page = Vec::new();
        man.render(&mut page).map_err(|e| format!("{}: {e}", path.display()))?;
        for roff in extra {
            roff.to_writer(&mut page).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        write(&path, &page)
    }

    fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
        std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A section of term/description pairs.
    fn list(heading: &str, items: &[(&str, &str)]) -> Roff {
        let mut roff = Roff::new();
        roff.control("SH", [heading]);
        for (term, text) in items {
            roff.control("TP", []).text([bold(*term)]).text([roman(*text)]);
        }
        roff
    }

    fn files() -> Roff {
        list(
            "FILES",
            &[
                (
                    "/etc/palisade/palisade.toml",
                    "The system broker's configuration (palisade.service's --config).",
                ),
                (
                    "/usr/share/doc/palisade/examples/palisade.example.toml",
                    "Every configuration key with its default and its meaning.",
                ),
                (
                    "/run/palisade/palisade.sock",
                    "The system broker's socket (a broker that serves other users: root, or palisade.service's \
                     user palisade holding CAP_SETUID), unless --socket names another; /var/run/palisade.sock \
                     on macOS.",
                ),
                (
                    "/var/lib/palisade",
                    "The system broker's state: the audit journal, trust stages, held change sets, skills and \
                     secrets. The user palisade's, mode 0700 (the package's tmpfiles.d entry and the unit's \
                     StateDirectory=); a journal reader_gid may pass through it, search only.",
                ),
                (
                    "$XDG_RUNTIME_DIR/palisade/palisade.sock, $XDG_STATE_HOME/palisade",
                    "The socket and state of a user's own broker, which serves its own uid only.",
                ),
            ],
        )
    }

    fn environment() -> Roff {
        list(
            "ENVIRONMENT",
            &[
                ("PALISADE_SOCKET", "The broker socket the client uses when --socket is not given."),
                ("PALISADE_LOG", "The log filter (tracing's syntax: info, debug, palisade_broker=trace)."),
                (
                    "PALISADE_STATE",
                    "Another state directory (absolute): journal, trust stages, change sets, skills.",
                ),
                ("PALISADE_JOURNAL", "Another directory for the audit journal alone."),
            ],
        )
    }

    fn see_also(pages: &[&str]) -> Roff {
        let mut roff = Roff::new();
        roff.control("SH", ["SEE ALSO"]);
        let mut line = vec![];
        for (i, page) in pages.iter().enumerate() {
            if i > 0 {
                line.push(roman(", "));
            }
            line.push(bold(*page));
        }
        roff.text(line);
        roff.control("PP", []).text([
            roman("The documentation in "),
            italic(DOC_DIR),
            roman(": README.md (installing, the daemon, policy, the system service), docs/protocol.md, "),
            roman("docs/journal.md, docs/security.md and ARCHITECTURE.md."),
        ]);
        roff
    }
}
