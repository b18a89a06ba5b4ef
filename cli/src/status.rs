//! `palisade status`: the running broker's state, as its `Status` answer gives it.

use crate::approve::ask;
use crate::discovery::BrokerArgs;
use crate::{json_fail, json_reply};
use palisade_protocol::wire::{BrokerStatus, ClientMessage, ErrorKind, ServerMessage};
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_protocol::wire::{CgroupStatus, ConfigStatus, JournalHead, PoolStatus};

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
}
