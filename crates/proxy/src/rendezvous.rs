//! Where rank 0 serves the frameworks' rendezvous: torch.distributed's `MASTER_ADDR` and
//! `MASTER_PORT`, JAX's `JAX_COORDINATOR_ADDRESS`. The address is an IP of rank 0's node that
//! the other nodes reach (never a name they would have to resolve, never loopback where other
//! machines take part), the ports two that were free there at launch: chosen by whoever runs
//! on rank 0's machine (rlaunch, or rank 0's proxy).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener};

use rlaunch_protocol::control::Rendezvous;

/// Two ports free on this machine now, for `MASTER_PORT` and JAX's coordinator, then let go
/// for rank 0 to bind.
///
/// They come from below the kernel's ephemeral range (`ip_local_port_range`), never from
/// it: a port the kernel hands out to `bind(0)` or `connect()` can be given to any process
/// in the seconds before rank 0's program binds it (a JAX coordinator binds after its import,
/// seconds later; CI saw another job's listener take it). Outside that range only a program
/// naming the port takes it. Each candidate is drawn at random, skips the ports the admin
/// reserved (`ip_local_reserved_ports`), and is bound on every address (so a listener on any
/// of them rules it out). Where the ephemeral range leaves no room, the kernel chooses.
pub fn pick(addr: IpAddr) -> io::Result<Rendezvous> {
    let (master, jax) = match quiet_ports() {
        Some(ports) => ports,
        None => kernel_ports(addr)?,
    };
    Ok(Rendezvous { addr: addr.to_string(), port: master, jax_port: jax })
}

/// Candidates drawn from below the ephemeral range.
const TRIES: usize = 64;

/// Two free ports outside the ephemeral range; `None` where none were found.
fn quiet_ports() -> Option<(u16, u16)> {
    let ranges = quiet_ranges(&read_proc("ip_local_port_range"));
    let reserved = read_proc("ip_local_reserved_ports");
    let size: u32 = ranges.iter().map(|r| u32::from(r.end - r.start)).sum();
    if size < 2 {
        return None;
    }
    let mut held = Vec::with_capacity(2);
    let mut draws = std::iter::repeat_with(random).take(TRIES);
    while held.len() < 2 {
        let port = nth_port(&ranges, (draws.next()? % u64::from(size)) as u32);
        if is_reserved(&reserved, port) {
            continue;
        }
        if let Some(listener) = bind_everywhere(port) {
            held.push(listener);
        }
    }
    let port = |l: &TcpListener| l.local_addr().map(|a| a.port()).ok();
    Some((port(&held[0])?, port(&held[1])?))
}

/// Ports no kernel choice takes: up to 16384 ports below the ephemeral range, from 1024, and
/// what lies above it.
fn quiet_ranges(port_range: &str) -> Vec<std::ops::Range<u16>> {
    let mut bounds = port_range.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(low)), Some(Ok(high))) = (bounds.next(), bounds.next()) else {
        return Vec::new();
    };
    let below = low.saturating_sub(16384).max(1024)..low;
    let above = high.saturating_add(1)..u16::MAX;
    [below, above].into_iter().filter(|r| r.start < r.end).collect()
}

/// The `n`th port of `ranges` laid end to end.
fn nth_port(ranges: &[std::ops::Range<u16>], mut n: u32) -> u16 {
    for range in ranges {
        let len = u32::from(range.end - range.start);
        if n < len {
            return range.start + n as u16;
        }
        n -= len;
    }
    unreachable!("n is below the ranges' total size")
}

/// Whether `port` is in a list such as `8080,9000-9010`.
fn is_reserved(list: &str, port: u16) -> bool {
    list.trim().split(',').filter(|item| !item.is_empty()).any(|item| {
        let (start, end) = item.split_once('-').unwrap_or((item, item));
        matches!((start.parse::<u16>(), end.parse::<u16>()), (Ok(s), Ok(e)) if (s..=e).contains(&port))
    })
}

