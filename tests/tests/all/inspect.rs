//! Inspected domains through the real binaries: a sandbox reaches a local
//! HTTPS origin (a certificate from a test CA, which the configuration's
//! `[egress] ca_bundle` trusts) through the broker's proxy, which ends the
//! sandbox's TLS with its own authority, checks every request against the
//! profile's rules and adds credentials the run never sees. The origin
//! serves git's smart HTTP (`git http-backend`) and a `/whoami` that says
//! whether it got the secret without ever echoing it. As root the file runs
//! again as the unprivileged test user.

use palisade_tests::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

const SECRET: &str = "tok-7f3a9c-never-inside";

/// A git (and `sh`, `curl`) the sandbox can see: the host's.
fn tool(name: &str) -> String {
    let found =
        ["/usr/bin", "/bin", "/usr/local/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.exists());
    found.unwrap_or_else(|| panic!("{name} is not installed: .ci/run installs it")).display().to_string()
}

/// The origin: HTTPS on 127.0.0.1, one thread per connection, HTTP/1.1
/// keep-alive.
struct HttpsOrigin {
    port: u16,
    /// The test CA's certificate (PEM).
    ca: PathBuf,
    repos: PathBuf,
    _dir: TempDir,
}

impl HttpsOrigin {
    fn start() -> HttpsOrigin {
        let dir = TempDir::new("https-origin");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "test origin CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let names = ["git.test", "other.test", "pass.test"].map(String::from).to_vec();
        let leaf = rcgen::CertificateParams::new(names).unwrap().signed_by(&key, &issuer).unwrap();
        let ca_path = dir.join("origin-ca.pem");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let repos = dir.join("repos");
        std::fs::create_dir(&repos).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let root = repos.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (config, root) = (config.clone(), root.clone());
                std::thread::spawn(move || {
                    let Ok(conn) = rustls::ServerConnection::new(config) else { return };
                    serve(BufReader::new(rustls::StreamOwned::new(conn, tcp)), &root);
                });
            }
        });
        HttpsOrigin { port, ca: ca_path, repos, _dir: dir }
    }

    /// A bare repository `name` with one commit on `main`, pushable over HTTP.
    fn repository(&self, name: &str) -> PathBuf {
        let git = tool("git");
        let bare = self.repos.join(name);
        let work = self.repos.join(format!("{name}.work"));
        let run = |args: &[&str], cwd: &Path| {
            let o = Command::new(&git).args(args).current_dir(cwd).output().unwrap();
            assert!(o.status.success(), "git {args:?}: {}", text(&o.stderr));
            text(&o.stdout)
        };
        run(&["init", "-q", "--bare", "-b", "main", bare.to_str().unwrap()], &self.repos);
        run(&["config", "http.receivepack", "true"], &bare);
        run(&["init", "-q", "-b", "main", work.to_str().unwrap()], &self.repos);
        std::fs::write(work.join("README"), "first\n").unwrap();
        run(&["add", "README"], &work);
        run(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first"], &work);
        run(&["push", "-q", bare.to_str().unwrap(), "main"], &work);
        bare
    }

    /// The commit a branch names (empty: no such branch).
    fn head(&self, bare: &Path, branch: &str) -> String {
        let o = Command::new(tool("git"))
            .args(["rev-parse", "--verify", "-q", branch])
            .current_dir(bare)
            .output()
            .unwrap();
        text(&o.stdout).trim().to_string()
    }
}

/// One connection: requests until the client closes.
fn serve<S: Read + Write>(mut conn: BufReader<S>, repos: &Path) {
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if conn.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end().to_string();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let header = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let body = read_body(&mut conn, header("content-length"), header("transfer-encoding"));
        let mut parts = line.split_whitespace();
        let (method, target) =
            (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("/").to_string());
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let (status, extra, out) = if path == "/whoami" {
            let got = header("authorization").unwrap_or_default();
            let said = if got == format!("Bearer {SECRET}") { "authorized" } else { "unauthorized" };
            ("200 OK".to_string(), String::new(), said.as_bytes().to_vec())
        } else if let Some(info) = path.strip_prefix("/git") {
            git_backend(repos, &method, info, query, &headers, &body)
        } else {
            ("200 OK".to_string(), String::new(), format!("origin saw {method} {path}").into_bytes())
        };
        let head = format!("HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\n\r\n", out.len());
        let w = conn.get_mut();
        if w.write_all(head.as_bytes()).and_then(|()| w.write_all(&out)).and_then(|()| w.flush()).is_err() {
            return;
        }
    }
}

