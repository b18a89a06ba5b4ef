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
    /// What would lift it, where a flag or a key could.
    pub fix: Option<Fix>,
}

/// What lifts a refusal: `palisade run`'s flag, where one does, and the
/// configuration's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fix {
    pub flag: Option<String>,
    pub key: String,
}

impl Denial {
    pub fn new(kind: ErrorKind, rule: &'static str, reason: impl Into<String>) -> Denial {
        Denial { kind, rule, reason: reason.into(), fix: None }
    }

    /// This refusal, lifted by `flag` (if one does) or `key`.
    pub fn with_fix(mut self, flag: Option<String>, key: impl Into<String>) -> Denial {
        self.fix = Some(Fix { flag, key: key.into() });
        self
    }

    /// The refusal as it is given: its reason, ending with its fix where it
    /// has one. Under a person's own policy (`own`: the CLI's embedded
    /// broker, whose flags edit it) the flag and the key; under a broker's,
    /// which a request can only narrow, that its policy does not allow it
    /// and the key an operator would set.
    pub fn finish(mut self, own: bool) -> Denial {
        if let Some(fix) = &self.fix {
            let key = &fix.key;
            let end = match (&fix.flag, own) {
                (Some(flag), true) => format!("; allow it with `{flag}` / `{key}`"),
                (None, true) => format!("; allow it with `{key}` in the policy"),
                (_, false) => {
                    format!("; this broker's policy does not allow it (an operator would set `{key}`)")
                }
            };
            self.reason.push_str(&end);
        }
        self
    }
}
