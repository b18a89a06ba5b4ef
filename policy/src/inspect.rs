//! Strict egress's inspected domains: the broker terminates the sandbox's
//! TLS to them (and reads their plain HTTP) and checks every request
//! against rules on its method and path.
//!
//! ```toml
//! [profiles.agent.inspect]
//! domains = ["github.com", "api.github.com"]
//! requests = ["read_only github.com/*", "POST api.github.com/repos/ORG/*"]
//! ```
//!
//! A rule is `METHODS HOST[PATH]`: `METHODS` is one method (`GET`), a list
//! (`GET,POST`), `*` (any) or `read_only` (GET, HEAD and OPTIONS); `HOST` an
//! inspected name or `*.suffix` pattern; `PATH` starts with `/`, and a `*`
//! in it matches any run of characters, `/` included (no `PATH`: any path).
//! A request to a host that some rule names must match one of the rules
//! naming it; a host no rule names allows every request (inspected all the
//! same). The path is matched without its query; a path the origin could
//! read otherwise (a `.` or `..` segment, an encoded `.`, `/` or `\`) is
//! refused whatever the rules say.

use crate::egress::{allowed, within};
use serde::Deserialize;

/// A profile's or tool's `inspect` table.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Inspection {
    /// Names (exact or `*.suffix`) whose connections the broker decrypts.
    pub domains: Vec<String>,
    /// Rules on the requests to them (see the module's documentation),
    /// parsed as the configuration is read.
    pub requests: Vec<RequestRule>,
    /// Secrets the proxy adds to requests to some inspected hosts, which
    /// the run never sees.
    pub credentials: Vec<CredentialGrant>,
}

/// One credential: a secret, the hosts it is for, and how it is sent.
///
/// ```toml
/// credentials = [
///   { secret = "gh", hosts = ["api.github.com"], header = "Authorization", format = "Bearer {}" },
///   { secret = "npm", hosts = ["registry.example.net"], env = "NPM_TOKEN" },
/// ]
/// ```
///
/// With `header`, the proxy sets that header (the value `format` with `{}`
/// replaced by the secret) on every request to the hosts. With `env`, the
/// run's variable holds a placeholder unique to the run, and the proxy
/// replaces it with the secret where the grant's `placeholder_in` puts it
/// (default `["Authorization"]`: that header's value, a Basic
/// authorization's decoded text included; a `?NAME` entry: the value of
/// that query parameter) in a request to the hosts; a request that carries
/// it anywhere else, or to any other host, is refused. Either way the
/// secret is added only over TLS to an origin whose certificate was
/// verified.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CredentialGrant {
    /// A secret by name: `$CREDENTIALS_DIRECTORY/NAME` when the broker has
    /// that directory (systemd's `LoadCredential=`), else the broker's
    /// secret store (`palisade plugin secret set NAME`).
    #[serde(default)]
    pub secret: Option<String>,
    /// Or a file holding the secret (absolute; readable by the broker
    /// alone: mode 0600 or 0400).
    #[serde(default)]
    pub file: Option<std::path::PathBuf>,
    /// Inspected hosts (names or `*.suffix`) the secret is sent to.
    pub hosts: Vec<String>,
    #[serde(default)]
    pub header: Option<String>,
    /// The header's value, `{}` standing for the secret (default `{}`).
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default)]
    pub env: Option<String>,
    /// Where an `env` grant's placeholder is swapped: header names, and
    /// `?NAME` for a query parameter (default `["Authorization"]`).
    #[serde(default)]
    pub placeholder_in: Option<Vec<String>>,
}

/// Where a placeholder goes when the grant does not say.
pub const DEFAULT_PLACEHOLDER_IN: &str = "Authorization";

impl CredentialGrant {
    /// The name results and the journal use: the secret's, or the file's path.
    pub fn name(&self) -> String {
        match (&self.secret, &self.file) {
            (Some(s), _) => s.clone(),
            (None, Some(f)) => f.display().to_string(),
            (None, None) => String::new(),
        }
    }

