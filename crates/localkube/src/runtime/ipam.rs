//! In-memory IP address management for the pod CIDR.
//!
//! The first host address is the gateway (the bridge); pods get the others, handed out
//! next-fit (round robin) so a released address is reused only after the rest of the range,
//! like the host-local CNI plugin. Not thread-safe by itself: [`super::Network`] wraps it in a
//! mutex.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::error::{Result, RuntimeError};

/// Address allocator over one IPv4 network.
#[derive(Debug, Clone)]
pub struct Ipam {
    net: Ipv4Net,
    first: u32,
    last: u32,
    next: u32,
    allocated: BTreeSet<u32>,
}

impl Ipam {
    /// An allocator for `net`; needs at least a /30 (gateway + one pod).
    pub fn new(net: Ipv4Net) -> Result<Self> {
        let net = net.trunc();
        if net.prefix_len() > 30 {
            return Err(RuntimeError::invalid(
                "pod CIDR",
                format!("{net} is too small (need at least a /30)"),
            ));
        }
        let network = u32::from(net.network());
        let broadcast = u32::from(net.broadcast());
        // network+1 is the gateway; pods use network+2 ..= broadcast-1.
        Ok(Self {
            net,
            first: network + 2,
            last: broadcast - 1,
            next: network + 2,
            allocated: BTreeSet::new(),
        })
    }

    /// The gateway address (first host of the network).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.net.network()) + 1)
    }

    /// The managed network.
    pub fn net(&self) -> Ipv4Net {
        self.net
    }

    /// Hands out a free address.
    pub fn allocate(&mut self) -> Result<Ipv4Addr> {
        let size = self.last - self.first + 1;
        let mut candidate = self.next;
        for _ in 0..size {
            if !self.allocated.contains(&candidate) {
                self.allocated.insert(candidate);
                self.next = if candidate == self.last {
                    self.first
                } else {
                    candidate + 1
                };
                return Ok(Ipv4Addr::from(candidate));
            }
            candidate = if candidate == self.last {
                self.first
            } else {
                candidate + 1
            };
        }
        Err(RuntimeError::AddressesExhausted(self.net))
    }

    /// Returns an address to the pool (unknown addresses are ignored).
    pub fn release(&mut self, ip: Ipv4Addr) {
        self.allocated.remove(&u32::from(ip));
    }

    /// Number of addresses in use.
    pub fn in_use(&self) -> usize {
        self.allocated.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_is_first_host_and_pods_follow() {
        let mut ipam = Ipam::new("10.250.3.0/24".parse().unwrap()).unwrap();
        assert_eq!(ipam.gateway(), Ipv4Addr::new(10, 250, 3, 1));
        assert_eq!(ipam.allocate().unwrap(), Ipv4Addr::new(10, 250, 3, 2));
        assert_eq!(ipam.allocate().unwrap(), Ipv4Addr::new(10, 250, 3, 3));
    }

    #[test]
    fn exhausts_then_reuses_released() {
        let mut ipam = Ipam::new("10.250.3.0/29".parse().unwrap()).unwrap();
        // .2 ..= .6 are usable.
        let ips: Vec<_> = (0..5).map(|_| ipam.allocate().unwrap()).collect();
        assert_eq!(ips.last(), Some(&Ipv4Addr::new(10, 250, 3, 6)));
        assert!(matches!(
            ipam.allocate(),
            Err(RuntimeError::AddressesExhausted(_))
        ));
        ipam.release(Ipv4Addr::new(10, 250, 3, 4));
        assert_eq!(ipam.allocate().unwrap(), Ipv4Addr::new(10, 250, 3, 4));
        assert_eq!(ipam.in_use(), 5);
    }

    #[test]
    fn next_fit_does_not_reuse_immediately() {
        let mut ipam = Ipam::new("10.250.3.0/24".parse().unwrap()).unwrap();
        let a = ipam.allocate().unwrap();
        ipam.release(a);
        assert_ne!(ipam.allocate().unwrap(), a);
    }

    #[test]
    fn unaligned_cidr_is_truncated_and_tiny_rejected() {
        let ipam = Ipam::new("10.250.3.77/24".parse().unwrap()).unwrap();
        assert_eq!(ipam.gateway(), Ipv4Addr::new(10, 250, 3, 1));
        assert!(Ipam::new("10.250.3.0/31".parse().unwrap()).is_err());
    }
}
