//! Batched datagram I/O (`recvmmsg`/`sendmmsg`) for metadata traffic.
//!
//! A zero-byte Get is one small datagram each way, and its cost is almost
//! all kernel work per system call and per wake-up, not per byte. Under
//! load, several requests wait in a metadata node's socket at once (and
//! several replies in a busy client's): taking them in one call and
//! answering in one call spreads that fixed cost over the batch.

use std::io;
use std::net::{Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

/// Datagrams taken or sent per system call at most.
pub const BATCH: usize = 16;

/// One datagram received by [`RecvBatch::recv`].
#[derive(Clone, Copy, Debug)]
pub struct Received {
    /// Its length in the slot's buffer.
    pub len: usize,
    /// Its sender.
    pub from: SocketAddr,
    /// The address it was sent to, when the socket reports it (IPv6 with
    /// `IPV6_RECVPKTINFO`).
    pub to: Option<Ipv6Addr>,
}

/// Receive buffers for up to [`BATCH`] datagrams of up to `slot_len`
/// bytes each, kept across calls.
pub struct RecvBatch {
    slot_len: usize,
    bufs: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    // u64s keep each control buffer aligned for cmsghdr.
    controls: Vec<[u64; 16]>,
    got: Vec<Received>,
}

impl RecvBatch {
    /// Buffers for [`BATCH`] datagrams of `slot_len` bytes.
    pub fn new(slot_len: usize) -> RecvBatch {
        RecvBatch {
            slot_len,
            bufs: vec![0u8; slot_len * BATCH],
            // SAFETY: all-zero bytes are a valid sockaddr_storage.
            names: vec![unsafe { std::mem::zeroed() }; BATCH],
            controls: vec![[0u64; 16]; BATCH],
            got: Vec::with_capacity(BATCH),
        }
    }

    /// Receives at least one datagram (waiting as the socket's timeout and
    /// blocking mode say) and whatever else is already queued, up to
    /// [`BATCH`]; returns how many.
    pub fn recv(&mut self, sock: &impl AsRawFd) -> io::Result<usize> {
        let mut iovs: Vec<libc::iovec> = self
            .bufs
            .chunks_mut(self.slot_len)
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = (0..BATCH)
            .map(|i| {
                // SAFETY: all-zero bytes are a valid mmsghdr.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = std::ptr::addr_of_mut!(self.names[i]).cast();
                h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
                h.msg_hdr.msg_iov = &mut iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h.msg_hdr.msg_control = self.controls[i].as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = std::mem::size_of::<[u64; 16]>() as _;
                h
            })
            .collect();
        // SAFETY: every header points at live buffers of the lengths given
        // next to them, for the duration of the call.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                BATCH as _,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        self.got.clear();
        for h in &hdrs[..n as usize] {
            // SAFETY: the name buffer was filled by recvmmsg for this header.
            let from = socket_address(unsafe { &*h.msg_hdr.msg_name.cast() });
            let Some(from) = from else { continue };
            self.got.push(Received {
                len: (h.msg_len as usize).min(self.slot_len),
                from,
                to: destination(&h.msg_hdr),
            });
        }
        Ok(self.got.len())
    }

    /// The `i`th datagram of the last [`RecvBatch::recv`] and its bytes.
    pub fn get(&self, i: usize) -> Option<(Received, &[u8])> {
        let r = *self.got.get(i)?;
        let start = i * self.slot_len;
        Some((r, &self.bufs[start..start + r.len]))
    }
}

/// Sends every datagram of `out` (bytes, destination), [`BATCH`] per call.
/// A datagram the kernel refuses (an unreachable destination, say) is
/// skipped: datagrams are best effort and the protocol retries.
pub fn send_batch(sock: &impl AsRawFd, out: &[(Vec<u8>, SocketAddr)]) {
    for chunk in out.chunks(BATCH) {
        let mut names: Vec<(libc::sockaddr_storage, libc::socklen_t)> =
            chunk.iter().map(|(_, to)| raw_address(to)).collect();
        let mut iovs: Vec<libc::iovec> = chunk
            .iter()
            .map(|(b, _)| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = (0..chunk.len())
            .map(|i| {
                // SAFETY: all-zero bytes are a valid mmsghdr.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = std::ptr::addr_of_mut!(names[i].0).cast();
                h.msg_hdr.msg_namelen = names[i].1;
                h.msg_hdr.msg_iov = &mut iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        let mut sent = 0;
        // The datagram already waited for room once (see `writable`).
        let mut waited = usize::MAX;
        while sent < hdrs.len() {
            // SAFETY: the headers point at live buffers and addresses of
            // the lengths given next to them; the kernel only reads them.
            let n = unsafe {
                libc::sendmmsg(
                    sock.as_raw_fd(),
                    hdrs[sent..].as_mut_ptr(),
                    (hdrs.len() - sent) as _,
                    0,
                )
            };
            if n < 0 && waited != sent && would_block() {
                waited = sent;
                if writable(sock) {
                    continue; // a non-blocking socket's buffer was full; it has room now
                }
            }
            // An error concerns the first datagram not sent: skip it.
            sent += if n <= 0 { 1 } else { n as usize };
        }
    }
}

/// Whether the last system call failed because a non-blocking socket
/// had no room (or nothing to give).
fn would_block() -> bool {
    io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
}

/// Waits up to [`SEND_WAIT_MS`] until `sock` can take a datagram: a
/// non-blocking socket (as metadata nodes use) then behaves like the
/// blocking one it replaced, instead of dropping answers when its send
/// buffer is briefly full. `false` when it still cannot.
fn writable(sock: &impl AsRawFd) -> bool {
    let mut fd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one initialised pollfd, alive for the call.
    let r = unsafe { libc::poll(&mut fd, 1, SEND_WAIT_MS) };
    r > 0 && fd.revents & libc::POLLOUT != 0
}

/// How long a send waits for room in a full socket buffer, in ms.
const SEND_WAIT_MS: libc::c_int = 10;

/// The destination address in a received header's IPV6_PKTINFO message.
fn destination(hdr: &libc::msghdr) -> Option<Ipv6Addr> {
    let mut to = None;
    // SAFETY: `hdr` was filled by the kernel; the CMSG macros walk the
    // control bytes it reports, and the data of an IPV6_PKTINFO message is
    // an in6_pktinfo (read unaligned, as control data need not be).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IPV6 && (*c).cmsg_type == libc::IPV6_PKTINFO {
                let info: libc::in6_pktinfo = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                to = Some(Ipv6Addr::from(info.ipi6_addr.s6_addr));
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    to
}

/// The socket address in a `sockaddr_storage` filled by the kernel.
pub(crate) fn socket_address(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match s.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: &libc::sockaddr_in = unsafe { &*std::ptr::addr_of!(*s).cast() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: &libc::sockaddr_in6 = unsafe { &*std::ptr::addr_of!(*s).cast() };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A socket address as the kernel takes it.
fn raw_address(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sin: &mut libc::sockaddr_in = unsafe { &mut *std::ptr::addr_of_mut!(s).cast() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let sin6: &mut libc::sockaddr_in6 = unsafe { &mut *std::ptr::addr_of_mut!(s).cast() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_goes_out_and_comes_back_whole_with_senders() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = b.local_addr().unwrap();
        let out: Vec<(Vec<u8>, SocketAddr)> =
            (0..20u8).map(|i| (vec![i; i as usize + 1], to)).collect();
        send_batch(&a, &out);
        let mut batch = RecvBatch::new(64);
        let mut seen = Vec::new();
        while seen.len() < 20 {
            let n = batch.recv(&b).unwrap();
            assert!((1..=BATCH).contains(&n));
            for i in 0..n {
                let (r, bytes) = batch.get(i).unwrap();
                assert_eq!(r.from, a.local_addr().unwrap());
                seen.push(bytes.to_vec());
            }
        }
        for (i, d) in seen.iter().enumerate() {
            assert_eq!(d, &vec![i as u8; i + 1]);
        }
    }

    #[test]
    fn ipv6_datagrams_carry_their_destination() {
        let Ok(b) = std::net::UdpSocket::bind("[::1]:0") else {
            return; // no IPv6 loopback on this host
        };
        let on: libc::c_int = 1;
        // SAFETY: a valid socket and an int option value of the right size.
        let r = unsafe {
            libc::setsockopt(
                b.as_raw_fd(),
                libc::IPPROTO_IPV6,
                libc::IPV6_RECVPKTINFO,
                std::ptr::addr_of!(on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        let a = std::net::UdpSocket::bind("[::1]:0").unwrap();
        send_batch(&a, &[(b"x".to_vec(), b.local_addr().unwrap())]);
        let mut batch = RecvBatch::new(16);
        assert_eq!(batch.recv(&b).unwrap(), 1);
        let (r, bytes) = batch.get(0).unwrap();
        assert_eq!(bytes, b"x");
        assert_eq!(r.to, Some(Ipv6Addr::LOCALHOST));
    }
}
