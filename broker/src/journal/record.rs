//! One record of the journal: its canonical bytes, its hash, and the line
//! it is written as (see `docs/journal.md`, which a reviewer's own script
//! can follow).

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The `prev` of the journal's first record: no record came before it.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// A record read back from a line: its place in the chain and its fields.
#[derive(Debug, Clone)]
pub struct Record {
    pub seq: u64,
    pub prev: String,
    pub hash: String,
    /// Every field, `hash` included, as the line has them.
    pub fields: Map<String, Value>,
}

impl Record {
    /// The event's name (`run_finished`, ...).
    pub fn event(&self) -> &str {
        self.fields.get("event").and_then(Value::as_str).unwrap_or("")
    }

    /// The run the record is about, if it is about one.
    pub fn run_id(&self) -> Option<u64> {
        self.fields.get("run_id").and_then(Value::as_u64)
    }
}

/// `value` written canonically: object keys sorted by their UTF-8 bytes, no
/// whitespace, strings and numbers as serde_json writes them (the same bytes
/// as Python's `json.dumps(v, sort_keys=True, separators=(",", ":"),
/// ensure_ascii=False)` for the strings and integers records hold).
pub fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => canonical_map(map, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(v, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

/// An object's canonical bytes (see [`canonical`]).
pub fn canonical_map(map: &Map<String, Value>, out: &mut Vec<u8>) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    out.push(b'{');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_scalar(&Value::String(k.clone()), out);
        out.push(b':');
        canonical(&map[k], out);
    }
    out.push(b'}');
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// sha256 over the previous record's hash (its 32 bytes) followed by the
/// record's canonical bytes without `hash`, as lowercase hex.
pub fn chain_hash(prev: &str, fields: &Map<String, Value>) -> Option<String> {
    let prev = hex_bytes(prev)?;
    let mut bytes = Vec::with_capacity(256);
    let mut without = fields.clone();
    without.remove("hash");
    canonical(&Value::Object(without), &mut bytes);
    let mut h = Sha256::new();
    h.update(prev);
    h.update(&bytes);
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The 32 bytes of a lowercase hex sha256, or `None` if it is not one.
fn hex_bytes(hex: &str) -> Option<Vec<u8>> {
    let lower = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    if hex.len() != 64 || !hex.bytes().all(lower) {
        return None;
    }
    (0..32).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()).collect()
}

/// The line (newline included) of a record with `fields` (without `hash`),
/// and its hash. `None` if `prev` is not a hash.
pub fn seal(mut fields: Map<String, Value>) -> Option<(Vec<u8>, String)> {
    let prev = fields.get("prev").and_then(Value::as_str)?.to_string();
    let hash = chain_hash(&prev, &fields)?;
    fields.insert("hash".into(), Value::String(hash.clone()));
    let mut line = Vec::with_capacity(512);
    canonical(&Value::Object(fields), &mut line);
    line.push(b'\n');
    Some((line, hash))
}

/// Why a line is not a record.
pub fn parse(line: &[u8]) -> Result<Record, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(fields) = value else { return Err("not a JSON object".into()) };
    let text = |k: &str| fields.get(k).and_then(Value::as_str).map(str::to_string);
    let seq = fields.get("seq").and_then(Value::as_u64).ok_or("no seq")?;
    let prev = text("prev").ok_or("no prev")?;
    let hash = text("hash").ok_or("no hash")?;
    if text("event").is_none() {
        return Err("no event".into());
    }
    Ok(Record { seq, prev, hash, fields })
}

/// Seconds since the epoch as RFC 3339 UTC with microseconds
/// (`2026-11-24T02:15:02.123456Z`).
pub fn rfc3339(since_epoch: std::time::Duration) -> String {
    let secs = since_epoch.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let (hh, mm, ss) = (rest / 3600, rest % 3600 / 60, rest % 60);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{:06}Z", since_epoch.subsec_micros())
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A record to write: the event's fields, and whether its caller gets a receipt.
pub struct Entry {
    pub fields: Map<String, Value>,
    pub answered: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_bytes_sort_keys_and_leave_no_space() {
        let v = serde_json::json!({"b": 1, "a": {"z": [1, "x\n\u{1}é"], "y": null}, "é": true});
        let mut out = Vec::new();
        canonical(&v, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":{"y":null,"z":[1,"x\n\u0001é"]},"b":1,"é":true}"#
        );
    }

    #[test]
    fn a_sealed_line_reads_back_with_the_hash_it_was_given() {
        let fields = serde_json::json!({"seq": 1, "prev": GENESIS, "event": "broker_started", "time": "t"});
        let Value::Object(fields) = fields else { unreachable!() };
        let (line, hash) = seal(fields).unwrap();
        let record = parse(&line).unwrap();
        assert_eq!((record.seq, record.hash.as_str()), (1, hash.as_str()));
        assert_eq!(chain_hash(&record.prev, &record.fields), Some(hash));
        assert!(seal(Map::from_iter([("prev".to_string(), Value::from("zz"))])).is_none());
    }

    #[test]
    fn times_are_rfc3339_utc() {
        use std::time::Duration;
        assert_eq!(rfc3339(Duration::from_micros(0)), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339(Duration::new(1_795_918_502, 123_456_789)), "2026-11-29T02:15:02.123456Z");
        assert_eq!(rfc3339(Duration::new(951_782_400, 0)), "2000-02-29T00:00:00.000000Z");
    }
}
