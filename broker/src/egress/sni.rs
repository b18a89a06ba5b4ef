//! The server name (SNI) of a TLS ClientHello, read before a tunnel to a
//! TLS port is opened: the tunnel goes to the host it was asked for only
//! if the TLS session says the same name. A small parser of the few fields
//! on the way to the extension (RFC 8446 4.1.2, RFC 6066 3), every length
//! checked against what is left.

use super::refusal::Refusal;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest ClientHello read: a post-quantum key share makes one about 2
/// KiB; one full TLS record is 16 KiB.
pub const HELLO_MAX: usize = 16 * 1024 + RECORD_HEADER;
/// How long the sandbox has to send its ClientHello once the tunnel is
/// granted.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS record header: type, version, length.
const RECORD_HEADER: usize = 5;
/// The `handshake` record type.
const HANDSHAKE: u8 = 22;
/// The `client_hello` handshake type.
const CLIENT_HELLO: u8 = 1;
/// The `server_name` extension.
const SERVER_NAME: u16 = 0;
/// The `host_name` entry of a `server_name` list.
const HOST_NAME: u8 = 0;

/// What the bytes read so far hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    Incomplete,
    /// A whole ClientHello, with its server name if it has one.
    Complete(Option<String>),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SniError {
    #[error("not a TLS handshake")]
    NotTls,
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// Reads the ClientHello from `client` (after the `initial` bytes already
/// read) and checks that its server name is `expected`. Returns every byte
/// read, to be sent on to the origin.
pub async fn expect<R: AsyncRead + Unpin>(
    client: &mut R,
    initial: Vec<u8>,
    expected: &str,
) -> Result<Vec<u8>, Refusal> {
    let mismatch = |found: String| Refusal::SniMismatch { expected: expected.to_owned(), found };
    let mut buf = initial;
    let read = async {
        loop {
            match parse(&buf) {
                Ok(Hello::Complete(sni)) => return Ok(sni),
                Ok(Hello::Incomplete) if buf.len() >= HELLO_MAX => {
                    return Err("a ClientHello too large".into());
                }
                Ok(Hello::Incomplete) => {}
                Err(e) => return Err(e.to_string()),
            }
            let mut chunk = [0u8; 4096];
            let room = (HELLO_MAX - buf.len()).min(chunk.len());
            match client.read(&mut chunk[..room]).await {
                Ok(0) => return Err("the connection closed before its ClientHello".into()),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("reading the ClientHello: {e}")),
            }
        }
    };
    let sni = match tokio::time::timeout(HELLO_TIMEOUT, read).await {
        Ok(Ok(sni)) => sni,
        Ok(Err(why)) => return Err(mismatch(why)),
        Err(_) => return Err(mismatch(format!("no ClientHello within {HELLO_TIMEOUT:?}"))),
    };
    match sni {
        Some(name) if name.strip_suffix('.').unwrap_or(&name).eq_ignore_ascii_case(expected) => Ok(buf),
        Some(name) => Err(mismatch(name)),
        None => Err(mismatch("no server name".into())),
    }
}

/// Parses the TLS records in `buf` as far as one ClientHello.
pub fn parse(buf: &[u8]) -> Result<Hello, SniError> {
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        match rest.first() {
            None => return Ok(Hello::Incomplete),
            Some(&HANDSHAKE) => {}
            Some(_) => return Err(SniError::NotTls),
        }
        if rest.len() < RECORD_HEADER {
            return Ok(Hello::Incomplete);
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > HELLO_MAX - RECORD_HEADER {
            return Err(SniError::Malformed("record length"));
        }
        let Some(fragment) = rest.get(RECORD_HEADER..RECORD_HEADER + len) else {
            return Ok(Hello::Incomplete);
        };
        handshake.extend_from_slice(fragment);
        rest = &rest[RECORD_HEADER + len..];
        if handshake[0] != CLIENT_HELLO {
            return Err(SniError::Malformed("not a ClientHello"));
        }
        if handshake.len() < 4 {
            continue;
        }
        let body_len =
            usize::from(handshake[1]) << 16 | usize::from(handshake[2]) << 8 | usize::from(handshake[3]);
        if let Some(body) = handshake.get(4..4 + body_len) {
            return client_hello_sni(body).map(Hello::Complete);
        }
    }
}

