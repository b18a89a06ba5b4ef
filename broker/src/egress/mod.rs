//! Strict egress, the broker's side (issue 15): the helper opens listening
//! sockets inside the sandbox's network namespace (only loopback there) and
//! hands them over; the broker serves them for the run. These are its
//! parts that do no I/O of their own: the address classifier, host names,
//! the refusals, the TLS server name and the DNS wire format.

pub mod addr;
#[allow(dead_code)]
mod dnswire;
#[allow(dead_code)]
mod name;
pub mod refusal;
#[allow(dead_code)]
mod sni;
