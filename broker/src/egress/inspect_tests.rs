//! Inspected domains end to end on host loopback: an HTTPS origin with a
//! certificate from a test CA (the plan's `ca_bundle`), the proxy's
//! listener as the sandbox's, and a client that trusts only the broker's
//! authority, as a run does.

use super::authority::Authority;
use super::tests::{Sandbox, plan, start_with_authority};
use super::*;
use palisade_policy::inspect::RequestRule;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::PathBuf;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(20);

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "palisade-inspect-{tag}-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A test CA: its certificate written to `dir/origin-ca.pem`, and a server
/// configuration for `name` signed by it.
fn origin_tls(dir: &std::path::Path, name: &str) -> (PathBuf, Arc<rustls::ServerConfig>) {
    origin_tls_for(dir, &[name])
}

fn origin_tls_for(dir: &std::path::Path, names: &[&str]) -> (PathBuf, Arc<rustls::ServerConfig>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf = CertificateParams::new(names).unwrap().signed_by(&key, &issuer).unwrap();
    let path = dir.join("origin-ca.pem");
    std::fs::write(&path, ca.pem()).unwrap();
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], PrivateKeyDer::try_from(key.serialize_der()).unwrap())
            .unwrap();
    (path, Arc::new(config))
}

/// An HTTPS origin (HTTP/1.1, keep-alive) that answers each request with
/// its request line, `Host` and `Authorization`; plain HTTP without `config`.
async fn origin(config: Option<Arc<rustls::ServerConfig>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let config = config.clone();
            tokio::spawn(async move {
                match config {
                    Some(c) => {
                        if let Ok(s) = tokio_rustls::TlsAcceptor::from(c).accept(s).await {
                            answer_each(s).await
                        }
                    }
                    None => answer_each(s).await,
                }
            });
        }
    });
    port
}

async fn answer_each<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    while let Some(head) = read_head(&mut s).await {
        let line = head.lines().next().unwrap_or_default().to_owned();
        let target = line.split(' ').nth(1).unwrap_or_default().to_owned();
        let keep = |name: &str| {
            head.lines()
                .filter(|l| l.to_ascii_lowercase().starts_with(&format!("{name}:")))
                .collect::<Vec<_>>()
                .join("\n")
        };
        // What the origin was sent, in a form no answer is searched for.
        let seen: String = head.bytes().map(|b| format!("{b:02x}")).collect();
        let answer = if target.starts_with("/reflect") {
            reflect(&head, &target)
        } else if target.starts_with("/gzip") {
            "HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\nContent-Encoding: gzip\r\nConnection: content-encoding\r\n\
             Content-Length: 4\r\n\r\nzzzz"
                .to_owned()
        } else if target.starts_with("/cut") {
            // An error page that quotes the target, cut short.
            let cut: String = target.chars().take(22).collect();
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{cut}", cut.len())
        } else {
            let body = format!("{line}\n{}\n{}\nseen {seen}\n", keep("host"), keep("authorization"));
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        };
        if s.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// What an origin that echoes its request answers: a redirect to the
/// target with a slash (the target in its reason phrase too), a body quoting the request head as it came, in
/// base64 and JSON-escaped, in chunks of 5 bytes (a secret in it is split).
fn reflect(head: &str, target: &str) -> String {
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, head);
    let body = format!("Not found: {head}\nb64 {b64}\njson {}\n", serde_json::to_string(head).unwrap());
    let chunks: String = body
        .as_bytes()
        .chunks(5)
        .map(|c| format!("{:x}\r\n{}\r\n", c.len(), String::from_utf8_lossy(c)))
        .collect();
    format!(
        "HTTP/1.1 301 Moved {target}\r\nLocation: {target}/\r\nX-Echo: {}\r\nTransfer-Encoding: chunked\r\n\r\n{chunks}0\r\n\r\n",
        head.lines().find(|l| l.to_ascii_lowercase().starts_with("authorization")).unwrap_or("none")
    )
}

