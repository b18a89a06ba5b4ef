//! Strict egress's speed: one download from an origin on the host's
//! loopback, by the same client (Python's sockets, reading 1 MiB at a time),
//! without a sandbox and from inside one through the broker's proxy and
//! through its transparent path; then over HTTPS, the same way without a
//! sandbox, and from inside one through a passthrough tunnel and through
//! an inspected domain (the broker ends the TLS and makes its own).
//! Nothing but loopback is reached: the names come from the configuration's
//! static host map.

use crate::{Daemon, bin};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// The client, the same in and out of the sandbox: `MODE HOST PORT`, where
/// MODE is `proxy` (a GET through `HTTP_PROXY`) or `direct` (a GET to the
/// name as resolved). Prints the bytes of the body and head it read.
const CLIENT: &str = r#"
import os, socket, sys
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "proxy":
    proxy = os.environ["HTTP_PROXY"].removeprefix("http://").rstrip("/").split(":")
    s = socket.create_connection((proxy[0], int(proxy[1])))
    target = f"http://{host}:{port}/"
else:
    s = socket.create_connection((host, port))
    target = "/"
s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
buf, got = bytearray(1 << 20), 0
while (k := s.recv_into(buf)):
    got += k
print(got)
"#;

/// The origin: every connection gets an HTTP response of `size` bytes.
fn origin(size: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the origin");
    let port = listener.local_addr().expect("origin address").port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let _ = respond(&mut conn, size);
            });
        }
    });
    port
}

/// An HTTP response of `size` bytes, written 1 MiB at a time.
fn respond(w: &mut impl Write, size: usize) -> std::io::Result<()> {
    write!(w, "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n")?;
    let chunk = vec![b'x'; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len());
        w.write_all(&chunk[..n])?;
        left -= n;
    }
    Ok(())
}

/// Seconds for one download by `cmd`, which must print at least `size`.
fn timed(mut cmd: Command, size: usize) -> f64 {
    let t = Instant::now();
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::inherit()).output().expect("run the client");
    let secs = t.elapsed().as_secs_f64();
    let got: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    assert!(out.status.success() && got >= size, "{cmd:?}: {}, {got} of {size} bytes", out.status);
    secs
}

pub fn download(dir: &Path, ws: &Path, size: usize, rounds: usize) -> String {
    let port = origin(size);
    let defaults = "egress = \"strict\"\nnetwork = { allow_domains = [\"origin.bench\"] }\n";
    let tables = format!(
        "[egress]\nports = [{port}]\nhosts = {{ \"origin.bench\" = \"127.0.0.1\" }}\n\
         allow_addresses = [\"127.0.0.1/32\"]\nmax_bytes = {}\n",
        4 * size
    );
    let d = Daemon::start_with(dir, "bench-egress", true, true, defaults, &tables);
    let python = "/usr/bin/python3";
    let client = |mode: &str, host: &str, sandboxed: bool| {
        let mut cmd = Command::new(if sandboxed { bin("palisade") } else { python.into() });
        if sandboxed {
            cmd.args(["run", "--socket", d.socket.to_str().unwrap(), "--", python]);
        }
        cmd.args(["-c", CLIENT, mode, host, &port.to_string()]).current_dir(ws);
        cmd
    };
    let mut times: [Vec<f64>; 3] = Default::default();
    for _ in 0..rounds {
        times[0].push(timed(client("direct", "127.0.0.1", false), size));
        times[1].push(timed(client("proxy", "origin.bench", true), size));
        times[2].push(timed(client("direct", "origin.bench", true), size));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [plain, proxy, transparent] = times.map(|mut v| median(&mut v));
    let mbs = |secs: f64| size as f64 / secs / 1e6;
    format!(
        "### Strict egress ({} MiB from a loopback origin, one connection; median of {rounds}, each including its launch)\n\n\
         | path | MB/s | × no sandbox |\n|---|---:|---:|\n\
         | no sandbox (the client straight to the origin) | {:.0} | 1.00 |\n\
         | sandboxed, through the broker's proxy (`HTTP_PROXY`) | {:.0} | {:.2} |\n\
         | sandboxed, transparent (the name resolved in the sandbox) | {:.0} | {:.2} |\n",
        size >> 20,
        mbs(plain),
        mbs(proxy),
        plain / proxy,
        mbs(transparent),
        plain / transparent
    )
}

/// The HTTPS client, the same in and out of the sandbox: `MODE HOST PORT
/// [CAFILE]`, where MODE is `proxy` (a CONNECT tunnel through
/// `HTTPS_PROXY`) or `direct` (to 127.0.0.1); TLS verified for HOST against
/// CAFILE, else the default roots (in an inspected run: the bundle with
/// the broker's authority). Prints the bytes it read.
const TLS_CLIENT: &str = r#"
import os, socket, ssl, sys
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = ssl.create_default_context(cafile=sys.argv[4]) if len(sys.argv) > 4 else ssl.create_default_context()
if mode == "proxy":
    proxy = os.environ["HTTPS_PROXY"].removeprefix("http://").rstrip("/").split(":")
    s = socket.create_connection((proxy[0], int(proxy[1])))
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += s.recv(1)
else:
    s = socket.create_connection(("127.0.0.1", port))
t = ctx.wrap_socket(s, server_hostname=host)
t.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
buf, got = bytearray(1 << 20), 0
while (k := t.recv_into(buf)):
    got += k
print(got)
"#;

/// An HTTPS origin for `names` (its certificate from a CA written to
/// `dir/origin-ca.pem`): every connection gets a response of `size` bytes.
fn tls_origin(dir: &Path, names: &[&str], size: usize) -> (u16, std::path::PathBuf) {
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // A subject of its own: the leaf's default one would make it look self-signed.
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "bench origin CA");
    let ca = ca_params.self_signed(&ca_key).expect("the CA");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("a key");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf = rcgen::CertificateParams::new(names).and_then(|p| p.signed_by(&key, &issuer)).expect("a leaf");
    let ca_path = dir.join("origin-ca.pem");
    std::fs::write(&ca_path, ca.pem()).expect("write the CA");
    let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("the key");
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|b| b.with_no_client_auth().with_single_cert(vec![leaf.der().clone()], key))
    .expect("the origin's TLS");
    let config = std::sync::Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the origin");
    let port = listener.local_addr().expect("origin address").port();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(config) else { return };
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut head = Vec::new();
                let mut byte = [0u8];
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                if respond(&mut tls, size).is_err() {
                    return;
                }
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    (port, ca_path)
}

