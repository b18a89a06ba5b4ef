//! Inspected domains: the broker ends the sandbox's TLS with a leaf of its
//! own authority (`authority.rs`), opens its own TLS connection to the
//! origin (verified against the host's roots or `[egress] ca_bundle`), and
//! serves HTTP/1.1 between them, so that it sees every request on the
//! connection (keep-alive and pipelining included) and checks each against
//! the profile's `inspect.requests` rules before it reaches the origin.
//! Plain HTTP to an inspected name is served the same way, without TLS.
//! HTTP/2 is refused at ALPN (the broker offers only `http/1.1`); an
//! upgrade (WebSocket) is not passed on.

use super::account::{Flow, count};
use super::limits::Quota;
use super::refusal::Refusal;
use super::{Run, authority::Authority};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use palisade_policy::inspect::{Verdict, judge};
use palisade_protocol::attest::{EgressPath, InspectedRequest};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

type Body = BoxBody<Bytes, hyper::Error>;

/// Headers of one hop, never passed on (RFC 9110 7.6.1), beside those the
/// `Connection` header names.
const HOP_HEADERS: [&str; 8] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// One inspected connection: where it goes, and how it came.
pub(super) struct Inspected<'a> {
    pub name: &'a str,
    pub port: u16,
    pub via: EgressPath,
    /// Whether the sandbox speaks TLS; `None`: seen from its first byte
    /// (a TLS handshake record, or an HTTP request).
    pub tls: Option<bool>,
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Serves `client` (the sandbox's side, `prefix` already read from it) as
/// an inspected connection to `origin`.
pub(super) async fn serve<C>(
    run: &Run,
    client: C,
    prefix: Vec<u8>,
    origin: TcpStream,
    address: SocketAddr,
    to: Inspected<'_>,
) where
    C: AsyncRead + AsyncWrite + Unpin + Send,
{
    let deny = |refusal: Refusal| run.account.deny(to.name, to.port, to.via, &refusal);
    let Some(authority) = run.authority.as_deref() else {
        return deny(Refusal::TlsFailed("the broker has no inspection authority".into()));
    };
    let _ = origin.set_nodelay(true);
    let mut client = Prefixed { prefix, at: 0, inner: client };
    let tls = match (to.tls, client.prefix.first()) {
        (Some(tls), _) => tls,
        (None, Some(&first)) => first == TLS_HANDSHAKE,
        (None, None) => {
            let mut first = [0u8; 1];
            match tokio::time::timeout(run.plan.idle_timeout, client.inner.read(&mut first)).await {
                Ok(Ok(1)) => client.prefix.push(first[0]),
                _ => return,
            }
            first[0] == TLS_HANDSHAKE
        }
    };
    let to = Inspected { tls: Some(tls), ..to };
    let flow = run.account.reached(to.name, to.port, address, to.via);
    let origin = Metered { inner: origin, quota: &run.quota, flow: &flow };
    if !tls {
        return http(run, client, origin, &to).await;
    }
    let (client, origin) = match handshakes(run, authority, client, origin, to.name).await {
        Ok(both) => both,
        Err(refusal) => return deny(refusal),
    };
    http(run, client, origin, &to).await
}

/// What is read from each side's socket at once under TLS: rustls reads
/// 4 KiB at a time, a syscall each without a buffer between.
const TLS_READ_BUFFER: usize = 128 * 1024;

/// Both sides of an inspected connection under TLS.
type Tls<C, O> =
    (tokio_rustls::server::TlsStream<BufReader<C>>, tokio_rustls::client::TlsStream<BufReader<O>>);

/// TLS with the sandbox (a leaf for `name`), then with the origin.
async fn handshakes<C, O>(
    run: &Run,
    authority: &Authority,
    client: C,
    origin: O,
    name: &str,
) -> Result<Tls<C, O>, Refusal>
where
    C: AsyncRead + AsyncWrite + Unpin,
    O: AsyncRead + AsyncWrite + Unpin,
{
    let (client, origin) = (
        BufReader::with_capacity(TLS_READ_BUFFER, client),
        BufReader::with_capacity(TLS_READ_BUFFER, origin),
    );
    let server = authority.server_config(name).map_err(Refusal::TlsFailed)?;
    let client = tokio_rustls::TlsAcceptor::from(server)
        .accept(client)
        .await
        .map_err(|e| Refusal::TlsFailed(format!("the sandbox's TLS handshake for {name} failed: {e}")))?;
    let upstream = authority.client_config(run.plan.ca_bundle.as_deref()).map_err(Refusal::TlsFailed)?;
    let server_name = rustls::pki_types::ServerName::try_from(name.to_owned())
        .map_err(|e| Refusal::TlsFailed(format!("{name}: {e}")))?;
    let origin = tokio_rustls::TlsConnector::from(upstream)
        .connect(server_name, origin)
        .await
        .map_err(|e| Refusal::TlsFailed(format!("{name} failed TLS verification or its handshake: {e}")))?;
    Ok((client, origin))
}

/// HTTP/1.1 between the two sides, each request checked.
async fn http<C, O>(run: &Run, client: C, origin: O, to: &Inspected<'_>)
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    O: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (sender, connection) =
        match hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(origin)).await {
            Ok(both) => both,
            Err(e) => return run.account.deny(to.name, to.port, to.via, &Refusal::TlsFailed(e.to_string())),
        };
    let sender = Mutex::new(Some(sender));
    let service = hyper::service::service_fn(|req| handle(run, &sender, to, req));
    let server = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(run.plan.idle_timeout)
        .serve_connection(TokioIo::new(client), service);
    let (mut server, mut connection) = (std::pin::pin!(server), std::pin::pin!(connection));
    let mut origin_closed = false;
    loop {
        tokio::select! {
            ended = &mut server => {
                if let Err(e) = ended {
                    tracing::debug!(host = to.name, "inspected connection ended: {e}");
                }
                break;
            }
            _ = &mut connection, if !origin_closed => {
                // The origin closed: the answer in flight is finished, then the sandbox's side.
                origin_closed = true;
                server.as_mut().graceful_shutdown();
            }
        }
    }
    sender.lock().await.take();
    if !origin_closed {
        let _ = connection.await;
    }
}