/// The request head the origin said it was sent (its `seen` line).
fn origin_saw(body: &str) -> String {
    let hex = body.lines().find_map(|l| l.strip_prefix("seen ")).unwrap_or_default();
    let bytes: Vec<u8> =
        (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        if s.read(&mut byte).await.unwrap_or(0) == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Reads one response (its head and a `Content-Length` or chunked body):
/// status and body.
async fn response<S: AsyncRead + Unpin>(s: &mut S) -> (u16, String) {
    let (status, _, body) = response_with_head(s).await;
    (status, body)
}

async fn response_with_head<S: AsyncRead + Unpin>(s: &mut S) -> (u16, String, String) {
    let head = timeout(WAIT, read_head(s)).await.unwrap().expect("a response head");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let field = |name: &str| {
        head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    };
    let mut body = Vec::new();
    if field("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let size = timeout(WAIT, read_line(s)).await.unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0u8; size + 2];
            timeout(WAIT, s.read_exact(&mut chunk)).await.unwrap().unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        let len: usize = field("content-length").map_or(0, |v| v.parse().unwrap());
        body = vec![0u8; len];
        timeout(WAIT, s.read_exact(&mut body)).await.unwrap().unwrap();
    }
    (status, head, String::from_utf8_lossy(&body).into_owned())
}

async fn read_line<S: AsyncRead + Unpin>(s: &mut S) -> String {
    let mut line = Vec::new();
    while !line.ends_with(b"\r\n") {
        let mut byte = [0u8];
        assert_eq!(s.read(&mut byte).await.unwrap(), 1, "a chunk's size line");
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line).into_owned()
}

struct Setup {
    sandbox: Sandbox,
    authority: Arc<Authority>,
    port: u16,
    _dir: Scratch,
}

/// The proxy inspecting `allowed.test` (an HTTPS origin) under `rules`.
async fn setup(tag: &str, rules: &[&str]) -> Setup {
    let dir = Scratch::new(tag);
    let (ca, config) = origin_tls(&dir.0, "allowed.test");
    let port = origin(Some(config)).await;
    let authority = Arc::new(Authority::open(&dir.0.join("tls")).unwrap());
    let mut p = plan(port);
    p.inspect = vec!["allowed.test".into()];
    p.requests = rules.iter().map(|r| RequestRule::parse(r).unwrap()).collect();
    p.ca_bundle = Some(ca);
    let sandbox = start_with_authority(p, 443, &[], Some(authority.clone()));
    Setup { sandbox, authority, port, _dir: dir }
}

/// CONNECT through the proxy, then TLS trusting only the broker's authority.
async fn connect(s: &Setup, alpn: &[&[u8]]) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    connect_to(s, "allowed.test", alpn).await
}

async fn connect_to(
    s: &Setup,
    host: &'static str,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut tcp = TcpStream::connect(s.sandbox.proxy).await?;
    tcp.write_all(format!("CONNECT {host}:{} HTTP/1.1\r\n\r\n", s.port).as_bytes()).await?;
    let head = timeout(WAIT, read_head(&mut tcp)).await.unwrap().unwrap_or_default();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut roots = rustls::RootCertStore::empty();
    let ca = CertificateDer::from_pem_slice(s.authority.ca_pem().as_bytes()).unwrap();
    roots.add(ca).unwrap();
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = ServerName::try_from(host).unwrap();
    timeout(WAIT, tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp)).await.unwrap()
}

async fn send<S: AsyncWrite + Unpin>(s: &mut S, requests: &str) {
    s.write_all(requests.as_bytes()).await.unwrap();
}

use rustls::pki_types::pem::PemObject;

