//! The macOS broker on Linux: served on a socket, spoken to by the Linux
//! client and by a JSON client of another uid, its commands run through the
//! stand-in for `sandbox-exec` (see `seatbelt::tests`). What is tested is
//! the broker's side: the protocol, who is served, the journal, refusals.

use super::*;
use crate::cli::client::{Client, ClientError};
use crate::seatbelt::tests::{seatbelt_host, stand_in};
use crate::serve::server::Server;
use palisade_policy::{Context, Decision, Policy};
use palisade_protocol::HostIds;
use palisade_protocol::attest::Executor;
use palisade_protocol::wire::{ClientMessage, ErrorKind, RunRequest, RunResult, RunStatus, ServerMessage};
use std::path::Path;
use std::time::Duration;

/// A uid that is not the broker's (the test users of this repository's CI;
/// any other uid does as well).
const OTHER_UID: u32 = 999;

struct Served {
    dir: PathBuf,
    socket: PathBuf,
    /// Serves until the test ends.
    _runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::watch::Sender<bool>>,
}

impl Served {
    fn start(tag: &str, extra: &str) -> Served {
        let base = std::env::temp_dir().canonicalize().unwrap();
        let dir = base.join(format!("palisade-mac-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["bin", "ws", "journal"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        // Reachable by another uid, to be refused by the broker rather than the file system.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let toml = format!(
            "[defaults]\nallow_interpreters = true\nallow_inline_code = true\n\
             [policy]\ntemp_root = \"{}/runs\"\n[journal]\npath = \"{}/journal\"\n\
             [broker]\nsocket_mode = 0o666\n{extra}",
            dir.display(),
            dir.display()
        );
        let config = Config::parse(&toml, Path::new("mac.toml")).unwrap();
        let broker = crate::mac::broker(config, stand_in(&dir.join("bin")), seatbelt_host).unwrap();
        let socket = dir.join("palisade.sock");
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let listener = runtime.block_on(async { crate::serve::socket::bind(&socket, 0o666) }).unwrap();
        runtime.spawn(std::sync::Arc::new(Server::new(broker)).serve(listener, stopping));
        Served { dir, socket, _runtime: runtime, stop: Some(stop) }
    }

    fn request(&self, script: &str) -> RunRequest {
        RunRequest {
            argv: ["/bin/sh", "-c", script].map(String::from).into(),
            cwd: Some(self.dir.join("ws").to_string_lossy().into_owned()),
            ..Default::default()
        }
    }

    fn run(&self, request: RunRequest) -> (Result<RunResult, ClientError>, Vec<ServerMessage>) {
        let mut client = Client::connect(&self.socket).unwrap();
        let mut seen = Vec::new();
        let result = client.run(request, |m| seen.push(m.clone()));
        (result, seen)
    }

    /// A JSON hello from `uid`, and the broker's first line back.
    fn hello_as(&self, uid: u32) -> serde_json::Value {
        let version = palisade_protocol::wire::PROTOCOL_VERSION;
        let script = format!(
            "import socket,sys\n\
            s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
            s.sendall(b'{{\"hello\": {{\"magic\": \"palisade\", \"version\": {version}, \"encoding\": \"json\"}}}}\\n')\n\
            print(s.makefile().readline())"
        );
        let out = std::process::Command::new("/usr/bin/python3")
            .args(["-c", &script])
            .arg(&self.socket)
            .uid(uid)
            .gid(uid)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

use std::os::unix::process::CommandExt;

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        std::thread::sleep(Duration::from_millis(50));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_run_is_served_recorded_and_attested_as_seatbelt() {
    let s = Served::start("run", "");
    let (result, seen) = s.run(s.request("echo hello; exit 4"));
    let result = result.unwrap();
    assert_eq!(result.status, RunStatus::Exited { code: 4 });
    assert!(
        seen.iter().any(|m| matches!(m, ServerMessage::Started { executor: Executor::MacosSeatbelt, .. }))
    );
    let out: Vec<u8> = seen
        .iter()
        .filter_map(|m| match m {
            ServerMessage::Output { data, .. } => Some(data.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(out, b"hello\n");
    let a = &result.attestation;
    assert_eq!(a.executor, Executor::MacosSeatbelt);
    assert!(a.enforcement.seatbelt_sha256.is_some());
    // The end of the run is in the journal, with the seq and hash the result carries.
    let record = a.journal.clone().expect("a journal record");
    let journal = std::fs::read_dir(s.dir.join("journal")).unwrap().flatten().map(|e| e.path());
    let text: String = journal.filter_map(|p| std::fs::read_to_string(p).ok()).collect();
    let finished = text.lines().find(|l| l.contains("\"run_finished\"")).expect("run_finished recorded");
    assert!(finished.contains(&record.hash), "{finished}");
    // The record written before the run is the Seatbelt attestation's.
    let started = text.lines().find(|l| l.contains("\"run_started\"")).expect("run_started recorded");
    assert!(started.contains("macos-seatbelt") && started.contains("seatbelt_sha256"), "{started}");
    for event in ["request_received", "decision", "run_started", "broker"] {
        assert!(text.contains(event), "{event} missing from {text}");
    }
}

#[test]
fn a_refusal_is_a_reply_and_the_connection_serves_on() {
    let s = Served::start("refusal", "");
    let mut client = Client::connect(&s.socket).unwrap();
    let mut outside = s.request("cat /root/.ssh/id_ed25519");
    outside.argv = ["/bin/cat", "/root/.ssh/id_ed25519"].map(String::from).into();
    match client.run(outside, |_| {}) {
        Err(ClientError::Reply(e)) => assert_eq!(e.kind, ErrorKind::WorkspaceScopeDenied, "{}", e.message),
        other => panic!("{other:?}"),
    }
    // What the Linux broker serves and this one does not: answered, and the connection goes on.
    for unserved in [
        ClientMessage::ListChanges,
        ClientMessage::RunPlugin {
            skill: "echo".into(),
            input: "{}".into(),
            inline_module: None,
            timeout_ms: None,
        },
    ] {
        match client.request(&unserved) {
            Err(ClientError::Reply(e)) => {
                assert_eq!(e.kind, ErrorKind::Unavailable, "{}", e.message);
                assert!(e.message.contains("not served by palisade on"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
    }
    // What the one server serves on every system: status, with this executor's figures.
    match client.request(&ClientMessage::Status) {
        Ok(ServerMessage::Status(status)) => {
            assert_eq!(status.cgroup.mode, "none");
            assert_eq!((status.pool.size, status.pool.warm), (0, false));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(client.run(s.request("true"), |_| {}).unwrap().status, RunStatus::Exited { code: 0 });
}

#[test]
fn only_the_brokers_own_uid_is_served() {
    let s = Served::start("uid", "");
    let mine = s.hello_as(nix::unistd::geteuid().as_raw());
    assert!(mine.get("hello").is_some(), "{mine}");
    let other = s.hello_as(OTHER_UID);
    assert_eq!(other["error"]["kind"], "Unauthorized", "{other}");
}

#[test]
fn a_configuration_asking_for_what_is_not_served_is_refused() {
    for (extra, what) in [
        ("[broker]\nallowed_uids = [1000]\n", "serving other users"),
        ("[tools.lint]\npreset = \"code_analyzer\"\n", "trust stages"),
    ] {
        let config = Config::parse(extra, Path::new("mac.toml")).unwrap();
        let dir = std::env::temp_dir().join(format!("palisade-mac-refused-{}", std::process::id()));
        match crate::mac::broker(config, dir.join("sandbox-exec"), seatbelt_host) {
            Err(e) => assert!(e.contains(what) && e.contains("not served by palisade on macOS"), "{e}"),
            Ok(_) => panic!("{extra}: assembled"),
        }
    }
}

/// A client waiting for a run slot that leaves frees its place at once: a
/// third client then waits instead of being told `Busy`, and runs once the
/// first is gone.
#[test]
fn a_client_that_leaves_the_queue_frees_its_place() {
    let s = Served::start("queue", "max_concurrent = 1\nmax_queued = 1\n");
    let mut first = Client::connect(&s.socket).unwrap();
    first.send(&ClientMessage::Run(s.request("sleep 60"))).unwrap();
    assert!(matches!(first.receive().unwrap(), ServerMessage::Started { .. }));
    let mut second = Client::connect(&s.socket).unwrap();
    second.send(&ClientMessage::Run(s.request("echo second"))).unwrap();
    // Its request read before the probe's (connections are served concurrently);
    // queued once a probe is told Busy (one running, one waiting: all places taken).
    std::thread::sleep(Duration::from_millis(300));
    let busy = |r: &Result<RunResult, ClientError>| matches!(r, Err(ClientError::Reply(e)) if e.kind == ErrorKind::Busy);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !busy(&s.run(s.request("true")).0) {
        assert!(std::time::Instant::now() < deadline, "the second client was never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(second);
    // A third client is queued (no answer at once) instead of told Busy.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let third = loop {
        let (tx, rx) = std::sync::mpsc::channel();
        let (socket, request) = (s.socket.clone(), s.request("echo third"));
        let waiting = std::thread::spawn(move || {
            let result = Client::connect(&socket).unwrap().run(request, |_| {});
            let _ = tx.send(());
            result
        });
        match rx.recv_timeout(Duration::from_millis(500)) {
            Err(_) => break waiting,
            Ok(()) => {
                let refused = waiting.join().unwrap();
                assert!(busy(&refused), "{refused:?}");
                assert!(std::time::Instant::now() < deadline, "the second client's place was never freed");
            }
        }
    };
    drop(first);
    let third = third.join().unwrap();
    assert_eq!(third.map(|r| r.status).ok(), Some(RunStatus::Exited { code: 0 }));
}

/// The profile as a Mac gets it: decided on a Mac's layout (`host::layout`,
/// every system directory of it present) rather than this Linux host's,
/// checked line by line against `golden/mac.sb` (`$ROOT`: the test's
/// directory; `PALISADE_BLESS=1` rewrites it after a change that is meant),
/// and read as sandbox-exec would read it (`sbpl`).
#[test]
fn the_profile_a_mac_gets_is_golden_and_reads() {
    let base = std::env::temp_dir().canonicalize().unwrap();
    let dir = base.join(format!("palisade-mac-layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("ws")).unwrap();
    let mac = palisade_policy::Host {
        capabilities: host::capabilities(true),
        homes: vec![],
        layout: host::layout(&|_| true),
        files: crate::host::files::files(),
        owned: Vec::new().into(),
    };
    // Never root (a Mac's first user, staff, when the test is root): the workspace is its own.
    let (uid, gid) = match nix::unistd::geteuid().is_root() {
        true => (501, 20),
        false => (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw()),
    };
    std::os::unix::fs::chown(dir.join("ws"), Some(uid), Some(gid)).unwrap();
    let context = Context {
        parent_pid: 1,
        uid,
        gid,
        serves_others: false,
        requester: HostIds { uid, gid },
        groups: vec![],
        temp_root: PathBuf::from("/private/var/folders/xy/palisade/runs"),
        instance: "1-1".into(),
        run: 7,
        etc_view: None,
        trust: None,
        homes: None,
    };
    let request = RunRequest {
        argv: ["/bin/ls", "-la"].map(String::from).into(),
        cwd: Some(dir.join("ws").to_string_lossy().into_owned()),
        ..Default::default()
    };
    let resolved = match Policy::new(Config::default(), &*mac.files).decide(&mac, &context, &request) {
        Decision::Allow(r) => r,
        other => panic!("{other:?}"),
    };
    let text = palisade_policy::seatbelt::profile(&resolved, &[]).unwrap();
    assert_eq!(palisade_policy::seatbelt::sbpl::check(&text), Ok(()));
    let text = text.replace(&dir.to_string_lossy().into_owned(), "$ROOT");
    for system in host::SYSTEM_DIRS {
        assert!(text.contains(&format!("(subpath \"{system}\")")), "{system} missing:\n{text}");
    }
    for entry in host::ETC_ENTRIES {
        assert!(text.contains(&format!("\"{entry}\"")), "{entry} missing:\n{text}");
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/mac/golden/mac.sb");
    if std::env::var_os("PALISADE_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(text, golden, "the profile differs from {}", path.display());
}

/// SIGHUP reloads the macOS broker's configuration, as it does Linux's: the
/// daemon's life is the one both share.
#[test]
fn sighup_reloads_the_configuration() {
    let dir =
        std::env::temp_dir().canonicalize().unwrap().join(format!("palisade-mac-hup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let launcher = stand_in(&dir.join("bin"));
    super::hangup::sighup_reloads(&dir, |config| crate::mac::broker(config, launcher, seatbelt_host));
    let _ = std::fs::remove_dir_all(&dir);
}
