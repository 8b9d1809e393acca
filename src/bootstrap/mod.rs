//! TCP bootstrap: the unique id, the root rendezvous and the ring of peers (being written).
