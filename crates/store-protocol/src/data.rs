//! TCP data frames between clients and storage nodes, and between storage
//! nodes along a replication chain.
//!
//! Request: `S6D2`, kind (u8), replica address (16 bytes), then
//! - Put: size (u64), forward chain (u8 count ≤ 15, addresses);
//! - Get and Free: nothing more;
//! - GetObject (an erasure-coded object, whole, from the node of its
//!   fragment 0, the address): the object's size (u64) and CRC-32C
//!   (u32), its data fragments k (u8), then its fragment count (u8, at
//!   most 16) and each fragment's address and CRC-32C, fragment 0 first;
//! - Schedule (an operator's RS3 settings; the address is any in the
//!   node's prefix): the settings text (u16 length, at most
//!   [`MAX_SCHEDULE_TEXT`] bytes, UTF-8);
//! - GetRange (bytes of a replica): the offset (u64) and length (u64),
//!   checked by [`crate::range::check_request`];
//!
//! then its credentials: a mode byte and
//! - 0: nothing (refused by every storage node);
//! - 1, sealed by a node holding the cluster key: the sender's clock (u64,
//!   ms since the Unix epoch) and an HMAC-SHA256 tag truncated to 16
//!   bytes over every request byte before it;
//! - 2, a tenant's: a ticket ([`crate::auth::Ticket`]) its metadata node
//!   issued, u16-length-prefixed (at most [`MAX_TICKET`] bytes).
//!
//! For Put the data follows, then its CRC-32C (u32).
//!
//! Reply: status (u8, 0 = ok), then for Put the number of durable copies
//! (u8); for Get the size (u64), the data, and a trailer: status (u8, 0 =
//! checksum verified) and the CRC-32C (u32); for GetRange the replica's
//! layout (u8): 1 (no chunk table: nothing follows, read the replica
//! whole) or 2, then the object's size (u64), the chunk size (u32), the
//! covering chunks' start (u64) and length (u64), each chunk's CRC-32C
//! (u32), the chunks' bytes, and a trailer status (u8, 0 = every byte
//! was there); for Schedule the node's
//! settings and counters as text (u32 length, at most
//! [`MAX_SCHEDULE_REPLY`] bytes); errors carry a message.

use crate::addr::Addr;
use crate::key::{ClusterKey, TAG_LEN, WINDOW_MS};
use crate::ticket::{Ticket, TicketOp};
use crate::wire::{Reader, WireError, Writer, MAX_TICKET};

/// Version 2 (`S6D2`): requests carry credentials.
pub const MAGIC: [u8; 4] = *b"S6D2";
/// Size of the fixed request prefix.
pub const HEADER: usize = 21;

/// Credential mode: none.
pub const MODE_NONE: u8 = 0;
/// Credential mode: sealed with the cluster key.
pub const MODE_SEALED: u8 = 1;
/// Credential mode: a tenant's ticket.
pub const MODE_TICKET: u8 = 2;

/// Longest settings text of a Schedule request.
pub const MAX_SCHEDULE_TEXT: usize = 4096;
/// Longest answer to a Schedule request.
pub const MAX_SCHEDULE_REPLY: usize = 1 << 20;

/// Data frame kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Store a replica and forward it along `chain`.
    Put {
        /// This replica's address.
        addr: Addr,
        /// Size of the data that follows.
        size: u64,
        /// Replicas still to write after this one.
        chain: Vec<Addr>,
    },
    /// Read a replica.
    Get {
        /// Replica address.
        addr: Addr,
    },
    /// Read an erasure-coded object whole from the node of its fragment
    /// 0 (`addr`): from its object cache, or gathered from any k of the
    /// fragments and decoded there, then cached.
    GetObject {
        /// Fragment 0's address (this node's).
        addr: Addr,
        /// What the object's record says of it.
        object: CodedObject,
    },
    /// Read bytes of a replica: the chunks covering `length` bytes from
    /// `offset`, with their CRC-32Cs.
    GetRange {
        /// Replica address.
        addr: Addr,
        /// The first byte asked.
        offset: u64,
        /// Bytes asked (1 to [`crate::range::MAX_RANGE`]).
        length: u64,
    },
    /// Free a replica.
    Free {
        /// Replica address.
        addr: Addr,
    },
    /// Change (or, with no settings, just show) the node's RS3 settings;
    /// only sealed with the cluster key.
    Schedule {
        /// Any address in the node's prefix.
        addr: Addr,
        /// Settings, one `key=value` per line (see `strata store schedule`).
        settings: String,
    },
}

