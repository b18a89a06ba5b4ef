//! docs/protocol.md is what a client in another language is written from:
//! every JSON example in it must be a message the protocol reads, with no
//! field it does not know and none of the wrong type (each is decoded as
//! the message it shows, encoded again, and must be found whole in what
//! comes out), and the documented Python client must run against a real
//! broker, exchanging the document's hello, a run and its messages, its
//! output raw after each line (`raw_output`). ARCHITECTURE.md, what a
//! newcomer reads first, names only files and items that exist, and the
//! floors it draws hold: no crate imports in a circle.

use palisade_protocol::wire::{
    ClientMessage, Decoder, Encoding, ServerMessage, Stream, encode, raw_output_header,
};
use palisade_tests::*;
use serde_json::Value;
use std::path::Path;

/// Each JSON value of the document's ```json blocks, with its line.
fn examples() -> Vec<(usize, Value)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/protocol.md")).unwrap();
    let mut out = Vec::new();
    let mut block: Option<(usize, String)> = None;
    for (n, line) in doc.lines().enumerate() {
        match (&mut block, line.trim()) {
            (None, "```json") => block = Some((n + 2, String::new())),
            (Some((first, text)), "```") => {
                let values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
                for v in values {
                    out.push((
                        *first,
                        v.unwrap_or_else(|e| panic!("protocol.md, block at line {first}: {e}")),
                    ));
                }
                block = None;
            }
            (Some((_, text)), _) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, _) => {}
        }
    }
    out
}

/// Whether everything in `part` is in `whole`, the same (objects may
/// have more keys in `whole`: the fields an example leaves out).
fn within(part: &Value, whole: &Value) -> bool {
    match (part, whole) {
        (Value::Object(p), Value::Object(w)) => p.iter().all(|(k, v)| w.get(k).is_some_and(|x| within(v, x))),
        (Value::Array(p), Value::Array(w)) => {
            p.len() == w.len() && p.iter().zip(w).all(|(a, b)| within(a, b))
        }
        (Value::Object(p), Value::Null) => p.values().all(|v| v.is_null()),
        _ => part == whole,
    }
}

/// The example read as a message of type `M`, and written again.
fn reread<M: serde::de::DeserializeOwned + serde::Serialize>(example: &Value) -> Result<Value, String> {
    let mut d = Decoder::new(Some(Encoding::Json));
    d.push(format!("{example}\n").as_bytes());
    let message: M = d.next_message().map_err(|e| e.to_string())?.ok_or("incomplete")?;
    let line = encode(&message, Encoding::Json).map_err(|e| e.to_string())?;
    serde_json::from_slice(&line).map_err(|e| e.to_string())
}

#[test]
fn every_json_example_in_the_protocol_document_is_a_message() {
    let examples = examples();
    assert!(
        examples.len() >= 20,
        "only {} examples found: is the document's layout changed?",
        examples.len()
    );
    for (line, example) in &examples {
        // The line announcing raw output (a run's `raw_output`) is no message of its own.
        if let Some(n) = example["output"]["bytes"].as_u64() {
            let stream =
                if example["output"]["stream"] == "stderr" { Stream::Stderr } else { Stream::Stdout };
            let header: Value = serde_json::from_slice(&raw_output_header(stream, n as usize)).unwrap();
            assert_eq!(&header, example, "protocol.md, block at line {line}");
            continue;
        }
        let client = reread::<ClientMessage>(example);
        let server = reread::<ServerMessage>(example);
        let fits = |r: &Result<Value, String>| r.as_ref().is_ok_and(|v| within(example, v));
        assert!(
            fits(&client) || fits(&server),
            "protocol.md, block at line {line}: {example}\n as a client message: {client:?}\n as a broker message: {server:?}"
        );
    }
}

/// The test above can fail: a misspelt field or a wrong type is caught.
#[test]
fn a_wrong_example_would_be_caught() {
    for bad in [
        r#"{"run": {"argv": ["ls"], "cwd": "/", "timeout_sec": 3}}"#,
        r#"{"output": {"stream": "stdout", "data": [104, 105]}}"#,
        r#"{"finished": {"run_id": 7, "status": {"exited": {"code": 0}}, "wall_time": 4}}"#,
    ] {
        let v: Value = serde_json::from_str(bad).unwrap();
        let client = reread::<ClientMessage>(&v).is_ok_and(|r| within(&v, &r));
        let server = reread::<ServerMessage>(&v).is_ok_and(|r| within(&v, &r));
        assert!(!client && !server, "{bad} passed");
    }
}

