//! Listening and naming addresses: listeners on an ephemeral or an exact port, and
//! `NCCL_COMM_ID`'s `<host>:<port>` parsed and resolved.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};

use crate::debug::Subsys;
use crate::error::{Error, Result};

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // A fixed NCCL_COMM_ID port must be reusable while old connections sit in TIME_WAIT.
    s.set_reuse_address(true)?;
    super::size_buffers((&s).into())?;
    s.bind(&addr.into())?;
    // Deep backlog: many ranks may connect to one listener at once (p2p fan-in, the root).
    s.listen(1024)?;
    Ok(s.into())
}

/// A listener on an ephemeral port of `ip`, or of 127.0.0.1 if `ip` cannot be bound.
pub fn listen(ip: IpAddr) -> Result<TcpListener> {
    bind(SocketAddr::new(ip, 0)).or_else(|e| {
        crate::nccl_info!(Subsys::BOOTSTRAP, "Bootstrap: cannot listen on {ip} ({e}); falling back to 127.0.0.1");
        bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .map_err(|e| Error::System(format!("bootstrap: cannot listen on 127.0.0.1 either: {e}")))
    })
}

/// A listener on exactly `addr` (the root of an `NCCL_COMM_ID` run).
pub fn listen_exact(addr: SocketAddr) -> Result<TcpListener> {
    bind(addr).map_err(|e| {
        Error::System(format!(
            "bootstrap: rank 0 cannot listen on the NCCL_COMM_ID address {addr} ({e}); \
             NCCL_COMM_ID must name this host of rank 0 and a free port"
        ))
    })
}

/// Resolves `NCCL_COMM_ID`'s host, preferring IPv4 as the interface choice does.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("NCCL_COMM_ID host {host:?} does not resolve: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| Error::InvalidArgument(format!("NCCL_COMM_ID host {host:?} has no address")))
}

/// Splits `NCCL_COMM_ID`'s `<host>:<port>` (`[v6addr]:port` for IPv6 literals).
pub fn split_host_port(s: &str) -> Result<(&str, u16)> {
    let bad = |why: &str| {
        Error::InvalidArgument(format!(
            "NCCL_COMM_ID={s:?} is not <host>:<port> ({why}); e.g. NCCL_COMM_ID=10.0.0.1:29500"
        ))
    };
    let (host, port) = s.trim().rsplit_once(':').ok_or_else(|| bad("no ':'"))?;
    let host = match host.strip_prefix('[') {
        Some(h) => h.strip_suffix(']').ok_or_else(|| bad("unclosed '['"))?,
        None if host.contains(':') => return Err(bad("IPv6 addresses need brackets: [addr]:port")),
        None => host,
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 => Ok((host, p)),
        _ => Err(bad("the port must be 1..65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_parsing() {
        assert_eq!(split_host_port("10.0.0.1:29500"), Ok(("10.0.0.1", 29500)));
        assert_eq!(split_host_port(" node-3.cluster:80 "), Ok(("node-3.cluster", 80)));
        assert_eq!(split_host_port("[::1]:7"), Ok(("::1", 7)));
        for bad in ["10.0.0.1", "10.0.0.1:0", "10.0.0.1:70000", ":80", "::1:80", "[::1:80", "host:x"] {
            assert!(
                matches!(split_host_port(bad), Err(Error::InvalidArgument(m)) if m.contains("NCCL_COMM_ID")),
                "{bad}"
            );
        }
    }
}