/// An erasure-coded object as its record describes it, sent with a
/// [`Request::GetObject`] so that the node of fragment 0 can gather and
/// check the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodedObject {
    /// Its size.
    pub size: u64,
    /// Its CRC-32C.
    pub crc: u32,
    /// Its data fragments (k).
    pub data: u8,
    /// Each fragment's address and CRC-32C, by index.
    pub fragments: Vec<(Addr, u32)>,
}

impl CodedObject {
    /// Checks what a request may carry: k ≥ 1, more fragments than k
    /// and at most [`crate::wire::MAX_DATA_REPLICAS`], fragment 0 at
    /// `addr`.
    pub fn check(&self, addr: Addr) -> Result<(), String> {
        let n = self.fragments.len();
        if self.data == 0 || n <= self.data as usize || n > crate::wire::MAX_DATA_REPLICAS {
            return Err(format!(
                "a GetObject of {} data fragments names {n} fragments (more than k, at most {})",
                self.data,
                crate::wire::MAX_DATA_REPLICAS
            ));
        }
        if self.fragments.first().map(|f| f.0) != Some(addr) {
            return Err("a GetObject must go to the node of the object's fragment 0".into());
        }
        Ok(())
    }
}

/// What a request is sent with: nothing, a seal with the cluster key (a
/// node's request), or a ticket (a tenant's).
#[derive(Clone, Copy, Debug)]
pub enum Credential<'a> {
    /// Nothing: every storage node refuses it (tests send it on purpose).
    None,
    /// Sealed with the cluster key at the sender's clock.
    Seal(&'a ClusterKey),
    /// A ticket from a metadata node's answer.
    Ticket(&'a [u8]),
}

/// The credentials a request arrived with, not checked yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proof {
    /// None.
    None,
    /// A seal: the sender's clock and the tag.
    Sealed {
        /// The sender's clock (ms since the Unix epoch).
        at: u64,
        /// The tag over the request's bytes and the clock.
        tag: [u8; TAG_LEN],
    },
    /// A ticket's bytes.
    Ticket(Vec<u8>),
}

/// A request as read from a stream, with its credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The request.
    pub req: Request,
    /// What it was sent with.
    pub proof: Proof,
}

/// Who a request was authenticated as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authority {
    /// A node holding the cluster key.
    Node,
    /// A tenant holding a valid ticket for this request.
    Tenant {
        /// The ticket's coordinator metadata address
        /// ([`crate::auth::Ticket::coordinator`]).
        coordinator: Addr,
        /// The tenant the ticket was issued to
        /// ([`crate::auth::Ticket::tenant`]).
        tenant: String,
    },
}

impl Request {
    /// The replica the request is for.
    pub fn addr(&self) -> Addr {
        match self {
            Request::Put { addr, .. }
            | Request::Get { addr }
            | Request::GetRange { addr, .. }
            | Request::GetObject { addr, .. }
            | Request::Free { addr }
            | Request::Schedule { addr, .. } => *addr,
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Request::Put { .. } => "Put",
            Request::Get { .. } => "Get",
            Request::GetRange { .. } => "GetRange",
            Request::GetObject { .. } => "GetObject",
            Request::Free { .. } => "Free",
            Request::Schedule { .. } => "Schedule",
        }
    }

    /// The header without credentials.
    fn plain(&self) -> Writer {
        let mut w = Writer::default();
        w.buf.extend_from_slice(&MAGIC);
        match self {
            Request::Put { addr, size, chain } => {
                w.u8(1);
                w.addr(*addr);
                w.u64(*size);
                w.addrs(chain);
            }
            Request::Get { addr } => {
                w.u8(2);
                w.addr(*addr);
            }
            Request::GetRange {
                addr,
                offset,
                length,
            } => {
                w.u8(6);
                w.addr(*addr);
                w.u64(*offset);
                w.u64(*length);
            }
            Request::Free { addr } => {
                w.u8(3);
                w.addr(*addr);
            }
            Request::Schedule { addr, settings } => {
                w.u8(4);
                w.addr(*addr);
                w.str(&settings[..floor_char(settings, MAX_SCHEDULE_TEXT)]);
            }
            Request::GetObject { addr, object } => {
                w.u8(5);
                w.addr(*addr);
                w.u64(object.size);
                w.u32(object.crc);
                w.u8(object.data);
                let n = object.fragments.len().min(crate::wire::MAX_DATA_REPLICAS);
                w.u8(n as u8);
                for &(fragment, crc) in &object.fragments[..n] {
                    w.addr(fragment);
                    w.u32(crc);
                }
            }
        }
        w
    }

    /// Encodes the request header with `cred` (a seal at the current
    /// clock); for Put, the data follows it.
    pub fn encode(&self, cred: Credential) -> Vec<u8> {
        self.encode_at(cred, crate::auth::unix_ms())
    }

