//! The HTTP proxy the sandbox's `HTTP(S)_PROXY` names. `CONNECT host:port`
//! opens a byte tunnel (TLS passes through, never decrypted; on the TLS
//! port the ClientHello must name the host). A plain HTTP request
//! (absolute-form, or origin-form with `Host`) goes to its origin rewritten
//! to origin-form with `Connection: close`, and the connection is then a
//! tunnel to that origin: the proxy parses one request head per
//! connection, never a response.

use super::inspect::{self, Inspected};
use super::refusal::Refusal;
use super::{Run, connect, name, sni, tunnel};
use palisade_protocol::attest::EgressPath;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest request head (request line and headers): what browsers and
/// servers commonly accept (8 to 16 KiB).
pub const HEAD_MAX: usize = 16 * 1024;
/// How long the sandbox has to send a whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Most headers in a request head.
const HEADERS_MAX: usize = 64;
/// The port of an `http://` URL or a `Host` without one.
const HTTP_PORT: u16 = 80;
/// Headers of the proxy hop, not passed to the origin (RFC 9110 7.6.1);
/// `Host` is written from the request target.
const HOP_HEADERS: [&str; 5] =
    ["host", "connection", "proxy-connection", "keep-alive", "proxy-authorization"];
/// A refused client may still be sending: what it sent after the refusal
/// is read and dropped (up to this much, for at most [`DRAIN_TIMEOUT`]) so
/// that closing does not reset the connection before it reads the answer.
const DRAIN_MAX: usize = 256 * 1024;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// A request the proxy understood.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Request {
    host: String,
    port: u16,
    /// `None` for CONNECT; the head to send the origin for plain HTTP.
    forward: Option<Vec<u8>>,
}

/// A request head the proxy cannot take.
#[derive(Debug)]
struct BadHead {
    status: u16,
    detail: String,
}

/// Serves one connection to the proxy.
pub async fn serve(run: Arc<Run>, mut client: TcpStream) {
    let local = client.local_addr().map(|a| (a.ip().to_string(), a.port())).unwrap_or_default();
    let slot = match run.slots.admit(&run.quota) {
        Ok(slot) => slot,
        Err(refusal) => {
            run.account.deny(&local.0, local.1, EgressPath::Proxy, &refusal);
            return refuse(&mut client, refusal.http_status(), &refusal).await;
        }
    };
    let (buf, head_len) = match read_head(&mut client).await {
        Ok(Some(read)) => read,
        Ok(None) => return,
        Err(bad) => {
            let refusal = Refusal::MalformedRequest(bad.detail);
            run.account.deny(&local.0, local.1, EgressPath::Proxy, &refusal);
            return refuse(&mut client, bad.status, &refusal).await;
        }
    };
    let request = match parse_request(&buf[..head_len]) {
        Ok(request) => request,
        Err(detail) => {
            let refusal = Refusal::MalformedRequest(detail);
            run.account.deny(&local.0, local.1, EgressPath::Proxy, &refusal);
            return refuse(&mut client, 400, &refusal).await;
        }
    };
    let (host, port) = (request.host.clone(), request.port);
    if let Err(refusal) = forward(&run, &mut client, request, buf, head_len).await {
        run.account.deny(&host, port, EgressPath::Proxy, &refusal);
        // A refused client that does not close holds no slot.
        drop(slot);
        refuse(&mut client, refusal.http_status(), &refusal).await;
    }
}

