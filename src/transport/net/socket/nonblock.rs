//! Non-blocking socket calls that never raise SIGPIPE and never wait.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Runs one non-blocking socket call again while it is interrupted: `Ok(None)` when it would
/// block, else the byte count it returned.
pub(super) fn nonblocking(mut call: impl FnMut() -> isize) -> io::Result<Option<usize>> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// Sends what the socket takes now: `Ok(None)` if it takes nothing.
pub(super) fn send_some(fd: RawFd, buf: &[u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for reads of buf.len() bytes; MSG_NOSIGNAL turns a dead peer into
    // EPIPE instead of a signal that would kill a C host program.
    nonblocking(|| unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) })
}

/// As [`send_some`], for several buffers in one call (`sendmsg`).
///
/// # Safety
/// Every iovec must describe memory valid for reads during the call.
pub(super) unsafe fn send_iov(fd: RawFd, iov: &[libc::iovec]) -> io::Result<Option<usize>> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: the caller vouches for the iovecs; flags as in send_some.
    nonblocking(|| unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) })
}

/// Receives what is there now: `Ok(None)` if nothing is, `Ok(Some(0))` at end of stream.
pub(super) fn recv_some(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    nonblocking(|| unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) })
}

/// As [`recv_some`], into several buffers in order (`recvmsg`).
///
/// # Safety
/// Every iovec must describe memory valid for writes during the call.
pub(super) unsafe fn recv_iov(fd: RawFd, iov: &mut [libc::iovec]) -> io::Result<Option<usize>> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: the caller vouches for the iovecs.
    nonblocking(|| unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) })
}

/// Copies what is there now without taking it off the socket (`MSG_PEEK`): as [`recv_some`].
pub(super) fn peek_some(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    nonblocking(|| unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_PEEK) })
}

/// Puts a TCP socket's receiving side in delayed-ACK mode (Linux's "pingpong" mode, which its
/// delayed-ACK timer ends): a read that empties the socket then acknowledges a small segment only
/// every second time, instead of sending an ACK of its own each time (docs/NET.md, "ACKs off the
/// step's path"). Failure changes nothing we rely on, so it is ignored.
pub(super) fn delay_acks(fd: RawFd) {
    let zero: libc::c_int = 0;
    // SAFETY: the option value points to an int of the length given, valid for the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&zero as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

pub(super) fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    // SAFETY: fds is a valid array of fds.len() pollfd structs for the duration of the call.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout.as_millis().min(i32::MAX as u128) as i32)
    };
}
