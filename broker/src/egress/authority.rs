//! The broker's own certificate authority, for strict egress's inspected
//! domains: made on first use in `tls/` of the broker's state directory
//! (`ca.pem`, and `ca.key` mode 0600 in a directory of mode 0700, which no
//! run can reach: the state directory is kept out of every sandbox), it
//! issues a leaf certificate per inspected name, kept in memory. Rotation:
//! stop the broker, remove `tls/`, start it; the next inspected run makes a
//! new authority (runs trust the certificate of the run's start).
//!
//! It also holds the TLS configurations the proxy speaks: as a server to
//! the sandbox (HTTP/1.1 only, offered by ALPN: a client asking for HTTP/2
//! alone is refused in the handshake), and as a client to origins, verified
//! against the host's trust roots or `[egress] ca_bundle`.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where the host keeps its trust roots, in the order they are looked for
/// (Debian and Ubuntu, Fedora and RHEL, Alpine and macOS-like, openSUSE).
pub const HOST_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];
/// The variables that point a run's TLS clients at its bundle (see
/// [`run_bundle_path`]).
pub const BUNDLE_VARIABLES: [&str; 6] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
];
/// Leaf certificates kept in memory, per authority (names beyond it are
/// issued again at each connection).
const MAX_LEAVES: usize = 1024;

/// The authority and the TLS configurations made from it.
pub struct Authority {
    dir: PathBuf,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    upstream: Mutex<HashMap<Option<PathBuf>, Arc<ClientConfig>>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// The authorities of this process, by directory (one in a broker).
static AUTHORITIES: Mutex<Vec<Arc<Authority>>> = Mutex::new(Vec::new());

/// The authority kept in `dir`, loaded or made on first use.
pub fn shared(dir: &Path) -> Result<Arc<Authority>, String> {
    let mut all = AUTHORITIES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = all.iter().find(|a| a.dir == dir) {
        return Ok(found.clone());
    }
    let made = Arc::new(Authority::open(dir)?);
    all.push(made.clone());
    Ok(made)
}

/// Where a run's bundle goes: over the host's own bundle, a regular file in
/// `/etc/ssl` (which the sandbox's `/etc` holds), so that a client's
/// default trust roots hold the authority too.
pub fn run_bundle_path() -> Result<&'static str, String> {
    let in_etc_ssl = HOST_BUNDLES.iter().filter(|p| p.starts_with("/etc/ssl/"));
    in_etc_ssl.clone().copied().find(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_file())).ok_or_else(
        || {
            let names: Vec<&str> = in_etc_ssl.copied().collect();
            format!(
                "a run trusts the broker's authority through the host's bundle of trust roots, a regular \
             file at one of {}, and this host has none",
                names.join(", ")
            )
        },
    )
}

/// The authority a plan's inspected domains need: `tls/` of the broker's
/// state directory; `None` when the plan inspects none.
pub fn for_plan(plan: &palisade_policy::EgressPlan) -> Result<Option<Arc<Authority>>, String> {
    if plan.inspect.is_empty() {
        return Ok(None);
    }
    let state = crate::host::paths::default_state_dir()?;
    shared(&state.join("tls")).map(Some)
}

/// ring's suites with AES-128-GCM first: the broker encrypts every byte of
/// an inspected connection twice, and AES-128 costs about two thirds of
/// AES-256 (both with the CPU's AES instructions, where the broker and its
/// runs share a machine); ChaCha20 for peers that offer nothing else.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    let rank = |s: &rustls::SupportedCipherSuite| {
        let name = format!("{:?}", s.suite());
        match (name.contains("AES_128"), name.contains("AES_256")) {
            (true, _) => 0,
            (_, true) => 1,
            _ => 2,
        }
    };
    provider
        .cipher_suites
        .sort_by_key(|s| (s.version().version != rustls::ProtocolVersion::TLSv1_3, rank(s)));
    Arc::new(provider)
}

impl Authority {
    /// Loads the authority in `dir`, or makes one there.
    pub fn open(dir: &Path) -> Result<Authority, String> {
        let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
        let what =
            |e: &dyn std::fmt::Display| format!("the TLS inspection authority in {}: {e}", dir.display());
        if !key.exists() {
            crate::host::paths::create_dirs(dir, 0o700).map_err(|e| what(&e))?;
            make(&cert, &key).map_err(|e| what(&e))?;
        }
        let ca_pem = fs::read_to_string(&cert).map_err(|e| what(&e))?;
        let key_pem = fs::read_to_string(&key).map_err(|e| what(&e))?;
        let signing = KeyPair::from_pem(&key_pem).map_err(|e| what(&e))?;
        // The same subject as the certificate's (its parameters are fixed):
        // what the leaves name as their issuer.
        let issuer = Issuer::new(ca_params().map_err(|e| what(&e))?, signing);
        Ok(Authority {
            dir: dir.to_path_buf(),
            ca_pem,
            issuer,
            leaves: Mutex::new(HashMap::new()),
            upstream: Mutex::new(HashMap::new()),
        })
    }

