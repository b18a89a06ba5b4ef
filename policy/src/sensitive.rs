//! Sensitive paths: what no run is given, whatever grants it. Credentials
//! and keys by name wherever they are, a few more by name in a home
//! directory, absolute paths (`/etc/shadow`, the Docker socket), and the
//! patterns the configuration adds. Both the configuration's check (a grant
//! of a sensitive path is an error) and each request's validation ask here.

use globset::{Glob, GlobSet, GlobSetBuilder};
use std::path::{Component, Path};

/// Credentials and keys, by name: refused wherever a path leads to one (a
/// home directory or a project alike), and hidden when a granted directory,
/// or a home directory inside one, holds it. The union of what the
/// sandboxes and secret scanners palisade is compared with protect (firejail,
/// nono, Codex, agent-safehouse, shhgit), less what ordinary builds need
/// (`~/.cargo`, `~/.npm`, `~/.m2` stay; their credential files do not).
pub const SENSITIVE_NAMES: &[&str] = &[
    // Keys and keyrings.
    ".ssh",
    ".gnupg",
    ".password-store",
    ".pki",
    ".local/share/keyrings",
    ".local/share/kwalletd",
    ".gnome2/keyrings",
    ".1password",
    ".config/op",
    ".minisign",
    // Cloud and cluster credentials.
    ".aws",
    ".kube",
    ".config/gcloud",
    ".docker",
    ".dockercfg",
    ".config/containers/auth.json",
    ".tsh",
    ".boto",
    ".s3cfg",
    ".passwd-s3fs",
    ".config/doctl",
    ".config/rclone",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
    // Forges, registries and package indexes.
    ".git-credentials",
    ".git-credential-cache",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".config/glab-cli",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".pypirc",
    ".config/pypoetry/auth.toml",
    ".ivy2/.credentials",
    ".sbt/credentials",
    ".terraformrc",
    ".pulumi/credentials.json",
    ".databrickscfg",
    // Agents' and model hubs' sign-ins.
    ".claude/.credentials.json",
    ".codex/auth.json",
    ".cache/huggingface/token",
    ".huggingface/token",
    // Passwords for services.
    ".netrc",
    ".pgpass",
    ".my.cnf",
    ".smbcredentials",
    ".davfs2/secrets",
    ".msmtprc",
    ".fetchmailrc",
    // macOS keychains and what Apple's own applications keep.
    "Library/Keychains",
    "Library/Cookies",
    "Library/Safari",
    "Library/Mail",
    "Library/Messages",
    // Browser profiles: cookies, saved passwords, session tokens.
    "Library/Application Support/Google/Chrome",
    "Library/Application Support/Chromium",
    "Library/Application Support/Firefox",
    "Library/Application Support/BraveSoftware",
    "Library/Application Support/Microsoft Edge",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    // Shell and interpreter histories: commands typed with their secrets.
    ".bash_history",
    ".zsh_history",
    ".zhistory",
    ".sh_history",
    ".local/share/fish/fish_history",
    ".python_history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
];

/// Credentials by name only in a home directory (the request's `HOME` and the
/// homes of /etc/passwd): a project's own `.npmrc` or `.azure` holds its
/// settings, a user's holds tokens. The user's git configuration is one:
/// `url.<base>.insteadOf` and `http.extraHeader` carry tokens (the run is
/// given git's identity by its environment).
pub const HOME_SENSITIVE_NAMES: &[&str] = &[
    ".npmrc",
    ".azure",
    ".azd",
    ".gcloud",
    ".gitconfig",
    ".config/git/config",
    ".config/pip/pip.conf",
    ".pip/pip.conf",
    ".m2/settings.xml",
    ".m2/settings-security.xml",
    ".gradle/gradle.properties",
    ".yarnrc.yml",
    ".yarnrc",
    ".bundle/config",
    ".composer/auth.json",
    ".config/composer/auth.json",
    ".nuget/NuGet/NuGet.Config",
];

/// Whether `path` leads to or through one of [`SENSITIVE_NAMES`] (one
/// component, or several such as `.config/gh`), wherever it is.
pub fn names_a_credential(path: &Path) -> bool {
    let path: Vec<_> = path.components().collect();
    SENSITIVE_NAMES.iter().any(|name| {
        let name: Vec<_> = Path::new(name).components().collect();
        path.windows(name.len()).any(|w| w == name.as_slice())
    })
}

/// Absolute sensitive paths (globs).
pub const SENSITIVE_PATHS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/shadow+",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/gshadow+",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/sudoers.d/**",
    "/etc/doas.conf",
    "/etc/ssh/ssh_host_*_key",
    "/etc/security/opasswd",
    "/etc/credstore",
    "/etc/credstore/**",
    "/etc/credstore.encrypted",
    "/etc/credstore.encrypted/**",
    "/run/credentials",
    "/run/credentials/**",
    "/var/backups",
    "/var/backups/**",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/proc/kcore",
    "/dev/mem",
];

/// A set of glob patterns; one that does not compile is left out (the
/// configuration's were checked when it was parsed).
pub(crate) fn globset(patterns: impl IntoIterator<Item = String>) -> GlobSet {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        if let Ok(g) = Glob::new(&p) {
            b.add(g);
        }
    }
    b.build().unwrap_or_else(|_| GlobSet::empty())
}

/// The sensitive paths of one configuration: the built-in ones and its
/// `sensitive_paths`.
#[derive(Debug, Clone)]
pub struct Sensitive {
    /// [`SENSITIVE_PATHS`] (the names are compared component by component).
    absolute: GlobSet,
    /// [`SENSITIVE_NAMES`], each split into its components.
    names: Vec<Vec<Component<'static>>>,
    /// The configured patterns, `~/` expanded at each question.
    pub(crate) extra: Vec<String>,
}

impl Sensitive {
    pub fn new(extra: impl IntoIterator<Item = String>) -> Sensitive {
        Sensitive {
            absolute: globset(SENSITIVE_PATHS.iter().map(|s| s.to_string())),
            names: SENSITIVE_NAMES.iter().map(|n| Path::new(n).components().collect()).collect(),
            extra: extra.into_iter().collect(),
        }
    }

    /// Whether `path` leads to or through one of [`SENSITIVE_NAMES`] (one
    /// component, or several such as `.config/gh`): as the globs `**/NAME`
    /// and `**/NAME/**` would match, without building them (half a
    /// millisecond at every start).
    pub(crate) fn holds_name(&self, path: &Path) -> bool {
        let path: Vec<_> = path.components().collect();
        self.names.iter().any(|name| path.windows(name.len()).any(|w| w == name.as_slice()))
    }

    /// Whether a resolved path is sensitive. `home` expands `~/` in the
    /// configured patterns.
    pub fn matches(&self, path: &Path, home: Option<&Path>) -> bool {
        if self.holds_name(path) || self.absolute.is_match(path) {
            return true;
        }
        // The home as given, or as it resolves; resolved only for a path that
        // names one of these at all (this runs for every argument).
        let in_home = |h: &Path| HOME_SENSITIVE_NAMES.iter().any(|n| path.starts_with(h.join(n)));
        let names_one = || path.iter().any(|c| HOME_SENSITIVE_NAMES.iter().any(|n| c == *n));
        if home.is_some_and(|h| in_home(h) || names_one() && h.canonicalize().is_ok_and(|c| in_home(&c))) {
            return true;
        }
        let extra = self.extra.iter().map(|p| match (p.strip_prefix("~/"), home) {
            (Some(rest), Some(h)) => h.join(rest).to_string_lossy().into_owned(),
            _ => p.clone(),
        });
        globset(extra).is_match(path)
    }
}
