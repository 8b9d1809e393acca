//! One direction of one connection's FIFOs, as the kernels address them (`slotStride` in
//! `kernels/prims.cuh`): `FN_NSTEPS` slots of each protocol, LL128's first so that its lines stay
//! 128-byte aligned, then LL's, then Simple's. The P2P and SHM arenas and the NET host blocks all
//! lay their FIFOs out this way.

use crate::abi::{FN_LL128_SLOT_LINES, FN_LL_SLOT_LINES, FN_NSTEPS, FN_NUM_PROTOS, FN_PROTO_LL, FN_PROTO_LL128};

/// Bytes between consecutive slots of `proto`'s FIFO; `slot_bytes` is a Simple slot
/// (NCCL_BUFFSIZE / `FN_NSTEPS`), LL and LL128 slots have fixed sizes.
pub fn stride(proto: u32, slot_bytes: usize) -> usize {
    match proto {
        FN_PROTO_LL => FN_LL_SLOT_LINES as usize * 16,
        FN_PROTO_LL128 => FN_LL128_SLOT_LINES as usize * 128,
        _ => slot_bytes,
    }
}

/// Offset of `proto`'s FIFO among one direction's FIFOs.
pub fn offset(proto: u32, slot_bytes: usize) -> usize {
    let n = FN_NSTEPS as usize;
    match proto {
        FN_PROTO_LL128 => 0,
        FN_PROTO_LL => n * stride(FN_PROTO_LL128, slot_bytes),
        _ => n * (stride(FN_PROTO_LL128, slot_bytes) + stride(FN_PROTO_LL, slot_bytes)),
    }
}

/// Bytes of one direction's FIFOs, every protocol.
pub fn bytes(slot_bytes: usize) -> usize {
    FN_NSTEPS as usize * (0..FN_NUM_PROTOS).map(|p| stride(p, slot_bytes)).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::FN_PROTO_SIMPLE;

    #[test]
    fn protocols_follow_each_other_aligned() {
        let slot = 1 << 16;
        let n = FN_NSTEPS as usize;
        assert_eq!(offset(FN_PROTO_LL128, slot), 0);
        assert_eq!(offset(FN_PROTO_LL, slot), n * stride(FN_PROTO_LL128, slot));
        assert_eq!(offset(FN_PROTO_SIMPLE, slot) + n * slot, bytes(slot));
        assert!([FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE].iter().all(|&p| offset(p, slot).is_multiple_of(128)));
    }
}
