//! The size of a record: no line of the journal is longer than
//! [`MAX_RECORD_BYTES`], and a refused request's are at most
//! [`REFUSAL_RECORD_BYTES`] (see `docs/journal.md`). A refused request is
//! recorded in a bounded form (counts, sizes, sha256 and the first bytes of
//! its variable-size fields), and any record that would still be longer than
//! its bound is clipped: its long strings cut, its long lists shortened,
//! with the size and sha256 of what it would have been.

use super::record;
use serde_json::{Map, Value};

/// The longest line (newline included) of any record: a run's record keeps
/// its argv whole within the policy's default limits (128 arguments of 4096
/// bytes: 512 KiB), twice over for JSON's escapes.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// The longest line of a refused request's records (and of a
/// `refusals_summarized`): a refusal costs its client next to nothing, so
/// what it leaves in the journal is small. The bounded form of a request
/// whose every list is full (printable text) fits whole.
pub const REFUSAL_RECORD_BYTES: usize = 16 << 10;

/// What the fields every record gets from the writer (`seq`, `time`,
/// `prev`, `broker`, `hash`, the newline) take at most: keys, a u64, a
/// timestamp, two hashes and an instance tag (`<pid>-<start time>`).
const CHAIN_FIELDS_BYTES: usize = 320;

/// The first bytes of each variable-size field a bounded form keeps.
pub const HEAD_BYTES: usize = 64;

/// How many items of a list a bounded form shows the first bytes of.
pub const LISTED: usize = 16;

/// A string in bounded form: its size, its sha256, its first bytes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Text {
    pub bytes: u64,
    pub sha256: String,
    pub head: String,
}

/// A list of strings in bounded form: how many, their size together, the
/// sha256 of the list (its canonical JSON), the first bytes of the first
/// [`LISTED`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Texts {
    pub count: u64,
    pub bytes: u64,
    pub sha256: String,
    pub heads: Vec<String>,
}

impl Text {
    pub fn of(s: &str) -> Text {
        Text {
            bytes: s.len() as u64,
            sha256: crate::journal::attest::sha256_hex(s.as_bytes()),
            head: head(s, HEAD_BYTES),
        }
    }
}

impl Texts {
    pub fn of<S: AsRef<str>>(items: &[S]) -> Texts {
        let list = Value::Array(items.iter().map(|s| Value::from(s.as_ref())).collect());
        let mut canonical = Vec::new();
        record::canonical(&list, &mut canonical);
        Texts {
            count: items.len() as u64,
            bytes: items.iter().map(|s| s.as_ref().len() as u64).sum(),
            sha256: crate::journal::attest::sha256_hex(&canonical),
            heads: items.iter().take(LISTED).map(|s| head(s.as_ref(), HEAD_BYTES)).collect(),
        }
    }
}

