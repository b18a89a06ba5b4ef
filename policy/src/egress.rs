//! Egress preflight: the hosts a command names in its arguments, and whether
//! the allow-list admits them. This is a user-space check (it cannot see a
//! host a program computes); `strict` adds the kernel's network namespace.

/// How network access is checked and enforced: defined beside the
/// attestation, which reports it.
pub use palisade_protocol::attest::EgressMode;

/// Network tools whose bare `host:path` arguments name remote hosts.
const SCP_LIKE: [&str; 3] = ["scp", "rsync", "sftp"];
/// Tools whose first operand is a host, with their short options that take a value.
const HOST_FIRST: [(&str, &str); 5] = [
    ("ssh", "BbcDEeFIiJLlmOopQRSWw"),
    ("ping", "cfiIlmMpQsStTwW"),
    ("nc", "iImOpPqsTVwx"),
    ("ncat", "iImOpPqsTVwx"),
    ("telnet", "blnX"),
];

/// Tools whose operands are all URLs, a scheme or not (`curl evil.net/x`),
/// with their options that take a value (the value is not an operand).
const URL_OPERANDS: [(&str, &str, &[&str]); 4] = [
    (
        "curl",
        "AbcCdDeEFHKmoPQrtTuUwxXyYz",
        &[
            "--output",
            "--header",
            "--data",
            "--data-raw",
            "--data-binary",
            "--data-urlencode",
            "--json",
            "--user",
            "--user-agent",
            "--referer",
            "--cookie",
            "--cookie-jar",
            "--form",
            "--request",
            "--max-time",
            "--connect-timeout",
            "--retry",
            "--proxy",
            "--cert",
            "--key",
            "--cacert",
            "--write-out",
            "--config",
            "--upload-file",
            "--range",
            "--dump-header",
            "--output-dir",
            "--resolve",
            "--connect-to",
            "--interface",
            "--limit-rate",
            "--max-filesize",
        ],
    ),
    (
        "wget",
        "aAbBDeiIlLoOPQrRtTUwX",
        &[
            "--output-document",
            "--output-file",
            "--append-output",
            "--execute",
            "--tries",
            "--timeout",
            "--wait",
            "--user-agent",
            "--directory-prefix",
            "--header",
            "--post-data",
            "--post-file",
            "--user",
            "--password",
            "--load-cookies",
            "--save-cookies",
            "--input-file",
            "--level",
            "--accept",
            "--reject",
            "--domains",
            "--exclude-domains",
            "--referer",
            "--bind-address",
        ],
    ),
    ("http", "aA", &["--auth", "--auth-type", "--output", "--session", "--session-read-only", "--proxy"]),
    ("https", "aA", &["--auth", "--auth-type", "--output", "--session", "--session-read-only", "--proxy"]),
];
/// git subcommands whose first operand is a repository, and the operand's
/// position among the subcommand's operands (`remote add NAME URL`: 2).
const GIT_REPOSITORY: [(&str, usize); 7] =
    [("clone", 0), ("fetch", 0), ("pull", 0), ("push", 0), ("ls-remote", 0), ("remote", 2), ("submodule", 1)];

/// The longest a domain name's text form can be (RFC 1035: 255 octets on
/// the wire, 253 characters written out).
const MAX_HOSTNAME_CHARS: usize = 253;

fn looks_like_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= MAX_HOSTNAME_CHARS
        && (h.contains('.') || h.contains(':') || h.eq_ignore_ascii_case("localhost"))
        && !h.starts_with('-')
        && !h.contains('/')
        && !h.chars().any(|c| c.is_whitespace())
}

fn clean(host: &str) -> String {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.trim_end_matches('.').to_ascii_lowercase()
}

/// `scheme://[user@]host[:port][/...]`
fn from_url(arg: &str) -> Option<String> {
    let (scheme, rest) = arg.split_once("://")?;
    if scheme.is_empty() || !scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        hostport.split(':').next().unwrap_or("")
    };
    (!host.is_empty() && scheme != "file").then(|| clean(host))
}

/// `user@host:path` (git, scp), `host:port`, and for scp-like tools `host:path`.
fn from_colon_form(arg: &str, scp_like: bool) -> Option<String> {
    if arg.starts_with('-') || arg.starts_with('/') || arg.starts_with('.') {
        return None;
    }
    let (before, after) = arg.split_once(':')?;
    if let Some((_, host)) = before.rsplit_once('@') {
        return (!host.is_empty()).then(|| clean(host));
    }
    let port = after.split('/').next().unwrap_or("");
    if !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()) && looks_like_host(before) {
        return Some(clean(before));
    }
    (scp_like && !before.is_empty() && !before.contains('/')).then(|| clean(before))
}