#[tokio::test]
async fn every_request_on_a_connection_is_checked_by_method_and_path() {
    let s = setup("rules", &["GET allowed.test/ok/*", "POST allowed.test/ok/write"]).await;
    let mut tls = connect(&s, &[b"http/1.1"]).await.unwrap();
    send(&mut tls, "GET /ok/read?q=1 HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.to_ascii_lowercase().starts_with("get /ok/read?q=1 http/1.1\nhost: allowed.test"), "{body}");
    // The same connection, kept alive: a method the rules do not allow there.
    send(&mut tls, "POST /ok/read HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 2\r\n\r\nhi").await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("request_not_allowed") && body.contains("GET allowed.test/ok/*"), "{body}");
    // Pipelined: an allowed request, then a refused one, sent at once.
    send(
        &mut tls,
        "POST /ok/write HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 0\r\n\r\n\
         GET /elsewhere HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    )
    .await;
    assert_eq!(response(&mut tls).await.0, 200);
    assert_eq!(response(&mut tls).await.0, 403);
    // A path the origin could read as another one.
    send(&mut tls, "GET /ok/../secret HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    assert_eq!(response(&mut tls).await.0, 403);
    drop(tls);
    let traffic = s.sandbox.egress.finish().await;
    let seen: Vec<(String, String, u16, bool)> =
        traffic.requests.iter().map(|r| (r.method.clone(), r.path.clone(), r.status, r.allowed)).collect();
    assert_eq!(
        seen,
        [
            ("GET".into(), "/ok/read".into(), 200, true),
            ("POST".into(), "/ok/read".into(), 403, false),
            ("POST".into(), "/ok/write".into(), 200, true),
            ("GET".into(), "/elsewhere".into(), 403, false),
            ("GET".into(), "/ok/../secret".into(), 403, false),
        ]
    );
    assert_eq!(traffic.requests[0].rule.as_deref(), Some("GET allowed.test/ok/*"));
    assert_eq!(traffic.denied.iter().filter(|d| d.reason == "request_not_allowed").count(), 3);
    assert!(traffic.bytes_in > 0 && traffic.bytes_out > 0, "{traffic:?}");
}

#[tokio::test]
async fn a_request_for_another_host_on_the_connection_is_refused() {
    let s = setup("host", &[]).await;
    let mut tls = connect(&s, &[b"http/1.1"]).await.unwrap();
    send(&mut tls, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n").await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("other.test"), "{body}");
    // With no rule on the host, any request to it is let through.
    send(&mut tls, "DELETE /anything HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    assert_eq!(response(&mut tls).await.0, 200);
    drop(tls);
    let traffic = s.sandbox.egress.finish().await;
    assert_eq!(traffic.requests.len(), 2);
    assert_eq!(traffic.requests[1].rule, None);
}

#[tokio::test]
async fn http2_alone_is_refused_in_the_handshake() {
    let s = setup("h2", &[]).await;
    assert!(connect(&s, &[b"h2"]).await.is_err(), "a client asking only for HTTP/2 is refused");
    // Offered beside HTTP/1.1, HTTP/1.1 is chosen.
    let tls = connect(&s, &[b"h2", b"http/1.1"]).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    drop(tls);
    let traffic = s.sandbox.egress.finish().await;
    assert!(traffic.denied.iter().any(|d| d.reason == "tls_failed"), "{traffic:?}");
}

#[tokio::test]
async fn an_origin_the_trust_roots_do_not_vouch_for_is_refused() {
    let s = setup("untrusted", &[]).await;
    let other = Scratch::new("other-ca");
    let (ca, _) = origin_tls(&other.0, "allowed.test");
    let mut p = plan(s.port);
    p.inspect = vec!["allowed.test".into()];
    p.ca_bundle = Some(ca);
    let sandbox = start_with_authority(p, 443, &[], Some(s.authority.clone()));
    let s = Setup { sandbox, ..s };
    let mut tls = connect(&s, &[b"http/1.1"]).await.unwrap();
    send(&mut tls, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    let mut rest = Vec::new();
    let _ = timeout(WAIT, tls.read_to_end(&mut rest)).await.unwrap();
    assert!(!String::from_utf8_lossy(&rest).contains("200 OK"));
    drop(tls);
    let traffic = s.sandbox.egress.finish().await;
    let failed = traffic.denied.iter().find(|d| d.reason == "tls_failed").expect("a TLS refusal");
    assert!(failed.detail.contains("allowed.test"), "{failed:?}");
}

#[tokio::test]
async fn plain_http_to_an_inspected_name_is_checked_too() {
    let dir = Scratch::new("plain");
    let port = origin(None).await;
    let authority = Arc::new(Authority::open(&dir.0.join("tls")).unwrap());
    let mut p = plan(port);
    p.inspect = vec!["allowed.test".into()];
    p.requests = vec![RequestRule::parse("read_only allowed.test/*").unwrap()];
    let sandbox = start_with_authority(p, 443, &[], Some(authority));
    let mut tcp = TcpStream::connect(sandbox.proxy).await.unwrap();
    let target = format!("http://allowed.test:{port}");
    send(&mut tcp, &format!("GET {target}/a HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n")).await;
    assert_eq!(response(&mut tcp).await.0, 200);
    send(
        &mut tcp,
        &format!("PUT {target}/a HTTP/1.1\r\nHost: allowed.test:{port}\r\nContent-Length: 0\r\n\r\n"),
    )
    .await;
    assert_eq!(response(&mut tcp).await.0, 403);
    drop(tcp);
    let traffic = sandbox.egress.finish().await;
    assert_eq!(traffic.requests.iter().map(|r| r.status).collect::<Vec<_>>(), [200, 403]);
}

/// A secret in a file only its owner reads, for a `file` grant.
fn secret_file(dir: &std::path::Path, value: &str) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("token");
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
    std::io::Write::write_all(&mut f, format!("{value}\n").as_bytes()).unwrap();
    path
}

fn grant(file: &std::path::Path, hosts: &[&str], way: &str) -> palisade_policy::Credential {
    let text = format!(
        "file = {:?}\nhosts = [{}]\n{way}",
        file.display().to_string(),
        hosts.iter().map(|h| format!("{h:?}")).collect::<Vec<_>>().join(", ")
    );
    palisade_policy::Credential { grant: toml::from_str(&text).unwrap(), placeholder: String::new() }
}

#[tokio::test]
async fn a_placeholder_is_swapped_for_its_hosts_and_refused_elsewhere() {
    let dir = Scratch::new("cred");
    let (ca, config) = origin_tls_for(&dir.0, &["allowed.test", "a.wild.test"]);
    let port = origin(Some(config)).await;
    let authority = Arc::new(Authority::open(&dir.0.join("tls")).unwrap());
    let token = secret_file(&dir.0, "s3cr3t-value-of-24-bytes");
    let mut p = plan(port);
    p.inspect = vec!["allowed.test".into(), "*.wild.test".into()];
    p.ca_bundle = Some(ca);
    let mut by_env = grant(&token, &["allowed.test"], "env = \"TOKEN\"");
    by_env.placeholder = credentials::placeholder();
    p.credentials =
        vec![by_env.clone(), grant(&token, &["allowed.test"], "header = \"X-Api-Key\"\nformat = \"k={}\"")];
    let sandbox = start_with_authority(p, 443, &[], Some(authority.clone()));
    let s = Setup { sandbox, authority, port, _dir: dir };
    let placeholder = by_env.placeholder.as_str();
    let basic =
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, format!("git:{placeholder}"));
    let mut tls = connect(&s, &[b"http/1.1"]).await.unwrap();
    send(
        &mut tls,
        &format!("GET /a HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {placeholder}\r\n\r\n"),
    )
    .await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 200);
    // The origin was sent the secret; its echo reaches the run as the placeholder.
    let saw = origin_saw(&body);
    assert!(saw.contains("Bearer s3cr3t-value-of-24-bytes") && !saw.contains(placeholder), "{saw}");
    assert!(!body.contains("s3cr3t") && body.contains(&format!("Bearer {placeholder}")), "{body}");
    send(&mut tls, &format!("GET /b HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Basic {basic}\r\n\r\n"))
        .await;
    let (_, body) = response(&mut tls).await;
    let want =
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "git:s3cr3t-value-of-24-bytes");
    assert!(origin_saw(&body).contains(&want), "{body}");
    assert!(!body.contains(&want), "the echoed Basic authorization is not the secret's: {body}");
    drop(tls);
    // Another inspected host: the placeholder is refused there, the secret never sent.
    let mut tls = connect_to(&s, "a.wild.test", &[b"http/1.1"]).await.unwrap();
    send(&mut tls, &format!("GET /x?t={placeholder} HTTP/1.1\r\nHost: a.wild.test\r\n\r\n")).await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("placeholder") && !body.contains("s3cr3t"), "{body}");
    send(&mut tls, "GET /y HTTP/1.1\r\nHost: a.wild.test\r\n\r\n").await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 200);
    assert!(!body.contains("s3cr3t") && !body.to_ascii_lowercase().contains("x-api-key"), "{body}");
    drop(tls);
    let traffic = s.sandbox.egress.finish().await;
    let names: Vec<Vec<String>> = traffic.requests.iter().map(|r| r.credentials.clone()).collect();
    let token = s._dir.0.join("token").display().to_string();
    assert_eq!(names, [vec![token.clone(), token.clone()], vec![token.clone(), token], vec![], vec![]]);
    let text = format!("{traffic:?}");
    assert!(!text.contains("s3cr3t"), "no secret in the record: {text}");
}

