//! The real `palisade-plugin-host`, driven through its stdin and stdout
//! with the broker's frames, on the test plugins of `tests/plugins/`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use palisade_protocol::plugin::{
    CallDone, CallOutcome, FromHost, HostFn, HostFnError, PluginCall, PluginLimits, ToHost, encode_frame,
    read_frame,
};
use palisade_protocol::wire::ErrorKind;

/// Longest wait for any answer: far above any call here, below a hung CI.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

const LIMITS: PluginLimits = PluginLimits {
    fuel_budget: 10_000_000,
    max_memory_bytes: 16 << 20,
    max_table_elements: 1000,
    max_instances: 1,
    deadline_ms: 5_000,
};

struct Host {
    child: Child,
    stdin: ChildStdin,
    frames: Receiver<FromHost>,
    dir: PathBuf,
    engine: String,
    next_id: u64,
}

impl Host {
    fn start(name: &str) -> Host {
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade-plugin-host"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("palisade-plugin-host starts");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = child.stdout.take().expect("stdout");
        let (tx, frames) = mpsc::channel();
        std::thread::spawn(move || {
            while let Ok(Some(frame)) = read_frame::<FromHost>(&mut stdout) {
                if tx.send(frame).is_err() {
                    return;
                }
            }
        });
        let dir = std::env::temp_dir().join(format!("palisade-plugins-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("artifact directory");
        let mut host = Host { child, stdin, frames, dir, engine: String::new(), next_id: 1 };
        match host.recv() {
            FromHost::Ready { engine } => host.engine = engine,
            other => panic!("expected Ready, got {other:?}"),
        }
        host
    }

    fn send(&mut self, message: &ToHost) {
        self.stdin.write_all(&encode_frame(message).expect("encodes")).expect("writes");
    }

    fn recv(&self) -> FromHost {
        self.frames.recv_timeout(ANSWER_TIMEOUT).expect("an answer from the host")
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn compile_bytes(&mut self, module: Vec<u8>) -> FromHost {
        let id = self.id();
        self.send(&ToHost::Compile { id, module });
        self.recv()
    }

    /// Compiles `tests/plugins/NAME.wat` and writes its artifact where calls find it.
    fn compile(&mut self, name: &str) -> String {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/plugins").join(format!("{name}.wat"));
        let wat = std::fs::read(&path).expect("the test plugin");
        self.install(name, wat)
    }

    fn install(&mut self, name: &str, module: Vec<u8>) -> String {
        let artifact = match self.compile_bytes(module) {
            FromHost::Compiled { artifact, .. } => artifact,
            other => panic!("compiling {name}: {other:?}"),
        };
        let path = self.dir.join(format!("{name}.cwasm"));
        std::fs::write(&path, artifact).expect("writes the artifact");
        path.to_string_lossy().into_owned()
    }

    fn plugin_call(
        &mut self,
        artifact: &str,
        entry: &str,
        input: &str,
        limits: PluginLimits,
        granted: &[HostFn],
    ) -> PluginCall {
        PluginCall {
            id: self.id(),
            artifact: artifact.into(),
            module_sha256: "00".repeat(32),
            entry: entry.into(),
            input: input.as_bytes().to_vec(),
            limits,
            granted: granted.to_vec(),
        }
    }

    /// A call whose host functions `answer` serves (`None`: no answer at all);
    /// returns its `Done` and the host calls it saw.
    fn call_with(
        &mut self,
        call: PluginCall,
        mut answer: impl FnMut(HostFn, &[u8]) -> Option<Result<Vec<u8>, HostFnError>>,
    ) -> (CallDone, Vec<(HostFn, String)>) {
        let id = call.id;
        self.send(&ToHost::Call(call));
        let mut seen = Vec::new();
        loop {
            match self.recv() {
                FromHost::HostCall { id: hid, function, args } => {
                    assert_eq!(hid, id, "a host call carries its call's id");
                    seen.push((function, String::from_utf8_lossy(&args).into_owned()));
                    if let Some(result) = answer(function, &args) {
                        self.send(&ToHost::HostReply { id, result });
                    }
                }
                FromHost::Done(done) => {
                    assert_eq!(done.id, id);
                    return (done, seen);
                }
                other => panic!("call {id}: {other:?}"),
            }
        }
    }

    fn call(&mut self, artifact: &str, input: &str, limits: PluginLimits) -> CallDone {
        let call = self.plugin_call(artifact, "palisade_plugin_main", input, limits, &[]);
        self.call_with(call, |f, _| panic!("no host call expected, got {f:?}")).0
    }

    /// The call that must work after anything else.
    fn echo_works(&mut self, echo: &str) {
        let done = self.call(echo, r#"{"after":"anything"}"#, LIMITS);
        assert_eq!(done.outcome, CallOutcome::Output(br#"{"after":"anything"}"#.to_vec()));
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn quota(done: &CallDone) -> &str {
    match &done.outcome {
        CallOutcome::QuotaExceeded(what) => what,
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
}

/// Ready, with the same engine digest in every process, and the host's own
/// filter in force (it refuses exec: `seccomp::tests` checks what it does).
#[test]
fn ready_with_a_stable_digest_and_its_seccomp_filter_on() {
    let (a, b) = (Host::start("digest-a"), Host::start("digest-b"));
    assert!(a.engine.starts_with("wasmtime-48."), "{}", a.engine);
    assert_eq!(a.engine, b.engine);
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", a.child.id())).expect("the host's status");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
}

#[test]
fn echo_and_every_limit_then_echo_again() {
    let mut host = Host::start("limits");
    let echo = host.install(
        "echo",
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/plugins/echo.wat")).unwrap(),
    );
    let done = host.call(&echo, r#"{"hello":"world"}"#, LIMITS);
    assert_eq!(done.outcome, CallOutcome::Output(br#"{"hello":"world"}"#.to_vec()));
    assert!(done.fuel_used > 0 && done.memory_peak_bytes == 65536, "{done:?}");

    let looping = host.compile("loop");
    let done = host.call(&looping, "{}", LIMITS);
    assert!(quota(&done).starts_with("fuel"), "{done:?}");
    assert_eq!(done.fuel_used, LIMITS.fuel_budget);
    host.echo_works(&echo);

    let endless_fuel = PluginLimits { fuel_budget: u64::MAX, deadline_ms: 50, ..LIMITS };
    let done = host.call(&looping, "{}", endless_fuel);
    assert!(quota(&done).starts_with("deadline"), "{done:?}");
    assert!(done.call_us >= 50_000, "{done:?}");
    host.echo_works(&echo);

    let grow = host.compile("grow");
    let done = host.call(&grow, "{}", LIMITS);
    assert!(quota(&done).starts_with("memory"), "{done:?}");
    assert!(done.memory_peak_bytes <= LIMITS.max_memory_bytes, "{done:?}");
    host.echo_works(&echo);

    let trap = host.compile("trap");
    let done = host.call(&trap, "{}", LIMITS);
    assert!(matches!(&done.outcome, CallOutcome::Trap(m) if m.contains("unreachable")), "{done:?}");
    host.echo_works(&echo);

    let badout = host.compile("badout");
    let done = host.call(&badout, "{}", LIMITS);
    assert!(
        matches!(&done.outcome, CallOutcome::Trap(m) if m.contains("outside the guest's memory")),
        "{done:?}"
    );
    host.echo_works(&echo);

    let call = host.plugin_call(&echo, "no_such_entry", "{}", LIMITS, &[]);
    let (done, _) = host.call_with(call, |_, _| None);
    assert!(matches!(&done.outcome, CallOutcome::Trap(m) if m.contains("no_such_entry")), "{done:?}");
    let done = host.call(&echo, "{}", PluginLimits { max_instances: 0, ..LIMITS });
    assert!(quota(&done).starts_with("instances"), "{done:?}");
    let done = host.call(&echo, "{}", PluginLimits { max_memory_bytes: 1000, ..LIMITS });
    assert!(quota(&done).starts_with("memory"), "an initial memory over the limit: {done:?}");
    let done =
        host.call(&echo, "{}", PluginLimits { deadline_ms: u64::MAX, fuel_budget: u64::MAX, ..LIMITS });
    assert_eq!(done.outcome, CallOutcome::Output(b"{}".to_vec()), "the largest limits");
    host.echo_works(&echo);
}

#[test]
fn bad_modules_and_frames_fail_and_the_host_goes_on() {
    let mut host = Host::start("bad");
    let echo = host.compile("echo");
    for module in [b"\0asm\x01\0\0\0\xff garbage".to_vec(), b"(module (func".to_vec(), Vec::new()] {
        assert!(
            matches!(host.compile_bytes(module), FromHost::Failed { message, .. } if message.contains("compiling"))
        );
    }
    let noabi = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/plugins/noabi.wat")).unwrap();
    assert!(
        matches!(host.compile_bytes(noabi), FromHost::Failed { message, .. } if message.contains("palisade_alloc"))
    );
    let unknown_import = br#"(module (import "palisade" "exec" (func (param i32 i32) (result i64))) (memory (export "memory") 1) (func (export "palisade_alloc") (param i32) (result i32) (i32.const 0)))"#;
    assert!(
        matches!(host.compile_bytes(unknown_import.to_vec()), FromHost::Failed { message, .. } if message.contains("exec"))
    );
    host.echo_works(&echo);

    // A frame whose body is not a message: the stream stays in sync.
    host.stdin.write_all(&[0, 0, 0, 3, 0xff, 0xff, 0xff]).unwrap();
    assert!(matches!(host.recv(), FromHost::Failed { id: 0, .. }));
    host.echo_works(&echo);

    // An artifact that is not one: Failed for that call.
    let junk = host.dir.join("junk.cwasm");
    std::fs::write(&junk, b"not an artifact").unwrap();
    let call = host.plugin_call(&junk.to_string_lossy(), "palisade_plugin_main", "{}", LIMITS, &[]);
    let id = call.id;
    host.send(&ToHost::Call(call));
    assert!(matches!(host.recv(), FromHost::Failed { id: f, .. } if f == id));
    // A late reply with no call waiting is discarded.
    host.send(&ToHost::HostReply { id: 999, result: Ok(b"{}".to_vec()) });
    host.echo_works(&echo);
}

#[test]
fn host_functions_granted_denied_failed_and_late() {
    let mut host = Host::start("hostfns");
    let echo = host.compile("echo");
    let secret = host.compile("secret");
    let input = r#"{"key":"api-token"}"#;

    let call = host.plugin_call(&secret, "palisade_plugin_main", input, LIMITS, &[HostFn::SecretGet]);
    let (done, seen) = host.call_with(call, |_, _| Some(Ok(br#"{"value":"s3cret"}"#.to_vec())));
    assert_eq!(seen, vec![(HostFn::SecretGet, input.to_string())]);
    assert_eq!(done.outcome, CallOutcome::Output(br#"{"ok":{"value":"s3cret"}}"#.to_vec()));

    let call = host.plugin_call(&secret, "palisade_plugin_main", input, LIMITS, &[HostFn::SecretGet]);
    let refusal = HostFnError { kind: ErrorKind::QuotaExceeded, message: "too big".into() };
    let (done, _) = host.call_with(call, |_, _| Some(Err(refusal.clone())));
    let expected = br#"{"error":{"kind":"QuotaExceeded","message":"too big"}}"#;
    assert_eq!(done.outcome, CallOutcome::Output(expected.to_vec()));

    // Not granted: the guest sees CapabilityDenied; the broker is never asked.
    let call = host.plugin_call(&secret, "palisade_plugin_main", input, LIMITS, &[HostFn::Log]);
    let (done, seen) = host.call_with(call, |_, _| panic!("the broker was asked"));
    assert!(seen.is_empty());
    let CallOutcome::Output(out) = &done.outcome else { panic!("{done:?}") };
    let out: serde_json::Value = serde_json::from_slice(out).unwrap();
    assert_eq!(out["error"]["kind"], "CapabilityDenied", "{out}");
    host.echo_works(&echo);

    // A request while a call waits for its host function: refused, busy;
    // the call goes on.
    let call = host.plugin_call(&secret, "palisade_plugin_main", input, LIMITS, &[HostFn::SecretGet]);
    let id = call.id;
    host.send(&ToHost::Call(call));
    assert!(matches!(host.recv(), FromHost::HostCall { id: h, .. } if h == id));
    host.send(&ToHost::Compile { id: 77, module: b"(module)".to_vec() });
    assert!(matches!(host.recv(), FromHost::Failed { id: 77, message } if message.contains("busy")));
    host.send(&ToHost::HostReply { id, result: Ok(br#"{"value":"v"}"#.to_vec()) });
    let FromHost::Done(done) = host.recv() else { panic!("expected Done") };
    assert_eq!(done.outcome, CallOutcome::Output(br#"{"ok":{"value":"v"}}"#.to_vec()));

    // The broker answers after the deadline: the call ends at its deadline,
    // and the late answer is discarded.
    let limits = PluginLimits { deadline_ms: 200, ..LIMITS };
    let call = host.plugin_call(&secret, "palisade_plugin_main", input, limits, &[HostFn::SecretGet]);
    let late_id = call.id;
    let (done, seen) = host.call_with(call, |_, _| None);
    assert_eq!(seen.len(), 1);
    assert!(quota(&done).starts_with("deadline"), "{done:?}");
    host.send(&ToHost::HostReply { id: late_id, result: Ok(b"{}".to_vec()) });
    host.echo_works(&echo);
}

/// The Rust example (`examples/hello-plugin`), built for
/// wasm32-unknown-unknown by `scripts/test-hello-plugin.sh`, which runs this
/// test: a target the workspace's own test run may not have.
#[test]
#[ignore = "needs examples/hello-plugin built for wasm32-unknown-unknown: scripts/test-hello-plugin.sh"]
fn the_rust_example_plugin() {
    let wasm = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/hello-plugin/target/wasm32-unknown-unknown/release/hello_plugin.wasm");
    let module = std::fs::read(&wasm)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/test-hello-plugin.sh)", wasm.display()));
    let mut host = Host::start("hello");
    let hello = host.install("hello", module);
    let call =
        host.plugin_call(&hello, "palisade_plugin_main", r#"{"name":"palisade"}"#, LIMITS, &[HostFn::Log]);
    let (done, seen) = host.call_with(call, |_, _| Some(Ok(b"{}".to_vec())));
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, HostFn::Log);
    let CallOutcome::Output(out) = &done.outcome else { panic!("{done:?}") };
    let out: serde_json::Value = serde_json::from_slice(out).unwrap();
    assert_eq!(out["greeting"], "hello, palisade", "{out}");
}