    fn check(&self, domains: &[String]) -> Result<(), String> {
        let what = format!("inspect.credentials ({})", self.name());
        match (&self.secret, &self.file) {
            (Some(s), None) if secret_name(s) => {}
            (Some(s), None) => return Err(format!("{what}: {s:?} is not a secret's name")),
            (None, Some(f)) if f.is_absolute() => {}
            (None, Some(f)) => return Err(format!("{what}: file {} must be an absolute path", f.display())),
            _ => return Err(format!("{what}: give exactly one of secret and file")),
        }
        match (&self.header, &self.env) {
            (Some(h), None) if !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') => {
            }
            (Some(h), None) => return Err(format!("{what}: {h:?} is not a header name")),
            (None, Some(e)) if !e.is_empty() && e.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
            }
            (None, Some(e)) => return Err(format!("{what}: {e:?} is not a variable name")),
            _ => return Err(format!("{what}: give exactly one of header and env")),
        }
        if let Some(f) = &self.format {
            if self.header.is_none() || f.matches("{}").count() != 1 || f.contains(['\r', '\n']) {
                return Err(format!("{what}: format goes with header and holds \"{{}}\" once, on one line"));
            }
        }
        if let Some(places) = &self.placeholder_in {
            if self.env.is_none() || places.is_empty() {
                return Err(format!("{what}: placeholder_in goes with env and names at least one place"));
            }
            if let Some(bad) = places.iter().find(|p| !placement(p)) {
                return Err(format!(
                    "{what}: placeholder_in: {bad:?} is neither a header name nor ?NAME (a query parameter)"
                ));
            }
        }
        if self.hosts.is_empty() {
            return Err(format!("{what}: hosts is empty"));
        }
        if let Some(h) = self.hosts.iter().find(|h| !within(h, domains)) {
            return Err(format!(
                "{what}: {h} is not in inspect.domains: a credential is added only where the broker \
                 reads the requests"
            ));
        }
        Ok(())
    }
}

/// A header name, or `?` and a query parameter's name.
fn placement(place: &str) -> bool {
    let name = place.strip_prefix('?').unwrap_or(place);
    let query = name.len() != place.len();
    !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric() || b == b'-' || (query && matches!(b, b'_' | b'.' | b'[' | b']'))
        })
}

/// `read_only`'s methods: those that change nothing on a well-behaved origin.
pub const READ_ONLY_METHODS: [&str; 3] = ["GET", "HEAD", "OPTIONS"];

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct RequestRule {
    /// The rule as written: what a refusal and the journal name.
    pub text: String,
    /// `None`: any method.
    methods: Option<Vec<String>>,
    host: String,
    path: String,
}

impl Inspection {
    /// Every name is one, and every rule and credential names inspected
    /// hosts (a rule on a host that is not decrypted could not be enforced).
    pub fn check(&self) -> Result<(), String> {
        for d in &self.domains {
            if d.is_empty() || d.contains(['/', ' ', ':']) || d == "*." {
                return Err(format!("inspect.domains: {d:?} is not a name or *.suffix pattern"));
            }
        }
        if let Some(rule) = self.requests.iter().find(|r| !within(&r.host, &self.domains)) {
            return Err(format!(
                "inspect.requests: {:?} names {}, which is not in inspect.domains: a rule can hold only \
                 where the broker reads the requests",
                rule.text, rule.host
            ));
        }
        self.credentials.iter().try_for_each(|c| c.check(&self.domains))
    }

    /// Whether `name` is inspected.
    pub fn covers(&self, name: &str) -> bool {
        allowed(name, &self.domains)
    }
}

impl TryFrom<String> for RequestRule {
    type Error = String;

    fn try_from(text: String) -> Result<RequestRule, String> {
        RequestRule::parse(&text).map_err(|e| format!("inspect.requests: {text:?}: {e}"))
    }
}

impl RequestRule {
    pub fn parse(text: &str) -> Result<RequestRule, String> {
        let (methods, target) = text
            .trim()
            .split_once(' ')
            .ok_or("a rule is METHODS HOST[/PATH], e.g. \"GET github.com/ORG/*\"")?;
        let methods = match methods {
            "*" => None,
            "read_only" => Some(READ_ONLY_METHODS.iter().map(|m| m.to_string()).collect()),
            list => {
                let list: Vec<String> = list.split(',').map(str::to_owned).collect();
                if let Some(bad) =
                    list.iter().find(|m| m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()))
                {
                    return Err(format!(
                        "{bad:?} is not a method (upper case, like GET), \"*\" or \"read_only\""
                    ));
                }
                Some(list)
            }
        };
        let target = target.trim();
        let (host, path) = match target.find('/') {
            Some(at) => (&target[..at], &target[at..]),
            None => (target, "/*"),
        };
        if host.is_empty() || host.contains([' ', '?', '#']) || path.contains([' ', '?', '#']) {
            return Err("a rule's host and path hold no space, '?' or '#'".into());
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        Ok(RequestRule { text: text.trim().to_owned(), methods, host, path: path.to_owned() })
    }

