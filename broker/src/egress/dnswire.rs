//! The DNS wire format, as much as the sandbox's resolver needs (RFC 1035
//! 4.1): a query's header and its one question, and answers of A and AAAA
//! records. Compressed names are refused in a question (a query has no
//! earlier name to point at).

use std::net::IpAddr;

pub const HEADER_LEN: usize = 12;
/// Longest name on the wire (RFC 1035 3.1).
const NAME_WIRE_MAX: usize = 255;
pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
pub const TYPE_PTR: u16 = 12;
pub const CLASS_IN: u16 = 1;
/// Largest answer: what every client takes over UDP without EDNS.
pub const ANSWER_MAX: usize = 512;
/// A record's size without its data: name pointer, type, class, TTL, length.
const RECORD_FIXED: usize = 12;

/// Response codes (RFC 1035 4.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError = 0,
    FormErr = 1,
    ServFail = 2,
    NxDomain = 3,
    NotImp = 4,
    Refused = 5,
}

/// A query with one question.
#[derive(Debug, PartialEq, Eq)]
pub struct Query<'a> {
    pub id: u16,
    flags: u16,
    /// Lower case, dot-separated, no trailing dot (empty for the root).
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// The question as it came, echoed in the answer.
    question: &'a [u8],
}

/// A message that is not a query the resolver answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Unanswerable {
    /// Too short for a header, or a response: dropped.
    Drop,
    /// Answered with this code and no question.
    Error { id: u16, flags: u16, rcode: Rcode },
}

pub fn parse(msg: &[u8]) -> Result<Query<'_>, Unanswerable> {
    if msg.len() < HEADER_LEN {
        return Err(Unanswerable::Drop);
    }
    let word = |at: usize| u16::from_be_bytes([msg[at], msg[at + 1]]);
    let (id, flags) = (word(0), word(2));
    let error = |rcode| Unanswerable::Error { id, flags, rcode };
    if flags & 0x8000 != 0 {
        return Err(Unanswerable::Drop);
    }
    if (flags >> 11) & 0xf != 0 {
        return Err(error(Rcode::NotImp));
    }
    if word(4) != 1 {
        return Err(error(Rcode::FormErr));
    }
    let mut at = HEADER_LEN;
    let mut labels: Vec<String> = Vec::new();
    loop {
        let len = usize::from(*msg.get(at).ok_or(error(Rcode::FormErr))?);
        at += 1;
        if len == 0 {
            break;
        }
        let label = msg.get(at..at + len).filter(|_| len < 64).ok_or(error(Rcode::FormErr))?;
        if at + len - HEADER_LEN > NAME_WIRE_MAX || !label.iter().all(|b| b.is_ascii_graphic() && *b != b'.')
        {
            return Err(error(Rcode::FormErr));
        }
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += len;
    }
    let fixed = msg.get(at..at + 4).ok_or(error(Rcode::FormErr))?;
    let question = &msg[HEADER_LEN..at + 4];
    let qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    let qclass = u16::from_be_bytes([fixed[2], fixed[3]]);
    Ok(Query { id, flags, name: labels.join("."), qtype, qclass, question })
}

/// The answer to `query`: `rcode`, and one record per address (A or AAAA
/// by the address) with `ttl`, as many as fit in [`ANSWER_MAX`] bytes.
pub fn answer(query: &Query<'_>, rcode: Rcode, addresses: &[IpAddr], ttl: u32) -> Vec<u8> {
    let mut room = ANSWER_MAX.saturating_sub(HEADER_LEN + query.question.len());
    let fits = addresses
        .iter()
        .take_while(|ip| {
            let size = RECORD_FIXED + if ip.is_ipv4() { 4 } else { 16 };
            let fits = size <= room;
            room = room.saturating_sub(size);
            fits
        })
        .count();
    let mut out = header(query.id, query.flags, rcode, 1, fits as u16);
    out.extend_from_slice(query.question);
    for ip in &addresses[..fits] {
        // The question's name, by a pointer to it (offset 12).
        out.extend_from_slice(&[0xc0, HEADER_LEN as u8]);
        let (kind, data) = match ip {
            IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
            IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
        };
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(&data);
    }
    out
}

/// The answer to a reverse query: one PTR record naming `name` (a
/// normalized name, whose labels fit the wire's bounds).
pub fn ptr_answer(query: &Query<'_>, name: &str, ttl: u32) -> Vec<u8> {
    let mut data = Vec::with_capacity(name.len() + 2);
    for label in name.split('.') {
        data.push(label.len() as u8);
        data.extend_from_slice(label.as_bytes());
    }
    data.push(0);
    let mut out = header(query.id, query.flags, Rcode::NoError, 1, 1);
    out.extend_from_slice(query.question);
    out.extend_from_slice(&[0xc0, HEADER_LEN as u8]);
    out.extend_from_slice(&TYPE_PTR.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&ttl.to_be_bytes());
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(&data);
    out
}

/// The IPv4 address a reverse name (`4.3.2.1.in-addr.arpa`) stands for.
pub fn reverse_v4(name: &str) -> Option<std::net::Ipv4Addr> {
    let octets: Vec<u8> =
        name.strip_suffix(".in-addr.arpa")?.split('.').map(|o| o.parse().ok()).collect::<Option<_>>()?;
    let [d, c, b, a] = octets[..] else { return None };
    Some(std::net::Ipv4Addr::new(a, b, c, d))
}

