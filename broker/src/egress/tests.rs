//! The egress service end to end on host loopback: the "sandbox's"
//! listeners are sockets these tests bind on 127.0.0.0/8, the origins are
//! test listeners on 127.0.0.1, reached through the plan's `hosts` and
//! `allow_addresses` (never any other address).

use super::dnswire::{self, TYPE_A, TYPE_AAAA};
use super::*;
use palisade_policy::PoolEntry;
use palisade_protocol::attest::EgressPath;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UdpSocket;
use tokio::time::timeout;

/// A bound on every wait of these tests, so that a bug fails a test
/// rather than hanging it (never a measure of speed).
const WAIT: Duration = Duration::from_secs(20);
const MX: u16 = 15;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn plan(port: u16) -> EgressPlan {
    let mut hosts = BTreeMap::new();
    hosts.insert("allowed.test".to_owned(), vec![ip("127.0.0.1")]);
    hosts.insert("a.wild.test".to_owned(), vec![ip("127.0.0.1")]);
    hosts.insert(
        "refused.test".to_owned(),
        vec![ip("127.0.0.3"), ip("169.254.169.254"), ip("::ffff:10.0.0.1")],
    );
    EgressPlan {
        domains: vec!["allowed.test".into(), "*.wild.test".into(), "refused.test".into()],
        ports: vec![port],
        transparent: false,
        pool: vec![],
        allow_addresses: vec!["127.0.0.1/32".parse().unwrap()],
        hosts,
        max_connections: 16,
        max_bytes: 1 << 30,
        idle_timeout: Duration::from_secs(60),
        inspect: vec![],
        requests: vec![],
        ca_bundle: None,
        credentials: vec![],
        secrets_dir: None,
        own: false,
    }
}

/// The listeners a test serves, by kind; transparent ones are
/// `(bound address, the port their record names)`.
pub(super) struct Sandbox {
    pub egress: Egress,
    pub proxy: SocketAddr,
    dns_udp: SocketAddr,
    dns_tcp: SocketAddr,
    pub transparent: Vec<SocketAddr>,
}

fn tcp_fd(address: &str) -> (OwnedFd, SocketAddr) {
    let listener = std::net::TcpListener::bind(address).unwrap();
    let bound = listener.local_addr().unwrap();
    (OwnedFd::from(listener), bound)
}

fn record(kind: ListenerKind, bound: SocketAddr, port: u16) -> Listener {
    let IpAddr::V4(address) = bound.ip() else { unreachable!() };
    Listener { kind, address, port }
}

fn start(plan: EgressPlan, tls_port: u16, transparent: &[(&str, u16)]) -> Sandbox {
    start_with_authority(plan, tls_port, transparent, None)
}

pub(super) fn start_with_authority(
    plan: EgressPlan,
    tls_port: u16,
    transparent: &[(&str, u16)],
    authority: Option<Arc<authority::Authority>>,
) -> Sandbox {
    let (proxy_fd, proxy) = tcp_fd("127.0.0.1:0");
    let (dns_tcp_fd, dns_tcp) = tcp_fd("127.0.0.1:0");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dns_udp = udp.local_addr().unwrap();
    let mut listeners = vec![
        (record(ListenerKind::Proxy, proxy, proxy.port()), proxy_fd),
        (record(ListenerKind::DnsUdp, dns_udp, dns_udp.port()), OwnedFd::from(udp)),
        (record(ListenerKind::DnsTcp, dns_tcp, dns_tcp.port()), dns_tcp_fd),
    ];
    let mut bound = vec![];
    for (address, port) in transparent {
        let (fd, at) = tcp_fd(&format!("{address}:0"));
        listeners.push((record(ListenerKind::Transparent, at, *port), fd));
        bound.push(at);
    }
    let egress = Egress::start_with(Arc::new(plan), listeners, tls_port, authority).unwrap();
    Sandbox { egress, proxy, dns_udp, dns_tcp, transparent: bound }
}

/// An origin that sends back what it receives.
async fn echo_origin() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

