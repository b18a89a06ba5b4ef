//! What became of the files a run wrote: its change set (see
//! docs/protocol.md, "Change sets"). On a connection of protocol version 18
//! or older, [`Changes`] takes that version's form (see
//! [`crate::form::in_form_of`]): no `dirs`, `held` or `discarded`, an
//! outcome `partial` said as `applied`, and `not_carried` entries left out.

use serde::{Deserialize, Serialize};

/// What became of a run's writes.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(into = "ChangesForm", from = "ChangesForm")]
pub struct Changes {
    pub outcome: ChangesOutcome,
    /// The change set that holds what was not applied: the whole run's
    /// (`held`), or the rest of it (`partial`).
    pub id: Option<String>,
    /// Files, symbolic links, FIFOs and sockets written on the host.
    pub files: u64,
    /// Directories made on the host.
    pub dirs: u64,
    /// Entries removed on the host.
    pub removed: u64,
    /// Bytes of the files written on the host.
    pub bytes: u64,
    /// Entries of the run's writes held in change set `id`, not applied.
    pub held: u64,
    /// Entries of the run's writes not kept anywhere (`discarded`).
    pub discarded: u64,
    /// The paths someone else changed on the host while the run ran: the
    /// host's version is kept, the run's is in change set `id`.
    pub conflicts: Vec<String>,
    /// Why not everything was applied: held, partly applied or discarded.
    pub reason: Option<String>,
    /// Paths the run changed that were not applied (what the broker keeps:
    /// dropped; files the host executes: held in change set `id`), and
    /// what of the run's writes no change set carries.
    pub withheld: Vec<Withheld>,
}

impl Changes {
    /// Whether every write of the run landed on the host as the run left it:
    /// nothing held, discarded or withheld.
    pub fn all_landed(&self) -> bool {
        matches!(self.outcome, ChangesOutcome::None | ChangesOutcome::Applied | ChangesOutcome::InPlace)
            && self.id.is_none()
            && self.withheld.is_empty()
    }
}

/// What became of a run's writes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ChangesOutcome {
    /// The run wrote nothing that is kept (or nothing at all).
    #[default]
    None,
    /// Applied to the host, all of it.
    Applied,
    /// Held whole, for `changes apply` or `changes discard`: nothing applied.
    Held,
    /// Not kept (the run was ended and `keep_changes = "discard_when_ended"`).
    Discarded,
    /// Written in place (`disk = "direct"`): nothing to apply or hold.
    InPlace,
    /// Applied in part: the rest (conflicts, files the host executes, what
    /// could not be written) is held in change set `id`.
    Partial,
}

/// A path a run changed that was not applied as the run left it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    /// The path on the host.
    pub path: String,
    pub reason: WithheldReason,
    /// What the path is, in words (`git hooks`, `the audit journal`, ...).
    pub what: String,
}

/// Why a change was withheld.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WithheldReason {
    /// It is, or would replace or remove, what the broker keeps.
    BrokerState,
    /// It is a file the host executes (a git hook, a git setting naming a
    /// command, `.envrc`, an editor's tasks, ...) or a place of credentials:
    /// held for a person to apply.
    HostExecuted,
    /// The host has another filesystem mounted there, which the run never
    /// saw (the overlay shows none): its change is dropped, never applied.
    OtherFilesystem,
    /// What no change set carries: a device node, extended attributes past
    /// their bound. The rest of the entry is applied.
    NotCarried,
}

/// [`Changes`] on the wire: its whole form, or version 18's, as the
/// connection's version says (bincode carries no field names to tell).
enum ChangesForm {
    Whole(ChangesWhole),
    V18(ChangesV18),
}

impl Serialize for ChangesForm {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ChangesForm::Whole(c) => c.serialize(s),
            ChangesForm::V18(c) => c.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ChangesForm {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if before_loud() {
            ChangesV18::deserialize(d).map(ChangesForm::V18)
        } else {
            ChangesWhole::deserialize(d).map(ChangesForm::Whole)
        }
    }
}

