//! `palisade doctor`: what this host can enforce, and the tier palisade will
//! use. Reads only; changes nothing.

use crate::engine::cgroup::Cgroups;
use crate::host;
use palisade_policy::{Config, FallbackPolicy};
use palisade_protocol::LandlockFeatures;
use std::fmt::Write;

fn sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/sys/{}", name.replace('.', "/")))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The AppArmor profiles loaded in the kernel, one per line: `name (mode)`.
const APPARMOR_PROFILES: &str = "/sys/kernel/security/apparmor/profiles";
/// The profile palisade ships (apparmor/palisade-helper) and the path it attaches to.
const HELPER_PROFILE: &str = "palisade-helper";
const HELPER_PROFILE_PATH: &str = "/usr/bin/palisade-helper";

/// Whether AppArmor keeps the helper from using user namespaces, and the
/// fix: `restrict` is the sysctl `kernel.apparmor_restrict_unprivileged_userns`
/// (`None`: no such restriction in this kernel), `profiles` the loaded
/// profiles (`None`: unreadable), `helper` the helper this broker runs.
fn apparmor_userns(restrict: Option<&str>, profiles: Option<&str>, helper: &std::path::Path) -> String {
    const SYSCTL: &str = "kernel.apparmor_restrict_unprivileged_userns";
    match restrict {
        None => return "no AppArmor userns restriction".into(),
        Some("0") => return format!("AppArmor does not restrict them ({SYSCTL}=0)"),
        Some(_) => {}
    }
    let fix = "install apparmor/palisade-helper as /etc/apparmor.d/palisade-helper (the Debian package does) \
               and load it: apparmor_parser -r /etc/apparmor.d/palisade-helper";
    let loaded = profiles.map(|p| p.lines().any(|l| l.split_whitespace().next() == Some(HELPER_PROFILE)));
    match loaded {
        Some(true) if helper == std::path::Path::new(HELPER_PROFILE_PATH) => {
            format!("{SYSCTL}=1, and the {HELPER_PROFILE} profile that grants them is loaded")
        }
        Some(true) => format!(
            "{SYSCTL}=1: the {HELPER_PROFILE} profile is loaded but attaches to {HELPER_PROFILE_PATH}, \
             not to this helper ({}): copy the profile with this path in its place and load it",
            helper.display()
        ),
        Some(false) => format!("{SYSCTL}=1 and no {HELPER_PROFILE} AppArmor profile is loaded: {fix}"),
        None => format!(
            "{SYSCTL}=1; whether the {HELPER_PROFILE} profile is loaded is unknown ({APPARMOR_PROFILES} \
             is not readable here); if runs fail at their mounts: {fix}"
        ),
    }
}

/// What `palisade doctor` found: printed as text, or as one JSON object
/// with `--json` (README.md, "Resource limits", lists the fields).
#[derive(serde::Serialize, Debug)]
pub struct Report {
    /// `uname -r`, and the machine (`x86_64`, `aarch64`).
    pub kernel: String,
    pub arch: &'static str,
    /// Whether runs get user namespaces (the host has them, and
    /// `[broker] user_namespaces` does not turn them off), whether the host
    /// has them, and what decides it.
    pub user_namespaces: bool,
    pub user_namespaces_available: bool,
    pub user_namespaces_detail: Vec<String>,
    /// The kernel's Landlock ABI (0: none) and what it covers.
    pub landlock_abi: u32,
    pub landlock_detail: String,
    pub seccomp: bool,
    pub overlay: bool,
    /// The host's cgroup layout, and the cgroup runs get.
    pub cgroups: String,
    pub cgroup_for_runs: bool,
    pub cgroup_detail: String,
    /// Without a cgroup for runs: what happens, and the lines that give one.
    pub cgroup_fix: Vec<String>,
    /// The tier runs get (`linux-tier-c: ...`), and whether it is Tier C.
    pub tier: String,
    pub tier_c: bool,
    pub warm_pool: String,
    /// Every mechanism Tier C needs is there (the exit status is 0).
    pub complete: bool,
    /// Where this user's runs go: the broker that answers, or an embedded
    /// one and why (`palisade doctor` fills it in).
    pub runs_go_to: Option<String>,
}