/// Checks and opens the connection `request` asks for, and tunnels it (or,
/// to an inspected name, serves it as HTTP: `inspect.rs`). `buf` is what
/// was read, the head's `head_len` bytes first. An error is for the proxy
/// to answer; a refusal after the tunnel was granted (the SNI) is recorded
/// here and the connection closed.
async fn forward(
    run: &Run,
    client: &mut TcpStream,
    request: Request,
    mut buf: Vec<u8>,
    head_len: usize,
) -> Result<(), Refusal> {
    let name = name::normalize(&request.host)?;
    if let Some(closed) = run.credentials.closed() {
        return Err(Refusal::RequestNotAllowed(closed));
    }
    // A plain request's head is searched for a secret before anything is
    // opened (past it, a connection to a name not inspected is not read).
    if let Some(head) = &request.forward {
        run.credentials.check_head(head).map_err(Refusal::RequestNotAllowed)?;
    }
    let (mut origin, address) = connect::open(&run.plan, &name, request.port).await?;
    let inspected = run.plan.inspects(&name);
    let prefix = match request.forward {
        // The inspecting server reads the request as the sandbox sent it.
        Some(_) if inspected => buf,
        Some(mut head) => {
            head.extend_from_slice(&buf[head_len..]);
            head
        }
        None => {
            if client.write_all(ESTABLISHED).await.is_err() {
                return Ok(());
            }
            let rest = buf.split_off(head_len);
            if request.port != run.tls_port {
                rest
            } else {
                match sni::expect(client, rest, &name).await {
                    Ok(hello) => hello,
                    Err(refusal) => {
                        run.account.deny(&name, request.port, EgressPath::Proxy, &refusal);
                        return Ok(());
                    }
                }
            }
        }
    };
    if inspected {
        let to = Inspected { name: &name, port: request.port, via: EgressPath::Proxy, tls: None };
        inspect::serve(run, client, prefix, origin, address, to).await;
        return Ok(());
    }
    let flow = run.account.reached(&name, request.port, address, EgressPath::Proxy);
    let end = tunnel::relay(client, &mut origin, &prefix, &run.quota, &flow, run.plan.idle_timeout).await;
    tracing::debug!(host = name, port = request.port, ?end, "proxy connection ended");
    Ok(())
}

/// Reads until a whole request head is in: the bytes read (the head and
/// whatever followed it) and the head's length; `None` for a connection
/// closed before its first byte.
async fn read_head(client: &mut TcpStream) -> Result<Option<(Vec<u8>, usize)>, BadHead> {
    let bad = |status: u16, detail: String| BadHead { status, detail };
    let read = async {
        let mut buf = vec![0u8; HEAD_MAX];
        let mut filled = 0;
        loop {
            let n = client.read(&mut buf[filled..]).await.map_err(|e| bad(400, format!("reading: {e}")))?;
            if n == 0 {
                return match filled {
                    0 => Ok(None),
                    _ => Err(bad(400, "the connection closed inside the request head".into())),
                };
            }
            filled += n;
            let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
            match httparse::Request::new(&mut headers).parse(&buf[..filled]) {
                Ok(httparse::Status::Complete(len)) => {
                    buf.truncate(filled);
                    return Ok(Some((buf, len)));
                }
                Ok(httparse::Status::Partial) if filled == HEAD_MAX => {
                    return Err(bad(431, format!("a request head over {HEAD_MAX} bytes")));
                }
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(bad(431, format!("more than {HEADERS_MAX} headers")));
                }
                Err(e) => return Err(bad(400, format!("a malformed request head: {e}"))),
            }
        }
    };
    match tokio::time::timeout(HEAD_TIMEOUT, read).await {
        Ok(result) => result,
        Err(_) => Err(bad(408, format!("no whole request head within {HEAD_TIMEOUT:?}"))),
    }
}

/// The target of a complete request head, and for plain HTTP the head to
/// send on.
pub(super) fn parse_request(head: &[u8]) -> Result<Request, String> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    req.parse(head).map_err(|e| e.to_string())?;
    let (method, target, version) = match (req.method, req.path, req.version) {
        (Some(m), Some(t), Some(v)) => (m, t, v),
        _ => return Err("an incomplete request line".into()),
    };
    if method == "CONNECT" {
        let (host, port) = authority(target, None)?;
        return Ok(Request { host, port, forward: None });
    }
    let (authority_text, path) = match strip_scheme(target) {
        Some(rest) => {
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            let path = &rest[end..];
            (rest[..end].to_owned(), if path.starts_with('/') { path.to_owned() } else { format!("/{path}") })
        }
        None if target.starts_with('/') => {
            let mut hosts = req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("host"));
            let host = match (hosts.next(), hosts.next()) {
                (Some(h), None) => std::str::from_utf8(h.value).map_err(|_| "a Host that is not text")?,
                _ => return Err("an origin-form request needs exactly one Host".into()),
            };
            (host.trim().to_owned(), target.to_owned())
        }
        None => return Err(format!("a request target the proxy does not serve: {target:?}")),
    };
    let (host, port) = authority(&authority_text, Some(HTTP_PORT))?;
    let mut out = format!("{method} {path} HTTP/1.{version}\r\nHost: {authority_text}\r\n").into_bytes();
    for h in req.headers.iter().filter(|h| !HOP_HEADERS.iter().any(|hop| h.name.eq_ignore_ascii_case(hop))) {
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Request { host, port, forward: Some(out) })
}