/// The same download over HTTPS: without a sandbox, through a passthrough
/// tunnel, and through an inspected domain.
pub fn tls_download(dir: &Path, ws: &Path, size: usize, rounds: usize) -> String {
    let (port, ca) = tls_origin(dir, &["pass.bench", "inspected.bench"], size);
    std::fs::copy(&ca, ws.join("origin-ca.pem")).expect("the CA in the workspace");
    let defaults =
        "egress = \"strict\"\nnetwork = { allow_domains = [\"pass.bench\", \"inspected.bench\"] }\n";
    let tables = format!(
        "[defaults.inspect]\ndomains = [\"inspected.bench\"]\n\
         [egress]\nports = [{port}]\nhosts = {{ \"pass.bench\" = \"127.0.0.1\", \"inspected.bench\" = \"127.0.0.1\" }}\n\
         allow_addresses = [\"127.0.0.1/32\"]\nmax_bytes = {}\nca_bundle = {:?}\n",
        4 * size,
        ca.display().to_string()
    );
    let d = Daemon::start_with(dir, "bench-inspect", true, true, defaults, &tables);
    let python = "/usr/bin/python3";
    let client = |args: &[&str], sandboxed: bool| {
        let mut cmd = Command::new(if sandboxed { bin("palisade") } else { python.into() });
        if sandboxed {
            cmd.args(["run", "--socket", d.socket.to_str().unwrap(), "--", python]);
        }
        cmd.args(["-c", TLS_CLIENT]).args(args).current_dir(ws);
        cmd
    };
    let port = port.to_string();
    let ca = ca.to_str().expect("a path in UTF-8");
    let mut times: [Vec<f64>; 3] = Default::default();
    for _ in 0..rounds {
        times[0].push(timed(client(&["direct", "pass.bench", &port, ca], false), size));
        times[1].push(timed(client(&["proxy", "pass.bench", &port, "origin-ca.pem"], true), size));
        times[2].push(timed(client(&["proxy", "inspected.bench", &port], true), size));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [plain, pass, inspected] = times.map(|mut v| median(&mut v));
    let mbs = |secs: f64| size as f64 / secs / 1e6;
    format!(
        "### Strict egress over HTTPS ({} MiB from a loopback origin, one connection; median of {rounds}, each including its launch)\n\n\
         | path | MB/s | × no sandbox |\n|---|---:|---:|\n\
         | no sandbox (the client's TLS straight to the origin) | {:.0} | 1.00 |\n\
         | sandboxed, passthrough (a CONNECT tunnel, the client's TLS to the origin) | {:.0} | {:.2} |\n\
         | sandboxed, inspected (the broker ends the client's TLS and makes its own) | {:.0} | {:.2} |\n",
        size >> 20,
        mbs(plain),
        mbs(pass),
        plain / pass,
        mbs(inspected),
        plain / inspected
    )
}
