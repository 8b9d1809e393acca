//! ferronickel: a drop-in replacement for NVIDIA NCCL 2.28, built as `libnccl.so.2`.
//!
//! The C ABI lives in [`api`]; everything behind it is ordinary Rust: [`bootstrap`] (TCP
//! rendezvous), [`topo`] (rings), [`transport`] (connection FIFOs between GPUs), [`enqueue`]
//! (turning calls into kernel launches) and [`cuda`] (the driver, loaded at run time).

pub mod debug;
pub mod env;
pub mod error;
pub mod types;

pub mod bootstrap;
pub mod abi;
pub mod comm;
pub mod copy_engine;
pub mod cuda;
pub mod enqueue;
pub mod group;
pub mod hang_report;
pub mod topo;
pub mod transport;
pub mod tuner;
#[allow(non_snake_case, non_upper_case_globals)]
pub mod api;
