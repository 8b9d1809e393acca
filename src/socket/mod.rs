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

pub mod acceptor;
pub mod addr;
pub mod auth;
pub mod frame;
pub mod handshake;
pub mod iface;
pub mod progress;
pub mod wire;

#[cfg(test)]
mod tests;
