//! Credentials the run never sees: the proxy adds a secret to inspected
//! requests to the hosts it is granted for (`inspect.credentials`), and
//! only over TLS to an origin whose certificate it verified. A header
//! grant sets a header; an env grant swaps the run's placeholder for the
//! secret where the grant puts it (`placeholder_in`: headers, a Basic
//! authorization's decoded text, query parameters), and refuses a request
//! that carries it anywhere else or to another host. Every request the
//! proxy reads is searched for the secret itself (and its encodings), and
//! a granted host's answer has it replaced by the placeholder
//! (`scrub.rs`): an origin that echoes what it was sent hands the run the
//! placeholder back, never the secret. Secret values live in this module's
//! [`Live`] and the [`Secrets`] finder only: never in a plan, a record, a
//! log or a result.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use hyper::header::{HeaderName, HeaderValue};
use hyper::http::request::Parts;
use palisade_policy::EgressPlan;
use palisade_policy::egress::allowed;
use palisade_policy::inspect::DEFAULT_PLACEHOLDER_IN;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Largest secret: a token or a key, not a file's worth.
const MAX_SECRET_BYTES: u64 = 64 * 1024;
/// systemd's credentials of the service (`LoadCredential=`).
const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";
/// Shortest encoded form searched for: a shorter one would match text
/// that merely happens to hold it.
const MIN_FORM: usize = 8;
/// Longest piece of a secret searched for (one per byte of it).
const MAX_PIECE: usize = 64;
/// Shortest secret: a shorter one is guessed, and found in ordinary text.
const MIN_SECRET_BYTES: usize = 16;

/// One credential with its value, for the run.
pub struct Live {
    name: String,
    hosts: Vec<String>,
    /// A header grant: the header and its value, secret in place.
    header: Option<(HeaderName, HeaderValue)>,
    /// What stands for the secret: the run's placeholder (an env grant),
    /// or one of the broker's own (a header grant, for answers).
    placeholder: String,
    /// An env grant: the headers where the placeholder is swapped.
    in_headers: Vec<HeaderName>,
    /// An env grant: the query parameters where the placeholder is swapped.
    in_query: Vec<String>,
    value: String,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("name", &self.name).field("hosts", &self.hosts).finish_non_exhaustive()
    }
}

/// A run's credentials, and the finder of their secrets.
#[derive(Debug, Default)]
pub struct Credentials {
    pub(super) live: Vec<Live>,
    pub(super) secrets: Option<std::sync::Arc<Secrets>>,
    /// The run sent a secret itself: it has it, or guessed it. Its network
    /// is closed from then on (each refusal would otherwise tell a guess
    /// that hit from one that missed, as often as the run asked).
    tripped: std::sync::atomic::AtomicBool,
}

/// Every form of every secret, found at once.
pub struct Secrets {
    finder: AhoCorasick,
    /// For each pattern, the credential it is a form of.
    owner: Vec<usize>,
    /// For each credential, what replaces its secret in an answer.
    stand_in: Vec<Vec<u8>>,
    /// The longest pattern's length.
    pub(super) longest: usize,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets").field("patterns", &self.owner.len()).finish_non_exhaustive()
    }
}

/// A fresh placeholder, unique to a run and opaque: it tells nothing of
/// the credential or where its secret is kept.
pub fn placeholder() -> String {
    let mut random = [0u8; 16];
    // A failing source of randomness leaves a placeholder that is still
    // not the secret, only guessable.
    let _ = getrandom::fill(&mut random);
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    format!("palisade-credential-{hex}")
}

/// Reads every credential's secret.
pub fn load(plan: &EgressPlan) -> Result<Credentials, String> {
    let live = plan.credentials.iter().map(|c| one(plan, c)).collect::<Result<Vec<Live>, String>>()?;
    let secrets = if live.is_empty() { None } else { Some(std::sync::Arc::new(Secrets::new(&live)?)) };
    Ok(Credentials { live, secrets, tripped: Default::default() })
}