    /// Encodes the request header with `cred`, a seal made at `now_ms`.
    pub fn encode_at(&self, cred: Credential, now_ms: u64) -> Vec<u8> {
        let mut w = self.plain();
        match cred {
            Credential::None => w.u8(MODE_NONE),
            Credential::Seal(key) => {
                w.u8(MODE_SEALED);
                w.u64(now_ms);
                let tag = key.tag(&w.buf);
                w.buf.extend_from_slice(&tag);
            }
            Credential::Ticket(t) => {
                w.u8(MODE_TICKET);
                w.bytes16(&t[..t.len().min(MAX_TICKET)]);
            }
        }
        w.buf
    }

    /// Decodes the fixed prefix; for Put, `rest` reads the size and chain.
    pub fn decode_prefix(prefix: &[u8; HEADER]) -> Result<(u8, Addr), WireError> {
        let mut r = Reader::new(prefix);
        if r.take(4)? != MAGIC {
            return Err(WireError::BadMagic);
        }
        let kind = r.u8()?;
        if !(1..=6).contains(&kind) {
            return Err(WireError::UnknownKind(kind));
        }
        Ok((kind, r.addr()?))
    }
}

/// The longest prefix of `text` of at most `most` bytes that ends on a
/// character boundary.
fn floor_char(text: &str, most: usize) -> usize {
    let mut end = text.len().min(most);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

impl Incoming {
    /// Checks the request's credentials with the storage node's `key` at
    /// its clock `now_ms`: a node's seal (tag, then a clock within
    /// [`WINDOW_MS`]) allows any request; a tenant's ticket (tag, expiry,
    /// then operation, replicas and size) allows the Put or Get it was
    /// issued for, never a Free. The error says why, for the reply.
    pub fn authorize(&self, key: Option<&ClusterKey>, now_ms: u64) -> Result<Authority, String> {
        let what = self.req.what();
        let refuse = |why: String| {
            format!(
                "unauthenticated {what} of replica {}: {why}; nothing done",
                crate::addr::fmt_addr(self.req.addr())
            )
        };
        let Some(key) = key else {
            return Err(refuse(
                "this storage node holds no cluster key to check it with".into(),
            ));
        };
        match &self.proof {
            Proof::None => Err(refuse(match self.req {
                Request::Free { .. } | Request::Schedule { .. } => {
                    "it is not sealed with the cluster key".into()
                }
                _ => "it carries neither the cluster key's seal nor a ticket \
                      (a tenant's Put or Get needs the ticket of its metadata \
                      node's answer)"
                    .into(),
            })),
            Proof::Sealed { at, tag } => {
                let mut w = self.req.plain();
                w.u8(MODE_SEALED);
                w.u64(*at);
                if !key.verify(&w.buf, tag) {
                    return Err(refuse("its seal does not match this cluster's key".into()));
                }
                let apart = now_ms.abs_diff(*at);
                if apart > WINDOW_MS {
                    return Err(refuse(format!(
                        "it was sealed {apart} ms away from this node's clock \
                         (limit {WINDOW_MS} ms): clocks apart, or a replay"
                    )));
                }
                Ok(Authority::Node)
            }
            Proof::Ticket(bytes) => {
                let ticket = Ticket::open(bytes, key, now_ms).map_err(|e| refuse(e.to_string()))?;
                let allowed = match &self.req {
                    Request::Put { addr, size, chain } => {
                        // A Put is of replicas or of one fragment, as the
                        // ticket was issued for.
                        let op = match ticket.op {
                            TicketOp::PutFragment => TicketOp::PutFragment,
                            _ => TicketOp::Put,
                        };
                        ticket.allows(op, *addr, chain, *size)
                    }
                    Request::Get { addr } | Request::GetRange { addr, .. } => {
                        ticket.allows(TicketOp::Get, *addr, &[], 0)
                    }
                    // Every fragment it names, of the ticket's object.
                    Request::GetObject { object, .. } => object
                        .fragments
                        .iter()
                        .try_for_each(|&(a, _)| ticket.allows(TicketOp::Get, a, &[], 0))
                        .and_then(|_| match ticket.size == object.size {
                            true => Ok(()),
                            false => Err(format!(
                                "the ticket covers an object of {} bytes, not {}",
                                ticket.size, object.size
                            )),
                        }),
                    Request::Free { .. } | Request::Schedule { .. } => Err(format!(
                        "a {what} needs the cluster key's seal; a ticket allows none"
                    )),
                };
                allowed.map_err(refuse)?;
                Ok(Authority::Tenant {
                    coordinator: ticket.coordinator,
                    tenant: ticket.tenant,
                })
            }
        }
    }
}
