//! A host name as the sandbox gave it, made into the form the plan's
//! allowlist is written in: lower case, no trailing dot, ASCII labels.

use super::refusal::Refusal;

/// Longest host name DNS can carry (RFC 1035, in text form).
const NAME_MAX: usize = 253;
/// Longest label (RFC 1035).
const LABEL_MAX: usize = 63;

/// `raw` lower-cased with one trailing dot removed, or a refusal if it is
/// not a host name (empty labels, non-ASCII, characters a name cannot have).
pub fn normalize(raw: &str) -> Result<String, Refusal> {
    let name = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
    let valid_label = |l: &str| {
        !l.is_empty()
            && l.len() <= LABEL_MAX
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > NAME_MAX || !name.split('.').all(valid_label) {
        return Err(Refusal::DomainNotAllowed(format!("{raw:?} (not a host name)")));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowered_and_lose_one_trailing_dot() {
        assert_eq!(normalize("Allowed.TEST.").unwrap(), "allowed.test");
        assert_eq!(normalize("1.2.3.4").unwrap(), "1.2.3.4");
        for bad in ["", ".", "a..b", "a.b..", "exämple.com", "a b", "a/b", "[::1]", &"a".repeat(64)] {
            assert!(normalize(bad).is_err(), "{bad:?}");
        }
    }
}