fn one(plan: &EgressPlan, c: &palisade_policy::Credential) -> Result<Live, String> {
    let g = &c.grant;
    let name = g.name();
    let value = read(plan, g).map_err(|e| format!("credential {name}: {e}"))?;
    let header = match &g.header {
        Some(h) => {
            let text = g.format.as_deref().unwrap_or("{}").replace("{}", &value);
            let name = HeaderName::from_bytes(h.as_bytes()).map_err(|e| format!("{h}: {e}"))?;
            let value = HeaderValue::from_str(&text)
                .map_err(|_| format!("credential {}: the secret is not a header's text", g.name()))?;
            Some((name, value))
        }
        None => None,
    };
    if g.env.is_some() && c.placeholder.is_empty() {
        return Err(format!("credential {name}: the run was given no placeholder"));
    }
    let places = g.placeholder_in.clone().unwrap_or_else(|| vec![DEFAULT_PLACEHOLDER_IN.into()]);
    let (query, headers): (Vec<String>, Vec<String>) = places.into_iter().partition(|p| p.starts_with('?'));
    let in_headers = match g.env {
        Some(_) => headers
            .iter()
            .map(|h| HeaderName::from_bytes(h.as_bytes()).map_err(|e| format!("credential {name}: {h}: {e}")))
            .collect::<Result<_, _>>()?,
        None => vec![],
    };
    let in_query = if g.env.is_some() { query.iter().map(|q| q[1..].to_owned()).collect() } else { vec![] };
    let placeholder = if c.placeholder.is_empty() { placeholder() } else { c.placeholder.clone() };
    Ok(Live { name, hosts: g.hosts.clone(), header, placeholder, in_headers, in_query, value })
}

fn read(plan: &EgressPlan, grant: &palisade_policy::inspect::CredentialGrant) -> Result<String, String> {
    let path = match (&grant.secret, &grant.file) {
        (_, Some(file)) => file.clone(),
        (Some(name), None) => secret_path(plan, name)?,
        (None, None) => return Err("no source".into()),
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} must be a regular file only its owner may read (mode 0600 or 0400; it is {:o})",
            path.display(),
            meta.mode() & 0o7777
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_SECRET_BYTES {
        return Err(format!("{} is over {MAX_SECRET_BYTES} bytes", path.display()));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("{} is not text", path.display()))?;
    let value = text.trim_end_matches(['\r', '\n']).to_owned();
    if value.is_empty() || value.contains(['\r', '\n', '\0']) {
        return Err(format!("{} holds an empty secret or more than one line", path.display()));
    }
    if value.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "{} holds a secret of {} bytes: one under {MIN_SECRET_BYTES} is guessed, and found in ordinary \
             text, which the broker searches for it",
            path.display(),
            value.len()
        ));
    }
    Ok(value)
}

/// A named secret: systemd's credential of that name when the service has
/// them, else the broker's secret store.
fn secret_path(plan: &EgressPlan, name: &str) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(CREDENTIALS_DIRECTORY).map(PathBuf::from) {
        let path = dir.join(name);
        if path.exists() {
            return Ok(path);
        }
    }
    let dir = match &plan.secrets_dir {
        Some(d) => d.clone(),
        None => crate::host::paths::default_state_dir()?.join(crate::host::paths::SECRETS_DIR),
    };
    Ok(Path::new(&dir).join(name))
}

