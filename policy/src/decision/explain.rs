//! `palisade explain`: a decision and, when allowed, the resolved plan, for a
//! person to read.

use crate::capabilities::{EnvironmentCapability, FsCapability};
use crate::decision::{Decision, Resolved};
use crate::egress_plan::{DNS_ADDRESS, EgressPlan, PROXY_ADDRESS};
use crate::seccomp;
use palisade_protocol::attest::exact_size as size;
use palisade_protocol::wire::Explanation;
use palisade_protocol::{DEV_NODES, LandlockFeatures, Mount, Rlimit};
use std::fmt::Write;

fn count(l: Rlimit) -> String {
    if l.hard == u64::MAX { "unlimited".into() } else { l.hard.to_string() }
}

fn list(items: &[String]) -> String {
    if items.is_empty() { "-".into() } else { items.join(", ") }
}

/// The decision as the protocol's `Explained` carries it, decided by `policy`.
pub fn explanation(decision: &Decision, policy: String) -> Explanation {
    let (word, kind, rule, reason) = match decision {
        Decision::Allow(_) => ("allow", None, None, None),
        Decision::NeedsApproval { reason, rule, .. } => {
            ("needs_approval", None, Some(rule.to_string()), Some(reason.clone()))
        }
        Decision::Deny(d) => ("deny", Some(d.kind), Some(d.rule.to_string()), Some(d.reason.clone())),
    };
    Explanation { decision: word.into(), kind, rule, reason, text: render(decision), policy }
}

pub fn render(decision: &Decision) -> String {
    let mut out = String::new();
    match decision {
        Decision::Deny(d) => {
            let _ = writeln!(out, "decision: deny");
            let _ = writeln!(out, "kind:     {}", d.kind);
            let _ = writeln!(out, "rule:     {}", d.rule);
            let _ = writeln!(out, "reason:   {}", d.reason);
        }
        Decision::NeedsApproval { reason, rule, resolved } => {
            let _ = writeln!(out, "decision: needs approval");
            let _ = writeln!(out, "rule:     {rule}");
            let _ = writeln!(out, "reason:   {reason}");
            let _ = writeln!(out, "if approved:");
            allow(&mut out, resolved);
        }
        Decision::Allow(r) => allow(&mut out, r),
    }
    out
}

fn allow(out: &mut String, r: &Resolved) {
    let p = &r.plan;
    let _ = writeln!(out, "decision: allow ({})", p.tier());
    for w in &r.warnings {
        let _ = writeln!(out, "warning:  {w}");
    }
    let _ = writeln!(out, "tool:     {}", r.tool.as_deref().unwrap_or("(default profile)"));
    let how = match p.argv.first().filter(|a| !a.contains('/')) {
        Some(name) => format!(" (the first {name} in the caller's PATH, else the sandbox's)"),
        None => String::new(),
    };
    let _ = writeln!(out, "program:  {}{how}", p.program);
    if let Some(home) = &r.home {
        let _ = writeln!(out, "home:     {} (this workspace's own HOME, kept between runs)", home.display());
    }
    let shown: Vec<String> = r.toolchains.iter().map(|t| t.display().to_string()).collect();
    let _ = writeln!(out, "toolchains: {} (read-only)", list(&shown));
    let _ = writeln!(out, "argv:     {:?}", p.argv);
    let _ = writeln!(out, "cwd:      {}", p.cwd);
    let env: Vec<String> = p.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(out, "env:      {}", list(&env));

    let c = &r.capabilities;
    let fs: Vec<String> = c
        .filesystem
        .iter()
        .map(|f| match f {
            FsCapability::ReadOnly { path } => format!("read_only {path}"),
            FsCapability::ReadWrite { path } => format!("read_write {path}"),
            FsCapability::TempWorkspace => "temp_workspace".into(),
        })
        .collect();
    let _ = writeln!(out, "capabilities:");
    let _ = writeln!(out, "  filesystem:  {}", list(&fs));
    let _ = writeln!(out, "  network:     {} (egress {})", c.network, r.egress);
    let pc = &c.process;
    let _ = writeln!(
        out,
        "  process:     {}, {} s, {} MiB, {} processes",
        if pc.no_fork { "no_fork" } else { "fork allowed" },
        pc.max_execution_time,
        pc.max_memory_mb,
        pc.max_processes
    );
    let env_cap = match c.environment {
        EnvironmentCapability::None => "none",
        EnvironmentCapability::Restricted => "restricted",
        EnvironmentCapability::Full => "full",
    };
    let _ = writeln!(out, "  environment: {env_cap}");

    let _ = writeln!(
        out,
        "namespaces: {}",
        list(&p.namespaces.names().iter().map(|s| s.to_string()).collect::<Vec<_>>())
    );
    if let Some(ids) = p.host_ids {
        let _ = writeln!(
            out,
            "host ids:   {}:{} (the broker runs as root; writable binds are idmapped)",
            ids.uid, ids.gid
        );
    }
    if !p.mounts.is_empty() {
        let _ = writeln!(out, "mounts (the sandbox's root is a read-only tmpfs):");
        for m in &p.mounts {
            let line = mount_line(m);
            let _ = writeln!(out, "  {line}");
        }
    }
    let l = &p.landlock;
    let _ = writeln!(out, "landlock: handles {}; requires {}", l.wanted, l.required);
    let _ = writeln!(out, "  read:    {}", list(&l.read));
    let _ = writeln!(out, "  write:   {}", list(&l.write));
    let _ = writeln!(out, "  execute: {}", list(&l.execute));
    if !l.list.is_empty() {
        let _ = writeln!(out, "  list:    {}", list(&l.list));
    }
    if l.wanted.contains(LandlockFeatures::NET_TCP) {
        let ports: Vec<String> = l.tcp_connect.iter().map(u16::to_string).collect();
        let connect = if ports.is_empty() {
            "no connect".into()
        } else {
            format!("connect to ports {}", ports.join(", "))
        };
        let _ = writeln!(out, "  tcp:     no bind, {connect}");
    }
    let rl = &p.rlimits;
    let _ = writeln!(
        out,
        "limits:   data {}, address space {}, cpu {} s, processes {}, open files {}, file size {}, core {}",
        size(rl.data.hard),
        size(rl.address_space.hard),
        rl.cpu_seconds.soft,
        count(rl.processes),
        count(rl.open_files),
        size(rl.file_size.hard),
        rl.core.hard
    );
    let _ = writeln!(out, "deadline: {} s; output quota {}", r.timeout.as_secs(), size(r.max_output_bytes));
    let _ = writeln!(out, "network:  {}", r.network);
    if let Some(e) = &r.egress_plan {
        egress_plan(out, e);
    }
    let _ = writeln!(out, "disk:     {}", r.disk);
    let _ = writeln!(out, "memory:   {}", r.memory);
    let _ = writeln!(out, "seccomp:  {}", seccomp_summary(r));
    let _ = writeln!(out, "cedar:    {}", cedar_summary(r));
}