#[test]
fn the_documented_python_client_runs_against_a_broker() {
    let d = Daemon::start("");
    let ws = TempDir::new("doc");
    std::fs::write(ws.join("bytes"), b"a\xffb\n").unwrap();
    let o = python_client(&[])
        .args(["--socket", d.socket.to_str().unwrap(), "--", "cat", "bytes"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert_eq!(o.stdout, b"a\xffb\n", "{}", text(&o.stderr));
    assert_eq!(o.status.code(), Some(0));
    // Large output, raw after its lines (spliced by the broker), every byte in place.
    let big = pattern(3 << 20, 7);
    std::fs::write(ws.join("big"), &big).unwrap();
    let o = python_client(&[])
        .args(["--socket", d.socket.to_str().unwrap(), "--", "cat", "big", "bytes"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert!(o.stdout.len() == big.len() + 4 && o.stdout.starts_with(&big), "{}", text(&o.stderr));
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_protocol_document_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_protocol_document_suite_passes_as_an_unprivileged_user");
}

/// Every file of the project, relative to its root (no `target/`, no `.git`).
fn project_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "target" || name.starts_with('.') && name != ".ci" {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                out.push(format!("{rel}/"));
                dirs.push(path);
            } else {
                out.push(rel);
            }
        }
    }
    out
}

/// The `code spans` of a Markdown text.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).filter(|s| !s.is_empty() && !s.contains('\n')).collect()
}

/// Whether some Rust source defines `name` (a function, type, trait, module, constant or variant).
fn defined(sources: &[String], name: &str) -> bool {
    let kinds = ["fn ", "struct ", "enum ", "trait ", "mod ", "type ", "const ", "static "];
    sources.iter().any(|s| {
        kinds.iter().any(|k| s.contains(&format!("{k}{name}")))
            || s.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with(name) && l[name.len()..].starts_with([' ', ',', '(', '{'])
            })
    })
}

/// ARCHITECTURE.md names only what exists: each file or folder it names
/// (whole, or relative to a folder it describes) is in the project, and
/// each `module::Item` or `Type::item` is defined in its Rust sources.
fn architecture_misses(doc: &str, files: &[String], sources: &[String]) -> Vec<String> {
    let mut missing = Vec::new();
    for span in code_spans(doc) {
        let is_path = span.ends_with('/') || [".rs", ".md", ".sh", ".toml"].iter().any(|e| span.ends_with(e));
        let pattern = span.contains([' ', '*', '<']);
        if is_path && !span.starts_with('/') && !pattern {
            let found = files.iter().any(|f| f == span || f.ends_with(&format!("/{span}")));
            if !found {
                missing.push(span.to_string());
            }
        } else if let Some((owner, item)) = span.split_once("::") {
            let ident = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if ident(owner) && ident(item) && !(defined(sources, owner) && defined(sources, item)) {
                missing.push(span.to_string());
            }
        }
    }
    missing
}

#[test]
fn the_architecture_document_names_only_files_and_items_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let files = project_files(&root);
    let sources: Vec<String> = files
        .iter()
        .filter(|f| f.ends_with(".rs"))
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
        .collect();
    let missing = architecture_misses(&doc, &files, &sources);
    assert!(missing.is_empty(), "ARCHITECTURE.md names what is not in the project: {missing:?}");
    // The check could fail: a renamed file and a removed item are caught.
    let stale = "`broker/src/no_such_room.rs` holds `Broker::no_such_step`";
    assert_eq!(
        architecture_misses(stale, &files, &sources),
        ["broker/src/no_such_room.rs", "Broker::no_such_step"]
    );
}

/// A crate's modules as paths of names (`["engine", "run"]`), each with its
/// source, less what only tests compile: files declared under a `cfg(test)`
/// and each file's `#[cfg(test)] mod tests { ... }` at its end.
fn modules(root: &Path, files: &[String], krate: &str) -> Vec<(Vec<String>, String)> {
    let src = format!("{krate}/src/");
    let files = files.iter().filter_map(|f| f.strip_prefix(&src).filter(|f| f.ends_with(".rs")));
    let files: Vec<&str> = files.filter(|f| !f.starts_with("bin/")).collect();
    let mut test_only = std::collections::HashSet::new();
    let mut out = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(root.join(&src).join(file)).unwrap();
        let mut name: Vec<String> = file.trim_end_matches(".rs").split('/').map(String::from).collect();
        if ["mod", "lib", "main"].contains(&name.last().unwrap().as_str()) {
            name.pop();
        }
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            let declared = pair[1].strip_prefix("pub ").unwrap_or(pair[1]);
            let declared = declared.strip_prefix("pub(crate) ").unwrap_or(declared);
            if let Some(m) = declared.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                if pair[0].starts_with("#[cfg(") && pair[0].contains("test") {
                    test_only.insert([name.clone(), vec![m.to_string()]].concat());
                }
            }
        }
        let code = text.split("#[cfg(test)]\nmod tests {").next().unwrap();
        let code: String =
            code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
        out.push((name, code));
    }
    out.retain(|(name, _)| !(1..=name.len()).any(|n| test_only.contains(&name[..n])));
    out
}

