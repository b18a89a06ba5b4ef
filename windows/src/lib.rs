//! Windows' side of palisade's executor: a run's processes in one Job
//! Object ([`job`]). The limits come from the policy's translation of a
//! decided plan (`palisade_policy::windows`); this crate applies them.
//!
//! Not yet behind the broker's executor seam: `palisaded.exe` and
//! `palisade.exe` still refuse every run (docs/windows.md says what is
//! missing). On other systems the crate is empty.

#[cfg(windows)]
pub mod job;
