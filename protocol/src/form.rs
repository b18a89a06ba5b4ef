//! The form messages take on a connection of an older protocol version:
//! a message whose form a version changed is written and read, on a
//! connection of an earlier one, in that one's form. Encoding and decoding
//! never wait, so the version is the thread's while they run.

use std::cell::Cell;

/// The version that added inspected requests to `EgressTraffic`
/// (`requests`, `requests_omitted`): a connection of an older one has the
/// form without them.
pub const INSPECTION_VERSION: u32 = 18;
/// The version that made a run's writes that did not all land say so
/// (`Changes`' outcome `partial`, its counts `dirs`, `held` and
/// `discarded`, and the withheld reason `not_carried`): a connection of an
/// older one has the form without them.
pub const LOUD_CHANGES_VERSION: u32 = 19;

std::thread_local! {
    /// The version whose form messages take while [`in_form_of`] runs;
    /// outside it, the newest form.
    static FORM: Cell<u32> = const { Cell::new(u32::MAX) };
}

/// Runs `f` (an encoding or decoding) with messages in the form of
/// protocol `version`.
pub fn in_form_of<R>(version: u32, f: impl FnOnce() -> R) -> R {
    let before = FORM.with(|form| form.replace(version));
    let out = f();
    FORM.with(|form| form.set(before));
    out
}

/// Whether messages take the form of a version older than `version`.
pub(crate) fn form_before(version: u32) -> bool {
    FORM.with(|form| form.get() < version)
}