/// The forms a secret travels in: itself and each run of half of it (an
/// origin that echoes a value cut short shows a piece), percent-encoded as common encoders do (every reserved byte, or
/// `/` kept, or a form's `+` for a space; either case of hex), JSON-escaped,
/// and the part of its base64 (standard and URL-safe) that does not depend
/// on what is beside it, at each of the three alignments.
fn forms(secret: &str) -> Vec<Vec<u8>> {
    let raw = secret.as_bytes();
    let mut out = vec![raw.to_vec()];
    // Pieces: every run of half of it (at least MIN_FORM bytes, at most
    // MAX_PIECE), which a longer piece holds: found in it, the rest of it
    // is shorter than the run.
    let piece = raw.len().div_ceil(2).clamp(MIN_FORM, MAX_PIECE);
    if piece < raw.len() {
        out.extend(raw.windows(piece).map(<[u8]>::to_vec));
    }
    for keep in ["", "/"] {
        for form in [false, true] {
            let mut upper = String::new();
            for &b in raw {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.as_bytes().contains(&b) {
                    upper.push(b as char);
                } else if form && b == b' ' {
                    upper.push('+');
                } else {
                    upper.push_str(&format!("%{b:02X}"));
                }
            }
            out.push(lower_escapes(&upper).into_bytes());
            out.push(upper.into_bytes());
        }
    }
    let json = serde_json::to_string(secret).unwrap_or_default();
    let json = json.trim_matches('"').to_owned();
    out.push(json.replace('/', "\\/").into_bytes());
    out.push(json.into_bytes());
    for shift in 0..3 {
        let mut bytes = vec![0u8; shift];
        bytes.extend_from_slice(raw);
        let (from, to) = ((8 * shift).div_ceil(6), (8 * bytes.len()) / 6);
        for engine in [
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            let text = engine.encode(&bytes);
            if let Some(core) = text.get(from..to) {
                out.push(core.as_bytes().to_vec());
            }
        }
    }
    let first = out[0].clone();
    out.retain(|f| f == &first || f.len() >= MIN_FORM);
    out.sort();
    out.dedup();
    out
}

