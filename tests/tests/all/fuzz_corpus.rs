//! Every fuzz target's committed corpus (fuzz/corpus/TARGET), replayed
//! through the target's own property (fuzz/src/lib.rs): an input that
//! found new coverage once is a regression test of its decoder from then on.
//! `scripts/fuzz.sh` is what searches for new inputs (fuzz/README.md).

#[path = "../../../fuzz/src/lib.rs"]
mod properties;

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The inputs of `corpus` whose property panics, by file name.
fn failures(corpus: &Path, property: properties::Property) -> (usize, Vec<String>) {
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(corpus).unwrap().map(|e| e.unwrap().path()).collect();
    inputs.sort();
    let failed = inputs
        .iter()
        .filter(|input| {
            let bytes = std::fs::read(input).unwrap();
            std::panic::catch_unwind(|| property(&bytes)).is_err()
        })
        .map(|input| input.display().to_string())
        .collect();
    (inputs.len(), failed)
}

#[test]
fn every_committed_fuzz_input_still_holds_its_targets_property() {
    let bins = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    let mut named: Vec<&str> =
        bins.lines().filter_map(|l| l.strip_prefix("name = \"")?.strip_suffix('"')).collect();
    named.retain(|n| *n != "palisade-fuzz");
    named.sort();
    let mut replayed: Vec<&str> = properties::TARGETS.iter().map(|(n, _)| *n).collect();
    replayed.sort();
    assert_eq!(named, replayed, "every fuzz target is replayed, and nothing else");
    for (name, property) in properties::TARGETS {
        let (count, failed) = failures(&fuzz_dir().join("corpus").join(name), property);
        assert!(count > 0, "fuzz/corpus/{name} is empty");
        assert!(
            failed.is_empty(),
            "{name}: {} of {count} inputs fail its property: {failed:?}",
            failed.len()
        );
    }
}

/// Counter-test: a property that does not hold is reported, by input.
#[test]
fn a_failing_property_is_reported_by_input() {
    let (count, failed) = failures(&fuzz_dir().join("corpus/dns_query"), |data| assert!(data.is_empty()));
    assert!(count > 0);
    assert_eq!(failed.len(), count, "{failed:?}");
}
