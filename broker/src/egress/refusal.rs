//! Why the broker refused a connection or a lookup: the module's typed
//! error, with the stable reason the attestation records.

#[cfg(doc)]
use palisade_policy::EgressPlan;

/// A refused attempt; `reason()` is the stable word, the message is for a
/// person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0} is not an allowed name")]
    DomainNotAllowed(String),
    /// `fix`: what would let it through ([`EgressPlan::port_fix`]).
    #[error("port {port} is not an allowed port{fix}")]
    PortNotAllowed { port: u16, fix: String },
    /// `fix`: what would let it through ([`EgressPlan::address_fix`]).
    #[error("{name} resolves only to refused addresses ({addresses}){fix}")]
    AddressRefused { name: String, addresses: String, fix: String },
    #[error("cannot resolve {name}: {why}")]
    ResolveFailed { name: String, why: String },
    #[error("cannot connect to {name}: {why}")]
    ConnectFailed { name: String, why: String },
    #[error("the TLS server name {found:?} is not {expected}")]
    SniMismatch { expected: String, found: String },
    #[error("{0} connections are open, the run's limit")]
    TooManyConnections(u32),
    #[error("the run's egress quota of {0} bytes is used up")]
    QuotaExceeded(u64),
    #[error("{0}")]
    MalformedRequest(String),
    #[error("{0}")]
    QueryRefused(String),
    #[error("more than {0} name lookups a second")]
    RateLimited(u32),
    #[error("{0}")]
    RequestNotAllowed(String),
    #[error("{0}")]
    TlsFailed(String),
}

impl Refusal {
    /// The stable reason (`EgressDenied::reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::DomainNotAllowed(_) => "domain_not_allowed",
            Refusal::PortNotAllowed { .. } => "port_not_allowed",
            Refusal::AddressRefused { .. } => "address_refused",
            Refusal::ResolveFailed { .. } => "resolve_failed",
            Refusal::ConnectFailed { .. } => "connect_failed",
            Refusal::SniMismatch { .. } => "sni_mismatch",
            Refusal::TooManyConnections(_) => "too_many_connections",
            Refusal::QuotaExceeded(_) => "quota_exceeded",
            Refusal::MalformedRequest(_) => "malformed_request",
            Refusal::QueryRefused(_) => "query_refused",
            Refusal::RateLimited(_) => "rate_limited",
            Refusal::RequestNotAllowed(_) => "request_not_allowed",
            Refusal::TlsFailed(_) => "tls_failed",
        }
    }

    /// The proxy's answer to a refusal: 403 for what the policy refuses, 502
    /// for an origin that cannot be reached, 503 for the run's limits.
    pub fn http_status(&self) -> u16 {
        match self {
            Refusal::DomainNotAllowed(_)
            | Refusal::PortNotAllowed { .. }
            | Refusal::AddressRefused { .. }
            | Refusal::SniMismatch { .. }
            | Refusal::QueryRefused(_)
            | Refusal::RequestNotAllowed(_) => 403,
            Refusal::ResolveFailed { .. } | Refusal::ConnectFailed { .. } | Refusal::TlsFailed(_) => 502,
            Refusal::TooManyConnections(_) | Refusal::QuotaExceeded(_) | Refusal::RateLimited(_) => 503,
            Refusal::MalformedRequest(_) => 400,
        }
    }
}