/// The host of a URL given without a scheme (`evil.net/x`, `user@h:8080`).
fn from_schemeless(arg: &str) -> Option<String> {
    if arg.starts_with(['-', '/', '.', '~']) || arg.is_empty() {
        return None;
    }
    let authority = arg.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match hostport.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => hostport.split(':').next().unwrap_or(""),
    };
    let label = |l: &str| !l.is_empty() && l.chars().all(|c| c.is_alphanumeric() || c == '-' || c == '_');
    (hostport.starts_with('[') || host.split('.').all(label)).then(|| clean(host)).filter(|h| !h.is_empty())
}

/// The operands of `argv` (after the program), skipping options and the
/// values of the options that take one.
fn operands<'a>(argv: &'a [String], short: &str, long: &[&str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut args = argv.iter().skip(1);
    let mut options_done = false;
    while let Some(arg) = args.next() {
        if options_done || !arg.starts_with('-') || arg == "-" {
            out.push(arg.as_str());
        } else if arg == "--" {
            options_done = true;
        } else if arg.starts_with("--") {
            if !arg.contains('=') && long.contains(&arg.as_str()) {
                args.next();
            }
        } else if arg.len() == 2 && short.contains(&arg[1..]) {
            // `-o file`; a value glued on (`-ofile`) needs no skip.
            args.next();
        }
    }
    out
}

/// Every host named in `argv` (URLs anywhere, `--flag=URL` values, git/scp
/// forms, `host:port`, the operands of URL tools such as curl and wget, the
/// repository of git's network commands, and the host operand of ssh-like tools).
pub fn hosts_in(argv: &[String]) -> Vec<String> {
    let tool = argv.first().map(|a| a.rsplit('/').next().unwrap_or(a)).unwrap_or("");
    let mut hosts = hosts_by_form(argv, tool);
    if let Some((_, short, long)) = URL_OPERANDS.iter().find(|(t, _, _)| *t == tool) {
        let mut ops = operands(argv, short, long);
        if tool.starts_with("http") {
            // httpie: `[METHOD] URL [ITEM...]`; the items are headers and data.
            let method = ops.first().is_some_and(|m| m.chars().all(|c| c.is_ascii_uppercase()));
            ops = ops.into_iter().skip(usize::from(method)).take(1).collect();
        }
        hosts.extend(ops.into_iter().filter_map(|op| from_url(op).or_else(|| from_schemeless(op))));
    }
    if tool == "git" {
        // Global options before the subcommand (`-C dir`, `-c k=v`) take a value.
        let ops = operands(argv, "Cc", &["--git-dir", "--work-tree", "--namespace", "--exec-path"]);
        if let Some((sub, rest)) = ops.split_first() {
            let position = GIT_REPOSITORY.iter().find(|(s, _)| s == sub).map(|(_, p)| *p);
            if let Some(repo) = position.and_then(|p| rest.get(p)).filter(|r| !r.contains("://")) {
                // `host:path` with no slash before the colon is git's scp-like syntax.
                let scp = repo.split_once(':').filter(|(h, _)| !h.is_empty() && !h.contains('/'));
                hosts.extend(scp.map(|(h, _)| clean(h.rsplit_once('@').map_or(h, |(_, h)| h))));
            }
        }
    }
    let mut seen = Vec::new();
    hosts.retain(|h| {
        let new = !seen.contains(h);
        seen.push(h.clone());
        new
    });
    hosts
}

fn hosts_by_form(argv: &[String], tool: &str) -> Vec<String> {
    let scp_like = SCP_LIKE.contains(&tool);
    let value_flags = HOST_FIRST.iter().find(|(t, _)| *t == tool).map(|(_, f)| *f);
    let mut hosts = Vec::new();
    let mut first_operand_seen = false;
    let mut skip_value = false;
    for arg in argv.iter().skip(1) {
        let value = arg.split_once('=').map_or(arg.as_str(), |(_, v)| v);
        for candidate in [arg.as_str(), value] {
            if let Some(h) = from_url(candidate).or_else(|| from_colon_form(candidate, scp_like)) {
                hosts.push(h);
                break;
            }
        }
        let Some(flags) = value_flags else { continue };
        if std::mem::take(&mut skip_value) || first_operand_seen {
            continue;
        }
        if let Some(opt) = arg.strip_prefix('-') {
            // `-p 22`: the next argument is the option's value, not the host.
            skip_value = opt.len() == 1 && flags.contains(opt);
            continue;
        }
        first_operand_seen = true;
        let host = from_colon_form(arg, false)
            .unwrap_or_else(|| clean(arg.rsplit_once('@').map_or(arg.as_str(), |(_, h)| h)));
        if !host.is_empty() && !hosts.contains(&host) {
            hosts.push(host);
        }
    }
    hosts
}

