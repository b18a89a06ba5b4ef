//! launchd/: the LaunchAgent and the LaunchDaemon parse as property lists
//! and have the shape the README describes: palisaded with its socket from
//! launchd's `Sockets` entry (the name the broker asks
//! `launch_activate_socket` for), kept alive, logging to a file, never root.

use plist::{Dictionary, Value};
use std::path::Path;

const AGENT: &str = "launchd/agent/dev.palisade.palisaded.plist";
const DAEMON: &str = "launchd/daemon/dev.palisade.palisaded.plist";
const LABEL: &str = "dev.palisade.palisaded";

/// The plist at `relative`, with its one placeholder filled in as the
/// README's install command does.
fn load(relative: &str, placeholder: &str, value: &str) -> Dictionary {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
    let others: Vec<&str> = ["@HOME@", "@USER@"].into_iter().filter(|p| *p != placeholder).collect();
    assert!(others.iter().all(|p| !text.contains(p)), "{relative}: a placeholder other than {placeholder}");
    assert!(text.contains(placeholder), "{relative}: no {placeholder}");
    let text = text.replace(placeholder, value);
    let value = Value::from_reader_xml(text.as_bytes()).unwrap_or_else(|e| panic!("{relative}: {e}"));
    value.into_dictionary().unwrap_or_else(|| panic!("{relative}: not a dictionary"))
}

fn string<'a>(d: &'a Dictionary, key: &str) -> &'a str {
    d.get(key).and_then(Value::as_string).unwrap_or_else(|| panic!("{key}: not a string"))
}

/// What both plists share: the label and file name, palisaded, the one
/// socket entry, keep-alive, logs.
fn common(relative: &str, d: &Dictionary) -> Dictionary {
    assert_eq!(string(d, "Label"), LABEL);
    assert!(relative.ends_with(&format!("{LABEL}.plist")), "{relative}: named after its label");
    let args = d.get("ProgramArguments").and_then(Value::as_array).expect("ProgramArguments");
    let args: Vec<&str> = args.iter().filter_map(Value::as_string).collect();
    assert!(args[0].ends_with("/palisaded") && args[0].starts_with('/'), "{args:?}");
    assert_eq!(args[1], "--config");
    assert_eq!(d.get("KeepAlive").and_then(Value::as_boolean), Some(true));
    for log in ["StandardErrorPath", "StandardOutPath"] {
        assert!(string(d, log).starts_with('/') && string(d, log).ends_with("palisaded.log"), "{log}");
    }
    let sockets = d.get("Sockets").and_then(Value::as_dictionary).expect("Sockets");
    let names: Vec<&String> = sockets.keys().collect();
    assert_eq!(names, [palisade_broker::mac::cli::LAUNCHD_SOCKETS]);
    sockets.values().next().and_then(Value::as_dictionary).expect("a socket dictionary").clone()
}

#[test]
fn the_launch_agent_serves_its_user_on_a_private_socket() {
    let d = load(AGENT, "@HOME@", "/Users/someone");
    let socket = common(AGENT, &d);
    // launchd makes the socket in a directory private to the user, and names it.
    assert_eq!(string(&socket, "SecureSocketWithKey"), "PALISADE_SOCKET");
    assert!(d.get("UserName").is_none(), "an agent runs as the user who loads it");
}

#[test]
fn the_launch_daemon_runs_as_a_service_account_on_a_socket_it_checks() {
    let d = load(DAEMON, "@USER@", "agent");
    let socket = common(DAEMON, &d);
    assert_eq!(string(&d, "UserName"), "agent");
    // Where every client looks for the system broker on macOS.
    assert_eq!(string(&socket, "SockPathName"), palisade_protocol::clients::MACOS_SYSTEM_SOCKET);
    // Anyone may connect: palisaded answers every uid but its own Unauthorized.
    assert_eq!(socket.get("SockPathMode").and_then(Value::as_unsigned_integer), Some(0o666));
}

#[test]
fn a_plist_that_is_not_one_is_refused() {
    // The parse above could fail: a broken file does.
    assert!(Value::from_reader_xml(&b"<plist><dict><key>Label</key></plist>"[..]).is_err());
}
