//! Strict egress through the real binaries: a sandbox whose network
//! namespace has only loopback reaches allowed names through the broker's
//! proxy, resolver and transparent listeners, and nothing else. Origins are
//! listeners on the host's loopback; names come from the configuration's
//! static host map (`[egress] hosts`), and the origins' addresses are listed
//! in `allow_addresses` (loopback is refused otherwise). As root the file
//! runs again as the unprivileged test user.

use palisade_tests::*;
use std::io::Write;
use std::process::Stdio;

/// The origins' names: one allowed and served, one allowed but pointing at
/// a cloud metadata address, one allowed but pointing at loopback that is
/// not listed, names under an allowed wildcard, and an allowed TLS origin.
fn config(port: u16, extra: &str) -> String {
    format!(
        "egress = \"strict\"\n\
         network = {{ allow_domains = [\"allowed.test\", \"meta.test\", \"loop.test\", \"tls.test\", \"*.wild.test\"] }}\n\
         [egress]\n\
         ports = [{port}, 443]\n\
         hosts = {{ \"allowed.test\" = \"127.0.0.1\", \"meta.test\" = \"169.254.169.254\", \"loop.test\" = \"127.0.0.3\", \
         \"a.wild.test\" = \"127.0.0.1\", \"tls.test\" = \"127.0.0.2\" }}\n\
         allow_addresses = [\"127.0.0.1/32\", \"127.0.0.2/32\"]\n{extra}"
    )
}

/// One `probe egress` run through `d`: the probe's line, and the result.
fn egress(d: &Daemon, pre: &[&str], line: &str) -> (String, serde_json::Value) {
    egress_by(&["--socket", d.socket.to_str().unwrap()], pre, line)
}

/// One `probe egress` run by the broker `by` names (a socket, or a policy
/// for an embedded one): the probe's line, and the result.
fn egress_by(by: &[&str], pre: &[&str], line: &str) -> (String, serde_json::Value) {
    let ws = TempDir::new("egress");
    // Where an embedded broker's journal and state are: a directory the
    // sandbox's helper may pass through (an unprivileged user's too).
    let (_scratch, journal) = scratch_journal(None);
    let mut argv = vec!["run", "--json"];
    argv.extend_from_slice(by);
    argv.extend_from_slice(pre);
    let mut child = std::process::Command::new(bin("palisade"))
        .args(&argv)
        .args(["--", &probe(), "egress", "-"])
        .current_dir(ws.path())
        .env("PALISADE_JOURNAL", &journal)
        .env("PALISADE_STATE", state_beside(&journal))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&o.stdout), text(&o.stderr)));
    (v["stdout"].as_str().unwrap_or_default().trim_end().to_string(), v)
}

/// The run's egress traffic, from its attestation.
fn traffic(v: &serde_json::Value) -> &serde_json::Value {
    &v["result"]["attestation"]["enforcement"]["egress_traffic"]
}

