//! Transports: how bytes move between two ranks' GPUs. Only P2P (direct GPU memory access,
//! within a process or through CUDA IPC) exists so far.

pub mod net;
pub mod p2p;
