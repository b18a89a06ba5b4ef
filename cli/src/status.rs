//! `palisade status`: the running broker's state, as its `Status` answer gives it.

use crate::approve::ask;
use crate::discovery::BrokerArgs;
use crate::escape;
use crate::{json_fail, json_reply};
use palisade_protocol::wire::{BrokerStatus, ClientMessage, ErrorKind, Operations, ServerMessage};
use std::fmt::Write;

/// `palisade status [--socket S] [--json]`.
pub fn status(args: &BrokerArgs, json: bool) -> i32 {
    let status = match ask(args, &ClientMessage::Status) {
        Ok(ServerMessage::Status(s)) => s,
        Ok(other) => return json_fail(json, ErrorKind::ProtocolError, format!("unexpected reply {other:?}")),
        Err(e) => return json_reply(json, e),
    };
    if json {
        crate::outln!("{}", serde_json::to_string(&status).unwrap_or_default());
    } else {
        crate::out!("{}", render(&status, now_unix()));
    }
    0
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A duration in seconds as a person reads it: `3d 4h 5m 6s`, its largest
/// unit first, the zero ones left out.
fn duration(secs: u64) -> String {
    let parts = [(secs / 86_400, "d"), (secs / 3600 % 24, "h"), (secs / 60 % 60, "m"), (secs % 60, "s")];
    let shown: Vec<String> =
        parts.iter().filter(|(n, _)| *n > 0).map(|(n, unit)| format!("{n}{unit}")).collect();
    if shown.is_empty() { "0s".into() } else { shown.join(" ") }
}

/// The status, one item a line (`now`: seconds since the epoch, for "ago").
fn render(s: &BrokerStatus, now: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "broker:      palisaded {} (protocol {}), pid {}, uid {}",
        s.version, s.protocol, s.pid, s.uid
    );
    let _ = writeln!(out, "uptime:      {}", duration(s.uptime_secs));
    let _ = writeln!(
        out,
        "runs:        {} in flight (of {}), {} queued (of {})",
        s.runs_in_flight, s.max_concurrent, s.runs_queued, s.max_queued
    );
    let _ = writeln!(out, "connections: {}", s.connections);
    let _ = writeln!(out, "approvals:   {} waiting", s.approvals_pending);
    let kind = if s.pool.warm { "warm" } else { "helpers only" };
    let _ = writeln!(out, "pool:        {} idle of {} ({kind})", s.pool.idle, s.pool.size);
    match &s.journal {
        Some(j) => {
            let _ = writeln!(out, "journal:     head {} {} ({})", j.seq, j.hash, j.dir);
        }
        None => {
            let _ = writeln!(out, "journal:     off");
        }
    }
    let _ = writeln!(out, "cgroups:     {} ({})", s.cgroup.mode, s.cgroup.description);
    let file = s.config.file.as_deref().unwrap_or("built-in");
    let ago = duration(now.saturating_sub(s.config.loaded_unix));
    let reloads = match s.config.reloads {
        0 => "not reloaded since the start".to_string(),
        1 => "reloaded once".to_string(),
        n => format!("reloaded {n} times"),
    };
    let _ = writeln!(out, "config:      {file}, loaded {ago} ago ({reloads})");
    if let Some(ops) = &s.operations {
        operations(&mut out, ops, now);
    }
    out
}

/// Version 21's part: the socket, the shares, the runs and sessions, the
/// last reload. The runs' commands and a reload's error are shown escaped.
fn operations(out: &mut String, o: &Operations, now: u64) {
    let kind = if o.system { "a system broker: serves other users" } else { "serves its own user" };
    let _ = writeln!(out, "socket:      {} ({kind})", escape::name(&o.socket));
    let memory = match o.per_uid.max_memory_mb {
        0 => "memory not shared out".to_string(),
        mb => format!("{mb} MiB of memory"),
    };
    let p = &o.per_uid;
    let _ = writeln!(
        out,
        "per user:    {} runs at once, {} queued, {} sessions, {memory}",
        p.max_concurrent, p.max_queued, p.max_sessions
    );
    let who = |uid: u32, user: &Option<String>| match user {
        Some(name) => format!("uid {uid} ({})", escape::name(name)),
        None => format!("uid {uid}"),
    };
    for r in &o.requesters {
        let mem = if r.memory_mb > 0 { format!(", {} MiB", r.memory_mb) } else { String::new() };
        let _ = writeln!(out, "requester:   uid {}: {} running, {} queued{mem}", r.uid, r.running, r.queued);
    }
    for r in &o.runs {
        let session =
            r.session.as_ref().map(|s| format!(" in session {}", escape::name(s))).unwrap_or_default();
        let age = duration(r.age_secs);
        let _ = writeln!(
            out,
            "run {}:      {}{session}, {} for {age}: {}",
            r.run_id,
            who(r.uid, &r.user),
            r.state,
            command(&r.argv)
        );
    }
    for s in &o.sessions {
        let (name, age) = (escape::name(&s.name), duration(s.age_secs));
        let _ = writeln!(out, "session {name}: {}, {age} old, {} running", who(s.uid, &s.user), s.running);
    }
    if o.runs_omitted + o.sessions_omitted > 0 {
        let _ = writeln!(
            out,
            "others:      {} runs and {} sessions of other users (an operator sees them)",
            o.runs_omitted, o.sessions_omitted
        );
    }
    match &o.last_reload {
        None => {}
        Some(r) if r.ok => {
            let _ = writeln!(out, "last reload: took effect {} ago", duration(now.saturating_sub(r.unix)));
        }
        Some(r) => {
            let why = r.error.as_deref().map_or(String::new(), |e| format!(": {}", escape::name(e)));
            let ago = duration(now.saturating_sub(r.unix));
            let _ = writeln!(out, "last reload: FAILED {ago} ago, the configuration before it stays{why}");
        }
    }
}

