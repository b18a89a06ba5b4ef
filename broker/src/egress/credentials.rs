//! Credentials the run never sees: the proxy adds a secret to inspected
//! requests to the hosts it is granted for (`inspect.credentials`). A
//! header grant sets a header; an env grant swaps the run's placeholder
//! for the secret wherever a request to the hosts carries it (a header
//! value, a Basic authorization's decoded text, the target), and refuses a
//! request that carries it anywhere else. Secret values live in this
//! module's [`Live`] only: never in a plan, a record, a log or a result.

use base64::Engine as _;
use hyper::header::{HeaderName, HeaderValue};
use hyper::http::request::Parts;
use palisade_policy::EgressPlan;
use palisade_policy::egress::allowed;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Largest secret: a token or a key, not a file's worth.
const MAX_SECRET_BYTES: u64 = 64 * 1024;
/// systemd's credentials of the service (`LoadCredential=`).
const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// One credential with its value, for the run.
pub struct Live {
    name: String,
    hosts: Vec<String>,
    /// A header grant: the header and its value, secret in place.
    header: Option<(HeaderName, HeaderValue)>,
    /// An env grant: the run's placeholder (empty for a header grant).
    placeholder: String,
    value: String,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("name", &self.name).field("hosts", &self.hosts).finish_non_exhaustive()
    }
}

/// A fresh placeholder for the credential `name`, unique to a run.
pub fn placeholder(name: &str) -> String {
    let mut random = [0u8; 16];
    // A failing source of randomness leaves a placeholder that is still
    // the run's own name and counter: never the secret.
    let _ = getrandom::fill(&mut random);
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let name: String = name.chars().filter(char::is_ascii_alphanumeric).take(24).collect();
    format!("palisade-credential-{name}-{hex}")
}

/// Reads every credential's secret.
pub fn load(plan: &EgressPlan) -> Result<Vec<Live>, String> {
    plan.credentials
        .iter()
        .map(|c| {
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
            Ok(Live { name, hosts: g.hosts.clone(), header, placeholder: c.placeholder.clone(), value })
        })
        .collect()
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

/// Adds the credentials granted for `host` to a request, and refuses one
/// that carries a placeholder to a host it is not granted for. The names
/// of the credentials used.
pub fn apply(live: &[Live], host: &str, parts: &mut Parts) -> Result<Vec<String>, String> {
    let mut used = Vec::new();
    for c in live {
        let granted = allowed(host, &c.hosts);
        if !c.placeholder.is_empty() {
            let carried = swap(parts, &c.placeholder, granted.then_some(c.value.as_str()));
            if carried && !granted {
                return Err(format!(
                    "the request carries credential {}'s placeholder to {host}, which it is not granted for \
                     (granted: {})",
                    c.name,
                    c.hosts.join(", ")
                ));
            }
            if carried {
                used.push(c.name.clone());
            }
        }
        if let (Some((name, value)), true) = (&c.header, granted) {
            parts.headers.insert(name.clone(), value.clone());
            used.push(c.name.clone());
        }
    }
    Ok(used)
}

/// Whether the request carries `placeholder` (a header value, a Basic
/// authorization's decoded text, the target); with `value`, each is
/// replaced by it.
fn swap(parts: &mut Parts, placeholder: &str, value: Option<&str>) -> bool {
    let mut carried = false;
    for header in parts.headers.values_mut() {
        let Ok(text) = header.to_str() else { continue };
        let replaced = match basic(text) {
            Some(decoded) if decoded.contains(placeholder) => {
                carried = true;
                value.map(|v| {
                    let inner =
                        base64::engine::general_purpose::STANDARD.encode(decoded.replace(placeholder, v));
                    format!("Basic {inner}")
                })
            }
            _ if text.contains(placeholder) => {
                carried = true;
                value.map(|v| text.replace(placeholder, v))
            }
            _ => None,
        };
        if let Some(new) = replaced.and_then(|t| HeaderValue::from_str(&t).ok()) {
            *header = new;
        }
    }
    let target = parts.uri.to_string();
    if target.contains(placeholder) {
        carried = true;
        if let Some(uri) = value.and_then(|v| target.replace(placeholder, v).parse().ok()) {
            parts.uri = uri;
        }
    }
    carried
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
