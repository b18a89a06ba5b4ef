//! The client⇄broker framing, in both encodings: whatever bytes a client
//! sends, the decoder returns messages or an error, never panics, and never
//! buffers past its limit. Every message it returns encodes and decodes back
//! to itself in both encodings, and a first message that is a hello is
//! checked as the broker checks it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_protocol::wire::{ClientMessage, Decoder, Encoding, ServerMessage, encode};

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

fuzz_target!(|data: &[u8]| {
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
});
