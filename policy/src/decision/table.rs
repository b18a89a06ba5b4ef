//! Decisions as a table: a request, a configuration and a host in, the
//! decision out. No root, no user namespaces, no installed binary: the host
//! is in memory ([`FakeFiles`]), but for the request's own directories, made
//! in a temporary directory (the paths a request names are canonicalized on
//! the real filesystem, the one read of it the policy makes).

use super::{Context, Decision, Policy, Resolved};
use crate::config::Config;
use crate::host::fake::{FakeFiles, elf_with_interpreter};
use crate::host::{CgroupRoot, Host, HostCapabilities};
use crate::jail::Layout;
use palisade_protocol::wire::{ErrorKind, ParamValue, RunRequest, WindowSize};
use palisade_protocol::{HostIds, Mount, Tier};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const LOADER: &str = "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2";
/// The bytes of the fake host's bash (and of a renamed copy of it).
const BASH: &[u8] = b"\x7fELF\x02\x01\x01 bash, as far as this test knows";

/// The request's side: a workspace with a key directory inside and a
/// symlink out, a secret outside, a home with keys.
pub(crate) struct Fixture {
    pub(crate) root: PathBuf,
}

impl Fixture {
    pub(crate) fn new(tag: &str) -> Fixture {
        let base = std::env::temp_dir().canonicalize().unwrap();
        let root = base.join(format!("palisade-decision-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in
            ["ws/src", "ws/.ssh", "outside", "home/.ssh", "home/.local/state/palisade/journal", "home/src"]
        {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("ws/src/main.rs"), "fn main() {}").unwrap();
        // What the host executes: direnv's file, an editor's settings.
        std::fs::create_dir_all(root.join("ws/src/.vscode")).unwrap();
        std::fs::write(root.join("ws/src/.vscode/settings.json"), "{}").unwrap();
        std::fs::write(root.join("ws/.envrc"), "export A=1").unwrap();
        std::fs::write(root.join("outside/secret"), "s").unwrap();
        std::fs::write(root.join("home/.ssh/id_ed25519"), "key").unwrap();
        std::fs::write(root.join("home/.local/state/palisade/journal/segment"), "records").unwrap();
        std::os::unix::fs::symlink(root.join("outside"), root.join("ws/link-out")).unwrap();
        // A real file that may be executed, outside every directory a sandbox sees.
        let tool = root.join("outside/tool");
        std::fs::write(&tool, "").unwrap();
        std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        Fixture { root }
    }

    pub(crate) fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }

    /// A request run in the workspace, with `HOME` the fixture's home.
    pub(crate) fn request(&self, argv: &[&str]) -> RunRequest {
        self.request_in("ws", argv)
    }

    pub(crate) fn request_in(&self, cwd: &str, argv: &[&str]) -> RunRequest {
        RunRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: Some(self.p(cwd)),
            env: [("HOME".to_string(), self.p("home")), ("LANG".to_string(), "C.UTF-8".to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    /// A merged-/usr host with a few programs, shells among them.
    pub(crate) fn host(&self, on: On) -> Host {
        let elf = elf_with_interpreter("/lib64/ld-linux-x86-64.so.2");
        let mut files = FakeFiles::new(Some(&self.root))
            .executable(LOADER, b"\x7fELF\x02\x01\x01 the loader")
            .symlink("/lib64/ld-linux-x86-64.so.2", LOADER)
            .executable("/usr/bin/bash", BASH)
            .executable("/usr/bin/sh", &elf)
            .symlink("/bin/sh", "/usr/bin/sh")
            .executable("/usr/bin/python3", b"\x7fELF\x02\x01\x01 python")
            .executable("/usr/local/bin/innocent", BASH)
            .executable("/usr/bin/build", b"#!/bin/sh\nmake\n")
            .file("/usr/bin/readme", 0o644, b"not a program")
            .denied("/srv/private");
        // Each program its own bytes: a copy of a shell is a shell.
        for name in ["ls", "cat", "cp", "curl", "git", "env", "grep"] {
            files = files.executable(&format!("/usr/bin/{name}"), &[&elf[..], name.as_bytes()].concat());
        }
        let usr = |d: &str| PathBuf::from(format!("/usr/{d}"));
        let mut capabilities = HostCapabilities {
            user_namespaces: true,
            landlock_abi: 6,
            seatbelt: false,
            cgroup: Err("none (test)".into()),
        };
        match on {
            On::TierC | On::RootFor(_) => {}
            On::NoUserNamespaces => capabilities.user_namespaces = false,
            On::Cgroup => {
                let path = PathBuf::from("/sys/fs/cgroup/palisade");
                capabilities.cgroup = Ok(CgroupRoot { path, v1: false });
            }
            On::LandlockAbi(abi) => capabilities.landlock_abi = abi,
            On::Seatbelt => {
                capabilities.user_namespaces = false;
                capabilities.landlock_abi = 0;
                capabilities.seatbelt = true;
            }
        }
        Host {
            capabilities,
            homes: vec![self.root.join("home")],
            layout: Layout {
                links: ["bin", "sbin", "lib", "lib64"].map(|d| (format!("/{d}"), format!("usr/{d}"))).into(),
                real: vec!["/usr".into()],
                canonical: vec![PathBuf::from("/usr"), usr("bin"), usr("sbin"), usr("lib"), usr("lib64")],
                etc: ["/etc/passwd", "/etc/group", "/etc/hosts"].map(String::from).into(),
                devices: ["/dev/null", "/dev/zero", "/dev/urandom"].map(String::from).into(),
            },
            files: Arc::new(files),
            owned: self.owned().into(),
        }
    }

    /// What the fixture's broker keeps: its state directory in the home,
    /// as a per-user broker's is by default.
    pub(crate) fn owned(&self) -> Vec<crate::host::OwnedPath> {
        vec![crate::host::OwnedPath {
            path: self.root.join("home/.local/state/palisade"),
            what: "the broker's state directory".into(),
            hidden: true,
        }]
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// What the host and the broker are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum On {
    /// User namespaces, Landlock ABI 6, no cgroup for runs.
    TierC,
    NoUserNamespaces,
    /// Tier C with a cgroup v2 subtree for runs.
    Cgroup,
    LandlockAbi(u32),
    /// Tier C, the broker running as root for requester uid N.
    RootFor(u32),
    /// macOS: Seatbelt, no user namespaces, no Landlock.
    Seatbelt,
}

pub(crate) fn context(on: On) -> Context {
    let (uid, requester) = match on {
        On::RootFor(requester) => (0, requester),
        _ => (1000, 1000),
    };
    Context {
        parent_pid: 1,
        uid,
        gid: uid,
        serves_others: uid == 0,
        requester: HostIds { uid: requester, gid: requester },
        groups: vec![],
        temp_root: PathBuf::from("/run/palisade-test"),
        instance: "1-1".into(),
        run: 7,
        etc_view: None,
        trust: None,
        homes: None,
    }
}

/// The decision a row must get.
enum Want {
    Allow(fn(&Resolved, &Fixture)),
    /// Allowed once a person approves: the run it would be.
    Approval(fn(&Resolved, &Fixture)),
    Deny(ErrorKind, &'static str),
}

struct Row {
    what: &'static str,
    config: String,
    on: On,
    request: Box<dyn Fn(&Fixture) -> RunRequest>,
    want: Want,
}

fn row(
    what: &'static str,
    config: &str,
    on: On,
    request: impl Fn(&Fixture) -> RunRequest + 'static,
    want: Want,
) -> Row {
    Row { what, config: config.to_string(), on, request: Box::new(request), want }
}

/// A request run in the workspace.
fn args(argv: &'static [&'static str]) -> impl Fn(&Fixture) -> RunRequest + 'static {
    move |f: &Fixture| f.request(argv)
}

/// `ls` in a terminal of `rows` by `cols`.
fn ls_in_terminal(rows: u16, cols: u16) -> impl Fn(&Fixture) -> RunRequest + 'static {
    move |f: &Fixture| RunRequest { terminal: Some(WindowSize { rows, cols }), ..f.request(&["ls"]) }
}

/// A request for tool `name`, its parameters' paths relative to the fixture.
pub(crate) fn tool(
    name: &'static str,
    argv: &'static [&'static str],
    params: &'static [(&'static str, &'static str)],
) -> impl Fn(&Fixture) -> RunRequest {
    move |f: &Fixture| {
        let mut r = f.request(argv);
        r.tool = Some(name.into());
        let value = |v: &str| ParamValue::One(if v.starts_with('/') { v.into() } else { f.p(v) });
        r.params = params.iter().map(|(k, v)| (k.to_string(), value(v))).collect();
        r
    }
}

const SCOPE: ErrorKind = ErrorKind::WorkspaceScopeDenied;
const DENY: ErrorKind = ErrorKind::PolicyDenied;
const INVALID: ErrorKind = ErrorKind::InvalidRequest;
const CAP: ErrorKind = ErrorKind::CapabilityDenied;
const UNAVAILABLE: ErrorKind = ErrorKind::Unavailable;

const ALLOW_INTERPRETERS: &str = "[defaults]\nallow_interpreters = true\n";
const ALLOW_INLINE: &str = "[defaults]\nallow_interpreters = true\nallow_inline_code = true\n";
const WARN: &str = "[policy]\nfallback = \"warn_and_execute\"\n";
const ASK: &str = "[policy]\nfallback = \"request_approval\"\n";
pub(crate) const GITHUB: &str = "[defaults]\nnetwork = { allow_domains = [\"github.com\"] }\n";
pub(crate) const TOOLS: &str = r#"
[tools.convert]
preset = "file_processor"
[tools.convert.parameters.input]
capability = "filesystem.read_only"
validation = "is_file"
mapping = "single"

[tools.scan]
preset = "code_analyzer"

[tools.peek]
[tools.peek.overrides]
filesystem = [{ read_only = "${WORKSPACE}/.ssh" }]

[tools.out]
[tools.out.overrides]
filesystem = [{ read_write = "${WORKSPACE}/missing" }]
"#;

fn rows() -> Vec<Row> {
    [
        allowed(),
        strict_egress(),
        strict_egress_refused(),
        allowed_elsewhere(),
        refused_for_the_request(),
        refused_for_the_program(),
        refused_for_paths_and_hosts(),
        broker_state(),
        asks(),
        asks_refused(),
        terminals(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Allowed in Tier C, with the plan's key fields.
fn allowed() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        row(
            "Tier C: the workspace an overlay, its .ssh hidden, no network",
            "",
            TierC,
            args(&["ls", "src"]),
            Allow(|r, f| {
                let p = &r.plan;
                assert_eq!(
                    (p.tier(), p.program.as_str(), p.cwd.as_str()),
                    (Tier::C, "/usr/bin/ls", f.p("ws").as_str())
                );
                assert_eq!(r.writable, vec![PathBuf::from(f.p("ws"))]);
                assert!(
                    p.mounts
                        .iter()
                        .any(|m| matches!(m, Mount::Overlay { target, .. } if *target == f.p("ws")))
                );
                assert!(
                    p.mounts.iter().any(
                        |m| matches!(m, Mount::Tmpfs { target, mode: 0, .. } if *target == f.p("ws/.ssh"))
                    )
                );
                assert!(p.mounts.iter().any(
                    |m| matches!(m, Mount::Symlink { target, link } if target == "/bin" && link == "usr/bin")
                ));
                assert!(p.namespaces.net && r.cgroup.is_none() && r.warnings.is_empty());
                assert_eq!((r.timeout.as_secs(), p.rlimits.data.hard), (300, 512 << 20));
                assert_eq!(p.rlimits.address_space.hard, 4 * (512 << 20));
                assert!(p.env.contains(&("HOME".into(), f.p("ws"))), "{:?}", p.env);
            }),
        ),
        row(
            "a tool's preset: its temporary workspace, no fork",
            TOOLS,
            TierC,
            tool("convert", &["cp", "in", "out"], &[("input", "ws/src/main.rs")]),
            Allow(|r, f| {
                let p = &r.plan;
                assert_eq!((p.cwd.as_str(), r.tool.as_deref()), ("/workspace", Some("convert")));
                assert!(
                    p.mounts
                        .iter()
                        .any(|m| matches!(m, Mount::Tmpfs { target, .. } if target == "/workspace"))
                );
                assert!(p.mounts.iter().any(|m| matches!(m, Mount::Bind { target, writable: false, .. } if *target == f.p("ws/src/main.rs"))));
                assert!(r.writable.is_empty() && r.capabilities.process.no_fork);
            }),
        ),
        row(
            "a read-only preset: the workspace a read-only bind",
            TOOLS,
            TierC,
            tool("scan", &["grep", "-r", "x", "src"], &[]),
            Allow(|r, f| {
                assert!(r.plan.mounts.iter().any(
                    |m| matches!(m, Mount::Bind { target, writable: false, .. } if *target == f.p("ws"))
                ));
                assert_eq!((r.writable.len(), r.timeout.as_secs()), (0, 900));
            }),
        ),
        row(
            "preflight egress: a named host on the allow-list, the host network",
            GITHUB,
            TierC,
            args(&["curl", "https://github.com/o/r"]),
            Allow(|r, _| {
                assert!(!r.plan.namespaces.net);
                assert_eq!(r.egress, palisade_protocol::attest::EgressMode::Preflight);
                let preflight = matches!(
                    r.network,
                    palisade_protocol::attest::Network::HostDomains { preflight: true, .. }
                );
                assert!(preflight, "{}", r.network);
            }),
        ),
    ]
}

/// Strict egress with domains: github.com and every name below pkgs.example.org.
const STRICT: &str = "[defaults]\negress = \"strict\"\nnetwork = { allow_domains = [\"github.com\", \"*.pkgs.example.org\", \"api.example\"] }\n";

/// A request narrowing its profile's domains to `names`.
fn narrowed(names: &'static [&'static str]) -> impl Fn(&Fixture) -> RunRequest + 'static {
    move |f: &Fixture| RunRequest {
        allow_domains: Some(names.iter().map(|n| n.to_string()).collect()),
        ..f.request(&["ls"])
    }
}

/// Strict egress: the broker's listeners planned, or loopback alone.
fn strict_egress() -> Vec<Row> {
    use On::*;
    use Want::*;
    use palisade_protocol::{LandlockFeatures, Listener, ListenerKind as K};
    use std::net::Ipv4Addr;
    vec![
        row(
            "strict with domains: listeners, pool, proxy variables, resolv.conf, Landlock TCP rules",
            STRICT,
            TierC,
            args(&["ls"]),
            Allow(|r, _| {
                let (p, e) = (&r.plan, r.egress_plan.as_ref().expect("an egress plan"));
                assert_eq!(e.domains, ["*.pkgs.example.org", "api.example", "github.com"]);
                assert_eq!((e.ports.as_slice(), e.transparent), (&[443, 80][..], true));
                let names: Vec<(Ipv4Addr, Option<&str>)> =
                    e.pool.iter().map(|p| (p.address, p.name.as_deref())).collect();
                assert_eq!(
                    names[..2],
                    [
                        (Ipv4Addr::new(127, 77, 0, 1), Some("api.example")),
                        (Ipv4Addr::new(127, 77, 0, 2), Some("github.com"))
                    ]
                );
                assert_eq!(names.len(), 2 + crate::egress_plan::SPARE_POOL_ADDRESSES);
                assert!(names[2..].iter().all(|(_, n)| n.is_none()));
                let at = |kind, address, port| Listener { kind, address, port };
                let lo = Ipv4Addr::LOCALHOST;
                assert_eq!(
                    p.listeners[..3],
                    [at(K::Proxy, lo, 3128), at(K::DnsUdp, lo, 53), at(K::DnsTcp, lo, 53)]
                );
                assert_eq!(
                    p.listeners[3..5],
                    [
                        at(K::Transparent, Ipv4Addr::new(127, 77, 0, 1), 443),
                        at(K::Transparent, Ipv4Addr::new(127, 77, 0, 1), 80)
                    ]
                );
                assert_eq!(p.listeners.len(), 3 + 2 * names.len());
                assert!(p.namespaces.net && p.loopback);
                for k in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]
                {
                    assert!(p.env.contains(&(k.into(), "http://127.0.0.1:3128".into())), "{k}: {:?}", p.env);
                }
                assert!(p.env.contains(&("no_proxy".into(), "localhost,127.0.0.1,::1".into())));
                assert!(p.mounts.iter().any(|m| matches!(m, Mount::File { target, contents } if target == "/etc/resolv.conf" && contents == "nameserver 127.0.0.1\n")));
                assert!(
                    !p.mounts
                        .iter()
                        .any(|m| matches!(m, Mount::Bind { target, .. } if target == "/etc/resolv.conf"))
                );
                let l = &p.landlock;
                assert!(
                    l.wanted.contains(LandlockFeatures::NET_TCP)
                        && !l.required.contains(LandlockFeatures::NET_TCP)
                );
                assert_eq!(
                    (l.tcp_bind.as_slice(), l.tcp_connect.as_slice()),
                    (&[][..], &[53, 80, 443, 3128][..])
                );
                assert!(l.read.contains(&"/etc".to_string()), "{:?}", l.read);
                let text = r.network.to_string();
                assert!(
                    text.contains("only loopback")
                        && text.contains("github.com")
                        && text.contains("[443, 80]"),
                    "{text}"
                );
                let explained = crate::decision::explain::render(&Decision::Allow(Box::new(r.clone())));
                assert!(
                    explained.contains("127.77.0.2 github.com") && explained.contains("127.0.0.1:3128"),
                    "{explained}"
                );
            }),
        ),
        row(
            "strict with domains, not transparent, other limits: no pool",
            &format!(
                "{STRICT}[egress]\ntransparent = false\nports = [8443]\nmax_connections = 4\nallow_addresses = [\"127.0.0.1\", \"10.0.0.0/8\"]\nhosts = {{ \"API.example.\" = \"127.0.0.1\", \"b.example\" = [\"::1\", \"10.1.2.3\"] }}\n"
            ),
            TierC,
            args(&["ls"]),
            Allow(|r, _| {
                let e = r.egress_plan.as_ref().expect("an egress plan");
                assert!(e.pool.is_empty() && r.plan.listeners.len() == 3);
                assert_eq!((e.ports.as_slice(), e.max_connections), (&[8443][..], 4));
                assert_eq!(e.allow_addresses.len(), 2);
                assert_eq!(e.hosts["api.example"], ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]);
                assert_eq!(e.hosts["b.example"].len(), 2);
                assert_eq!(r.plan.landlock.tcp_connect, [53, 3128, 8443]);
            }),
        ),
        row(
            "strict without domains: loopback alone, no listeners",
            "[defaults]\negress = \"strict\"\n",
            TierC,
            args(&["ls"]),
            Allow(|r, _| {
                let p = &r.plan;
                assert!(r.egress_plan.is_none() && p.listeners.is_empty() && p.loopback);
                assert!(!p.env.iter().any(|(k, _)| k.ends_with("PROXY")));
                assert!(!p.mounts.iter().any(|m| matches!(m, Mount::File { .. })));
                assert!(!p.landlock.wanted.contains(palisade_protocol::LandlockFeatures::NET_TCP));
                assert_eq!(r.network, palisade_protocol::attest::Network::LoopbackOnly);
            }),
        ),
        row(
            "a request narrows the domains: the plan has only those",
            STRICT,
            TierC,
            narrowed(&["files.pkgs.example.org", "*.cdn.pkgs.example.org", "GitHub.com."]),
            Allow(|r, _| {
                let e = r.egress_plan.as_ref().expect("an egress plan");
                assert_eq!(e.domains, ["*.cdn.pkgs.example.org", "files.pkgs.example.org", "github.com"]);
                assert_eq!(e.pool[0].name.as_deref(), Some("files.pkgs.example.org"));
            }),
        ),
    ]
}

