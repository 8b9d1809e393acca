//! The unexpected-message queue behind point-to-point receives. Pure code.
//!
//! Each p2p message travels on its own connection, so messages can be accepted out of order;
//! the sender numbers them per (peer, tag) and the mailbox hands them out in that order.

use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Default)]
pub struct Mailbox {
    /// The sequence number the next `take` for (peer, tag) must return.
    next: HashMap<(usize, u32), u64>,
    held: HashMap<(usize, u32), BTreeMap<u64, Vec<u8>>>,
}

impl Mailbox {
    /// Stores a message; `false` if that (peer, tag, seq) was already stored or taken.
    pub fn push(&mut self, peer: usize, tag: u32, seq: u64, payload: Vec<u8>) -> bool {
        if seq < self.next.get(&(peer, tag)).copied().unwrap_or(0) {
            return false;
        }
        let q = self.held.entry((peer, tag)).or_default();
        if q.contains_key(&seq) {
            return false;
        }
        q.insert(seq, payload);
        true
    }

    /// The next message in order from `peer` with `tag`, if it has arrived.
    pub fn take(&mut self, peer: usize, tag: u32) -> Option<Vec<u8>> {
        let key = (peer, tag);
        let want = self.next.get(&key).copied().unwrap_or(0);
        let q = self.held.get_mut(&key)?;
        let payload = q.remove(&want)?;
        if q.is_empty() {
            self.held.remove(&key);
        }
        self.next.insert(key, want + 1);
        Some(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_per_peer_and_tag() {
        let mut m = Mailbox::default();
        assert_eq!(m.take(1, 7), None);
        assert!(m.push(1, 7, 1, b"second".to_vec()));
        assert_eq!(m.take(1, 7), None, "seq 0 has not arrived");
        assert!(m.push(1, 9, 0, b"other tag".to_vec()));
        assert!(m.push(2, 7, 0, b"other peer".to_vec()));
        assert!(m.push(1, 7, 0, b"first".to_vec()));
        assert_eq!(m.take(1, 7).as_deref(), Some(&b"first"[..]));
        assert_eq!(m.take(1, 7).as_deref(), Some(&b"second"[..]));
        assert_eq!(m.take(1, 7), None);
        assert_eq!(m.take(2, 7).as_deref(), Some(&b"other peer"[..]));
        assert_eq!(m.take(1, 9).as_deref(), Some(&b"other tag"[..]));
        assert!(m.held.is_empty(), "nothing left behind");
    }

    #[test]
    fn duplicates_and_stale_messages_are_refused() {
        let mut m = Mailbox::default();
        assert!(m.push(0, 0, 0, vec![1]));
        assert!(!m.push(0, 0, 0, vec![2]), "duplicate while held");
        assert_eq!(m.take(0, 0), Some(vec![1]));
        assert!(!m.push(0, 0, 0, vec![3]), "already taken");
        assert!(m.push(0, 0, 1, vec![4]));
        assert_eq!(m.take(0, 0), Some(vec![4]));
    }
}
