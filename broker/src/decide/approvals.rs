//! Runs held for a person's approval: a registry of the pending ones, who
//! may answer them (the approvers, and a requester where `self_approval`
//! allows), and the answer handed to the connection that waits for it.

use crate::error::BrokerError;
use crate::host::peer::Peer;
use palisade_policy::Resolved;
use palisade_policy::cedar::{CedarPolicies, Principal};
use palisade_protocol::wire::PendingApproval;
use palisade_protocol::wire::{ErrorKind, ErrorReply};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// An answer to a pending approval.
#[derive(Debug, Clone)]
pub struct Answer {
    pub approved: bool,
    /// Who answered.
    pub by_uid: u32,
    /// Whether they are an approver (a requester answering its own, with
    /// `self_approval`, is not: its answer runs the run, and counts for
    /// nothing towards a tool's Verified stage).
    pub by_approver: bool,
    /// What the requester is told (`approved by uid 0`, `denied by uid 0: ...`).
    pub why: String,
}

/// What an approver does; [`Approvers::authorize`] decides each.
#[derive(Debug, Clone, Copy)]
pub enum ApproverAction<'a> {
    /// Approve this pending approval of this run (`None`: a run not kept,
    /// which Cedar's `approve`, when configured, refuses).
    Approve(&'a PendingApproval, Option<&'a Resolved>),
    /// Deny it: the role alone decides (a denial only narrows).
    Deny(&'a PendingApproval),
    /// Approve this tool's declaration (Draft → Trial).
    ApproveTool(&'a str),
}

/// Who the approvers are.
#[derive(Debug, Clone)]
pub struct Approvers {
    /// `[approvers] uids`, as numbers.
    uids: Vec<u32>,
    /// `[approvers] gids`, as numbers.
    gids: Vec<u32>,
    /// `[approvers] self_approval`.
    self_approval: bool,
    /// The broker's own uid: the approver (with root) when none are configured.
    broker_uid: u32,
    /// The policy's Cedar file, which must also permit `approve` when there is one.
    cedar: Option<Arc<CedarPolicies>>,
}

impl Approvers {
    /// The approvers `config` names (its names resolved into `ids`).
    pub fn new(
        config: &palisade_policy::Config,
        ids: &palisade_policy::ids::ResolvedIds,
        broker_uid: u32,
    ) -> Approvers {
        Approvers {
            uids: ids.approver_uids.clone(),
            gids: ids.approver_gids.clone(),
            self_approval: config.approvers.self_approval,
            broker_uid,
            cedar: config.policy.cedar_policies.clone(),
        }
    }

    /// Approvers by number (the unit tests'), with no Cedar policies.
    #[cfg(test)]
    fn listed(uids: &[u32], gids: &[u32], self_approval: bool, broker_uid: u32) -> Approvers {
        Approvers { uids: uids.to_vec(), gids: gids.to_vec(), self_approval, broker_uid, cedar: None }
    }

    /// Whether `peer` holds the approver role: its uid, primary or
    /// supplementary group is configured; with neither list set, it is the
    /// broker's own uid or root.
    pub fn is_approver(&self, peer: &Peer) -> bool {
        if self.uids.is_empty() && self.gids.is_empty() {
            return peer.uid == self.broker_uid || peer.uid == 0;
        }
        self.uids.contains(&peer.uid)
            || self.gids.contains(&peer.gid)
            || peer.groups.iter().any(|g| self.gids.contains(g))
    }

    /// Whether `peer` may do `action`: the one place an approver's answer
    /// (and a tool's approval) is authorized. An approver may do both; a
    /// client that is not one may answer only its own request, and only
    /// with `self_approval` on.
    pub fn authorize(&self, peer: &Peer, action: ApproverAction<'_>) -> Result<(), BrokerError> {
        self.role(peer, action)?;
        match action {
            ApproverAction::Approve(_, run) => self.cedar_approve(peer, run),
            ApproverAction::Deny(_) | ApproverAction::ApproveTool(_) => Ok(()),
        }
    }

    /// The built-in rule: the approver role, or a requester's own answer
    /// where `self_approval` allows it.
    fn role(&self, peer: &Peer, action: ApproverAction<'_>) -> Result<(), BrokerError> {
        if self.is_approver(peer) {
            return Ok(());
        }
        let p = match action {
            ApproverAction::Approve(p, _) | ApproverAction::Deny(p) => p,
            ApproverAction::ApproveTool(name) => {
                return Err(BrokerError::Unauthorized(format!(
                    "uid {} is not an approver: it may not approve tool {name}",
                    peer.uid
                )));
            }
        };
        if p.uid != peer.uid {
            return Err(BrokerError::Unauthorized(format!(
                "uid {} is not an approver: it may not answer approval {}",
                peer.uid, p.id
            )));
        }
        if self.self_approval {
            return Ok(());
        }
        Err(BrokerError::Unauthorized(format!(
            "uid {} is not an approver and may not answer its own request (approval {}): \
             self_approval is off; an approver answers it (palisade approve {})",
            peer.uid, p.id, p.id
        )))
    }

    /// With a Cedar file, its `approve` action must permit `peer`'s answer
    /// on the waiting run too: it can only narrow the built-in rule.
    fn cedar_approve(&self, peer: &Peer, run: Option<&Resolved>) -> Result<(), BrokerError> {
        let Some(cedar) = &self.cedar else { return Ok(()) };
        let refused = |kind, message: String, rule: &str| {
            BrokerError::Reply(ErrorReply::with_rule(kind, message, rule.to_string()))
        };
        let Some(run) = run else {
            let message = "the waiting run is not kept, so Cedar's approve cannot be asked".to_string();
            return Err(refused(ErrorKind::PolicyDenied, message, "cedar.error"));
        };
        let principal = Principal { uid: peer.uid, gid: peer.gid, groups: peer.groups.clone() };
        cedar
            .authorize(&principal, palisade_policy::cedar::Action::Approve, run, true)
            .map(drop)
            .map_err(|d| refused(d.kind, d.reason, d.rule))
    }
}

/// One pending approval and the way to its waiting run.
struct Waiting {
    pending: PendingApproval,
    /// The run it would be, for Cedar's `approve`.
    run: Option<Arc<Resolved>>,
    /// Taken by the first answer.
    answer: Option<oneshot::Sender<Answer>>,
}

#[derive(Default)]
struct Registry {
    next: u64,
    waiting: BTreeMap<u64, Waiting>,
}

/// The pending approvals of this broker.
#[derive(Clone, Default)]
pub struct Pending {
    registry: Arc<Mutex<Registry>>,
}

/// A pending approval, held by the connection that waits for its answer;
/// dropped, it leaves the list.
pub struct Ticket {
    pub pending: PendingApproval,
    /// The run it would be.
    pub run: Option<Arc<Resolved>>,
    pub answer: oneshot::Receiver<Answer>,
    registry: Arc<Mutex<Registry>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.registry.lock().unwrap_or_else(|e| e.into_inner()).waiting.remove(&self.pending.id);
    }
}

