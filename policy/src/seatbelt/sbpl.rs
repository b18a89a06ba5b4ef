//! A reader of the Seatbelt profile language (SBPL, an S-expression
//! language) for the profiles palisade writes: what `sandbox-exec` on a Mac
//! would refuse for its form (parentheses out of balance, a string left
//! open, an operation or a filter it does not know, a filter with the wrong
//! arguments) is refused here, where no Mac runs. Every profile is read
//! before it is handed over, and the tests read the golden ones.
//!
//! It knows the operations and filters palisade uses and their close
//! relatives, not the whole language: a profile written with anything else
//! is refused, to be added here on purpose.

/// An expression: a list, a symbol, a string or a regular expression (`#"..."`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    List(Vec<Expr>),
    Symbol(String),
    Text(String),
    Regex(String),
}

/// The operations a rule may name.
const OPERATIONS: &[&str] = &[
    "default",
    "file*",
    "file-read*",
    "file-read-data",
    "file-read-metadata",
    "file-read-xattr",
    "file-write*",
    "file-write-create",
    "file-write-data",
    "file-write-mode",
    "file-write-unlink",
    "file-write-xattr",
    "file-ioctl",
    "file-map-executable",
    "process*",
    "process-exec",
    "process-exec*",
    "process-fork",
    "process-info*",
    "signal",
    "network*",
    "network-bind",
    "network-inbound",
    "network-outbound",
    "system-socket",
    "sysctl-read",
    "mach-lookup",
    "iokit-get-properties",
    "iokit-open",
    "nvram*",
    "ipc-posix-shm*",
    "pseudo-tty",
];

/// The filters that take one path: absolute, in a string.
const PATH_FILTERS: &[&str] = &["literal", "subpath", "path-literal", "prefix"];
/// The filters that take one name, in a string.
const NAME_FILTERS: &[&str] = &["global-name", "sysctl-name", "sysctl-name-prefix"];
/// What `(socket-domain ...)` may name.
const SOCKET_DOMAINS: &[&str] = &["AF_INET", "AF_INET6", "AF_UNIX", "AF_SYSTEM", "AF_ROUTE"];
/// What `(target ...)` may name.
const TARGETS: &[&str] = &["same-sandbox", "self", "children", "pgrp"];

/// Reads `text` as a profile: `(version 1)` first, then rules `(allow OP...
/// FILTER...)` and `(deny ...)`. The first thing wrong, with its line.
pub fn check(text: &str) -> Result<(), String> {
    let forms = parse(text)?;
    let mut forms = forms.iter();
    let version = [Expr::Symbol("version".into()), Expr::Symbol("1".into())];
    match forms.next() {
        Some((_, Expr::List(v))) if v[..] == version[..] => {}
        _ => return Err("the profile must begin with (version 1)".into()),
    }
    for (line, form) in forms {
        rule(form).map_err(|e| format!("line {line}: {e}"))?;
    }
    Ok(())
}