/// `%AB` escapes in lower case.
fn lower_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut hex = 0;
    for c in text.chars() {
        if c == '%' {
            hex = 2;
            out.push(c);
        } else if hex > 0 {
            hex -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

impl Secrets {
    fn new(live: &[Live]) -> Result<Secrets, String> {
        let mut patterns = Vec::new();
        let mut owner = Vec::new();
        for (i, c) in live.iter().enumerate() {
            for form in forms(&c.value) {
                patterns.push(form);
                owner.push(i);
            }
        }
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|e| format!("the credentials' finder: {e}"))?;
        let longest = patterns.iter().map(Vec::len).max().unwrap_or(1);
        let stand_in = live.iter().map(|c| c.placeholder.clone().into_bytes()).collect();
        Ok(Secrets { finder, owner, stand_in, longest })
    }

    /// The credential whose secret `text` holds, in any form.
    fn found(&self, text: &[u8]) -> Option<usize> {
        self.finder.find(text).map(|m| self.owner[m.pattern().as_usize()])
    }

    /// `text` with every secret replaced by what stands for it; `None`
    /// when it holds none.
    pub(super) fn replaced(&self, text: &[u8]) -> Option<Vec<u8>> {
        self.finder.find(text)?;
        let mut out = Vec::with_capacity(text.len());
        let mut at = 0;
        for m in self.finder.find_iter(text) {
            out.extend_from_slice(&text[at..m.start()]);
            out.extend_from_slice(&self.stand_in[self.owner[m.pattern().as_usize()]]);
            at = m.end();
        }
        out.extend_from_slice(&text[at..]);
        Some(out)
    }

    /// The front of `buf` that no secret can span into what comes next
    /// (all of it at the `end`), with every secret in it replaced; it is
    /// taken out of `buf`.
    pub(super) fn take(&self, buf: &mut Vec<u8>, end: bool) -> Vec<u8> {
        let mut cut = if end { buf.len() } else { buf.len().saturating_sub(self.longest - 1) };
        let mut out = Vec::with_capacity(cut);
        let mut at = 0;
        for m in self.finder.find_iter(&buf[..]) {
            if m.start() >= cut {
                break;
            }
            out.extend_from_slice(&buf[at..m.start()]);
            out.extend_from_slice(&self.stand_in[self.owner[m.pattern().as_usize()]]);
            at = m.end();
            cut = cut.max(at);
        }
        out.extend_from_slice(&buf[at..cut]);
        buf.drain(..cut);
        out
    }
}

impl Credentials {
    /// Whether a credential is granted for `host`: its answers are searched.
    pub fn granted(&self, host: &str) -> bool {
        self.live.iter().any(|c| allowed(host, &c.hosts))
    }

    /// Why the run's network is closed, once it sent a secret itself.
    pub fn closed(&self) -> Option<String> {
        self.tripped.load(std::sync::atomic::Ordering::Relaxed).then(|| {
            "the run sent a credential's secret itself: its network is closed for the rest of the run".into()
        })
    }

    fn trip(&self) -> String {
        self.tripped.store(true, std::sync::atomic::Ordering::Relaxed);
        SECRET_CARRIED.into()
    }

    /// Whether the request's head carries a secret (its target, a header's
    /// name or value, a Basic authorization's decoded text).
    fn carries_secret(&self, parts: &Parts) -> bool {
        let Some(secrets) = self.secrets.as_ref() else { return false };
        let found = |text: &[u8]| secrets.found(text).is_some();
        found(parts.uri.to_string().as_bytes())
            || parts.headers.iter().any(|(name, value)| {
                found(name.as_str().as_bytes())
                    || found(value.as_bytes())
                    || value.to_str().ok().and_then(basic).is_some_and(|d| found(d.as_bytes()))
            })
    }

    /// A plain HTTP request head the proxy passes on unread: refused when
    /// it carries a secret (and the run's network closed).
    pub fn check_head(&self, head: &[u8]) -> Result<(), String> {
        match self.secrets.as_ref().and_then(|s| s.found(head)) {
            Some(_) => Err(self.trip()),
            None => Ok(()),
        }
    }
}

/// Why a request carrying a secret is refused; which credential's is not
/// said.
const SECRET_CARRIED: &str = "the request carries a credential's secret itself (or an encoding or a piece of \
                              it): the broker adds it only where a grant says, and a run is never to send it; \
                              the run's network is closed";

/// Where a request carries a placeholder.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// A header whose value is the placeholder alone, `SCHEME PLACEHOLDER`,
    /// or `Basic` of `USER:PLACEHOLDER`.
    Header(HeaderName),
    /// A query parameter whose value is the placeholder alone.
    Query(String),
    /// Anywhere else: the path, a parameter's name, beside other text.
    Around(String),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Header(h) => write!(f, "the header {h}"),
            Place::Query(q) => write!(f, "the query parameter ?{q}"),
            Place::Around(what) => write!(f, "{what}"),
        }
    }
}

/// Adds the credentials granted for `host` to a request (`tls`: on a TLS
/// connection to a verified origin), and refuses one that carries a
/// secret, or a placeholder anywhere but where its grant puts it. The
/// names of the credentials used.
pub fn apply(creds: &Credentials, host: &str, tls: bool, parts: &mut Parts) -> Result<Vec<String>, String> {
    if let Some(closed) = creds.closed() {
        return Err(closed);
    }
    if creds.carries_secret(parts) {
        return Err(creds.trip());
    }
    let plain = |c: &Live| {
        format!(
            "credential {} is added only over TLS to an origin whose certificate the broker verified; this \
             request to {host} is plain HTTP",
            c.name
        )
    };
    let mut used = Vec::new();
    for c in &creds.live {
        let granted = allowed(host, &c.hosts);
        if c.header.is_none() {
            let places = carried(parts, &c.placeholder);
            if places.is_empty() {
                continue;
            }
            if !granted {
                return Err(format!(
                    "the request carries credential {}'s placeholder to {host}, which it is not granted for \
                     (granted: {})",
                    c.name,
                    c.hosts.join(", ")
                ));
            }
            if let Some(p) = places.iter().find(|p| !c.may_carry(p)) {
                return Err(format!(
                    "the request carries credential {}'s placeholder in {p}, where its grant does not put it \
                     (placeholder_in: {})",
                    c.name,
                    c.places().join(", ")
                ));
            }
            if !tls {
                return Err(plain(c));
            }
            c.swap(parts);
            used.push(c.name.clone());
        } else if let (Some((name, value)), true) = (&c.header, granted) {
            if !tls {
                return Err(plain(c));
            }
            parts.headers.insert(name.clone(), value.clone());
            used.push(c.name.clone());
        }
    }
    Ok(used)
}