/// The imports between a crate's modules, `depth` names deep (1: its
/// top-level modules and folders; 2: the modules in those): `crate::a::b`,
/// `crate::{a, b}`, and `super::x` of a module in a folder.
fn imports(modules: &[(Vec<String>, String)], depth: usize) -> Vec<(String, String)> {
    let ident =
        |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut edges = Vec::new();
    for (name, code) in modules {
        if name.is_empty() {
            continue;
        }
        let me = name[..depth.min(name.len())].join("/");
        let mut targets: Vec<Vec<String>> = Vec::new();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                targets.extend(group.split(',').map(|g| vec![ident(g.trim())]));
            } else {
                targets.push(rest.split("::").take(depth).map(ident).collect());
            }
        }
        if name.len() > 1 {
            for (i, _) in code.match_indices("super::") {
                let parent = &name[..name.len() - 1];
                targets.push([parent.to_vec(), vec![ident(&code[i + "super::".len()..])]].concat());
            }
        }
        for t in targets {
            let t: Vec<String> = t.into_iter().take(depth).filter(|s| !s.is_empty()).collect();
            let t = t.join("/");
            if !t.is_empty()
                && t != me
                && !me.starts_with(&format!("{t}/"))
                && !t.starts_with(&format!("{me}/"))
            {
                edges.push((me.clone(), t));
            }
        }
    }
    edges.sort();
    edges.dedup();
    edges
}

/// A cycle among the edges, as the path around it, if there is one.
fn a_cycle(edges: &[(String, String)]) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &[(String, String)],
        path: &mut Vec<String>,
        done: &mut std::collections::HashSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some([&path[at..], &[node.to_string()]].concat());
        }
        if !done.insert(node.to_string()) {
            return None;
        }
        path.push(node.to_string());
        for (_, to) in edges.iter().filter(|(from, _)| from == node) {
            if let Some(cycle) = visit(to, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = std::collections::HashSet::new();
    edges.iter().find_map(|(from, _)| visit(from, edges, &mut Vec::new(), &mut done))
}

/// No crate imports in a circle: not its top-level modules and folders (the
/// broker's rooms, on the floors ARCHITECTURE.md draws), nor the modules in
/// them.
#[test]
fn no_crate_has_an_import_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = project_files(&root);
    for krate in ["protocol", "policy", "helper", "broker", "cli", "plugins"] {
        let modules = modules(&root, &files, krate);
        assert!(modules.len() > 3, "{krate}: {} modules", modules.len());
        // A crate whose modules are all in one folder (the helper's `jail/`)
        // has its imports one level down.
        let tops: std::collections::BTreeSet<&String> =
            modules.iter().filter(|(name, _)| name.len() > 1).map(|(name, _)| &name[0]).collect();
        for depth in [1, 2] {
            let edges = imports(&modules, depth);
            assert!(!edges.is_empty() || depth == 1 && tops.len() == 1, "{krate}: no imports found");
            let cycle = a_cycle(&edges);
            assert!(cycle.is_none(), "{krate} imports in a circle: {}", cycle.unwrap().join(" -> "));
        }
    }
    // The check could fail: a room that imports from a room above it is caught.
    let rooms = |edge: (&str, &str)| {
        vec![
            (vec!["serve".to_string(), "server".into()], "use crate::decide::service::Broker;".to_string()),
            (vec!["decide".into(), "service".into()], "use crate::engine::run::Engine;".into()),
            (vec![edge.0.into()], edge.1.into()),
        ]
    };
    assert_eq!(a_cycle(&imports(&rooms(("host", "use crate::{error, journal};")), 1)), None);
    let cycle = a_cycle(&imports(&rooms(("engine", "use crate::serve::socket::Frame;")), 1));
    assert_eq!(cycle.map(|c| c.join(" -> ")).as_deref(), Some("decide -> engine -> serve -> decide"));
}