/// Strict egress and requests' domains: refused.
fn strict_egress_refused() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        row(
            "preflight narrowed: a host outside the narrowed list is refused",
            GITHUB,
            TierC,
            |f: &Fixture| RunRequest {
                allow_domains: Some(vec![]),
                ..f.request(&["curl", "https://github.com/"])
            },
            Deny(CAP, "egress.host_not_allowed"),
        ),
        row(
            "a request names a domain its profile lacks",
            STRICT,
            TierC,
            narrowed(&["evil.example"]),
            Deny(CAP, "egress.domain_not_granted"),
        ),
        row(
            "a request widens *.pkgs.example.org to pkgs.example.org",
            STRICT,
            TierC,
            narrowed(&["pkgs.example.org"]),
            Deny(CAP, "egress.domain_not_granted"),
        ),
        row(
            "a request widens an exact name to a pattern",
            STRICT,
            TierC,
            narrowed(&["*.github.com"]),
            Deny(CAP, "egress.domain_not_granted"),
        ),
        row(
            "a request asks for a domain under a deny network",
            "",
            TierC,
            narrowed(&["github.com"]),
            Deny(CAP, "egress.domain_not_granted"),
        ),
        row(
            "too many names × ports for one plan",
            &format!(
                "[defaults]\negress = \"strict\"\nnetwork = {{ allow_domains = [{}] }}\n",
                (0..130).map(|i| format!("\"h{i}.example\"")).collect::<Vec<_>>().join(", ")
            ),
            TierC,
            args(&["ls"]),
            Deny(INVALID, "egress.too_many_listeners"),
        ),
    ]
}

