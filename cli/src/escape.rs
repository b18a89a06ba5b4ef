//! What a run wrote, shown to a person: file names and a diff's text are
//! the run's, and a terminal obeys what they hold (an escape sequence sets
//! the clipboard or the title, moves the cursor up and erases the line
//! that named a git hook; a newline in a name forges an entry of its own).
//! Every run-controlled string palisade prints goes through here: control
//! characters and the characters that reorder text are shown as escapes,
//! as git's `core.quotePath` does for names. `--json` keeps the exact
//! text (JSON escapes it), and `palisade changes show --raw` the diff's.

use std::borrow::Cow;

/// Whether `c` is shown escaped: a C0 or C1 control, DEL, or a character
/// that reorders or hides text (bidirectional overrides and isolates,
/// zero-width marks).
fn unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
        c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
    }
}

/// A name as a person reads it: as it is when it holds nothing a terminal
/// acts on, else in double quotes with C escapes (`"a\nb"`, `"\x1b]52;..."`).
pub fn name(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| unsafe_char(c) || c == '"' || c == '\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if unsafe_char(c) => push_escaped(&mut out, c),
            c => out.push(c),
        }
    }
    out.push('"');
    Cow::Owned(out)
}

/// Text of many lines (a diff): lines and tabs kept, every other control
/// character and reordering mark escaped.
pub fn text(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| unsafe_char(c) && c != '\n' && c != '\t') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if unsafe_char(c) => push_escaped(&mut out, c),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_terminal_would_act_on_are_quoted_and_escaped() {
        assert_eq!(name("src/main.rs"), "src/main.rs");
        assert_eq!(name("with space.txt"), "with space.txt");
        assert_eq!(name("a\nb"), "\"a\\nb\"");
        assert_eq!(name("x\r\u{1b}[1A\u{1b}[2K"), "\"x\\r\\x1b[1A\\x1b[2K\"");
        assert_eq!(name("\u{1b}]52;c;aGk=\u{7}"), "\"\\x1b]52;c;aGk=\\x07\"");
        assert_eq!(name("q\"uote\\"), "\"q\\\"uote\\\\\"");
        assert_eq!(name("evil\u{202e}txt.sh"), "\"evil\\u{202e}txt.sh\"");
        assert_eq!(name("\u{9b}31m"), "\"\\u{9b}31m\"");
        assert_eq!(name("naïve"), "naïve");
    }

    #[test]
    fn text_keeps_its_lines_and_escapes_the_rest() {
        assert_eq!(text("+ok\n-old\tx\n"), "+ok\n-old\tx\n");
        assert_eq!(text("+\u{1b}]0;title\u{7}\n"), "+\\x1b]0;title\\x07\n");
        assert_eq!(text("+a\r+forged\n"), "+a\\r+forged\n");
    }
}
