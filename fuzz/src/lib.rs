//! What each fuzz target checks of one input (`fuzz/fuzz_targets/`, built
//! and run by `scripts/fuzz.sh`). A property panics where it does not
//! hold. The test suite replays every committed corpus through these same
//! functions (tests/tests/all/fuzz_corpus.rs), so a decoder's regression on
//! a known input fails `cargo test` too.

use palisade_policy::{Config, Manifest, egress, paths};
use palisade_protocol::plan::{PLAN_ARCH, PLAN_MAGIC, PLAN_VERSION};
use palisade_protocol::wire::{ClientMessage, Decoder, Encoding, ServerMessage, encode};
use palisade_protocol::{decode_plan, encode_plan};
use std::path::Path;

/// A target's property of one input: panics where it does not hold.
pub type Property = fn(&[u8]);

/// Every target, by name: its property.
pub const TARGETS: [(&str, Property); 8] = [
    ("frame", frame),
    ("jail_plan", jail_plan),
    ("policy_toml", policy_toml),
    ("argv", argv),
    ("dns_query", dns_query),
    ("client_hello", client_hello),
    ("proxy_request", proxy_request),
    ("plugin_manifest", plugin_manifest),
];

/// Decodes `bytes` as a stream of messages of type `T`, fed in two pieces.
fn messages<T: serde::de::DeserializeOwned>(encoding: Option<Encoding>, bytes: &[u8]) -> Vec<T> {
    let mut decoder = Decoder::new(encoding);
    let split = bytes.len() / 2;
    let mut out = Vec::new();
    for piece in [&bytes[..split], &bytes[split..]] {
        decoder.push(piece);
        while let Ok(Some(m)) = decoder.next_message::<T>() {
            out.push(m);
        }
    }
    let _ = decoder.finish();
    out
}

fn round_trips(m: &ClientMessage) {
    for encoding in [Encoding::Bincode, Encoding::Json] {
        let bytes = encode(m, encoding).expect("a decoded message encodes");
        let mut decoder = Decoder::new(Some(encoding));
        decoder.push(&bytes);
        let back: ClientMessage = decoder.next_message().expect("decodes").expect("whole");
        assert_eq!(&back, m, "{encoding:?}");
    }
}

/// The client⇄broker framing, in both encodings: whatever bytes a client
/// sends, the decoder returns messages or an error, never panics, and never
/// buffers past its limit. Every message it returns encodes and decodes back
/// to itself in both encodings, and a first message that is a hello is
/// checked as the broker checks it. The first byte picks the encoding.
pub fn frame(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else { return };
    let encoding = match selector % 3 {
        0 => None,
        1 => Some(Encoding::Bincode),
        _ => Some(Encoding::Json),
    };
    let decoded: Vec<ClientMessage> = messages(encoding, bytes);
    if let Some(ClientMessage::Hello(h)) = decoded.first() {
        let _ = palisade_broker::serve::socket::check_hello(h, encoding.unwrap_or(Encoding::Bincode));
    }
    for m in &decoded {
        round_trips(m);
    }
    // What a client decodes from a broker: the same decoder, the other type,
    // with output frames read in place as the client reads them.
    let _: Vec<ServerMessage> = messages(encoding, bytes);
    let mut decoder = Decoder::new(Some(Encoding::Bincode));
    decoder.push(bytes);
    loop {
        if decoder.next_output().is_some() {
            continue;
        }
        if decoder.take_output_start(1, |_| true).is_some() {
            break;
        }
        match decoder.next_message::<ServerMessage>() {
            Ok(Some(_)) => {}
            _ => break,
        }
    }
}

/// The plan the helper reads from the broker: decoded and checked
/// (`JailPlan::check`), never a panic, whatever the bytes. A plan that
/// decodes and passes its checks encodes back to the same plan. Half the
/// inputs get a valid header (magic, version, architecture) in front, so
/// that the fuzzer spends its time on the body rather than the magic.
pub fn jail_plan(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else { return };
    let bytes = if selector % 2 == 0 {
        let mut b = PLAN_MAGIC.to_vec();
        b.extend_from_slice(&PLAN_VERSION.to_be_bytes());
        b.push(PLAN_ARCH.len() as u8);
        b.extend_from_slice(PLAN_ARCH.as_bytes());
        b.extend_from_slice(rest);
        b
    } else {
        rest.to_vec()
    };
    let Ok(plan) = decode_plan(&bytes) else { return };
    if plan.check().is_ok() {
        let encoded = encode_plan(&plan).expect("a checked plan encodes");
        assert_eq!(decode_plan(&encoded).expect("and decodes"), plan);
    }
}

/// The policy file: any text is a configuration or an error with its
/// position, never a panic.
pub fn policy_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = Config::parse(text, Path::new("fuzz.toml"));
}

/// What the validation pipeline extracts from a command line: the hosts
/// and URLs it names (egress preflight), a redirection, and its paths
/// resolved lexically against a working directory. Arguments are the input
/// split at NUL bytes.
pub fn argv(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let argv: Vec<String> = text.split('\0').map(String::from).collect();
    for host in egress::hosts_in(&argv) {
        let _ = egress::allowed(&host, &["example.org".into(), "*.example.com".into()]);
    }
    let _ = egress::redirection(&argv);
    for a in &argv {
        let p = paths::resolve_lexically(a, Path::new("/work/ws"), Some(Path::new("/home/u")));
        let _ = paths::within(&p, Path::new("/work/ws"));
    }
}

/// What a sandboxed command sends the broker's strict-egress listeners
/// (broker/src/egress/), here a DNS message to the sandbox's resolver: parsed, or refused, never a panic.
pub fn dns_query(data: &[u8]) {
    let _ = palisade_broker::egress::fuzzing::dns_query(data);
}

/// What a sandboxed command sends the broker's strict-egress listeners
/// (broker/src/egress/), here a TLS ClientHello, through the proxy or a transparent listener: parsed, or refused, never a panic.
pub fn client_hello(data: &[u8]) {
    let _ = palisade_broker::egress::fuzzing::client_hello(data);
}

/// What a sandboxed command sends the broker's strict-egress listeners
/// (broker/src/egress/), here an HTTP request head to the proxy: parsed, or refused, never a panic.
pub fn proxy_request(data: &[u8]) {
    let _ = palisade_broker::egress::fuzzing::proxy_request(data);
}

/// A skill's manifest (TOML): a manifest or an error, never a panic.
pub fn plugin_manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = Manifest::parse(text, Path::new("fuzz-skill.toml"));
}
