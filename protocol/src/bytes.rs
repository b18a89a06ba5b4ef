//! Byte fields (a run's stdin, a piece of output) as each encoding carries
//! them best. In bincode: a length, then the bytes. In JSON: a string when
//! the bytes are text ([`as_text`]: UTF-8 without control characters but
//! tab, newline and carriage return), which a client reads as it reads any
//! string; anything else as `{"base64": "..."}` (the standard alphabet,
//! padded). A reader takes either form.

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserializer, Serializer};
use std::fmt;

/// The bytes as the text JSON carries them as a plain string, if they are such text.
pub fn as_text(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    let control = |b: &u8| (*b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r')) || *b == 0x7f;
    (!text.as_bytes().iter().any(control)).then_some(text)
}

pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    #[cfg(feature = "json")]
    if s.is_human_readable() {
        use base64::Engine;
        use serde::ser::SerializeMap;
        if let Some(text) = as_text(bytes) {
            return s.serialize_str(text);
        }
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry("base64", &base64::engine::general_purpose::STANDARD.encode(bytes))?;
        return map.end();
    }
    serde_bytes::serialize(bytes, s)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    if d.is_human_readable() {
        return d.deserialize_any(TextOrBase64);
    }
    serde_bytes::deserialize(d)
}

struct TextOrBase64;

impl<'de> Visitor<'de> for TextOrBase64 {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a string (the bytes as UTF-8 text) or {"base64": "..."}"#)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u8>, E> {
        Ok(text.as_bytes().to_vec())
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Vec<u8>, E> {
        Ok(text.into_bytes())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<u8>, A::Error> {
        let Some((key, value)) = map.next_entry::<String, String>()? else {
            return Err(de::Error::custom(r#"expected {"base64": "..."}, found an empty object"#));
        };
        if key != "base64" || map.next_key::<String>()?.is_some() {
            return Err(de::Error::custom(r#"expected {"base64": "..."}: one key, base64"#));
        }
        decode_base64(&value).map_err(de::Error::custom)
    }
}

#[cfg(feature = "json")]
fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| format!("not base64: {e}"))
}

#[cfg(not(feature = "json"))]
fn decode_base64(_: &str) -> Result<Vec<u8>, String> {
    Err("base64 is read only with the JSON encoding".into())
}