/// What follows `http://` (scheme case-insensitive).
fn strip_scheme(target: &str) -> Option<&str> {
    let scheme = target.get(..7)?;
    scheme.eq_ignore_ascii_case("http://").then(|| &target[7..])
}

/// `host[:port]` or `[v6]:port`; the port is required when there is no
/// default.
fn authority(text: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("not a host and port: {text:?}");
    if text.contains('@') {
        return Err(format!("credentials in the request target: {text:?}"));
    }
    let (host, port) = match text.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').ok_or_else(bad)?;
            let port = if after.is_empty() { "" } else { after.strip_prefix(':').ok_or_else(bad)? };
            (host, port)
        }
        None => text.rsplit_once(':').unwrap_or((text, "")),
    };
    let port = match (port, default_port) {
        ("", Some(default)) => default,
        (port, _) => port.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad)?,
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

/// Answers a refusal with its status and a short text body, and closes.
async fn refuse(client: &mut TcpStream, status: u16, refusal: &Refusal) {
    let text = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = format!("{}: {refusal}\n", refusal.reason());
    let answer = format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let close = async {
        client.write_all(answer.as_bytes()).await?;
        client.shutdown().await?;
        let mut sink = vec![0u8; 16 * 1024];
        let mut drained = 0;
        while drained < DRAIN_MAX {
            match client.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, close).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_read_in_every_form() {
        let r = parse_request(b"CONNECT Allowed.Test:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!((r.host.as_str(), r.port, r.forward), ("Allowed.Test", 443, None));
        let r = parse_request(b"GET http://a.test:8080/p?q HTTP/1.1\r\nHost: evil.test\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n")
            .unwrap();
        assert_eq!((r.host.as_str(), r.port), ("a.test", 8080));
        let head = String::from_utf8(r.forward.unwrap()).unwrap();
        assert_eq!(
            head,
            "GET /p?q HTTP/1.1\r\nHost: a.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let r = parse_request(b"GET http://a.test?x HTTP/1.0\r\n\r\n").unwrap();
        assert!(
            String::from_utf8(r.forward.unwrap())
                .unwrap()
                .starts_with("GET /?x HTTP/1.0\r\nHost: a.test\r\n")
        );
        let r =
            parse_request(b"POST /up HTTP/1.1\r\nhost: b.test\r\nConnection: keep-alive\r\n\r\n").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("b.test", 80));
        let r = parse_request(b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("::1", 443));
    }

    #[test]
    fn targets_the_proxy_does_not_serve_are_malformed() {
        for head in [
            &b"CONNECT a.test HTTP/1.1\r\n\r\n"[..],
            b"CONNECT a.test:0 HTTP/1.1\r\n\r\n",
            b"CONNECT user@a.test:443 HTTP/1.1\r\n\r\n",
            b"GET https://a.test/ HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n",
        ] {
            assert!(parse_request(head).is_err(), "{}", String::from_utf8_lossy(head));
        }
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any request line and headers: the parser answers, never panics.
        #[test]
        fn any_head_is_parsed_or_refused(target in "[ -~]{0,40}", host in "[ -~]{0,40}") {
            let head = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n");
            let _ = parse_request(head.as_bytes());
            let head = format!("CONNECT {target} HTTP/1.1\r\n\r\n");
            let _ = parse_request(head.as_bytes());
        }
    }
}