/// A sandbox inspecting `allowed.test` (HTTPS, or plain HTTP without TLS)
/// with one env grant for it, `placeholder_in` as given: the setup and the
/// run's placeholder.
async fn granted(tag: &str, tls: bool, way: &str) -> (Setup, String) {
    let dir = Scratch::new(tag);
    let (ca, config) = origin_tls_for(&dir.0, &["allowed.test", "a.wild.test"]);
    let port = origin(tls.then_some(config)).await;
    let authority = Arc::new(Authority::open(&dir.0.join("tls")).unwrap());
    let token = secret_file(&dir.0, SECRET);
    let mut p = plan(port);
    p.inspect = vec!["allowed.test".into()];
    p.ca_bundle = Some(ca);
    let mut by_env = grant(&token, &["allowed.test"], way);
    by_env.placeholder = credentials::placeholder();
    p.credentials = vec![by_env.clone()];
    let sandbox = start_with_authority(p, 443, &[], Some(authority.clone()));
    (Setup { sandbox, authority, port, _dir: dir }, by_env.placeholder)
}

const SECRET: &str = "s3cr3t/value+with=things";

/// Every form of [`SECRET`] an answer is searched for, as the test knows them.
fn secret_forms() -> Vec<String> {
    let b64 = |t: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, t);
    vec![
        SECRET.into(),
        "s3cr3t%2Fvalue%2Bwith%3Dthings".into(),
        "s3cr3t\\/value+with=things".into(),
        b64(SECRET).trim_end_matches('=').into(),
        b64(&format!("x:{SECRET}"))[4..20].into(),
    ]
}

