//! Sockets and their authentication: the layer the bootstrap and the NET transport both stand on
//! (docs/ARCHITECTURE.md, "Layers").
//!
//! - [`iface`]: which interfaces sockets use (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`).
//! - [`addr`]: listeners, and `NCCL_COMM_ID`'s address parsed and resolved.
//! - [`auth`]: the proof that the other end holds the unique id's secret (pure).
//! - [`wire`]: the frames framed connections carry (pure).
//! - [`frame`]: framed streams over non-blocking sockets, every wait under a deadline.
//! - [`handshake`]: the challenge/response every framed connection opens with, both sides.
//! - [`acceptor`]: a listener that screens strangers without letting them delay anyone.
//! - [`progress`]: the INFO lines of long waits, naming whom they wait for.
//!
//! Every TCP socket of the library, the bootstrap's and the Socket net's, takes NCCL's buffer
//! settings ([`size_buffers`]).

pub mod acceptor;
pub mod addr;
pub mod auth;
pub mod frame;
pub mod handshake;
pub mod iface;
pub mod progress;
pub mod wire;

crate::int_param!(
    /// NCCL_SOCKET_SNDBUF: the send buffer of every TCP socket, in bytes (`SO_SNDBUF`, which
    /// Linux doubles and caps at `net.core.wmem_max`); unset or not above 0, the kernel's own.
    socket_sndbuf, "NCCL_SOCKET_SNDBUF", -1
);
crate::int_param!(
    /// NCCL_SOCKET_RCVBUF: the receive buffer of every TCP socket, in bytes (`SO_RCVBUF`, capped
    /// at `net.core.rmem_max`); unset or not above 0, the kernel's own.
    socket_rcvbuf, "NCCL_SOCKET_RCVBUF", -1
);

/// Sets a socket's buffers from NCCL_SOCKET_SNDBUF and NCCL_SOCKET_RCVBUF where they are set, as
/// NCCL sets each of its sockets'. Called before a socket connects or listens where the code
/// makes it (the receive window's scale is fixed at the handshake; accepted sockets inherit
/// their listener's buffers).
pub fn size_buffers(sock: socket2::SockRef<'_>) -> std::io::Result<()> {
    set_buffers(sock, socket_sndbuf(), socket_rcvbuf())
}

fn set_buffers(sock: socket2::SockRef<'_>, send: i64, recv: i64) -> std::io::Result<()> {
    let bytes = |v: i64| usize::try_from(v).ok().filter(|&b| b > 0 && b <= i32::MAX as usize);
    if let Some(b) = bytes(send) {
        sock.set_send_buffer_size(b)?;
    }
    if let Some(b) = bytes(recv) {
        sock.set_recv_buffer_size(b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