/// `port` bound on every address (IPv6's, which covers IPv4's, else IPv4's).
fn bind_everywhere(port: u16) -> Option<TcpListener> {
    TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
        .ok()
}

/// The kernel's choice: bound together, so they differ.
fn kernel_ports(addr: IpAddr) -> io::Result<(u16, u16)> {
    let master = TcpListener::bind((addr, 0))?;
    let jax = TcpListener::bind((addr, 0))?;
    Ok((master.local_addr()?.port(), jax.local_addr()?.port()))
}

fn read_proc(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).unwrap_or_default()
}

/// A random number: std's hasher keys are drawn from the OS's random source per process and
/// stepped per call.
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

/// An address of this machine that other machines reach: the one the ssh session that
/// started this proxy came in at (`SSH_CONNECTION`), else the first IPv4 address of an
/// interface that is up and not loopback, else loopback.
pub fn own_address() -> IpAddr {
    let ssh = std::env::var("SSH_CONNECTION").ok();
    if let Some(addr) = ssh.as_deref().and_then(ssh_server_address) {
        return addr;
    }
    let up = |flags: nix::net::if_::InterfaceFlags| {
        use nix::net::if_::InterfaceFlags as F;
        flags.contains(F::IFF_UP) && !flags.contains(F::IFF_LOOPBACK)
    };
    let found = nix::ifaddrs::getifaddrs().ok().and_then(|mut all| {
        all.find_map(|ifa| {
            let addr = ifa.address?;
            let v4 = addr.as_sockaddr_in()?.ip();
            up(ifa.flags).then_some(IpAddr::V4(v4))
        })
    });
    found.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The server's address in `SSH_CONNECTION` ("client port server port").
fn ssh_server_address(value: &str) -> Option<IpAddr> {
    let addr: IpAddr = value.split_whitespace().nth(2)?.parse().ok()?;
    (!addr.is_loopback() && !addr.is_unspecified()).then_some(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ssh_server_address_is_where_the_session_came_in() {
        let addr = ssh_server_address("10.1.0.1 52000 10.1.0.12 22");
        assert_eq!(addr, Some("10.1.0.12".parse().unwrap()));
        assert_eq!(ssh_server_address("::1 52000 ::1 22"), None);
        assert_eq!(ssh_server_address("garbage"), None);
    }

    #[test]
    fn two_free_ports_differ_and_can_be_bound_again() {
        let picked = pick(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        assert_ne!(picked.port, picked.jax_port);
        assert_eq!(picked.addr, "127.0.0.1");
        TcpListener::bind(("127.0.0.1", picked.port)).expect("the port is free again");
        let range = read_proc("ip_local_port_range");
        let bounds: Vec<u16> = range.split_whitespace().map(|b| b.parse().unwrap()).collect();
        let ephemeral = bounds[0]..=bounds[1];
        let outside = |port| !ephemeral.contains(&port);
        assert!(outside(picked.port) && outside(picked.jax_port), "{picked:?} outside {range}");
    }

    #[test]
    fn quiet_ports_lie_outside_the_ephemeral_range() {
        assert_eq!(quiet_ranges("32768\t60999\n"), vec![16384..32768, 61000..65535]);
        assert_eq!(quiet_ranges("1024 65535"), Vec::<std::ops::Range<u16>>::new());
        assert_eq!(quiet_ranges("2000 65535"), vec![1024..2000]);
        assert_eq!(quiet_ranges("nonsense"), Vec::<std::ops::Range<u16>>::new());
        let ranges = quiet_ranges("32768 60999");
        assert_eq!(nth_port(&ranges, 0), 16384);
        assert_eq!(nth_port(&ranges, 16384), 61000);
        assert!(is_reserved("8080,20000-20010\n", 20005));
        assert!(!is_reserved("8080,20000-20010\n", 20011));
        assert!(!is_reserved("\n", 20011));
    }
}
