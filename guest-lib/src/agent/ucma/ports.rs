//! rdma_cm's port spaces: which ids own which port of a port space
//! (Linux cma.c `cma_get_port`, `cma_use_port`, `cma_alloc_any_port`,
//! `cma_check_port`), shared by every program of the function.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use vrnic_wire::PortSpace;

use super::sockaddr::is_any;

/// The ephemeral range ports are allocated from (Linux's default
/// `net.ipv4.ip_local_port_range`, 32768–60999, which
/// `cma_alloc_any_port` uses).
pub const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;

/// One owner of a bound port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    id: u32,
    addr: SocketAddr,
    reuseaddr: bool,
    afonly: bool,
}

/// Why a port cannot be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// Another id holds the same address and port (`EADDRINUSE`).
    #[error("address in use")]
    InUse,
    /// A wildcard conflicts with another owner of the port
    /// (`EADDRNOTAVAIL`, as `cma_check_port` answers).
    #[error("address not available")]
    NotAvail,
}

impl PortError {
    /// The negative errno.
    pub fn errno(self) -> i32 {
        match self {
            PortError::InUse => -libc::EADDRINUSE,
            PortError::NotAvail => -libc::EADDRNOTAVAIL,
        }
    }
}

/// The bound ports of every port space.
#[derive(Debug, Default)]
pub struct Ports {
    bound: BTreeMap<(u16, u16), Vec<Owner>>,
    /// Where the next ephemeral search starts.
    next: u32,
}

impl Ports {
    /// Empty tables; `seed` picks where ephemeral searches start.
    pub fn new(seed: u32) -> Ports {
        Ports {
            bound: BTreeMap::new(),
            next: seed,
        }
    }

    /// `cma_check_port`: whether id `id` at `addr` may share `port` with
    /// its current owners (`reuseaddr`: both must have set it).
    fn check(
        owners: &[Owner],
        id: u32,
        addr: &SocketAddr,
        reuseaddr: bool,
        afonly: bool,
    ) -> Result<(), PortError> {
        for cur in owners.iter().filter(|o| o.id != id) {
            if reuseaddr && cur.reuseaddr {
                continue;
            }
            if afonly && cur.afonly && addr.is_ipv4() != cur.addr.is_ipv4() {
                continue;
            }
            if is_any(addr) || is_any(&cur.addr) {
                return Err(PortError::NotAvail);
            }
            if addr.ip() == cur.addr.ip() {
                return Err(PortError::InUse);
            }
        }
        Ok(())
    }

    /// Binds id `id` to `addr` in `ps` (`cma_get_port`): port 0 takes a
    /// free ephemeral port (`cma_alloc_any_port`), another port is shared
    /// under `cma_check_port`'s rules. Returns the port. Errors:
    /// [`PortError`]; no free ephemeral port is [`PortError::NotAvail`]
    /// (cma.c `cma_alloc_any_port`: `-EADDRNOTAVAIL`).
    pub fn bind(
        &mut self,
        ps: PortSpace,
        id: u32,
        addr: SocketAddr,
        reuseaddr: bool,
        afonly: bool,
    ) -> Result<u16, PortError> {
        let port = if addr.port() == 0 {
            let span = u32::from(EPHEMERAL.end() - EPHEMERAL.start()) + 1;
            let mut found = None;
            for i in 0..span {
                let p = EPHEMERAL.start() + ((self.next.wrapping_add(i)) % span) as u16;
                if !self.bound.contains_key(&(ps as u16, p)) {
                    found = Some(p);
                    self.next = self.next.wrapping_add(i + 1);
                    break;
                }
            }
            found.ok_or(PortError::NotAvail)?
        } else {
            let p = addr.port();
            if let Some(owners) = self.bound.get(&(ps as u16, p)) {
                Self::check(owners, id, &addr, reuseaddr, afonly)?;
            }
            p
        };
        let mut a = addr;
        a.set_port(port);
        self.bound
            .entry((ps as u16, port))
            .or_default()
            .push(Owner {
                id,
                addr: a,
                reuseaddr,
                afonly,
            });
        Ok(port)
    }