    /// Whether the rule names `host` (so that requests to it must match a rule).
    pub fn names(&self, host: &str) -> bool {
        allowed(host, std::slice::from_ref(&self.host))
    }

    /// Whether the rule allows `method` on `path` (its query excluded) of `host`.
    pub fn allows(&self, method: &str, host: &str, path: &str) -> bool {
        self.names(host)
            && self.methods.as_ref().is_none_or(|m| m.iter().any(|x| x == method))
            && glob(self.path.as_bytes(), path.as_bytes())
    }
}

/// A name the secret store keeps a file by (as `plugins::key_name` checks
/// it, which this module cannot import: `plugins` reads the configuration).
fn secret_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.len() <= 128
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// What rules say of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No rule names the host: every request to it is allowed.
    Unruled,
    /// Allowed by this rule.
    Allowed(String),
    /// Refused, and why (the rules that name the host, or the path's defect).
    Refused(String),
}

/// The verdict of `rules` on `method` and `target` (origin-form: path and
/// query) of a request to `host`.
pub fn judge(rules: &[RequestRule], method: &str, host: &str, target: &str) -> Verdict {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let naming: Vec<&RequestRule> = rules.iter().filter(|r| r.names(host)).collect();
    if naming.is_empty() {
        return Verdict::Unruled;
    }
    if let Some(defect) = ambiguous(path) {
        return Verdict::Refused(format!("the path {path:?} {defect}, which rules on paths cannot judge"));
    }
    match naming.iter().find(|r| r.allows(method, host, path)) {
        Some(rule) => Verdict::Allowed(rule.text.clone()),
        None => {
            let texts: Vec<&str> = naming.iter().map(|r| r.text.as_str()).collect();
            Verdict::Refused(format!(
                "{method} {host}{path} matches none of the rules on {host}: {}",
                texts.join("; ")
            ))
        }
    }
}

/// A path an origin might read as another one: not absolute, a `.` or
/// `..` segment (also with a `;` parameter after it, which some servers
/// drop before they resolve the path: `/..;/`), a percent-encoded `.`, `/`
/// or `\`, a backslash.
fn ambiguous(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("is not absolute");
    }
    if path.contains('\\') {
        return Some("holds a backslash");
    }
    let lower = path.to_ascii_lowercase();
    if ["%2e", "%2f", "%5c"].iter().any(|e| lower.contains(e)) {
        return Some("holds an encoded '.', '/' or '\\'");
    }
    if path.split('/').map(|s| s.split(';').next().unwrap_or_default()).any(|s| s == "." || s == "..") {
        return Some("holds a '.' or '..' segment");
    }
    None
}