/// A cursor over bytes whose every read is checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SniError> {
        if self.0.len() < n {
            return Err(SniError::Malformed("a length past the end"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, SniError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, SniError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Result<&'a [u8], SniError> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }
    fn vec16(&mut self) -> Result<&'a [u8], SniError> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// The server name of a ClientHello's body (after its 4-byte header).
fn client_hello_sni(body: &[u8]) -> Result<Option<String>, SniError> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    if r.vec8()?.len() > 32 {
        return Err(SniError::Malformed("session id"));
    }
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.0.is_empty() {
        return Ok(None);
    }
    let mut extensions = Reader(r.vec16()?);
    if !r.0.is_empty() {
        return Err(SniError::Malformed("bytes after the extensions"));
    }
    let mut found = None;
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vec16()?;
        if kind != SERVER_NAME {
            continue;
        }
        if found.is_some() {
            return Err(SniError::Malformed("two server_name extensions"));
        }
        found = Some(server_name(data)?);
    }
    Ok(found)
}

fn server_name(data: &[u8]) -> Result<String, SniError> {
    let mut outer = Reader(data);
    let mut list = Reader(outer.vec16()?);
    if !outer.0.is_empty() {
        return Err(SniError::Malformed("bytes after the server_name list"));
    }
    let mut name = None;
    while !list.0.is_empty() {
        let kind = list.u8()?;
        let value = list.vec16()?;
        if kind == HOST_NAME {
            if name.is_some() {
                return Err(SniError::Malformed("two host names"));
            }
            name = Some(value);
        }
    }
    let name = name.ok_or(SniError::Malformed("a server_name without a host name"))?;
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
        return Err(SniError::Malformed("a host name that is not ASCII"));
    }
    Ok(String::from_utf8_lossy(name).into_owned())
}

/// A minimal TLS 1.2/1.3 ClientHello naming `sni` (none when `None`), in
/// `records` records: what the tests send.
#[cfg(test)]
pub fn client_hello(sni: Option<&str>, records: usize) -> Vec<u8> {
    let mut ext = Vec::new();
    if let Some(name) = sni {
        let n = name.len() as u16;
        ext.extend_from_slice(&SERVER_NAME.to_be_bytes());
        ext.extend_from_slice(&(n + 5).to_be_bytes());
        ext.extend_from_slice(&(n + 3).to_be_bytes());
        ext.push(HOST_NAME);
        ext.extend_from_slice(&n.to_be_bytes());
        ext.extend_from_slice(name.as_bytes());
    }
    // supported_versions: TLS 1.3, an extension that is not the name.
    ext.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01, 0x01, 0x00]);
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![CLIENT_HELLO, 0, (body.len() >> 8) as u8, body.len() as u8];
    hs.extend_from_slice(&body);
    let mut out = Vec::new();
    for piece in hs.chunks(hs.len().div_ceil(records)) {
        out.extend_from_slice(&[HANDSHAKE, 0x03, 0x01]);
        out.extend_from_slice(&(piece.len() as u16).to_be_bytes());
        out.extend_from_slice(piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_is_found_in_one_or_several_records() {
        for records in [1, 2, 5] {
            let hello = client_hello(Some("Allowed.Test"), records);
            assert_eq!(parse(&hello), Ok(Hello::Complete(Some("Allowed.Test".into()))));
            for cut in 0..hello.len() {
                assert_eq!(parse(&hello[..cut]), Ok(Hello::Incomplete), "cut at {cut}");
            }
        }
        assert_eq!(parse(&client_hello(None, 1)), Ok(Hello::Complete(None)));
    }

    #[test]
    fn what_is_not_a_client_hello_is_refused() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(SniError::NotTls));
        assert_eq!(parse(&[22, 3, 1, 0, 0]), Err(SniError::Malformed("record length")));
        assert_eq!(parse(&[22, 3, 1, 0, 4, 2, 0, 0, 0]), Err(SniError::Malformed("not a ClientHello")));
        // A ClientHello whose extension block claims more than it has.
        let mut hello = client_hello(Some("a.test"), 1);
        // Its extensions: server_name (15 bytes) and supported_versions (7).
        let at = hello.len() - 22 - 2;
        hello[at] = 0x7f;
        assert!(matches!(parse(&hello), Err(SniError::Malformed(_))));
    }

    #[tokio::test]
    async fn expect_checks_the_name_and_returns_the_bytes() {
        let hello = client_hello(Some("allowed.test."), 2);
        let (head, tail) = hello.split_at(3);
        let got = expect(&mut &tail[..], head.to_vec(), "allowed.test").await.unwrap();
        assert_eq!(got, hello);
        let other = client_hello(Some("evil.test"), 1);
        let err = expect(&mut &other[..], vec![], "allowed.test").await.unwrap_err();
        assert_eq!(err.reason(), "sni_mismatch");
        let none = client_hello(None, 1);
        assert_eq!(
            expect(&mut &none[..], vec![], "allowed.test").await.unwrap_err().reason(),
            "sni_mismatch"
        );
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any bytes: the parser answers, never panics.
        #[test]
        fn the_parser_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse(&bytes);
        }

        /// A real ClientHello with one byte changed and cut short: refused,
        /// incomplete, or read with a name as long as the one it carries.
        #[test]
        fn a_damaged_hello_is_refused_or_read(at in 0usize..200, value in any::<u8>(), cut in 0usize..200) {
            let mut hello = client_hello(Some("allowed.test"), 2);
            let at = at % hello.len();
            hello[at] = value;
            hello.truncate(hello.len() - cut % hello.len());
            if let Ok(Hello::Complete(Some(name))) = parse(&hello) {
                prop_assert_eq!(name.len(), "allowed.test".len());
            }
        }
    }
}
