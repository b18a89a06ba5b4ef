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
        let keep = |name: &str| {
            head.lines()
                .filter(|l| l.to_ascii_lowercase().starts_with(&format!("{name}:")))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let body = format!("{line}\n{}\n{}\n", keep("host"), keep("authorization"));
        let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        if s.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
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

/// Reads one response (its head and a `Content-Length` body): status and body.
async fn response<S: AsyncRead + Unpin>(s: &mut S) -> (u16, String) {
    let head = timeout(WAIT, read_head(s)).await.unwrap().expect("a response head");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    timeout(WAIT, s.read_exact(&mut body)).await.unwrap().unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
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
    let token = secret_file(&dir.0, "s3cr3t-value");
    let mut p = plan(port);
    p.inspect = vec!["allowed.test".into(), "*.wild.test".into()];
    p.ca_bundle = Some(ca);
    let mut by_env = grant(&token, &["allowed.test"], "env = \"TOKEN\"");
    by_env.placeholder = credentials::placeholder("token");
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
    assert!(body.contains("Bearer s3cr3t-value") && !body.contains(placeholder), "{body}");
    send(&mut tls, &format!("GET /b HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Basic {basic}\r\n\r\n"))
        .await;
    let (_, body) = response(&mut tls).await;
    let want = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "git:s3cr3t-value");
    assert!(body.contains(&want), "{body}");
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
