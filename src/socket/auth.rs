//! Proof that the other end of a connection holds the unique id's secret. Pure code.
//!
//! Every bootstrap connection opens with a challenge/response in both directions:
//!
//! ```text
//! listener  -> connector  Challenge { listener nonce }
//! connector -> listener   Auth { magic, connector nonce, HMAC(secret, "connector" | both nonces) }
//! listener  -> connector  Proof { HMAC(secret, "listener" | both nonces) }
//! ```
//!
//! Neither the secret nor a proof that could be replayed crosses the wire: each proof covers a
//! fresh nonce chosen by the side that checks it, and the two roles sign different labels, so a
//! proof cannot be reflected back either. The magic travels in clear; it only names the job,
//! so that a rank given another job's id is told so instead of "authentication failed".
//! The net transport authenticates its own connections with the same functions.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a proof (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// Bytes of the secret a unique id carries.
pub const SECRET_LEN: usize = 32;

pub type Nonce = [u8; NONCE_LEN];
pub type Proof = [u8; MAC_LEN];

/// What both ends of a connection share: the id's magic (which job, in clear) and its secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub magic: u64,
    pub secret: Secret,
}

/// Which end of a connection computed a proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The end that connected.
    Connector,
    /// The end that accepted and sent the first challenge.
    Listener,
}

/// The shared secret of one communicator's bootstrap (and of its net transport).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u8; SECRET_LEN]);

impl std::fmt::Debug for Secret {
    /// Never prints the secret: ids end up in logs and panics.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A fresh secret from the kernel's random source.
    pub fn random() -> crate::error::Result<Secret> {
        Ok(Secret(random_bytes()?))
    }

    /// A secret every process computes alike from `parts` (the `NCCL_COMM_ID` mode).
    pub fn derive(parts: &[&[u8]]) -> Secret {
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
        Secret(h.finalize().into())
    }

    /// The proof `role` sends: an HMAC over its role and both nonces (the listener's first).
    pub fn proof(&self, role: Role, listener_nonce: &Nonce, connector_nonce: &Nonce) -> Proof {
        self.mac(role, listener_nonce, connector_nonce).finalize().into_bytes().into()
    }

    /// Checks, in constant time, a proof received from the end playing `role`.
    pub fn verify(&self, role: Role, listener_nonce: &Nonce, connector_nonce: &Nonce, proof: &Proof) -> bool {
        self.mac(role, listener_nonce, connector_nonce).verify_slice(proof).is_ok()
    }

    fn mac(&self, role: Role, listener_nonce: &Nonce, connector_nonce: &Nonce) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(match role {
            Role::Connector => b"ferronickel bootstrap connector",
            Role::Listener => b"ferronickel bootstrap listener\0",
        });
        m.update(listener_nonce);
        m.update(connector_nonce);
        m
    }
}

/// A fresh nonce; never reused, so a recorded proof is worthless.
pub fn nonce() -> crate::error::Result<Nonce> {
    random_bytes()
}

/// `N` bytes from getrandom. Failing is an error, not a weaker fallback: a guessable secret
/// would silently remove the protection.
pub fn random_bytes<const N: usize>() -> crate::error::Result<[u8; N]> {
    let mut b = [0u8; N];
    let mut filled = 0;
    while filled < N {
        // SAFETY: the range b[filled..] is valid for writes of N - filled bytes during the call.
        let n = unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), N - filled, 0) };
        match n {
            n if n > 0 => filled += n as usize,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => {
                return Err(crate::error::Error::System(format!(
                    "bootstrap: getrandom failed ({}); cannot make a secret",
                    std::io::Error::last_os_error()
                )))
            }
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_check_out_only_with_the_same_secret_role_and_nonces() {
        let s = Secret::random().unwrap();
        let (ln, cn) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(ln, cn, "nonces are random");
        let p = s.proof(Role::Connector, &ln, &cn);
        assert!(s.verify(Role::Connector, &ln, &cn, &p));
        assert!(!s.verify(Role::Listener, &ln, &cn, &p), "a proof cannot be reflected to the other role");
        assert!(!s.verify(Role::Connector, &cn, &ln, &p), "nonces are ordered");
        assert!(!s.verify(Role::Connector, &nonce().unwrap(), &cn, &p), "a fresh challenge defeats replay");
        assert!(!Secret::random().unwrap().verify(Role::Connector, &ln, &cn, &p), "another secret");
        let mut bad = p;
        bad[31] ^= 1;
        assert!(!s.verify(Role::Connector, &ln, &cn, &bad));
    }

    #[test]
    fn derived_secrets_agree_and_separate_their_parts() {
        assert_eq!(Secret::derive(&[b"a", b"bc"]), Secret::derive(&[b"a", b"bc"]));
        assert_ne!(Secret::derive(&[b"a", b"bc"]), Secret::derive(&[b"ab", b"c"]));
        assert_eq!(format!("{:?}", Secret([7; SECRET_LEN])), "Secret(..)");
    }
}
