//! `http_fetch`'s client: plain HTTP/1.1, one request per connection
//! (`Connection: close`), the response read to its end and bounded.
//! `https://` is not supported yet (the broker would have to verify the
//! origin's certificate itself).

use std::collections::BTreeMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest response (head and body) `http_fetch` reads.
pub const MAX_RESPONSE_BYTES: u64 = 4 << 20;
/// Largest head of a response: its status line and headers.
const MAX_HEADERS: usize = 64;
const PORT_HTTP: u16 = 80;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FetchError {
    #[error("https is not supported by http_fetch yet")]
    Https,
    #[error("{0:?} is not an http:// URL")]
    BadUrl(String),
    #[error("method {0:?}: GET, POST, PUT, DELETE or HEAD")]
    BadMethod(String),
    #[error("header {0:?} may not be set by a plugin")]
    BadHeader(String),
    #[error("the response exceeds {MAX_RESPONSE_BYTES} bytes")]
    TooLarge,
    #[error("the response is not HTTP: {0}")]
    Malformed(String),
    #[error("{0}")]
    Io(String),
}

/// A URL `http_fetch` takes: `http://host[:port][/path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    pub path: String,
}

pub fn parse_url(url: &str) -> Result<Url, FetchError> {
    if url.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://")) {
        return Err(FetchError::Https);
    }
    let bad = || FetchError::BadUrl(url.into());
    let rest =
        url.get(..7).filter(|s| s.eq_ignore_ascii_case("http://")).map(|_| &url[7..]).ok_or_else(bad)?;
    let (authority, path) = rest.find(['/', '?']).map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
    if authority.contains('@') || authority.is_empty() {
        return Err(bad());
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, p.parse().map_err(|_| bad())?),
        _ => (authority, PORT_HTTP),
    };
    let host = palisade_policy::config::host_name(host.trim_start_matches('[').trim_end_matches(']'));
    let path = if path.starts_with('?') { format!("/{path}") } else { path.to_string() };
    if host.is_empty() || path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(bad());
    }
    Ok(Url { host, port, path })
}

/// What the plugin asks (`http_fetch`'s args).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct FetchRequest {
    pub url: String,
    #[serde(default = "get")]
    pub method: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: String,
}

fn get() -> String {
    "GET".into()
}

