//! How a resolved run is described to Cedar: the resource and the context of
//! palisade's schema (`docs/palisade.cedarschema`), from what the run will
//! get, not from what the request asked for.

use crate::capabilities::FsCapability;
use crate::cedar::{CedarRun, long};
use crate::decision::Resolved;
use cedar_policy::{Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression};
use palisade_protocol::attest::Network;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::str::FromStr;

impl CedarRun for Resolved {
    fn is_tool(&self) -> bool {
        self.tool.is_some()
    }

    fn resource(&self) -> Result<(EntityUid, Entity), String> {
        resource(self)
    }

    fn context(&self, needs_approval: bool) -> Vec<(String, RestrictedExpression)> {
        run_context(self, needs_approval)
    }
}

/// The run's resource: its tool, or its program; with the entity that
/// holds its attributes.
fn resource(resolved: &Resolved) -> Result<(EntityUid, Entity), String> {
    let program = resolved.plan.program.clone();
    let (type_name, id, attrs) = match &resolved.tool {
        Some(tool) => (
            "Tool",
            tool.clone(),
            HashMap::from([
                ("name".to_string(), RestrictedExpression::new_string(tool.clone())),
                ("executable".to_string(), RestrictedExpression::new_string(program)),
            ]),
        ),
        None => (
            "Executable",
            program.clone(),
            HashMap::from([("path".to_string(), RestrictedExpression::new_string(program))]),
        ),
    };
    let name = EntityTypeName::from_str(type_name).map_err(|e| e.to_string())?;
    let uid = EntityUid::from_type_name_and_id(name, EntityId::new(id));
    let entity = Entity::new(uid.clone(), attrs, HashSet::new()).map_err(|e| e.to_string())?;
    Ok((uid, entity))
}

fn strings<'a>(items: impl IntoIterator<Item = &'a str>) -> RestrictedExpression {
    RestrictedExpression::new_set(items.into_iter().map(|s| RestrictedExpression::new_string(s.to_string())))
}

/// The request's context (the schema's `Run`): what the resolved run will
/// get, not what the request asked for.
fn run_context(r: &Resolved, needs_approval: bool) -> Vec<(String, RestrictedExpression)> {
    let p = &r.plan;
    let path = |p: &PathBuf| p.to_string_lossy().into_owned();
    let read_write: Vec<String> = r.writable.iter().map(path).collect();
    let read_only: Vec<String> = r.granted.iter().filter(|g| !r.writable.contains(g)).map(path).collect();
    let (network, domains): (bool, &[String]) = match &r.network {
        Network::LoopbackOnly | Network::NoSockets => (false, &[]),
        Network::Host => (true, &[]),
        // Strict egress reaches the allowed domains, through the broker.
        Network::HostDomains { domains, .. } | Network::StrictDomains { domains, .. } => (true, domains),
    };
    let process = &r.capabilities.process;
    let tier = match p.tier() {
        palisade_protocol::Tier::B => "B",
        palisade_protocol::Tier::C => "C",
    };
    let temp_workspace = r.capabilities.filesystem.contains(&FsCapability::TempWorkspace);
    [
        ("command", RestrictedExpression::new_string(p.argv.first().cloned().unwrap_or_default())),
        ("program", RestrictedExpression::new_string(p.program.clone())),
        ("argv", strings(p.argv.iter().map(String::as_str))),
        ("tier", RestrictedExpression::new_string(tier.into())),
        ("needs_approval", RestrictedExpression::new_bool(needs_approval)),
        ("network", RestrictedExpression::new_bool(network)),
        ("egress", RestrictedExpression::new_string(r.egress.to_string())),
        ("allow_domains", strings(domains.iter().map(String::as_str))),
        ("workspace", RestrictedExpression::new_string(path(&r.workspace))),
        ("cwd", RestrictedExpression::new_string(p.cwd.clone())),
        ("read_only", strings(read_only.iter().map(String::as_str))),
        ("read_write", strings(read_write.iter().map(String::as_str))),
        ("temp_workspace", RestrictedExpression::new_bool(temp_workspace)),
        ("timeout_secs", long(r.timeout.as_secs())),
        ("memory_mb", long(process.max_memory_mb)),
        ("processes", long(process.max_processes)),
        ("output_bytes", long(r.max_output_bytes)),
        ("no_fork", RestrictedExpression::new_bool(process.no_fork)),
        ("requester_uid", long(u64::from(r.requester.uid))),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
