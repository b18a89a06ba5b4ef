//! A refusal as the policy gives it: the kind a client sees, the stable
//! name of the rule that refused, and the reason in words.

use palisade_protocol::wire::ErrorKind;

/// A request refused, and by which rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub kind: ErrorKind,
    /// A stable name for the rule that refused (`scope.outside_roots`).
    pub rule: &'static str,
    pub reason: String,
}

impl Denial {
    pub fn new(kind: ErrorKind, rule: &'static str, reason: impl Into<String>) -> Denial {
        Denial { kind, rule, reason: reason.into() }
    }
}