#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
pub struct FetchResponse {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// Headers the broker writes itself.
const OWN_HEADERS: [&str; 5] = ["host", "connection", "content-length", "transfer-encoding", "upgrade"];

/// The request's bytes.
pub fn request_bytes(url: &Url, req: &FetchRequest) -> Result<Vec<u8>, FetchError> {
    let method = req.method.to_ascii_uppercase();
    if !["GET", "POST", "PUT", "DELETE", "HEAD"].contains(&method.as_str()) {
        return Err(FetchError::BadMethod(req.method.clone()));
    }
    let mut out = format!("{method} {} HTTP/1.1\r\nHost: {}", url.path, url.host);
    if url.port != PORT_HTTP {
        out.push_str(&format!(":{}", url.port));
    }
    out.push_str("\r\nConnection: close\r\n");
    for (name, value) in &req.headers {
        let plain = |s: &str| !s.bytes().any(|b| b.is_ascii_control());
        if OWN_HEADERS.contains(&name.to_ascii_lowercase().as_str())
            || name.is_empty()
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            || !plain(value)
        {
            return Err(FetchError::BadHeader(name.clone()));
        }
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !req.body.is_empty() || method == "POST" || method == "PUT" {
        out.push_str(&format!("Content-Length: {}\r\n", req.body.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(req.body.as_bytes());
    Ok(bytes)
}

/// Sends the request and reads the response to the end of the connection.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    url: &Url,
    req: &FetchRequest,
) -> Result<FetchResponse, FetchError> {
    let io = |e: std::io::Error| FetchError::Io(e.to_string());
    stream.write_all(&request_bytes(url, req)?).await.map_err(io)?;
    let mut raw = Vec::new();
    let n = stream.take(MAX_RESPONSE_BYTES + 1).read_to_end(&mut raw).await.map_err(io)?;
    if n as u64 > MAX_RESPONSE_BYTES {
        return Err(FetchError::TooLarge);
    }
    parse_response(&raw)
}

/// A whole response: its head, and its body (chunked or not).
pub fn parse_response(raw: &[u8]) -> Result<FetchResponse, FetchError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(raw).map_err(|e| FetchError::Malformed(e.to_string()))? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Err(FetchError::Malformed("the head is cut short".into())),
    };
    let mut out = BTreeMap::new();
    for h in response.headers.iter() {
        out.insert(h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).into_owned());
    }
    let mut body = &raw[head..];
    if let Some(len) = out.get("content-length").and_then(|l| l.trim().parse::<usize>().ok()) {
        body = &body[..len.min(body.len())];
    }
    let body = if out.get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    let status = response.code.unwrap_or(0);
    Ok(FetchResponse { status, headers: out, body: String::from_utf8_lossy(&body).into_owned() })
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, FetchError> {
    let mut out = Vec::new();
    loop {
        let (size, rest) = match httparse::parse_chunk_size(body) {
            Ok(httparse::Status::Complete((used, size))) => (size as usize, &body[used..]),
            _ => return Err(FetchError::Malformed("a bad chunk".into())),
        };
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest.get(..size).ok_or_else(|| FetchError::Malformed("a chunk cut short".into()))?;
        out.extend_from_slice(chunk);
        body = rest.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_plain_http_only() {
        assert_eq!(parse_url("https://x.org/"), Err(FetchError::Https));
        let u = parse_url("http://Example.COM:8080/a?b=1").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("example.com", 8080, "/a?b=1"));
        assert_eq!(parse_url("http://127.0.0.1").unwrap().path, "/");
        assert!(parse_url("http://u:p@x.org/").is_err());
        assert!(parse_url("ftp://x.org/").is_err());
        assert!(parse_url("http://x.org/a b").is_err());
    }

    #[test]
    fn requests_carry_no_header_of_the_brokers() {
        let url = parse_url("http://a.test:81/p").unwrap();
        let mut req = FetchRequest {
            url: String::new(),
            method: "post".into(),
            headers: BTreeMap::new(),
            body: "hi".into(),
        };
        let text = String::from_utf8(request_bytes(&url, &req).unwrap()).unwrap();
        assert_eq!(
            text,
            "POST /p HTTP/1.1\r\nHost: a.test:81\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi"
        );
        req.headers.insert("Host".into(), "evil".into());
        assert!(request_bytes(&url, &req).is_err());
        req.headers.clear();
        req.headers.insert("X-A".into(), "1\r\nX-B: 2".into());
        assert!(request_bytes(&url, &req).is_err());
        req.method = "CONNECT".into();
        assert!(request_bytes(&url, &req).is_err());
    }

    #[tokio::test]
    async fn a_response_is_read_to_its_end_and_bounded() {
        let (mut ours, mut theirs) = tokio::io::duplex(1 << 16);
        let url = parse_url("http://a.test/").unwrap();
        let req = FetchRequest {
            url: String::new(),
            method: "GET".into(),
            headers: BTreeMap::new(),
            body: String::new(),
        };
        let server = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            let n = theirs.read(&mut buf).await.unwrap();
            assert!(buf[..n].starts_with(b"GET / HTTP/1.1\r\n"));
            theirs
                .write_all(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                )
                .await
                .unwrap();
        });
        let r = exchange(&mut ours, &url, &req).await.unwrap();
        server.await.unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "abcde"));
        let big = vec![b'x'; MAX_RESPONSE_BYTES as usize + 10];
        let (mut ours, mut theirs) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let _ = theirs.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
            let _ = theirs.write_all(&big).await;
        });
        assert_eq!(exchange(&mut ours, &url, &req).await, Err(FetchError::TooLarge));
    }
}