/// What this host can enforce under `config`.
pub fn report(config: &Config) -> Report {
    let uname = nix::sys::utsname::uname().ok();
    let kernel = uname.as_ref().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let available = host::user_namespaces();
    let detail = userns_detail(config);
    let user_namespaces = available && config.broker.user_namespaces;
    let abi = host::landlock_abi();
    let landlock_detail = if abi == 0 {
        "unavailable (not built in, or not in the lsm= list)".to_string()
    } else {
        format!("ABI {abi}: {}", LandlockFeatures::supported_by_abi(abi))
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let seccomp = status.lines().any(|l| l.starts_with("Seccomp:"));
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    let overlay = filesystems.lines().any(|l| l.split_whitespace().last() == Some("overlay"));
    let cgroups = Cgroups::discover(config.broker.cgroup_root.as_deref(), false);
    let layout = Cgroups::host_layout();
    let cgroup_fix = match cgroups.available() {
        Ok(()) => Vec::new(),
        Err(_) => {
            let refused = if config.policy.require_cgroup {
                "require_cgroup is set: runs will be refused"
            } else {
                "require_cgroup is off"
            };
            let first = format!("limits fall back to rlimits (a process tree can exceed them); {refused}");
            std::iter::once(first).chain(cgroup_lines(&layout)).collect()
        }
    };
    let tier_c = user_namespaces && seccomp;
    Report {
        kernel,
        arch: std::env::consts::ARCH,
        user_namespaces,
        user_namespaces_available: available,
        user_namespaces_detail: detail,
        landlock_abi: abi,
        landlock_detail,
        seccomp,
        overlay,
        cgroups: layout,
        cgroup_for_runs: cgroups.available().is_ok(),
        cgroup_detail: cgroups.description.clone(),
        cgroup_fix,
        tier: tier(config, tier_c),
        tier_c,
        warm_pool: warm_pool(config, &cgroups, tier_c),
        complete: tier_c && abi > 0,
        runs_go_to: None,
    }
}

/// What decides whether the helper may make user namespaces here.
fn userns_detail(config: &Config) -> Vec<String> {
    let mut why = vec![];
    if let Some(v) = sysctl("kernel.unprivileged_userns_clone") {
        why.push(format!("kernel.unprivileged_userns_clone={v}"));
    }
    if let Some(v) = sysctl("user.max_user_namespaces") {
        why.push(format!("user.max_user_namespaces={v}"));
    }
    let profiles = std::fs::read_to_string(APPARMOR_PROFILES).ok();
    why.push(apparmor_userns(
        sysctl("kernel.apparmor_restrict_unprivileged_userns").as_deref(),
        profiles.as_deref(),
        &crate::host::paths::default_helper(),
    ));
    if !config.broker.user_namespaces {
        why.push("not used: [broker] user_namespaces = false".into());
    }
    why
}

/// The tier runs get, with Tier C's mechanisms there or not.
fn tier(config: &Config, tier_c: bool) -> String {
    if tier_c {
        return "linux-tier-c: namespaces, private root, Landlock, seccomp, rlimits".into();
    }
    match config.policy.fallback {
        FallbackPolicy::Deny => {
            "none: Tier C is unavailable and the fallback policy is deny (runs are refused)".into()
        }
        FallbackPolicy::RequestApproval => "linux-tier-b after approval (fallback = request_approval)".into(),
        FallbackPolicy::WarnAndExecute => {
            "linux-tier-b: Landlock, seccomp, rlimits, no namespaces (fallback = warn_and_execute)".into()
        }
    }
}

impl Report {
    /// The report as a person reads it, one line per mechanism.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "kernel:           Linux {} ({})", self.kernel, self.arch);
        let userns = if self.user_namespaces_available { "available" } else { "unavailable" };
        let _ = writeln!(out, "user namespaces:  {userns} ({})", self.user_namespaces_detail.join("; "));
        let _ = writeln!(out, "landlock:         {}", self.landlock_detail);
        let seccomp = if self.seccomp { "available (filter mode)" } else { "unavailable" };
        let _ = writeln!(out, "seccomp:          {seccomp}");
        let overlay = if self.overlay {
            "available (disk = \"overlay\" bounds a run's writes to its workspace)"
        } else {
            "not loaded (disk = \"overlay\" needs it: modprobe overlay, or set disk = \"direct\")"
        };
        let _ = writeln!(out, "overlay:          {overlay}");
        let _ = writeln!(out, "cgroups:          {}", self.cgroups);
        let _ = writeln!(out, "cgroup for runs:  {}", self.cgroup_detail);
        for line in &self.cgroup_fix {
            let _ = writeln!(out, "                  {line}");
        }
        let _ = writeln!(out, "tier:             {}", self.tier);
        let _ = writeln!(out, "warm pool:        {}", self.warm_pool);
        if let Some(to) = &self.runs_go_to {
            let _ = writeln!(out, "runs go to:       {to}");
        }
        out
    }
}

