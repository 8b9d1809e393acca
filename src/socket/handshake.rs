//! The handshake every connection opens with (the frames of [`auth`]'s challenge/response):
//! the connector's side ([`FrameStream::open`]) and the listener's (a challenge at accept, then
//! the connector's proof checked and ours sent), which the [`Acceptor`](super::acceptor::Acceptor)
//! runs for every connection before anything else is read from it.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::auth::{self, Credentials, Nonce, Role};
use super::frame::{FrameStream, NetError};
use super::wire::{self, Msg, RefuseReason, MAX_CONTROL_BODY};

impl FrameStream {
    /// Connects and authenticates both ways (see [`auth`]): the listener's challenge, our proof,
    /// the listener's proof. `patient`: retry refused connections until `deadline`, for a
    /// listener that may not be up yet (the root of an `NCCL_COMM_ID` run, started by rank 0);
    /// otherwise a refusal is final (every rank's listener is up before the root sends the ring
    /// addresses, so a refusal means the peer is gone). A connection closed during the handshake is
    /// retried either way: a listener shedding a flood of silent connections may have evicted it.
    pub fn open(
        addr: SocketAddr,
        cred: &Credentials,
        deadline: Instant,
        patient: bool,
    ) -> std::result::Result<FrameStream, NetError> {
        let mut backoff = Duration::from_millis(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NetError::Timeout);
            }
            let r = TcpStream::connect_timeout(&addr, left).map_err(NetError::from).and_then(|s| {
                let mut s = FrameStream::new(s, Vec::new(), addr)?;
                s.handshake(cred, deadline).map(|()| s)
            });
            let retry = match &r {
                Err(NetError::Io(e)) if e.kind() == io::ErrorKind::ConnectionRefused => patient,
                Err(NetError::Io(e)) => e.kind() == io::ErrorKind::ConnectionReset,
                Err(NetError::Closed) => true,
                _ => false,
            };
            if !retry || Instant::now() + backoff >= deadline {
                return r;
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(100));
        }
    }

    /// The connector's side of the handshake of [`auth`].
    fn handshake(&mut self, cred: &Credentials, deadline: Instant) -> std::result::Result<(), NetError> {
        let peer = self.peer();
        let unexpected =
            |m: Msg| NetError::Refused(format!("the listener at {peer} sent {} during the handshake", m.kind_name()));
        let listener_nonce = match self.recv(MAX_CONTROL_BODY, deadline)? {
            Msg::Challenge { nonce } => nonce,
            other => return Err(unexpected(other)),
        };
        let nonce = auth::nonce().map_err(|e| NetError::Io(io::Error::other(e.to_string())))?;
        let proof = cred.secret.proof(Role::Connector, &listener_nonce, &nonce);
        self.send(&Msg::Auth { magic: cred.magic, nonce, proof }, deadline)?;
        match self.recv(MAX_CONTROL_BODY, deadline)? {
            Msg::Proven { proof } if cred.secret.verify(Role::Listener, &listener_nonce, &nonce, &proof) => Ok(()),
            Msg::Proven { .. } => Err(NetError::Refused(format!(
                "the listener at {peer} could not prove it holds the unique id: not the rank it claims to be"
            ))),
            Msg::Refused { text, .. } => Err(NetError::Refused(text)),
            other => Err(unexpected(other)),
        }
    }
}

/// Writes `bytes` to a fresh non-blocking socket in one go: small frames at the start of a
/// connection always fit in its empty send buffer, so a short write means the peer is gone.
fn write_now(stream: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    match (&*stream).write(bytes)? {
        n if n == bytes.len() => Ok(()),
        n => Err(io::Error::other(format!("only {n} of {} bytes could be written", bytes.len()))),
    }
}

/// Makes the socket non-blocking and sends it a fresh challenge.
pub(super) fn challenge(stream: &TcpStream) -> io::Result<Nonce> {
    stream.set_nonblocking(true)?;
    let nonce = auth::nonce().map_err(|e| io::Error::other(e.to_string()))?;
    write_now(stream, &wire::encode(&Msg::Challenge { nonce }))?;
    Ok(nonce)
}

/// Checks a connector's answer to our challenge and sends our own proof; a wrong magic or proof
/// gets a refusal that explains it (nothing secret in it) and ends the connection.
pub(super) fn check_proof(
    stream: &TcpStream,
    from: SocketAddr,
    cred: &Credentials,
    ours: Nonce,
    msg: Msg,
) -> std::result::Result<(), NetError> {
    let refuse = |text: String| {
        let _ = write_now(stream, &wire::encode(&Msg::Refused { reason: RefuseReason::Rejected, text: text.clone() }));
        Err(NetError::Refused(text))
    };
    match msg {
        Msg::Auth { magic, .. } if magic != cred.magic => refuse(format!(
            "{} presented a unique id whose magic does not match this listener's; \
             every rank must use the id from the same ncclGetUniqueId call",
            from
        )),
        Msg::Auth { nonce, proof, .. } if cred.secret.verify(Role::Connector, &ours, &nonce, &proof) => {
            let proof = cred.secret.proof(Role::Listener, &ours, &nonce);
            Ok(write_now(stream, &wire::encode(&Msg::Proven { proof }))?)
        }
        Msg::Auth { .. } => refuse(format!(
            "{} could not prove it holds the unique id (right magic, wrong secret: a forged or corrupted id)",
            from
        )),
        other => Err(NetError::Refused(format!("{} sent {} instead of authenticating", from, other.kind_name()))),
    }
}
