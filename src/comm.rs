//! The communicator: what `ncclComm_t` points at (being written).

/// Opaque to C; `ncclComm_t` is a pointer to it.
#[allow(non_camel_case_types)]
pub struct ncclComm {
    _private: (),
}