fn denied_reasons(v: &serde_json::Value) -> Vec<String> {
    traffic(v)["denied"]
        .as_array()
        .map(|d| d.iter().map(|x| x["reason"].as_str().unwrap_or_default().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn through_the_proxy_variables_allowed_names_are_reached_and_accounted_for() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let d = Daemon::start(&config(origin.port(), ""));
    let port = origin.port();
    let (out, v) = egress(&d, &[], &format!("proxy-connect allowed.test:{port} hello-through-connect"));
    assert_eq!(out, "ok 200 hello-through-connect", "{v}");
    let t = traffic(&v);
    assert_eq!(t["reached"][0]["host"], "allowed.test", "{t}");
    assert_eq!(t["reached"][0]["port"], port);
    assert_eq!(t["reached"][0]["via"], "proxy");
    assert!(t["bytes_out"].as_u64().unwrap() >= 21 && t["bytes_in"].as_u64().unwrap() >= 21, "{t}");
    // The journal's run_finished carries the same traffic.
    let o = std::process::Command::new(bin("palisade"))
        .args([
            "audit",
            "show",
            "--json",
            &v["result"]["run_id"].to_string(),
            "--journal",
            d.journal().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let shown = text(&o.stdout);
    let finished =
        shown.lines().find(|l| l.contains("\"event\":\"run_finished\"")).unwrap_or_else(|| panic!("{shown}"));
    let record: serde_json::Value = serde_json::from_str(finished).unwrap();
    assert_eq!(&record["egress"], t, "{finished}");
    let (out, _) = egress(&d, &[], &format!("proxy-get allowed.test:{port} some/path"));
    assert_eq!(out, "ok 200 origin saw GET /some/path");
    // Counter-test: the origin is there for anyone on the host.
    assert_eq!(probe_outside(&["connect", &origin.addr.to_string()]), Ok(String::new()));
}

#[test]
fn a_tool_that_ignores_the_proxy_variables_reaches_allowed_names_transparently() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let d = Daemon::start(&config(origin.port(), ""));
    let port = origin.port();
    let (out, _) = egress(&d, &[], "resolve allowed.test");
    assert_eq!(out, "ok 127.77.0.1");
    // The address names it back, as a canonicalizing lookup asks.
    let (out, _) = egress(&d, &[], "dns 1.0.77.127.in-addr.arpa 12");
    assert_eq!(out, "ok rcode=0 answers=1");
    let (out, v) = egress(&d, &[], &format!("fetch allowed.test:{port} straight-through"));
    assert_eq!(out, "ok straight-through", "{v}");
    assert_eq!(traffic(&v)["reached"][0]["via"], "transparent");
    // A name under an allowed wildcard gets a spare address of the pool.
    let (out, v) = egress(&d, &[], &format!("fetch a.wild.test:{port} wild"));
    assert_eq!(out, "ok wild", "{v}");
}

#[test]
fn curl_reaches_an_allowed_name_through_the_proxy() {
    let Some(curl) = ["/usr/bin/curl", "/bin/curl"].into_iter().find(|p| std::path::Path::new(p).exists())
    else {
        panic!("curl is not installed: .ci/run installs it");
    };
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let d = Daemon::start(&config(origin.port(), ""));
    let ws = TempDir::new("curl");
    let url = format!("http://allowed.test:{}/by-curl", origin.port());
    let o =
        palisade_cli(ws.path(), &["run", "--socket", d.socket.to_str().unwrap()], &[curl, "-sS", &url], None);
    assert_eq!(text(&o.stdout), "origin saw GET /by-curl", "{}", text(&o.stderr));
    assert!(!text(&o.stderr).contains("egress refused"), "{}", text(&o.stderr));
    // A name not allowed (not on the command line, which the policy would
    // refuse: the program finds it itself): the program sees the proxy's
    // 403 and goes on, and palisade says once, on stderr, which name was
    // refused and why.
    let mut child = std::process::Command::new(bin("palisade"))
        .args(["run", "--socket", d.socket.to_str().unwrap(), "--", &probe(), "egress", "-"])
        .current_dir(ws.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = format!("proxy-connect denied.test:{0} x\nproxy-connect denied.test:{0} y\n", origin.port());
    child.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(text(&o.stdout).starts_with("ok 403"), "{}\n{}", text(&o.stdout), text(&o.stderr));
    let said: Vec<String> =
        text(&o.stderr).lines().filter(|l| l.contains("egress refused")).map(String::from).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].starts_with("palisade: egress refused: denied.test (domain_not_allowed): "), "{said:?}");
    assert_eq!(origin.accepted(), 1, "only the allowed request reached the origin");
}

#[test]
fn a_name_not_allowed_is_refused_by_the_proxy_and_the_resolver_and_has_no_listener() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let d = Daemon::start(&config(origin.port(), ""));
    let port = origin.port();
    let (out, v) = egress(&d, &[], &format!("proxy-connect denied.test:{port} x"));
    assert!(out.starts_with("ok 403"), "{out}");
    assert_eq!(denied_reasons(&v), ["domain_not_allowed"]);
    let (out, _) = egress(&d, &[], "dns denied.test 1");
    assert_eq!(out, "ok rcode=3 answers=0", "NXDOMAIN");
    let (out, _) = egress(&d, &[], "dns allowed.test 15");
    assert_eq!(out, "ok rcode=5 answers=0", "REFUSED for a type it does not serve");
    let (out, _) = egress(&d, &[], "dns allowed.test 1");
    assert_eq!(out, "ok rcode=0 answers=1");
    // No listener stands for it, nor for the origin's own address.
    let (out, _) = egress(&d, &[], "resolve denied.test");
    assert!(out.starts_with("err"), "{out}");
    for addr in [format!("127.0.0.1:{port}"), format!("127.77.0.200:{port}")] {
        let (out, _) = egress(&d, &[], &format!("connect {addr}"));
        assert!(out.starts_with("err ECONNREFUSED"), "{addr}: {out}");
    }
    assert_eq!(origin.accepted(), 0, "nothing reached the origin");
}

#[test]
fn an_allowed_name_that_resolves_to_a_refused_address_is_not_connected() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let port = origin.port();
    let d = Daemon::start(&config(port, ""));
    for name in ["meta.test", "loop.test"] {
        let (out, v) = egress(&d, &[], &format!("proxy-connect {name}:{port} x"));
        assert!(out.starts_with("ok 403"), "{name}: {out}");
        assert_eq!(denied_reasons(&v), ["address_refused"], "{name}");
        let (out, v) = egress(&d, &[], &format!("fetch {name}:{port} x"));
        assert_eq!(out, "ok", "{name}: the transparent path closes it, nothing comes back");
        assert_eq!(denied_reasons(&v), ["address_refused"], "{name}");
    }
}