/// One request: checked, passed on (or refused with a 403 naming the rule),
/// recorded.
async fn handle(
    run: &Run,
    sender: &Mutex<Option<hyper::client::conn::http1::SendRequest<Incoming>>>,
    to: &Inspected<'_>,
    req: Request<Incoming>,
) -> Result<Response<Body>, hyper::Error> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut record = InspectedRequest {
        method: method.clone(),
        host: to.name.into(),
        path,
        status: 0,
        allowed: false,
        rule: None,
        bytes_in: None,
        credentials: vec![],
    };
    let verdict = match other_host(&req, to.name) {
        Some(other) => Verdict::Refused(format!("a request for {other} on a connection to {}", to.name)),
        None => match (judge(&run.plan.requests, &method, to.name, &target), overriding(&req)) {
            (Verdict::Allowed(_), Some(header)) => Verdict::Refused(format!(
                "the request carries {header}, which would have the origin act on another method than the \
                 rules judged ({method})"
            )),
            (verdict, _) => verdict,
        },
    };
    let rule = match verdict {
        Verdict::Refused(why) => {
            run.account.deny(to.name, to.port, to.via, &Refusal::RequestNotAllowed(why.clone()));
            record.status = 403;
            record.rule = Some(why.clone());
            run.account.inspected(record);
            return Ok(text(StatusCode::FORBIDDEN, format!("request_not_allowed: {why}\n")));
        }
        Verdict::Allowed(rule) => Some(rule),
        Verdict::Unruled => None,
    };
    let (mut parts, body) = req.into_parts();
    // One hop's headers go first: a `Connection` naming a header the broker
    // sets would otherwise take it away.
    strip_hop_headers(&mut parts.headers);
    let tls = to.tls == Some(true);
    match super::credentials::apply(&run.credentials, to.name, tls, &mut parts) {
        Ok(used) => record.credentials = used,
        Err(why) => {
            run.account.deny(to.name, to.port, to.via, &Refusal::RequestNotAllowed(why.clone()));
            (record.status, record.rule) = (403, Some(why.clone()));
            run.account.inspected(record);
            return Ok(text(StatusCode::FORBIDDEN, format!("request_not_allowed: {why}\n")));
        }
    }
    record.allowed = true;
    record.rule = rule;
    // A granted host's answer is searched for the secrets it was sent.
    let scrub = run.credentials.secrets.clone().filter(|_| run.credentials.granted(to.name));
    if scrub.is_some() {
        super::scrub::ask_identity(&mut parts.headers);
    }
    let method = parts.method.clone();
    let forwarded = origin_request(Request::from_parts(parts, body), to);
    let answer = match sender.lock().await.as_mut() {
        Some(sender) => sender.send_request(forwarded).await.map_err(|e| e.to_string()),
        None => Err("the connection to the origin is closed".into()),
    };
    let response = match answer {
        Ok(mut response) => {
            let unreadable = scrub.as_ref().and_then(|_| super::scrub::unreadable(response.headers()));
            strip_hop_headers(response.headers_mut());
            record.bytes_in =
                response.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
            match (&scrub, unreadable) {
                (Some(_), Some(why)) => text(StatusCode::BAD_GATEWAY, format!("{why}\n")),
                (Some(secrets), None) => super::scrub::answer(secrets, &method, response),
                (None, _) => response.map(|b| b.boxed()),
            }
        }
        Err(e) => text(StatusCode::BAD_GATEWAY, format!("the origin {} failed: {e}\n", to.name)),
    };
    record.status = response.status().as_u16();
    run.account.inspected(record);
    Ok(response)
}

