//! Byte fields (a run's stdin, a piece of output) as each encoding carries
//! them best: raw bytes in bincode (a length, then the bytes), a base64
//! string (standard alphabet, padded) in JSON, which every language decodes
//! in one library call, at a third more than the bytes on the wire.

use serde::{Deserializer, Serializer};

pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    #[cfg(feature = "json")]
    if s.is_human_readable() {
        use base64::Engine;
        return s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    serde_bytes::serialize(bytes, s)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    #[cfg(feature = "json")]
    if d.is_human_readable() {
        use base64::Engine;
        let text: String = serde::Deserialize::deserialize(d)?;
        return base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|e| serde::de::Error::custom(format!("not base64: {e}")));
    }
    serde_bytes::deserialize(d)
}