#[test]
fn a_tls_tunnel_must_name_its_host_in_the_client_hello() {
    if !is_root() {
        skipped("an origin on port 443 needs root: this case runs in the root half of the suite only");
        return;
    }
    let origin = Origin::start("127.0.0.2", 443).expect("127.0.0.2:443 free for the test");
    let d = Daemon::start(&config(4, ""));
    let (out, v) = egress(&d, &[], "tls tls.test:443 tls.test");
    assert_eq!(out, "ok echoed 69 of 69", "the origin got the whole hello: {v}");
    let (out, v) = egress(&d, &[], "tls tls.test:443 other.example");
    assert_eq!(out, "ok echoed 0 of 74", "{v}");
    let (out, v) = egress(&d, &[], "tls tls.test:443 -");
    assert_eq!(out, "ok echoed 0 of 52", "no SNI at all: {v}");
    assert_eq!(denied_reasons(&v), ["sni_mismatch"]);
    assert_eq!(origin.accepted(), 1, "the mismatched hello never reached the origin");
}

#[test]
fn the_byte_quota_and_the_connection_limit_hold() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let port = origin.port();
    let d = Daemon::start(&config(port, "max_bytes = 1048576\nmax_connections = 3\n"));
    let (out, v) = egress(&d, &[], &format!("count allowed.test:{port} big_8000000"));
    let got: u64 = out.trim_start_matches("ok ").parse().unwrap_or_else(|_| panic!("{out}"));
    assert!(got <= 1 << 20, "{got} bytes came through a 1 MiB quota");
    assert_eq!(traffic(&v)["quota_exceeded"], true, "{v}");
    let (out, v) = egress(&d, &[], &format!("hold allowed.test:{port} 6"));
    assert_eq!(out, "ok answered 3 of 6", "{v}");
    assert!(denied_reasons(&v).contains(&"too_many_connections".to_string()), "{v}");
}

