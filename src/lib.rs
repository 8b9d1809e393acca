//! ferronickel: a drop-in replacement for NVIDIA NCCL 2.28, built as `libnccl.so.2`.
//!
//! The C ABI lives in [`api`]; everything behind it is ordinary Rust: [`bootstrap`] (TCP
//! rendezvous), [`topo`] (rings), [`transport`] (connection FIFOs between GPUs), [`plan`]
//! (turning a group's tasks into kernel launches or copies, priced by the [`tuner`]), [`comm`]
//! (the communicator and the executor that runs plans) and [`cuda`] (the driver, loaded at run
//! time). The layers and what each may import are in docs/ARCHITECTURE.md; `tests/layers.rs`
//! enforces them.

pub mod debug;
pub mod env;
pub mod error;
pub mod exit;
pub mod param;
pub mod types;

pub mod abi;
pub mod affinity;
#[allow(non_snake_case, non_upper_case_globals)]
pub mod api;
pub mod bootstrap;
pub mod comm;
pub mod cuda;
pub mod group;
pub mod hang_report;
pub mod plan;
pub mod plugin;
pub mod socket;
pub mod task;
pub mod topo;
pub mod transport;
pub mod tuner;