/// Everywhere the request's head carries `placeholder`. Where the grant
/// may put it, it must stand alone (the whole value, after a scheme, or a
/// Basic authorization's password): text the run puts beside the secret
/// (`%2` before it, padding to be cut) would come back in an echo joined
/// to it, in a form not searched for.
fn carried(parts: &Parts, placeholder: &str) -> Vec<Place> {
    let mut places = Vec::new();
    for (name, value) in &parts.headers {
        let text = String::from_utf8_lossy(value.as_bytes());
        let decoded = basic(&text);
        if !text.contains(placeholder) && !decoded.as_ref().is_some_and(|d| d.contains(placeholder)) {
            continue;
        }
        let alone = text == placeholder
            || text.split_once(' ').is_some_and(|(scheme, rest)| {
                rest == placeholder && !scheme.is_empty() && scheme.bytes().all(|b| b.is_ascii_alphanumeric())
            })
            || decoded
                .is_some_and(|d| d.split_once(':').is_some_and(|(_, password)| password == placeholder));
        places.push(match alone {
            true => Place::Header(name.clone()),
            false => Place::Around(format!("the header {name}, beside other text")),
        });
    }
    if parts.uri.path().contains(placeholder) {
        places.push(Place::Around("the request's path".into()));
    }
    for pair in parts.uri.query().unwrap_or_default().split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key.contains(placeholder) {
            places.push(Place::Around("a query parameter's name".into()));
        } else if value == placeholder {
            places.push(Place::Query(key.to_owned()));
        } else if value.contains(placeholder) {
            places.push(Place::Around(format!("the query parameter ?{key}, beside other text")));
        }
    }
    places
}

impl Live {
    fn may_carry(&self, place: &Place) -> bool {
        match place {
            Place::Header(h) => self.in_headers.contains(h),
            Place::Query(q) => self.in_query.contains(q),
            Place::Around(_) => false,
        }
    }

    fn places(&self) -> Vec<String> {
        let headers = self.in_headers.iter().map(|h| h.to_string());
        headers.chain(self.in_query.iter().map(|q| format!("?{q}"))).collect()
    }

    /// The placeholder replaced by the secret where the grant puts it
    /// (every place it is carried was checked to be one of those).
    fn swap(&self, parts: &mut Parts) {
        for (name, header) in parts.headers.iter_mut() {
            if !self.in_headers.contains(name) {
                continue;
            }
            let Ok(text) = header.to_str() else { continue };
            let replaced = match basic(text) {
                Some(decoded) if decoded.contains(&self.placeholder) => {
                    let inner = base64::engine::general_purpose::STANDARD
                        .encode(decoded.replace(&self.placeholder, &self.value));
                    format!("Basic {inner}")
                }
                _ => text.replace(&self.placeholder, &self.value),
            };
            if let Ok(new) = HeaderValue::from_str(&replaced) {
                *header = new;
            }
        }
        let Some(query) = parts.uri.query().filter(|q| q.contains(&self.placeholder)) else { return };
        let query = query.replace(&self.placeholder, &self.value);
        let target = format!("{}?{query}", parts.uri.path());
        let mut uri = hyper::http::uri::Builder::new();
        if let (Some(scheme), Some(authority)) = (parts.uri.scheme(), parts.uri.authority()) {
            uri = uri.scheme(scheme.clone()).authority(authority.clone());
        }
        if let Ok(uri) = uri.path_and_query(target).build() {
            parts.uri = uri;
        }
    }
}

/// The decoded text of a `Basic` authorization.
fn basic(value: &str) -> Option<String> {
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(rest.trim()).ok()?;
    String::from_utf8(bytes).ok()
}
