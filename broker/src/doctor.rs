//! `palisade doctor`: what this host can enforce, and the tier palisade will
//! use. Reads only; changes nothing.

use crate::cgroup::Cgroups;
use crate::host;
use palisade_policy::{Config, FallbackPolicy};
use palisade_protocol::LandlockFeatures;
use std::fmt::Write;

fn sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/sys/{}", name.replace('.', "/")))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The report, and whether every mechanism of Tier C is there.
pub fn report(config: &Config) -> (String, bool) {
    let mut out = String::new();
    let uname = nix::sys::utsname::uname().ok();
    let release = uname.as_ref().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let _ = writeln!(out, "kernel:           Linux {release} ({})", std::env::consts::ARCH);

    let userns = host::user_namespaces();
    let mut why = vec![];
    if let Some(v) = sysctl("kernel.unprivileged_userns_clone") {
        why.push(format!("kernel.unprivileged_userns_clone={v}"));
    }
    if let Some(v) = sysctl("user.max_user_namespaces") {
        why.push(format!("user.max_user_namespaces={v}"));
    }
    match sysctl("kernel.apparmor_restrict_unprivileged_userns") {
        Some(v) if v != "0" => why.push(format!(
            "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns={v}): \
             install palisade's AppArmor profile for palisade-helper"
        )),
        Some(_) => why.push("AppArmor does not restrict them".into()),
        None => why.push("no AppArmor userns restriction".into()),
    }
    if !config.broker.user_namespaces {
        why.push("not used: [broker] user_namespaces = false".into());
    }
    let _ = writeln!(
        out,
        "user namespaces:  {} ({})",
        if userns { "available" } else { "unavailable" },
        why.join("; ")
    );
    let userns = userns && config.broker.user_namespaces;

    let abi = host::landlock_abi();
    let _ = writeln!(
        out,
        "landlock:         {}",
        if abi == 0 {
            "unavailable (not built in, or not in the lsm= list)".to_string()
        } else {
            format!("ABI {abi}: {}", LandlockFeatures::supported_by_abi(abi))
        }
    );
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let seccomp = status.lines().any(|l| l.starts_with("Seccomp:"));
    let _ = writeln!(
        out,
        "seccomp:          {}",
        if seccomp { "available (filter mode)" } else { "unavailable" }
    );

    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    let overlay = filesystems.lines().any(|l| l.split_whitespace().last() == Some("overlay"));
    let _ = writeln!(
        out,
        "overlay:          {}",
        if overlay {
            "available (disk = \"overlay\" bounds a run's writes to its workspace)"
        } else {
            "not loaded (disk = \"overlay\" needs it: modprobe overlay, or set disk = \"direct\")"
        }
    );
    let _ = writeln!(out, "cgroups:          {}", Cgroups::host_layout());
    let cgroups = Cgroups::discover(config.broker.cgroup_root.as_deref(), false);
    let _ = writeln!(out, "cgroup for runs:  {}", cgroups.description);
    if cgroups.available().is_err() {
        let _ = writeln!(
            out,
            "                  limits fall back to rlimits (a process tree can exceed them); {}",
            if config.policy.require_cgroup {
                "require_cgroup is set: runs will be refused"
            } else {
                "require_cgroup is off"
            }
        );
    }

    let tier_c = userns && seccomp;
    let tier = if tier_c {
        "linux-tier-c: namespaces, private root, Landlock, seccomp, rlimits".to_string()
    } else {
        match config.policy.fallback {
            FallbackPolicy::Deny => {
                "none: Tier C is unavailable and the fallback policy is deny (runs are refused)".into()
            }
            FallbackPolicy::RequestApproval => {
                "linux-tier-b after approval (fallback = request_approval)".into()
            }
            FallbackPolicy::WarnAndExecute => {
                "linux-tier-b: Landlock, seccomp, rlimits, no namespaces (fallback = warn_and_execute)".into()
            }
        }
    };
    let _ = writeln!(out, "tier:             {tier}");
    let _ = writeln!(out, "warm pool:        {}", warm_pool(config, &cgroups, tier_c));
    (out, tier_c && abi > 0)
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
    if nix::unistd::geteuid().is_root() {
        return plain("a root broker's sandboxes run as each requester's own host ids");
    }
    if !tier_c {
        return plain("no Tier C here");
    }
    match crate::service::warm_spec(config, cgroups) {
        Some(spec) if spec.cgroup => {
            format!("{n} sandboxes built ahead (namespaces, monitor, pid 1), each in a cgroup of its own")
        }
        Some(_) => format!("{n} sandboxes built ahead (namespaces, monitor, pid 1)"),
        None => plain("cgroup v1: the broker places each run's helper in its cgroups itself"),
    }
}