#[tokio::test]
async fn an_origin_that_echoes_the_secret_hands_the_run_the_placeholder() {
    let (s, placeholder) =
        granted("echo", true, "env = \"TOKEN\"\nplaceholder_in = [\"Authorization\", \"?key\"]").await;
    let mut tls = connect(&s, &[b"http/1.1"]).await.unwrap();
    // The origin is sent the secret where the grant puts it.
    send(
        &mut tls,
        &format!("GET /a?key={placeholder} HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {placeholder}\r\n\r\n"),
    )
    .await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 200, "{body}");
    let saw = origin_saw(&body);
    assert!(saw.contains(&format!("/a?key={SECRET} ")) && saw.contains(&format!("Bearer {SECRET}")), "{saw}");
    // An origin that reflects it (a redirect, a header, an error page in
    // 5-byte chunks, base64 and JSON): the run gets the placeholder.
    send(
        &mut tls,
        &format!(
            "GET /reflect?key={placeholder} HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Basic {}\r\n\r\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, format!("x:{placeholder}"))
        ),
    )
    .await;
    let (status, head, body) = response_with_head(&mut tls).await;
    assert_eq!(status, 301, "{head}");
    let answer = format!("{head}{body}");
    for form in secret_forms() {
        assert!(!answer.contains(&form), "{form:?} reached the run: {answer}");
    }
    assert!(head.contains(&format!("/reflect?key={placeholder}/")), "{head}");
    assert!(body.contains(&format!("GET /reflect?key={placeholder} ")), "{body}");
    // An echo cut short shows a piece; a range asked for is not passed on.
    send(
        &mut tls,
        &format!("GET /cut?key={placeholder} HTTP/1.1\r\nHost: allowed.test\r\nRange: bytes=9-30\r\n\r\n"),
    )
    .await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("/cut?key=") && !body.contains(&SECRET[..12]), "{body}");
    send(&mut tls, "GET /a HTTP/1.1\r\nHost: allowed.test\r\nRange: bytes=0-4\r\n\r\n").await;
    let saw = origin_saw(&response(&mut tls).await.1).to_ascii_lowercase();
    assert!(!saw.contains("range:") && saw.contains("accept-encoding: identity"), "{saw}");
    // An answer the broker could not search is not passed on, however it
    // says its coding (two headers, one named in Connection).
    send(&mut tls, "GET /gzip HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("Content-Encoding") && !body.contains("gzip"), "{body}");
    // Had the run the secret, it could not send it; and from then on, nothing.
    send(&mut tls, &format!("GET /x HTTP/1.1\r\nHost: allowed.test\r\nX-Leak: {SECRET}\r\n\r\n")).await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("secret itself") && !body.contains("credential TOKEN"), "{body}");
    send(&mut tls, "GET /y HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("network is closed"), "{body}");
    drop(tls);
    // A new connection after it, to another host.
    let mut tcp = TcpStream::connect(s.sandbox.proxy).await.unwrap();
    send(&mut tcp, &format!("CONNECT a.wild.test:{} HTTP/1.1\r\n\r\n", s.port)).await;
    let (status, body) = response(&mut tcp).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("network is closed"), "{body}");
    let traffic = s.sandbox.egress.finish().await;
    let text = format!("{traffic:?}");
    assert!(!text.contains(SECRET), "no secret in the record: {text}");
}

