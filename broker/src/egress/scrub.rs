//! A granted host's answer, its secrets replaced: an origin that echoes
//! its request (a redirect's `Location`, an error page quoting the target)
//! would otherwise hand the run the secret the broker added. Headers are
//! searched whole, the body as it streams (a secret split between two
//! reads is found: the last bytes that could begin one wait for the
//! next), every form [`super::credentials`] knows. A body the broker
//! cannot read (a `Content-Encoding` other than `identity`, though the
//! request asked for `identity`) is not passed on.

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

/// What a request to a granted host asks for: an answer the broker can read.
pub fn ask_identity(headers: &mut hyper::HeaderMap) {
    headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
}

/// The answer with its secrets replaced, or why it cannot be passed on.
pub fn answer(
    secrets: &Arc<Secrets>,
    method: &Method,
    response: Response<Incoming>,
) -> Result<Response<BoxBody<Bytes, hyper::Error>>, String> {
    let (mut parts, body) = response.into_parts();
    if let Some(coding) = parts.headers.get(header::CONTENT_ENCODING) {
        let coding = String::from_utf8_lossy(coding.as_bytes()).trim().to_ascii_lowercase();
        if coding != "identity" {
            return Err(format!(
                "the origin answered with Content-Encoding: {coding}, though asked for identity: an answer \
                 the broker cannot search for the credential's secret is not passed on"
            ));
        }
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
        return Ok(Response::from_parts(parts, body.boxed()));
    }
    // A replaced secret changes the length: the body goes chunked.
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = Scrubbed { inner: body, secrets: secrets.clone(), carry: Vec::new(), done: false };
    Ok(Response::from_parts(parts, body.boxed()))
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
