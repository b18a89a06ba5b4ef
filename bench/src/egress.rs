//! Strict egress's speed: one download from an origin on the host's
//! loopback, by the same client (Python's sockets, reading 1 MiB at a time),
//! without a sandbox and from inside one through the broker's proxy and
//! through its transparent path. Nothing but loopback is reached: the name
//! comes from the configuration's static host map.

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
                let _ =
                    write!(conn, "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n");
                let chunk = vec![b'x'; 1 << 20];
                let mut left = size;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if conn.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    port
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
