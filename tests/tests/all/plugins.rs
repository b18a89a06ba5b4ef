//! Tier A, WebAssembly skill plugins, end to end through palisaded, the
//! CLI and the plugin-host in its jail (issue 16, point 7). The plugins are
//! the WAT files of `tests/plugins/`. The tests that run a plugin need
//! `palisade-plugin-host` next to the other binaries (the refusals before
//! the host need it not). As root the file runs again as the unprivileged
//! test user.

use palisade_broker::cli::client::{Client, ClientError};
use palisade_broker::plugins::index::sha256_hex;
use palisade_protocol::plugin::PluginAttestation;
use palisade_protocol::wire::{ClientMessage, ErrorKind, ErrorReply, ServerMessage};
use palisade_tests::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The call's deadline in these tests.
const TIMEOUT_MS: u64 = 2000;
/// Fuel enough for echo and the host-function plugins, not for a loop.
const FUEL: u64 = 5_000_000;
/// A few pages: the grow plugin reaches it at once.
const MEMORY: u64 = 4 << 20;

fn plugins_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins")
}

/// palisade-plugin-host is a member of the workspace, built next to
/// palisade-helper: a suite without it is a broken build, not a pass.
fn host_built() {
    let host = bin("palisade-helper").with_file_name("palisade-plugin-host");
    assert!(host.exists(), "{} is not built (the palisade-plugins crate)", host.display());
}

/// A skills directory, a secrets directory, and the policy naming them.
struct Skills {
    dir: TempDir,
}

impl Skills {
    fn new() -> Skills {
        let dir = TempDir::new("skills");
        std::fs::create_dir_all(dir.join("src")).unwrap();
        Skills { dir }
    }

    fn policy(&self, extra: &str) -> String {
        format!(
            "[plugins]\nenabled = true\nskills_dir = {:?}\nsecrets_dir = {:?}\ntimeout_ms = {TIMEOUT_MS}\n\
             fuel_budget = {FUEL}\nmax_memory_bytes = {MEMORY}\n{extra}",
            self.dir.join("skills"),
            self.dir.join("secrets"),
        )
    }

    fn policy_file(&self, extra: &str) -> PathBuf {
        let path = self.dir.join("policy.toml");
        std::fs::write(&path, self.policy(extra)).unwrap();
        path
    }

    /// Installs `tests/plugins/<plugin>.wat` as skill `name` with these capabilities, by the CLI.
    fn install(&self, name: &str, plugin: &str, capabilities: &str) {
        let module = std::fs::read(plugins_dir().join(format!("{plugin}.wat"))).unwrap();
        let src = self.dir.join("src");
        std::fs::write(src.join(format!("{name}.wat")), &module).unwrap();
        let manifest = src.join(format!("{name}.toml"));
        std::fs::write(
            &manifest,
            format!(
                "name = {name:?}\nversion = \"1.0.0\"\nmodule = \"{name}.wat\"\nsha256 = {:?}\n[capabilities]\n{capabilities}\n",
                sha256_hex(&module)
            ),
        )
        .unwrap();
        let out = self.cli(&["plugin", "install", manifest.to_str().unwrap()], None);
        assert!(out.status.success(), "install {name}: {}", text(&out.stderr));
    }

    fn cli(&self, args: &[&str], stdin: Option<&str>) -> std::process::Output {
        use std::io::Write;
        let policy = self.policy_file("");
        let mut cmd = std::process::Command::new(bin("palisade"));
        cmd.args(args).args(["--policy", policy.to_str().unwrap()]);
        cmd.env("PALISADE_JOURNAL", self.dir.join("journal"))
            .env("PALISADE_STATE", state_beside(self.dir.join("journal")));
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
        cmd.stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    }
}

type Called = Result<(String, PluginAttestation), ErrorReply>;

fn call_with(d: &Daemon, skill: &str, input: &str, inline_module: Option<String>) -> Called {
    let mut client = Client::connect(&d.socket).unwrap();
    let message = ClientMessage::RunPlugin {
        skill: skill.into(),
        input: input.into(),
        inline_module,
        timeout_ms: None,
    };
    match client.request(&message) {
        Ok(ServerMessage::PluginResult { output, attestation, .. }) => Ok((output, *attestation)),
        Ok(other) => panic!("unexpected reply {other:?}"),
        Err(ClientError::Reply(e)) => Err(e),
        Err(e) => panic!("{skill}: {e}\n{}", d.log()),
    }
}

