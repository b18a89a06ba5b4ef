//! What a broker that died left unsaid in its journal, found at the next
//! daemon's start: each instance (a record's `broker` tag) of the journal's
//! last segment whose process is gone, with the runs it started and never
//! ended, and whether it had started serving and never said it stopped.
//! The records that say so (`run_lost`, `broker_lost`) are read too, so
//! that each loss is recorded once.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

/// An instance that is gone: its tag, the runs it left unfinished, and
/// whether it was a daemon that never recorded its stop.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Lost {
    pub broker: String,
    pub runs: Vec<u64>,
    pub unclean: bool,
}

/// The fields of a record this reads.
#[derive(serde::Deserialize)]
struct Line {
    event: String,
    broker: Option<String>,
    run_id: Option<u64>,
    lost: Option<String>,
}

/// What an instance did, as far as the segment says.
#[derive(Default)]
struct Seen {
    started: bool,
    stopped: bool,
    open: Vec<u64>,
}

/// The instances of the last segment of the journal in `dir` whose process
/// is gone and whose loss is not recorded yet, oldest first. A line that
/// does not read is passed over (the chain's check is `palisade audit
/// verify`'s, not this).
pub fn lost(dir: &Path) -> Vec<Lost> {
    let Some((_, last)) = super::segment::segments(dir).ok().and_then(|s| s.into_iter().last()) else {
        return Vec::new();
    };
    let Ok(file) = std::fs::File::open(last) else { return Vec::new() };
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        let Ok(l) = serde_json::from_str::<Line>(&line) else { continue };
        // A loss recorded already ends what it names.
        if let Some(lost) = &l.lost {
            let s = seen.entry(lost.clone()).or_default();
            match l.event.as_str() {
                "run_lost" => s.open.retain(|r| Some(*r) != l.run_id),
                "broker_lost" => s.stopped = true,
                _ => {}
            }
            continue;
        }
        let Some(tag) = l.broker else { continue };
        if !seen.contains_key(&tag) {
            order.push(tag.clone());
        }
        let s = seen.entry(tag).or_default();
        match (l.event.as_str(), l.run_id) {
            ("broker_started", _) => s.started = true,
            ("broker_stopped", _) => s.stopped = true,
            ("run_started", Some(id)) => s.open.push(id),
            ("run_finished", Some(id)) => s.open.retain(|r| *r != id),
            _ => {}
        }
    }
    let mut found = Vec::new();
    for tag in order {
        let s = &seen[&tag];
        let unclean = s.started && !s.stopped;
        if (unclean || !s.open.is_empty()) && !crate::host::instance::alive(&tag) {
            found.push(Lost { broker: tag, runs: s.open.clone(), unclean });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_instances_unfinished_runs_and_missing_stop_are_found_once() {
        let dir = std::env::temp_dir().join(format!("palisade-crash-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let me = crate::host::instance::tag();
        let lines = [
            r#"{"event":"broker_started","broker":"1-1"}"#.to_string(),
            r#"{"event":"run_started","broker":"1-1","run_id":1}"#.into(),
            r#"{"event":"run_started","broker":"1-1","run_id":2}"#.into(),
            r#"{"event":"run_finished","broker":"1-1","run_id":1}"#.into(),
            // An embedded broker that ended cleanly, and one that is alive (this process).
            r#"{"event":"run_started","broker":"2-2","run_id":1}"#.into(),
            r#"{"event":"run_finished","broker":"2-2","run_id":1}"#.into(),
            format!(r#"{{"event":"run_started","broker":"{me}","run_id":1}}"#),
            "not json".into(),
        ];
        let segment = dir.join("segment-00000000000000000001.jsonl");
        std::fs::write(&segment, lines.join("\n") + "\n").unwrap();
        assert_eq!(lost(&dir), [Lost { broker: "1-1".into(), runs: vec![2], unclean: true }]);
        // Once recorded, found no more.
        let recorded = r#"{"event":"run_lost","broker":"9-9","lost":"1-1","run_id":2}
{"event":"broker_lost","broker":"9-9","lost":"1-1"}
"#;
        std::fs::write(&segment, lines.join("\n") + "\n" + recorded).unwrap();
        assert_eq!(lost(&dir), []);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
