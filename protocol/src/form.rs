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
/// The version that added the run request's `allow_ports` and
/// `allow_addresses` (at its end): a connection of an older one has the
/// form without them.
pub const REACH_VERSION: u32 = 20;
/// The version that added the run status `stopped` (a session its
/// requester stopped, said `cancelled` in an older form) and a change
/// set's `broker` (at the end of its info, which an older form has not):
/// the same version as [`REACH_VERSION`].
pub const STOPPED_VERSION: u32 = REACH_VERSION;
/// The version that added what operators and requesters of a shared
/// broker see: the status's runs, sessions, shares and last reload (at the
/// end of `BrokerStatus`), and the result's `approved` (at the end of
/// `RunResult`): a connection of an older one has the form without them.
pub const OPERATIONS_VERSION: u32 = 21;

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

/// `skip_serializing_if` of a field version 20 added ([`REACH_VERSION`],
/// [`STOPPED_VERSION`]): not written in an older form.
pub(crate) fn before_20<T>(_: &T) -> bool {
    form_before(REACH_VERSION)
}

/// `deserialize_with` of a field version 20 added at the end of its
/// message: an older bincode form has no bytes for it, and it is read as
/// its default. JSON names its fields: one there is read in any form.
pub(crate) fn field_of_20<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    field_since(REACH_VERSION, d)
}

/// `skip_serializing_if` of a field version 21 added ([`OPERATIONS_VERSION`]).
pub(crate) fn before_21<T>(_: &T) -> bool {
    form_before(OPERATIONS_VERSION)
}

/// `deserialize_with` of a field version 21 added at the end of its message.
pub(crate) fn field_of_21<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    field_since(OPERATIONS_VERSION, d)
}

/// A field `version` added at the end of its message, read in the form the
/// connection's version gives it.
fn field_since<'de, D, T>(version: u32, d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    if !d.is_human_readable() && form_before(version) {
        return Ok(T::default());
    }
    T::deserialize(d)
}