#[test]
fn a_malformed_or_oversized_proxy_request_is_refused_and_the_broker_keeps_serving() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let port = origin.port();
    let d = Daemon::start(&config(port, ""));
    let (out, v) = egress(&d, &[], "proxy-raw GARBAGE_LINE\\r\\n\\r\\n");
    assert!(out.starts_with("ok HTTP/1.1 400"), "{out}");
    assert_eq!(denied_reasons(&v), ["malformed_request"]);
    let (out, _) = egress(&d, &[], "proxy-big 100000");
    assert!(out.starts_with("ok HTTP/1.1 431"), "{out}");
    let (out, _) = egress(&d, &[], &format!("proxy-connect allowed.test:{port} still-serving"));
    assert_eq!(out, "ok 200 still-serving");
}

#[test]
fn a_request_narrows_the_allowed_names_and_cannot_widen_them() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let port = origin.port();
    // A daemon whose requests only narrow (run as the test user, it is the requester's own).
    let d = Daemon::start(&config(port, "[broker]\nowner_widens = false\n"));
    let (out, v) =
        egress(&d, &["--allow-domain", "a.wild.test"], &format!("proxy-connect allowed.test:{port} x"));
    assert!(out.starts_with("ok 403"), "{out} {v}");
    let (out, _) =
        egress(&d, &["--allow-domain", "a.wild.test"], &format!("proxy-connect a.wild.test:{port} y"));
    assert_eq!(out, "ok 200 y");
    let ws = TempDir::new("widen");
    let o = palisade_cli(
        ws.path(),
        &["run", "--socket", d.socket.to_str().unwrap(), "--allow-domain", "elsewhere.example"],
        &[&probe(), "echo", "x"],
        None,
    );
    assert!(text(&o.stderr).starts_with("palisade: CapabilityDenied: "), "{}", text(&o.stderr));
    assert!(o.stdout.is_empty());
    assert!(text(&o.stderr).contains("elsewhere.example"), "{}", text(&o.stderr));
}

/// The detail of the run's first refused attempt.
fn first_denied(v: &serde_json::Value) -> &str {
    traffic(v)["denied"][0]["detail"].as_str().unwrap_or_default()
}

/// A dev server on the host's loopback, on a port of its own: under a
/// policy that says nothing of egress (the suite's base, which lets the
/// probe run), the CLI's embedded broker reaches it only once
/// `--allow-port` and `--allow-address` let it, and each refusal on the
/// way names the flag and the key that would.
#[test]
fn a_loopback_server_on_a_port_of_its_own_is_reached_only_with_the_port_and_address_flags() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let port = origin.port().to_string();
    let dir = TempDir::new("dev-server");
    let policy = dir.join("p.toml");
    std::fs::write(&policy, test_config("")).unwrap();
    let embedded = ["--policy", policy.to_str().unwrap()];
    let line = format!("proxy-get 127.0.0.1:{port} dev");
    let name = ["--allow-domain", "127.0.0.1"];
    let (out, v) = egress_by(&embedded, &name, &line);
    assert!(out.starts_with("ok 403"), "{out} {v}");
    assert_eq!(denied_reasons(&v), ["port_not_allowed"]);
    assert_eq!(
        first_denied(&v),
        format!(
            "port {port} is not an allowed port; allow it with `--allow-port {port}` / `[egress] ports = \
             [443, 80, {port}]`"
        )
    );
    let with_port = [&name[..], &["--allow-port", &port]].concat();
    let (out, v) = egress_by(&embedded, &with_port, &line);
    assert!(out.starts_with("ok 403"), "{out} {v}");
    assert_eq!(denied_reasons(&v), ["address_refused"]);
    assert_eq!(
        first_denied(&v),
        "127.0.0.1 resolves only to refused addresses (127.0.0.1: loopback); allow it with \
         `--allow-address 127.0.0.1` / `[egress] allow_addresses = [\"127.0.0.1\"]`"
    );
    assert_eq!(origin.accepted(), 0, "nothing reached the server yet");
    let both = [&with_port[..], &["--allow-address", "127.0.0.1"]].concat();
    let (out, v) = egress_by(&embedded, &both, &line);
    assert_eq!(out, "ok 200 origin saw GET /dev", "{v}");
    assert_eq!(traffic(&v)["reached"][0]["port"].to_string(), port, "{v}");
    assert_eq!(origin.accepted(), 1);
}