fn call(d: &Daemon, skill: &str, input: &str) -> Called {
    call_with(d, skill, input, None)
}

/// The call failed with `kind`, or its plugin's output says the host function was refused with it.
fn refused(called: &Called, kind: ErrorKind) -> bool {
    match called {
        Err(e) => e.kind == kind,
        Ok((output, _)) => output.contains(kind.name()),
    }
}

fn echo_works(d: &Daemon) {
    let (output, a) =
        call(d, "echo", r#"{"hello":"world"}"#).unwrap_or_else(|e| panic!("echo: {e:?}\n{}", d.log()));
    assert_eq!(output, r#"{"hello":"world"}"#);
    assert_eq!(a.entry, "palisade_plugin_main");
    // This host's cgroups are its process manager's: the host has none of
    // its own, and the attestation says so (tests/vm checks the other case).
    assert_eq!(a.jail.cgroup, None);
}

#[test]
fn refusals_before_the_plugin_host() {
    let skills = Skills::new();
    skills.install("echo", "echo", "");
    // A module that does not match its manifest is refused at install.
    let src = skills.dir.join("src");
    std::fs::write(src.join("bad.wat"), "(module)").unwrap();
    std::fs::write(
        src.join("bad.toml"),
        format!("name = \"bad\"\nversion = \"1\"\nmodule = \"bad.wat\"\nsha256 = {:?}\n", "0".repeat(64)),
    )
    .unwrap();
    let out = skills.cli(&["plugin", "install", src.join("bad.toml").to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("does not match the manifest"), "{}", text(&out.stderr));
    // An unknown key in a manifest names its line.
    std::fs::write(src.join("typo.toml"), "name = \"t\"\nversion = \"1\"\nmodul = \"x\"\n").unwrap();
    let out = skills.cli(&["plugin", "install", src.join("typo.toml").to_str().unwrap()], None);
    assert!(text(&out.stderr).contains("typo.toml:3:"), "{}", text(&out.stderr));
    let out = skills.cli(&["plugin", "list", "--json"], None);
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed[0]["name"], "echo");
    assert_eq!(listed.as_array().unwrap().len(), 1);

    let off = Daemon::start(&skills.policy("").replace("enabled = true", "enabled = false"));
    let e = call(&off, "echo", "{}").unwrap_err();
    assert_eq!((e.kind, e.rule.as_deref()), (ErrorKind::PolicyDenied, Some("plugins.disabled")));
    drop(off);
    let d = Daemon::start(&skills.policy(""));
    let e = call_with(&d, "inline", "{}", Some("(module)".into())).unwrap_err();
    assert_eq!((e.kind, e.rule.as_deref()), (ErrorKind::PolicyDenied, Some("plugins.inline_not_allowed")));
    assert_eq!(call(&d, "nope", "{}").unwrap_err().kind, ErrorKind::InvalidRequest);
    // The Python client speaks it too (JSON lines).
    let out = python_client(&[])
        .args(["--socket", d.socket.to_str().unwrap(), "--plugin", "nope", "{}"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("InvalidRequest: no skill \"nope\""), "{}", text(&out.stderr));
    // The module is verified at every load, not only at install.
    std::fs::write(skills.dir.join("skills/echo/module.wasm"), "(module )").unwrap();
    let e = call(&d, "echo", "{}").unwrap_err();
    assert_eq!(e.kind, ErrorKind::RuntimeFailure);
    assert!(e.message.contains("does not match"), "{}", e.message);
    let journal = std::fs::read_dir(d.journal())
        .unwrap()
        .flatten()
        .map(|f| std::fs::read_to_string(f.path()).unwrap_or_default())
        .collect::<String>();
    // A refused call is recorded as such (a call that runs gets its `plugin_finished` too).
    let denied = journal
        .lines()
        .filter(|l| l.contains("\"plugin_called\"") && l.contains("\"decision\":\"deny\""))
        .count();
    assert_eq!(denied, 4, "{}", journal.trim_end());
}

/// A daemon with every test skill installed, and an origin on loopback.
fn setup() -> (Skills, Daemon, Origin, std::net::TcpListener) {
    let skills = Skills::new();
    for (name, plugin, capabilities) in [
        ("echo", "echo", "log = true"),
        ("loop", "loop", ""),
        ("grow", "grow", ""),
        ("trap", "trap", ""),
        ("secret", "secret", "secrets = [\"granted_key\", \"other_key\"]"),
        ("fetch", "fetch", "http_hosts = [\"origin.test\", \"denied.test\"]"),
        ("sleep", "fetch", "http_hosts = [\"origin.test\"]"),
        ("storage", "storage", "storage_prefixes = [\"notes/\", \"cache/\"]"),
        ("malformed", "malformed", ""),
    ] {
        skills.install(name, plugin, capabilities);
    }
    for (key, value) in [("granted_key", "sesame"), ("other_key", "never-seen")] {
        let out = skills.cli(&["plugin", "secret", "set", key], Some(value));
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    // Accepts and never answers: a host call that outlives the call's deadline.
    let (stall, _) = loopback_listener();
    let stall_port = stall.local_addr().unwrap().port();
    let d = Daemon::start(&skills.policy(&format!(
        "allow_inline_modules = true\nallow_http_hosts = [\"origin.test\"]\nallow_secrets = [\"granted_key\"]\n\
         allow_storage_prefixes = [\"notes/\"]\n\
         [egress]\nports = [{}, {stall_port}]\nallow_addresses = [\"127.0.0.1\"]\n\
         hosts = {{ \"origin.test\" = \"127.0.0.1\", \"denied.test\" = \"127.0.0.1\" }}\n",
        origin.port()
    )));
    (skills, d, origin, stall)
}

#[test]
fn limits_end_a_call_and_the_next_call_works() {
    host_built();
    let (_skills, d, _origin, stall) = setup();
    echo_works(&d);
    let e = call(&d, "loop", "{}").unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded, "loop: {e:?}");
    echo_works(&d);
    let e = call(&d, "grow", "{}").unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded, "grow: {e:?}");
    echo_works(&d);
    let e = call(&d, "trap", "{}").unwrap_err();
    assert_eq!(e.kind, ErrorKind::RuntimeFailure, "trap: {e:?}");
    echo_works(&d);
    let e = call(&d, "malformed", "{}").unwrap_err();
    assert_eq!(e.kind, ErrorKind::RuntimeFailure, "malformed: {e:?}");
    echo_works(&d);
    let garbage = call_with(&d, "inline", "{}", Some("bm90IGEgbW9kdWxl".into())).unwrap_err();
    assert_eq!(garbage.kind, ErrorKind::RuntimeFailure, "inline garbage: {garbage:?}");
    echo_works(&d);
    // A host call past the deadline: the broker answers it TimedOut, and
    // the call ends within its deadline and the grace.
    let url = format!("http://origin.test:{}/never", stall.local_addr().unwrap().port());
    let started = Instant::now();
    let slept = call(&d, "sleep", &serde_json::json!({ "url": url }).to_string());
    assert!(
        refused(&slept, ErrorKind::TimedOut) || refused(&slept, ErrorKind::QuotaExceeded),
        "sleep: {slept:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(3));
    echo_works(&d);
}

#[test]
fn grants_decide_secrets_fetches_and_storage() {
    host_built();
    let (_skills, d, origin, _stall) = setup();
    let (output, a) = call(&d, "secret", r#"{"key":"granted_key"}"#).unwrap();
    assert!(output.contains("sesame"), "{output}");
    assert_eq!(a.grants.secrets, ["granted_key"]);
    // Requested by the manifest, not allowed by the policy.
    let other = call(&d, "secret", r#"{"key":"other_key"}"#);
    assert!(refused(&other, ErrorKind::CapabilityDenied), "{other:?}");
    assert!(!format!("{other:?}").contains("never-seen"));
    echo_works(&d);

    let url = |host: &str| format!("http://{host}:{}/from-plugin", origin.port());
    let fetched =
        call(&d, "fetch", &serde_json::json!({ "url": url("origin.test"), "method": "GET" }).to_string());
    let (output, a) = fetched.unwrap();
    assert!(output.contains("origin saw GET /from-plugin"), "{output}");
    assert_eq!(a.grants.http_hosts, ["origin.test"]);
    let before = origin.accepted();
    let denied = call(&d, "fetch", &serde_json::json!({ "url": url("denied.test") }).to_string());
    assert!(refused(&denied, ErrorKind::CapabilityDenied), "{denied:?}");
    let https = call(&d, "fetch", r#"{"url":"https://origin.test/"}"#);
    assert!(format!("{https:?}").contains("https is not supported"), "{https:?}");
    assert_eq!(origin.accepted(), before, "a refused fetch reached the origin");
    echo_works(&d);

    let (output, a) = call(&d, "storage", r#"{"key":"notes/a","value":"kept"}"#).unwrap();
    assert!(output.contains("kept"), "{output}");
    let me = nix::unistd::getuid().as_raw();
    let store = a.store.expect("a call granted storage names its store");
    assert_eq!((store.uid, store.skill.as_str()), (me, "storage"));
    let (output, _) = call(&d, "storage", r#"{"get":1,"key":"notes/a"}"#).unwrap();
    assert_eq!(output, r#"{"ok":{"value":"kept"}}"#);
    // A call granted no storage names none.
    assert_eq!(call(&d, "echo", "{}").unwrap().1.store, None);
    let outside = call(&d, "storage", r#"{"key":"cache/a","value":"no"}"#);
    assert!(refused(&outside, ErrorKind::CapabilityDenied), "{outside:?}");
    echo_works(&d);
}

/// `palisade plugin run SKILL --input INPUT --json` through `d` as `user`:
/// the answer's JSON (`plugin_result` or `error`).
fn call_as(d: &Daemon, user: &nix::unistd::User, skill: &str, input: &str) -> serde_json::Value {
    let out = std::process::Command::new("setpriv")
        .args(&as_user(user)[1..])
        .arg(bin("palisade"))
        .args(["plugin", "run", skill, "--input", input, "--json", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{skill} as {}: {e}: {}{}\n{}", user.name, text(&out.stdout), text(&out.stderr), d.log())
    })
}

/// The plugin's output of an answer, and the uid its attestation's store names.
fn stored(answer: &serde_json::Value) -> (String, u64) {
    let result = &answer["plugin_result"];
    let output = result["output"].as_str().unwrap_or_else(|| panic!("{answer}"));
    (output.to_string(), result["attestation"]["store"]["uid"].as_u64().unwrap_or_else(|| panic!("{answer}")))
}

/// A root broker serving two users: each has a store of its own for the
/// same skill. What one writes the other neither reads nor changes, one
/// filling its quota leaves the other's, and the files of a store are not
/// readable by the other user; the owner reads its own value back.
#[test]
fn storage_is_each_requesters_own() {
    host_built();
    let Some(users) = system_users() else {
        skipped("not root: a root broker serving other users cannot be tested as an ordinary user");
        return;
    };
    let (owner, other) = (&users.victim, &users.attacker);
    let skills = Skills::new();
    // Everyone may traverse to the stores: their own modes are what keeps them.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(skills.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    skills.install("storage", "storage", "storage_prefixes = [\"notes/\"]");
    let d = Daemon::start(&skills.policy(&format!(
        "allow_storage_prefixes = [\"notes/\"]\nstorage_quota_bytes = 64\n\
         [broker]\nallowed_uids = [0, {}, {}]\nsocket_mode = 0o666\n",
        owner.uid, other.uid
    )));
    let (a, b) = (owner.uid.as_raw() as u64, other.uid.as_raw() as u64);
    let put = |key: &str, value: &str| serde_json::json!({ "key": key, "value": value }).to_string();
    let get = |key: &str| serde_json::json!({ "get": 1, "key": key }).to_string();

    let answer = call_as(&d, owner, "storage", &put("notes/k", "owner-value-4711"));
    assert_eq!(stored(&answer), (r#"{"ok":{"value":"owner-value-4711"}}"#.into(), a));
    assert_eq!(answer["plugin_result"]["attestation"]["store"]["skill"], "storage");
    // The other user, same skill, same key: nothing, and its own store named.
    assert_eq!(
        stored(&call_as(&d, other, "storage", &get("notes/k"))),
        (r#"{"ok":{"value":null}}"#.into(), b)
    );
    let answer = call_as(&d, other, "storage", &put("notes/k", "other-value"));
    assert_eq!(stored(&answer), (r#"{"ok":{"value":"other-value"}}"#.into(), b));
    // Counter-test: the owner reads its own value back, unchanged.
    let answer = call_as(&d, owner, "storage", &get("notes/k"));
    assert_eq!(stored(&answer), (r#"{"ok":{"value":"owner-value-4711"}}"#.into(), a));

    // The other user fills its quota (64 bytes: 7 + 11 used, 10 + 36 more)...
    let answer = call_as(&d, other, "storage", &put("notes/fill", &"x".repeat(36)));
    assert!(stored(&answer).0.starts_with(r#"{"ok":"#), "{answer}");
    let answer = call_as(&d, other, "storage", &put("notes/more", "y"));
    assert!(stored(&answer).0.contains("QuotaExceeded"), "{answer}");
    // ...and the owner still has all of its own.
    let answer = call_as(&d, owner, "storage", &put("notes/more", &"z".repeat(30)));
    assert!(stored(&answer).0.starts_with(r#"{"ok":"#), "{answer}");

    // On disk: the other user cannot read the owner's file; root can.
    let file = skills.dir.join(&format!("skills/.storage/{a}/storage/{}", hex(b"notes/k")));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "owner-value-4711");
    let cat = std::process::Command::new("setpriv")
        .args(&as_user(other)[1..])
        .args(["cat", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!cat.status.success() && cat.stdout.is_empty(), "{}", text(&cat.stdout));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The pid of `d`'s plugin-host: a process of that name whose parents lead
/// to the daemon (other tests' daemons run theirs at the same time).
fn plugin_host_pid(d: &Daemon) -> Option<u32> {
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    };
    let under_daemon = |mut pid: u32| {
        while let Some(p) = parent(pid).filter(|p| *p > 1) {
            if p == d.child.id() {
                return true;
            }
            pid = p;
        }
        false
    };
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "palisade-plugin" && under_daemon(pid)).then_some(pid)
    })
}

fn ns(pid: u32, name: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{name}")).unwrap()
}

#[test]
fn the_plugin_host_is_jailed() {
    host_built();
    let (skills, d, _origin, _stall) = setup();
    let (_, a) = call(&d, "echo", "{}").unwrap();
    assert_eq!(a.jail.namespaces.len(), 7, "{:?}", a.jail.namespaces);
    assert!(a.jail.address_space_unlimited);
    assert!(!a.jail.engine.is_empty() && a.jail.seccomp_sha256.len() == 64);
    let pid = plugin_host_pid(&d).expect("the plugin-host runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    let daemon = d.child.id();
    for name in ["user", "mnt", "pid", "net", "ipc", "uts"] {
        assert_ne!(ns(pid, name), ns(daemon, name), "{name} namespace shared with the broker");
    }
    // The module cache's MAC key is nowhere in the host's root; the cache is.
    let inside = |path: &Path| Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap());
    let (key, cache) = (skills.dir.join("secrets/.module-cache.key"), skills.dir.join("skills/.cache"));
    assert!(key.is_file() && inside(&cache).is_dir(), "{}", inside(&cache).display());
    assert!(!inside(&key).exists() && !inside(key.parent().unwrap()).exists());
}

#[test]
fn killing_the_plugin_host_mid_call_fails_that_call_and_the_next_works() {
    host_built();
    let skills = Skills::new();
    skills.install("echo", "echo", "");
    skills.install("loop", "loop", "");
    // Fuel and time for the loop to run while the host is killed.
    let policy = skills.policy("").replace(&format!("fuel_budget = {FUEL}"), "fuel_budget = 100000000000");
    let policy = policy.replace(&format!("timeout_ms = {TIMEOUT_MS}"), "timeout_ms = 20000");
    let d = std::sync::Arc::new(Daemon::start(&policy));
    echo_works(&d);
    let first = plugin_host_pid(&d).expect("the plugin-host runs");
    let looping = {
        let d = d.clone();
        std::thread::spawn(move || call(&d, "loop", "{}"))
    };
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let e = looping.join().unwrap().unwrap_err();
    assert_eq!(e.kind, ErrorKind::RuntimeFailure, "{e:?}");
    echo_works(&d);
    assert_ne!(plugin_host_pid(&d), Some(first), "the next call has a new plugin-host");
}

/// A file of the module cache: its name, inode, modification time and its bytes' sha256.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cached {
    name: String,
    ino: u64,
    mtime: (i64, i64),
    sha256: String,
}

/// The module cache's files, by name.
fn cache_files(skills: &Skills) -> Vec<Cached> {
    use std::os::unix::fs::MetadataExt;
    let dir = skills.dir.join("skills/.cache");
    let mut out: Vec<Cached> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let meta = std::fs::symlink_metadata(e.path()).unwrap();
                    Cached {
                        name: e.file_name().to_string_lossy().into_owned(),
                        ino: meta.ino(),
                        mtime: (meta.mtime(), meta.mtime_nsec()),
                        sha256: sha256_hex(&std::fs::read(e.path()).unwrap_or_default()),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The cached artifact of the installed skill `name`.
fn artifact_of(skills: &Skills, name: &str) -> Cached {
    let module = std::fs::read(skills.dir.join(&format!("skills/{name}/module.wasm"))).unwrap();
    let sha = sha256_hex(&module);
    let files = cache_files(skills);
    let found = files.iter().find(|c| c.name.starts_with(&format!("{sha}-")) && c.name.ends_with(".cwasm"));
    found.unwrap_or_else(|| panic!("no artifact of {name} ({sha}) in {:?}", names(&files))).clone()
}

fn names(files: &[Cached]) -> Vec<&str> {
    files.iter().map(|c| c.name.as_str()).collect()
}

/// Lines of `d`'s log that say a module was compiled.
fn compiled(d: &Daemon) -> usize {
    d.log().matches("module compiled by the plugin-host").count()
}

/// The module cache authenticates what it holds: an artifact whose bytes
/// changed, or one put under another module's name, is removed and the
/// module compiled again (never loaded: the call runs its own module);
/// an untampered artifact is reused by the next broker, not compiled again.
#[test]
fn the_module_cache_loads_only_what_the_broker_wrote() {
    host_built();
    let skills = Skills::new();
    skills.install("echo", "echo", "");
    skills.install("storage", "storage", "storage_prefixes = [\"notes/\"]");
    let policy = skills.policy("allow_storage_prefixes = [\"notes/\"]\n");
    let d = Daemon::start(&policy);
    echo_works(&d);
    let put = r#"{"key":"notes/a","value":"kept"}"#;
    assert_eq!(call(&d, "storage", put).unwrap().0, r#"{"ok":{"value":"kept"}}"#);
    assert_eq!(compiled(&d), 2, "{}", d.log());
    drop(d);
    let echo = artifact_of(&skills, "echo");
    let key = skills.dir.join("secrets/.module-cache.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);

    // Counter-test: a broker started afresh reuses the untampered artifact.
    let d = Daemon::start(&policy);
    echo_works(&d);
    assert_eq!(compiled(&d), 0, "{}", d.log());
    assert_eq!(artifact_of(&skills, "echo"), echo, "the artifact was written again");
    drop(d);

    // Its bytes changed: not loaded, compiled again, and said.
    let path = skills.dir.join(&format!("skills/.cache/{}", echo.name));
    let mut tampered = std::fs::read(&path).unwrap();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 0xff;
    std::fs::write(&path, &tampered).unwrap();
    let d = Daemon::start(&policy);
    echo_works(&d);
    assert!(d.log().contains("does not verify against the broker's MAC"), "{}", d.log());
    assert_eq!(compiled(&d), 1, "{}", d.log());
    let again = artifact_of(&skills, "echo");
    assert_ne!(again.sha256, sha256_hex(&tampered), "the tampered artifact stayed");
    drop(d);

    // Echo's artifact and MAC under storage's names: storage's own code runs.
    let storage = artifact_of(&skills, "storage");
    let cache = skills.dir.join("skills/.cache");
    for ext in ["cwasm", "mac"] {
        let from = cache.join(&again.name).with_extension(ext);
        std::fs::copy(from, cache.join(&storage.name).with_extension(ext)).unwrap();
    }
    let d = Daemon::start(&policy);
    let (output, _) = call(&d, "storage", &put.replace("kept", "own code")).unwrap();
    assert_eq!(output, r#"{"ok":{"value":"own code"}}"#, "another module's artifact ran");
    assert!(d.log().contains("does not verify against the broker's MAC"), "{}", d.log());
    assert_eq!(compiled(&d), 1, "{}", d.log());
}

/// An inline module's artifact goes with its call (it ran or failed), and
/// the cache keeps only installed skills' modules: what no skill names is
/// swept at start, after `plugin install` and `plugin remove`; past
/// `cache_max_bytes` an installed skill's module is compiled for its call
/// only. Counter-test: an installed skill's artifact is cached and reused.
#[test]
fn the_module_cache_keeps_only_installed_skills_within_its_bound() {
    host_built();
    let skills = Skills::new();
    skills.install("echo", "echo", "");
    let policy = skills.policy("allow_inline_modules = true\n");
    let d = Daemon::start(&policy);
    echo_works(&d);
    let before = cache_files(&skills);
    let echo = artifact_of(&skills, "echo");
    let module = |plugin: &str, n: usize| {
        let text = std::fs::read_to_string(plugins_dir().join(format!("{plugin}.wat"))).unwrap();
        let start = text.find("(module").unwrap();
        format!("{}\n;; distinct {n}\n", &text[start..])
    };
    for n in 0..4 {
        let (output, a) = call_with(&d, "inline", "{\"n\":1}", Some(module("echo", n))).unwrap();
        assert_eq!((output.as_str(), a.store), ("{\"n\":1}", None));
        let e = call_with(&d, "inline", "{}", Some(module("trap", n))).unwrap_err();
        assert_eq!(e.kind, ErrorKind::RuntimeFailure, "{e:?}");
        assert_eq!(cache_files(&skills), before, "inline module {n} left something in the cache");
    }
    assert_eq!(compiled(&d), 1 + 8, "{}", d.log());
    // Counter-test: the installed skill's artifact is reused, not compiled again.
    echo_works(&d);
    assert_eq!((artifact_of(&skills, "echo"), compiled(&d)), (echo.clone(), 9));
    drop(d);

    // Entries no installed skill names: swept when a broker starts.
    let cache = skills.dir.join("skills/.cache");
    let digest = echo.name.trim_end_matches(".cwasm").split_once('-').unwrap().1.to_string();
    let plant = || {
        let stale = format!("{}-{digest}", sha256_hex(b"no skill has this module"));
        for name in [
            format!("{stale}.cwasm"),
            format!("{stale}.mac"),
            format!("call-7-{stale}.cwasm"),
            "planted".into(),
        ] {
            std::fs::write(cache.join(name), b"not the broker's").unwrap();
        }
        std::fs::create_dir_all(cache.join("a-dir")).unwrap();
    };
    plant();
    let d = Daemon::start(&policy);
    assert_eq!(names(&cache_files(&skills)), names(&before), "{}", d.log());
    echo_works(&d);
    assert_eq!(compiled(&d), 0, "{}", d.log());
    // After an install (another skill), and after a remove (echo's own artifact goes too).
    plant();
    skills.install("log", "log", "log = true");
    assert_eq!(names(&cache_files(&skills)), names(&before));
    plant();
    let out = skills.cli(&["plugin", "remove", "echo"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cache_files(&skills), vec![]);
    assert_eq!(call(&d, "echo", "{}").unwrap_err().kind, ErrorKind::InvalidRequest);
    drop(d);

    // Past the bound: the installed skill's module is compiled for each call, and nothing stays.
    skills.install("echo", "echo", "");
    let d = Daemon::start(&skills.policy("cache_max_bytes = 1\n"));
    echo_works(&d);
    echo_works(&d);
    assert_eq!((cache_files(&skills), compiled(&d)), (vec![], 2));
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_plugin_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_plugin_suite_passes_as_an_unprivileged_user");
}