/// A terminal: the plan's in Tier C, refused where the sandbox has no /dev
/// of its own, and of a window no terminal has.
fn terminals() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        row(
            "a terminal in Tier C: the plan's, of the asked window, with /dev",
            "",
            TierC,
            ls_in_terminal(50, 120),
            Allow(|r, _| {
                assert_eq!(r.plan.terminal, Some(WindowSize { rows: 50, cols: 120 }));
                assert!(r.plan.mounts.iter().any(|m| matches!(m, Mount::Dev { .. })));
            }),
        ),
        row(
            "a terminal in Tier B, which has no /dev of its own",
            WARN,
            NoUserNamespaces,
            ls_in_terminal(24, 80),
            Deny(UNAVAILABLE, "terminal.unavailable"),
        ),
        row(
            "a terminal under Seatbelt",
            "",
            Seatbelt,
            ls_in_terminal(24, 80),
            Deny(UNAVAILABLE, "terminal.unavailable"),
        ),
        row(
            "a terminal of no rows",
            "",
            TierC,
            ls_in_terminal(0, 80),
            Deny(ErrorKind::InvalidRequest, "request.terminal"),
        ),
    ]
}

/// Allowed on other hosts and brokers, and with interpreters allowed.
fn allowed_elsewhere() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        row(
            "no user namespaces, warn_and_execute: Tier B with a warning",
            WARN,
            NoUserNamespaces,
            |f: &Fixture| f.request_in("ws/src", &["ls"]),
            Allow(|r, _| {
                let p = &r.plan;
                assert_eq!(p.tier(), Tier::B);
                assert!(p.mounts.is_empty() && p.namespaces.names().is_empty() && !r.warnings.is_empty());
                assert!(r.host_dirs.iter().all(|d| d.starts_with("/run/palisade-test/run-1-1-7")));
                assert!(p.env.contains(&("TMPDIR".into(), "/run/palisade-test/run-1-1-7/tmp".into())));
                assert!(
                    p.landlock.write.contains(&"/dev/null".to_string()),
                    "the host's devices: {:?}",
                    p.landlock.write
                );
            }),
        ),
        row(
            "a cgroup for runs: limits planned, rlimits a looser floor",
            "",
            Cgroup,
            args(&["ls"]),
            Allow(|r, _| {
                let c = r.cgroup.as_ref().unwrap();
                assert_eq!((c.name.as_str(), c.memory_bytes, c.processes), ("run-1-1-7", 512 << 20, 256));
                assert_eq!(r.plan.cgroup.as_deref(), Some("/sys/fs/cgroup/palisade/run-1-1-7"));
                let l = &r.plan.rlimits;
                assert_eq!(
                    (l.address_space.hard, l.data.hard, l.processes.hard),
                    (4 * (512 << 20), 4 * (512 << 20), 512)
                );
            }),
        ),
        row(
            "a root broker: the requester's own block of host ids",
            "",
            RootFor(1000),
            args(&["ls"]),
            Allow(|r, _| {
                let ids = HostIds { uid: 0x7000_0000 + 1000, gid: 0x7000_0000 + 1000 };
                assert_eq!(
                    (r.plan.host_ids, r.plan.acting_for),
                    (Some(ids), Some(HostIds { uid: 1000, gid: 1000 }))
                );
            }),
        ),
        row(
            "interpreters allowed: a script runs",
            ALLOW_INTERPRETERS,
            TierC,
            args(&["sh", "build.sh"]),
            Allow(|r, _| {
                assert_eq!(r.plan.program, "/usr/bin/sh");
            }),
        ),
    ]
}

const PROFILES: &str = "[profiles.build]\nallow_interpreters = true\nmax_memory_mb = 2048\n\
                        pass_env = [\"CARGO_HOME\"]\nread_only = [\"/opt\"]\n";
fn ask(
    argv: &'static [&'static str],
    edit: fn(&mut RunRequest, &Fixture),
) -> impl Fn(&Fixture) -> RunRequest {
    move |f: &Fixture| {
        let mut r = f.request(argv);
        edit(&mut r, f);
        r
    }
}

/// A request with its own asks: each narrows the profile, or is refused
/// (rule `request.widens`); a named profile replaces `[defaults]`.
fn asks() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        row(
            "a named profile's interpreters, memory and variables",
            PROFILES,
            TierC,
            ask(&["sh", "build.sh"], |r, _| {
                r.profile = Some("build".into());
                r.allow_interpreters = true;
                r.env.insert("CARGO_HOME".into(), "/c".into());
                r.pass_env = vec!["CARGO_HOME".into()];
            }),
            Allow(|r, _| {
                assert_eq!(r.capabilities.process.max_memory_mb, 2048);
                assert!(r.plan.env.contains(&("CARGO_HOME".into(), "/c".into())), "{:?}", r.plan.env);
            }),
        ),
        row(
            "lower limits and no fork",
            "",
            TierC,
            ask(&["ls"], |r, _| {
                (r.max_memory_mb, r.max_processes, r.no_fork) = (Some(64), Some(8), true);
            }),
            Allow(|r, _| {
                let p = r.capabilities.process;
                assert_eq!((p.max_memory_mb, p.max_processes, p.no_fork), (64, 8, true));
            }),
        ),
        row(
            "paths inside what is granted, and the system's",
            "",
            TierC,
            ask(&["ls"], |r, f| {
                r.read_only = vec![f.p("ws/src"), "/usr/bin".into()];
                r.read_write = vec!["src".into()];
            }),
            Allow(|_, _| {}),
        ),
    ]
}

/// Asks the profile does not allow, or that name nothing.
fn asks_refused() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        row(
            "an unknown profile",
            PROFILES,
            TierC,
            ask(&["ls"], |r, _| r.profile = Some("x".into())),
            Deny(INVALID, "profiles.unknown"),
        ),
        row(
            "a profile with a tool",
            TOOLS,
            TierC,
            ask(&["ls"], |r, _| (r.profile, r.tool) = (Some("build".into()), Some("scan".into()))),
            Deny(INVALID, "request.profile_with_tool"),
        ),
        row(
            "interpreters the profile refuses",
            "",
            TierC,
            ask(&["sh", "build.sh"], |r, _| r.allow_interpreters = true),
            Deny(CAP, "request.widens"),
        ),
        row(
            "inline code the profile refuses",
            ALLOW_INTERPRETERS,
            TierC,
            ask(&["ls"], |r, _| r.allow_inline_code = true),
            Deny(CAP, "request.widens"),
        ),
        row(
            "more memory",
            "",
            TierC,
            ask(&["ls"], |r, _| r.max_memory_mb = Some(4096)),
            Deny(CAP, "request.widens"),
        ),
        row(
            "more processes",
            "",
            TierC,
            ask(&["ls"], |r, _| r.max_processes = Some(100_000)),
            Deny(CAP, "request.widens"),
        ),
        row(
            "no memory at all",
            "",
            TierC,
            ask(&["ls"], |r, _| r.max_memory_mb = Some(0)),
            Deny(INVALID, "request.limit"),
        ),
        row(
            "a umask beyond the permission bits",
            "",
            TierC,
            ask(&["ls"], |r, _| r.umask = Some(0o4022)),
            Deny(INVALID, "request.umask"),
        ),
        row(
            "a path outside the grants",
            "",
            TierC,
            ask(&["ls"], |r, f| r.read_only = vec![f.p("outside")]),
            Deny(CAP, "request.widens"),
        ),
        row(
            "a system path written",
            "",
            TierC,
            ask(&["ls"], |r, _| r.read_write = vec!["/usr".into()]),
            Deny(CAP, "request.widens"),
        ),
        row(
            "a path that does not exist",
            "",
            TierC,
            ask(&["ls"], |r, _| r.read_only = vec!["nope".into()]),
            Deny(INVALID, "request.path"),
        ),
        row(
            "a variable the profile does not pass",
            "",
            TierC,
            ask(&["ls"], |r, _| {
                r.env.insert("TOKEN".into(), "t".into());
                r.pass_env = vec!["TOKEN".into()];
            }),
            Deny(CAP, "request.widens"),
        ),
        row(
            "a variable the request does not hold",
            PROFILES,
            TierC,
            ask(&["ls"], |r, _| {
                r.profile = Some("build".into());
                r.pass_env = vec!["CARGO_HOME".into()];
            }),
            Deny(INVALID, "request.pass_env"),
        ),
        row(
            "more memory for a tool",
            TOOLS,
            TierC,
            ask(&["ls"], |r, _| {
                r.tool = Some("scan".into());
                r.max_memory_mb = Some(1 << 20);
            }),
            Deny(CAP, "request.widens"),
        ),
    ]
}

