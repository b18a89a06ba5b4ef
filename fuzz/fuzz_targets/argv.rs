//! What the validation pipeline extracts from a command line: the hosts
//! and URLs it names (egress preflight), a redirection, and its paths
//! resolved lexically against a working directory. Arguments are the input
//! split at NUL bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_policy::{egress, paths};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
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
});