/// Options of network tools that send a connection somewhere other than the
/// host the command line names (a DNS override, a proxy, a unix socket, a
/// source address), or that read such settings from a file or the
/// environment: (tool, short options, long options). A long option given
/// as any prefix of one of these is refused too (the tools accept unique
/// prefixes: `--resol` is `--resolve`).
const REDIRECTING: [(&str, &str, &[&str]); 13] = [
    (
        "curl",
        "xK",
        &[
            "resolve",
            "connect-to",
            "alt-svc",
            "doh-url",
            "dns-servers",
            "dns-interface",
            "dns-ipv4-addr",
            "dns-ipv6-addr",
            "proxy",
            "preproxy",
            "proxy1.0",
            "socks4",
            "socks4a",
            "socks5",
            "socks5-hostname",
            "unix-socket",
            "abstract-unix-socket",
            "interface",
            "local-port",
            "config",
            "variable",
        ],
    ),
    ("wget", "ei", &["execute", "config", "input-file", "bind-address", "bind-dns-address", "dns-servers"]),
    (
        "ssh",
        "FJWRSbB",
        &["hostname", "proxycommand", "proxyjump", "bindaddress", "bindinterface", "controlpath"],
    ),
    (
        "scp",
        "FJSR",
        &["hostname", "proxycommand", "proxyjump", "bindaddress", "bindinterface", "controlpath"],
    ),
    (
        "sftp",
        "FJSRD",
        &["hostname", "proxycommand", "proxyjump", "bindaddress", "bindinterface", "controlpath"],
    ),
    ("rsync", "e", &["rsh", "address"]),
    ("pip", "", &["proxy"]),
    ("pip3", "", &["proxy"]),
    ("npm", "", &["proxy", "https-proxy", "local-address", "userconfig", "globalconfig"]),
    ("nc", "xXsU", &[]),
    (
        "ncat",
        "sUec",
        &["proxy", "proxy-type", "proxy-dns", "unixsock", "vsock", "exec", "sh-exec", "lua-exec"],
    ),
    (
        "aria2c",
        "iT",
        &[
            "all-proxy",
            "http-proxy",
            "https-proxy",
            "ftp-proxy",
            "interface",
            "multiple-interface",
            "async-dns-server",
            "conf-path",
            "input-file",
        ],
    ),
    ("http", "", &["proxy"]),
];

/// git configuration (`-c key=value`, `--config-env=key=var`) that sends a
/// connection elsewhere or reads more configuration: keys, lowercase, `*` for
/// any subsection.
const GIT_REDIRECTING: [&str; 11] = [
    "http.proxy",
    "http.*.proxy",
    "remote.*.proxy",
    "http.curloptresolve",
    "url.*.insteadof",
    "url.*.pushinsteadof",
    "core.gitproxy",
    "core.sshcommand",
    "include.path",
    "includeif.*.path",
    "protocol.*.allow",
];

fn git_key_redirects(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    GIT_REDIRECTING.iter().any(|pattern| match pattern.split_once(".*.") {
        Some((section, name)) => {
            key.starts_with(&format!("{section}."))
                && key.ends_with(&format!(".{name}"))
                && key.len() > section.len() + name.len() + 2
        }
        None => key == *pattern,
    })
}