/// An answer with no question (to a message whose question cannot be read).
pub fn error(id: u16, flags: u16, rcode: Rcode) -> Vec<u8> {
    header(id, flags, rcode, 0, 0)
}

fn header(id: u16, flags: u16, rcode: Rcode, questions: u16, answers: u16) -> Vec<u8> {
    // QR, the query's opcode and RD, RA (the broker recurses), the code.
    let flags = 0x8000 | (flags & 0x7900) | 0x0080 | rcode as u16;
    let mut out = Vec::with_capacity(HEADER_LEN + 64);
    for word in [id, flags, questions, answers, 0, 0] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    out
}

/// A query for `name` of type `qtype`, class IN (what the tests send).
#[cfg(test)]
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = Vec::new();
    for word in [id, 0x0100, 1, 0, 0, 0] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

/// An answer's id, code and addresses (what the tests read).
#[cfg(test)]
pub fn read_answer(msg: &[u8]) -> (u16, u8, Vec<IpAddr>) {
    let as_query = [&msg[..2], &[0, 0], &msg[4..]].concat();
    let query = parse(&as_query).expect("an answer with its question");
    let mut at = HEADER_LEN + query.question.len();
    let mut addresses = Vec::new();
    for _ in 0..u16::from_be_bytes([msg[6], msg[7]]) {
        let len = usize::from(u16::from_be_bytes([msg[at + 10], msg[at + 11]]));
        let data = &msg[at + 12..at + 12 + len];
        addresses.push(match len {
            4 => IpAddr::from(<[u8; 4]>::try_from(data).unwrap()),
            _ => IpAddr::from(<[u8; 16]>::try_from(data).unwrap()),
        });
        at += 12 + len;
    }
    (u16::from_be_bytes([msg[0], msg[1]]), msg[3] & 0xf, addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reverse_query_of_an_address_is_answered_with_its_name() {
        assert_eq!(reverse_v4("1.0.77.127.in-addr.arpa"), Some(std::net::Ipv4Addr::new(127, 77, 0, 1)));
        for bad in
            ["1.0.77.in-addr.arpa", "1.0.77.127.5.in-addr.arpa", "x.0.77.127.in-addr.arpa", "1.0.77.127"]
        {
            assert_eq!(reverse_v4(bad), None, "{bad}");
        }
        let q = query(9, "1.0.77.127.in-addr.arpa", TYPE_PTR);
        let parsed = parse(&q).unwrap();
        let a = ptr_answer(&parsed, "allowed.test", 30);
        assert_eq!(&a[..2], &[0, 9]);
        assert_eq!(u16::from_be_bytes([a[6], a[7]]), 1, "one answer");
        assert!(a.ends_with(b"\x07allowed\x04test\x00"), "{a:?}");
    }

    #[test]
    fn a_query_is_read_and_answered() {
        let q = query(7, "Allowed.Test.", TYPE_A);
        let parsed = parse(&q).unwrap();
        assert_eq!((parsed.id, parsed.name.as_str(), parsed.qtype, parsed.qclass), (7, "allowed.test", 1, 1));
        let a = answer(&parsed, Rcode::NoError, &["127.77.0.1".parse().unwrap(), "::1".parse().unwrap()], 5);
        assert_eq!(read_answer(&a), (7, 0, vec!["127.77.0.1".parse().unwrap(), "::1".parse().unwrap()]));
        let many: Vec<IpAddr> =
            (0..40u16).map(|i| std::net::Ipv6Addr::new(0x2606, 0, 0, 0, 0, 0, 0, i).into()).collect();
        let a = answer(&parsed, Rcode::NoError, &many, 5);
        assert!(a.len() <= ANSWER_MAX);
        assert_eq!(read_answer(&a).2, many[..(ANSWER_MAX - HEADER_LEN - 18) / 28]);
    }

    #[test]
    fn what_is_not_a_query_is_dropped_or_refused() {
        assert_eq!(parse(&[0; 5]), Err(Unanswerable::Drop));
        let mut response = query(1, "a.test", TYPE_A);
        response[2] |= 0x80;
        assert_eq!(parse(&response), Err(Unanswerable::Drop));
        let mut two = query(1, "a.test", TYPE_A);
        two[5] = 2;
        assert!(matches!(parse(&two), Err(Unanswerable::Error { rcode: Rcode::FormErr, .. })));
        let mut compressed = query(1, "a.test", TYPE_A);
        compressed[12] = 0xc0;
        assert!(matches!(parse(&compressed), Err(Unanswerable::Error { rcode: Rcode::FormErr, .. })));
        let q = query(1, "a.test", TYPE_A);
        assert!(matches!(parse(&q[..q.len() - 1]), Err(Unanswerable::Error { rcode: Rcode::FormErr, .. })));
        let mut notify = query(1, "a.test", TYPE_A);
        notify[2] |= 4 << 3;
        assert!(matches!(parse(&notify), Err(Unanswerable::Error { rcode: Rcode::NotImp, .. })));
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any bytes: the parser answers (never panics), and whatever it
        /// reads as a query is answered within the size bound.
        #[test]
        fn the_parser_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(query) = parse(&bytes) {
                let addresses = vec![IpAddr::from([1, 2, 3, 4]); 40];
                prop_assert!(answer(&query, Rcode::NoError, &addresses, 1).len() <= ANSWER_MAX.max(HEADER_LEN + query.question.len()));
            }
        }
    }
}
