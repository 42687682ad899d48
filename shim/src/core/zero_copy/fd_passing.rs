//! Datagrams that carry a file descriptor (SCM_RIGHTS), on the service's socket: how a cuMem
//! allocation reaches another process. std has no stable API for ancillary data, hence libc.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;

/// Room for the control message of one descriptor.
const CONTROL_BYTES: usize = 64;

/// Sends `bytes` with `fd` to the socket named `name` in the abstract namespace.
pub fn send(
    socket: &UnixDatagram,
    name: &[u8],
    bytes: &[u8],
    fd: BorrowedFd<'_>,
) -> io::Result<()> {
    // SAFETY: plain data, every field the kernel reads is set below.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.len() + 1 > address.sun_path.len() {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // sun_path[0] stays 0: the abstract namespace.
    for (slot, &b) in address.sun_path[1..].iter_mut().zip(name) {
        *slot = b as libc::c_char;
    }
    let address_len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = [0u64; CONTROL_BYTES / 8];
    // SAFETY: plain data.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_name = (&raw mut address).cast();
    header.msg_namelen = address_len as libc::socklen_t;
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    // SAFETY: computes the space of one int's worth of data.
    header.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as _;
    // SAFETY: the header's control buffer holds one control message of one int.
    unsafe {
        let message = libc::CMSG_FIRSTHDR(&header);
        (*message).cmsg_level = libc::SOL_SOCKET;
        (*message).cmsg_type = libc::SCM_RIGHTS;
        (*message).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as _;
        libc::CMSG_DATA(message)
            .cast::<libc::c_int>()
            .write_unaligned(fd.as_raw_fd());
    }
    // SAFETY: a header of live buffers, on our socket.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &header, 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one datagram into `buffer`: its length, and the descriptor sent with it if any.
pub fn receive(socket: &UnixDatagram, buffer: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    let mut control = [0u64; CONTROL_BYTES / 8];
    // SAFETY: plain data.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    header.msg_controllen = CONTROL_BYTES as _;
    // SAFETY: a header of live buffers, on our socket; descriptors close on exec.
    let length = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) };
    if length < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: walks the control messages the kernel wrote into our buffer.
    unsafe {
        let mut message = libc::CMSG_FIRSTHDR(&header);
        while !message.is_null() {
            if (*message).cmsg_level == libc::SOL_SOCKET && (*message).cmsg_type == libc::SCM_RIGHTS
            {
                let count = ((*message).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / size_of::<libc::c_int>();
                let data = libc::CMSG_DATA(message).cast::<libc::c_int>();
                for i in 0..count {
                    // Ours now: the first is kept, any other closed.
                    let received = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                    if fd.is_none() {
                        fd = Some(received);
                    }
                }
            }
            message = libc::CMSG_NXTHDR(&header, message);
        }
    }
    Ok((length as usize, fd))
}
