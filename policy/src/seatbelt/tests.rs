//! The profiles of decided runs, against the golden files beside this one.
//! The host is the decision table's (in memory, no root) with Seatbelt in
//! place of user namespaces and Landlock; the fixture's temporary directory
//! is written `$ROOT`. `PALISADE_BLESS=1` rewrites the files after a change
//! that is meant (then review the diff).

use super::{SeatbeltError, held_writes, profile};
use crate::config::Config;
use crate::decision::table::{Fixture, GITHUB, On, TOOLS, context};
use crate::decision::{Decision, Policy, Resolved};
use palisade_protocol::attest::Network;
use palisade_protocol::wire::{ErrorKind, ParamValue, RunRequest};
use std::path::{Path, PathBuf};

/// A workspace with nothing sensitive in it (Tier B refuses to grant one
/// that holds keys: it cannot hide them).
const WORKSPACE: &str = "proj";

fn fixture(tag: &str) -> Fixture {
    let f = Fixture::new(tag);
    std::fs::create_dir_all(f.root.join("proj/src")).unwrap();
    std::fs::write(f.root.join("proj/src/main.rs"), "fn main() {}").unwrap();
    f
}

fn decide(f: &Fixture, config: &str, request: &RunRequest) -> Decision {
    let config = Config::parse(config, Path::new("seatbelt.toml")).unwrap();
    let host = f.host(On::Seatbelt);
    Policy::new(config, &*host.files).decide(&host, &context(On::Seatbelt), request)
}

fn allowed(f: &Fixture, config: &str, request: &RunRequest) -> Resolved {
    match decide(f, config, request) {
        Decision::Allow(r) => *r,
        other => panic!("{other:?}"),
    }
}

fn tool(f: &Fixture, name: &str, argv: &[&str], params: &[(&str, &str)]) -> RunRequest {
    let mut r = f.request_in(WORKSPACE, argv);
    r.tool = Some(name.into());
    r.params = params.iter().map(|(k, v)| (k.to_string(), ParamValue::One(f.p(v)))).collect();
    r
}

/// `text` with the fixture's directory as `$ROOT`, against `golden/NAME.sb`.
fn check_golden(f: &Fixture, name: &str, text: &str) {
    let text = text.replace(&f.root.to_string_lossy().into_owned(), "$ROOT");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("src/seatbelt/golden/{name}.sb"));
    if std::env::var_os("PALISADE_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(text, golden, "{name}: the profile differs from {}", path.display());
}

#[test]
fn the_default_profile_has_no_network() {
    let f = fixture("seatbelt-default");
    let r = allowed(&f, "", &f.request_in(WORKSPACE, &["ls", "-la", "src"]));
    let text = profile(&r, &[]).unwrap();
    check_golden(&f, "default", &text);
    assert!(text.contains("(deny default)") && !text.contains("(allow network"));
    // The workspace is the one writable directory of the request's.
    assert!(text.contains(&format!("(subpath \"{}\")", f.p(WORKSPACE))));
    assert!(!text.contains(&f.p("outside")) && !text.contains(&f.p("home")));
    // Denied by name before anything is allowed; allowed back only with a filter.
    let denied = text.find("(deny process-info* iokit-get-properties nvram* file-map-executable)").unwrap();
    assert!(denied < text.find("(allow").unwrap());
    assert!(!text.contains("(allow iokit") && !text.contains("(allow nvram"));
    assert!(text.contains("(allow process-info* (target same-sandbox))"));
}

/// What a profile refuses to write, read as the regular expressions they
/// are (POSIX's extended ones, which Seatbelt reads, and Rust's agree on
/// what these use): git's hooks and configuration and the files the host
/// runs, in any case of their names; ordinary files, git's data and a
/// branch named `config` stay writable.
#[test]
fn host_executed_writes_are_refused_in_any_case() {
    let root = "/Users/a/proj".to_string();
    let held = held_writes(&[&root], &["tools/run-on-open.sh".into()]).unwrap();
    let regexes: Vec<regex::Regex> = held.iter().map(|r| regex::Regex::new(r).unwrap()).collect();
    let refused = |p: &str| regexes.iter().any(|r| r.is_match(&format!("{root}/{p}")));
    let held = [
        ".git/hooks/pre-commit",
        ".git/hooks",
        ".git/config",
        ".GIT/Hooks/post-checkout",
        ".git/Config",
        ".git/config.worktree",
        ".git/modules/sub/hooks/x",
        ".git/modules/a/modules/b/config",
        ".git/worktrees/w/config.worktree",
        "sub/.git/hooks/x",
        ".envrc",
        "deep/dir/.ENVRC",
        ".vscode/tasks.json",
        ".vscode",
        "app.code-workspace",
        ".bashrc",
        ".config/git/config",
        ".claude/settings.json",
        ".mcp.json",
        "tools/run-on-open.sh",
        ".cargo/bin/cargo",
        // What could be written under another name and moved in.
        ".git",
        "sub/.Git",
        ".git/modules",
        ".git/modules/m",
        ".git/worktrees/w",
        ".git/commondir",
        ".git/gitdir",
        ".git/hooks/deep/x",
        ".config",
        ".config/systemd",
        ".cargo",
        "tools",
    ];
    for p in held {
        assert!(refused(p), "{p} must be refused");
    }
    let ordinary = [
        "src/main.rs",
        ".git/objects/ab/cdef",
        ".git/refs/heads/config",
        ".git/HEAD",
        ".git/index",
        "sub/.bashrc",
        "notes/.vscode-notes",
        "envrc",
        ".github/workflows/ci.yml",
        "tools/other.sh",
        ".git/modules/m/objects/x",
        ".git/objects/pack/config",
        ".gitignore",
        ".config/other/x",
        "sub/.config",
        ".configure",
        "git",
    ];
    for p in ordinary {
        assert!(!refused(p), "{p} must stay writable");
    }
    // A configured glob the profile cannot say is refused, not left out.
    for bad in ["{a,b}.sh", "x/[ab]", "a**"] {
        assert_eq!(held_writes(&[], &[bad.into()]), Err(SeatbeltError::HostExecuted(bad.into())));
    }
}

