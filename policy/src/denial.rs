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

/// The refusals no flag or key of a request lifts, and the words each says
/// why (the request itself is wrong, the host lacks the mechanism, the
/// policy never grants it) or who lifts it instead (an approver, the Cedar
/// file it names). Every other refusal ends with its fix.
const NO_FIX: &[(&str, &[&str])] = &[
    ("broker.sandbox_ids", &["[broker] sandbox_ids covers"]),
    ("cedar.ask", &["Not approved: "]),
    ("cedar.error", &["failed to evaluate", "cannot be built"]),
    ("cedar.forbid", &["a forbid overrides any permit"]),
    ("cedar.no_permit", &["Cedar denies what no permit allows"]),
    ("changes.host_executed", &["an operator names approvers in `[approvers] uids`"]),
    ("changes.unknown", &["holds no change set"]),
    ("command.not_found", &["command not found"]),
    ("egress.domains_unenforced", &["cannot be enforced on macOS"]),
    ("egress.redirected", &["preflight checks only the hosts it names"]),
    ("egress.strict_unavailable", &["which this host cannot create"]),
    ("egress.too_many_listeners", &["allow fewer names or ports, or set [egress] transparent = false"]),
    ("fallback.request_approval", &["Not approved: "]),
    ("filesystem.missing", &["does not exist"]),
    ("landlock.unsupported", &["no flag makes the kernel enforce it"]),
    ("limits.empty_command", &["empty command"]),
    ("limits.nul_byte", &["NUL byte"]),
    ("mcp.workspace", &["(palisade mcp --workspace", "--params-outside-workspace lets"]),
    ("memory.per_uid", &["no cgroup bounds this run's memory", "ask for less"]),
    ("patterns.blocked", &["no flag lifts it"]),
    ("plugins.inline_module", &["is neither WAT text nor base64"]),
    ("profiles.unknown", &["is declared (declared:"]),
    ("queue.closed", &["the broker is shutting down"]),
    ("queue.full", &["try again later"]),
    ("queue.per_uid", &["try again when one has ended"]),
    ("request.address", &["is not an address or CIDR range"]),
    ("request.cwd", &["the request names no cwd"]),
    ("request.limit", &["must be at least"]),
    ("request.not_visible", &["the broker sees another file system"]),
    ("request.pass_env", &["which env does not hold"]),
    ("request.path", &["is not a directory", "does not exist"]),
    ("request.profile_with_tool", &["not both"]),
    ("request.terminal", &["rows and cols are 1 to"]),
    ("request.umask", &["is not a umask"]),
    ("request.widens", &["an operator would set"]),
    ("scope.broker_state", &["the broker's state directory"]),
    ("scope.changed", &["refused, not followed"]),
    ("scope.host_executed", &["run it with a change set (without --direct)"]),
    ("scope.not_allowed", &["cannot reach it"]),
    ("scope.not_the_peers", &["no flag or key lifts that"]),
    ("scope.root", &["by any flag or key"]),
    ("scope.sensitive_path", &["never granted, by any flag or key"]),
    ("session.argv", &["a session starts with no command"]),
    ("session.bounds", &["idle_timeout_secs and max_lifetime_secs are 1 to"]),
    ("session.cgroup", &["cannot be joined"]),
    ("session.differs", &["never a wider one"]),
    ("session.field", &["the rest is the session's"]),
    ("session.limit", &["the most one requester may have"]),
    ("session.name", &["a session's name is", "you already have a session named"]),
    (
        "session.publish",
        &[
            "publishes no port",
            "is no port: publish the one",
            "the most one session may publish",
            "give the session a shorter name",
            "where its ports are the host's own",
        ],
    ),
    ("session.unavailable", &["a session is a Tier C sandbox"]),
    ("session.unknown", &["you have no session named"]),
    ("terminal.unavailable", &["has no /dev of its own"]),
    ("tools.parameter_validation", &["is not an existing"]),
    ("tools.undeclared_parameter", &["is not declared by tool"]),
    ("tools.unknown", &["is declared (declared:"]),
    ("trust.draft", &["and approves it (palisade tools approve"]),
    ("trust.escalation", &["Not approved: "]),
    ("trust.sensitive_directory", &["never granted"]),
    ("trust.tampered", &["until an approver approves it again (palisade tools approve"]),
    ("trust.trial", &["Not approved: "]),
];

/// Whether a refusal's `message` (as a client gets it) says what lifts it:
/// it ends with its fix (`Denial::finish`), or its `rule` is one no flag or
/// key lifts and the message says why in the words [`NO_FIX`] holds for it.
/// The suite holds every refusal the policy and the broker give to this.
pub fn names_a_fix_or_why_none(rule: &str, message: &str) -> Result<(), String> {
    if message.contains("; allow it with `") || message.contains("(an operator would set `") {
        return Ok(());
    }
    match NO_FIX.iter().find(|(r, _)| *r == rule) {
        Some((_, why)) if why.iter().any(|w| message.contains(w)) => Ok(()),
        Some((_, why)) => Err(format!("{rule}: does not say {why:?}: {message}")),
        None => Err(format!("{rule}: neither a fix nor a reason none exists: {message}")),
    }
}