/// A command as a person reads it: each word escaped, one that holds a
/// space or a quote, or nothing, in single quotes as a shell reads them.
fn command(argv: &[String]) -> String {
    let word = |a: &String| {
        let shown = escape::name(a);
        match shown {
            std::borrow::Cow::Borrowed(w) if w.is_empty() || w.contains([' ', '\'']) => {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
            other => other.into_owned(),
        }
    };
    argv.iter().map(word).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_protocol::wire::{
        CgroupStatus, ConfigStatus, JournalHead, LiveRun, LiveSession, PerUidLimits, PoolStatus,
        ReloadOutcome, RequesterShare,
    };

    #[test]
    fn durations_read_largest_unit_first() {
        assert_eq!(duration(0), "0s");
        assert_eq!(duration(59), "59s");
        assert_eq!(duration(3600), "1h");
        assert_eq!(duration(90_061), "1d 1h 1m 1s");
    }

    #[test]
    fn every_field_is_shown() {
        let s = BrokerStatus {
            version: "1.2.3".into(),
            protocol: 11,
            pid: 42,
            uid: 0,
            started_unix: 1000,
            uptime_secs: 65,
            runs_in_flight: 3,
            runs_queued: 1,
            max_concurrent: 16,
            max_queued: 128,
            connections: 5,
            approvals_pending: 2,
            pool: PoolStatus { idle: 1, size: 2, warm: true },
            journal: Some(JournalHead { dir: "/j".into(), seq: 7, hash: "ab".into() }),
            cgroup: CgroupStatus { mode: "v2".into(), description: "v2 at /sys/fs/cgroup/x".into() },
            config: ConfigStatus { file: Some("/etc/p.toml".into()), loaded_unix: 1000, reloads: 1 },
            operations: None,
        };
        let text = render(&s, 1010);
        for want in [
            "palisaded 1.2.3 (protocol 11), pid 42, uid 0",
            "uptime:      1m 5s",
            "3 in flight (of 16), 1 queued (of 128)",
            "connections: 5",
            "2 waiting",
            "1 idle of 2 (warm)",
            "head 7 ab (/j)",
            "v2 (v2 at /sys/fs/cgroup/x)",
            "/etc/p.toml, loaded 10s ago (reloaded once)",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let off = BrokerStatus { journal: None, ..s };
        assert!(render(&off, 1010).contains("journal:     off"));
    }

    #[test]
    fn an_operators_view_shows_runs_sessions_and_a_failed_reload() {
        let ops = Operations {
            socket: "/run/palisade/palisade.sock".into(),
            system: true,
            per_uid: PerUidLimits { max_concurrent: 3, max_queued: 96, max_sessions: 8, max_memory_mb: 0 },
            requesters: vec![RequesterShare { uid: 1000, running: 2, queued: 1, memory_mb: 512 }],
            runs: vec![LiveRun {
                run_id: 7,
                uid: 1000,
                user: Some("dev1".into()),
                argv: vec!["sh".into(), "-c".into(), "sleep 15\x1b]0;x".into()],
                session: None,
                state: "running".into(),
                age_secs: 5,
            }],
            runs_omitted: 2,
            sessions: vec![LiveSession {
                name: "s1".into(),
                uid: 1000,
                user: None,
                age_secs: 60,
                running: 1,
            }],
            sessions_omitted: 0,
            last_reload: Some(ReloadOutcome {
                unix: 1000,
                ok: false,
                error: Some("line 3: unknown key".into()),
            }),
        };
        let s = BrokerStatus { operations: Some(ops), ..BrokerStatus::default() };
        let text = render(&s, 1010);
        for want in [
            "socket:      /run/palisade/palisade.sock (a system broker: serves other users)",
            "per user:    3 runs at once, 96 queued, 8 sessions, memory not shared out",
            "requester:   uid 1000: 2 running, 1 queued, 512 MiB",
            "run 7:      uid 1000 (dev1), running for 5s: sh -c \"sleep 15\\x1b]0;x\"",
            "session s1: uid 1000, 1m old, 1 running",
            "others:      2 runs and 0 sessions of other users",
            "last reload: FAILED 10s ago, the configuration before it stays: line 3: unknown key",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let words = ["a' 'b", "two words", ""].map(String::from);
        assert_eq!(command(&words), "'a'\\'' '\\''b' 'two words' ''");
    }
}