/// What gives runs a cgroup on a host of this `layout` ([`Cgroups::host_layout`]):
/// the exact lines to add, and the commands that make the directory.
fn cgroup_lines(layout: &str) -> Vec<String> {
    let user =
        nix::unistd::User::from_uid(nix::unistd::getuid()).ok().flatten().map_or("USER".into(), |u| u.name);
    if layout.starts_with("v2") {
        vec![
            "to give runs a cgroup (cgroup v2): start the broker in a cgroup systemd delegates to it, which it finds".into(),
            "  by itself: `systemd-run --user --scope -p Delegate=yes -- palisaded` (the system unit has Delegate=yes);".into(),
            "  or, for a broker running as root, a subtree made for it: `mkdir /sys/fs/cgroup/palisade`, then".into(),
            "  [broker]".into(),
            "  cgroup_root = \"/sys/fs/cgroup/palisade\"".into(),
        ]
    } else if layout.starts_with("v1") {
        vec![
            "to give runs a cgroup (cgroup v1 or hybrid): a directory of the same name in each hierarchy, the broker's:".into(),
            format!(
                "  for c in memory pids cpu cpuacct freezer; do sudo mkdir -p /sys/fs/cgroup/$c/palisade; \
                 sudo chown -R {user} /sys/fs/cgroup/$c/palisade; done"
            ),
            "  then, in the policy:".into(),
            "  [broker]".into(),
            "  cgroup_root = \"/sys/fs/cgroup/memory/palisade\"".into(),
        ]
    } else {
        Vec::new()
    }
}

/// What the broker keeps started ahead of requests, and why no more.
fn warm_pool(config: &Config, cgroups: &Cgroups, tier_c: bool) -> String {
    let n = config.broker.prespawn;
    let plain = |why: &str| format!("{n} helpers started ahead, nothing built: {why}");
    if n == 0 {
        return "none (prespawn = 0)".into();
    }
    if !config.broker.warm {
        return plain("warm = false");
    }
    if !tier_c {
        return plain("no Tier C here");
    }
    let each = if crate::host::privilege::serves_others() {
        let most = crate::engine::requesters::MOST;
        let idle = crate::engine::requesters::IDLE.as_secs() / 60;
        format!(
            " for each requester, as its own host ids (the last {most} requesters; \
             a requester's dropped after {idle} min without a run)"
        )
    } else {
        String::new()
    };
    let built = format!("{n} sandboxes built ahead (namespaces, monitor, pid 1, /proc, /dev){each}");
    match crate::engine::linux::warm_spec(config, cgroups) {
        Some(_) if cgroups.is_v1() => {
            format!("{built}, each in a cgroup of its own (cgroup v1: placed there by the broker)")
        }
        Some(_) if cgroups.available().is_ok() => format!("{built}, each in a cgroup of its own"),
        Some(_) => built,
        None => plain("user namespaces are off"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const PACKAGED: &str = "/usr/bin/palisade-helper";

    #[test]
    fn apparmor_names_the_restriction_and_the_fix_only_where_it_is_in_force() {
        let helper = Path::new(PACKAGED);
        assert_eq!(apparmor_userns(None, None, helper), "no AppArmor userns restriction");
        assert!(apparmor_userns(Some("0"), None, helper).contains("does not restrict"));
        let others = "snap.lxd.lxc (enforce)\nunprivileged_userns (enforce)\n";
        let missing = apparmor_userns(Some("1"), Some(others), helper);
        assert!(missing.contains("kernel.apparmor_restrict_unprivileged_userns=1"), "{missing}");
        assert!(missing.contains("apparmor_parser -r /etc/apparmor.d/palisade-helper"), "{missing}");
        let loaded = format!("{others}palisade-helper (unconfined)\n");
        let ok = apparmor_userns(Some("1"), Some(&loaded), helper);
        assert!(ok.contains("is loaded") && !ok.contains("apparmor_parser"), "{ok}");
        // A profile whose name only starts the same is not the helper's.
        let lookalike = apparmor_userns(Some("1"), Some("palisade-helper-old (enforce)\n"), helper);
        assert!(lookalike.contains("no palisade-helper AppArmor profile is loaded"), "{lookalike}");
        let elsewhere =
            apparmor_userns(Some("1"), Some(&loaded), Path::new("/home/u/.local/bin/palisade-helper"));
        assert!(elsewhere.contains("not to this helper (/home/u/.local/bin/palisade-helper)"), "{elsewhere}");
        let unreadable = apparmor_userns(Some("1"), None, helper);
        assert!(unreadable.contains("unknown") && unreadable.contains("apparmor_parser -r"), "{unreadable}");
    }
}