impl Pending {
    /// Lists `pending` (its id assigned here) until the ticket is dropped.
    pub fn open(&self, mut pending: PendingApproval, run: Option<Arc<Resolved>>) -> Ticket {
        let (tx, rx) = oneshot::channel();
        let mut r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.next += 1;
        pending.id = r.next;
        r.waiting
            .insert(pending.id, Waiting { pending: pending.clone(), run: run.clone(), answer: Some(tx) });
        Ticket { pending, run, answer: rx, registry: self.registry.clone() }
    }

    /// How many wait for an answer now.
    pub fn count(&self) -> usize {
        self.registry.lock().unwrap_or_else(|e| e.into_inner()).waiting.len()
    }

    /// What `peer` may see: everything for an approver, its own otherwise.
    pub fn list(&self, approvers: &Approvers, peer: &Peer) -> Vec<PendingApproval> {
        let all = approvers.is_approver(peer);
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.waiting.values().filter(|w| all || w.pending.uid == peer.uid).map(|w| w.pending.clone()).collect()
    }

    /// `peer`'s answer to approval `id`, handed to the run that waits for it.
    pub fn answer(
        &self,
        approvers: &Approvers,
        peer: &Peer,
        id: u64,
        approved: bool,
        reason: Option<String>,
    ) -> Result<(), BrokerError> {
        let mut r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let w = r.waiting.get_mut(&id).ok_or_else(|| no_such(id))?;
        let action = match approved {
            true => ApproverAction::Approve(&w.pending, w.run.as_deref()),
            false => ApproverAction::Deny(&w.pending),
        };
        approvers.authorize(peer, action)?;
        let sender = w.answer.take().ok_or_else(|| no_such(id))?;
        let why = match (approved, reason) {
            (true, _) => format!("approved by uid {}", peer.uid),
            (false, Some(r)) => format!("denied by uid {}: {r}", peer.uid),
            (false, None) => format!("denied by uid {}", peer.uid),
        };
        let by_approver = approvers.is_approver(peer);
        sender.send(Answer { approved, by_uid: peer.uid, by_approver, why }).map_err(|_| no_such(id))
    }
}