/// The option of a known network tool in `argv` (the program and its
/// arguments, launchers already looked through) that would connect
/// somewhere the command line does not name, if any: preflight checks only
/// the names it sees.
pub fn redirection(argv: &[String]) -> Option<String> {
    let tool = argv.first().map(|a| a.rsplit('/').next().unwrap_or(a))?;
    if tool == "socat" {
        return Some("socat (its addresses are not read by the check)".into());
    }
    if tool == "git" {
        return git_redirection(argv);
    }
    let (_, short, long) = REDIRECTING.iter().find(|(t, _, _)| *t == tool)?;
    let ssh_like = matches!(tool, "ssh" | "scp" | "sftp");
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        if let Some(name) = arg.strip_prefix("--") {
            let name = name.split_once('=').map_or(name, |(n, _)| n).to_ascii_lowercase();
            if name.len() >= 2 && long.iter().any(|l| l.starts_with(&name)) {
                return Some(format!("{tool} --{name}"));
            }
        } else if let Some(cluster) = arg.strip_prefix('-') {
            // `-o Key=value` / `-oKey value`: ssh's options by keyword.
            if ssh_like && cluster.starts_with('o') {
                let value =
                    if cluster.len() > 1 { Some(cluster[1..].to_string()) } else { args.next().cloned() };
                let key = value
                    .unwrap_or_default()
                    .split(['=', ' ', '\t'])
                    .next()
                    .unwrap_or("")
                    .to_ascii_lowercase();
                if long.contains(&key.as_str()) {
                    return Some(format!("{tool} -o {key}"));
                }
                continue;
            }
            if let Some(c) = cluster.chars().find(|c| short.contains(*c)) {
                return Some(format!("{tool} -{c}"));
            }
        }
    }
    None
}

fn git_redirection(argv: &[String]) -> Option<String> {
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        let setting = match arg.as_str() {
            "-c" | "--config" => args.next().map(String::as_str),
            a => a.strip_prefix("--config-env=").or_else(|| a.strip_prefix("--config=")),
        };
        let Some(key) = setting.map(|s| s.split_once('=').map_or(s, |(k, _)| k)) else { continue };
        if git_key_redirects(key) {
            return Some(format!("git -c {}", key.to_ascii_lowercase()));
        }
    }
    None
}

/// Whether `host` matches an allow-list entry: an exact name, or `*.suffix`
/// for any name below `suffix` (not `suffix` itself). ASCII only: a look-alike
/// in another script never matches.
pub fn allowed(host: &str, allow: &[String]) -> bool {
    let host = clean(host);
    allow.iter().any(|entry| {
        let entry = clean(entry);
        match entry.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => host == entry,
        }
    })
}