/// `*` matches any run of bytes; everything else matches itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(texts: &[&str]) -> Vec<RequestRule> {
        texts.iter().map(|t| RequestRule::parse(t).unwrap()).collect()
    }

    #[test]
    fn methods_and_paths_are_matched() {
        let r = rules(&["read_only github.com/*", "GET,POST api.github.com/repos/ORG/*"]);
        assert_eq!(
            judge(&r, "GET", "github.com", "/x/y?z"),
            Verdict::Allowed("read_only github.com/*".into())
        );
        assert!(matches!(judge(&r, "POST", "github.com", "/x"), Verdict::Refused(_)));
        assert!(matches!(judge(&r, "POST", "api.github.com", "/repos/ORG/r/issues"), Verdict::Allowed(_)));
        assert!(matches!(judge(&r, "POST", "api.github.com", "/repos/OTHER/r"), Verdict::Refused(_)));
        assert!(matches!(judge(&r, "DELETE", "api.github.com", "/repos/ORG/r"), Verdict::Refused(_)));
        assert_eq!(judge(&r, "DELETE", "uploads.github.com", "/"), Verdict::Unruled);
    }

    #[test]
    fn paths_an_origin_could_read_otherwise_are_refused() {
        let r = rules(&["* a.test/repos/ORG/*"]);
        for path in [
            "/repos/ORG/../EVIL/x",
            "/repos/ORG/%2e%2e/EVIL",
            "/repos/ORG/%2F..",
            "/repos/ORG/.\\x",
            "/repos/ORG/./x",
            "/repos/ORG/..;/EVIL/x",
            "/repos/ORG/.;x=1/x",
            "*",
        ] {
            assert!(matches!(judge(&r, "GET", "a.test", path), Verdict::Refused(_)), "{path}");
        }
        assert!(matches!(judge(&r, "GET", "a.test", "/repos/ORG/a..b/c"), Verdict::Allowed(_)));
        assert!(matches!(judge(&r, "GET", "a.test", "/repos/ORG/a;v=1/c"), Verdict::Allowed(_)));
    }

    #[test]
    fn globs_match_runs_of_anything() {
        assert!(glob(b"/*", b"/"));
        assert!(glob(b"/a/*/c", b"/a/b/x/c"));
        assert!(!glob(b"/a/*/c", b"/a/b/x/d"));
        assert!(glob(b"/a.git/*", b"/a.git/info/refs"));
        assert!(!glob(b"/a.git/*", b"/b.git/info/refs"));
        assert!(!glob(b"/exact", b"/exact/more"));
    }

    #[test]
    fn credentials_must_name_a_source_a_way_and_inspected_hosts() {
        let parse = |text: &str| -> Result<(), String> {
            let grant: CredentialGrant = toml::from_str(text).map_err(|e| e.to_string())?;
            Inspection { domains: vec!["a.test".into()], credentials: vec![grant], ..Default::default() }
                .check()
        };
        assert_eq!(
            parse(
                "secret = \"gh\"\nhosts = [\"a.test\"]\nheader = \"Authorization\"\nformat = \"Bearer {}\""
            ),
            Ok(())
        );
        assert_eq!(parse("file = \"/run/t\"\nhosts = [\"a.test\"]\nenv = \"GH_TOKEN\""), Ok(()));
        assert_eq!(
            parse(
                "secret = \"k\"\nhosts = [\"a.test\"]\nenv = \"K\"\nplaceholder_in = [\"X-Api-Key\", \"?key\"]"
            ),
            Ok(())
        );
        for (text, want) in [
            (
                "secret = \"k\"\nhosts = [\"a.test\"]\nheader = \"X\"\nplaceholder_in = [\"X\"]",
                "placeholder_in goes with env",
            ),
            ("secret = \"k\"\nhosts = [\"a.test\"]\nenv = \"K\"\nplaceholder_in = []", "at least one place"),
            (
                "secret = \"k\"\nhosts = [\"a.test\"]\nenv = \"K\"\nplaceholder_in = [\"path\", \"a b\"]",
                "\"a b\" is neither",
            ),
            ("secret = \"k\"\nhosts = [\"a.test\"]\nenv = \"K\"\nplaceholder_in = [\"?\"]", "is neither"),
            ("hosts = [\"a.test\"]\nenv = \"T\"", "exactly one of secret and file"),
            ("secret = \"gh\"\nhosts = [\"a.test\"]", "exactly one of header and env"),
            ("secret = \"gh\"\nhosts = [\"b.test\"]\nenv = \"T\"", "not in inspect.domains"),
            (
                "secret = \"gh\"\nhosts = [\"a.test\"]\nenv = \"T\"\nformat = \"x{}\"",
                "format goes with header",
            ),
            ("file = \"rel\"\nhosts = [\"a.test\"]\nenv = \"T\"", "absolute"),
            ("secret = \"gh\"\nhosts = [\"a.test\"]\nenv = \"T\"\nvalue = \"x\"", "unknown field"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn rules_must_parse_and_name_an_inspected_host() {
        let parse = |rule: &str| -> Result<(), String> {
            let text = format!("domains = [\"*.x.test\"]\nrequests = [{rule:?}]");
            let inspection: Inspection = toml::from_str(&text).map_err(|e| e.to_string())?;
            inspection.check()
        };
        assert_eq!(parse("GET a.x.test/p"), Ok(()));
        for (requests, want) in [
            ("GET", "METHODS HOST"),
            ("get a.x.test/", "not a method"),
            ("GET other.test/", "not in inspect.domains"),
            ("GET a.x.test/p?q", "no space, '?' or '#'"),
        ] {
            let e = parse(requests).unwrap_err();
            assert!(e.contains(want), "{requests}: {e}");
        }
    }
}