fn no_such(id: u64) -> BrokerError {
    BrokerError::Reply(palisade_protocol::wire::ErrorReply::new(
        palisade_protocol::wire::ErrorKind::InvalidRequest,
        format!("no approval {id} is waiting for an answer (answered, expired, or its client gone)"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer { uid, gid, pid: None, groups: groups.to_vec() }
    }

    fn asked_by(uid: u32) -> PendingApproval {
        PendingApproval { uid, reason: "why".into(), ..Default::default() }
    }

    #[test]
    fn without_lists_the_brokers_uid_and_root_approve_and_nobody_else() {
        let a = Approvers::listed(&[], &[], false, 1000);
        assert!(a.is_approver(&peer(1000, 1000, &[])) && a.is_approver(&peer(0, 0, &[])));
        assert!(!a.is_approver(&peer(1001, 1000, &[1000])));
    }

    #[test]
    fn configured_uids_and_groups_approve_and_the_broker_alone_no_longer_does() {
        let a = Approvers::listed(&[1001], &[50], false, 1000);
        assert!(a.is_approver(&peer(1001, 1, &[])));
        assert!(a.is_approver(&peer(1002, 50, &[])));
        assert!(a.is_approver(&peer(1003, 1, &[7, 50])));
        assert!(!a.is_approver(&peer(1000, 1000, &[])) && !a.is_approver(&peer(0, 0, &[])));
    }

    #[test]
    fn a_non_approver_answers_its_own_request_only_with_self_approval() {
        let own = asked_by(1001);
        let a = Approvers::listed(&[0], &[], false, 0);
        let e = a.authorize(&peer(1001, 1001, &[]), ApproverAction::Approve(&own, None)).unwrap_err();
        assert!(e.to_string().contains("self_approval is off"), "{e}");
        let a = Approvers::listed(&[0], &[], true, 0);
        assert!(a.authorize(&peer(1001, 1001, &[]), ApproverAction::Approve(&own, None)).is_ok());
        // Another's request, or a tool: never.
        assert!(a.authorize(&peer(1002, 1002, &[]), ApproverAction::Approve(&own, None)).is_err());
        assert!(a.authorize(&peer(1001, 1001, &[]), ApproverAction::ApproveTool("t")).is_err());
    }

    #[test]
    fn the_first_answer_reaches_the_waiting_run_and_a_refused_one_changes_nothing() {
        let a = Approvers::listed(&[0], &[], false, 0);
        let pending = Pending::default();
        let mut ticket = pending.open(asked_by(1001), None);
        let id = ticket.pending.id;
        let stranger = peer(1002, 1002, &[]);
        assert!(pending.list(&a, &stranger).is_empty());
        assert_eq!(pending.list(&a, &peer(1001, 1001, &[])).len(), 1);
        let e = pending.answer(&a, &stranger, id, true, None).unwrap_err();
        assert!(matches!(e, BrokerError::Unauthorized(_)), "{e}");
        assert!(ticket.answer.try_recv().is_err(), "a refused answer reached the run");
        pending.answer(&a, &peer(0, 0, &[]), id, false, Some("not now".into())).unwrap();
        let got = ticket.answer.try_recv().unwrap();
        assert_eq!((got.approved, got.by_uid, got.why.as_str()), (false, 0, "denied by uid 0: not now"));
        assert!(pending.answer(&a, &peer(0, 0, &[]), id, true, None).is_err(), "answered twice");
        drop(ticket);
        assert!(pending.list(&a, &peer(0, 0, &[])).is_empty());
    }
}
