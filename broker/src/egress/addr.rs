//! Which addresses the broker refuses to connect to on a sandbox's behalf:
//! everything that is not the public internet (loopback, private,
//! link-local with the cloud metadata address, multicast, ...), in every
//! IPv6 form that carries an IPv4 address, unless the plan lists it.

use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The class of a refused address, or `None` for a public one.
pub fn refused_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

/// Whether the broker may connect to `ip`: public, or inside one of the
/// plan's `allow_addresses` (checked on the address's canonical form too,
/// so `::ffff:127.0.0.1` is allowed by `127.0.0.1/32` and refused without).
pub fn acceptable(ip: IpAddr, allow: &[IpNet]) -> bool {
    let canonical = ip.to_canonical();
    if allow.iter().any(|net| net.contains(&ip) || net.contains(&canonical)) {
        return true;
    }
    refused_class(ip).is_none()
}

fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let class = match (a, b, c) {
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) | (192, 168, _) => "private",
        (172, 16..=31, _) => "private",
        (100, 64..=127, _) => "shared (CGNAT)",
        (169, 254, _) => "link-local",
        (192, 0, 0) => "IETF protocol assignments",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved or broadcast",
        _ => return None,
    };
    Some(class)
}

fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4_class(v4).unwrap_or("IPv4-mapped"));
    }
    let s = ip.segments();
    let embedded = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let class = match s {
        [0, 0, 0, 0, 0, 0, 0, 0] => "unspecified",
        [0, 0, 0, 0, 0, 0, 0, 1] => "loopback",
        // Deprecated IPv4-compatible form (::a.b.c.d): never routed as such.
        [0, 0, 0, 0, 0, 0, _, _] => v4_class(embedded).unwrap_or("IPv4-compatible"),
        // NAT64 (64:ff9b::/96) reaches the embedded IPv4 address.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => return v4_class(embedded),
        [0x100, 0, 0, 0, ..] => "discard-only",
        [0x2001, 0xdb8, ..] => "documentation",
        // Teredo and 6to4 tunnel to IPv4 addresses the broker cannot check.
        [0x2001, 0, ..] => "Teredo",
        [0x2002, ..] => "6to4",
        [x, ..] if x & 0xfe00 == 0xfc00 => "unique local (private)",
        [x, ..] if x & 0xffc0 == 0xfe80 => "link-local",
        [x, ..] if x & 0xffc0 == 0xfec0 => "site-local",
        [x, ..] if x & 0xff00 == 0xff00 => "multicast",
        _ => return None,
    };
    Some(class)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn non_public_addresses_are_refused_in_every_form() {
        for s in [
            "127.0.0.1",
            "127.77.0.1",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "198.18.0.1",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:8.8.8.8",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "2002:7f00:1::1",
        ] {
            assert!(refused_class(ip(s)).is_some(), "{s} should be refused");
            assert!(!acceptable(ip(s), &[]), "{s} should not be acceptable");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for s in ["8.8.8.8", "1.1.1.1", "172.32.0.1", "100.128.0.1", "2606:4700::1111", "64:ff9b::808:808"] {
            assert_eq!(refused_class(ip(s)), None, "{s}");
        }
    }

    #[test]
    fn allow_addresses_admit_a_refused_address_and_its_mapped_form() {
        let allow: Vec<IpNet> = vec!["127.0.0.1/32".parse().unwrap()];
        assert!(acceptable(ip("127.0.0.1"), &allow));
        assert!(acceptable(ip("::ffff:127.0.0.1"), &allow));
        assert!(!acceptable(ip("127.0.0.2"), &allow));
        assert!(!acceptable(ip("169.254.169.254"), &allow));
    }
}
