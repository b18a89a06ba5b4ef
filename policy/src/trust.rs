//! Trust stages of declared tools, as the decision sees them: the broker
//! keeps the stages (see its `trust` module) and passes a tool's in
//! [`Context::trust`](crate::Context); the decision turns it into a
//! refusal (Draft), a question (Trial, an escalation) or nothing (Verified).

pub use palisade_protocol::wire::{EscalationReason, EscalationTrigger};

/// The rule that refuses a tool in Draft.
pub const DRAFT_RULE: &str = "trust.draft";
/// The rule that refuses a tool's parameter naming a sensitive path: the
/// escalation `SensitiveDirectory`, which puts the tool back to Draft.
pub const SENSITIVE_RULE: &str = "trust.sensitive_directory";

/// The rule of a run held because its tool is in Trial.
pub const TRIAL_RULE: &str = "trust.trial";
/// The rule of a run held because it asks for more than its tool was
/// approved for (an escalation, which puts the tool back to Draft).
pub const ESCALATION_RULE: &str = "trust.escalation";
/// The rule of a run held because the host lacks Tier C and the fallback
/// policy is `request_approval`.
pub const FALLBACK_RULE: &str = "fallback.request_approval";

/// Why a person must approve a run before it starts: the question put to
/// them, and the rule that asks it (a refusal for want of an answer carries it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    pub reason: String,
    pub rule: &'static str,
}

/// Where a declared tool stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustStage {
    /// Declared, not reviewed: not executable.
    Draft,
    /// Reviewed and approved: each run is held for an approval.
    Trial,
    /// Enough approved runs succeeded: runs silently.
    Verified,
}

impl TrustStage {
    /// The stage as the state file, the journal and the CLI spell it.
    pub fn name(self) -> &'static str {
        match self {
            TrustStage::Draft => "draft",
            TrustStage::Trial => "trial",
            TrustStage::Verified => "verified",
        }
    }

    /// The stage spelled `name`.
    pub fn named(name: &str) -> Option<TrustStage> {
        [TrustStage::Draft, TrustStage::Trial, TrustStage::Verified].into_iter().find(|s| s.name() == name)
    }
}

/// A tool's stage, for one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolTrust {
    pub stage: TrustStage,
    /// Approved Trial runs that succeeded so far.
    pub successes: u32,
    /// How many make it Verified.
    pub trial_runs: u32,
}

/// The question a tool's stage puts before a run (and the trigger, if the
/// run escalated), or none for a Verified tool that stays in its range.
pub fn question(
    tool: &str,
    trust: &ToolTrust,
    escalation: Option<EscalationTrigger>,
) -> Option<(String, Option<EscalationTrigger>)> {
    if let Some(t) = escalation {
        let what = match (&t.reason, &t.requested_path) {
            (EscalationReason::UndeclaredBinding, Some(p)) => format!("parameter {p} is not declared"),
            (_, Some(p)) => format!("{p} is outside the approved range [{}]", t.approved_paths.join(", ")),
            (_, None) => "it asks for more than was approved".to_string(),
        };
        let reason = format!(
            "tool {tool} escalates ({}: {what}); it is back to Draft, and this run needs an approval.",
            t.reason.name()
        );
        return Some((reason, Some(t)));
    }
    match trust.stage {
        TrustStage::Verified | TrustStage::Draft => None,
        TrustStage::Trial if trust.successes == 0 => Some((
            format!("tool {tool} is in Trial: its first run needs an approval (1 of {}).", trust.trial_runs),
            Some(EscalationTrigger {
                reason: EscalationReason::FirstExecution,
                requested_path: None,
                approved_paths: vec![],
            }),
        )),
        TrustStage::Trial => Some((
            format!(
                "tool {tool} is in Trial: each run needs an approval ({} of {}).",
                trust.successes + 1,
                trust.trial_runs
            ),
            None,
        )),
    }
}