/// Headers by which a request asks the origin to act on another method
/// than its own (frameworks honour them, and a `_method` parameter, for
/// clients that cannot send it; one in a form's body is not seen).
const METHOD_OVERRIDES: [&str; 3] = ["x-http-method-override", "x-http-method", "x-method-override"];

/// The method-override header (or `_method` query parameter) a request
/// carries, if any.
fn overriding<B>(req: &Request<B>) -> Option<&'static str> {
    let query = req.uri().query().unwrap_or_default();
    let by_query =
        query.split('&').any(|p| p.split('=').next().is_some_and(|k| k.eq_ignore_ascii_case("_method")));
    match METHOD_OVERRIDES.into_iter().find(|h| req.headers().contains_key(*h)) {
        Some(h) => Some(h),
        None => by_query.then_some("a _method parameter"),
    }
}

/// The host a request names (`Host`, or an absolute-form target) when it is
/// not the connection's: a request routed by the origin to another name
/// would escape that name's rules.
fn other_host<B>(req: &Request<B>, name: &str) -> Option<String> {
    let strip = |h: &str| {
        let h = h.trim().trim_end_matches('.').to_ascii_lowercase();
        match h.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default().to_owned(),
            None => h.rsplit_once(':').map_or(h.clone(), |(host, _)| host.to_owned()),
        }
    };
    let named = req.uri().host().map(str::to_owned).into_iter().chain(
        req.headers()
            .get_all(header::HOST)
            .iter()
            .map(|v| v.to_str().map_or_else(|_| "?".into(), str::to_owned)),
    );
    named.map(|h| strip(&h)).find(|h| h != name)
}

/// The request as the origin gets it: origin-form, one hop's headers out,
/// `Host` set.
fn origin_request(req: Request<Incoming>, to: &Inspected<'_>) -> Request<Incoming> {
    let (mut parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = target.parse().unwrap_or_else(|_| hyper::Uri::from_static("/"));
    parts.version = hyper::Version::HTTP_11;
    strip_hop_headers(&mut parts.headers);
    if !parts.headers.contains_key(header::HOST) {
        let default = if to.tls == Some(true) { 443 } else { 80 };
        let host = if to.port == default { to.name.to_owned() } else { format!("{}:{}", to.name, to.port) };
        if let Ok(value) = HeaderValue::from_str(&host) {
            parts.headers.insert(header::HOST, value);
        }
    }
    Request::from_parts(parts, body)
}

fn strip_hop_headers(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().map(HeaderName::as_str).chain(HOP_HEADERS) {
        headers.remove(name);
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// The sandbox's side, with what was read from it before (a ClientHello,
/// a request head) given back first.
struct Prefixed<C> {
    prefix: Vec<u8>,
    at: usize,
    inner: C,
}

impl<C: AsyncRead + Unpin> AsyncRead for Prefixed<C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.at);
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Prefixed<C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The origin's side, each byte counted in the connection's flow and
/// against the run's quota (a side that would pass it fails).
struct Metered<'a> {
    inner: TcpStream,
    quota: &'a Quota,
    flow: &'a Flow<'a>,
}

fn quota_used(quota: &Quota) -> std::io::Error {
    std::io::Error::other(Refusal::QuotaExceeded(quota.max()).to_string())
}

impl AsyncRead for Metered<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            let room = this.quota.take(n);
            count(&this.flow.inbound, room);
            if room < n {
                return Poll::Ready(Err(quota_used(this.quota)));
            }
        }
        polled
    }
}

impl Metered<'_> {
    /// Counts what a write sent.
    fn sent(&self, polled: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = polled {
            let room = self.quota.take(n);
            count(&self.flow.out, room);
        }
        polled
    }
}

impl AsyncWrite for Metered<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.quota.is_exceeded() {
            return Poll::Ready(Err(quota_used(this.quota)));
        }
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.sent(polled)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.quota.is_exceeded() {
            return Poll::Ready(Err(quota_used(this.quota)));
        }
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.sent(polled)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