/// An origin that sends `n` bytes and closes.
async fn source_origin(n: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(&vec![b'x'; n]).await;
            });
        }
    });
    port
}

/// An HTTP origin that answers with the request head it got.
async fn http_origin() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let head = read_head(&mut s).await;
                let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{head}", head.len());
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        if s.read(&mut byte).await.unwrap_or(0) == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Sends `request` to the proxy and returns the connection and the head of
/// the answer.
async fn ask(proxy: SocketAddr, request: &[u8]) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(request).await.unwrap();
    let head = timeout(WAIT, read_head(&mut s)).await.unwrap();
    (s, head)
}

async fn connect_to(proxy: SocketAddr, target: &str) -> (TcpStream, String) {
    ask(proxy, format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).await
}

async fn rest(mut s: TcpStream) -> String {
    let mut out = Vec::new();
    let _ = timeout(WAIT, s.read_to_end(&mut out)).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn reasons(traffic: &EgressTraffic) -> Vec<&str> {
    traffic.denied.iter().map(|d| d.reason.as_str()).collect()
}

#[tokio::test]
async fn connect_to_an_allowed_name_tunnels_and_is_accounted() {
    let port = echo_origin().await;
    let sandbox = start(plan(port), 443, &[]);
    let (mut s, head) = connect_to(sandbox.proxy, &format!("Allowed.Test.:{port}")).await;
    assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    s.write_all(b"hello").await.unwrap();
    let mut back = [0u8; 5];
    timeout(WAIT, s.read_exact(&mut back)).await.unwrap().unwrap();
    assert_eq!(&back, b"hello");
    drop(s);
    let traffic = sandbox.egress.finish().await;
    assert_eq!(traffic.reached.len(), 1, "{traffic:?}");
    let host = &traffic.reached[0];
    assert_eq!(
        (host.host.as_str(), host.port, host.via, host.address.as_str()),
        ("allowed.test", port, EgressPath::Proxy, "127.0.0.1")
    );
    assert_eq!((host.connections, host.bytes_out, host.bytes_in), (1, 5, 5));
    assert_eq!((traffic.bytes_out, traffic.bytes_in, traffic.quota_exceeded), (5, 5, false));
    assert!(traffic.denied.is_empty());
}

#[tokio::test]
async fn names_ports_and_addresses_not_allowed_are_refused_with_403() {
    let port = echo_origin().await;
    let sandbox = start(plan(port), 443, &[]);
    let cases = [
        (format!("evil.test:{port}"), "domain_not_allowed"),
        (format!("wild.test:{port}"), "domain_not_allowed"),
        ("allowed.test:1".to_owned(), "port_not_allowed"),
        (format!("refused.test:{port}"), "address_refused"),
        (format!("127.0.0.1:{port}"), "domain_not_allowed"),
    ];
    for (target, reason) in &cases {
        let (s, head) = connect_to(sandbox.proxy, target).await;
        assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{target}: {head}");
        assert!(rest(s).await.starts_with(reason), "{target}");
    }
    let traffic = sandbox.egress.finish().await;
    assert_eq!(reasons(&traffic), cases.iter().map(|c| c.1).collect::<Vec<_>>());
    assert!(traffic.denied[3].detail.contains("169.254.169.254: link-local"), "{:?}", traffic.denied[3]);
    assert!(traffic.reached.is_empty());
    // Each names the key that would let it through: under a broker's
    // policy, as an operator would set it.
    assert_eq!(
        traffic.denied[2].detail,
        format!(
            "port 1 is not an allowed port; this broker's policy does not allow it (an operator would set \
             `[egress] ports = [{port}, 1]`)"
        )
    );
    assert!(
        traffic.denied[3].detail.ends_with(
            "; this broker's policy does not allow it (an operator would set `[egress] allow_addresses = \
             [\"127.0.0.1\", \"127.0.0.3\"]`)"
        ),
        "{}",
        traffic.denied[3].detail
    );
}

#[tokio::test]
async fn loopback_is_refused_without_allow_addresses() {
    let port = echo_origin().await;
    let mut plan = plan(port);
    plan.allow_addresses.clear();
    // The CLI's embedded broker: the refusal names the flag too.
    plan.own = true;
    let sandbox = start(plan, 443, &[]);
    let (s, head) = connect_to(sandbox.proxy, &format!("allowed.test:{port}")).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(rest(s).await.contains("127.0.0.1: loopback"));
    let traffic = sandbox.egress.finish().await;
    assert_eq!(reasons(&traffic), ["address_refused"]);
    assert_eq!(
        traffic.denied[0].detail,
        "allowed.test resolves only to refused addresses (127.0.0.1: loopback); allow it with \
         `--allow-address 127.0.0.1` / `[egress] allow_addresses = [\"127.0.0.1\"]`"
    );
}

#[tokio::test]
async fn plain_http_goes_to_its_origin_rewritten() {
    let port = http_origin().await;
    let sandbox = start(plan(port), 443, &[]);
    let request = format!(
        "GET http://allowed.test:{port}/path?q=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n"
    );
    let (s, head) = ask(sandbox.proxy, request.as_bytes()).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let seen = rest(s).await;
    assert_eq!(
        seen,
        format!(
            "GET /path?q=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        )
    );
    let origin_form = format!("GET /x HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n");
    let (s, head) = ask(sandbox.proxy, origin_form.as_bytes()).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(rest(s).await.starts_with("GET /x HTTP/1.1\r\n"));
    let (s, head) = ask(sandbox.proxy, b"GET http://evil.test/ HTTP/1.1\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    drop(s);
    let traffic = sandbox.egress.finish().await;
    assert_eq!(traffic.reached[0].connections, 2);
    assert_eq!(reasons(&traffic), ["domain_not_allowed"]);
}

#[tokio::test]
async fn the_tls_server_name_must_be_the_tunnels_host() {
    let port = echo_origin().await;
    let sandbox = start(plan(port), port, &[]);
    let target = format!("allowed.test:{port}");
    let (mut s, head) = connect_to(sandbox.proxy, &target).await;
    assert!(head.starts_with("HTTP/1.1 200"));
    let hello = sni::client_hello(Some("ALLOWED.test"), 2);
    s.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    timeout(WAIT, s.read_exact(&mut back)).await.unwrap().unwrap();
    assert_eq!(back, hello, "the ClientHello reaches the origin");
    drop(s);
    for sni in [Some("evil.test"), None] {
        let (mut s, _) = connect_to(sandbox.proxy, &target).await;
        s.write_all(&sni::client_hello(sni, 1)).await.unwrap();
        assert_eq!(rest(s).await, "", "closed without a byte");
    }
    let traffic = sandbox.egress.finish().await;
    assert_eq!(reasons(&traffic), ["sni_mismatch", "sni_mismatch"]);
    assert_eq!(traffic.reached[0].connections, 1);
}

#[tokio::test]
async fn the_byte_quota_cuts_the_run_and_refuses_new_connections() {
    let port = source_origin(1 << 20).await;
    let mut plan = plan(port);
    plan.max_bytes = 100_000;
    let sandbox = start(plan, 443, &[]);
    let (s, head) = connect_to(sandbox.proxy, &format!("allowed.test:{port}")).await;
    assert!(head.starts_with("HTTP/1.1 200"));
    assert_eq!(rest(s).await.len(), 100_000);
    let (s, head) = connect_to(sandbox.proxy, &format!("allowed.test:{port}")).await;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(rest(s).await.starts_with("quota_exceeded"));
    let traffic = sandbox.egress.finish().await;
    assert!(traffic.quota_exceeded);
    assert_eq!((traffic.bytes_in, traffic.reached[0].bytes_in), (100_000, 100_000));
    assert_eq!(reasons(&traffic), ["quota_exceeded"]);
}

#[tokio::test]
async fn connections_past_the_limit_are_refused_until_one_closes() {
    let port = echo_origin().await;
    let mut plan = plan(port);
    plan.max_connections = 1;
    let sandbox = start(plan, 443, &[]);
    let target = format!("allowed.test:{port}");
    let (first, head) = connect_to(sandbox.proxy, &target).await;
    assert!(head.starts_with("HTTP/1.1 200"));
    let (s, head) = connect_to(sandbox.proxy, &target).await;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(rest(s).await.starts_with("too_many_connections"));
    drop(first);
    let served = timeout(WAIT, async {
        loop {
            let (_s, head) = connect_to(sandbox.proxy, &target).await;
            if head.starts_with("HTTP/1.1 200") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    served.await.unwrap();
    let traffic = sandbox.egress.finish().await;
    assert!(reasons(&traffic).iter().all(|r| *r == "too_many_connections"));
}

#[tokio::test]
async fn an_idle_tunnel_is_closed() {
    let port = echo_origin().await;
    let mut plan = plan(port);
    plan.idle_timeout = Duration::from_millis(200);
    let sandbox = start(plan, 443, &[]);
    let (s, head) = connect_to(sandbox.proxy, &format!("allowed.test:{port}")).await;
    assert!(head.starts_with("HTTP/1.1 200"));
    assert_eq!(rest(s).await, "");
    sandbox.egress.finish().await;
}

#[tokio::test]
async fn malformed_and_oversized_requests_are_refused_and_the_proxy_keeps_serving() {
    let port = echo_origin().await;
    let sandbox = start(plan(port), 443, &[]);
    let (s, head) = ask(sandbox.proxy, b"\x16\x03\x01\x00\x05hello\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
    assert!(rest(s).await.starts_with("malformed_request"));
    let big = format!("GET http://allowed.test/ HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(proxy::HEAD_MAX));
    let (s, head) = ask(sandbox.proxy, big.as_bytes()).await;
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
    drop(s);
    let (s, head) = ask(sandbox.proxy, b"CONNECT allowed.test HTTP/1.1\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    drop(s);
    let (_s, head) = connect_to(sandbox.proxy, &format!("allowed.test:{port}")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let traffic = sandbox.egress.finish().await;
    assert_eq!(reasons(&traffic), ["malformed_request"; 3]);
}

async fn udp_query(server: SocketAddr, name: &str, qtype: u16) -> (u8, Vec<IpAddr>) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(&dnswire::query(42, name, qtype), server).await.unwrap();
    let mut buf = [0u8; 512];
    let n = timeout(WAIT, socket.recv(&mut buf)).await.unwrap().unwrap();
    let (id, rcode, addresses) = dnswire::read_answer(&buf[..n]);
    assert_eq!(id, 42);
    (rcode, addresses)
}

async fn tcp_query(stream: &mut TcpStream, name: &str, qtype: u16) -> (u8, Vec<IpAddr>) {
    let q = dnswire::query(7, name, qtype);
    stream.write_all(&[&(q.len() as u16).to_be_bytes()[..], &q].concat()).await.unwrap();
    let len = timeout(WAIT, stream.read_u16()).await.unwrap().unwrap();
    let mut msg = vec![0u8; usize::from(len)];
    stream.read_exact(&mut msg).await.unwrap();
    let (_, rcode, addresses) = dnswire::read_answer(&msg);
    (rcode, addresses)
}

const NOERROR: u8 = 0;
const FORMERR: u8 = 1;
const SERVFAIL: u8 = 2;
const NXDOMAIN: u8 = 3;
const REFUSED: u8 = 5;

#[tokio::test]
async fn the_resolver_answers_allowed_names_only_over_udp_and_tcp() {
    let sandbox = start(plan(443), 443, &[]);
    let udp = sandbox.dns_udp;
    assert_eq!(udp_query(udp, "Allowed.Test.", TYPE_A).await, (NOERROR, vec![ip("127.0.0.1")]));
    assert_eq!(udp_query(udp, "allowed.test", TYPE_AAAA).await, (NOERROR, vec![]));
    assert_eq!(udp_query(udp, "evil.test", TYPE_A).await, (NXDOMAIN, vec![]));
    assert_eq!(udp_query(udp, "allowed.test", MX).await, (REFUSED, vec![]));
    assert_eq!(udp_query(udp, "refused.test", TYPE_A).await, (NOERROR, vec![]));
    let mut tcp = TcpStream::connect(sandbox.dns_tcp).await.unwrap();
    assert_eq!(tcp_query(&mut tcp, "allowed.test", TYPE_A).await, (NOERROR, vec![ip("127.0.0.1")]));
    assert_eq!(tcp_query(&mut tcp, "other.test", TYPE_AAAA).await, (NXDOMAIN, vec![]));
    assert_eq!(tcp_query(&mut tcp, "allowed.test", MX).await, (REFUSED, vec![]));
    drop(tcp);
    let traffic = sandbox.egress.finish().await;
    assert_eq!(
        reasons(&traffic),
        ["domain_not_allowed", "query_refused", "address_refused", "domain_not_allowed", "query_refused"]
    );
    assert!(traffic.denied.iter().all(|d| d.via == EgressPath::Dns && d.port == 0));
}

#[tokio::test]
async fn the_resolver_is_rate_limited() {
    let sandbox = start(plan(443), 443, &[]);
    let mut tcp = TcpStream::connect(sandbox.dns_tcp).await.unwrap();
    let mut refused = false;
    for _ in 0..(limits::DNS_BURST * 3) {
        if tcp_query(&mut tcp, "allowed.test", TYPE_A).await.0 == REFUSED {
            refused = true;
            break;
        }
    }
    assert!(refused, "a query past the burst is refused");
    drop(tcp);
    assert_eq!(reasons(&sandbox.egress.finish().await), ["rate_limited"]);
}

fn transparent_plan(port: u16) -> EgressPlan {
    let mut plan = plan(port);
    plan.transparent = true;
    plan.pool = vec![
        PoolEntry { address: Ipv4Addr::new(127, 0, 0, 2), name: Some("allowed.test".into()) },
        PoolEntry { address: Ipv4Addr::new(127, 0, 0, 3), name: None },
        PoolEntry { address: Ipv4Addr::new(127, 0, 0, 4), name: None },
    ];
    plan
}

#[tokio::test]
async fn transparent_names_get_pool_addresses_and_wildcards_take_spares() {
    let sandbox = start(transparent_plan(443), 443, &[]);
    let udp = sandbox.dns_udp;
    assert_eq!(udp_query(udp, "allowed.test", TYPE_A).await, (NOERROR, vec![ip("127.0.0.2")]));
    assert_eq!(udp_query(udp, "allowed.test", TYPE_AAAA).await, (NOERROR, vec![]));
    assert_eq!(udp_query(udp, "a.wild.test", TYPE_A).await, (NOERROR, vec![ip("127.0.0.3")]));
    assert_eq!(udp_query(udp, "b.wild.test", TYPE_A).await, (NOERROR, vec![ip("127.0.0.4")]));
    assert_eq!(udp_query(udp, "A.wild.test", TYPE_A).await, (NOERROR, vec![ip("127.0.0.3")]));
    assert_eq!(udp_query(udp, "c.wild.test", TYPE_A).await, (SERVFAIL, vec![]));
    assert_eq!(udp_query(udp, "evil.test", TYPE_A).await, (NXDOMAIN, vec![]));
    let traffic = sandbox.egress.finish().await;
    assert_eq!(reasons(&traffic), ["resolve_failed", "domain_not_allowed"]);
}

#[tokio::test]
async fn transparent_connections_go_to_the_name_their_address_stands_for() {
    let port = echo_origin().await;
    let listeners = [("127.0.0.2", port), ("127.0.0.3", port), ("127.0.0.4", port)];
    let sandbox = start(transparent_plan(port), 443, &listeners);
    // A spare not given to a name yet: nothing behind it.
    let s = TcpStream::connect(sandbox.transparent[1]).await.unwrap();
    assert_eq!(rest(s).await, "");
    assert_eq!(udp_query(sandbox.dns_udp, "a.wild.test", TYPE_A).await, (NOERROR, vec![ip("127.0.0.3")]));
    for at in &sandbox.transparent[..2] {
        let mut s = TcpStream::connect(at).await.unwrap();
        s.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        timeout(WAIT, s.read_exact(&mut back)).await.unwrap().unwrap();
        assert_eq!(&back, b"ping");
    }
    let traffic = sandbox.egress.finish().await;
    let reached: Vec<_> =
        traffic.reached.iter().map(|h| (h.host.as_str(), h.port, h.via, h.bytes_in)).collect();
    assert_eq!(
        reached,
        [
            ("allowed.test", port, EgressPath::Transparent, 4),
            ("a.wild.test", port, EgressPath::Transparent, 4)
        ]
    );
    assert_eq!(reasons(&traffic), ["domain_not_allowed"]);
    assert_eq!(traffic.denied[0].host, "127.0.0.3");
}

#[tokio::test]
async fn a_transparent_tls_connection_must_name_its_host() {
    let port = echo_origin().await;
    let sandbox = start(transparent_plan(port), port, &[("127.0.0.2", port)]);
    let mut s = TcpStream::connect(sandbox.transparent[0]).await.unwrap();
    let hello = sni::client_hello(Some("allowed.test"), 1);
    s.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    timeout(WAIT, s.read_exact(&mut back)).await.unwrap().unwrap();
    assert_eq!(back, hello);
    drop(s);
    let mut s = TcpStream::connect(sandbox.transparent[0]).await.unwrap();
    s.write_all(&sni::client_hello(Some("evil.test"), 1)).await.unwrap();
    assert_eq!(rest(s).await, "");
    let traffic = sandbox.egress.finish().await;
    assert_eq!(reasons(&traffic), ["sni_mismatch"]);
    assert_eq!(traffic.reached[0].connections, 1);
}

#[tokio::test]
async fn a_descriptor_that_is_not_its_listener_is_refused() {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let at = udp.local_addr().unwrap();
    let listeners = vec![(record(ListenerKind::Proxy, at, at.port()), OwnedFd::from(udp))];
    assert!(Egress::start(Arc::new(plan(443)), listeners, None).is_err());
    let (fd, at) = tcp_fd("127.0.0.1:0");
    let listeners = vec![(record(ListenerKind::DnsUdp, at, at.port()), fd)];
    assert!(Egress::start(Arc::new(plan(443)), listeners, None).is_err());
    let (_listening, at) = tcp_fd("127.0.0.1:0");
    let connected = OwnedFd::from(std::net::TcpStream::connect(at).unwrap());
    let listeners = vec![(record(ListenerKind::Proxy, at, at.port()), connected)];
    assert!(Egress::start(Arc::new(plan(443)), listeners, None).is_err());
}

/// Parser differentials: a NUL byte or another control character in a name
/// (a CONNECT target, a Host, a TLS server name, a DNS question) is never
/// read as the allowed name before it, nor after it.
#[tokio::test]
async fn control_characters_in_a_name_are_refused_wherever_the_name_comes() {
    let port = echo_origin().await;
    let sandbox = start(plan(port), port, &[]);
    for name in
        ["allowed.test\0.evil.test", "evil.test\0allowed.test", "allowed.test\x01", "allowed\x7f.test"]
    {
        let (s, head) = connect_to(sandbox.proxy, &format!("{name}:{port}")).await;
        assert!(head.starts_with("HTTP/1.1 400") || head.starts_with("HTTP/1.1 403"), "{name:?}: {head}");
        drop(s);
        let request = format!("GET / HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n");
        let (s, head) = ask(sandbox.proxy, request.as_bytes()).await;
        assert!(head.starts_with("HTTP/1.1 400") || head.starts_with("HTTP/1.1 403"), "{name:?}: {head}");
        drop(s);
    }
    // A tunnel to the allowed name whose TLS server name hides another behind a NUL.
    let (mut s, head) = connect_to(sandbox.proxy, &format!("allowed.test:{port}")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(&sni::client_hello(Some("allowed.test\0evil.test"), 1)).await.unwrap();
    assert_eq!(rest(s).await, "", "closed without a byte");
    for name in ["allowed.test\0.evil.test", "allowed\x01.test"] {
        // Refused as malformed (FORMERR) or unknown (NXDOMAIN), never answered.
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket.send_to(&dnswire::query(42, name, TYPE_A), sandbox.dns_udp).await.unwrap();
        let mut buf = [0u8; 512];
        let n = timeout(WAIT, socket.recv(&mut buf)).await.unwrap().unwrap();
        let (rcode, answers) = (buf[3] & 0x0f, u16::from_be_bytes([buf[6], buf[7]]));
        assert!(n >= 12 && matches!(rcode, FORMERR | NXDOMAIN) && answers == 0, "{name:?}: {:?}", &buf[..n]);
    }
    // Counter-tests: the same name, clean, is served everywhere.
    let (mut s, head) = connect_to(sandbox.proxy, &format!("allowed.test:{port}")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let hello = sni::client_hello(Some("allowed.test"), 1);
    s.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    timeout(WAIT, s.read_exact(&mut back)).await.unwrap().unwrap();
    drop(s);
    assert_eq!(udp_query(sandbox.dns_udp, "allowed.test", TYPE_A).await.0, NOERROR);
    let traffic = sandbox.egress.finish().await;
    assert!(traffic.reached.iter().all(|h| h.host == "allowed.test"), "{traffic:?}");
    assert_eq!(traffic.reached[0].connections, 1, "only the clean tunnel reached it: {traffic:?}");
    let refused = reasons(&traffic);
    assert_eq!(refused.iter().filter(|r| **r == "malformed_request").count(), 8, "{traffic:?}");
    assert_eq!(refused.last(), Some(&"sni_mismatch"), "{traffic:?}");
}

/// A second request pipelined behind a plain-HTTP one, naming another
/// host, and a CONNECT sent inside an allowed tunnel: bytes to the allowed
/// origin, counted there, and no connection anywhere else.
#[tokio::test]
async fn pipelined_and_nested_requests_stay_at_the_allowed_origin_and_are_counted() {
    let port = echo_origin().await;
    let sandbox = start(plan(port), 443, &[]);
    let first = format!("GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n");
    let second = format!("GET http://evil.test:{port}/ HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n");
    let mut s = TcpStream::connect(sandbox.proxy).await.unwrap();
    s.write_all(format!("{first}{second}").as_bytes()).await.unwrap();
    s.shutdown().await.unwrap();
    let echoed = rest(s).await;
    // The origin got the first, rewritten, and the second as it was sent.
    assert!(echoed.starts_with("GET / HTTP/1.1\r\nHost: allowed.test:"), "{echoed}");
    assert!(echoed.ends_with(&second), "{echoed}");
    let (mut s, head) = connect_to(sandbox.proxy, &format!("allowed.test:{port}")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let nested = format!("CONNECT evil.test:{port} HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n");
    s.write_all(nested.as_bytes()).await.unwrap();
    let mut back = vec![0u8; nested.len()];
    timeout(WAIT, s.read_exact(&mut back)).await.unwrap().unwrap();
    assert_eq!(back, nested.as_bytes(), "the tunnel's bytes reach its origin as they are");
    drop(s);
    let traffic = sandbox.egress.finish().await;
    assert_eq!(traffic.reached.len(), 1, "{traffic:?}");
    let host = &traffic.reached[0];
    assert_eq!((host.host.as_str(), host.connections), ("allowed.test", 2));
    assert_eq!(host.bytes_out, echoed.len() as u64 + nested.len() as u64, "{traffic:?}");
    assert!(traffic.denied.is_empty(), "{traffic:?}");
}
