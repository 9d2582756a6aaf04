//! Where rank 0 serves the frameworks' rendezvous: torch.distributed's `MASTER_ADDR` and
//! `MASTER_PORT`, JAX's `JAX_COORDINATOR_ADDRESS`. The address is an IP of rank 0's node that
//! the other nodes reach (never a name they would have to resolve, never loopback where other
//! machines take part), the ports two that were free there at launch: chosen by whoever runs
//! on rank 0's machine (rlaunch, or rank 0's proxy).

use std::io;
use std::net::{IpAddr, Ipv4Addr, TcpListener};

use rlaunch_protocol::control::Rendezvous;

/// Two ports free on `addr` now, for `MASTER_PORT` and JAX's coordinator: bound together, so
/// they differ, then let go for rank 0 to bind. The kernel hands out a free port at random,
/// so two jobs started at once get different ones.
pub fn pick(addr: IpAddr) -> io::Result<Rendezvous> {
    let master = TcpListener::bind((addr, 0))?;
    let jax = TcpListener::bind((addr, 0))?;
    let port = master.local_addr()?.port();
    let jax_port = jax.local_addr()?.port();
    Ok(Rendezvous { addr: addr.to_string(), port, jax_port })
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
    }
}
