//! What the broker keeps out of every run's reach, gathered from the
//! configuration and the rooms that keep state (the journal, the trust
//! stages, the plugins): above them all, so that `paths`, which they use,
//! takes nothing from them.

use std::path::PathBuf;

/// What the broker keeps, by its real location (canonical as far as it
/// exists): its state directory, the journal, the trust stages and their
/// lock, the skills and secrets (the inspection authority's key is in the
/// state directory), every file a credential grant names and systemd's
/// credentials of the service, `temp_root`, its configuration and Cedar
/// file, and `extra` (the socket's directory, where it serves one). No run
/// is granted any of it, and inside a granted tree it is hidden: a home
/// used as a workspace does not show a credential's file to the run its
/// placeholder stands in.
pub fn owned(
    config: &palisade_policy::Config,
    journal: Option<&std::path::Path>,
    temp_root: &std::path::Path,
    extra: &[(PathBuf, &str, bool)],
) -> Vec<palisade_policy::host::OwnedPath> {
    let mut found: Vec<(PathBuf, String, bool)> = Vec::new();
    let mut add = |p: PathBuf, what: &str| found.push((p, what.to_string(), true));
    if let Ok(state) = crate::host::paths::default_state_dir() {
        add(state, "the broker's state directory");
    }
    if let Some(j) = journal {
        add(j.to_path_buf(), "the audit journal");
    }
    // Trust stages and plugins are Linux's alone: the macOS broker has neither.
    #[cfg(target_os = "linux")]
    if let Some(t) = &config.trust.state {
        add(t.clone(), "the tools' trust stages");
        add(crate::decide::trust::lock_path(t), "the lock of the tools' trust stages");
        add(crate::decide::trust::key_path(t), "the key of the tools' trust stages");
    }
    #[cfg(target_os = "linux")]
    if let Ok((skills, secrets)) = crate::plugins::dirs(&config.plugins) {
        add(skills, "the skills index");
        add(secrets, "the plugin secrets");
    }
    let grants =
        config.profile_tables().map(|(_, p)| &p.inspect).chain(config.tools.values().map(|t| &t.inspect));
    for grant in grants.flat_map(|i| &i.credentials) {
        if let Some(file) = &grant.file {
            add(file.clone(), "a credential's secret (inspect.credentials)");
        }
    }
    if let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") {
        add(PathBuf::from(dir), "the service's credentials ($CREDENTIALS_DIRECTORY)");
    }
    add(temp_root.to_path_buf(), "the run directories (temp_root)");
    // Whether it exists yet or not: a run that wrote it would decide the next.
    if let Some(dir) = palisade_protocol::clients::user_config().as_deref().and_then(std::path::Path::parent)
    {
        add(dir.to_path_buf(), "the user's palisade configuration (palisade init's)");
    }
    if let Some(source) = &config.source {
        add(source.clone(), "the broker's configuration");
        if let Some(cedar) = &config.policy.cedar {
            let dir = source.parent().unwrap_or(std::path::Path::new(""));
            add(dir.join(cedar.get_ref()), "the Cedar policies");
        }
    }
    for (p, what, hidden) in extra {
        found.push((p.clone(), what.to_string(), *hidden));
    }
    let mut owned: Vec<palisade_policy::host::OwnedPath> = Vec::new();
    for (p, what, hidden) in found {
        let path = if p.is_absolute() { p } else { std::env::current_dir().unwrap_or_default().join(p) };
        let path = crate::host::paths::canonical_prefix(&path);
        if !owned.iter().any(|o| o.path == path) {
            owned.push(palisade_policy::host::OwnedPath { path, what, hidden });
        }
    }
    owned
}
