//! The process's zero-copy service: one Unix datagram socket, named in the abstract namespace
//! after the process's identity (set-up tells every rank its peers' identities), and a thread
//! that takes every message for every communicator of this process and hands it to its member
//! (`ZeroCopy`). The thread maps what peers offer, away from the callers' threads: an offer is
//! answered even while this process's program is busy elsewhere, so a caller waiting for its
//! peers' answers never waits for its peers' next call. Messages go out from a thread of their
//! own (`post`): a send waits while the peer's queue is full (a few datagrams, the system's
//! `net.unix.max_dgram_qlen`), and neither the serving thread (which must keep draining this
//! process's queue) nor a caller holding its communicator's table may wait on a peer that waits
//! on them. Between messages, every SWEEP_EVERY, the thread has each member retire what its
//! program freed (`ZeroCopy::retire_freed`).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use super::fd_passing;
use super::wire::{MESSAGE_BYTES, Message};
use super::{SWEEP_EVERY, ZeroCopy};

/// A message on its way, and the member to tell if it cannot go.
pub struct Outgoing {
    pub process: u64,
    pub message: Message,
    /// Shared by the messages of one offer to every peer.
    pub fd: Option<Arc<OwnedFd>>,
    pub sender: Weak<ZeroCopy>,
}

pub struct Service {
    socket: UnixDatagram,
    outbox: Sender<Outgoing>,
    members: Mutex<HashMap<u64, Weak<ZeroCopy>>>,
}

/// The abstract socket name of the process whose identity is `process`.
fn name(process: u64) -> String {
    format!("ncclshim-zero-copy-{process:016x}")
}

impl Service {
    /// The service of this process, started on first use; `Err` if its socket cannot be had
    /// (or in a forked child, whose parent's thread did not come along).
    pub fn of_process(process: u64) -> Result<Arc<Service>, String> {
        static SERVICE: OnceLock<Result<(u32, Arc<Service>), String>> = OnceLock::new();
        let pid = std::process::id();
        match SERVICE.get_or_init(|| Service::start(process).map(|s| (pid, s))) {
            Ok((started_in, service)) if *started_in == pid => Ok(service.clone()),
            Ok(_) => Err("a forked child has no zero-copy service".into()),
            Err(e) => Err(e.clone()),
        }
    }

    /// A service on the socket of `process`, its thread started.
    pub fn start(process: u64) -> Result<Arc<Service>, String> {
        let address = SocketAddr::from_abstract_name(name(process).as_bytes())
            .map_err(|e| format!("zero-copy socket name: {e}"))?;
        let socket =
            UnixDatagram::bind_addr(&address).map_err(|e| format!("zero-copy socket: {e}"))?;
        // The serving thread's waits for a message end in time for its sweeps.
        socket
            .set_read_timeout(Some(SWEEP_EVERY))
            .map_err(|e| format!("zero-copy socket: {e}"))?;
        let (outbox, outgoing) = mpsc::channel::<Outgoing>();
        let service = Arc::new(Service {
            socket,
            outbox,
            members: Mutex::new(HashMap::new()),
        });
        let serving = service.clone();
        std::thread::Builder::new()
            .name("ncclshim-zero-copy".into())
            .spawn(move || serving.serve())
            .map_err(|e| format!("zero-copy thread: {e}"))?;
        let sending = service.clone();
        std::thread::Builder::new()
            .name("ncclshim-zc-send".into())
            .spawn(move || outgoing.into_iter().for_each(|o| sending.deliver(o)))
            .map_err(|e| format!("zero-copy thread: {e}"))?;
        Ok(service)
    }

    /// Messages for communicator `comm` go to `member` from now on.
    pub fn join(&self, comm: u64, member: &Arc<ZeroCopy>) {
        self.lock().insert(comm, Arc::downgrade(member));
    }

