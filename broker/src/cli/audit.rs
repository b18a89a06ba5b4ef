//! `palisade audit`: the audit journal read for people and checked for
//! tools (`verify`, `head`, `show`, `tail`).

use crate::journal::{self, Record, verify};
use clap::{Args, Subcommand};
use palisade_protocol::wire::{ErrorKind, ErrorReply};
use std::path::PathBuf;
use std::time::Duration;

/// Exit status when a record does not chain on the one before it.
pub const EXIT_BROKEN: i32 = 1;
/// Exit status when there is no journal, or the command line is wrong
/// (clap's own status for that, too).
pub const EXIT_UNREADABLE: i32 = 2;
/// Exit status when records before the first were removed and no record in
/// the chain says retention removed them (without `--allow-pruned`).
pub const EXIT_PRUNED: i32 = 3;
/// Exit status when the head given with `--head` is not in the journal.
pub const EXIT_HEAD_MISSING: i32 = 4;
/// Exit status when the journal, or a segment of it, is there but this
/// user may not read it (the message names the permission that refuses
/// it): nothing is known of its chain, which is not "broken".
pub const EXIT_CANNOT_READ: i32 = 5;
/// How often `tail -f` looks for new records.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);
/// Fields every record has; a record's line for people shows the others.
const CHAIN_FIELDS: [&str; 6] = ["seq", "time", "prev", "hash", "event", "broker"];

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Check every segment: each record's seq, prev and hash. Exits 0 when
    /// the chain is whole, 1 naming the first broken record (seq, file,
    /// line), 2 when there is no journal, 3 when records before the first
    /// were removed and no retention record says so, 4 when the head given
    /// with --head is not in the journal, 5 when the journal is there but
    /// this user may not read it (naming the permission that refuses it).
    Verify {
        /// A head kept elsewhere (`palisade audit head`, or the broker's log
        /// line `journal head SEQ HASH`): it must still be in the chain.
        #[arg(long, value_name = "HASH")]
        head: Option<String>,
        /// Records before the first may have been removed without a
        /// retention record saying so (segments removed by hand): say so and
        /// exit 0 rather than 3.
        #[arg(long)]
        allow_pruned: bool,
        #[command(flatten)]
        at: JournalDir,
        /// Print the outcome as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Print the last record's seq and hash, to keep elsewhere for `verify --head`.
    Head {
        #[command(flatten)]
        at: JournalDir,
        /// Print them as a JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Print the records of one run (every broker's run with that id), or
    /// with --path the records of the writes that touched a file: which
    /// run wrote it, and what became of it (applied, held, discarded).
    Show {
        /// The run's id (the result's `run_id`).
        #[arg(required_unless_present = "path")]
        run_id: Option<u64>,
        /// A file (or directory) of a workspace: the `changes` records that
        /// name it, with each run's own records.
        #[arg(long, value_name = "PATH", conflicts_with = "run_id")]
        path: Option<std::path::PathBuf>,
        #[command(flatten)]
        at: JournalDir,
        /// One JSON record a line, as the journal has them.
        #[arg(long)]
        json: bool,
    },
    /// Print the last records, and with -f the new ones as they come.
    Tail {
        /// How many records.
        #[arg(short = 'n', default_value_t = 10)]
        n: usize,
        /// Keep printing records as they are appended.
        #[arg(short = 'f', long)]
        follow: bool,
        #[command(flatten)]
        at: JournalDir,
        /// One JSON record a line, as the journal has them.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
pub struct JournalDir {
    /// The journal's directory [default: $PALISADE_JOURNAL, else yours
    /// ($XDG_STATE_HOME/palisade/journal; /var/lib/palisade/journal for
    /// root), else, when you have none, the system broker's].
    #[arg(long, value_name = "DIR")]
    journal: Option<PathBuf>,
    /// The system broker's journal: [journal] path of the system
    /// configuration (/etc/palisade/palisade.toml, or
    /// $PALISADE_SYSTEM_CONFIG), else /var/lib/palisade/journal.
    #[arg(long, conflicts_with = "journal")]
    system: bool,
}

/// Why there is no journal to read: none there (exit 2), or one this user
/// may not read (exit 5).
enum NoJournal {
    Missing(String),
    CannotRead(String),
}

impl NoJournal {
    fn status(&self) -> i32 {
        match self {
            NoJournal::Missing(_) => EXIT_UNREADABLE,
            NoJournal::CannotRead(_) => EXIT_CANNOT_READ,
        }
    }

    fn message(self) -> String {
        match self {
            NoJournal::Missing(m) | NoJournal::CannotRead(m) => m,
        }
    }
}

impl JournalDir {
    fn dir(&self) -> Result<PathBuf, String> {
        self.find().map_err(NoJournal::message)
    }

    /// The journal to read: as named, else the user's own, else (when the
    /// user has none, and said on stderr) the system broker's.
    fn find(&self) -> Result<PathBuf, NoJournal> {
        let system = || {
            crate::cli::discovery::SystemConfig::load()
                .map(|c| c.journal_dir())
                .map_err(|e| NoJournal::Missing(e.to_string()))
        };
        let dir = match (&self.journal, self.system) {
            (Some(d), _) => d.clone(),
            (None, true) => system()?,
            (None, false) => {
                let own = journal::default_dir(None).map_err(NoJournal::Missing)?;
                let named = std::env::var_os(journal::JOURNAL_ENV).is_some_and(|v| !v.is_empty());
                match std::fs::metadata(&own) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named => {
                        let dir = system()?;
                        eprintln!(
                            "palisade audit: no journal of yours at {}: the system broker's, {}",
                            own.display(),
                            dir.display()
                        );
                        dir
                    }
                    _ => own,
                }
            }
        };
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => Ok(dir),
            Ok(_) => Err(NoJournal::Missing(format!("{} is not a directory", dir.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(NoJournal::Missing(format!("no journal at {}", dir.display())))
            }
            Err(e) => {
                let why = verify::why_unreadable(&dir, &e);
                Err(NoJournal::CannotRead(format!("cannot read: {}: {why}", dir.display())))
            }
        }
    }
}

pub fn main(command: AuditCommand) -> i32 {
    let json = match &command {
        AuditCommand::Verify { json, .. }
        | AuditCommand::Head { json, .. }
        | AuditCommand::Show { json, .. }
        | AuditCommand::Tail { json, .. } => *json,
    };
    let done = match command {
        AuditCommand::Verify { head, allow_pruned, at, json } => {
            return verify_journal(&at, head.as_deref(), allow_pruned, json);
        }
        AuditCommand::Head { at, json } => print_head(&at, json),
        AuditCommand::Show { run_id: Some(run_id), at, json, .. } => show(&at, run_id, json),
        AuditCommand::Show { path: Some(path), at, json, .. } => show_path(&at, &path, json),
        AuditCommand::Show { .. } => {
            return audit_fail(json, ErrorKind::InvalidRequest, "a run's id or --path PATH", EXIT_UNREADABLE);
        }
        AuditCommand::Tail { n, follow, at, json } => tail(&at, n, follow, json),
    };
    match done {
        Ok(()) => 0,
        Err(e) => audit_fail(json, ErrorKind::JournalUnavailable, e, EXIT_UNREADABLE),
    }
}

/// Says why `palisade audit` failed (with `json`, as one `{"error": ...}`
/// object on stdout); the exit status `status`.
fn audit_fail(json: bool, kind: ErrorKind, why: impl std::fmt::Display, status: i32) -> i32 {
    if json {
        let error = ErrorReply::new(kind, why.to_string());
        palisade_cli::outln!("{}", serde_json::json!({ "error": error }));
    } else {
        eprintln!("palisade audit: {why}");
    }
    status
}

fn verify_journal(at: &JournalDir, head: Option<&str>, allow_pruned: bool, json: bool) -> i32 {
    let dir = match at.find() {
        Ok(d) => d,
        Err(e) => {
            let status = e.status();
            return audit_fail(json, ErrorKind::JournalUnavailable, e.message(), status);
        }
    };
    let head = head.map(str::to_ascii_lowercase);
    if let Some(h) = head.as_deref().filter(|h| h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit())) {
        let why = format!("--head {h:?} is not a record's hash (64 hex digits)");
        return audit_fail(json, ErrorKind::InvalidRequest, why, EXIT_UNREADABLE);
    }
    match verify::verify(&dir, head.as_deref(), allow_pruned) {
        Ok(v) if json => {
            palisade_cli::outln!("{}", serde_json::json!({ "verified": v }));
            0
        }
        Ok(v) => {
            palisade_cli::out!("{}", describe(&v));
            0
        }
        Err(failure) => {
            if json {
                palisade_cli::outln!("{}", serde_json::json!(failure));
            } else {
                palisade_cli::outln!("{failure}");
            }
            match failure {
                verify::Failure::Broken(_) => EXIT_BROKEN,
                verify::Failure::Pruned { .. } => EXIT_PRUNED,
                verify::Failure::HeadMissing { .. } => EXIT_HEAD_MISSING,
                verify::Failure::Unreadable { .. } => EXIT_CANNOT_READ,
            }
        }
    }
}

/// What a verified journal is, for people.
fn describe(v: &verify::Verified) -> String {
    let mut text = format!("verified: {} records in {} segments\n", v.records, v.segments);
    if let Some((seq, hash)) = &v.head {
        text += &format!("head: {seq} {hash}\n");
    }
    if let Some(seq) = v.removed_before {
        text += &format!("records before seq {seq} were removed by retention (a record says so)\n");
    }
    if let Some(seq) = v.pruned_before {
        text += &format!("records before seq {seq} are missing, and no record says why (--allow-pruned)\n");
    }
    if let Some((file, bytes)) = &v.torn_tail {
        text += &format!(
            "torn tail: the last {bytes} bytes of {} are not a whole record (the next writer sets them aside)\n",
            file.display()
        );
    }
    for f in &v.set_aside {
        text += &format!("set aside: {}\n", f.display());
    }
    text
}

fn print_head(at: &JournalDir, json: bool) -> Result<(), String> {
    let Some(last) = verify::head(&at.dir()?)? else { return Err("the journal is empty".into()) };
    if json {
        palisade_cli::outln!("{}", serde_json::json!({ "seq": last.seq, "hash": last.hash }));
    } else {
        palisade_cli::outln!("{} {}", last.seq, last.hash);
    }
    Ok(())
}

fn show(at: &JournalDir, run_id: u64, json: bool) -> Result<(), String> {
    let records = verify::records(&at.dir()?)?;
    let found: Vec<&Record> = records.iter().map(|(_, r)| r).filter(|r| r.run_id() == Some(run_id)).collect();
    if found.is_empty() {
        return Err(format!("no record of run {run_id}"));
    }
    found.into_iter().for_each(|r| print_record(r, json));
    Ok(())
}

/// The runs whose writes named `path` (a `changes` record lists it), with
/// every record of each: which run wrote a file.
fn show_path(at: &JournalDir, path: &std::path::Path, json: bool) -> Result<(), String> {
    let wanted =
        crate::host::paths::canonical_prefix(&std::env::current_dir().map_err(|e| e.to_string())?.join(path));
    let wanted = wanted.to_string_lossy().into_owned();
    let records = verify::records(&at.dir()?)?;
    let names = |r: &Record| {
        let paths = r.fields.get("paths").and_then(serde_json::Value::as_array);
        paths.is_some_and(|p| {
            p.iter().any(|v| v.as_str().is_some_and(|s| s == wanted || wanted.starts_with(&format!("{s}/"))))
        })
    };
    // A run is its broker's: run ids start again with each broker.
    let run_of = |r: &Record| (r.fields.get("broker").cloned(), r.run_id());
    let runs: Vec<_> =
        records.iter().map(|(_, r)| r).filter(|r| r.event() == "changes" && names(r)).map(run_of).collect();
    if runs.is_empty() {
        return Err(format!("no record of a run's writes names {wanted}"));
    }
    let mine = records.iter().map(|(_, r)| r).filter(|r| r.run_id().is_some() && runs.contains(&run_of(r)));
    mine.for_each(|r| print_record(r, json));
    Ok(())
}

fn tail(at: &JournalDir, n: usize, follow: bool, json: bool) -> Result<(), String> {
    let dir = at.dir()?;
    let records = verify::records(&dir)?;
    let mut last = records.last().map_or(0, |(_, r)| r.seq);
    records.iter().skip(records.len().saturating_sub(n)).for_each(|(_, r)| print_record(r, json));
    if !follow {
        return Ok(());
    }
    loop {
        std::thread::sleep(FOLLOW_EVERY);
        let seen = last;
        for (_, r) in verify::records(&dir)?.iter().filter(|(_, r)| r.seq > seen) {
            print_record(r, json);
            last = r.seq;
        }
    }
}

/// One record: as the journal has it (`json`), or `seq time event key=value ...`.
fn print_record(r: &Record, json: bool) {
    use std::io::Write;
    let line = if json {
        serde_json::Value::Object(r.fields.clone()).to_string()
    } else {
        let time = r.fields.get("time").and_then(|t| t.as_str()).unwrap_or("");
        let rest: Vec<String> = r
            .fields
            .iter()
            .filter(|(k, _)| !CHAIN_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("{} {time} {} {}", r.seq, r.event(), rest.join(" "))
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}
