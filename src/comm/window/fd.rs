//! Taking another process's file descriptor: `pidfd_getfd` where the kernel lets us (same user,
//! ptrace permission), else the owner hands it over a Unix socket in the abstract namespace with
//! SCM_RIGHTS. Both sides of the fallback are driven by the window registration's collective
//! steps (docs/ARCHITECTURE.md, "Windows and the device communicator").

use crate::error::{Error, Result};
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// What taking a descriptor with `pidfd_getfd` gave.
pub enum Taken {
    Fd(OwnedFd),
    /// The kernel refused (no ptrace permission, a kernel before 5.6 without the calls, a process
    /// this PID namespace cannot see): ask the owner over its socket instead.
    Refused,
}

/// Errors of pidfd_open / pidfd_getfd that the socket hand-over gets around.
fn refused(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EPERM | libc::EACCES | libc::ENOSYS | libc::ESRCH))
}

/// Duplicates descriptor `fd` of process `pid` into ours.
pub fn take(pid: u32, fd: i32) -> Result<Taken> {
    if pid == std::process::id() {
        // SAFETY: dup of a descriptor this process owns (kept open by its owner until the
        // registration's last step); the result is a fresh descriptor.
        let d = unsafe { libc::dup(fd) };
        if d < 0 {
            return Err(Error::System(format!("dup of our own descriptor {fd}: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: fresh descriptor from dup.
        return Ok(Taken::Fd(unsafe { OwnedFd::from_raw_fd(d) }));
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        let err = std::io::Error::last_os_error();
        if refused(&err) {
            return Ok(Taken::Refused);
        }
        return Err(Error::System(format!("pidfd_open of process {pid}: {err}")));
    }
    // SAFETY: fresh descriptor from pidfd_open.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd takes a pidfd, the target's descriptor number and flags.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got >= 0 {
        // SAFETY: fresh descriptor from pidfd_getfd.
        return Ok(Taken::Fd(unsafe { OwnedFd::from_raw_fd(got as i32) }));
    }
    let err = std::io::Error::last_os_error();
    if refused(&err) {
        return Ok(Taken::Refused);
    }
    Err(Error::System(format!("pidfd_getfd of descriptor {fd} of process {pid}: {err}")))
}

/// The abstract socket name an owner listens on for one registration.
pub fn socket_name(comm_magic: u64, seq: u64, owner_rank: usize) -> String {
    format!("ferronickel-win-{comm_magic:016x}-{seq}-{owner_rank}")
}

/// An owner's listener for peers that could not take its descriptor themselves.
pub struct Owner {
    listener: UnixListener,
}

impl Owner {
    pub fn listen(name: &str) -> Result<Owner> {
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)
            .map_err(|e| Error::System(format!("binding the abstract Unix socket {name}: {e}")))?;
        listener.set_nonblocking(true)?;
        Ok(Owner { listener })
    }

    /// Sends `fd` to each of `count` peers as they connect, waiting until `deadline`.
    pub fn serve(&self, fd: &OwnedFd, count: usize, deadline: Instant, name: &str) -> Result<()> {
        let mut served = 0;
        while served < count {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    send_fd(&stream, fd)?;
                    served += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(Error::System(format!(
                            "{served} of {count} peers took our window's descriptor from socket {name} before the \
                             deadline"
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(Error::System(format!("accepting on socket {name}: {e}"))),
            }
        }
        Ok(())
    }
}

/// Connects to an owner's socket (answered later by [`Owner::serve`]; the backlog holds us).
pub fn connect(name: &str) -> Result<UnixStream> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    UnixStream::connect_addr(&addr).map_err(|e| Error::System(format!("connecting to socket {name}: {e}")))
}

/// `f` with a `msghdr` for a one-byte message (`byte`) with room for one descriptor, whose
/// buffers live on this frame for the call.
fn with_fd_msg<R>(byte: u8, f: impl FnOnce(&mut libc::msghdr) -> R) -> R {
    let mut byte = [byte];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr() as *mut libc::c_void, iov_len: 1 };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: a zeroed msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    f(&mut msg)
}

fn send_fd(stream: &UnixStream, fd: &OwnedFd) -> Result<()> {
    let n = with_fd_msg(1, |msg| {
        // SAFETY: msg's control buffer holds one cmsg of an int (see with_fd_msg).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, fd.as_raw_fd());
        }
        // SAFETY: msg points at live buffers for the duration of the call.
        unsafe { libc::sendmsg(stream.as_raw_fd(), msg, libc::MSG_NOSIGNAL) }
    });
    if n != 1 {
        return Err(Error::System(format!("sending a descriptor: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

/// Receives the descriptor an owner sends on `stream`, waiting until `deadline`.
pub fn recv_fd(stream: &UnixStream, deadline: Instant, name: &str) -> Result<OwnedFd> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left))?;
    with_fd_msg(0, |msg| {
        // SAFETY: msg points at live buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), msg, libc::MSG_CMSG_CLOEXEC) };
        if n != 1 {
            return Err(Error::System(format!(
                "no descriptor from socket {name} before the deadline: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: recvmsg filled msg's control buffer; CMSG_FIRSTHDR checks its length.
        let c = unsafe { libc::CMSG_FIRSTHDR(msg) };
        // SAFETY: c is checked non-NULL before reading its header.
        if c.is_null() || unsafe { (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS } {
            return Err(Error::System(format!("socket {name} sent a message without a descriptor")));
        }
        // SAFETY: an SCM_RIGHTS cmsg carries at least one int.
        let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32) };
        // SAFETY: the kernel installed this descriptor in our table for us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// A file with known contents, as an owned descriptor.
    fn file_with(text: &[u8]) -> OwnedFd {
        let mut f = memfd();
        f.write_all(text).unwrap();
        f.into()
    }

    fn memfd() -> std::fs::File {
        let name = std::ffi::CString::new("ferronickel-fd-test").unwrap();
        // SAFETY: memfd_create with a valid name; the result is a fresh descriptor or -1.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: fresh descriptor.
        unsafe { std::fs::File::from_raw_fd(fd) }
    }

    /// With pread: copies of one descriptor share its offset.
    fn contents(fd: OwnedFd) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 64];
        let n = std::fs::File::from(fd).read_at(&mut buf, 0).unwrap();
        buf[..n].to_vec()
    }

    #[test]
    fn our_own_descriptor_is_duplicated() {
        let fd = file_with(b"own");
        let Taken::Fd(got) = take(std::process::id(), fd.as_fd().as_raw_fd()).unwrap() else {
            panic!("dup of our own descriptor was refused")
        };
        assert_ne!(got.as_raw_fd(), fd.as_raw_fd());
        assert_eq!(contents(got), b"own");
    }

    #[test]
    fn another_process_descriptor_is_taken_or_refused_never_an_error() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("spawn sleep");
        let taken = take(child.id(), 0);
        child.kill().ok();
        child.wait().ok();
        assert!(matches!(taken, Ok(Taken::Fd(_)) | Ok(Taken::Refused)), "pidfd_getfd gave an error");
    }

    #[test]
    fn descriptors_travel_over_the_socket_to_each_peer_that_connects() {
        let name = socket_name(0x5eed, std::process::id() as u64, 3);
        let owner = Owner::listen(&name).unwrap();
        // Both peers connect before the owner serves: the backlog holds them.
        let (a, b) = (connect(&name).unwrap(), connect(&name).unwrap());
        let deadline = Instant::now() + Duration::from_secs(5);
        owner.serve(&file_with(b"window"), 2, deadline, &name).unwrap();
        assert_eq!(contents(recv_fd(&a, deadline, &name).unwrap()), b"window");
        assert_eq!(contents(recv_fd(&b, deadline, &name).unwrap()), b"window");
        // Nobody connects: the owner gives up at the deadline, naming the socket.
        let e = owner.serve(&file_with(b"x"), 1, Instant::now() + Duration::from_millis(50), &name).unwrap_err();
        assert!(e.to_string().contains("0 of 1 peers") && e.to_string().contains(&name), "{e}");
    }
}