/// Put to a person, or refused for what the request is or names.
fn refused_for_the_request() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        // Needs approval.
        row(
            "no user namespaces, request_approval: the Tier B run, put to a person",
            ASK,
            NoUserNamespaces,
            |f: &Fixture| f.request_in("ws/src", &["ls"]),
            Approval(|r, _| {
                assert_eq!(r.plan.tier(), Tier::B);
            }),
        ),
        // Refused: the request's shape.
        row(
            "no cwd",
            "",
            TierC,
            |f: &Fixture| RunRequest { cwd: None, ..f.request(&["ls"]) },
            Deny(INVALID, "request.cwd"),
        ),
        row(
            "a cwd that is a file",
            "",
            TierC,
            |f: &Fixture| f.request_in("ws/src/main.rs", &["ls"]),
            Deny(INVALID, "request.path"),
        ),
        row("an empty command", "", TierC, args(&[]), Deny(INVALID, "limits.empty_command")),
        row(
            "a command longer than max_command_bytes",
            "[policy]\nmax_command_bytes = 1\n",
            TierC,
            args(&["ls"]),
            Deny(INVALID, "limits.command_bytes"),
        ),
        row(
            "more arguments than max_arguments",
            "[policy]\nmax_arguments = 1\n",
            TierC,
            args(&["ls", "src", "src"]),
            Deny(INVALID, "limits.arguments"),
        ),
        row(
            "an argument longer than max_argument_bytes",
            "[policy]\nmax_argument_bytes = 2\n",
            TierC,
            args(&["ls", "src"]),
            Deny(INVALID, "limits.argument_bytes"),
        ),
        row(
            "more variables than max_env_vars",
            "[policy]\nmax_env_vars = 1\n",
            TierC,
            args(&["ls"]),
            Deny(INVALID, "limits.env_vars"),
        ),
        row(
            "a root broker, a cwd it does not find",
            "",
            RootFor(1000),
            |f: &Fixture| f.request_in("ws/not-here", &["ls"]),
            Deny(INVALID, "request.not_visible"),
        ),
        row("a NUL byte", "", TierC, args(&["ls", "a\0b"]), Deny(INVALID, "limits.nul_byte")),
        // The tool and its parameters.
        row("an unknown tool", TOOLS, TierC, tool("nope", &["ls"], &[]), Deny(INVALID, "tools.unknown")),
        row(
            "an undeclared parameter",
            TOOLS,
            TierC,
            tool("convert", &["cp"], &[("other", "ws/src")]),
            Deny(DENY, "tools.undeclared_parameter"),
        ),
        row(
            "a parameter that is not the file it must be",
            TOOLS,
            TierC,
            tool("convert", &["cp"], &[("input", "ws/src")]),
            Deny(INVALID, "tools.parameter_validation"),
        ),
        row(
            "a parameter the requester cannot reach",
            TOOLS,
            TierC,
            tool("convert", &["cp"], &[("input", "/srv/private")]),
            Deny(SCOPE, "scope.not_allowed"),
        ),
        row(
            "a grant of a sensitive path through a template",
            TOOLS,
            TierC,
            tool("peek", &["ls"], &[]),
            Deny(SCOPE, "scope.sensitive_path"),
        ),
        row(
            "a writable grant that does not exist",
            TOOLS,
            TierC,
            tool("out", &["ls"], &[]),
            Deny(INVALID, "filesystem.missing"),
        ),
    ]
}

/// Refused for the program: not found, not visible, an interpreter.
fn refused_for_the_program() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        // The executable.
        row("a program not found", "", TierC, args(&["no-such-program"]), Deny(INVALID, "command.not_found")),
        row(
            "a file that is not executable",
            "",
            TierC,
            args(&["readme"]),
            Deny(INVALID, "command.not_found"),
        ),
        row(
            "a program outside what the sandbox may execute",
            "",
            TierC,
            |f: &Fixture| f.request(&[&f.p("outside/tool")]),
            Deny(DENY, "executables.not_visible"),
        ),
        // Interpreters.
        row(
            "a shell, interpreters not allowed",
            "",
            TierC,
            args(&["sh", "-c", "id"]),
            Deny(DENY, "interpreters.denied"),
        ),
        row(
            "a script whose #! names a shell",
            "",
            TierC,
            args(&["build"]),
            Deny(DENY, "interpreters.denied"),
        ),
        row(
            "a renamed copy of a shell (same bytes)",
            "",
            TierC,
            args(&["innocent"]),
            Deny(DENY, "interpreters.denied"),
        ),
        row(
            "a shell through a launcher",
            "",
            TierC,
            args(&["env", "-i", "bash"]),
            Deny(DENY, "interpreters.denied"),
        ),
        row(
            "inline code, interpreters allowed",
            ALLOW_INTERPRETERS,
            TierC,
            args(&["python3", "-c", "print(1)"]),
            Deny(DENY, "interpreters.inline_code"),
        ),
        row(
            "git told to run a command",
            ALLOW_INTERPRETERS,
            TierC,
            args(&["git", "-c", "alias.x=!id", "x"]),
            Deny(DENY, "interpreters.inline_code"),
        ),
        row(
            "the dynamic loader",
            ALLOW_INTERPRETERS,
            TierC,
            args(&["/lib64/ld-linux-x86-64.so.2", "/usr/bin/ls"]),
            Deny(DENY, "interpreters.loader"),
        ),
    ]
}

/// What the broker keeps: hidden in a home used as the workspace, never
/// granted, refused where the run writes in place.
fn broker_state() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        row(
            "the broker's state hidden in a home used as the workspace",
            "",
            TierC,
            |f: &Fixture| f.request_in("home", &["ls"]),
            Allow(|r, f| {
                let hidden = f.p("home/.local/state/palisade");
                let hides =
                    |m: &Mount| matches!(m, Mount::Tmpfs { target, mode: 0, .. } if *target == hidden);
                assert!(r.plan.mounts.iter().any(hides), "{:?}", r.plan.mounts);
            }),
        ),
        row(
            "a tool's parameter inside the broker's state",
            TOOLS,
            TierC,
            tool("convert", &["cat"], &[("input", "home/.local/state/palisade/journal/segment")]),
            Deny(SCOPE, "scope.broker_state"),
        ),
        row(
            "a home holding the broker's state, written in place",
            "[defaults]\ndisk = \"direct\"\n",
            TierC,
            |f: &Fixture| f.request_in("home", &["ls"]),
            Deny(SCOPE, "scope.broker_state"),
        ),
        row(
            "what the host executes in a tree written in place is mounted read-only over itself",
            "[defaults]\ndisk = \"direct\"\n",
            TierC,
            |f: &Fixture| f.request(&["ls"]),
            Allow(|r, f| {
                let ws = r.plan.mounts.iter().position(
                    |m| matches!(m, Mount::Bind { target, writable: true, .. } if *target == f.p("ws")),
                );
                for held in [f.p("ws/.envrc"), f.p("ws/src/.vscode")] {
                    let at = r.plan.mounts.iter().position(|m| matches!(m, Mount::Bind { source, target, writable: false, owned: true } if *source == held && *target == held));
                    assert!(at.is_some() && at > ws, "{held}: {:?}", r.plan.mounts);
                    assert!(
                        r.plan.descriptors.iter().any(|d| d.path == held && !d.host_layout),
                        "{held}: opened with no symlink on the way"
                    );
                }
            }),
        ),
        row(
            "a workspace written in place that is itself where the host executes from",
            "[defaults]\ndisk = \"direct\"\n",
            TierC,
            |f: &Fixture| f.request_in("ws/src/.vscode", &["ls"]),
            Deny(SCOPE, "scope.host_executed"),
        ),
        row(
            "with a change set, nothing of the workspace is mounted over",
            "",
            TierC,
            |f: &Fixture| f.request(&["ls"]),
            Allow(|r, f| {
                let envrc = f.p("ws/.envrc");
                assert!(
                    !r.plan
                        .mounts
                        .iter()
                        .any(|m| matches!(m, Mount::Bind { target, .. } if *target == envrc)),
                    "{:?}",
                    r.plan.mounts
                );
            }),
        ),
        row(
            "Tier B cannot hide the broker's state",
            WARN,
            NoUserNamespaces,
            |f: &Fixture| f.request_in("home/.local", &["ls"]),
            Deny(SCOPE, "scope.broker_state"),
        ),
    ]
}

