//! palisade's integration tests, one binary with a module per subject (one
//! link, shared fixtures in `palisade_tests`). A module's tests are named
//! after it: `cargo test -p palisade-tests --test all -- jail::` runs the
//! jail's. When the suite runs as root, each module that drives sandboxes
//! runs again as the unprivileged test user (`rerun_unprivileged`).
//!
//! The slow tier (feature `slow`, what `.ci/run` adds) brings the soak and
//! load tests, the official MCP SDK's client and the installed Python client here, and the QEMU guests
//! in a binary of their own (`tests/tests/guest.rs`), which cargo runs after
//! this one: a guest emulated without KVM is slow enough that sharing the
//! two cores with the rest of the suite put it past its bound.

mod approvals;
mod boundaries;
mod broker;
mod cedar;
mod changes;
mod cli_flags;
mod deploy;
mod direct;
mod discovery;
mod disk;
mod durable;
mod egress;
mod faults;
mod fidelity;
mod fuzz_corpus;
mod hardening;
mod helper_audit;
mod inspect;
mod jail;
mod journal;
mod launchd;
mod limits;
mod mcp_wire;
mod operations;
mod plugins;
mod policy;
mod protocol_doc;
mod python_client;
mod sessions;
mod stdin;
mod system;
mod terminal;
mod warm;

#[cfg(feature = "slow")]
mod first_hour;
#[cfg(feature = "slow")]
mod mcp;
#[cfg(feature = "slow")]
mod soak;
