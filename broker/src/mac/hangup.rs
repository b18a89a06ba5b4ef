//! `palisaded` on macOS lives the life a Linux daemon does
//! ([`crate::serve::start`]): `SIGHUP` reads its configuration file again, a
//! broken file is reported and changes nothing, and a stop removes its socket.

use crate::decide::service::Broker;
use crate::seatbelt::executor::Macos;
use crate::serve::start::{configuration, serve};
use palisade_policy::Config;
use palisade_protocol::wire::{ClientMessage, ReloadOutcome, ServerMessage};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Serves the broker `assemble` makes of a configuration file in `dir`
/// through the daemon's life, and sends this process `SIGHUP` twice: with
/// the file broken (the reload fails, as `status` says), then mended (it
/// succeeds). Then stops it: exit status 0, its socket gone.
pub(super) fn sighup_reloads(dir: &Path, assemble: impl FnOnce(Config) -> Result<Broker<Macos>, String>) {
    let (file, socket) = (dir.join("palisade.toml"), dir.join("palisade.sock"));
    let toml =
        format!("[policy]\ntemp_root = \"{0}/runs\"\n[journal]\npath = \"{0}/journal\"\n", dir.display());
    std::fs::write(&file, &toml).unwrap();
    let broker = assemble(configuration::<Macos>(Some(&file)).unwrap()).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (stop, stopping) = tokio::sync::oneshot::channel::<()>();
    let stopping = async {
        let _ = stopping.await;
    };
    let served = runtime.spawn(serve(broker, socket.clone(), 0o600, Some(file.clone()), stopping));
    // The SIGHUP handler is in place before the socket is bound.
    assert!(until(|| UnixStream::connect(&socket).ok()).is_some(), "not served");
    let last_reload = || match status(&socket) {
        ServerMessage::Status(s) => s.operations.and_then(|o| o.last_reload),
        other => panic!("{other:?}"),
    };
    assert_eq!(last_reload(), None);

    std::fs::write(&file, "[broker\n").unwrap();
    hang_up();
    let failed = until(last_reload).expect("the broken file's reload is not reported");
    assert!(!failed.ok, "{failed:?}");
    assert!(failed.error.as_deref().is_some_and(|e| e.contains("palisade.toml")), "{failed:?}");

    std::fs::write(&file, format!("{toml}[defaults]\nallow_interpreters = true\n")).unwrap();
    hang_up();
    let reloaded = until(|| last_reload().filter(|r| r.ok)).expect("the mended file is not reloaded");
    assert_eq!(reloaded, ReloadOutcome { unix: reloaded.unix, ok: true, error: None });

    stop.send(()).unwrap();
    assert_eq!(runtime.block_on(served).unwrap(), 0);
    assert!(!socket.exists(), "the socket is left behind");
}

/// The broker's answer to `status`, asked in JSON lines (the client of
/// this crate is Linux's).
fn status(socket: &Path) -> ServerMessage {
    let version = palisade_protocol::wire::PROTOCOL_VERSION;
    let mut stream = UnixStream::connect(socket).unwrap();
    let hello = format!(
        "{{\"hello\": {{\"magic\": \"palisade\", \"version\": {version}, \"encoding\": \"json\"}}}}\n"
    );
    let ask = serde_json::to_string(&ClientMessage::Status).unwrap();
    stream.write_all(format!("{hello}{ask}\n").as_bytes()).unwrap();
    let mut lines = BufReader::new(stream).lines();
    let _hello = lines.next().unwrap().unwrap();
    serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap()
}

/// `SIGHUP` to this process, as `kill -HUP` (or `launchctl kill HUP`) sends it.
fn hang_up() {
    nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGHUP).unwrap();
}

/// `f`'s first `Some`, asked every 20 ms for up to 10 s.
fn until<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}