/// Whether `name`, an exact name or a `*.suffix` pattern, lies within the
/// allow-list: an exact name wherever [`allowed`] admits it; `*.x` within
/// `*.x`, or within `*.y` when `x` lies below `y`. What a request or a
/// manifest may ask of what a profile or policy grants.
pub fn within(name: &str, allow: &[String]) -> bool {
    let name = clean(name);
    match name.strip_prefix("*.") {
        None => !name.is_empty() && allowed(&name, allow),
        Some("") => false,
        Some(x) => allow.iter().any(|entry| {
            clean(entry).strip_prefix("*.").is_some_and(|y| x == y || x.ends_with(&format!(".{y}")))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn hosts_are_found_in_every_form() {
        let cases = [
            ("curl https://api.github.com/repos", vec!["api.github.com"]),
            ("curl --url=http://user:pw@Example.COM.:8080/x", vec!["example.com"]),
            ("git clone git@github.com:owner/repo.git", vec!["github.com"]),
            ("git clone ssh://git@gitlab.com/x.git", vec!["gitlab.com"]),
            ("scp file.txt backup:/srv/file.txt", vec!["backup"]),
            ("nc example.org:443", vec!["example.org"]),
            ("ssh -p 22 deploy@10.0.0.7", vec!["10.0.0.7"]),
            ("curl http://[::1]:9000/", vec!["::1"]),
            ("ls -la src/main.rs", vec![]),
            ("echo key:value a:b", vec![]),
            ("cat file:///etc/passwd", vec![]),
            // URL tools: every operand is a URL, with or without a scheme.
            ("curl evil.net", vec!["evil.net"]),
            ("curl -sS -o out.txt evil.net/x?y=1", vec!["evil.net"]),
            ("curl --output out.json internal:8080/api", vec!["internal"]),
            ("curl -H Host:a.example -u me:pw intranet", vec!["intranet"]),
            ("wget -O - -q files.example.org/a.tar.gz", vec!["files.example.org"]),
            ("wget --tries 3 -- 10.1.2.3", vec!["10.1.2.3"]),
            ("http --auth u:p POST api.example.com/items name=x X-Token:abc", vec!["api.example.com"]),
            // git: the repository of network commands, in scp-like form too.
            ("git clone evil.net:repo.git", vec!["evil.net"]),
            ("git -C src fetch origin-host:x main:main", vec!["origin-host"]),
            ("git remote add upstream mirror.example:pkg.git", vec!["mirror.example"]),
            ("git show HEAD:README.md", vec![]),
            ("git clone ./local/repo", vec![]),
            ("git clone /srv/repo.git:x", vec![]),
        ];
        for (cmd, want) in cases {
            assert_eq!(hosts_in(&argv(cmd)), want, "{cmd}");
        }
    }

    /// The review's bypasses of preflight, and the other ways the known tools
    /// have to connect elsewhere than the host they name.
    #[test]
    fn options_that_connect_elsewhere_are_found() {
        let refused = [
            ("curl --resolve github.com:443:127.0.0.1 https://github.com/", "curl --resolve"),
            ("curl --connect-to github.com:443:127.0.0.1:8080 https://github.com/", "curl --connect-to"),
            ("curl --resol=github.com:443:127.0.0.1 https://github.com/", "curl --resol"),
            ("curl -sSx 127.0.0.1:8080 https://github.com/", "curl -x"),
            ("curl -x127.0.0.1:8080 https://github.com/", "curl -x"),
            ("curl -K /tmp/cfg https://github.com/", "curl -K"),
            ("curl --unix-socket /run/docker.sock http://github.com/", "curl --unix-socket"),
            ("curl --socks5-hostname 127.0.0.1:1080 https://github.com/", "curl --socks5-hostname"),
            ("wget -e use_proxy=on -e https_proxy=127.0.0.1:8080 https://github.com/", "wget -e"),
            ("wget --execute=https_proxy=x https://github.com/", "wget --execute"),
            ("git -c http.proxy=127.0.0.1:8080 clone https://github.com/a/b", "git -c http.proxy"),
            (
                "git -c Http.https://github.com.Proxy=x clone https://github.com/a/b",
                "git -c http.https://github.com.proxy",
            ),
            (
                "git -c url.http://127.0.0.1/.insteadOf=https://github.com/ clone https://github.com/a/b",
                "git -c url.http://127.0.0.1/.insteadof",
            ),
            ("git --config-env=http.proxy=P fetch", "git -c http.proxy"),
            (
                "git clone -c http.curloptResolve=github.com:443:127.0.0.1 https://github.com/a/b",
                "git -c http.curloptresolve",
            ),
            ("ssh -o ProxyCommand=nc 127.0.0.1 22 github.com", "ssh -o proxycommand"),
            ("ssh -oHostName=127.0.0.1 git@github.com", "ssh -o hostname"),
            ("ssh -J jump.example github.com", "ssh -J"),
            ("ssh -R 8080:127.0.0.1:80 github.com", "ssh -R"),
            ("scp -S ./prog f github.com:f", "scp -S"),
            ("npm --https-proxy=http://127.0.0.1:8080 install", "npm --https-proxy"),
            ("pip install --proxy 127.0.0.1:8080 x", "pip --proxy"),
            ("nc -x 127.0.0.1:1080 github.com 443", "nc -x"),
            ("socat - TCP:127.0.0.1:80", "socat (its addresses are not read by the check)"),
        ];
        for (cmd, want) in refused {
            assert_eq!(redirection(&argv(cmd)).as_deref(), Some(want), "{cmd}");
        }
        for cmd in [
            "curl -sSLo out.tgz https://github.com/a/b/archive.tgz",
            "curl --retry 3 --output out https://github.com/",
            "wget -q -O - https://github.com/",
            "git -c user.name=x -c core.autocrlf=false clone https://github.com/a/b",
            "ssh -o StrictHostKeyChecking=yes -p 22 git@github.com",
            "pip install -r requirements.txt",
            "ls --resolve",
        ] {
            assert_eq!(redirection(&argv(cmd)), None, "{cmd}");
        }
    }

    #[test]
    fn allow_list_matches_exact_names_and_suffixes_only() {
        let allow = vec!["github.com".to_string(), "*.pkgs.example.org".to_string()];
        assert!(allowed("github.com", &allow));
        assert!(allowed("GitHub.com.", &allow));
        assert!(allowed("files.pkgs.example.org", &allow));
        assert!(!allowed("pkgs.example.org", &allow));
        assert!(!allowed("evilgithub.com", &allow));
        assert!(!allowed("github.com.evil.net", &allow));
        assert!(!allowed("xpkgs.example.org", &allow));
        // Cyrillic "і" in place of the Latin "i".
        assert!(!allowed("gіthub.com", &allow));
    }
}