#[derive(Serialize, Deserialize)]
struct ChangesWhole {
    outcome: ChangesOutcome,
    id: Option<String>,
    files: u64,
    #[serde(default)]
    dirs: u64,
    removed: u64,
    bytes: u64,
    #[serde(default)]
    held: u64,
    #[serde(default)]
    discarded: u64,
    conflicts: Vec<String>,
    reason: Option<String>,
    withheld: Vec<Withheld>,
}

#[derive(Serialize, Deserialize)]
struct ChangesV18 {
    outcome: ChangesOutcome,
    id: Option<String>,
    files: u64,
    removed: u64,
    bytes: u64,
    conflicts: Vec<String>,
    reason: Option<String>,
    withheld: Vec<Withheld>,
}

fn before_loud() -> bool {
    crate::form::form_before(crate::form::LOUD_CHANGES_VERSION)
}

impl From<Changes> for ChangesForm {
    fn from(c: Changes) -> Self {
        if before_loud() {
            let outcome =
                if c.outcome == ChangesOutcome::Partial { ChangesOutcome::Applied } else { c.outcome };
            let withheld =
                c.withheld.into_iter().filter(|w| w.reason != WithheldReason::NotCarried).collect();
            return ChangesForm::V18(ChangesV18 {
                outcome,
                id: c.id,
                files: c.files,
                removed: c.removed,
                bytes: c.bytes,
                conflicts: c.conflicts,
                reason: c.reason,
                withheld,
            });
        }
        ChangesForm::Whole(ChangesWhole {
            outcome: c.outcome,
            id: c.id,
            files: c.files,
            dirs: c.dirs,
            removed: c.removed,
            bytes: c.bytes,
            held: c.held,
            discarded: c.discarded,
            conflicts: c.conflicts,
            reason: c.reason,
            withheld: c.withheld,
        })
    }
}

impl From<ChangesForm> for Changes {
    fn from(form: ChangesForm) -> Self {
        match form {
            ChangesForm::Whole(c) => Changes {
                outcome: c.outcome,
                id: c.id,
                files: c.files,
                dirs: c.dirs,
                removed: c.removed,
                bytes: c.bytes,
                held: c.held,
                discarded: c.discarded,
                conflicts: c.conflicts,
                reason: c.reason,
                withheld: c.withheld,
            },
            ChangesForm::V18(c) => Changes {
                outcome: c.outcome,
                id: c.id,
                files: c.files,
                removed: c.removed,
                bytes: c.bytes,
                conflicts: c.conflicts,
                reason: c.reason,
                withheld: c.withheld,
                ..Changes::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::form::{LOUD_CHANGES_VERSION, in_form_of};

    #[test]
    fn changes_take_the_form_of_the_connections_version() {
        let not_carried = Withheld {
            path: "/w/dev".into(),
            reason: WithheldReason::NotCarried,
            what: "a device node".into(),
        };
        let changes = Changes {
            outcome: ChangesOutcome::Partial,
            id: Some("0123456789ab".into()),
            files: 3,
            dirs: 1,
            held: 2,
            conflicts: vec!["/w/a".into()],
            withheld: vec![not_carried],
            ..Changes::default()
        };
        let config = bincode::config::standard();
        let whole = bincode::serde::encode_to_vec(&changes, config).unwrap();
        let (back, used): (Changes, usize) = bincode::serde::decode_from_slice(&whole, config).unwrap();
        assert_eq!((back, used), (changes.clone(), whole.len()));
        let old = LOUD_CHANGES_VERSION - 1;
        let earlier = in_form_of(old, || bincode::serde::encode_to_vec(&changes, config).unwrap());
        let (back, _): (Changes, usize) =
            in_form_of(old, || bincode::serde::decode_from_slice(&earlier, config).unwrap());
        let said = Changes {
            outcome: ChangesOutcome::Applied,
            dirs: 0,
            held: 0,
            withheld: vec![],
            ..changes.clone()
        };
        assert_eq!(back, said, "partial is said as applied, with the id and conflicts of the rest");
        let json = serde_json::to_value(&changes).unwrap();
        assert_eq!((json["outcome"].as_str(), json["held"].as_u64()), (Some("partial"), Some(2)), "{json}");
        let old_json = in_form_of(old, || serde_json::to_value(&changes).unwrap());
        assert!(old_json.get("held").is_none() && old_json["outcome"] == "applied", "{old_json}");
    }
}