/// Refused for a path, a command line, a host, or what the host lacks.
fn refused_for_paths_and_hosts() -> Vec<Row> {
    use On::*;
    use Want::*;
    vec![
        // The workspace scope and sensitive paths.
        row(
            "a path outside the roots",
            "",
            TierC,
            |f: &Fixture| f.request(&["cat", &f.p("outside/secret")]),
            Deny(SCOPE, "scope.outside_roots"),
        ),
        row(
            "a symlink out of the workspace",
            "",
            TierC,
            args(&["cat", "link-out/secret"]),
            Deny(SCOPE, "scope.outside_roots"),
        ),
        row("~/.ssh", "", TierC, args(&["cat", "~/.ssh/id_ed25519"]), Deny(SCOPE, "scope.sensitive_path")),
        row("/etc/shadow", "", TierC, args(&["cat", "/etc/shadow"]), Deny(SCOPE, "scope.sensitive_path")),
        row(
            "Tier B cannot hide the workspace's .ssh",
            WARN,
            NoUserNamespaces,
            args(&["ls"]),
            Deny(SCOPE, "scope.sensitive_path"),
        ),
        row(
            "/ granted as a whole",
            "[defaults]\nread_only = [\"/\"]\n",
            TierC,
            args(&["ls"]),
            Deny(SCOPE, "scope.root"),
        ),
        // Blocked patterns.
        row(
            "sudo inside inline code",
            ALLOW_INLINE,
            TierC,
            args(&["sh", "-c", "echo x; sudo id"]),
            Deny(DENY, "patterns.blocked"),
        ),
        // Egress.
        row(
            "a host not on the allow-list",
            GITHUB,
            TierC,
            args(&["curl", "https://evil.example/"]),
            Deny(CAP, "egress.host_not_allowed"),
        ),
        row(
            "a proxy option of a known tool",
            GITHUB,
            TierC,
            args(&["curl", "--proxy", "127.0.0.1:8080", "https://github.com/"]),
            Deny(CAP, "egress.redirected"),
        ),
        row(
            "strict egress without a network namespace",
            &format!("{WARN}{GITHUB}egress = \"strict\"\n"),
            NoUserNamespaces,
            |f: &Fixture| f.request_in("ws/src", &["ls"]),
            Deny(UNAVAILABLE, "egress.strict_unavailable"),
        ),
        row(
            "strict egress with domains in Tier B: refused, not downgraded",
            &format!("{WARN}{STRICT}"),
            NoUserNamespaces,
            |f: &Fixture| f.request_in("ws/src", &["ls"]),
            Deny(UNAVAILABLE, "egress.strict_unavailable"),
        ),
        // The host's mechanisms: fail closed.
        row(
            "allowed domains under Seatbelt: refused, never the host's network",
            GITHUB,
            Seatbelt,
            args(&["ls"]),
            Deny(UNAVAILABLE, "egress.domains_unenforced"),
        ),
        row(
            "no user namespaces, fallback deny",
            "",
            NoUserNamespaces,
            args(&["ls"]),
            Deny(UNAVAILABLE, "fallback.deny"),
        ),
        row(
            "a Landlock feature the kernel lacks",
            "[policy]\nrequire_landlock = [\"net.tcp\"]\n",
            LandlockAbi(2),
            args(&["ls"]),
            Deny(UNAVAILABLE, "landlock.unsupported"),
        ),
        row(
            "a cgroup required, none available",
            "[policy]\nrequire_cgroup = true\n",
            TierC,
            args(&["ls"]),
            Deny(UNAVAILABLE, "cgroup.unavailable"),
        ),
        row(
            "a root broker, a requester beyond its sandbox ids",
            "",
            RootFor(70000),
            args(&["ls"]),
            Deny(ErrorKind::Unauthorized, "broker.sandbox_ids"),
        ),
    ]
}

#[test]
fn decisions() {
    let f = Fixture::new("table");
    for row in rows() {
        let mut config = Config::parse(&row.config, Path::new("table.toml")).unwrap();
        // The table's requests only narrow, as a system broker's do (its
        // requester is the broker's own uid; `owner_widens` is tested apart).
        config.broker.owner_widens = false;
        let host = f.host(row.on);
        let decision = Policy::new(config, &*host.files).decide(&host, &context(row.on), &(row.request)(&f));
        match (row.want, decision) {
            (Want::Allow(check), Decision::Allow(r)) => check(&r, &f),
            (Want::Approval(check), Decision::NeedsApproval { reason, resolved, .. }) => {
                assert!(reason.contains("Tier B"), "{}: {reason}", row.what);
                check(&resolved, &f)
            }
            (Want::Deny(kind, rule), Decision::Deny(d)) => {
                assert_eq!((d.kind, d.rule), (kind, rule), "{}: {}", row.what, d.reason);
                names_a_fix_or_why_none(&d);
            }
            (_, other) => panic!("{}: {other:?}", row.what),
        }
    }
}

/// A refusal a flag or key lifts ends with it (`Denial::finish`), and only
/// such a one; any other says why none does
/// ([`crate::denial::names_a_fix_or_why_none`]).
fn names_a_fix_or_why_none(d: &crate::Denial) {
    if d.fix.is_some() {
        let end = d.reason.contains("; allow it with `") || d.reason.contains("(an operator would set `");
        assert!(end, "{}: a fix that the reason does not end with: {}", d.rule, d.reason);
    }
    crate::denial::names_a_fix_or_why_none(d.rule, &d.reason).unwrap_or_else(|e| panic!("{e}"));
}

/// A refused ask names the flag and the key an operator would change.
#[test]
fn a_widening_ask_names_its_flag_and_key() {
    let f = Fixture::new("widens");
    let host = f.host(On::TierC);
    let mut config = Config::parse(TOOLS, Path::new("t.toml")).unwrap();
    config.broker.owner_widens = false;
    let policy = Policy::new(config, &*host.files);
    let reason = |edit: fn(&mut RunRequest)| {
        let mut r = f.request(&["ls"]);
        edit(&mut r);
        match policy.decide(&host, &context(On::TierC), &r) {
            Decision::Deny(d) => d.reason,
            other => panic!("{other:?}"),
        }
    };
    type Edit = fn(&mut RunRequest);
    let cases: [(Edit, &[&str]); 4] = [
        (|r| r.allow_interpreters = true, &["--allow-interpreters", "[defaults] allow_interpreters = true"]),
        (
            |r| r.max_memory_mb = Some(4096),
            &["--memory", "4096 is above the policy's 512", "[defaults] max_memory_mb = 4096"],
        ),
        (
            |r| (r.tool, r.max_processes) = (Some("scan".into()), Some(1 << 20)),
            &["--processes", "[tools.scan.overrides] process = { max_processes = 1048576 }"],
        ),
        (
            |r| {
                r.env.insert("TOKEN".into(), "t".into());
                r.pass_env = vec!["TOKEN".into()];
            },
            &["--env", "TOKEN is not passed", "[defaults] pass_env = [\"TOKEN\"]"],
        ),
    ];
    for (edit, wants) in cases {
        let reason = reason(edit);
        for want in wants {
            assert!(reason.contains(want), "{want:?} is not in {reason:?}");
        }
    }
}

/// An allow-list names the programs a profile may run: others are refused.
#[test]
fn the_executable_allow_list() {
    let f = Fixture::new("allow-list");
    let host = f.host(On::TierC);
    let mut config = Config::default();
    config.defaults.allowed_executables = vec![toml::Spanned::new(0..0, "ls".into())];
    let policy = Policy::new(config, &*host.files);
    let decide = |argv: &[&str]| policy.decide(&host, &context(On::TierC), &f.request(argv));
    assert!(matches!(decide(&["ls"]), Decision::Allow(_)));
    match decide(&["cat", "src/main.rs"]) {
        Decision::Deny(d) => {
            assert_eq!((d.kind, d.rule), (DENY, "executables.not_allowed"));
            crate::denial::names_a_fix_or_why_none("executables.not_allowed", &d.reason).unwrap();
        }
        other => panic!("{other:?}"),
    }
}