/// Through a daemon, `--allow-port` and `--allow-address` ask only for what
/// its `[egress]` lists: more is refused before the run, naming the field,
/// the flag and the key an operator would set; and a port the run was not
/// given is refused naming that key.
#[test]
fn through_a_daemon_the_port_and_address_flags_cannot_widen_its_egress() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let port = origin.port();
    // Requests only narrow here, the owner's too.
    let d = Daemon::start(&config(port, "[broker]\nowner_widens = false\n"));
    let ws = TempDir::new("widen-egress");
    for (flag, value, key) in [
        ("--allow-port", "9", format!("`[egress] ports = [{port}, 443, 9]`")),
        (
            "--allow-address",
            "127.0.0.3",
            "`[egress] allow_addresses = [\"127.0.0.1\", \"127.0.0.2\", \"127.0.0.3\"]`".to_string(),
        ),
    ] {
        let argv =
            ["run", "--socket", d.socket.to_str().unwrap(), "--allow-domain", "allowed.test", flag, value];
        let o = palisade_cli(ws.path(), &argv, &[&probe(), "echo", "x"], None);
        let err = text(&o.stderr);
        assert!(err.starts_with("palisade: CapabilityDenied: "), "{err}");
        assert!(err.contains(&format!("({flag}) would widen the policy")), "{err}");
        assert!(err.contains(&format!("(an operator would set {key})")), "{err}");
        assert!(o.stdout.is_empty());
    }
    let asked = ["--allow-port", &port.to_string(), "--allow-address", "127.0.0.1"].map(String::from);
    let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
    let (out, v) = egress(&d, &asked, &format!("proxy-connect allowed.test:{port} asked"));
    assert_eq!(out, "ok 200 asked", "{v}");
    let (out, v) = egress(&d, &asked, "proxy-connect allowed.test:9 x");
    assert!(out.starts_with("ok 403"), "{out} {v}");
    assert_eq!(
        first_denied(&v),
        format!(
            "port 9 is not an allowed port; this broker's policy does not allow it (an operator would set \
             `[egress] ports = [{port}, 443, 9]`)"
        )
    );
}

#[test]
fn the_sandbox_binds_no_port_and_the_attestation_says_so() {
    let origin = Origin::start("127.0.0.1", 0).unwrap();
    let d = Daemon::start(&config(origin.port(), ""));
    let (out, v) = egress(&d, &[], "bind 127.0.0.1:8080");
    assert!(out.starts_with("err EACCES"), "{out}");
    let landlock = &v["result"]["attestation"]["enforcement"]["landlock"];
    assert!(landlock["enforced"].as_array().unwrap().iter().any(|f| f == "net.tcp"), "{landlock}");
    // Counter-test: outside, the probe binds it.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    assert_eq!(probe_outside(&["egress-bind", &free.to_string()]), Ok(String::new()));
}

#[test]
fn explain_shows_the_egress_plan() {
    let ws = TempDir::new("explain");
    let policy = ws.join("p.toml");
    std::fs::write(&policy, test_config(&config(8080, ""))).unwrap();
    let o = palisade_cli(
        ws.path(),
        &["explain", "--policy", policy.to_str().unwrap(), "--allow-domain", "allowed.test"],
        &["/bin/true"],
        None,
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    for want in [
        "egress:   strict, served by the broker",
        "127.0.0.1:3128",
        "127.0.0.1:53",
        "127.77.0.1",
        "allowed.test",
    ] {
        assert!(out.contains(want), "{want} is not in:\n{out}");
    }
    let allowed = out.lines().find(|l| l.trim_start().starts_with("allowed:")).unwrap_or_default();
    assert!(
        allowed.contains("allowed.test") && !allowed.contains("tls.test"),
        "the request narrowed the names:\n{out}"
    );
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_egress_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_egress_suite_passes_as_an_unprivileged_user");
}