fn read_body<R: BufRead>(r: &mut R, length: Option<String>, encoding: Option<String>) -> Vec<u8> {
    let mut body = Vec::new();
    if encoding.is_some_and(|e| e.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk).unwrap();
            if n == 0 {
                return body;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    let n: usize = length.and_then(|l| l.parse().ok()).unwrap_or(0);
    body.resize(n, 0);
    r.read_exact(&mut body).unwrap();
    body
}

/// `git http-backend` as CGI: its status, headers and body.
fn git_backend(
    repos: &Path,
    method: &str,
    info: &str,
    query: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> (String, String, Vec<u8>) {
    let header = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_default();
    let mut child = Command::new(tool("git"))
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", repos)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", method)
        .env("PATH_INFO", info)
        .env("QUERY_STRING", query)
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("HTTP_GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_USER", "tester")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap().stdout;
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    let split = split.or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let Some((at, gap)) = split else { return ("500 CGI".into(), String::new(), out) };
    let (mut status, mut extra) = ("200 OK".to_string(), String::new());
    for line in String::from_utf8_lossy(&out[..at]).lines() {
        match line.split_once(':') {
            Some((k, v)) if k.eq_ignore_ascii_case("status") => status = v.trim().to_string(),
            Some((k, v)) => extra.push_str(&format!("{k}: {}\r\n", v.trim())),
            None => {}
        }
    }
    (status, extra, out[at + gap..].to_vec())
}

fn b64(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            let c = if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' };
            out.push(c);
        }
    }
    out
}

/// The secret, in a file only its owner reads.
fn secret_file(dir: &TempDir) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("api-token");
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
    writeln!(f, "{SECRET}").unwrap();
    path
}

/// Strict egress to the origin's names: `git.test` and `other.test`
/// inspected, `pass.test` passed through.
fn config(origin: &HttpsOrigin, secret: &Path) -> String {
    format!(
        "egress = \"strict\"\n\
         network = {{ allow_domains = [\"git.test\", \"other.test\", \"pass.test\"] }}\n\
         allow_interpreters = true\nallow_inline_code = true\nmax_execution_time = 120\n\
         [defaults.inspect]\n\
         domains = [\"git.test\", \"other.test\"]\n\
         requests = [\"read_only git.test/*\", \"POST git.test/git/*/git-upload-pack\", \
         \"POST git.test/git/mine.git/git-receive-pack\"]\n\
         credentials = [{{ file = {secret:?}, hosts = [\"git.test\"], env = \"API_TOKEN\" }}]\n\
         [egress]\n\
         ports = [{port}]\n\
         hosts = {{ \"git.test\" = \"127.0.0.1\", \"other.test\" = \"127.0.0.1\", \"pass.test\" = \"127.0.0.1\" }}\n\
         allow_addresses = [\"127.0.0.1/32\"]\n\
         ca_bundle = {ca:?}\n",
        port = origin.port,
        ca = origin.ca.display().to_string(),
    )
}

/// `sh -c SCRIPT` in `ws` through the daemon: the JSON result.
fn run(d: &Daemon, ws: &Path, script: &str) -> serde_json::Value {
    let o = palisade_cli(
        ws,
        &["run", "--json", "--socket", d.socket.to_str().unwrap()],
        &[&tool("sh"), "-c", script],
        None,
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&o.stdout), text(&o.stderr)))
}

fn stdout(v: &serde_json::Value) -> String {
    v["stdout"].as_str().unwrap_or_default().to_string()
}

