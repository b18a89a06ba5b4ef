//! `probe egress`: what a tool inside a strict-egress sandbox does with the
//! network, one operation per run. The operation and its operands come on
//! stdin (`OP ARG...`), so that the policy's preflight never sees the names:
//! what is tested is what the broker and the kernel let through.

use super::{Outcome, io};
use nix::errno::Errno;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
use std::time::Duration;

/// How long any one step may wait: a refusal shows as a closed connection
/// or an error well within it.
const STEP: Duration = Duration::from_secs(10);

pub fn run(line: &str) -> Outcome {
    let words: Vec<&str> = line.split_whitespace().collect();
    let word = |i: usize| words.get(i).copied().unwrap_or_default();
    match word(0) {
        "proxy-get" => proxy_get(word(1), word(2)),
        "proxy-connect" => proxy_connect(word(1), word(2)),
        "proxy-raw" => proxy_raw(&word(1).replace("\\r\\n", "\r\n").replace('_', " ")),
        "proxy-big" => {
            proxy_raw(&format!("GET http://a/ HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(parse(word(1)))))
        }
        "resolve" => resolve(word(1)).map(|a| a.join(" ")),
        "fetch" => fetch(word(1), word(2).as_bytes()),
        "count" => fetch(word(1), word(2).replace('_', " ").as_bytes()).map(|reply| reply.len().to_string()),
        "bind" => bind(word(1)),
        "connect" => super::connect(word(1)),
        "tls" => {
            let hello = client_hello(word(2).trim_start_matches('-'));
            fetch(word(1), &hello).map(|reply| format!("echoed {} of {}", reply.len(), hello.len()))
        }
        "dns" => dns(word(1), parse(word(2)) as u16),
        "hold" => hold(word(1), parse(word(2))),
        other => Err((Errno::EINVAL, format!("unknown egress operation {other:?}"))),
    }
}

fn parse(word: &str) -> usize {
    word.parse().unwrap_or(0)
}

fn proxy() -> Result<TcpStream, (Errno, String)> {
    let url = std::env::var("HTTP_PROXY").map_err(|_| (Errno::ENOENT, "no HTTP_PROXY".into()))?;
    let addr = url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let stream = TcpStream::connect(&addr).map_err(io)?;
    stream.set_read_timeout(Some(STEP)).map_err(io)?;
    Ok(stream)
}

/// Reads to the end: what the other side sent before it closed.
fn read_all(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET http://HOST:PORT/PATH` through the proxy: the status code and the body.
fn proxy_get(host: &str, path: &str) -> Outcome {
    let mut s = proxy()?;
    let name = host.split(':').next().unwrap_or_default();
    write!(s, "GET http://{host}/{path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n")
        .map_err(io)?;
    Ok(status_and_body(&read_all(&mut s)))
}

fn status_and_body(response: &str) -> String {
    let code = response.split_whitespace().nth(1).unwrap_or("none");
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    format!("{code} {body}")
}

/// `CONNECT HOST:PORT`, then `msg` through the tunnel: the status code and
/// what came back.
fn proxy_connect(host: &str, msg: &str) -> Outcome {
    let mut s = proxy()?;
    write!(s, "CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n").map_err(io)?;
    let head = read_head(&mut s);
    let code = head.split_whitespace().nth(1).unwrap_or("none").to_string();
    if code != "200" {
        return Ok(format!(
            "{code} {}",
            status_and_body(&(head + &read_all(&mut s))).split_once(' ').map_or("", |x| x.1)
        ));
    }
    s.write_all(msg.as_bytes()).map_err(io)?;
    s.shutdown(std::net::Shutdown::Write).map_err(io)?;
    Ok(format!("200 {}", read_all(&mut s)))
}

/// The response's head, byte by byte up to its blank line.
fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Raw bytes to the proxy: its status line.
fn proxy_raw(bytes: &str) -> Outcome {
    let mut s = proxy()?;
    let _ = s.write_all(bytes.as_bytes());
    Ok(read_all(&mut s).lines().next().unwrap_or("closed").to_string())
}

/// The addresses the sandbox's resolver gives for `name`.
fn resolve(name: &str) -> Result<Vec<String>, (Errno, String)> {
    let addrs = (name, 0).to_socket_addrs().map_err(|e| (Errno::ENOENT, e.to_string()))?;
    Ok(addrs.map(|a| a.ip().to_string()).collect())
}

/// Resolves `HOST:PORT` as any tool would, connects straight to it (no
/// proxy), sends `msg`, and returns what came back before the close.
fn fetch(target: &str, msg: &[u8]) -> Outcome {
    let mut s = TcpStream::connect(target).map_err(io)?;
    s.set_read_timeout(Some(STEP)).map_err(io)?;
    // A refusal may close the connection before all is written: what came back says so.
    let _ = s.write_all(msg).and_then(|()| s.shutdown(std::net::Shutdown::Write));
    Ok(read_all(&mut s))
}

/// Listens on `ADDR:PORT`.
pub fn bind(addr: &str) -> Outcome {
    std::net::TcpListener::bind(addr).map(|_| String::new()).map_err(io)
}

/// `n` connections to `HOST:PORT` at once, a `ping` on each: how many were
/// answered while all were open.
fn hold(target: &str, n: usize) -> Outcome {
    let mut streams = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(target).map_err(io)?;
        s.set_read_timeout(Some(STEP)).map_err(io)?;
        let _ = s.write_all(b"ping\n");
        streams.push(s);
    }
    let answered = streams.iter_mut().map(read_head_line).filter(|l| l == "pong").count();
    Ok(format!("answered {answered} of {n}"))
}

fn read_head_line(s: &mut TcpStream) -> String {
    let mut buf = [0u8; 5];
    match s.read_exact(&mut buf) {
        Ok(()) => String::from_utf8_lossy(&buf).trim().to_string(),
        Err(_) => String::new(),
    }
}

/// One DNS query of type `qtype` for `name` to the resolver of
/// /etc/resolv.conf, over UDP: the answer's rcode and its answer count.
fn dns(name: &str, qtype: u16) -> Outcome {
    let conf = std::fs::read_to_string("/etc/resolv.conf").map_err(io)?;
    let server = conf
        .lines()
        .find_map(|l| l.strip_prefix("nameserver "))
        .ok_or((Errno::ENOENT, "no nameserver in /etc/resolv.conf".into()))?;
    let sock = UdpSocket::bind("127.0.0.1:0").map_err(io)?;
    sock.set_read_timeout(Some(STEP)).map_err(io)?;
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, (qtype >> 8) as u8, qtype as u8, 0, 1]);
    sock.send_to(&q, (server.trim(), 53)).map_err(io)?;
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).map_err(io)?;
    if n < 12 || buf[..2] != [0x12, 0x34] {
        return Err((Errno::EBADMSG, format!("not an answer ({n} bytes)")));
    }
    Ok(format!("rcode={} answers={}", buf[3] & 0xf, u16::from_be_bytes([buf[6], buf[7]])))
}

/// A TLS 1.2 ClientHello naming `sni` (no SNI extension when empty).
pub fn client_hello(sni: &str) -> Vec<u8> {
    let mut ext = Vec::new();
    if !sni.is_empty() {
        let name = sni.as_bytes();
        let len = |n: usize| [(n >> 8) as u8, n as u8];
        ext.extend_from_slice(&[0, 0]);
        ext.extend_from_slice(&len(name.len() + 5));
        ext.extend_from_slice(&len(name.len() + 3));
        ext.push(0);
        ext.extend_from_slice(&len(name.len()));
        ext.extend_from_slice(name);
    }
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.extend_from_slice(&[0, 0, 2, 0, 0x2f, 1, 0]);
    body.extend_from_slice(&[(ext.len() >> 8) as u8, ext.len() as u8]);
    body.extend_from_slice(&ext);
    let mut hs = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
    hs.extend_from_slice(&body);
    let mut record = vec![0x16, 3, 1, (hs.len() >> 8) as u8, hs.len() as u8];
    record.extend_from_slice(&hs);
    record
}