fn rule(form: &Expr) -> Result<(), String> {
    let Expr::List(items) = form else { return Err(format!("{form:?} is not a rule")) };
    match items.first() {
        Some(Expr::Symbol(s)) if s == "allow" || s == "deny" => {}
        other => return Err(format!("a rule begins with allow or deny, not {other:?}")),
    }
    let operations: Vec<&str> = items[1..]
        .iter()
        .map_while(|e| match e {
            Expr::Symbol(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    if operations.is_empty() {
        return Err("a rule names at least one operation".into());
    }
    if let Some(unknown) = operations.iter().find(|o| !OPERATIONS.contains(o)) {
        return Err(format!("unknown operation {unknown}"));
    }
    items[1 + operations.len()..].iter().try_for_each(filter)
}

fn filter(e: &Expr) -> Result<(), String> {
    let Expr::List(items) = e else { return Err(format!("{e:?} is not a filter")) };
    let (Some(Expr::Symbol(head)), args) = (items.first(), items.get(1..).unwrap_or_default()) else {
        return Err(format!("{e:?} is not a filter"));
    };
    let head = head.as_str();
    let one_text = || match args {
        [Expr::Text(t)] => Ok(t.as_str()),
        _ => Err(format!("({head} ...) takes one string")),
    };
    if PATH_FILTERS.contains(&head) {
        let path = one_text()?;
        return if path.starts_with('/') { Ok(()) } else { Err(format!("({head} {path:?}): not absolute")) };
    }
    if NAME_FILTERS.contains(&head) {
        return one_text().map(|_| ());
    }
    match (head, args) {
        ("regex", [Expr::Regex(_)]) => Ok(()),
        ("target", [Expr::Symbol(t)]) if TARGETS.contains(&t.as_str()) => Ok(()),
        ("socket-domain", [Expr::Symbol(d)]) if SOCKET_DOMAINS.contains(&d.as_str()) => Ok(()),
        ("remote" | "local", [Expr::Symbol(kind), Expr::Text(address)]) if is_ip(kind) => address
            .rsplit_once(':')
            .map(|_| ())
            .ok_or_else(|| format!("({head} {kind} {address:?}): no port")),
        ("remote" | "local", [Expr::Symbol(kind), inner]) if kind == "unix-socket" => filter(inner),
        ("require-any" | "require-all", inner) if !inner.is_empty() => inner.iter().try_for_each(filter),
        ("require-not", [inner]) => filter(inner),
        _ => Err(format!("unknown filter or arguments: ({head} ...)")),
    }
}

fn is_ip(kind: &str) -> bool {
    matches!(kind, "ip" | "tcp" | "udp")
}

/// The top-level forms of `text`, each with the line it begins on.
fn parse(text: &str) -> Result<Vec<(usize, Expr)>, String> {
    let mut reader = Reader { chars: text.chars().peekable(), line: 1 };
    let mut forms = Vec::new();
    while let Some(line) = reader.skip_blank() {
        match reader.expr()? {
            Some(e @ Expr::List(_)) => forms.push((line, e)),
            Some(other) => return Err(format!("line {line}: {other:?} outside a list")),
            None => return Err(format!("line {line}: ')' closes nothing")),
        }
    }
    Ok(forms)
}

struct Reader<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
}

impl Reader<'_> {
    /// Past spaces and comments: the line of what comes next, if anything does.
    fn skip_blank(&mut self) -> Option<usize> {
        while let Some(&c) = self.chars.peek() {
            match c {
                ';' => {
                    while self.chars.peek().is_some_and(|&c| c != '\n') {
                        self.chars.next();
                    }
                }
                '\n' => {
                    self.line += 1;
                    self.chars.next();
                }
                c if c.is_whitespace() => {
                    self.chars.next();
                }
                _ => return Some(self.line),
            }
        }
        None
    }

    /// The next expression; `None` at a closing parenthesis (consumed).
    fn expr(&mut self) -> Result<Option<Expr>, String> {
        let line = self.line;
        match self.chars.next() {
            Some('(') => {
                let mut items = Vec::new();
                loop {
                    if self.skip_blank().is_none() {
                        return Err(format!("line {line}: '(' never closed"));
                    }
                    match self.expr()? {
                        Some(e) => items.push(e),
                        None => return Ok(Some(Expr::List(items))),
                    }
                }
            }
            Some(')') => Ok(None),
            Some('"') => self.string(line).map(|s| Some(Expr::Text(s))),
            Some('#') if self.chars.next_if_eq(&'"').is_some() => {
                self.string(line).map(|s| Some(Expr::Regex(s)))
            }
            Some(c) if c.is_ascii_alphanumeric() || "*-_.".contains(c) => {
                let mut symbol = c.to_string();
                while let Some(c) = self.chars.next_if(|c| c.is_ascii_alphanumeric() || "*-_.".contains(*c)) {
                    symbol.push(c);
                }
                Ok(Some(Expr::Symbol(symbol)))
            }
            other => Err(format!("line {line}: unexpected {other:?}")),
        }
    }

    /// A string's text after its opening quote, up to the closing one.
    fn string(&mut self, line: usize) -> Result<String, String> {
        let mut text = String::new();
        loop {
            match self.chars.next() {
                None => return Err(format!("line {line}: string never closed")),
                Some('"') => return Ok(text),
                Some('\\') => match self.chars.next() {
                    Some(c @ ('"' | '\\')) => text.push(c),
                    other => return Err(format!("line {line}: unknown escape \\{other:?}")),
                },
                Some('\n') => return Err(format!("line {line}: a line break inside a string")),
                Some(c) => text.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    /// Every golden profile reads; and what sandbox-exec would refuse is
    /// refused here too, so the reading could fail.
    #[test]
    fn the_golden_profiles_read_and_malformed_ones_do_not() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/seatbelt/golden");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            // The fixture's directory is written `$ROOT` in them.
            let text = std::fs::read_to_string(&path).unwrap().replace("$ROOT", "/fixture");
            assert_eq!(check(&text), Ok(()), "{}", path.display());
            read += 1;
        }
        assert!(read >= 4, "{read} golden profiles");
        let good = "(version 1)\n(deny default)\n(allow file-read* (subpath \"/usr\"))\n";
        assert_eq!(check(good), Ok(()));
        for (bad, why) in [
            ("(deny default)\n", "must begin with (version 1)"),
            ("(version 1)\n(allow file-read* (subpath \"/usr\")\n", "never closed"),
            ("(version 1)\n(allow file-read* (subpath \"/usr\")))\n", "closes nothing"),
            ("(version 1)\n(allow file-reed* (subpath \"/usr\"))\n", "unknown operation file-reed*"),
            ("(version 1)\n(allow file-read* (subpaht \"/usr\"))\n", "unknown filter"),
            ("(version 1)\n(allow file-read* (subpath \"usr\"))\n", "not absolute"),
            ("(version 1)\n(allow file-read* (subpath \"/usr))\n", "a line break inside a string"),
            ("(version 1)\n(allow file-read* (subpath \"/usr\" \"/bin\"))\n", "takes one string"),
            ("(version 1)\n(allow signal (target everyone))\n", "unknown filter"),
            ("(version 1)\n(allow system-socket (socket-domain AF_INTERNET))\n", "unknown filter"),
            (
                "(version 1)\n(allow file-read* (require-not (subpath \"/a\") (subpath \"/b\")))\n",
                "unknown filter",
            ),
            ("(version 1)\n(allow network-outbound (remote ip \"localhost\"))\n", "no port"),
            ("(version 1)\n(permit file-read*)\n", "begins with allow or deny"),
            ("(version 1)\n(allow (subpath \"/usr\"))\n", "at least one operation"),
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