/// One mount of the sandbox's root, in words.
fn mount_line(m: &Mount) -> String {
    match m {
        Mount::Bind { source, target, .. } if source == "/dev/null" => {
            format!("{target}  hidden (sensitive)")
        }
        Mount::Bind { source, target, writable, .. } => {
            let how = if *writable { "read-write" } else { "read-only" };
            if source == target {
                format!("{target}  {how} bind")
            } else {
                format!("{target}  {how} bind of {source}")
            }
        }
        Mount::Tmpfs { target, mode: 0, .. } => format!("{target}  hidden (sensitive)"),
        Mount::Tmpfs { target, size_bytes, .. } => format!("{target}  tmpfs, {}", size(*size_bytes)),
        Mount::Proc { target } => format!("{target}  proc (the sandbox's processes only)"),
        Mount::Dev { target, shm_bytes } => {
            format!("{target}  {}, pts, shm (tmpfs, {})", DEV_NODES.join(" "), size(*shm_bytes))
        }
        Mount::Symlink { target, link } => format!("{target} -> {link}"),
        Mount::File { target, contents } => {
            format!("{target}  read-only file of the plan's: {:?}", contents.trim_end())
        }
        Mount::Overlay { source, target, size_bytes, layer, .. } => {
            let of = if source == target { String::new() } else { format!(" of {source}") };
            let held = match layer {
                Some(layer) => format!("held in {layer} (at most {})", size(*size_bytes)),
                None => format!("held in a change set (at most {})", size(*size_bytes)),
            };
            format!("{target}  read-write overlay{of}: writes {held}, applied after the run")
        }
    }
}

/// Strict egress: what the broker serves inside the sandbox, and its limits.
fn egress_plan(out: &mut String, e: &EgressPlan) {
    let ports: Vec<String> = e.ports.iter().map(u16::to_string).collect();
    let _ = writeln!(out, "egress:   strict, served by the broker");
    let _ = writeln!(out, "  allowed:   {} on ports {}", list(&e.domains), list(&ports));
    let _ = writeln!(out, "  proxy:     {PROXY_ADDRESS} (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY)");
    let _ = writeln!(out, "  resolver:  {DNS_ADDRESS} udp and tcp (/etc/resolv.conf)");
    if e.transparent {
        let pool: Vec<String> = e
            .pool
            .iter()
            .map(|p| format!("{} {}", p.address, p.name.as_deref().unwrap_or("(spare, for *.suffix names)")))
            .collect();
        let _ = writeln!(out, "  transparent pool: {}", list(&pool));
    } else {
        let _ = writeln!(out, "  transparent: off (tools that ignore the proxy variables reach nothing)");
    }
    let hosts: Vec<String> = e
        .hosts
        .iter()
        .map(|(n, a)| format!("{n} = {}", a.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(" ")))
        .collect();
    let nets: Vec<String> = e.allow_addresses.iter().map(|n| n.to_string()).collect();
    let _ = writeln!(out, "  static hosts: {}; allowed private addresses: {}", list(&hosts), list(&nets));
    let _ = writeln!(
        out,
        "  limits:    {} connections at once, {} both ways, idle {} s",
        e.max_connections,
        size(e.max_bytes),
        e.idle_timeout.as_secs()
    );
}

/// What the Cedar policies said of a run, in words.
fn cedar_summary(r: &Resolved) -> String {
    match &r.cedar {
        None => "no Cedar policies configured".into(),
        Some(v) => {
            let asked = v.asked.as_ref().map_or(String::new(), |a| {
                format!("; held for approval by {} (cedar.ask): {}", a.by.join(", "), a.reason)
            });
            format!("permitted by {} for {}{asked}", v.permitted_by.join(", "), v.request)
        }
    }
}

/// The seccomp program of a run, in words.
fn seccomp_summary(r: &Resolved) -> String {
    let p = &r.plan;
    let tier = p.tier();
    let ip = tier == palisade_protocol::Tier::C || !p.landlock.wanted.contains(LandlockFeatures::NET_TCP);
    let profile = seccomp::Profile { tier, ip, fork: !r.capabilities.process.no_fork };
    seccomp::summary(&p.seccomp, profile)
}