/// A tool's trust stage, passed in by the broker, turned into a refusal
/// (Draft), a question with its trigger (Trial, an escalation) or nothing
/// (Verified, in range); a sensitive path is refused at every stage, and
/// with stages off (or no tool) nothing changes.
#[test]
fn trust_stages() {
    use crate::trust::{EscalationReason, ToolTrust, TrustStage};
    let f = Fixture::new("trust");
    std::fs::write(f.root.join("ws/in.txt"), "in").unwrap();
    let host = f.host(On::TierC);
    let text = "[tools.t]\n[tools.t.overrides]\nfilesystem = [{ read_only = \"${WORKSPACE}\" }]\n\
                [tools.t.parameters.input]\ncapability = \"filesystem.read_only\"\nvalidation = \"is_file\"\nmapping = \"single\"\n";
    let policy = Policy::new(Config::parse(text, Path::new("trust.toml")).unwrap(), &*host.files);
    let at = |stage, successes| ToolTrust { stage, successes, trial_runs: 3 };
    let decide = |trust: Option<ToolTrust>, params: &'static [(&'static str, &'static str)]| {
        let ctx = Context { trust, ..context(On::TierC) };
        policy.decide(&host, &ctx, &tool("t", &["cat", "in.txt"], params)(&f))
    };
    let question = |d: Decision| match d {
        Decision::NeedsApproval { reason, resolved, .. } => (reason, resolved),
        other => panic!("{other:?}"),
    };
    let refusal = |d: Decision| match d {
        Decision::Deny(d) => {
            names_a_fix_or_why_none(&d);
            d
        }
        other => panic!("{other:?}"),
    };
    let input: &[(&str, &str)] = &[("input", "ws/in.txt")];

    // Draft: not executable, and the refusal says how to get it reviewed.
    let d = refusal(decide(Some(at(TrustStage::Draft, 0)), input));
    assert_eq!((d.kind, d.rule), (DENY, "trust.draft"));
    crate::denial::names_a_fix_or_why_none("trust.draft", &d.reason).unwrap();
    assert!(d.reason.contains("palisade tools show t") && d.reason.contains("palisade tools approve t"));
    // Trial: every run asks; the first says it is the first.
    let (reason, r) = question(decide(Some(at(TrustStage::Trial, 0)), input));
    assert!(reason.contains("(1 of 3)"), "{reason}");
    assert_eq!(r.escalation.map(|t| t.reason), Some(EscalationReason::FirstExecution));
    let (reason, r) = question(decide(Some(at(TrustStage::Trial, 2)), input));
    assert!(reason.contains("(3 of 3)") && r.escalation.is_none(), "{reason}");
    // Verified: silent in range.
    assert!(matches!(decide(Some(at(TrustStage::Verified, 0)), input), Decision::Allow(_)));

    // PathOutOfScope: outside the declared range (the workspace), with the range shown.
    let (reason, r) = question(decide(Some(at(TrustStage::Verified, 0)), &[("input", "outside/secret")]));
    let t = r.escalation.unwrap();
    assert_eq!((t.reason, t.requested_path), (EscalationReason::PathOutOfScope, Some(f.p("outside/secret"))));
    assert_eq!(t.approved_paths, [format!("{} (read-only)", f.p("ws"))]);
    assert!(reason.contains("back to Draft"), "{reason}");
    // UndeclaredBinding: asked; approved, the parameter grants nothing.
    let (_, r) = question(decide(
        Some(at(TrustStage::Verified, 0)),
        &[("input", "ws/in.txt"), ("other", "outside/secret")],
    ));
    let t = r.escalation.unwrap();
    assert_eq!((t.reason, t.requested_path.as_deref()), (EscalationReason::UndeclaredBinding, Some("other")));
    assert!(!r.granted.iter().any(|p| p.starts_with(f.p("outside"))), "{:?}", r.granted);
    // SensitiveDirectory: refused at every stage, approval or not.
    for stage in [TrustStage::Trial, TrustStage::Verified] {
        let d = refusal(decide(Some(at(stage, 0)), &[("input", "home/.ssh/id_ed25519")]));
        assert_eq!((d.kind, d.rule), (SCOPE, "trust.sensitive_directory"), "{}", d.reason);
        crate::denial::names_a_fix_or_why_none("trust.sensitive_directory", &d.reason).unwrap();
    }

    // Counter-tests: stages off, the same requests are decided as before.
    assert!(matches!(decide(None, &[("input", "outside/secret")]), Decision::Allow(_)));
    assert_eq!(refusal(decide(None, &[("other", "ws/in.txt")])).rule, "tools.undeclared_parameter");
    assert_eq!(refusal(decide(None, &[("input", "home/.ssh/id_ed25519")])).rule, "scope.sensitive_path");
    // The default profile has no stage, whatever the context says.
    let ctx = Context { trust: Some(at(TrustStage::Draft, 0)), ..context(On::TierC) };
    assert!(matches!(policy.decide(&host, &ctx, &f.request(&["cat", "in.txt"])), Decision::Allow(_)));
}

/// Cedar: what the built-in checks allow, a `[policy] cedar` file can only
/// narrow. Each case is a policy file, a configuration, who asks and what,
/// and the decision: the same request is allowed without the file (checked
/// once per case, so that a refusal here is Cedar's).
mod cedar {
    use super::*;
    use crate::cedar::Principal;

    /// The decision on `req` under `toml` with the Cedar `policies` added,
    /// asked by `uid` (gid the same) with supplementary `groups`.
    fn decide(
        f: &Fixture,
        on: On,
        toml: &str,
        policies: Option<&str>,
        (uid, groups): (u32, &[u32]),
        req: &RunRequest,
    ) -> Decision {
        let mut toml = toml.to_string();
        if let Some(text) = policies {
            let file = f.root.join("policy.cedar");
            std::fs::write(&file, text).unwrap();
            let key = format!("[policy]\ncedar = {:?}\n", file.to_string_lossy());
            toml = if toml.contains("[policy]\n") {
                toml.replacen("[policy]\n", &key, 1)
            } else {
                format!("{key}{toml}")
            };
        }
        let config = Config::parse(&toml, Path::new("cedar.toml")).unwrap();
        let host = f.host(on);
        let mut ctx = context(on);
        ctx.requester = HostIds { uid, gid: uid };
        ctx.groups = groups.to_vec();
        Policy::new(config, &*host.files).decide(&host, &ctx, req)
    }

    /// The Cedar refusal of `decision`: its rule and reason.
    fn refused(what: &str, decision: Decision) -> (&'static str, String) {
        match decision {
            Decision::Deny(d) => {
                assert_eq!(d.kind, DENY, "{what}: {}", d.reason);
                (d.rule, d.reason)
            }
            other => panic!("{what}: not refused: {other:?}"),
        }
    }

    /// The Cedar policies that permitted `decision`.
    fn permitted(what: &str, decision: Decision) -> Vec<String> {
        match decision {
            Decision::Allow(r) | Decision::NeedsApproval { resolved: r, .. } => {
                r.cedar.unwrap_or_else(|| panic!("{what}: no Cedar verdict")).permitted_by
            }
            Decision::Deny(d) => panic!("{what}: refused: {} {}", d.rule, d.reason),
        }
    }

    const USER: (u32, &[u32]) = (1000, &[]);

