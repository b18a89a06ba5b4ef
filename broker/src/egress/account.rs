//! What a run reached and was refused, as the attestation records it
//! (`EgressTraffic`): hosts aggregated per name, port and path, refusals
//! in order, both bounded.

use super::refusal::Refusal;
use palisade_protocol::attest::{
    EGRESS_LIST_MAX, EgressDenied, EgressPath, EgressTraffic, HostReached, InspectedRequest,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Longest host kept in a record (a name is at most 253 bytes; what the
/// sandbox sent in its place may be anything up to a request head).
const HOST_MAX: usize = 256;
/// Longest detail kept in a record.
const DETAIL_MAX: usize = 512;

#[derive(Default)]
pub struct Account {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    traffic: EgressTraffic,
    /// (host, port, path) → its entry in `traffic.reached`.
    index: HashMap<(String, u16, u8), usize>,
}

impl Account {
    /// Records a refusal (logged at info).
    pub fn deny(&self, host: &str, port: u16, via: EgressPath, refusal: &Refusal) {
        let (host, detail) = (clip(host, HOST_MAX), clip(&refusal.to_string(), DETAIL_MAX));
        tracing::info!(host, port, ?via, reason = refusal.reason(), "egress refused: {detail}");
        let mut state = self.lock();
        let traffic = &mut state.traffic;
        if traffic.denied.len() < EGRESS_LIST_MAX {
            traffic.denied.push(EgressDenied {
                host,
                port,
                via,
                reason: refusal.reason().to_owned(),
                detail,
            });
        } else {
            traffic.denied_omitted += 1;
        }
    }

    /// Records a request on an inspected connection.
    pub fn inspected(&self, mut request: InspectedRequest) {
        request.host = clip(&request.host, HOST_MAX);
        request.path = clip(&request.path, DETAIL_MAX);
        request.rule = request.rule.map(|r| clip(&r, DETAIL_MAX));
        tracing::info!(
            method = request.method,
            host = request.host,
            path = request.path,
            status = request.status,
            allowed = request.allowed,
            "inspected request"
        );
        let traffic = &mut self.lock().traffic;
        if traffic.requests.len() < EGRESS_LIST_MAX {
            traffic.requests.push(request);
        } else {
            traffic.requests_omitted += 1;
        }
    }

    /// Records a connection opened to `host:port` at `address`; its bytes
    /// are added when the returned [`Flow`] is dropped.
    pub fn reached(&self, host: &str, port: u16, address: SocketAddr, via: EgressPath) -> Flow<'_> {
        tracing::debug!(host, port, %address, ?via, "egress connection");
        let mut state = self.lock();
        let key = (host.to_owned(), port, via as u8);
        let entry = match state.index.get(&key) {
            Some(&i) => Some(i),
            None if state.traffic.reached.len() < EGRESS_LIST_MAX => {
                let i = state.traffic.reached.len();
                state.traffic.reached.push(HostReached {
                    host: host.to_owned(),
                    port,
                    address: address.ip().to_string(),
                    via,
                    connections: 0,
                    bytes_out: 0,
                    bytes_in: 0,
                });
                state.index.insert(key, i);
                Some(i)
            }
            None => {
                state.traffic.reached_omitted += 1;
                None
            }
        };
        if let Some(i) = entry {
            state.traffic.reached[i].connections += 1;
        }
        Flow { account: self, entry, out: AtomicU64::new(0), inbound: AtomicU64::new(0) }
    }

    /// What the run reached and was refused; `quota_exceeded` as the run's
    /// quota says.
    pub fn traffic(&self, quota_exceeded: bool) -> EgressTraffic {
        let mut traffic = std::mem::take(&mut self.lock().traffic);
        traffic.quota_exceeded = quota_exceeded;
        traffic
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `text` cut to at most `max` bytes, at a character boundary, marked.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// One connection's bytes, counted as they pass and added to the account
/// when it is dropped: a connection ended by the run's end, the quota or an
/// error is counted all the same.
pub struct Flow<'a> {
    account: &'a Account,
    entry: Option<usize>,
    /// From the sandbox to the host.
    pub out: AtomicU64,
    /// From the host to the sandbox.
    pub inbound: AtomicU64,
}

impl Drop for Flow<'_> {
    fn drop(&mut self) {
        let (out, inbound) = (*self.out.get_mut(), *self.inbound.get_mut());
        let mut state = self.account.lock();
        state.traffic.bytes_out += out;
        state.traffic.bytes_in += inbound;
        if let Some(entry) = self.entry.and_then(|i| state.traffic.reached.get_mut(i)) {
            entry.bytes_out += out;
            entry.bytes_in += inbound;
        }
    }
}

/// Adds `n` to a flow's counter (the tunnel's hot path: one atomic add per
/// buffer, not per byte).
pub fn count(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_bounded_and_the_rest_counted() {
        let account = Account::default();
        let at: SocketAddr = "127.0.0.1:80".parse().unwrap();
        for i in 0..EGRESS_LIST_MAX + 3 {
            account.deny(
                &format!("h{i}.test"),
                80,
                EgressPath::Proxy,
                &Refusal::PortNotAllowed { port: 80, fix: String::new() },
            );
            let flow = account.reached(&format!("h{i}.test"), 80, at, EgressPath::Proxy);
            count(&flow.out, 2);
            count(&flow.inbound, 3);
        }
        drop(account.reached("h0.test", 80, at, EgressPath::Proxy));
        let traffic = account.traffic(false);
        assert_eq!((traffic.denied.len(), traffic.denied_omitted), (EGRESS_LIST_MAX, 3));
        assert_eq!((traffic.reached.len(), traffic.reached_omitted), (EGRESS_LIST_MAX, 3));
        assert_eq!(traffic.reached[0].connections, 2);
        let total = (EGRESS_LIST_MAX + 3) as u64;
        assert_eq!((traffic.bytes_out, traffic.bytes_in), (2 * total, 3 * total));
        assert_eq!(traffic.denied[0].reason, "port_not_allowed");
    }

    #[test]
    fn long_hosts_and_details_are_clipped() {
        let account = Account::default();
        let long = "é".repeat(1000);
        account.deny(&long, 80, EgressPath::Proxy, &Refusal::MalformedRequest(long.clone()));
        let denied = &account.traffic(false).denied[0];
        assert!(denied.host.len() <= HOST_MAX && denied.host.ends_with('…'));
        assert!(denied.detail.len() <= DETAIL_MAX && denied.detail.starts_with("éé"));
    }
}
