//! A granted host's answer, its secrets replaced: an origin that echoes
//! its request (a redirect's `Location`, an error page quoting the target)
//! would otherwise hand the run the secret the broker added. Headers are
//! searched whole, the body as it streams (a secret split between two
//! reads is found: the last bytes that could begin one wait for the
//! next), every form [`super::credentials`] knows. A body the broker
//! cannot read (a `Content-Encoding` other than `identity`, though the
//! request asked for `identity`, or a `Transfer-Encoding` other than
//! `chunked`) is not passed on.

use super::credentials::Secrets;
use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Response, StatusCode};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// What a request to a granted host asks for: an answer the broker can
/// read, whole (a range of an echo would be a piece of a secret placed
/// where the run chose).
pub fn ask_identity(headers: &mut hyper::HeaderMap) {
    headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    headers.remove(header::RANGE);
    headers.remove(header::IF_RANGE);
}

/// Why an answer cannot be searched, read from its headers as the origin
/// sent them (before a `Connection` header could take one away): every
/// `Content-Encoding` must be `identity`, every `Transfer-Encoding`
/// `chunked`. The origin's own text is not repeated.
pub fn unreadable(headers: &hyper::HeaderMap) -> Option<String> {
    // Any value (of any field of that name, split at its commas) but `plain`.
    let other_than = |name, plain: &str| {
        let codings = headers.get_all(name).iter().flat_map(|v| v.as_bytes().split(|&b| b == b','));
        codings.map(<[u8]>::trim_ascii).any(|c| !c.is_empty() && !c.eq_ignore_ascii_case(plain.as_bytes()))
    };
    let coded =
        other_than(header::CONTENT_ENCODING, "identity") || other_than(header::TRANSFER_ENCODING, "chunked");
    coded.then(|| {
        "the origin answered with a Content-Encoding or Transfer-Encoding other than identity and chunked, \
         though asked for identity: an answer the broker cannot search for a credential's secret is not \
         passed on"
            .into()
    })
}

/// The answer with its secrets replaced: headers (a name holding one goes),
/// the reason phrase (dropped: the status's own is sent), the body.
pub fn answer(
    secrets: &Arc<Secrets>,
    method: &Method,
    response: Response<Incoming>,
) -> Response<BoxBody<Bytes, hyper::Error>> {
    let (mut parts, body) = response.into_parts();
    parts.extensions.remove::<hyper::ext::ReasonPhrase>();
    let named: Vec<_> =
        parts.headers.keys().filter(|k| secrets.replaced(k.as_str().as_bytes()).is_some()).cloned().collect();
    for name in named {
        parts.headers.remove(name);
    }
    for value in parts.headers.values_mut() {
        if let Some(new) = secrets.replaced(value.as_bytes()).and_then(|t| HeaderValue::from_bytes(&t).ok()) {
            *value = new;
        }
    }
    let bodiless = method == Method::HEAD
        || parts.status.is_informational()
        || matches!(parts.status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    if bodiless {
        return Response::from_parts(parts, body.boxed());
    }
    // A replaced secret changes the length: the body goes chunked.
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = Scrubbed { inner: body, secrets: secrets.clone(), carry: Vec::new(), done: false };
    Response::from_parts(parts, body.boxed())
}

/// A body with its secrets replaced as it streams. Trailers are dropped.
struct Scrubbed {
    inner: Incoming,
    secrets: Arc<Secrets>,
    /// Read and not yet passed on: what could begin a secret.
    carry: Vec<u8>,
    done: bool,
}

impl Body for Scrubbed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(None) => {
                    this.done = true;
                    let out = this.secrets.take(&mut this.carry, true);
                    return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(Bytes::from(out)))));
                }
            };
            if let Ok(data) = frame.into_data() {
                this.carry.extend_from_slice(&data);
                let out = this.secrets.take(&mut this.carry, false);
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