    /// (what, configuration, policies, who, request (`@tool` first: a
    /// tool's), the rule that refuses it or "" when allowed)
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        (u32, &'static [u32]),
        &'static [&'static str],
        &'static str,
    );

    fn cases() -> Vec<Case> {
        [permits(), forbids()].concat()
    }

    /// Who is permitted, and who is not.
    fn permits() -> Vec<Case> {
        vec![
            (
                "permit by user",
                "",
                r#"@id("u1000") permit(principal == User::"1000", action, resource);"#,
                USER,
                &["ls"],
                "",
            ),
            (
                "another user: no permit",
                "",
                r#"permit(principal == User::"1000", action, resource);"#,
                (1001, &[]),
                &["ls"],
                "cedar.no_permit",
            ),
            (
                "permit by a supplementary group",
                "",
                r#"@id("devs") permit(principal in Group::"4242", action, resource);"#,
                (1001, &[4242]),
                &["ls"],
                "",
            ),
            (
                "not in the group: no permit",
                "",
                r#"permit(principal in Group::"4242", action, resource);"#,
                (1001, &[4243]),
                &["ls"],
                "cedar.no_permit",
            ),
            (
                "permit by the primary group",
                "",
                r#"@id("g1001") permit(principal in Group::"1001", action, resource);"#,
                (1001, &[]),
                &["ls"],
                "",
            ),
            ("no policy at all: Cedar denies", "", "", USER, &["ls"], "cedar.no_permit"),
        ]
    }

    /// What a forbid refuses, by the run's context and resource.
    fn forbids() -> Vec<Case> {
        vec![
            (
                "forbid the network",
                GITHUB,
                "permit(principal, action, resource);\n@id(\"no-network\") forbid(principal, action, resource) when { context.network };",
                USER,
                &["curl", "https://github.com/"],
                "cedar.forbid",
            ),
            (
                "forbid an allowed domain",
                GITHUB,
                "permit(principal, action, resource);\n@id(\"no-github\") forbid(principal, action, resource) when { context.allow_domains.contains(\"github.com\") };",
                USER,
                &["curl", "https://github.com/"],
                "cedar.forbid",
            ),
            (
                "forbid the network: none asked",
                "",
                "@id(\"all\") permit(principal, action, resource);\nforbid(principal, action, resource) when { context.network };",
                USER,
                &["ls"],
                "",
            ),
            (
                "forbid a memory limit over 256 MiB",
                "",
                "permit(principal, action, resource);\n@id(\"small\") forbid(principal, action, resource) when { context.memory_mb > 256 };",
                USER,
                &["ls"],
                "cedar.forbid",
            ),
            (
                "a memory limit under it",
                "[defaults]\nmax_memory_mb = 128\n",
                "@id(\"all\") permit(principal, action, resource);\nforbid(principal, action, resource) when { context.memory_mb > 256 };",
                USER,
                &["ls"],
                "",
            ),
            (
                "forbid a writable workspace",
                "",
                "permit(principal, action, resource);\n@id(\"read-only\") forbid(principal, action, resource) unless { context.read_write.isEmpty() };",
                USER,
                &["ls"],
                "cedar.forbid",
            ),
            (
                "forbid a program",
                "",
                "permit(principal, action, resource);\n@id(\"no-curl\") forbid(principal, action == Action::\"run\", resource == Executable::\"/usr/bin/curl\");",
                USER,
                &["curl", "--version"],
                "cedar.forbid",
            ),
            (
                "forbid a program: another one",
                "",
                "@id(\"all\") permit(principal, action, resource);\nforbid(principal, action == Action::\"run\", resource == Executable::\"/usr/bin/curl\");",
                USER,
                &["ls"],
                "",
            ),
            (
                "forbid by path pattern",
                "",
                "permit(principal, action, resource);\n@id(\"no-usr-bin\") forbid(principal, action, resource is Executable) when { resource.path like \"/usr/bin/*\" };",
                USER,
                &["ls"],
                "cedar.forbid",
            ),
            (
                "forbid by argument",
                "",
                "permit(principal, action, resource);\n@id(\"no-force\") forbid(principal, action, resource) when { context.argv.contains(\"--force\") };",
                USER,
                &["git", "push", "--force"],
                "cedar.forbid",
            ),
            (
                "two forbids",
                "",
                "permit(principal, action, resource);\n@id(\"a\") forbid(principal, action, resource);\n@id(\"b\") forbid(principal, action, resource);",
                USER,
                &["ls"],
                "cedar.forbid",
            ),
            (
                "a failing policy refuses",
                "",
                "permit(principal, action, resource);\n@id(\"overflow\") forbid(principal, action, resource) when { context.output_bytes * 1000000000000 < 0 };",
                USER,
                &["ls"],
                "cedar.error",
            ),
            (
                "run_tool is not run",
                TOOLS,
                "permit(principal, action == Action::\"run\", resource);",
                USER,
                &["@scan", "grep", "-r", "x", "src"],
                "cedar.no_permit",
            ),
        ]
    }

    #[test]
    fn cedar_narrows_the_built_in_decision() {
        let f = Fixture::new("cedar");
        for (what, toml, policies, who, argv, want) in cases() {
            let req = match argv.split_first() {
                Some((t, rest)) if t.starts_with('@') => {
                    let mut r = f.request(rest);
                    r.tool = Some(t[1..].into());
                    r
                }
                _ => f.request(argv),
            };
            // Without the file, the same request is allowed, with no verdict.
            match decide(&f, On::TierC, toml, None, who, &req) {
                Decision::Allow(r) => assert!(r.cedar.is_none(), "{what}"),
                other => panic!("{what}: refused without Cedar: {other:?}"),
            }
            let decision = decide(&f, On::TierC, toml, Some(policies), who, &req);
            if want.is_empty() {
                let by = permitted(what, decision);
                assert!(!by.is_empty() && by.iter().all(|n| n.starts_with('"')), "{what}: {by:?}");
                continue;
            }
            let (rule, reason) = refused(what, decision);
            assert_eq!(rule, want, "{what}: {reason}");
            crate::denial::names_a_fix_or_why_none(rule, &reason).unwrap_or_else(|e| panic!("{what}: {e}"));
            // The reason names the policies that decided, by their @id.
            for name in [
                "no-network",
                "no-github",
                "small",
                "read-only",
                "no-curl",
                "no-usr-bin",
                "no-force",
                "overflow",
            ] {
                if policies.contains(&format!("@id(\"{name}\")")) {
                    assert!(reason.contains(&format!("\"{name}\"")), "{what}: {reason}");
                }
            }
            if want == "cedar.no_permit" {
                assert!(
                    reason.contains("no Cedar policy") && reason.contains("denies what no permit allows"),
                    "{reason}"
                );
            }
        }
    }

    /// On a thread whose stack is smaller than Cedar's margin, a run is
    /// still decided (Cedar runs on a stack of its own).
    #[test]
    fn a_small_stack_still_decides() {
        let small = std::thread::Builder::new().stack_size(256 << 10);
        let decided = small.spawn(|| {
            let f = Fixture::new("cedar-stack");
            let policies =
                "@id(\"all\") permit(principal, action, resource) when { context.memory_mb < 1024 };";
            permitted("small stack", decide(&f, On::TierC, "", Some(policies), USER, &f.request(&["ls"])))
        });
        assert_eq!(decided.unwrap().join().unwrap(), ["\"all\""]);
    }

    /// The names of the permits that applied, and of both forbids.
    #[test]
    fn the_deciding_policies_are_named() {
        let f = Fixture::new("cedar-names");
        let req = f.request(&["ls"]);
        let policies = "@id(\"users\") permit(principal in Group::\"1000\", action, resource);\npermit(principal, action == Action::\"run\", resource);\nforbid(principal == User::\"7\", action, resource);";
        assert_eq!(
            permitted("two permits", decide(&f, On::TierC, "", Some(policies), USER, &req)),
            ["\"policy1\"", "\"users\""]
        );
        let two = "permit(principal, action, resource);\n@id(\"a\") forbid(principal, action, resource);\nforbid(principal, action, resource);";
        let (_, reason) = refused("two forbids", decide(&f, On::TierC, "", Some(two), USER, &req));
        assert!(reason.starts_with("Cedar policies \"a\", \"policy2\" forbid the request (User::\"1000\", Action::\"run\", Executable::\"/usr/bin/ls\")"), "{reason}");
    }

    /// The run_tool action's resource is the tool, with its program.
    #[test]
    fn a_tool_is_its_own_resource() {
        let f = Fixture::new("cedar-tool");
        let tools = format!("{TOOLS}\n[tools.look]\npreset = \"code_analyzer\"\n");
        let mut req = f.request(&["grep", "-r", "x", "src"]);
        req.tool = Some("scan".into());
        let policies = "@id(\"scan\") permit(principal, action == Action::\"run_tool\", resource == Tool::\"scan\") when { resource.executable == \"/usr/bin/grep\" && !context.network && context.read_write.isEmpty() };";
        assert_eq!(
            permitted("scan", decide(&f, On::TierC, &tools, Some(policies), USER, &req)),
            ["\"scan\""]
        );
        req.tool = Some("look".into());
        assert!(matches!(decide(&f, On::TierC, &tools, None, USER, &req), Decision::Allow(_)));
        let (rule, _) = refused("look", decide(&f, On::TierC, &tools, Some(policies), USER, &req));
        assert_eq!(rule, "cedar.no_permit");
    }

    /// A run put to a person is put to Cedar first, and says so in its context.
    #[test]
    fn a_run_that_needs_approval_is_asked_too() {
        let f = Fixture::new("cedar-approval");
        let req = f.request_in("ws/src", &["ls"]);
        let policies = "permit(principal, action, resource);\n@id(\"no-tier-b\") forbid(principal, action, resource) when { context.needs_approval || context.tier == \"B\" };";
        let (rule, reason) =
            refused("Tier B", decide(&f, On::NoUserNamespaces, ASK, Some(policies), USER, &req));
        assert_eq!(rule, "cedar.forbid", "{reason}");
        assert!(matches!(
            decide(&f, On::NoUserNamespaces, ASK, None, USER, &req),
            Decision::NeedsApproval { .. }
        ));
    }

    /// `approve`: the approver is the principal, the run the resource and context.
    #[test]
    fn approvers_are_authorized_by_cedar() {
        let f = Fixture::new("cedar-approve");
        let req = f.request_in("ws/src", &["ls"]);
        let policies = "permit(principal, action == Action::\"run\", resource);\n@id(\"wheel approves\") permit(principal in Group::\"10\", action == Action::\"approve\", resource) when { context.requester_uid != principal.uid() };";
        // `principal.uid()` is no Cedar: the file is refused at load, with its position.
        let file = f.root.join("approve.cedar");
        std::fs::write(&file, policies).unwrap();
        let toml = format!("{ASK}cedar = {:?}\n", file.to_string_lossy());
        let err = Config::parse(&toml, Path::new("a.toml")).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}:2:", file.display())), "{err}");

        let policies = "permit(principal, action == Action::\"run\", resource);\n@id(\"wheel approves\") permit(principal in Group::\"10\", action == Action::\"approve\", resource) unless { context.requester_uid == 0 };\n@id(\"no curl\") forbid(principal, action == Action::\"approve\", resource == Executable::\"/usr/bin/curl\");\n@id(\"not your own\") forbid(principal, action == Action::\"approve\", resource) when { context.requester_uid == principal.uid };";
        std::fs::write(&file, policies).unwrap();
        let config = Config::parse(&toml, Path::new("a.toml")).unwrap();
        let host = f.host(On::NoUserNamespaces);
        let policy = Policy::new(config, &*host.files);
        let resolved = |argv: &[&str]| match policy.decide(
            &host,
            &context(On::NoUserNamespaces),
            &f.request_in("ws/src", argv),
        ) {
            Decision::NeedsApproval { resolved, .. } => resolved,
            other => panic!("{other:?}"),
        };
        let ls = resolved(&["ls"]);
        let wheel = Principal { uid: 1002, gid: 1002, groups: vec![10] };
        let verdict = policy.authorize_approval(&wheel, &ls).unwrap().unwrap();
        assert_eq!(verdict.permitted_by, ["\"wheel approves\""]);
        let other = Principal { uid: 1003, gid: 1003, groups: vec![11] };
        let d = policy.authorize_approval(&other, &ls).unwrap_err();
        assert_eq!((d.kind, d.rule), (DENY, "cedar.no_permit"), "{}", d.reason);
        assert!(
            d.reason.contains("(User::\"1003\", Action::\"approve\", Executable::\"/usr/bin/ls\")"),
            "{}",
            d.reason
        );
        let d = policy.authorize_approval(&wheel, &resolved(&["curl", "--version"])).unwrap_err();
        assert_eq!((d.rule, d.reason.contains("\"no curl\"")), ("cedar.forbid", true), "{}", d.reason);
        // The requester (uid 1000, context()'s), in group 10 too, may not approve its own run.
        let own = Principal { uid: 1000, gid: 1000, groups: vec![10] };
        let d = policy.authorize_approval(&own, &ls).unwrap_err();
        assert_eq!((d.rule, d.reason.contains("\"not your own\"")), ("cedar.forbid", true), "{}", d.reason);

        // Without Cedar policies, Cedar has nothing to say.
        let policy = Policy::new(Config::parse(ASK, Path::new("a.toml")).unwrap(), &*host.files);
        match policy.decide(&host, &context(On::NoUserNamespaces), &req) {
            Decision::NeedsApproval { resolved, .. } => {
                assert_eq!(policy.authorize_approval(&other, &resolved), Ok(None))
            }
            other => panic!("{other:?}"),
        }
    }

    /// A `forbid` with `@ask` holds what it matches for a person's
    /// approval, with its text as the question; what it does not match
    /// runs, a plain `forbid` that matches too still refuses, and so does
    /// the want of a permit.
    #[test]
    fn a_forbid_that_asks_holds_the_run_for_approval() {
        let f = Fixture::new("cedar-ask");
        let push = "@id(\"all\") permit(principal, action, resource);\n@id(\"push\") @ask(\"git push publishes the workspace\")\nforbid(principal, action, resource) when { context.argv.contains(\"push\") };";
        let asked = |what: &str, toml: &str, policies: &str, argv: &[&str]| match decide(
            &f,
            On::TierC,
            toml,
            Some(policies),
            USER,
            &f.request(argv),
        ) {
            Decision::NeedsApproval { reason, rule, resolved } => {
                let verdict = resolved.cedar.unwrap_or_else(|| panic!("{what}: no verdict"));
                (rule, reason, verdict)
            }
            other => panic!("{what}: not held for approval: {other:?}"),
        };
        let (rule, reason, verdict) = asked("git push", "", push, &["git", "push", "origin", "main"]);
        assert_eq!((rule, reason.as_str()), ("cedar.ask", "git push publishes the workspace"));
        assert_eq!(verdict.permitted_by, ["\"all\""]);
        assert_eq!(verdict.asked.map(|a| a.by), Some(vec!["\"push\"".to_string()]));
        // The control: what it does not match runs with nobody asked.
        match decide(&f, On::TierC, "", Some(push), USER, &f.request(&["git", "status"])) {
            Decision::Allow(r) => assert_eq!(r.cedar.and_then(|v| v.asked), None),
            other => panic!("git status: {other:?}"),
        }
        // A domain the run may reach.
        let github = "permit(principal, action, resource);\n@ask(\"reaches github.com\") forbid(principal, action, resource) when { context.allow_domains.contains(\"github.com\") };";
        let (rule, reason, _) = asked("a domain", GITHUB, github, &["curl", "https://github.com/"]);
        assert_eq!((rule, reason.as_str()), ("cedar.ask", "reaches github.com"));
        // A plain forbid that matches as well refuses: asking never overrides a refusal.
        let both = format!(
            "{push}\n@id(\"no force\") forbid(principal, action, resource) when {{ context.argv.contains(\"--force\") }};"
        );
        let (rule, reason) = refused(
            "force",
            decide(&f, On::TierC, "", Some(&both), USER, &f.request(&["git", "push", "--force"])),
        );
        assert_eq!(rule, "cedar.forbid", "{reason}");
        assert!(reason.contains("\"no force\"") && !reason.contains("\"push\""), "{reason}");
        let (rule, reason, _) = asked("no force asked", "", &both, &["git", "push"]);
        assert_eq!((rule, reason.as_str()), ("cedar.ask", "git push publishes the workspace"));
        // With no permit, the question is not put: the run is refused.
        let alone = "@ask(\"pushes\") forbid(principal, action, resource) when { context.argv.contains(\"push\") };\npermit(principal, action, resource) when { context.argv.contains(\"status\") };";
        let (rule, reason) =
            refused("no permit", decide(&f, On::TierC, "", Some(alone), USER, &f.request(&["git", "push"])));
        assert_eq!(rule, "cedar.no_permit", "{reason}");
        crate::denial::names_a_fix_or_why_none(rule, &reason).unwrap();
    }

    /// An approver's yes is not itself put to a person: `approve` is asked
    /// without the forbids that ask; a plain forbid of `approve` still refuses.
    #[test]
    fn an_approval_is_not_asked_again() {
        let f = Fixture::new("cedar-ask-approve");
        let policies = "permit(principal, action, resource);\n@ask(\"pushes\") forbid(principal, action, resource) when { context.argv.contains(\"push\") };";
        let file = f.root.join("ask.cedar");
        std::fs::write(&file, policies).unwrap();
        let toml = format!("[policy]\ncedar = {:?}\n", file.to_string_lossy());
        let host = f.host(On::TierC);
        let policy = Policy::new(Config::parse(&toml, Path::new("a.toml")).unwrap(), &*host.files);
        let resolved = match policy.decide(&host, &context(On::TierC), &f.request(&["git", "push"])) {
            Decision::NeedsApproval { resolved, rule: "cedar.ask", .. } => resolved,
            other => panic!("{other:?}"),
        };
        let approver = Principal { uid: 0, gid: 0, groups: vec![] };
        let verdict = policy.authorize_approval(&approver, &resolved).unwrap().unwrap();
        assert_eq!(verdict.asked, None);
        let no = format!(
            "{policies}\n@id(\"nobody\") forbid(principal, action == Action::\"approve\", resource);"
        );
        std::fs::write(&file, no).unwrap();
        let policy = Policy::new(Config::parse(&toml, Path::new("a.toml")).unwrap(), &*host.files);
        let d = policy.authorize_approval(&approver, &resolved).unwrap_err();
        assert_eq!((d.rule, d.reason.contains("\"nobody\"")), ("cedar.forbid", true), "{}", d.reason);
    }
}

