//! The validation pipeline on this host, as the broker gathers it, step by
//! step: tables of requests and the decision each must get, adversarial ones
//! included, and a property test that no generated path outside the allowed
//! roots is ever accepted.
#![cfg(target_os = "linux")]

use palisade_broker::host;
use palisade_policy::{Config, Context, Decision, Host, HostCapabilities, Policy};
use palisade_protocol::wire::{ErrorKind, ParamValue, RunRequest};
use palisade_protocol::{Mount, Tier};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A workspace with traps: a symlink out, a dangling link, a sensitive
/// directory inside; a secret outside; a home with keys.
struct Fixture {
    root: PathBuf,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        Fixture::new_in(&std::env::temp_dir(), tag)
    }

    fn new_in(base: &Path, tag: &str) -> Fixture {
        let root =
            base.canonicalize().unwrap().join(format!("palisade-pipeline-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["ws/src", "ws/.ssh", "outside", "home/.ssh", "home/.aws", "data"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("outside/secret"), "s").unwrap();
        std::fs::write(root.join("ws/src/main.rs"), "fn main() {}").unwrap();
        std::fs::write(root.join("ws/input.png"), "png").unwrap();
        std::fs::write(root.join("home/.ssh/id_ed25519"), "key").unwrap();
        std::os::unix::fs::symlink(root.join("outside"), root.join("ws/link-out")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", root.join("ws/shadow-link")).unwrap();
        std::os::unix::fs::symlink(root.join("home/.ssh"), root.join("ws/keys")).unwrap();
        Fixture { root }
    }
    fn ws(&self) -> PathBuf {
        self.root.join("ws")
    }
    fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }
    fn request(&self, argv: &[&str]) -> RunRequest {
        let mut env = BTreeMap::new();
        env.insert("HOME".to_string(), self.p("home"));
        env.insert("LANG".to_string(), "C.UTF-8".to_string());
        RunRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: Some(self.ws().to_string_lossy().into_owned()),
            env,
            ..Default::default()
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The host a decision is made on, and who asks.
struct On {
    host: Host,
    ctx: Context,
}

fn context(user_namespaces: bool, landlock_abi: u32) -> On {
    let host = host::gather(
        &HostCapabilities {
            user_namespaces,
            landlock_abi,
            seatbelt: false,
            cgroup: Err("no delegated cgroup v2 root (test)".into()),
        },
        true,
        Vec::new().into(),
    );
    let ctx = Context {
        parent_pid: 1,
        uid: 1000,
        gid: 1000,
        serves_others: false,
        requester: palisade_protocol::HostIds { uid: 1000, gid: 1000 },
        groups: vec![],
        temp_root: PathBuf::from("/run/palisade-test"),
        instance: "1-1".into(),
        etc_view: None,
        trust: None,
        homes: None,
        run: 7,
    };
    On { host, ctx }
}

fn policy(toml: &str) -> Policy {
    Policy::new(Config::parse(toml, Path::new("test.toml")).unwrap(), &*context(true, 7).host.files)
}

fn decide(p: &Policy, on: &On, req: &RunRequest) -> Decision {
    p.decide(&on.host, &on.ctx, req)
}

/// `Ok(())` for allow, `Err((kind, rule))` otherwise.
fn verdict(p: &Policy, ctx: &On, req: &RunRequest) -> Result<(), (ErrorKind, String)> {
    match decide(p, ctx, req) {
        Decision::Allow(_) => Ok(()),
        Decision::Deny(d) => Err((d.kind, d.rule.to_string())),
        Decision::NeedsApproval { .. } => Err((ErrorKind::NeedsApproval, "fallback.request_approval".into())),
    }
}

/// A command line and the refusal it must get (`None`: allowed).
type Case<'a> = (Vec<String>, Option<(ErrorKind, &'a str)>);

fn check_table(p: &Policy, f: &Fixture, table: &[Case<'_>]) {
    let ctx = context(true, 7);
    for (argv, want) in table {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let got = verdict(p, &ctx, &f.request(&argv));
        let want = want.map(|(k, r)| (k, r.to_string()));
        assert_eq!(got, want.map_or(Ok(()), Err), "{argv:?}");
    }
}

fn v(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

const DENY: ErrorKind = ErrorKind::PolicyDenied;
const SCOPE: ErrorKind = ErrorKind::WorkspaceScopeDenied;
const INVALID: ErrorKind = ErrorKind::InvalidRequest;
const CAP: ErrorKind = ErrorKind::CapabilityDenied;

#[test]
fn shape_limits() {
    let f = Fixture::new("shape");
    let p = policy("");
    let long_arg = "a".repeat(4097);
    let long_cmd = format!("/usr/bin/{}", "x".repeat(260));
    let many: Vec<String> =
        std::iter::once("echo".to_string()).chain((0..129).map(|i| i.to_string())).collect();
    let ok_many: Vec<String> =
        std::iter::once("echo".to_string()).chain((0..128).map(|i| i.to_string())).collect();
    let table = vec![
        (v(&["echo", "fine"]), None),
        (v(&["echo", "a\0b"]), Some((INVALID, "limits.nul_byte"))),
        (v(&["ec\0ho"]), Some((INVALID, "limits.nul_byte"))),
        (v(&["echo", &long_arg]), Some((INVALID, "limits.argument_bytes"))),
        (v(&["echo", &"a".repeat(4096)]), None),
        (v(&[&long_cmd]), Some((INVALID, "limits.command_bytes"))),
        (many, Some((INVALID, "limits.arguments"))),
        (ok_many, None),
        (v(&[]), Some((INVALID, "limits.empty_command"))),
    ];
    check_table(&p, &f, &table);
    // The environment the sandbox would get counts, not what the client offered.
    let mut req = f.request(&["echo"]);
    for i in 0..100 {
        req.env.insert(format!("V{i}"), "x".into());
    }
    assert_eq!(verdict(&p, &context(true, 7), &req), Ok(()));
    let full = policy("[defaults]\nenvironment = \"full\"\n");
    assert_eq!(verdict(&full, &context(true, 7), &req), Err((INVALID, "limits.env_vars".into())));
    let mut env_nul = f.request(&["echo"]);
    env_nul.env.insert("USER".into(), "a\0b".into());
    assert_eq!(verdict(&p, &context(true, 7), &env_nul), Err((INVALID, "limits.nul_byte".into())));
}

#[test]
fn executable_allow_list() {
    let f = Fixture::new("exe");
    let p = policy("[defaults]\nallowed_executables = [\"ls\", \"/usr/bin/cat\"]\n");
    let table = vec![
        (v(&["ls", "src"]), None),
        (v(&["/usr/bin/ls"]), None),
        (v(&["/bin/ls"]), None), // the same file through the /bin symlink
        (v(&["cat", "src/main.rs"]), None),
        (v(&["echo", "hi"]), Some((DENY, "executables.not_allowed"))),
        (v(&["no-such-program"]), Some((INVALID, "command.not_found"))),
        (v(&["ѕort"]), Some((INVALID, "command.not_found"))), // Cyrillic "ѕ"
    ];
    check_table(&p, &f, &table);
    // A program outside everything the sandbox can execute from.
    let exe = f.root.join("outside/tool");
    std::fs::copy("/usr/bin/true", &exe).unwrap();
    let q = policy("");
    check_table(&q, &f, &[(v(&[exe.to_str().unwrap()]), Some((DENY, "executables.not_visible")))]);
    // ... and one in the workspace, which the default profile may execute.
    std::fs::copy("/usr/bin/true", f.ws().join("built")).unwrap();
    check_table(&q, &f, &[(v(&["./built"]), None)]);
    let no_ws_exec = policy("[defaults]\nexec_in_workspace = false\n");
    check_table(&no_ws_exec, &f, &[(v(&["./built"]), Some((DENY, "executables.not_visible")))]);
}

#[test]
fn interpreters_are_denied_unless_allowed_and_inline_code_even_then() {
    let f = Fixture::new("interp");
    let have = |p: &str| Path::new(p).exists();
    let p = policy("");
    let mut table = vec![
        (v(&["sh", "-c", "id"]), Some((DENY, "interpreters.denied"))),
        (v(&["bash", "script.sh"]), Some((DENY, "interpreters.denied"))),
        (v(&["/bin/sh"]), Some((DENY, "interpreters.denied"))),
        (v(&["env", "sh", "-c", "id"]), Some((DENY, "interpreters.denied"))),
        (
            v(&["env", "-i", "A=1", "nice", "-n", "5", "timeout", "5", "dash"]),
            Some((DENY, "interpreters.denied")),
        ),
        (v(&["env", "-S", "sh -c id"]), Some((DENY, "interpreters.denied"))),
        (v(&["timeout", "-s", "KILL", "10", "sh"]), Some((DENY, "interpreters.denied"))),
        (v(&["xargs", "-n", "1", "sh", "-c"]), Some((DENY, "interpreters.denied"))),
        (v(&["env", "ls"]), None),
        (v(&["nice", "ls"]), None),
        (v(&["ls", "-la"]), None),
    ];
    if have("/usr/bin/python3") {
        table.push((v(&["python3", "x.py"]), Some((DENY, "interpreters.denied"))));
    }
    if have("/usr/bin/perl") {
        table.push((v(&["perl", "-e", "1"]), Some((DENY, "interpreters.denied"))));
    }
    check_table(&p, &f, &table);

    // A renamed copy, a hard link and a symlink of an interpreter are still one.
    std::fs::copy("/usr/bin/dash", f.ws().join("innocent")).unwrap();
    std::os::unix::fs::symlink("/usr/bin/dash", f.ws().join("also-innocent")).unwrap();
    let script = f.ws().join("run.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let envscript = f.ws().join("run-env");
    std::fs::write(&envscript, "#!/usr/bin/env dash\necho hi\n").unwrap();
    std::fs::set_permissions(&envscript, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    check_table(
        &p,
        &f,
        &[
            (v(&["./innocent", "-c", "id"]), Some((DENY, "interpreters.denied"))),
            (v(&["./also-innocent"]), Some((DENY, "interpreters.denied"))),
            (v(&["./run.sh"]), Some((DENY, "interpreters.denied"))),
            (v(&["./run-env"]), Some((DENY, "interpreters.denied"))),
        ],
    );

    // Interpreters allowed: scripts run, inline code does not.
    let allowed = policy("[defaults]\nallow_interpreters = true\n");
    let mut table = vec![
        (v(&["sh", "script.sh"]), None),
        (v(&["./run.sh"]), None),
        (v(&["sh", "-c", "id"]), Some((DENY, "interpreters.inline_code"))),
        (v(&["bash", "-ec", "id"]), Some((DENY, "interpreters.inline_code"))),
        (v(&["sh", "-s"]), Some((DENY, "interpreters.inline_code"))),
        (v(&["sh", "-"]), Some((DENY, "interpreters.inline_code"))),
        (v(&["sh", "-x", "script.sh"]), None),
        (v(&["env", "-S", "sh -c id"]), Some((DENY, "interpreters.inline_code"))),
    ];
    if have("/usr/bin/python3") {
        table.extend([
            (v(&["python3", "-c", "print(1)"]), Some((DENY, "interpreters.inline_code"))),
            (v(&["python3", "-Sc", "print(1)"]), Some((DENY, "interpreters.inline_code"))),
            (v(&["python3", "-m", "json.tool", "x.json"]), None),
            (v(&["python3", "-W", "ignore", "x.py"]), None),
            (v(&["python3", "x.py", "-c"]), None), // the script's own flag
        ]);
    }
    if have("/usr/bin/perl") {
        table.extend([
            (v(&["perl", "-ne", "print"]), Some((DENY, "interpreters.inline_code"))),
            (v(&["perl", "-Mstrict", "x.pl"]), None),
        ]);
    }
    check_table(&allowed, &f, &table);
    // A script on stdin: no script operand, and stdin given.
    let mut req = f.request(&["sh"]);
    req.stdin = b"id\n".to_vec();
    assert_eq!(verdict(&allowed, &context(true, 7), &req), Err((DENY, "interpreters.inline_code".into())));
    req.stdin.clear();
    assert_eq!(verdict(&allowed, &context(true, 7), &req), Ok(()));
    let inline = policy("[defaults]\nallow_interpreters = true\nallow_inline_code = true\n");
    check_table(&inline, &f, &[(v(&["sh", "-c", "id"]), None)]);
}

#[test]
fn workspace_scope_and_sensitive_paths() {
    let f = Fixture::new("scope");
    let p = policy("");
    let secret = f.p("outside/secret");
    let table = vec![
        (v(&["cat", "src/main.rs"]), None),
        (v(&["cat", "./src/../src/main.rs"]), None),
        (v(&["ls", "/usr/share"]), None),
        (v(&["cat", "/etc/passwd"]), None),
        (v(&["ls", "/tmp/scratch"]), None),
        (v(&["cat", &secret]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cat", "../outside/secret"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cat", "src/../../outside/secret"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cat", "link-out/secret"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cat", "link-out"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["ls", "--directory=../outside"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cc", "-I../outside", "x.c"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cc", "-o/srv/out", "x.c"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["tar", "-xf/srv/a.tar"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cat", "--file=link-out"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cat", "-flink-out"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["dd", "if=link-out"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["tar", "-xf", "src/a.tar"]), None),
        (v(&["dd", &format!("if={secret}"), "of=copy"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["dd", "if=/etc/shadow", "of=copy"]), Some((SCOPE, "scope.sensitive_path"))),
        (v(&["dd", "if=src/main.rs", "of=copy"]), None),
        (v(&["cp", "src/main.rs", "out=/srv/x"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cat", "~/notes"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["ls", "/"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["ls", "/home"]), Some((SCOPE, "scope.outside_roots"))),
        (v(&["cat", "/etc/shadow"]), Some((SCOPE, "scope.sensitive_path"))),
        (v(&["cat", "shadow-link"]), Some((SCOPE, "scope.sensitive_path"))),
        (v(&["cat", "/etc/sudoers"]), Some((SCOPE, "scope.sensitive_path"))),
        (v(&["cat", "~/.ssh/id_ed25519"]), Some((SCOPE, "scope.sensitive_path"))),
        (v(&["cat", "keys/id_ed25519"]), Some((SCOPE, "scope.sensitive_path"))),
        (v(&["ls", "~/.aws"]), Some((SCOPE, "scope.sensitive_path"))),
        // Deny beats allow: the workspace's own .ssh is inside an allowed root.
        (v(&["ls", ".ssh"]), Some((SCOPE, "scope.sensitive_path"))),
        (v(&["ls", "src/../.ssh/"]), Some((SCOPE, "scope.sensitive_path"))),
        // Look-alikes are different paths, and outside: "ѕrc" with a Cyrillic "ѕ".
        (v(&["cat", "/wоrkspace/x"]), Some((SCOPE, "scope.outside_roots"))),
        // URLs and remote forms are not local paths.
        (v(&["echo", "https://example.com/a/b"]), Some((CAP, "egress.host_not_allowed"))),
    ];
    check_table(&p, &f, &table);

    // Deny beats allow for a workspace that is the home directory itself.
    let mut home_ws = f.request(&["ls", ".ssh"]);
    home_ws.workspace = Some(f.p("home"));
    home_ws.cwd = Some(f.p("home"));
    assert_eq!(verdict(&p, &context(true, 7), &home_ws), Err((SCOPE, "scope.sensitive_path".into())));
    // Configured sensitive paths add to the built-in ones.
    let extra = policy("[policy]\nsensitive_paths = [\"**/src/main.rs\"]\n");
    check_table(&extra, &f, &[(v(&["cat", "src/main.rs"]), Some((SCOPE, "scope.sensitive_path")))]);
}

#[test]
fn sensitive_entries_in_a_granted_directory_are_hidden_in_tier_c_and_refused_in_tier_b() {
    let f = Fixture::new("mask");
    let p = policy("");
    let Decision::Allow(r) = decide(&p, &context(true, 7), &f.request(&["ls"])) else { panic!() };
    let hidden = f.ws().join(".ssh").to_string_lossy().into_owned();
    assert!(
        r.plan.mounts.iter().any(|m| matches!(m, Mount::Tmpfs { target, mode: 0, .. } if *target == hidden)),
        "{:?}",
        r.plan.mounts
    );
    // The mask comes after the workspace bind it hides part of.
    let bind_at = r.plan.mounts.iter().position(|m| m.target() == f.ws().to_str().unwrap()).unwrap();
    let mask_at = r.plan.mounts.iter().position(|m| m.target() == hidden).unwrap();
    assert!(bind_at < mask_at);
    let b = policy("[policy]\nfallback = \"warn_and_execute\"\n");
    assert_eq!(
        verdict(&b, &context(false, 7), &f.request(&["ls"])),
        Err((SCOPE, "scope.sensitive_path".into()))
    );
}

#[test]
fn a_grant_cannot_open_a_sensitive_path_and_homes_inside_a_grant_are_masked() {
    let f = Fixture::new("grants");
    let p = policy("");
    let mut req = f.request(&["ls"]);
    req.env.insert("HOME".into(), f.p("home"));
    // The workspace itself, or a directory inside it, sensitive: refused.
    for ws in ["home/.ssh", "ws/.ssh"] {
        let mut r = req.clone();
        r.cwd = Some(f.p(ws));
        assert_eq!(verdict(&p, &context(true, 7), &r), Err((SCOPE, "scope.sensitive_path".into())), "{ws}");
    }
    // A tool's override granting one: a configuration error when the path is
    // known at load time, a refusal at request time when a template makes it.
    let grant = |path: &str| {
        format!(
            "[tools.peek]\nallowed_executables = [\"ls\"]\n[tools.peek.overrides]\nfilesystem = [{{ read_only = \"{path}\" }}]\n"
        )
    };
    let err = Config::parse(&grant(&f.p("home/.aws")), Path::new("t.toml")).unwrap_err().to_string();
    assert!(err.contains("t.toml:4:") && err.contains("sensitive path"), "{err}");
    let tool = policy(&grant("${WORKSPACE}/.ssh"));
    let mut peek = req.clone();
    peek.tool = Some("peek".into());
    assert_eq!(verdict(&tool, &context(true, 7), &peek), Err((SCOPE, "scope.sensitive_path".into())));
    // A workspace above a home directory (the request's HOME): its sensitive
    // entries are masked, however deep the home is.
    let mut above = req.clone();
    above.cwd = Some(f.root.to_string_lossy().into_owned());
    let Decision::Allow(r) = decide(&p, &context(true, 7), &above) else {
        panic!("{:?}", decide(&p, &context(true, 7), &above))
    };
    for hidden in ["home/.ssh", "home/.aws"] {
        assert!(
            r.plan.mounts.iter().any(|m| m.target() == f.p(hidden)),
            "{hidden} not masked: {:?}",
            r.plan.mounts
        );
    }
    // Tier B cannot mask them: refused.
    let b = policy("[policy]\nfallback = \"warn_and_execute\"\n");
    assert_eq!(verdict(&b, &context(false, 7), &above), Err((SCOPE, "scope.sensitive_path".into())));
}

#[test]
fn blocked_command_patterns() {
    let f = Fixture::new("patterns");
    let p = policy("[defaults]\nallow_interpreters = true\nallow_inline_code = true\n");
    let table = vec![
        (v(&["rm", "-rf", "src"]), None),
        (v(&["sh", "-c", "rm -rf /"]), Some((DENY, "patterns.blocked"))),
        (v(&["sh", "-c", "rm -r -f /*"]), Some((DENY, "patterns.blocked"))),
        (v(&["rm", "-rf", "--no-preserve-root", "src"]), Some((DENY, "patterns.blocked"))),
        (v(&["sh", "-c", ":(){ :|:& };:"]), Some((DENY, "patterns.blocked"))),
        (v(&["bash", "-c", "echo x; sudo id"]), Some((DENY, "patterns.blocked"))),
        (v(&["sh", "-c", "mkfs.ext4 /dev/sda1"]), Some((DENY, "patterns.blocked"))),
        (v(&["sh", "-c", "dd if=/dev/zero of=/dev/sda bs=1M"]), Some((DENY, "patterns.blocked"))),
        (v(&["sh", "-c", "cat x > /dev/sda"]), Some((DENY, "patterns.blocked"))),
        (v(&["sh", "-c", "echo sudoku"]), None),
        (v(&["sh", "-c", "dd if=a of=b"]), None),
    ];
    check_table(&p, &f, &table);
    let custom = policy("[policy]\nblocked_patterns = [\"git\\\\s+push\\\\s+--force\"]\n");
    check_table(&custom, &f, &[(v(&["git", "push", "--force"]), Some((DENY, "patterns.blocked")))]);
}

#[test]
fn egress_preflight_and_strict() {
    let f = Fixture::new("egress");
    let allow = "[defaults]\nnetwork = { allow_domains = [\"github.com\", \"*.pkgs.example.org\"] }\n";
    let p = policy(allow);
    let table = vec![
        (v(&["git", "clone", "https://github.com/o/r"]), None),
        (v(&["git", "clone", "git@github.com:o/r.git"]), None),
        (v(&["curl", "https://files.pkgs.example.org/x"]), None),
        (v(&["curl", "https://pkgs.example.org/x"]), Some((CAP, "egress.host_not_allowed"))),
        (v(&["curl", "https://github.com.evil.net/"]), Some((CAP, "egress.host_not_allowed"))),
        (v(&["curl", "--url=http://evil.net/"]), Some((CAP, "egress.host_not_allowed"))),
        (v(&["curl", "https://gіthub.com/"]), Some((CAP, "egress.host_not_allowed"))), // Cyrillic "і"
        (v(&["ssh", "-p", "22", "deploy@evil.net"]), Some((CAP, "egress.host_not_allowed"))),
        (v(&["scp", "f", "backup:/srv/f"]), Some((CAP, "egress.host_not_allowed"))),
        // Hosts without a scheme, where the tool takes URLs or repositories.
        (v(&["curl", "-o", "out.txt", "files.pkgs.example.org/simple"]), None),
        (v(&["curl", "-o", "out.txt", "evil.net/x"]), Some((CAP, "egress.host_not_allowed"))),
        (v(&["wget", "internal:8080"]), Some((CAP, "egress.host_not_allowed"))),
        (v(&["git", "clone", "evil.net:o/r.git"]), Some((CAP, "egress.host_not_allowed"))),
        (v(&["git", "show", "HEAD:src/main.rs"]), None),
    ];
    check_table(&p, &f, &table);
    // deny: any named host is refused; allow_all: none is; egress none: no check.
    check_table(
        &policy(""),
        &f,
        &[(v(&["curl", "https://github.com/"]), Some((CAP, "egress.host_not_allowed")))],
    );
    check_table(
        &policy("[defaults]\nnetwork = \"allow_all\"\n"),
        &f,
        &[(v(&["curl", "https://any.example/"]), None)],
    );
    check_table(
        &policy("[defaults]\negress = \"none\"\n"),
        &f,
        &[(v(&["curl", "https://github.com/"]), None)],
    );

    // preflight keeps the host network; strict takes it away (a namespace).
    let Decision::Allow(pre) = decide(&p, &context(true, 7), &f.request(&["ls"])) else { panic!() };
    assert!(!pre.plan.namespaces.net);
    let strict = policy(&format!("{allow}egress = \"strict\"\n"));
    let Decision::Allow(st) = decide(&strict, &context(true, 7), &f.request(&["ls"])) else { panic!() };
    assert!(st.plan.namespaces.net && st.plan.loopback);
    // strict where no network namespace can be made: refused, with the reason.
    let strict_b =
        policy(&format!("[policy]\nfallback = \"warn_and_execute\"\n{allow}egress = \"strict\"\n"));
    match decide(&strict_b, &context(false, 7), &f.request(&["ls"])) {
        Decision::Deny(d) => {
            assert_eq!((d.kind, d.rule), (ErrorKind::Unavailable, "egress.strict_unavailable"));
            assert!(d.reason.contains("network namespace"), "{}", d.reason);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn fallback_policy_where_tier_c_is_unavailable() {
    let f = Fixture::new("fallback");
    let req = f.request(&["ls"]);
    match decide(&policy(""), &context(false, 7), &req) {
        Decision::Deny(d) => assert_eq!((d.kind, d.rule), (ErrorKind::Unavailable, "fallback.deny")),
        other => panic!("{other:?}"),
    }
    let mut req_b = req.clone();
    // Tier B cannot hide the workspace's .ssh: use a workspace without one.
    req_b.cwd = Some(f.p("ws/src"));
    // Approval is asked for a run the pipeline allows, and carries that run (Tier B).
    let ask = policy("[policy]\nfallback = \"request_approval\"\n");
    match decide(&ask, &context(false, 7), &req_b) {
        Decision::NeedsApproval { reason, rule, resolved } => {
            assert!(reason.contains("Tier B"), "{reason}");
            assert_eq!(rule, "fallback.request_approval");
            assert_eq!(resolved.plan.tier(), Tier::B);
        }
        other => panic!("{other:?}"),
    }
    // A run the pipeline refuses is refused, never put to a person.
    let mut shell = req_b.clone();
    shell.argv = v(&["sh", "-c", "id"]);
    assert!(
        matches!(decide(&ask, &context(false, 7), &shell), Decision::Deny(d) if d.kind == ErrorKind::PolicyDenied)
    );
    assert_eq!(verdict(&ask, &context(false, 7), &req), Err((SCOPE, "scope.sensitive_path".into())));
    let warn = policy("[policy]\nfallback = \"warn_and_execute\"\n");
    match decide(&warn, &context(false, 7), &req_b) {
        Decision::Allow(r) => {
            assert_eq!(r.plan.tier(), Tier::B);
            assert!(r.plan.mounts.is_empty() && r.plan.namespaces.names().is_empty());
            assert!(!r.warnings.is_empty());
            assert!(r.host_dirs.iter().all(|d| d.starts_with("/run/palisade-test/run-1-1-7")));
        }
        other => panic!("{other:?}"),
    }
    // Tier C with user namespaces: the fallback does not apply.
    assert!(
        matches!(decide(&policy(""), &context(true, 7), &req), Decision::Allow(r) if r.plan.tier() == Tier::C)
    );
}

#[test]
fn required_landlock_features_the_kernel_lacks_are_refused_before_spawning() {
    let f = Fixture::new("landlock");
    let p = policy("[policy]\nrequire_landlock = [\"fs\", \"net.tcp\"]\n");
    match decide(&p, &context(true, 2), &f.request(&["ls"])) {
        Decision::Deny(d) => {
            assert_eq!((d.kind, d.rule), (ErrorKind::Unavailable, "landlock.unsupported"));
            assert!(d.reason.contains("net.tcp") && d.reason.contains("ABI 2"), "{}", d.reason);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(decide(&p, &context(true, 4), &f.request(&["ls"])), Decision::Allow(_)));
}

#[test]
fn cgroup_limits_are_planned_when_there_is_a_root_and_required_ones_refused_when_not() {
    let f = Fixture::new("cgroup");
    let p = policy(
        "[policy]\nrequire_cgroup = true\n[defaults]\nmax_memory_mb = 64\nmax_processes = 32\nmax_cpu_percent = 25\n",
    );
    match decide(&p, &context(true, 7), &f.request(&["ls"])) {
        Decision::Deny(d) => {
            assert_eq!((d.kind, d.rule), (ErrorKind::Unavailable, "cgroup.unavailable"));
            assert!(d.reason.contains("no delegated cgroup v2 root (test)"), "{}", d.reason);
        }
        other => panic!("{other:?}"),
    }
    let mut ctx = context(true, 7);
    ctx.host.capabilities.cgroup =
        Ok(palisade_policy::CgroupRoot { path: PathBuf::from("/sys/fs/cgroup/palisade"), v1: false });
    let Decision::Allow(r) = decide(&p, &ctx, &f.request(&["ls"])) else { panic!() };
    let c = r.cgroup.as_ref().unwrap();
    assert_eq!(
        (c.name.as_str(), c.memory_bytes, c.processes, c.cpu_percent),
        ("run-1-1-7", 64 << 20, 32, 25)
    );
    assert_eq!(r.plan.cgroup.as_deref(), Some("/sys/fs/cgroup/palisade/run-1-1-7"));
    // The cgroup holds memory; RLIMIT_DATA and RLIMIT_AS stay as looser floors.
    assert_eq!(r.plan.rlimits.address_space.hard, 4 * (64 << 20));
    assert_eq!(r.plan.rlimits.data.hard, 4 * (64 << 20));
    assert_eq!(r.plan.rlimits.processes.hard, 64);
    // Without a root and without the requirement: rlimits alone, and the plan says so.
    let q = policy("[defaults]\nmax_memory_mb = 64\n");
    let Decision::Allow(r) = decide(&q, &context(true, 7), &f.request(&["ls"])) else { panic!() };
    assert!(r.cgroup.is_none() && r.plan.cgroup.is_none());
    // RLIMIT_DATA holds the limit; the address space has room for reservations.
    assert_eq!((r.plan.rlimits.data.hard, r.plan.rlimits.address_space.hard), (64 << 20, 4 * (64 << 20)));
}

const TOOLS: &str = r#"
[tools.convert]
preset = "file_processor"
allowed_executables = ["cp"]
[tools.convert.overrides]
environment = "none"
process = { max_execution_time = 60 }
[tools.convert.parameters.input]
capability = "filesystem.read_only"
validation = "is_file"
mapping = "single"
[tools.convert.parameters.out]
capability = "filesystem.read_write"
validation = "is_directory"
mapping = "single"
[tools.convert.parameters.extra]
capability = "filesystem.read_only"
validation = "is_path"
mapping = "each_element"

[tools.scan]
preset = "code_analyzer"

[tools.transform]
preset = "data_transformer"

[tools.fetch]
preset = "web_scraper"
allowed_executables = ["curl"]
egress = "none"
"#;

fn tool_request(f: &Fixture, tool: &str, argv: &[&str], params: &[(&str, ParamValue)]) -> RunRequest {
    let mut r = f.request(argv);
    r.tool = Some(tool.into());
    r.params = params.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    r
}

#[test]
fn tools_resolve_presets_overrides_and_parameter_bindings() {
    let f = Fixture::new("tools");
    let p = policy(TOOLS);
    let ctx = context(true, 7);
    let one = |s: String| ParamValue::One(s);
    let req = tool_request(
        &f,
        "convert",
        &["cp", &f.p("ws/input.png"), &f.p("data")],
        &[("input", one(f.p("ws/input.png"))), ("out", one(f.p("data")))],
    );
    let Decision::Allow(r) = decide(&p, &ctx, &req) else { panic!("{:?}", decide(&p, &ctx, &req)) };
    // The preset's temporary workspace, the bound paths, the overrides.
    assert!(r.plan.mounts.iter().any(|m| matches!(m, Mount::Tmpfs { target, .. } if target == "/workspace")));
    assert!(
        r.plan.mounts.iter().any(
            |m| matches!(m, Mount::Bind { target, writable: false, .. } if *target == f.p("ws/input.png"))
        )
    );
    assert!(
        r.plan.mounts.iter().any(|m| matches!(m, Mount::Overlay { target, .. } if *target == f.p("data")))
    );
    assert_eq!(r.writable, vec![PathBuf::from(f.p("data"))]);
    assert!(r.plan.env.is_empty(), "environment = none: {:?}", r.plan.env);
    assert_eq!(r.timeout.as_secs(), 60);
    assert_eq!(r.plan.cwd, "/workspace");
    assert!(r.plan.namespaces.net, "file_processor: no network");
    assert!(r.capabilities.process.no_fork);

    // each_element binds every path of a list; single refuses a list.
    let many = ParamValue::Many(vec![f.p("ws/src"), f.p("ws/input.png")]);
    let req = tool_request(&f, "convert", &["cp", "a", "b"], &[("extra", many.clone())]);
    let Decision::Allow(r) = decide(&p, &ctx, &req) else { panic!() };
    assert!(r.plan.mounts.iter().any(|m| m.target() == f.p("ws/src")));
    let wrong = tool_request(&f, "convert", &["cp", "a", "b"], &[("input", many)]);
    assert_eq!(verdict(&p, &ctx, &wrong), Err((INVALID, "tools.parameter_validation".into())));

    let cases: Vec<(RunRequest, (ErrorKind, &str))> = vec![
        (tool_request(&f, "nope", &["ls"], &[]), (INVALID, "tools.unknown")),
        (
            tool_request(&f, "convert", &["cp", "a", "b"], &[("undeclared", one(f.p("ws")))]),
            (DENY, "tools.undeclared_parameter"),
        ),
        (
            tool_request(&f, "convert", &["cp", "a", "b"], &[("input", one(f.p("ws/src")))]),
            (INVALID, "tools.parameter_validation"),
        ),
        (
            tool_request(&f, "convert", &["cp", "a", "b"], &[("out", one(f.p("ws/input.png")))]),
            (INVALID, "tools.parameter_validation"),
        ),
        (
            tool_request(&f, "convert", &["cp", "a", "b"], &[("input", one(f.p("home/.ssh/id_ed25519")))]),
            (SCOPE, "scope.sensitive_path"),
        ),
        (tool_request(&f, "convert", &["cp", "a", "b"], &[("out", one("/".into()))]), (SCOPE, "scope.root")),
        (tool_request(&f, "convert", &["cat", "a"], &[]), (DENY, "executables.not_allowed")),
        // A path argument the tool was not granted.
        (
            tool_request(&f, "convert", &["cp", &f.p("outside/secret"), "/workspace/x"], &[]),
            (SCOPE, "scope.outside_roots"),
        ),
        (
            tool_request(&f, "fetch", &["curl", "-o", &f.p("ws/x"), "https://any.example/"], &[]),
            (SCOPE, "scope.outside_roots"),
        ),
    ];
    for (req, (kind, rule)) in cases {
        assert_eq!(verdict(&p, &ctx, &req), Err((kind, rule.to_string())), "{req:?}");
    }

    // code_analyzer: the workspace read-only, no temp workspace, no network.
    let Decision::Allow(r) = decide(&p, &ctx, &tool_request(&f, "scan", &["grep", "-r", "x", "src"], &[]))
    else {
        panic!()
    };
    assert!(r.plan.mounts.iter().any(
        |m| matches!(m, Mount::Bind { target, writable: false, .. } if *target == f.ws().to_string_lossy())
    ));
    assert!(r.writable.is_empty());
    assert_eq!((r.timeout.as_secs(), r.capabilities.process.max_memory_mb), (900, 2048));
    // data_transformer: ${PROJECT_ROOT}/data read-only (the workspace is the project root).
    std::fs::create_dir_all(f.ws().join("data")).unwrap();
    let Decision::Allow(r) = decide(&p, &ctx, &tool_request(&f, "transform", &["ls"], &[])) else { panic!() };
    assert!(r.plan.mounts.iter().any(|m| m.target() == f.ws().join("data").to_string_lossy()));
    // web_scraper: the host network.
    let Decision::Allow(r) =
        decide(&p, &ctx, &tool_request(&f, "fetch", &["curl", "https://any.example/"], &[]))
    else {
        panic!()
    };
    assert!(!r.plan.namespaces.net);
}

fn arb_component() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_string()),
        Just(".".to_string()),
        Just("src".to_string()),
        Just("link-out".to_string()),
        Just("keys".to_string()),
        Just("outside".to_string()),
        Just("ws".to_string()),
        Just("secret".to_string()),
        Just("~".to_string()),
        Just(".ssh".to_string()),
        Just("etc".to_string()),
        Just("root".to_string()),
        Just("home".to_string()),
        "[a-z]{1,6}",
        "[а-яa-z]{1,4}",
    ]
}

/// How the generated path is given: alone, or inside an option.
fn arb_shape() -> impl Strategy<Value = usize> {
    0usize..4
}

/// Where the path starts: the workspace (relative), the fixture, or /.
fn arb_start() -> impl Strategy<Value = usize> {
    0usize..3
}

/// An oracle independent of palisade's resolver: the kernel's own answer
/// (`canonicalize`) for the longest prefix that exists, then the rest
/// lexically (a path through something missing resolves no further).
fn oracle(path: &str, cwd: &Path, home: &Path) -> PathBuf {
    let expanded = match path.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{}{rest}", home.display()),
        _ => path.to_string(),
    };
    let full = cwd.join(expanded);
    let mut done = PathBuf::from("/");
    let mut missing = false;
    for c in full.components().skip(1) {
        let next = done.join(c.as_os_str());
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if !missing => {
                done = next
                    .canonicalize()
                    .unwrap_or_else(|_| done.parent().unwrap_or(Path::new("/")).to_path_buf())
            }
            std::path::Component::ParentDir => {
                done.pop();
            }
            _ if missing => done = next,
            _ => match next.canonicalize() {
                Ok(p) => done = p,
                Err(_) => {
                    missing = true;
                    done = next;
                }
            },
        }
    }
    done
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 768, ..ProptestConfig::default() })]

    /// Whatever path an argument names, and however it is given, if the
    /// policy allows the request, the path (resolved as the kernel would)
    /// lies inside an allowed root and outside every sensitive path. The
    /// fixture lives outside every root (not under /tmp).
    #[test]
    fn no_path_outside_the_roots_is_accepted(
        start in arb_start(),
        shape in arb_shape(),
        components in proptest::collection::vec(arb_component(), 1..8),
    ) {
        let f = FIXTURE.with(|f| f.root.clone());
        let ws = f.join("ws");
        let home = f.join("home");
        let path = match start {
            0 => components.join("/"),
            1 => format!("{}/{}", f.display(), components.join("/")),
            _ => format!("/{}", components.join("/")),
        };
        let arg = match shape {
            0 => path.clone(),
            1 => format!("--file={path}"),
            2 => format!("-f{path}"),
            _ => format!("if={path}"),
        };
        let mut env = BTreeMap::new();
        env.insert("HOME".to_string(), home.to_string_lossy().into_owned());
        let req = RunRequest {
            argv: vec!["cat".into(), arg.clone()],
            cwd: Some(ws.to_string_lossy().into_owned()),
            env,
            ..Default::default()
        };
        let allowed = POLICY.with(|p| matches!(decide(p, &context(true, 7), &req), Decision::Allow(_)));
        // A bare name that does not exist is not a path (cat gets a word).
        let is_path = path.contains('/') || path.starts_with('.') || path.starts_with('~') || ws.join(&path).exists();
        if allowed && is_path {
            let resolved = oracle(&path, &ws, &home);
            let roots = [ws.clone(), PathBuf::from("/usr"), PathBuf::from("/tmp"), PathBuf::from("/etc"), PathBuf::from("/proc"), PathBuf::from("/dev")];
            prop_assert!(roots.iter().any(|r| resolved.starts_with(r)), "{arg} -> {}", resolved.display());
            prop_assert!(!resolved.starts_with(f.join("outside")), "{arg} -> {}", resolved.display());
            prop_assert!(!resolved.starts_with(&home), "{arg} -> {}", resolved.display());
            prop_assert!(!resolved.components().any(|c| c.as_os_str() == ".ssh"), "{arg} -> {}", resolved.display());
            prop_assert!(!resolved.starts_with("/root") && !resolved.starts_with("/home"), "{arg} -> {}", resolved.display());
            prop_assert!(resolved != Path::new("/etc/shadow"), "{arg}");
        }
    }
}

thread_local! {
    // Outside every root the policy grants (in particular not under /tmp).
    static FIXTURE: Fixture = Fixture::new_in(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        &format!("prop-{:?}", std::thread::current().id()).replace(['(', ')'], ""),
    );
    static POLICY: Policy = policy("");
}