    /// The authority's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// What a run trusts: the host's roots (the bundle at `path`) and the
    /// authority's certificate.
    pub fn run_bundle(&self, path: &Path) -> Result<String, String> {
        let host = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(format!("{}\n{}", host.trim_end(), self.ca_pem))
    }

    /// The server side for `name`: a leaf for it, signed by the authority.
    pub fn server_config(&self, name: &str) -> Result<Arc<ServerConfig>, String> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = leaves.get(name) {
            return Ok(config.clone());
        }
        let key = KeyPair::generate().map_err(|e| format!("a key for {name}: {e}"))?;
        let mut params = CertificateParams::new(vec![name.to_owned()])
            .map_err(|e| format!("a certificate for {name}: {e}"))?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages.push(KeyUsagePurpose::DigitalSignature);
        params.extended_key_usages.push(rcgen::ExtendedKeyUsagePurpose::ServerAuth);
        let leaf = params.signed_by(&key, &self.issuer).map_err(|e| format!("signing for {name}: {e}"))?;
        let key =
            PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| format!("the key for {name}: {e}"))?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .map_err(|e| format!("the certificate for {name}: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // The broker's order of suites (see `provider`), not the client's.
        config.ignore_client_order = true;
        let config = Arc::new(config);
        if leaves.len() < MAX_LEAVES {
            leaves.insert(name.to_owned(), config.clone());
        }
        Ok(config)
    }

    /// The client side towards origins: trust roots from `bundle`, else the host's.
    pub fn client_config(&self, bundle: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
        let key = bundle.map(Path::to_path_buf);
        let mut upstream = self.upstream.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = upstream.get(&key) {
            return Ok(config.clone());
        }
        let path = match bundle {
            Some(p) => p.to_path_buf(),
            None => HOST_BUNDLES.iter().map(PathBuf::from).find(|p| p.exists()).ok_or_else(|| {
                format!("no trust roots on this host ({}): set [egress] ca_bundle", HOST_BUNDLES.join(", "))
            })?,
        };
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (added, _) = roots.add_parsable_certificates(certs.filter_map(Result::ok));
        if added == 0 {
            return Err(format!("{} holds no certificate", path.display()));
        }
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        upstream.insert(key, config.clone());
        Ok(config)
    }
}

/// The authority's certificate: a CA for leaves only (path length 0).
fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.distinguished_name.push(DnType::CommonName, "palisade egress inspection");
    params.distinguished_name.push(DnType::OrganizationName, "palisade");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

/// Makes a CA: its certificate, and its key written mode 0600 (never
/// readable by anyone else, from its first byte).
fn make(cert: &Path, key: &Path) -> Result<(), String> {
    let signing = KeyPair::generate().map_err(|e| e.to_string())?;
    let ca = ca_params().and_then(|p| p.self_signed(&signing)).map_err(|e| e.to_string())?;
    let write = |path: &Path, text: &str, mode: u32| -> std::io::Result<()> {
        let temp = path.with_extension("new");
        let _ = fs::remove_file(&temp);
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&temp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        fs::rename(&temp, path)
    };
    write(cert, &ca.pem(), 0o644).map_err(|e| format!("{}: {e}", cert.display()))?;
    write(key, &signing.serialize_pem(), 0o600).map_err(|e| format!("{}: {e}", key.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_authority_is_made_once_with_a_private_key() {
        let dir = std::env::temp_dir().join(format!("palisade-ca-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = Authority::open(&dir.join("tls")).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("tls/ca.key")), 0o600);
        assert_eq!(mode(&dir.join("tls")), 0o700);
        let b = Authority::open(&dir.join("tls")).unwrap();
        assert_eq!(a.ca_pem(), b.ca_pem(), "made once, loaded after");
        assert!(a.server_config("a.test").is_ok());
        if let Ok(path) = run_bundle_path() {
            assert!(a.run_bundle(Path::new(path)).unwrap().ends_with(a.ca_pem()));
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