    pub fn leave(&self, comm: u64) {
        self.lock().remove(&comm);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Weak<ZeroCopy>>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends a message soon, on the sending thread; if it cannot go, its sender gives up.
    pub fn post(&self, outgoing: Outgoing) {
        let posted = self.outbox.send(outgoing);
        // The thread is gone (it never ends by itself): as a peer that cannot be reached.
        if let Err(unsent) = posted
            && let Some(member) = unsent.0.sender.upgrade()
        {
            member.give_up("its messages cannot be sent");
            let_go(member);
        }
    }

    /// Sends `outgoing` (the receiver gets its own descriptor of the same file, if any), waiting
    /// while the peer's queue is full.
    fn deliver(&self, outgoing: Outgoing) {
        let Outgoing {
            process,
            message,
            fd,
            sender,
        } = outgoing;
        let sent = again_if_interrupted(|| match &fd {
            None => SocketAddr::from_abstract_name(name(process).as_bytes()).and_then(|address| {
                self.socket
                    .send_to_addr(&message.encode(), &address)
                    .map(|_| ())
            }),
            Some(fd) => fd_passing::send(
                &self.socket,
                name(process).as_bytes(),
                &message.encode(),
                fd.as_fd(),
            ),
        });
        if let Err(e) = sent
            && let Some(member) = sender.upgrade()
        {
            member.unreachable(process, &e);
            let_go(member);
        }
    }

    fn serve(self: Arc<Self>) {
        // Mapping a peer's memory must not be refused because this process's program is
        // capturing a CUDA graph on another thread.
        let _relaxed = super::super::cuda::RelaxedCapture::where_driver();
        let mut buffer = [0u8; MESSAGE_BYTES + 1];
        let mut swept = Instant::now();
        loop {
            let received = fd_passing::receive(&self.socket, &mut buffer);
            if swept.elapsed() >= SWEEP_EVERY {
                self.sweep();
                swept = Instant::now();
            }
            let Ok((length, fd)) = received else {
                continue;
            };
            let Some(message) = Message::decode(&buffer[..length]) else {
                continue;
            };
            let member = self.lock().get(&message.comm).and_then(Weak::upgrade);
            if let Some(member) = member {
                // A panic in one message must not end the service for every communicator.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    member.receive(&self, message, fd)
                }));
                let_go(member);
            }
        }
    }

    /// Has every member retire the allocations its program freed.
    fn sweep(&self) {
        let members: Vec<Weak<ZeroCopy>> = self.lock().values().cloned().collect();
        for member in members.iter().filter_map(Weak::upgrade) {
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| member.retire_freed()));
            let_go(member);
        }
    }
}

/// Lets go of the service's threads' hold on `member`; if its communicator went meanwhile, it
/// is dropped on the releasing thread: dropping it closes mappings, which waits for the GPU,
/// and these threads must keep answering and sending.
fn let_go(member: Arc<ZeroCopy>) {
    if let Some(last) = Arc::into_inner(member)
        && let Err(last) = super::super::cuda::release_later(last)
    {
        drop(last);
    }
}

/// `send` again while a signal cuts it short (EINTR, as a send waiting on a full queue may be:
/// a handler installed without SA_RESTART, as Python's are), so that only a peer that cannot
/// be reached turns zero-copy off.
fn again_if_interrupted(mut send: impl FnMut() -> std::io::Result<()>) -> std::io::Result<()> {
    loop {
        match send() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            sent => return sent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_cut_short_by_a_signal_goes_again() {
        let mut tries = 0;
        let sent = again_if_interrupted(|| {
            tries += 1;
            match tries {
                1 | 2 => Err(std::io::Error::from(std::io::ErrorKind::Interrupted)),
                _ => Ok(()),
            }
        });
        assert!(sent.is_ok() && tries == 3);
        let refused = again_if_interrupted(|| {
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        });
        assert_eq!(
            refused.unwrap_err().kind(),
            std::io::ErrorKind::ConnectionRefused
        );
    }
}