    /// `rdma_listen`'s check of a reuseaddr id: nobody else may hold its
    /// address and port, reuseaddr or not (`cma_check_port(.., 0)`).
    pub fn check_listen(&self, ps: PortSpace, id: u32, addr: &SocketAddr) -> Result<(), PortError> {
        let Some(owners) = self.bound.get(&(ps as u16, addr.port())) else {
            return Ok(());
        };
        let me = owners.iter().find(|o| o.id == id).is_some_and(|o| o.afonly);
        Self::check(owners, id, addr, false, me)
    }

    /// Changes the address id `id` holds `port` with (a wildcard bind
    /// resolved to the function's address).
    pub fn rebind(&mut self, ps: PortSpace, id: u32, addr: SocketAddr) {
        if let Some(o) = self
            .bound
            .get_mut(&(ps as u16, addr.port()))
            .and_then(|v| v.iter_mut().find(|o| o.id == id))
        {
            o.addr = addr;
        }
    }

    /// Releases id `id`'s `port` in `ps`.
    pub fn release(&mut self, ps: PortSpace, id: u32, port: u16) {
        if let Some(v) = self.bound.get_mut(&(ps as u16, port)) {
            v.retain(|o| o.id != id);
            if v.is_empty() {
                self.bound.remove(&(ps as u16, port));
            }
        }
    }

    /// How many (port space, port) pairs are bound.
    pub fn len(&self) -> usize {
        self.bound.len()
    }

    /// Whether no port is bound.
    pub fn is_empty(&self) -> bool {
        self.bound.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn conflicts_as_cma_check_port() {
        let mut p = Ports::new(0);
        let tcp = PortSpace::Tcp;
        assert_eq!(p.bind(tcp, 1, a("10.0.0.1:7174"), false, true), Ok(7174));
        assert_eq!(
            p.bind(tcp, 2, a("10.0.0.1:7174"), false, true),
            Err(PortError::InUse)
        );
        assert_eq!(
            p.bind(tcp, 2, a("0.0.0.0:7174"), false, true),
            Err(PortError::NotAvail)
        );
        // Another address on the same port is fine; another port space too.
        assert_eq!(p.bind(tcp, 3, a("10.0.0.9:7174"), false, true), Ok(7174));
        assert_eq!(
            p.bind(PortSpace::Udp, 4, a("10.0.0.1:7174"), false, true),
            Ok(7174)
        );
        // Both reuseaddr: shared.
        assert_eq!(p.bind(tcp, 5, a("10.0.0.1:9"), true, true), Ok(9));
        assert_eq!(p.bind(tcp, 6, a("10.0.0.1:9"), true, true), Ok(9));
        assert_eq!(
            p.check_listen(tcp, 6, &a("10.0.0.1:9")),
            Err(PortError::InUse)
        );
        // AFONLY on both: an IPv6 wildcard does not conflict with IPv4.
        assert_eq!(p.bind(tcp, 7, a("[::]:7174"), false, true), Ok(7174));
        p.release(tcp, 1, 7174);
        p.release(tcp, 3, 7174);
        p.release(tcp, 7, 7174);
        assert_eq!(p.bind(tcp, 2, a("0.0.0.0:7174"), false, true), Ok(7174));
    }

    #[test]
    fn ephemeral_ports_are_distinct_and_in_range() {
        let mut p = Ports::new(12345);
        let mut seen = std::collections::BTreeMap::new();
        for id in 0..100 {
            let port = p
                .bind(PortSpace::Tcp, id, a("0.0.0.0:0"), false, true)
                .unwrap();
            assert!(EPHEMERAL.contains(&port));
            assert!(seen.insert(port, id).is_none());
        }
        assert_eq!(p.len(), 100);
        for (port, id) in seen {
            p.release(PortSpace::Tcp, id, port);
        }
        assert!(p.is_empty());
    }
}