/// A broker serving only its owner lets the owner's asks widen the profile
/// (up to its ceilings), as an embedded broker's flags do; another
/// requester's, or any with `owner_widens = false`, only narrow.
#[test]
fn the_owners_asks_widen_a_brokers_own_profile_and_no_one_elses() {
    let f = Fixture::new("owner");
    let host = f.host(On::TierC);
    let decide = |text: &str, ctx: &Context, edit: fn(&mut RunRequest)| {
        let policy = Policy::new(Config::parse(text, Path::new("o.toml")).unwrap(), &*host.files);
        let mut r = f.request(&["ls"]);
        edit(&mut r);
        policy.decide(&host, ctx, &r)
    };
    let owner = context(On::TierC);
    let other = Context { requester: HostIds { uid: 1001, gid: 1001 }, ..context(On::TierC) };
    let interpreters: fn(&mut RunRequest) = |r| {
        r.allow_interpreters = true;
        r.timeout_secs = Some(1000);
        r.pass_env = vec!["LANG".into(), "ANSWER".into()];
        r.env.insert("ANSWER".into(), "42".into());
    };
    match decide("", &owner, interpreters) {
        Decision::Allow(r) => {
            assert_eq!(r.timeout, std::time::Duration::from_secs(1000));
            assert!(r.plan.env.contains(&("ANSWER".into(), "42".into())), "{:?}", r.plan.env);
        }
        other => panic!("{other:?}"),
    }
    for (text, ctx) in [("", &other), ("[broker]\nowner_widens = false\n", &owner)] {
        match decide(text, ctx, interpreters) {
            Decision::Deny(d) => assert_eq!(d.rule, "request.widens", "{}", d.reason),
            other => panic!("{other:?}"),
        }
    }
    // Past the profile's ceiling: refused, naming it.
    match decide("", &owner, |r| r.timeout_secs = Some(4000)) {
        Decision::Deny(d) => assert!(d.reason.contains("[defaults] timeout_ceiling_secs"), "{}", d.reason),
        other => panic!("{other:?}"),
    }
}

/// A broker that keeps homes gives the run its workspace's own `HOME`,
/// outside the project, bound writable in place (no overlay); a system
/// broker's run, and a run with a temporary workspace, keep theirs.
#[test]
fn a_workspace_gets_a_home_of_its_own_outside_it() {
    let f = Fixture::new("homes");
    let host = f.host(On::TierC);
    let homes = f.root.join("state/homes");
    let ctx = Context { homes: Some(homes.clone()), ..context(On::TierC) };
    let policy = Policy::new(Config::default(), &*host.files);
    let Decision::Allow(r) = policy.decide(&host, &ctx, &f.request(&["ls"])) else { panic!() };
    let home = r.home.clone().expect("a home");
    assert!(home.starts_with(&homes) && !home.starts_with(f.root.join("ws")), "{}", home.display());
    assert_eq!(
        home.file_name(),
        Some(std::ffi::OsStr::new(&*crate::decision::home_name(&f.root.join("ws"), "defaults")))
    );
    let shown = home.to_string_lossy().into_owned();
    assert!(r.plan.env.contains(&("HOME".into(), shown.clone())), "{:?}", r.plan.env);
    let bound = r.plan.mounts.iter().any(|m| {
        matches!(m, Mount::Bind { source, target, writable: true, .. } if *source == shown && *target == shown)
    });
    assert!(bound && r.plan.landlock.write.contains(&shown), "{:?}", r.plan.mounts);
    // The same workspace, the same home.
    let Decision::Allow(again) = policy.decide(&host, &ctx, &f.request(&["ls"])) else { panic!() };
    assert_eq!(again.home, r.home);
    // Counter-test: a system broker's run has none.
    let root = Context { homes: Some(homes), serves_others: true, ..context(On::TierC) };
    let Decision::Allow(r) = policy.decide(&host, &root, &f.request(&["ls"])) else { panic!() };
    assert!(r.home.is_none());
}