/// The first `max` bytes of `s`, cut back to a character's start.
pub fn head(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The line length of a record with `fields` (the writer's fields at their longest).
fn line_bytes(fields: &Map<String, Value>) -> usize {
    let mut out = Vec::with_capacity(512);
    record::canonical_map(fields, &mut out);
    out.len() + CHAIN_FIELDS_BYTES
}

/// How a record too long for its bound is clipped, tried in turn: each
/// string cut to this many bytes and each list (or nested object) to this
/// many items; past the last, only the record's numbers, booleans and
/// short strings stay.
const CLIPS: [(usize, usize); 2] = [(HEAD_BYTES, LISTED), (16, 4)];

/// `fields`, or when its line would be longer than `limit`, the same
/// clipped to fit, with `clipped`: the size and sha256 of the canonical
/// bytes it would have had.
pub fn bounded(fields: Map<String, Value>, limit: usize) -> Map<String, Value> {
    if line_bytes(&fields) <= limit {
        return fields;
    }
    let mut canonical = Vec::new();
    record::canonical_map(&fields, &mut canonical);
    let clipped = serde_json::json!({
        "bytes": canonical.len(),
        "sha256": crate::journal::attest::sha256_hex(&canonical),
    });
    for (text, items) in CLIPS {
        let mut short: Map<String, Value> =
            fields.iter().map(|(k, v)| (k.clone(), clip(v, text, items))).collect();
        short.insert("clipped".into(), clipped.clone());
        if line_bytes(&short) <= limit {
            return short;
        }
    }
    // The event's name and its scalars (ids, counts): a few dozen bytes each.
    let event = head(fields.get("event").and_then(Value::as_str).unwrap_or(""), HEAD_BYTES);
    let mut bare: Map<String, Value> = fields
        .into_iter()
        .filter(|(_, v)| matches!(v, Value::Number(_) | Value::Bool(_) | Value::Null))
        .collect();
    bare.insert("event".into(), Value::from(event));
    bare.insert("clipped".into(), clipped);
    bare
}

/// `value` with every string cut to `text` bytes and every list or object
/// (below the record itself) to its first `items`.
fn clip(value: &Value, text: usize, items: usize) -> Value {
    match value {
        Value::String(s) => Value::from(head(s, text)),
        Value::Array(list) => Value::Array(list.iter().take(items).map(|v| clip(v, text, items)).collect()),
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let kept = keys.into_iter().take(items);
            Value::Object(kept.map(|k| (head(k, text), clip(&map[k], text, items))).collect())
        }
        scalar => scalar.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Event, fields};

    fn line(fields: Map<String, Value>) -> usize {
        let mut with = fields;
        // The writer's fields at their longest.
        with.insert("seq".into(), Value::from(u64::MAX));
        with.insert("time".into(), Value::from("2026-11-24T02:22:27.349380Z"));
        with.insert("prev".into(), Value::from(record::GENESIS));
        with.insert("broker".into(), Value::from(format!("{}-{}", u32::MAX, u64::MAX)));
        record::seal(with).unwrap().0.len()
    }

    #[test]
    fn a_record_too_long_for_its_bound_is_clipped_and_says_what_it_was() {
        // Every character escapes to six bytes: the worst a string can do.
        let nasty = "\u{1}".repeat(20_000);
        let event = Event::RequestReceived {
            run_id: 7,
            uid: 1000,
            gid: 1000,
            pid: Some(42),
            tool: Some(nasty.clone()),
            argv: vec![nasty.clone(); 10],
            workspace: Some(nasty.clone()),
        };
        let whole = fields(&event);
        assert!(line(whole.clone()) > MAX_RECORD_BYTES);
        for limit in [MAX_RECORD_BYTES, REFUSAL_RECORD_BYTES, 600] {
            let short = bounded(whole.clone(), limit);
            assert!(line(short.clone()) <= limit, "{limit}: {}", line(short.clone()));
            assert_eq!(short["event"], "request_received");
            assert_eq!(short["run_id"], 7);
            let mut canonical = Vec::new();
            record::canonical(&Value::Object(whole.clone()), &mut canonical);
            assert_eq!(short["clipped"]["bytes"], canonical.len());
            assert_eq!(short["clipped"]["sha256"], crate::journal::attest::sha256_hex(&canonical));
        }
        // A refusal's bound keeps the first bytes of the first arguments.
        let short = bounded(whole.clone(), REFUSAL_RECORD_BYTES);
        assert!(short["argv"].as_array().is_some_and(|a| !a.is_empty()), "{short:?}");
    }

    #[test]
    fn a_record_within_its_bound_is_left_whole() {
        let event = Event::RequestReceived {
            run_id: 1,
            uid: 1000,
            gid: 1000,
            pid: None,
            tool: None,
            argv: vec!["a".repeat(4096); 128],
            workspace: Some("/home/u/ws".into()),
        };
        let whole = fields(&event);
        assert!(line(whole.clone()) > REFUSAL_RECORD_BYTES);
        assert_eq!(bounded(whole.clone(), MAX_RECORD_BYTES), whole);
        assert!(!bounded(whole.clone(), MAX_RECORD_BYTES).contains_key("clipped"));
        // The same in a refusal's bound is not whole.
        assert!(bounded(whole, REFUSAL_RECORD_BYTES).contains_key("clipped"));
    }

    #[test]
    fn a_refused_request_at_its_largest_fits_its_bound_whole() {
        use palisade_protocol::wire::{ParamValue, RunRequest};
        let long = |c: char| c.to_string().repeat(5_000);
        let many = |c: char| vec![long(c); 100];
        let request = RunRequest {
            argv: many('a'),
            env: (0..100).map(|i| (format!("{i}{}", long('E')), long('v'))).collect(),
            cwd: Some(long('c')),
            workspace: Some(long('w')),
            stdin: vec![0; 1 << 20],
            tool: Some(long('t')),
            params: (0..20).map(|i| (format!("{i}{}", long('p')), ParamValue::Many(many('v')))).collect(),
            allow_domains: Some(many('d')),
            profile: Some(long('f')),
            read_only: many('r'),
            read_write: many('w'),
            pass_env: many('P'),
            ..Default::default()
        };
        let event = crate::journal::events::refused(u64::MAX, (u32::MAX, u32::MAX, Some(i32::MAX)), &request);
        let whole = fields(&event);
        assert!(line(whole.clone()) <= REFUSAL_RECORD_BYTES, "{}", line(whole.clone()));
        assert_eq!(bounded(whole.clone(), REFUSAL_RECORD_BYTES), whole);
        assert_eq!(whole["argv"]["count"], 100);
        assert_eq!(whole["argv"]["bytes"], 500_000);
        assert_eq!(whole["env_values_bytes"], 500_000);
        assert_eq!(whole["param_values_bytes"], 10_000_000);
        assert_eq!(whole["stdin_bytes"], 1 << 20);
        assert_eq!(whole["argv"]["heads"][0], "a".repeat(HEAD_BYTES));
    }

    #[test]
    fn texts_are_cut_at_a_character_and_hash_what_python_hashes() {
        assert_eq!(head("éé", 3), "é");
        let t = Texts::of(&["a", "é"]);
        assert_eq!((t.count, t.bytes), (2, 3));
        // python3 -c 'import hashlib,json;print(hashlib.sha256(json.dumps(["a","é"],
        //   separators=(",",":"),ensure_ascii=False).encode()).hexdigest())'
        assert_eq!(t.sha256, crate::journal::attest::sha256_hex("[\"a\",\"é\"]".as_bytes()));
        let long: Vec<String> = (0..100).map(|i| format!("{i}{}", "x".repeat(100))).collect();
        let t = Texts::of(&long);
        assert_eq!(t.heads.len(), LISTED);
        assert!(t.heads.iter().all(|h| h.len() == HEAD_BYTES));
    }
}