#[tokio::test]
async fn a_plain_request_to_a_host_not_inspected_is_searched_for_the_secret() {
    let (s, _) = granted("plain-head", true, "env = \"TOKEN\"").await;
    let mut tcp = TcpStream::connect(s.sandbox.proxy).await.unwrap();
    let leak =
        format!("GET http://a.wild.test:{}/?t={} HTTP/1.1\r\nHost: a.wild.test\r\n\r\n", s.port, SECRET);
    send(&mut tcp, &leak).await;
    let (status, body) = response(&mut tcp).await;
    assert_eq!(status, 403, "{body}");
    drop(tcp);
    let traffic = s.sandbox.egress.finish().await;
    assert!(
        traffic.denied.iter().any(|d| d.host == "a.wild.test" && d.detail.contains("secret itself")),
        "{traffic:?}"
    );
}

#[tokio::test]
async fn a_placeholder_goes_only_where_its_grant_puts_it() {
    let (s, placeholder) = granted("places", true, "env = \"TOKEN\"").await;
    let mut tls = connect(&s, &[b"http/1.1"]).await.unwrap();
    for (request, place) in [
        (format!("GET /v1/{placeholder}/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n"), "path"),
        (format!("GET /v1?q={placeholder} HTTP/1.1\r\nHost: allowed.test\r\n\r\n"), "?q"),
        (format!("GET /v1 HTTP/1.1\r\nHost: allowed.test\r\nX-Other: {placeholder}\r\n\r\n"), "x-other"),
        (
            format!(
                "GET /v1 HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer %2{placeholder}\r\n\r\n"
            ),
            "beside other text",
        ),
    ] {
        send(&mut tls, &request).await;
        let (status, body) = response(&mut tls).await;
        assert_eq!(status, 403, "{place}: {body}");
        assert!(body.contains(place) && body.contains("placeholder_in: authorization"), "{body}");
    }
    // Where the grant puts it, it is swapped.
    send(
        &mut tls,
        &format!("GET /v1 HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: token {placeholder}\r\n\r\n"),
    )
    .await;
    let (status, body) = response(&mut tls).await;
    assert_eq!(status, 200, "{body}");
    assert!(origin_saw(&body).contains(&format!("token {SECRET}")), "{body}");
    drop(tls);
    let traffic = s.sandbox.egress.finish().await;
    assert_eq!(traffic.requests.iter().map(|r| r.status).collect::<Vec<_>>(), [403, 403, 403, 403, 200]);
}

#[tokio::test]
async fn a_secret_is_never_added_over_plain_http() {
    for way in ["env = \"TOKEN\"", "header = \"Authorization\"\nformat = \"Bearer {}\""] {
        let (s, placeholder) = granted("plain-cred", false, way).await;
        let mut tcp = TcpStream::connect(s.sandbox.proxy).await.unwrap();
        let target = format!("http://allowed.test:{}/v1/x", s.port);
        send(
            &mut tcp,
            &format!(
                "GET {target} HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {placeholder}\r\n\r\n"
            ),
        )
        .await;
        let (status, body) = response(&mut tcp).await;
        assert_eq!(status, 403, "{way}: {body}");
        assert!(body.contains("only over TLS") && body.contains("plain HTTP"), "{body}");
        drop(tcp);
        let traffic = s.sandbox.egress.finish().await;
        assert!(traffic.requests.iter().all(|r| !r.allowed && r.credentials.is_empty()), "{traffic:?}");
    }
}

#[tokio::test]
async fn a_method_override_header_is_refused_where_rules_judge_the_method() {
    let s = setup("override", &["read_only allowed.test/ok/*"]).await;
    let mut tls = connect(&s, &[b"http/1.1"]).await.unwrap();
    send(&mut tls, "GET /ok/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    assert_eq!(response(&mut tls).await.0, 200);
    for header in ["X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"] {
        send(&mut tls, &format!("GET /ok/x HTTP/1.1\r\nHost: allowed.test\r\n{header}: DELETE\r\n\r\n"))
            .await;
        let (status, body) = response(&mut tls).await;
        assert_eq!(status, 403, "{header}: {body}");
        assert!(body.to_ascii_lowercase().contains(&header.to_ascii_lowercase()), "{body}");
    }
    send(&mut tls, "GET /ok/x?_method=DELETE HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    assert_eq!(response(&mut tls).await.0, 403);
    send(&mut tls, "GET /ok/..;/admin HTTP/1.1\r\nHost: allowed.test\r\n\r\n").await;
    assert_eq!(response(&mut tls).await.0, 403);
}