/// The list of rules in docs/protocol.md is complete: every rule the
/// policy and the broker can give (the rule argument of each refusal they
/// make: `Denial::new`, `deny`, `denied`, `with_rule`, and the `*_RULE`
/// constants) is in it. The check could fail: a rule it does not list is
/// found.
#[test]
fn the_protocol_lists_every_rule_the_code_can_give() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/protocol.md")).unwrap();
    let start = doc.find("The rules (`rule`) are:").expect("the rules' paragraph");
    let listed = &doc[start..start + doc[start..].find("\n\n").unwrap()];
    let mut rules = std::collections::BTreeSet::new();
    let sources = project_files(&root).into_iter().filter(|f| f.ends_with(".rs"));
    for file in sources.filter(|f| f.starts_with("policy/src/") || f.starts_with("broker/src/")) {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        rules.extend(rules_in(&text));
    }
    assert!(rules.len() > 40, "{rules:?}");
    let missing: Vec<&String> = rules.iter().filter(|r| !listed.contains(&format!("`{r}`"))).collect();
    assert!(missing.is_empty(), "docs/protocol.md does not list the rules {missing:?}");
    let made_up = "return denied(ErrorKind::PolicyDenied,\n \"nowhere.listed\", \"why\");";
    assert_eq!(rules_in(made_up), ["nowhere.listed"]);
}

/// The rules `text` gives: the literals shaped like a rule (`word.word`)
/// among the arguments of each refusal it makes, and its `*_RULE` constants.
fn rules_in(text: &str) -> Vec<String> {
    let mut out = rules_in_calls(text, &["Denial::new(", "deny(", "denied(", "with_rule("]);
    for line in text.lines().filter(|l| l.contains("_RULE: &str")) {
        out.extend(rule_literals(line));
    }
    out
}

/// The string literals in `text` shaped like a rule (`word.word`).
fn rule_literals(text: &str) -> Vec<String> {
    let shaped = |s: &str| {
        let mut parts = s.split('.');
        let ok = |p: Option<&str>| {
            p.is_some_and(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        };
        ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
    };
    text.split('"').skip(1).step_by(2).filter(|l| shaped(l)).map(String::from).collect()
}

/// The literals shaped like a rule (`word.word`) among the arguments of
/// each call of one of `calls` in `text`.
fn rules_in_calls(text: &str, calls: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for call in calls {
        for (at, _) in text.match_indices(call) {
            // The call's arguments: up to its closing parenthesis.
            let args = &text[at + call.len()..];
            let mut depth = 1;
            let end = args.char_indices().find_map(|(i, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                (depth == 0).then_some(i)
            });
            let args = &args[..end.unwrap_or(args.len())];
            out.extend(rule_literals(args));
        }
    }
    out
}

/// Every refusal the code can give (as the test above finds them) is given
/// by a test that checks it names its fix or says why none exists
/// (`palisade_policy::denial::names_a_fix_or_why_none`): a row of the
/// policy's decision table, whose every refusal is checked, or a test that
/// calls the check with the rule's name. The check could fail: a rule no
/// test gives is found.
#[test]
fn every_rule_the_code_can_give_is_checked_for_its_fix() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (mut given, mut checked) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    for file in project_files(&root).into_iter().filter(|f| f.ends_with(".rs")) {
        let text = std::fs::read_to_string(root.join(&file)).unwrap();
        if file.starts_with("policy/src/") || file.starts_with("broker/src/") {
            given.extend(rules_in(&text));
        }
        if file == "policy/src/decision/table.rs" {
            checked.extend(rules_in_calls(&text, &["Deny("]));
        }
        checked.extend(rules_in_calls(&text, &["names_a_fix_or_why_none("]));
    }
    assert!(checked.len() > 40, "{checked:?}");
    let unchecked: Vec<&String> = given.difference(&checked).collect();
    assert!(unchecked.is_empty(), "no test checks that these refusals name a fix: {unchecked:?}");
    let made_up = "names_a_fix_or_why_none(\"some.rule\", &message)";
    assert_eq!(rules_in_calls(made_up, &["names_a_fix_or_why_none("]), ["some.rule"]);
}

/// A session's shell is a convention of the clients: the script the
/// document gives is the one `palisade` sends, and clients/python's.
#[test]
fn the_shell_script_is_the_documented_one_in_every_client() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/protocol.md")).unwrap();
    let from = doc.find("- A session's shell").expect("the document's section");
    let block = &doc[from..];
    let start = block.find("  ```sh\n").unwrap() + "  ```sh\n".len();
    let end = block[start..].find("  ```\n").unwrap();
    let documented: Vec<&str> =
        block[start..start + end].lines().map(|l| l.strip_prefix("  ").unwrap_or(l)).collect();
    assert_eq!(documented.join("\n"), palisade_protocol::shell::SCRIPT);
    let python =
        std::fs::read_to_string(root.join("clients/python/src/palisade_client/__init__.py")).unwrap();
    let quoted = format!("SHELL_SCRIPT = r'''{}'''", palisade_protocol::shell::SCRIPT);
    assert!(python.contains(&quoted), "clients/python's SHELL_SCRIPT is not the script");
}