#[test]
fn a_tool_preset_reads_its_workspace_only() {
    let f = fixture("seatbelt-preset");
    let r = allowed(&f, TOOLS, &tool(&f, "scan", &["grep", "-r", "x", "src"], &[]));
    assert!(r.writable.is_empty());
    check_golden(&f, "tool_preset", &profile(&r, &[]).unwrap());
}

#[test]
fn a_temporary_workspace_is_the_runs_own() {
    let f = fixture("seatbelt-temporary");
    let request = tool(&f, "convert", &["cp", "in", "out"], &[("input", "proj/src/main.rs")]);
    let r = allowed(&f, TOOLS, &request);
    let text = profile(&r, &[]).unwrap();
    check_golden(&f, "temporary_workspace", &text);
    // A preset without fork: the profile does not allow it either.
    assert!(r.capabilities.process.no_fork && !text.contains("process-fork"));
}

#[test]
fn allow_all_is_the_hosts_network() {
    let f = fixture("seatbelt-network");
    let all = "[defaults]\nnetwork = \"allow_all\"\n";
    let r = allowed(&f, all, &f.request_in(WORKSPACE, &["git", "fetch"]));
    let text = profile(&r, &[]).unwrap();
    check_golden(&f, "host_network", &text);
    // IP sockets and the resolver's Unix socket; no kernel-control or routing socket.
    assert!(text.contains(
        "(allow system-socket (socket-domain AF_INET) (socket-domain AF_INET6) (socket-domain AF_UNIX))"
    ));
    assert!(!text.contains("(allow system-socket)"));
}

/// Allowed domains are refused, not loosened to the host's network: in
/// every egress mode a profile could only open every address. The same
/// policy decides a Linux run (Tier C, strict egress enforces them).
#[test]
fn allowed_domains_are_refused_not_loosened() {
    let f = fixture("seatbelt-domains");
    let clone = f.request_in(WORKSPACE, &["git", "clone", "https://github.com/a/b"]);
    for egress in ["none", "preflight"] {
        let config = format!("{GITHUB}egress = \"{egress}\"\n");
        match decide(&f, &config, &clone) {
            Decision::Deny(d) => {
                assert_eq!((d.kind, d.rule), (ErrorKind::Unavailable, "egress.domains_unenforced"));
                assert!(d.reason.contains("cannot be enforced on macOS"), "{}", d.reason);
            }
            other => panic!("{egress}: {other:?}"),
        }
    }
    let config = Config::parse(GITHUB, Path::new("linux.toml")).unwrap();
    let host = f.host(On::TierC);
    let linux = Policy::new(config, &*host.files).decide(&host, &context(On::TierC), &clone);
    assert!(matches!(linux, Decision::Allow(_)), "{linux:?}");
}

#[test]
fn strict_egress_is_refused_not_loosened() {
    let f = fixture("seatbelt-strict");
    let strict = "[defaults]\negress = \"strict\"\n";
    match decide(&f, strict, &f.request_in(WORKSPACE, &["ls"])) {
        Decision::Deny(d) => {
            assert_eq!((d.kind, d.rule), (ErrorKind::Unavailable, "egress.strict_unavailable"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn only_tier_b_plans_and_plain_paths_are_written() {
    let f = fixture("seatbelt-refusals");
    let mut r = allowed(&f, "", &f.request_in(WORKSPACE, &["ls"]));
    for bad in ["relative", "/a\"b", "/a\\b", "/a\nb"] {
        let mut r = r.clone();
        r.plan.landlock.read.push(bad.into());
        assert_eq!(profile(&r, &[]), Err(SeatbeltError::Path(bad.into())));
    }
    let mut listed = r.clone();
    listed.plan.landlock.list.push("/srv".into());
    assert_eq!(profile(&listed, &[]), Err(SeatbeltError::ListOnly(vec!["/srv".into()])));
    r.plan.namespaces.user = true;
    assert_eq!(profile(&r, &[]), Err(SeatbeltError::Tier(palisade_protocol::Tier::C)));
}

/// A plan that reaches the profile with allowed domains anyway (the
/// decision refuses them first) is refused there too: no profile is
/// written, so no domain of the request can add a rule.
#[test]
fn a_plan_with_domains_gets_no_profile() {
    let f = fixture("seatbelt-injection");
    let mut r = allowed(&f, "", &f.request_in(WORKSPACE, &["ls"]));
    let injected = "github.com\n(allow default)\n;";
    r.network = Network::HostDomains { domains: vec![injected.into()], preflight: true };
    assert_eq!(profile(&r, &[]), Err(SeatbeltError::Network(r.network.clone())));
}
