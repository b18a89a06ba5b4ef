//! Where in a file a byte offset is, as editors count: the configuration's
//! and the Cedar file's errors name their line and column.

/// 1-based line and column of a byte offset (inside a character: of that character).
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = (0..=offset.min(text.len())).rev().find(|o| text.is_char_boundary(*o)).unwrap_or(0);
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}