fn requests(v: &serde_json::Value) -> Vec<serde_json::Value> {
    v["result"]["attestation"]["enforcement"]["egress_traffic"]["requests"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_credential_reaches_its_host_only_and_is_never_inside_the_run() {
    let origin = HttpsOrigin::start();
    let keep = TempDir::new("secret");
    let d = Daemon::start(&config(&origin, &secret_file(&keep)));
    let ws = TempDir::new("ws");
    let p = origin.port;
    let curl = tool("curl");
    // The secret's file, named at run time (the request names no path outside the workspace).
    let secret = keep.join("api-token");
    let script = format!(
        "{curl} -sS -H \"Authorization: Bearer $API_TOKEN\" https://git.test:{p}/whoami; echo\n\
         {curl} -sS -H \"Authorization: Bearer $API_TOKEN\" https://other.test:{p}/whoami; echo\n\
         env; tr '\\0' '\\n' < /proc/self/environ; tr '\\0' '\\n' < /proc/1/environ\n\
         {probe} read \"$(echo {hidden} | base64 -d)\"; echo searched",
        probe = probe(),
        hidden = b64(secret.to_str().unwrap()),
    );
    let v = run(&d, ws.path(), &script);
    let out = stdout(&v);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "authorized", "the proxy put the secret in: {v}");
    assert!(lines[1].contains("request_not_allowed") && lines[1].contains("placeholder"), "{v}");
    assert!(out.contains("API_TOKEN=palisade-credential-"), "the run holds a placeholder: {out}");
    assert!(out.ends_with("searched\n") && !out.contains(SECRET), "the secret is nowhere in the run: {out}");
    assert!(out.contains("err ENOENT") || out.contains("err EACCES"), "its file is out of reach: {out}");
    let seen = requests(&v);
    assert_eq!(seen.len(), 2, "{v}");
    assert_eq!(seen[0]["host"], "git.test");
    assert_eq!(seen[0]["status"], 200);
    assert_eq!(seen[0]["credentials"][0], keep.join("api-token").display().to_string());
    assert_eq!((seen[1]["host"].as_str(), seen[1]["status"].as_u64()), (Some("other.test"), Some(403)));
    // The journal has the requests, by name, and never the value.
    // (The run's last record follows its answer: waited for, within a bound.)
    let show = || {
        let o = Command::new(bin("palisade"))
            .args(["audit", "show", "--json", &v["result"]["run_id"].to_string(), "--journal"])
            .arg(d.journal())
            .output()
            .unwrap();
        format!("{}{}", text(&o.stdout), text(&o.stderr))
    };
    let mut shown = show();
    for _ in 0..100 {
        if shown.contains("\"event\":\"run_finished\"") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        shown = show();
    }
    let finished =
        shown.lines().find(|l| l.contains("\"event\":\"run_finished\"")).unwrap_or_else(|| panic!("{shown}"));
    let record: serde_json::Value = serde_json::from_str(finished).unwrap();
    assert_eq!(record["egress"]["requests_omitted"], 0, "{finished}");
    // One record per request, before the run's end, the credential by name.
    let recorded: Vec<serde_json::Value> = shown
        .lines()
        .filter(|l| l.contains("\"event\":\"inspected_request\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recorded.len(), 2, "{shown}");
    assert_eq!((recorded[0]["host"].as_str(), recorded[0]["status"].as_u64()), (Some("git.test"), Some(200)));
    assert_eq!(recorded[0]["credentials"], seen[0]["credentials"], "{shown}");
    assert_eq!(
        (recorded[1]["allowed"].as_bool(), recorded[1]["rule"].as_str()),
        (Some(false), seen[1]["rule"].as_str())
    );
    assert!(recorded.iter().all(|r| r["seq"].as_u64() < record["seq"].as_u64()), "{shown}");
    assert!(!shown.contains(SECRET), "{shown}");
    let raw: Vec<u8> =
        journal_segments(&d.journal()).iter().flat_map(|p| std::fs::read(p).unwrap()).collect();
    assert!(!String::from_utf8_lossy(&raw).contains(SECRET), "no secret in the journal's bytes");
    // Counter-test: outside a sandbox, the placeholder is refused by the
    // origin, and the secret itself is what it takes.
    let outside = |token: &str| {
        let o = Command::new(&curl)
            .args([
                "-sS",
                "--cacert",
                origin.ca.to_str().unwrap(),
                "--resolve",
                &format!("git.test:{p}:127.0.0.1"),
            ])
            .args(["-H", &format!("Authorization: Bearer {token}"), &format!("https://git.test:{p}/whoami")])
            .output()
            .unwrap();
        text(&o.stdout)
    };
    assert_eq!(outside(SECRET), "authorized");
    assert_eq!(outside("palisade-credential-x"), "unauthorized");
}

#[test]
fn a_credentials_file_is_hidden_from_a_run_whose_workspace_holds_it() {
    // A home used as the workspace, its palisade configuration in it.
    let origin = HttpsOrigin::start();
    let home = TempDir::new("home-ws");
    let dir = home.join(".config/palisade");
    std::fs::create_dir_all(&dir).unwrap();
    let keep = TempDir::new_in(&dir, "keep");
    let secret = secret_file(&keep);
    let d = Daemon::start(&config(&origin, &secret));
    let relative = secret.strip_prefix(home.path()).unwrap().display().to_string();
    let v = run(
        &d,
        home.path(),
        &format!("cat '{relative}'; echo \"rc=$?\"; ls -a .config/palisade; echo $API_TOKEN"),
    );
    let out = stdout(&v);
    assert!(out.contains("rc=1") && !out.contains(SECRET), "the credential's file is hidden: {v}");
    assert!(out.contains("palisade-credential-"), "the run has its placeholder: {out}");
    // Outside, the same path is the secret.
    let outside = std::fs::read_to_string(home.join(&relative)).unwrap();
    assert_eq!(outside.trim(), SECRET);
    // Under a granted parent of it inside the home too (the workspace `~/.config`).
    let below = secret.strip_prefix(home.join(".config")).unwrap().display().to_string();
    let v = run(&d, &home.join(".config"), &format!("cat '{below}'; echo \"rc=$?\""));
    let out = stdout(&v);
    assert!(out.contains("rc=1") && !out.contains(SECRET), "hidden under a granted parent: {v}");
}

#[test]
fn rules_let_a_clone_through_and_refuse_a_push_outside_the_allowed_paths() {
    let origin = HttpsOrigin::start();
    let (theirs, mine) = (origin.repository("theirs.git"), origin.repository("mine.git"));
    let theirs_before = origin.head(&theirs, "main");
    assert_eq!(origin.head(&mine, "from-run"), "");
    let keep = TempDir::new("secret");
    let d = Daemon::start(&config(&origin, &secret_file(&keep)));
    let ws = TempDir::new("ws");
    let (git, p) = (tool("git"), origin.port);
    let script = format!(
        "{git} clone -q https://git.test:{p}/git/theirs.git c && echo cloned && cd c && \
         export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t.example GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t.example && \
         {git} commit -q --allow-empty -m second && \
         {{ {git} push -q origin HEAD:main; echo push-theirs=$?; \
            {git} push -q https://git.test:{p}/git/mine.git HEAD:refs/heads/from-run; echo push-mine=$?; }}"
    );
    let v = run(&d, ws.path(), &script);
    let out = stdout(&v);
    assert!(out.contains("cloned"), "{v}");
    assert!(out.contains("push-theirs=") && !out.contains("push-theirs=0"), "{v}");
    assert!(out.contains("push-mine=0"), "{v}");
    assert_eq!(origin.head(&theirs, "main"), theirs_before, "the refused push changed nothing");
    assert_ne!(origin.head(&mine, "from-run"), "", "the allowed push landed");
    let refused: Vec<serde_json::Value> = requests(&v).into_iter().filter(|r| r["status"] == 403).collect();
    assert!(
        refused.iter().any(|r| r["method"] == "POST" && r["path"] == "/git/theirs.git/git-receive-pack"),
        "{v}"
    );
    // Counter-test: the origin takes the same push from outside.
    let work = ws.join("c");
    let o = Command::new(&git)
        .args(["-c", &format!("http.sslCAInfo={}", origin.ca.display())])
        .args(["-c", &format!("http.curloptResolve=git.test:{p}:127.0.0.1")])
        .args(["push", "-q", &format!("https://git.test:{p}/git/theirs.git"), "HEAD:main"])
        .current_dir(&work)
        .env("GIT_SSL_CAINFO", &origin.ca)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_ne!(origin.head(&theirs, "main"), theirs_before);
}

#[test]
fn a_pinned_client_on_a_passthrough_domain_still_works_and_the_ca_key_stays_out() {
    let origin = HttpsOrigin::start();
    let keep = TempDir::new("secret");
    let d = Daemon::start(&config(&origin, &secret_file(&keep)));
    let ws = TempDir::new("ws");
    std::fs::copy(&origin.ca, ws.join("origin-ca.pem")).unwrap();
    let (curl, p) = (tool("curl"), origin.port);
    let key = d.dir.join("state/tls/ca.key");
    // Named at run time: the request itself names no path of the state.
    let hidden = format!("\"$(echo {} | base64 -d)\"", b64(key.to_str().unwrap()));
    let script = format!(
        "{curl} -sS --cacert origin-ca.pem https://pass.test:{p}/pinned; echo\n\
         {curl} -sS --cacert origin-ca.pem https://git.test:{p}/pinned >/dev/null 2>&1; echo inspected-pinned=$?\n\
         {curl} -sS https://git.test:{p}/trusted; echo\n\
         {probe} read {hidden}",
        probe = probe(),
    );
    let v = run(&d, ws.path(), &script);
    let out = stdout(&v);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "origin saw GET /pinned", "passed through to the origin's own certificate: {v}");
    assert!(lines[1].starts_with("inspected-pinned=") && lines[1] != "inspected-pinned=0", "{v}");
    assert_eq!(lines[2], "origin saw GET /trusted", "the run trusts the broker's authority: {v}");
    assert!(lines[3].starts_with("err "), "the CA key is out of the run's reach: {v}");
    // Counter-test: the key is there, the broker's alone.
    let read = probe_outside(&["read", key.to_str().unwrap()]).unwrap();
    assert!(read.contains("PRIVATE KEY"), "{read}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    // Tier B (no namespaces, Landlock alone): the same state, out of reach too.
    let tier_b = Daemon::start_with(DaemonOptions {
        config: "allow_interpreters = true\nallow_inline_code = true\n\
                 [policy]\nfallback = \"warn_and_execute\"\n[broker]\nuser_namespaces = false\n"
            .into(),
        env: vec![("PALISADE_STATE".into(), d.dir.join("state").display().to_string())],
        ..Default::default()
    });
    let script = format!("{} read {hidden}", probe());
    let shared = TempDir::new("tier-b");
    let project = shared_workspace(&shared, "project");
    let socket = tier_b.socket.to_str().unwrap();
    let o = palisade_cli(&project, &["run", "--socket", socket], &[&tool("sh"), "-c", &script], None);
    assert!(text(&o.stdout).starts_with("err "), "{}\n{}", text(&o.stdout), text(&o.stderr));
    // Counter-test: the same Tier B run reads its workspace's files.
    std::fs::write(project.join("visible.txt"), "seen").unwrap();
    let visible = project.join("visible.txt");
    let o = palisade_cli(
        &project,
        &["run", "--socket", socket],
        &[&probe(), "read", visible.to_str().unwrap()],
        None,
    );
    assert!(text(&o.stdout).contains("bytes:"), "{}\n{}", text(&o.stdout), text(&o.stderr));
}

/// `value` in `dir/name`, readable by its owner only.
fn secret_in(dir: &Path, name: &str, value: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(dir.join(name)).unwrap();
    writeln!(f, "{value}").unwrap();
}

#[test]
fn named_secrets_come_from_systemds_credentials_then_the_secret_store() {
    let origin = HttpsOrigin::start();
    // systemd's `LoadCredential=` directory holds `gh`; the secret store
    // holds a stale `gh` (which the systemd credential overrides) and `api`.
    let (credentials, store) = (TempDir::new("credentials"), TempDir::new("store"));
    secret_in(credentials.path(), "gh", SECRET);
    secret_in(store.path(), "gh", "stale-value");
    secret_in(store.path(), "api", SECRET);
    let p = origin.port;
    let config = format!(
        "egress = \"strict\"\n\
         network = {{ allow_domains = [\"git.test\", \"other.test\"] }}\n\
         allow_interpreters = true\nallow_inline_code = true\n\
         [defaults.inspect]\n\
         domains = [\"git.test\", \"other.test\"]\n\
         credentials = [{{ secret = \"gh\", hosts = [\"git.test\"], header = \"Authorization\", format = \"Bearer {{}}\" }}, \
         {{ secret = \"api\", hosts = [\"other.test\"], env = \"API_TOKEN\" }}]\n\
         [plugins]\nsecrets_dir = {store:?}\n\
         [egress]\nports = [{p}]\n\
         hosts = {{ \"git.test\" = \"127.0.0.1\", \"other.test\" = \"127.0.0.1\" }}\n\
         allow_addresses = [\"127.0.0.1/32\"]\nca_bundle = {ca:?}\n",
        store = store.path().display().to_string(),
        ca = origin.ca.display().to_string(),
    );
    let d = Daemon::start_with(DaemonOptions {
        config,
        env: vec![("CREDENTIALS_DIRECTORY".into(), credentials.path().display().to_string())],
        ..Default::default()
    });
    let ws = TempDir::new("ws");
    let curl = tool("curl");
    // Without a header of its own, the request to git.test gets systemd's
    // `gh`; the placeholder sent to other.test becomes the store's `api`.
    // Counter-test: the same request with no credential is unauthorized.
    let script = format!(
        "{curl} -sS https://git.test:{p}/whoami; echo\n\
         {curl} -sS -H \"Authorization: Bearer $API_TOKEN\" https://other.test:{p}/whoami; echo\n\
         {curl} -sS https://other.test:{p}/whoami; echo"
    );
    let v = run(&d, ws.path(), &script);
    assert_eq!(stdout(&v), "authorized\nauthorized\nunauthorized\n", "{v}\n{}", d.log());
    let used: Vec<serde_json::Value> = requests(&v).iter().map(|r| r["credentials"].clone()).collect();
    assert_eq!(used, [serde_json::json!(["gh"]), serde_json::json!(["api"]), serde_json::json!([])], "{v}");
    assert!(!v.to_string().contains(SECRET), "{v}");
}

/// As root, the same file again as the unprivileged test user.
#[test]
fn the_inspection_suite_passes_as_an_unprivileged_user() {
    rerun_unprivileged(module_path!(), "the_inspection_suite_passes_as_an_unprivileged_user");
}
