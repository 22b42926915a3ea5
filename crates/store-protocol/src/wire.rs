//! Pure encoding and decoding of the store's messages: UDP metadata
//! messages (one per datagram) and the headers of TCP data frames.
//!
//! Every length read from the wire is checked against a fixed bound before
//! anything is allocated, and every decoder returns an error, never panics.

use crate::addr::{Addr, MAX_META_REPLICAS};
pub use crate::codec::{check_name, Reader, WireError, Writer, MAX_DATAGRAM, MAX_NAME};
pub use crate::error::Code;
pub use crate::key::Fingerprints;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Most replicas of an object's data.
pub const MAX_DATA_REPLICAS: usize = 16;

/// Largest object the store accepts (1 TiB).
pub const MAX_OBJECT: u64 = 1 << 40;

const MAGIC: [u8; 2] = *b"S6";
/// Version 6: a request may end in zero padding ([`Msg::encode_padded`]),
/// an unauthenticated request gets no answer longer than itself (a
/// [`Body::PadTo`] instead), and a storage node reports a tenant's Put
/// whose connection closed early ([`Body::PutAbandoned`]). (Version 5: a
/// tenant's seal carries its credential's generation ([`TENANT`]), and the
/// operator's `RevokeTenant` (kind 37) is new. Version 4 added link proofs ([`crate::auth::LinkProof`]) in a
/// tenant's `Link`, `GetLinkProof` and `LinkProof`; version 3 tenants' seals
/// ([`Msg::seal_tenant`]), version 2 the data-path tickets of `PostPlan`
/// and `Found`.) Other versions are refused as "bad magic or version".
const VERSION: u8 = 6;

/// Longest ticket a `PostPlan` or `Found` carries ([`crate::auth::Ticket`]),
/// and longest link proof a `Link` or `LinkProof` carries
/// ([`crate::auth::LinkProof`]).
pub const MAX_TICKET: usize = 512;

/// Bytes of a message's header: magic, version, kind, request id, target.
pub const HEADER_LEN: usize = 28;

/// Set in the kind byte of a sealed message: its body is followed by the
/// sender's clock (u64, ms since the Unix epoch) and a tag over all the
/// bytes before the tag ([`crate::auth`]).
const SEALED: u8 = 0x80;

/// Bytes a seal adds to a message.
pub const SEAL_LEN: usize = 8 + crate::key::TAG_LEN;

/// Set in the kind byte of a tenant's request sealed with its credential
/// ([`crate::tenant`]): its body is followed by the tenant id (1 to
/// [`crate::tenant::MAX_TENANT_ID`] bytes), the credential's generation
/// (u32), the id's length (u8), the client's clock (u64, ms since the Unix
/// epoch) and a tag under the tenant's secret over all the bytes before
/// the tag. Read from the end, so the generation and the tag are checked
/// before the body is decoded.
const TENANT: u8 = 0x40;

/// Bytes a tenant's seal adds to a message, besides the tenant id.
pub const TENANT_SEAL_FIXED: usize = 4 + 1 + 8 + crate::key::TAG_LEN;

/// Who sends a message kind, which decides what the gate
/// ([`crate::auth::Gate`]) lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// A tenant's request to a metadata node (Post, Link, Update, Get,
    /// GetLinkProof, Delete, List): taken with a tenant's seal
    /// ([`crate::tenant`]) instead of the cluster key's.
    TenantRequest,
    /// An answer to a request, never answered itself.
    Answer,
    /// An operator's control request (retire, cancel): not idempotent
    /// across each other, so a replayed copy is refused.
    Control,
    /// A request between nodes, sealed with the cluster key (the table
    /// request, [`Kind::GetTable`], is also taken unsealed by the
    /// orchestrator).
    Internal,
}

/// Every message kind, numbered as on the wire (the kind byte, without
/// the seal flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// [`Body::PostBegin`].
    PostBegin = 1,
    /// [`Body::PostPlan`].
    PostPlan = 2,
    /// [`Body::PostCommit`].
    PostCommit = 3,
    /// [`Body::PostAbort`].
    PostAbort = 4,
    /// [`Body::Link`].
    Link = 5,
    /// [`Body::Get`].
    Get = 6,
    /// [`Body::Found`].
    Found = 7,
    /// [`Body::Delete`].
    Delete = 8,
    /// [`Body::List`].
    List = 9,
    /// [`Body::ListPage`].
    ListPage = 10,
    /// [`Body::Replicate`].
    Replicate = 11,
    /// [`Body::Unreplicate`].
    Unreplicate = 12,
    /// [`Body::Done`].
    Done = 13,
    /// [`Body::Error`].
    Error = 14,
    /// [`Body::GetTable`].
    GetTable = 15,
    /// [`Body::Table`].
    Table = 16,
    /// [`Body::Register`].
    Register = 17,
    /// [`Body::Registered`].
    Registered = 18,
    /// [`Body::Heartbeat`].
    Heartbeat = 19,
    /// [`Body::Retire`].
    Retire = 20,
    /// [`Body::Update`].
    Update = 21,
    /// [`Body::Referenced`].
    Referenced = 22,
    /// [`Body::ReferencedBy`].
    ReferencedBy = 23,
    /// [`Body::MgPull`].
    MgPull = 24,
    /// [`Body::MgRows`].
    MgRows = 25,
    /// [`Body::MoveReport`].
    MoveReport = 26,
    /// [`Body::MgGather`].
    MgGather = 27,
    /// [`Body::MgGathered`].
    MgGathered = 28,
    /// [`Body::DrainReport`].
    DrainReport = 29,
    /// [`Body::CancelRetire`].
    CancelRetire = 30,
    /// [`Body::Refresh`].
    Refresh = 31,
    /// [`Body::SyncCheck`].
    SyncCheck = 32,
    /// [`Body::SyncDigest`].
    SyncDigest = 33,
    /// [`Body::SyncDiff`].
    SyncDiff = 34,
    /// [`Body::GetLinkProof`].
    GetLinkProof = 35,
    /// [`Body::LinkProof`].
    LinkProof = 36,
    /// [`Body::RevokeTenant`].
    RevokeTenant = 37,
    /// [`Body::PutAbandoned`].
    PutAbandoned = 38,
    /// [`Body::PadTo`].
    PadTo = 39,
}

/// The one table of message kinds: each kind, in number order, with its
/// class. Encoding, decoding and the gate all read it.
const KINDS: [(Kind, Class); 39] = [
    (Kind::PostBegin, Class::TenantRequest),
    (Kind::PostPlan, Class::Answer),
    (Kind::PostCommit, Class::TenantRequest),
    (Kind::PostAbort, Class::TenantRequest),
    (Kind::Link, Class::TenantRequest),
    (Kind::Get, Class::TenantRequest),
    (Kind::Found, Class::Answer),
    (Kind::Delete, Class::TenantRequest),
    (Kind::List, Class::TenantRequest),
    (Kind::ListPage, Class::Answer),
    (Kind::Replicate, Class::Internal),
    (Kind::Unreplicate, Class::Internal),
    (Kind::Done, Class::Answer),
    (Kind::Error, Class::Answer),
    (Kind::GetTable, Class::Internal),
    (Kind::Table, Class::Answer),
    (Kind::Register, Class::Internal),
    (Kind::Registered, Class::Answer),
    (Kind::Heartbeat, Class::Internal),
    (Kind::Retire, Class::Control),
    (Kind::Update, Class::TenantRequest),
    (Kind::Referenced, Class::Internal),
    (Kind::ReferencedBy, Class::Answer),
    (Kind::MgPull, Class::Internal),
    (Kind::MgRows, Class::Answer),
    (Kind::MoveReport, Class::Internal),
    (Kind::MgGather, Class::Internal),
    (Kind::MgGathered, Class::Answer),
    (Kind::DrainReport, Class::Internal),
    (Kind::CancelRetire, Class::Control),
    (Kind::Refresh, Class::Internal),
    (Kind::SyncCheck, Class::Internal),
    (Kind::SyncDigest, Class::Internal),
    (Kind::SyncDiff, Class::Answer),
    (Kind::GetLinkProof, Class::TenantRequest),
    (Kind::LinkProof, Class::Answer),
    (Kind::RevokeTenant, Class::Internal),
    (Kind::PutAbandoned, Class::Internal),
    (Kind::PadTo, Class::Answer),
];

// The table is in number order from 1, so a kind's row is found by its
// number.
const _: () = {
    let mut i = 0;
    while i < KINDS.len() {
        assert!(
            KINDS[i].0 as usize == i + 1,
            "KINDS must list kinds 1, 2, 3... in order"
        );
        i += 1;
    }
};

impl Kind {
    /// The kind numbered `number` on the wire, if there is one.
    pub fn from_number(number: u8) -> Option<Kind> {
        KINDS
            .get((number as usize).wrapping_sub(1))
            .map(|row| row.0)
    }

    /// Who sends this kind.
    pub fn class(self) -> Class {
        KINDS[self as usize - 1].1
    }

    /// Every kind, in number order.
    pub fn all() -> impl Iterator<Item = Kind> {
        KINDS.iter().map(|row| row.0)
    }
}

/// The kind of [`Body::GetTable`] (tenants may send it unsealed).
pub const KIND_GET_TABLE: u8 = Kind::GetTable as u8;

fn class_of(kind: u8) -> Option<Class> {
    Kind::from_number(kind).map(Kind::class)
}

/// Whether `kind` is a tenant's request to a metadata node
/// ([`Class::TenantRequest`]).
pub fn is_client_request(kind: u8) -> bool {
    class_of(kind) == Some(Class::TenantRequest)
}

/// Whether `kind` only ever answers a request ([`Class::Answer`]).
pub fn is_answer(kind: u8) -> bool {
    class_of(kind) == Some(Class::Answer)
}

/// Whether `kind` is an operator's control request ([`Class::Control`]).
pub fn is_control(kind: u8) -> bool {
    class_of(kind) == Some(Class::Control)
}

/// A message's header, read without decoding its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The message kind (without the seal flag).
    pub kind: u8,
    /// The request id.
    pub req: u64,
    /// The target address.
    pub target: Addr,
    /// Whether the message is sealed with the cluster key.
    pub sealed: bool,
    /// Whether the message is sealed with a tenant's credential.
    pub tenant: bool,
}

/// Reads the header of `buf`.
pub fn peek(buf: &[u8]) -> Result<Header, WireError> {
    if buf.len() > MAX_DATAGRAM {
        return Err(WireError::TooLarge(buf.len()));
    }
    let mut r = Reader::new(buf);
    if r.take(2)? != MAGIC || r.u8()? != VERSION {
        return Err(WireError::BadMagic);
    }
    let kind = r.u8()?;
    if kind & SEALED != 0 && kind & TENANT != 0 {
        return Err(WireError::Invalid(
            "a message is sealed by a node or by a tenant, not both".into(),
        ));
    }
    Ok(Header {
        kind: kind & !(SEALED | TENANT),
        req: r.u64()?,
        target: r.addr()?,
        sealed: kind & SEALED != 0,
        tenant: kind & TENANT != 0,
    })
}

/// The parts of a tenant's sealed request ([`TENANT`]).
#[derive(Debug, PartialEq, Eq)]
pub struct TenantSeal<'a> {
    /// The bytes the tag covers (header, body, tenant id, its length and
    /// the clock).
    pub signed: &'a [u8],
    /// Where the body ends (and the tenant id starts) in the message.
    pub body_end: usize,
    /// The tenant id, as sent (checked by [`crate::tenant::verify`]).
    pub tenant: &'a str,
    /// The credential's generation, as sent (the tag covers it).
    pub generation: u32,
    /// The client's clock (ms since the Unix epoch).
    pub at: u64,
    /// The tag.
    pub tag: &'a [u8],
}

/// The parts of a tenant's sealed request, read from its end; `None` if
/// `buf` is not one or its seal is cut short or not UTF-8.
pub fn tenant_parts(buf: &[u8]) -> Option<TenantSeal<'_>> {
    if !peek(buf).ok()?.tenant {
        return None;
    }
    let (signed, tag) = buf.split_at(buf.len().checked_sub(crate::key::TAG_LEN)?);
    let clock_at = signed.len().checked_sub(8)?;
    let at = u64::from_be_bytes(signed.get(clock_at..)?.try_into().ok()?);
    let len_at = clock_at.checked_sub(1)?;
    let id_len = usize::from(*signed.get(len_at)?);
    let generation_at = len_at.checked_sub(4)?;
    let generation = u32::from_be_bytes(signed.get(generation_at..len_at)?.try_into().ok()?);
    let body_end = generation_at.checked_sub(id_len)?;
    if body_end < HEADER_LEN {
        return None;
    }
    let tenant = std::str::from_utf8(signed.get(body_end..generation_at)?).ok()?;
    Some(TenantSeal {
        signed,
        body_end,
        tenant,
        generation,
        at,
        tag,
    })
}

/// The parts of a sealed message: the bytes its tag covers, the sender's
/// clock, and the tag. `None` if `buf` is not a sealed message.
pub fn seal_parts(buf: &[u8]) -> Option<(&[u8], u64, [u8; crate::key::TAG_LEN])> {
    if !peek(buf).ok()?.sealed || buf.len() < HEADER_LEN + SEAL_LEN {
        return None;
    }
    let (signed, tag) = buf.split_at(buf.len() - crate::key::TAG_LEN);
    let at = signed.get(signed.len() - 8..)?.try_into().ok()?;
    Some((signed, u64::from_be_bytes(at), tag.try_into().ok()?))
}

/// An object's metadata as stored by metadata nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The object name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC-32C of the whole object.
    pub crc: u32,
    /// Version assigned by the coordinator (grows with every Post or Delete).
    pub version: u64,
    /// The object's metadata addresses, coordinator first.
    pub meta: Vec<Addr>,
    /// The addresses of its data replicas.
    pub replicas: Vec<Addr>,
    /// Set while a rename may share these replicas with another name.
    pub rename: Option<RenameLink>,
}

/// The other name of a rename, kept in both records: a rename marks the old
/// name first, binds the new one, then drops the old one. If it stops
/// half way, both names share the replicas, and a Delete of either keeps
/// the data while the other still holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenameLink {
    /// In the old name's record: being renamed to this name.
    To(String),
    /// In the new name's record: renamed from this name.
    From(String),
}

/// One listed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntry {
    /// The object name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Version.
    pub version: u64,
}

/// One row of a metadata group, as a handover copies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Row {
    /// A record.
    Record(Record),
    /// A tombstone: the name was deleted up to this version.
    Tomb {
        /// Object name.
        name: String,
        /// Tombstone version.
        version: u64,
    },
}

/// Most rows one [`Body::MgRows`] page carries (the sender also keeps the
/// page under the datagram limit).
pub const MAX_PULL_ROWS: usize = 2048;

/// Where a gather (see [`Body::MgGather`]) resumes its scan of a metadata
/// node's whole database: records first, then tombstones, each in
/// (group, name) order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatherCursor {
    /// Scanning tombstones (records are done).
    pub tombs: bool,
    /// The group the scan is in.
    pub group: u32,
    /// Only names strictly after this one in `group` ("" from its start).
    pub after: String,
}

/// Most groups one [`Body::MgGather`] names (a node restoring more gathers
/// them in several passes).
pub const MAX_GATHER_GROUPS: usize = 4096;

/// Node roles known to the orchestrator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Metadata node.
    Mn = 1,
    /// Storage node.
    Sn = 2,
}

/// The body of a metadata message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Client → coordinator: start a Post.
    PostBegin {
        /// Object name.
        name: String,
        /// Object size.
        size: u64,
    },
    /// Coordinator → client: where to stream the data.
    PostPlan {
        /// Version this Post will create.
        version: u64,
        /// The size the Post announced (its ticket binds it).
        size: u64,
        /// Replica addresses, first one first.
        replicas: Vec<Addr>,
        /// The Put ticket for those replicas ([`crate::auth::Ticket`]),
        /// filled in by the node's runtime; empty when none was issued.
        ticket: Vec<u8>,
    },
    /// Client → coordinator: data is durable on W_d replicas; commit.
    PostCommit {
        /// Object name.
        name: String,
        /// Version from the plan.
        version: u64,
        /// CRC-32C of the data.
        crc: u32,
    },
    /// Client → coordinator: the data phase failed; drop the Post.
    PostAbort {
        /// Object name.
        name: String,
        /// Version from the plan.
        version: u64,
    },
    /// Client → coordinator of a new name: bind existing replicas (rename).
    Link {
        /// The record to bind under its (new) name; version is ignored.
        record: Record,
        /// A tenant's proof that it may bind these replicas
        /// ([`crate::auth::LinkProof`], from a `LinkProof` answer about the
        /// old name); empty for a record with no replicas, or from a node.
        proof: Vec<u8>,
    },
    /// Client → coordinator: replace an object's record at `if_version`
    /// with `record`, which may change only its rename link.
    Update {
        /// The new record; version is ignored.
        record: Record,
        /// The version the stored record must have.
        if_version: u64,
    },
    /// Client → any metadata address: read metadata.
    Get {
        /// Object name.
        name: String,
    },
    /// Reply to Get.
    Found {
        /// The record.
        record: Record,
        /// The Get ticket for its replicas ([`crate::auth::Ticket`]),
        /// filled in by the node's runtime; empty for an empty object
        /// (no storage node is asked) or when none was issued.
        ticket: Vec<u8>,
    },
    /// Client → any metadata address: read metadata, as `Get` does, with a
    /// link proof for the asking tenant (the first step of a rename).
    GetLinkProof {
        /// Object name.
        name: String,
    },
    /// Reply to GetLinkProof.
    LinkProof {
        /// The record.
        record: Record,
        /// The link proof for its replicas, bound to the asking tenant
        /// ([`crate::auth::LinkProof`]), filled in by the node's runtime;
        /// empty for a record with no replicas or a request from a node.
        proof: Vec<u8>,
    },
    /// Client → coordinator: delete (metadata first, data later).
    Delete {
        /// Object name.
        name: String,
        /// Only delete this version (0: any).
        if_version: u64,
        /// Keep the data replicas (rename's second half).
        keep_data: bool,
    },
    /// Client → every MN: list names by prefix.
    List {
        /// Name prefix.
        prefix: String,
        /// Only names strictly after this one.
        after: String,
        /// Most entries wanted.
        limit: u32,
    },
    /// Reply to List.
    ListPage {
        /// Entries in name order.
        entries: Vec<ListEntry>,
        /// Whether this node has more after the last entry.
        more: bool,
    },
    /// Coordinator → replica MN: store this record at the addressed location.
    Replicate {
        /// The record.
        record: Record,
    },
    /// Coordinator → replica MN: the name is deleted up to `version`.
    Unreplicate {
        /// Object name.
        name: String,
        /// Tombstone version.
        version: u64,
    },
    /// Generic success (with the version concerned).
    Done {
        /// Version committed or deleted.
        version: u64,
    },
    /// Failure.
    Error {
        /// What kind of failure.
        code: Code,
        /// Human-readable explanation.
        message: String,
    },
    /// Anyone → ON: send the prefix table.
    GetTable,
    /// ON → anyone: the encoded prefix table.
    Table {
        /// Bytes of [`crate::table::Table::encode`].
        bytes: Vec<u8>,
    },
    /// Node → ON: admit me (or re-admit with my identity).
    Register {
        /// Role.
        role: Role,
        /// Persistent node identity.
        uuid: u64,
        /// Where the node listens.
        endpoint: SocketAddr,
        /// Capacity in bytes (SN).
        capacity: u64,
        /// Free bytes (SN).
        free: u64,
        /// Device type (0 SSD, 1 HDD).
        device: u8,
        /// The fingerprints of the node's keyring: an optional trailing
        /// field (a node of an older build sends none).
        keys: Option<Fingerprints>,
    },
    /// ON → node: admitted, with index (SN prefix index or MN slot).
    Registered {
        /// Index.
        index: u16,
    },
    /// Node → ON: alive, with current free space and replica count.
    Heartbeat {
        /// Persistent node identity.
        uuid: u64,
        /// Free bytes.
        free: u64,
        /// Replicas held (SN).
        objects: u64,
        /// The fingerprints of the node's keyring, as reloaded: an
        /// optional trailing field (a node of an older build sends none).
        keys: Option<Fingerprints>,
    },
    /// Operator → ON: retire a node.
    Retire {
        /// Node identity.
        uuid: u64,
    },
    /// Operator → ON: cancel the drain of a storage node that is being
    /// retired; it goes back to taking new objects. Answered `Done` also
    /// for a node that is not being drained (a resent request after a lost
    /// answer must not fail); refused for a node already retired.
    CancelRetire {
        /// Node identity.
        uuid: u64,
    },
    /// Storage node → the coordinator's metadata address named in a Put
    /// ticket: the tenant's connection carrying the Put of `replica` (the
    /// first of the Post's replicas) closed before the data was whole, so
    /// the client is gone. The coordinator drops the Post in its data
    /// phase whose first replica this is (unlocking the name at once, not
    /// at the data deadline) and frees its replicas. Sealed with the
    /// cluster key; answered `Done` (version 0).
    PutAbandoned {
        /// The first replica address of the abandoned Post.
        replica: Addr,
    },
    /// Anyone → a sender whose unauthenticated request was smaller than
    /// its answer: send it again padded with zeros to at least `size`
    /// bytes ([`Msg::encode_padded`]); nothing was done. An answer to an
    /// unauthenticated datagram is never longer than the datagram, so a
    /// spoofed source cannot use a node as an amplifier.
    PadTo {
        /// The least length of the padded request, in bytes.
        size: u32,
    },
    /// Operator → ON: refuse tenant `tenant`'s credentials of generations
    /// below `below` from now on (its minimum generation becomes the
    /// larger of its current one and `below`, so a resend is harmless).
    /// Answered `Done` with the minimum generation now in force as its
    /// version.
    RevokeTenant {
        /// Tenant id (not `*`: the admin credential follows the key).
        tenant: String,
        /// The lowest generation still valid after this.
        below: u32,
    },
    /// Storage node → metadata node: which of these replica addresses do
    /// your records name? (Garbage collection of unreferenced replicas.)
    Referenced {
        /// Replica addresses to look up.
        addrs: Vec<Addr>,
    },
    /// Metadata node → storage node: the ones its records name.
    ReferencedBy {
        /// The referenced subset.
        addrs: Vec<Addr>,
    },
    /// New owner → current owner of a metadata group being handed over
    /// (addressed to an address in the group): one page of its rows.
    MgPull {
        /// The group.
        group: u32,
        /// 0 for the first copy; for the final copy, the freeze epoch
        /// ([`crate::table::Move::frozen_epoch`]): the owner then refuses
        /// until it has seen that freeze and nothing of the group is in
        /// flight, and from then on refuses every change of the group.
        epoch: u64,
        /// Tombstones instead of records.
        tombs: bool,
        /// Only names strictly after this one ("" from the start).
        after: String,
    },
    /// Reply to MgPull: rows in name order.
    MgRows {
        /// The rows.
        rows: Vec<Row>,
        /// Whether more rows of that kind follow the last one.
        more: bool,
    },
    /// New owner of a group being restored (its previous owner is dead) →
    /// a live metadata node, addressed to an address in a group that node
    /// owns: one page of the rows, from any group of its database, of names
    /// with a metadata address in one of `groups`.
    MgGather {
        /// The groups being restored (at most [`MAX_GATHER_GROUPS`]).
        groups: Vec<u32>,
        /// The slot the request is meant for: another node refuses it (the
        /// address changed owner), so a page is never counted for the
        /// wrong node.
        slot: u16,
        /// Where the scan resumes.
        from: GatherCursor,
    },
    /// Reply to MgGather: matching rows, and where the next page starts
    /// (`None`: the scan is complete). A page may hold no row and still
    /// move the cursor on: each page scans a bounded number of rows.
    MgGathered {
        /// The rows.
        rows: Vec<Row>,
        /// The next page's cursor.
        next: Option<GatherCursor>,
    },
    /// New owner → ON: the first copy of a group is done (`ready` false),
    /// or the final copy under the freeze of `epoch` is (`ready` true).
    MoveReport {
        /// The group.
        group: u32,
        /// The reporting node's slot.
        to: u16,
        /// Final copy done.
        ready: bool,
        /// The freeze epoch of the final copy (0 for the first).
        epoch: u64,
    },
    /// Metadata node → ON, after each full scan of the groups it owns
    /// while a storage node is being drained: how many of its rows still
    /// name a replica on that node. Sent every pass (a lost one is
    /// replaced by the next); the ON retires the node once every node
    /// owning groups reports none, from a scan that started no earlier
    /// than the drain and the last change of group owners.
    DrainReport {
        /// The reporting node's slot.
        slot: u16,
        /// The epoch of the node's table when the scan started.
        epoch: u64,
        /// The drain the scan counted for: its start epoch
        /// ([`crate::table::Drain::since`]). A drain cancelled and started
        /// again has a new one, so a report for the old drain never counts
        /// for the new one.
        drain: u64,
        /// The drained storage node's prefix index.
        index: u16,
        /// Records this node coordinates that name it (plus Posts and
        /// repair copies under way that place a replica on it).
        left: u64,
        /// Metadata copies kept here for other coordinators that name it.
        copies: u64,
        /// Of `left`, records no other storage node could take.
        unplaceable: u64,
    },
    /// Metadata copy → coordinator, from the drain scan: the sender holds
    /// `name` at `version` under metadata address `copy`, and that row
    /// names a replica on a drained storage node. A coordinator holding a
    /// newer version (record or tombstone) sends it to `copy` in one
    /// `Replicate` or `Unreplicate`; nothing else answers (the next scan
    /// asks again if either datagram is lost).
    Refresh {
        /// Object name.
        name: String,
        /// The version the copy holds.
        version: u64,
        /// The metadata address of the copy: one of `name`'s.
        copy: Addr,
    },
    /// Coordinator → the metadata node holding some of its names' copies,
    /// from the anti-entropy pass: what the coordinator holds of each
    /// name. The receiver checks each entry against its own row under
    /// `copy` and sends a [`Body::Refresh`] to the name's coordinator
    /// address for each copy that is behind (its newest version, record
    /// or tombstone, older; or a record where the coordinator holds a
    /// tombstone of that version). Nothing else answers.
    SyncCheck {
        /// At most [`MAX_SYNC_ENTRIES`] entries.
        entries: Vec<SyncEntry>,
    },
    /// Coordinator → a metadata node holding copies, from the
    /// anti-entropy pass: per (coordinator group, copy index), the digest
    /// of the coordinator's rows whose copy lands in a group the receiver
    /// owns (in the sender's table). Answered with [`Body::SyncDiff`].
    SyncDigest {
        /// At most [`MAX_SYNC_SUMS`] sums.
        sums: Vec<SyncSum>,
    },
    /// The answer to a [`Body::SyncDigest`]: the (coordinator group, copy
    /// index) pairs whose digest differs from the receiver's copies.
    SyncDiff {
        /// At most [`MAX_SYNC_SUMS`] pairs.
        pairs: Vec<(u32, u8)>,
    },
}

impl Body {
    /// This body's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Body::PostBegin { .. } => Kind::PostBegin,
            Body::PostPlan { .. } => Kind::PostPlan,
            Body::PostCommit { .. } => Kind::PostCommit,
            Body::PostAbort { .. } => Kind::PostAbort,
            Body::Link { .. } => Kind::Link,
            Body::Get { .. } => Kind::Get,
            Body::Found { .. } => Kind::Found,
            Body::Delete { .. } => Kind::Delete,
            Body::List { .. } => Kind::List,
            Body::ListPage { .. } => Kind::ListPage,
            Body::Replicate { .. } => Kind::Replicate,
            Body::Unreplicate { .. } => Kind::Unreplicate,
            Body::Done { .. } => Kind::Done,
            Body::Error { .. } => Kind::Error,
            Body::GetTable => Kind::GetTable,
            Body::Table { .. } => Kind::Table,
            Body::Register { .. } => Kind::Register,
            Body::Registered { .. } => Kind::Registered,
            Body::Heartbeat { .. } => Kind::Heartbeat,
            Body::Retire { .. } => Kind::Retire,
            Body::Update { .. } => Kind::Update,
            Body::Referenced { .. } => Kind::Referenced,
            Body::ReferencedBy { .. } => Kind::ReferencedBy,
            Body::MgPull { .. } => Kind::MgPull,
            Body::MgRows { .. } => Kind::MgRows,
            Body::MoveReport { .. } => Kind::MoveReport,
            Body::MgGather { .. } => Kind::MgGather,
            Body::MgGathered { .. } => Kind::MgGathered,
            Body::DrainReport { .. } => Kind::DrainReport,
            Body::CancelRetire { .. } => Kind::CancelRetire,
            Body::Refresh { .. } => Kind::Refresh,
            Body::SyncCheck { .. } => Kind::SyncCheck,
            Body::SyncDigest { .. } => Kind::SyncDigest,
            Body::SyncDiff { .. } => Kind::SyncDiff,
            Body::GetLinkProof { .. } => Kind::GetLinkProof,
            Body::LinkProof { .. } => Kind::LinkProof,
            Body::RevokeTenant { .. } => Kind::RevokeTenant,
            Body::PutAbandoned { .. } => Kind::PutAbandoned,
            Body::PadTo { .. } => Kind::PadTo,
        }
    }
}

/// One name in a [`Body::SyncCheck`]: the coordinator's newest state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncEntry {
    /// Object name.
    pub name: String,
    /// The metadata address of the copy checked: one of `name`'s, not the
    /// first.
    pub copy: Addr,
    /// The coordinator's newest version of `name` (record or tombstone).
    pub version: u64,
    /// Whether that version is a tombstone (the object is deleted).
    pub deleted: bool,
}

/// One digest in a [`Body::SyncDigest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncSum {
    /// The coordinator group.
    pub group: u32,
    /// The copy index (1 to N_m - 1: which of the name's metadata
    /// addresses).
    pub index: u8,
    /// XOR of a hash of (name, newest version, deleted) over the rows.
    pub sum: u64,
}

/// Most entries one [`Body::SyncCheck`] carries (the sender also keeps
/// it within one datagram).
pub const MAX_SYNC_ENTRIES: usize = 1024;

/// Most sums one [`Body::SyncDigest`] (or pairs one [`Body::SyncDiff`])
/// carries: 13 bytes each, well within one datagram.
pub const MAX_SYNC_SUMS: usize = 4096;

// A full digest (group u32, index u8, sum u64: 13 bytes a sum) with its
// header and seal fits one datagram.
const _: () = assert!(HEADER_LEN + MAX_SYNC_SUMS * 13 + SEAL_LEN <= crate::codec::MAX_DATAGRAM);

/// Most addresses one `Referenced` message carries.
pub const MAX_REFERENCED: usize = 2048;

/// A metadata message: request id, target address and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    /// Chosen by the requester; replies carry the same id.
    pub req: u64,
    /// The address this message is for (in routed mode, the destination
    /// address; in mapped mode, carried here).
    pub target: Addr,
    /// The message.
    pub body: Body,
}

/// An unspecified socket address, for messages that carry none.
pub fn no_endpoint() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
}

fn put_record(w: &mut Writer, r: &Record) {
    w.str(&r.name);
    w.u64(r.size);
    w.u32(r.crc);
    w.u64(r.version);
    w.addrs(&r.meta);
    w.addrs(&r.replicas);
    match &r.rename {
        None => w.u8(0),
        Some(RenameLink::To(n)) => {
            w.u8(1);
            w.str(n);
        }
        Some(RenameLink::From(n)) => {
            w.u8(2);
            w.str(n);
        }
    }
}

fn get_record(r: &mut Reader) -> Result<Record, WireError> {
    let name = r.name()?;
    let size = r.u64()?;
    if size > MAX_OBJECT {
        return Err(WireError::Invalid(format!(
            "object size {size} exceeds the {MAX_OBJECT}-byte limit"
        )));
    }
    Ok(Record {
        name,
        size,
        crc: r.u32()?,
        version: r.u64()?,
        meta: r.addrs(MAX_META_REPLICAS, "metadata addresses")?,
        replicas: r.addrs(MAX_DATA_REPLICAS, "replicas")?,
        rename: match r.u8()? {
            0 => None,
            1 => Some(RenameLink::To(r.name()?)),
            2 => Some(RenameLink::From(r.name()?)),
            k => return Err(WireError::Invalid(format!("rename link kind {k}"))),
        },
    })
}

/// A ticket's bytes, at most [`MAX_TICKET`] (checked by the storage node
/// that takes it, not here).
fn get_ticket(r: &mut Reader) -> Result<Vec<u8>, WireError> {
    let b = r.bytes16()?;
    if b.len() > MAX_TICKET {
        return Err(WireError::Invalid(format!(
            "ticket of {} bytes; the limit is {MAX_TICKET}",
            b.len()
        )));
    }
    Ok(b.to_vec())
}

/// A u16-counted list of addresses, at most [`MAX_REFERENCED`].
fn get_addr_list(r: &mut Reader) -> Result<Vec<Addr>, WireError> {
    let n = r.u16()? as usize;
    if n > MAX_REFERENCED {
        return Err(WireError::Invalid(format!("{n} addresses in one message")));
    }
    (0..n).map(|_| r.addr()).collect()
}

/// Encodes a record alone (the metadata database's value format).
pub fn encode_record(rec: &Record) -> Vec<u8> {
    let mut w = Writer::default();
    put_record(&mut w, rec);
    w.buf
}

/// Decodes a record encoded by [`encode_record`].
pub fn decode_record(buf: &[u8]) -> Result<Record, WireError> {
    let mut r = Reader::new(buf);
    let rec = get_record(&mut r)?;
    r.finish()?;
    Ok(rec)
}

impl Msg {
    /// A message.
    pub fn new(req: u64, target: Addr, body: Body) -> Msg {
        Msg { req, target, body }
    }

    /// A reply to `self` with `body` (same request id and target).
    pub fn reply(&self, body: Body) -> Msg {
        Msg::new(self.req, self.target, body)
    }

    /// An error reply to `self`.
    pub fn error(&self, code: Code, message: impl Into<String>) -> Msg {
        self.reply(Body::Error {
            code,
            message: message.into(),
        })
    }

    /// Encodes the message into one datagram, unsealed.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        self.encode_padded(0)
    }

    /// Encodes the message into one datagram, unsealed, followed by zero
    /// bytes up to `pad_to` bytes in all (none if it is that long
    /// already): a request padded so that a node may answer it although
    /// it is not authenticated ([`Body::PadTo`]). Decoders skip the zeros.
    pub fn encode_padded(&self, pad_to: usize) -> Result<Vec<u8>, WireError> {
        let mut w = self.encode_with(self.kind());
        pad(&mut w, pad_to, 0);
        if w.buf.len() > MAX_DATAGRAM {
            return Err(WireError::TooLarge(w.buf.len()));
        }
        Ok(w.buf)
    }

    /// Encodes the message into one datagram sealed with `key` at the
    /// sender's clock `now_ms` (ms since the Unix epoch).
    pub fn seal(&self, key: &crate::key::ClusterKey, now_ms: u64) -> Result<Vec<u8>, WireError> {
        self.seal_padded(key, now_ms, 0)
    }

    /// [`Msg::seal`], padded with zeros (under the seal) to at least
    /// `pad_to` bytes in all.
    pub fn seal_padded(
        &self,
        key: &crate::key::ClusterKey,
        now_ms: u64,
        pad_to: usize,
    ) -> Result<Vec<u8>, WireError> {
        let mut w = self.encode_with(self.kind() | SEALED);
        pad(&mut w, pad_to, SEAL_LEN);
        w.u64(now_ms);
        let tag = key.tag(&w.buf);
        w.buf.extend_from_slice(&tag);
        if w.buf.len() > MAX_DATAGRAM {
            return Err(WireError::TooLarge(w.buf.len()));
        }
        Ok(w.buf)
    }

    /// Encodes a tenant's request into one datagram sealed with its
    /// `credential` at the client's clock `now_ms` ([`TENANT`]).
    pub fn seal_tenant(
        &self,
        credential: &crate::tenant::TenantCredential,
        now_ms: u64,
    ) -> Result<Vec<u8>, WireError> {
        self.seal_tenant_padded(credential, now_ms, 0)
    }

    /// [`Msg::seal_tenant`], padded with zeros (under the seal) to at
    /// least `pad_to` bytes in all.
    pub fn seal_tenant_padded(
        &self,
        credential: &crate::tenant::TenantCredential,
        now_ms: u64,
        pad_to: usize,
    ) -> Result<Vec<u8>, WireError> {
        let id = credential.tenant();
        let id_len = u8::try_from(id.len())
            .map_err(|_| WireError::Invalid(format!("tenant id of {} bytes", id.len())))?;
        let mut w = self.encode_with(self.kind() | TENANT);
        pad(&mut w, pad_to, id.len() + TENANT_SEAL_FIXED);
        w.buf.extend_from_slice(id.as_bytes());
        w.u32(credential.generation());
        w.u8(id_len);
        w.u64(now_ms);
        let tag = credential.tag(&w.buf);
        w.buf.extend_from_slice(&tag);
        if w.buf.len() > MAX_DATAGRAM {
            return Err(WireError::TooLarge(w.buf.len()));
        }
        Ok(w.buf)
    }

    fn encode_with(&self, kind: u8) -> Writer {
        let mut w = Writer::default();
        w.buf.extend_from_slice(&MAGIC);
        w.u8(VERSION);
        w.u8(kind);
        w.u64(self.req);
        w.addr(self.target);
        self.encode_body(&mut w);
        w
    }

    fn kind(&self) -> u8 {
        self.body.kind() as u8
    }

    fn encode_body(&self, w: &mut Writer) {
        match &self.body {
            Body::PostBegin { name, size } => {
                w.str(name);
                w.u64(*size);
            }
            Body::PostPlan {
                version,
                size,
                replicas,
                ticket,
            } => {
                w.u64(*version);
                w.u64(*size);
                w.addrs(replicas);
                w.bytes16(ticket);
            }
            Body::PostCommit { name, version, crc } => {
                w.str(name);
                w.u64(*version);
                w.u32(*crc);
            }
            Body::PostAbort { name, version } | Body::Unreplicate { name, version } => {
                w.str(name);
                w.u64(*version);
            }
            Body::Replicate { record } => put_record(w, record),
            Body::Link { record, proof } | Body::LinkProof { record, proof } => {
                put_record(w, record);
                w.bytes16(proof);
            }
            Body::Found { record, ticket } => {
                put_record(w, record);
                w.bytes16(ticket);
            }
            Body::Update { record, if_version } => {
                put_record(w, record);
                w.u64(*if_version);
            }
            Body::Get { name } | Body::GetLinkProof { name } => w.str(name),
            Body::Refresh {
                name,
                version,
                copy,
            } => {
                w.str(name);
                w.u64(*version);
                w.addr(*copy);
            }
            Body::SyncCheck { entries } => {
                let n = entries.len().min(MAX_SYNC_ENTRIES);
                w.u16(n as u16);
                for e in &entries[..n] {
                    w.str(&e.name);
                    w.addr(e.copy);
                    w.u64(e.version);
                    w.u8(e.deleted as u8);
                }
            }
            Body::SyncDigest { sums } => {
                let n = sums.len().min(MAX_SYNC_SUMS);
                w.u16(n as u16);
                for s in &sums[..n] {
                    w.u32(s.group);
                    w.u8(s.index);
                    w.u64(s.sum);
                }
            }
            Body::SyncDiff { pairs } => {
                let n = pairs.len().min(MAX_SYNC_SUMS);
                w.u16(n as u16);
                for &(g, i) in &pairs[..n] {
                    w.u32(g);
                    w.u8(i);
                }
            }
            Body::Delete {
                name,
                if_version,
                keep_data,
            } => {
                w.str(name);
                w.u64(*if_version);
                w.u8(*keep_data as u8);
            }
            Body::List {
                prefix,
                after,
                limit,
            } => {
                w.str(prefix);
                w.str(after);
                w.u32(*limit);
            }
            Body::ListPage { entries, more } => {
                w.u32(entries.len() as u32);
                for e in entries {
                    w.str(&e.name);
                    w.u64(e.size);
                    w.u64(e.version);
                }
                w.u8(*more as u8);
            }
            Body::Done { version } => w.u64(*version),
            Body::PutAbandoned { replica } => w.addr(*replica),
            Body::PadTo { size } => w.u32(*size),
            Body::Error { code, message } => {
                w.u16(*code as u16);
                w.str(message);
            }
            Body::GetTable => {}
            Body::Table { bytes } => w.buf.extend_from_slice(bytes),
            Body::Register {
                role,
                uuid,
                endpoint,
                capacity,
                free,
                device,
                keys,
            } => {
                w.u8(*role as u8);
                w.u64(*uuid);
                w.sockaddr(*endpoint);
                w.u64(*capacity);
                w.u64(*free);
                w.u8(*device);
                if let Some(k) = keys {
                    w.prints(k);
                }
            }
            Body::Registered { index } => w.u16(*index),
            Body::Heartbeat {
                uuid,
                free,
                objects,
                keys,
            } => {
                w.u64(*uuid);
                w.u64(*free);
                w.u64(*objects);
                if let Some(k) = keys {
                    w.prints(k);
                }
            }
            Body::Retire { uuid } | Body::CancelRetire { uuid } => w.u64(*uuid),
            Body::RevokeTenant { tenant, below } => {
                w.str(tenant);
                w.u32(*below);
            }
            Body::Referenced { addrs } | Body::ReferencedBy { addrs } => {
                let n = addrs.len().min(MAX_REFERENCED);
                w.u16(n as u16);
                for &a in &addrs[..n] {
                    w.addr(a);
                }
            }
            Body::MgPull {
                group,
                epoch,
                tombs,
                after,
            } => {
                w.u32(*group);
                w.u64(*epoch);
                w.u8(*tombs as u8);
                w.str(after);
            }
            Body::MgRows { rows, more } => {
                put_rows(w, rows);
                w.u8(*more as u8);
            }
            Body::MgGather { groups, slot, from } => {
                let n = groups.len().min(MAX_GATHER_GROUPS);
                w.u16(n as u16);
                for &g in &groups[..n] {
                    w.u32(g);
                }
                w.u16(*slot);
                put_cursor(w, from);
            }
            Body::MgGathered { rows, next } => {
                put_rows(w, rows);
                match next {
                    None => w.u8(0),
                    Some(c) => {
                        w.u8(1);
                        put_cursor(w, c);
                    }
                }
            }
            Body::MoveReport {
                group,
                to,
                ready,
                epoch,
            } => {
                w.u32(*group);
                w.u16(*to);
                w.u8(*ready as u8);
                w.u64(*epoch);
            }
            Body::DrainReport {
                slot,
                epoch,
                drain,
                index,
                left,
                copies,
                unplaceable,
            } => {
                w.u16(*slot);
                w.u64(*epoch);
                w.u64(*drain);
                w.u16(*index);
                w.u64(*left);
                w.u64(*copies);
                w.u64(*unplaceable);
            }
        }
    }

    /// Decodes one datagram, sealed (by a node or a tenant) or not. The
    /// seal is not checked here (tenants hold no key to check a node's
    /// with): a node checks it first ([`crate::auth::Gate`]).
    pub fn decode(buf: &[u8]) -> Result<Msg, WireError> {
        let head = peek(buf)?;
        let end = if head.sealed {
            buf.len()
                .checked_sub(SEAL_LEN)
                .filter(|&end| end >= HEADER_LEN)
                .ok_or(WireError::Truncated(buf.len()))?
        } else if head.tenant {
            tenant_parts(buf)
                .ok_or(WireError::Truncated(buf.len()))?
                .body_end
        } else {
            buf.len()
        };
        let mut r = Reader::new(&buf[..end]);
        r.take(HEADER_LEN)?;
        let body = decode_body(head.kind, &mut r)?;
        // A table's bytes run to the end: only requests are padded.
        if head.kind != 16 {
            r.skip_padding();
        }
        r.finish()?;
        Ok(Msg {
            req: head.req,
            target: head.target,
            body,
        })
    }
}

fn decode_body(kind: u8, r: &mut Reader) -> Result<Body, WireError> {
    let Some(kind) = Kind::from_number(kind) else {
        return Err(WireError::UnknownKind(kind));
    };
    Ok(match kind {
        Kind::PostBegin => Body::PostBegin {
            name: r.name()?,
            size: r.u64()?,
        },
        Kind::PostPlan => {
            let version = r.u64()?;
            let size = r.u64()?;
            if size > MAX_OBJECT {
                return Err(WireError::Invalid(format!(
                    "object size {size} exceeds the {MAX_OBJECT}-byte limit"
                )));
            }
            Body::PostPlan {
                version,
                size,
                replicas: r.addrs(MAX_DATA_REPLICAS, "replicas")?,
                ticket: get_ticket(r)?,
            }
        }
        Kind::PostCommit => Body::PostCommit {
            name: r.name()?,
            version: r.u64()?,
            crc: r.u32()?,
        },
        Kind::PostAbort => Body::PostAbort {
            name: r.name()?,
            version: r.u64()?,
        },
        Kind::Link => Body::Link {
            record: get_record(r)?,
            proof: get_ticket(r)?,
        },
        Kind::GetLinkProof => Body::GetLinkProof { name: r.name()? },
        Kind::LinkProof => Body::LinkProof {
            record: get_record(r)?,
            proof: get_ticket(r)?,
        },
        Kind::Get => Body::Get { name: r.name()? },
        Kind::Update => Body::Update {
            record: get_record(r)?,
            if_version: r.u64()?,
        },
        Kind::Found => Body::Found {
            record: get_record(r)?,
            ticket: get_ticket(r)?,
        },
        Kind::Delete => Body::Delete {
            name: r.name()?,
            if_version: r.u64()?,
            keep_data: r.u8()? != 0,
        },
        Kind::List => Body::List {
            prefix: r.str(MAX_NAME, "list prefix")?,
            after: r.str(MAX_NAME, "list cursor")?,
            limit: r.u32()?,
        },
        Kind::ListPage => {
            let n = r.u32()? as usize;
            // Each entry takes at least 18 bytes: bound the count by the
            // datagram before allocating.
            if n > MAX_DATAGRAM / 18 {
                return Err(WireError::Invalid(format!("{n} list entries")));
            }
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(ListEntry {
                    name: r.name()?,
                    size: r.u64()?,
                    version: r.u64()?,
                });
            }
            Body::ListPage {
                entries,
                more: r.u8()? != 0,
            }
        }
        Kind::Replicate => Body::Replicate {
            record: get_record(r)?,
        },
        Kind::Unreplicate => Body::Unreplicate {
            name: r.name()?,
            version: r.u64()?,
        },
        Kind::Done => Body::Done { version: r.u64()? },
        Kind::PutAbandoned => Body::PutAbandoned { replica: r.addr()? },
        Kind::PadTo => Body::PadTo { size: r.u32()? },
        Kind::Error => Body::Error {
            code: Code::from_u16(r.u16()?),
            message: r.str(MAX_DATAGRAM, "error message")?,
        },
        Kind::GetTable => Body::GetTable,
        Kind::Table => {
            let rest = r.take(r.buf.len() - r.pos)?;
            Body::Table {
                bytes: rest.to_vec(),
            }
        }
        Kind::Register => Body::Register {
            role: match r.u8()? {
                1 => Role::Mn,
                2 => Role::Sn,
                x => return Err(WireError::Invalid(format!("role {x}"))),
            },
            uuid: r.u64()?,
            endpoint: r.sockaddr()?,
            capacity: r.u64()?,
            free: r.u64()?,
            device: r.u8()?,
            keys: r.opt_prints()?,
        },
        Kind::Registered => Body::Registered { index: r.u16()? },
        Kind::Heartbeat => Body::Heartbeat {
            uuid: r.u64()?,
            free: r.u64()?,
            objects: r.u64()?,
            keys: r.opt_prints()?,
        },
        Kind::Retire => Body::Retire { uuid: r.u64()? },
        Kind::CancelRetire => Body::CancelRetire { uuid: r.u64()? },
        Kind::RevokeTenant => Body::RevokeTenant {
            tenant: r.str(crate::tenant::MAX_TENANT_ID, "tenant id")?,
            below: r.u32()?,
        },
        Kind::Referenced => Body::Referenced {
            addrs: get_addr_list(r)?,
        },
        Kind::ReferencedBy => Body::ReferencedBy {
            addrs: get_addr_list(r)?,
        },
        Kind::MgPull => Body::MgPull {
            group: r.u32()?,
            epoch: r.u64()?,
            tombs: flag(r, "tombstone flag")?,
            after: r.str(MAX_NAME, "pull cursor")?,
        },
        Kind::MgRows => Body::MgRows {
            rows: get_rows(r)?,
            more: flag(r, "more flag")?,
        },
        Kind::MgGather => Body::MgGather {
            groups: {
                let n = r.u16()? as usize;
                if n > MAX_GATHER_GROUPS {
                    return Err(WireError::Invalid(format!(
                        "{n} groups in one gather; the limit is {MAX_GATHER_GROUPS}"
                    )));
                }
                (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?
            },
            slot: r.u16()?,
            from: get_cursor(r)?,
        },
        Kind::MgGathered => Body::MgGathered {
            rows: get_rows(r)?,
            next: if flag(r, "next-page flag")? {
                Some(get_cursor(r)?)
            } else {
                None
            },
        },
        Kind::MoveReport => Body::MoveReport {
            group: r.u32()?,
            to: r.u16()?,
            ready: flag(r, "ready flag")?,
            epoch: r.u64()?,
        },
        Kind::DrainReport => {
            let (slot, epoch, drain, index) = (r.u16()?, r.u64()?, r.u64()?, r.u16()?);
            let (left, copies, unplaceable) = (r.u64()?, r.u64()?, r.u64()?);
            if unplaceable > left {
                return Err(WireError::Invalid(format!(
                    "drain report: {unplaceable} unplaceable of {left} records left"
                )));
            }
            Body::DrainReport {
                slot,
                epoch,
                drain,
                index,
                left,
                copies,
                unplaceable,
            }
        }
        Kind::Refresh => Body::Refresh {
            name: r.name()?,
            version: r.u64()?,
            copy: r.addr()?,
        },
        Kind::SyncCheck => {
            let n = sync_count(r, MAX_SYNC_ENTRIES, "entries")?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(SyncEntry {
                    name: r.name()?,
                    copy: r.addr()?,
                    version: r.u64()?,
                    deleted: flag(r, "sync deleted flag")?,
                });
            }
            Body::SyncCheck { entries }
        }
        Kind::SyncDigest => {
            let n = sync_count(r, MAX_SYNC_SUMS, "sums")?;
            let mut sums = Vec::with_capacity(n);
            for _ in 0..n {
                sums.push(SyncSum {
                    group: r.u32()?,
                    index: r.u8()?,
                    sum: r.u64()?,
                });
            }
            Body::SyncDigest { sums }
        }
        Kind::SyncDiff => {
            let n = sync_count(r, MAX_SYNC_SUMS, "pairs")?;
            let mut pairs = Vec::with_capacity(n);
            for _ in 0..n {
                pairs.push((r.u32()?, r.u8()?));
            }
            Body::SyncDiff { pairs }
        }
    })
}

/// Writes at most [`MAX_PULL_ROWS`] rows (the sender keeps pages smaller).
fn put_rows(w: &mut Writer, rows: &[Row]) {
    let n = rows.len().min(MAX_PULL_ROWS);
    w.u16(n as u16);
    for row in &rows[..n] {
        match row {
            Row::Record(r) => {
                w.u8(0);
                put_record(w, r);
            }
            Row::Tomb { name, version } => {
                w.u8(1);
                w.str(name);
                w.u64(*version);
            }
        }
    }
}

/// Appends zeros to `w` so that, with `suffix` more bytes (a seal), the
/// datagram is at least `pad_to` bytes long.
fn pad(w: &mut Writer, pad_to: usize, suffix: usize) {
    let len = w.buf.len() + suffix;
    if pad_to > len {
        w.buf.resize(w.buf.len() + (pad_to - len), 0);
    }
}

/// Reads a page of rows; a count above [`MAX_PULL_ROWS`] is refused before
/// anything is allocated.
fn get_rows(r: &mut Reader) -> Result<Vec<Row>, WireError> {
    let n = r.u16()? as usize;
    if n > MAX_PULL_ROWS {
        return Err(WireError::Invalid(format!(
            "{n} rows in one page; the limit is {MAX_PULL_ROWS}"
        )));
    }
    let mut rows = Vec::with_capacity(n);
    for _ in 0..n {
        rows.push(match r.u8()? {
            0 => Row::Record(get_record(r)?),
            1 => Row::Tomb {
                name: r.name()?,
                version: r.u64()?,
            },
            k => return Err(WireError::Invalid(format!("row kind {k}"))),
        });
    }
    Ok(rows)
}

fn put_cursor(w: &mut Writer, c: &GatherCursor) {
    w.u8(c.tombs as u8);
    w.u32(c.group);
    w.str(&c.after);
}

fn get_cursor(r: &mut Reader) -> Result<GatherCursor, WireError> {
    Ok(GatherCursor {
        tombs: flag(r, "gather tombstone flag")?,
        group: r.u32()?,
        after: r.str(MAX_NAME, "gather cursor")?,
    })
}

/// The count of an anti-entropy list, refused above `max` before
/// anything is allocated.
fn sync_count(r: &mut Reader, max: usize, what: &str) -> Result<usize, WireError> {
    let n = r.u16()? as usize;
    if n > max {
        return Err(WireError::Invalid(format!(
            "{n} sync {what} in one message; the limit is {max}"
        )));
    }
    Ok(n)
}

/// A boolean byte: 0 or 1, anything else refused.
fn flag(r: &mut Reader, what: &str) -> Result<bool, WireError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(WireError::Invalid(format!("{what} is {v}, not 0 or 1"))),
    }
}

/// The error reply to an undecodable datagram (with its request id when
/// the header got that far).
pub fn malformed(bytes: &[u8], e: &WireError) -> Msg {
    let req = bytes
        .get(4..12)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0);
    Msg::new(
        req,
        0,
        Body::Error {
            code: Code::BadRequest,
            message: format!("malformed message: {e}"),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(name: &str) -> Record {
        Record {
            name: name.into(),
            size: 306_000,
            crc: 0xdead_beef,
            version: 7,
            meta: vec![1, 2, 3],
            replicas: vec![u128::MAX, 5],
            rename: None,
        }
    }

    fn samples() -> Vec<Body> {
        vec![
            Body::PostBegin {
                name: "a/b".into(),
                size: 9,
            },
            Body::PostPlan {
                version: 3,
                size: 12,
                replicas: vec![1, 2],
                ticket: vec![7; 40],
            },
            Body::PostCommit {
                name: "x".into(),
                version: 1,
                crc: 2,
            },
            Body::PostAbort {
                name: "x".into(),
                version: 1,
            },
            Body::Update {
                record: Record {
                    rename: Some(RenameLink::To("elsewhere".into())),
                    ..record("u")
                },
                if_version: 9,
            },
            Body::Found {
                record: Record {
                    rename: Some(RenameLink::From("before".into())),
                    ..record("r")
                },
                ticket: vec![],
            },
            Body::Link {
                record: record("l"),
                proof: vec![],
            },
            Body::Link {
                record: record("l"),
                proof: vec![9; 60],
            },
            Body::GetLinkProof { name: "p".into() },
            Body::LinkProof {
                record: record("p"),
                proof: vec![8; 70],
            },
            Body::Get { name: "g".into() },
            Body::Refresh {
                name: "s".into(),
                version: 6,
                copy: u128::MAX,
            },
            Body::SyncCheck { entries: vec![] },
            Body::SyncCheck {
                entries: vec![
                    SyncEntry {
                        name: "a/b".into(),
                        copy: u128::MAX,
                        version: 3,
                        deleted: false,
                    },
                    SyncEntry {
                        name: "c".into(),
                        copy: 1,
                        version: u64::MAX,
                        deleted: true,
                    },
                ],
            },
            Body::SyncDigest {
                sums: vec![SyncSum {
                    group: u32::MAX,
                    index: 2,
                    sum: 0x1234_5678_9abc_def0,
                }],
            },
            Body::SyncDiff {
                pairs: vec![(0, 1), (u32::MAX, 255)],
            },
            Body::Found {
                record: record("f"),
                ticket: vec![1; MAX_TICKET],
            },
            Body::Delete {
                name: "d".into(),
                if_version: 4,
                keep_data: true,
            },
            Body::List {
                prefix: "".into(),
                after: "k".into(),
                limit: 100,
            },
            Body::ListPage {
                entries: vec![ListEntry {
                    name: "n".into(),
                    size: 1,
                    version: 2,
                }],
                more: true,
            },
            Body::Replicate {
                record: record("r"),
            },
            Body::Unreplicate {
                name: "u".into(),
                version: 9,
            },
            Body::Done { version: 5 },
            Body::Error {
                code: Code::Conflict,
                message: "busy".into(),
            },
            Body::GetTable,
            Body::Table {
                bytes: vec![1, 2, 3],
            },
            Body::Register {
                role: Role::Sn,
                uuid: 42,
                endpoint: "127.0.0.1:9000".parse().unwrap(),
                capacity: 10,
                free: 5,
                device: 1,
                keys: Some(Fingerprints {
                    active: 1,
                    other: Some(u64::MAX),
                }),
            },
            Body::Register {
                role: Role::Mn,
                uuid: 42,
                endpoint: "[::1]:9000".parse().unwrap(),
                capacity: 0,
                free: 0,
                device: 0,
                keys: None,
            },
            Body::Registered { index: 3 },
            Body::Heartbeat {
                uuid: 1,
                free: 2,
                objects: 3,
                keys: None,
            },
            Body::Heartbeat {
                uuid: 1,
                free: 2,
                objects: 3,
                keys: Some(Fingerprints {
                    active: 9,
                    other: None,
                }),
            },
            Body::Retire { uuid: 8 },
            Body::CancelRetire { uuid: u64::MAX },
            Body::RevokeTenant {
                tenant: "acme".into(),
                below: 3,
            },
            Body::Referenced {
                addrs: vec![1, u128::MAX],
            },
            Body::ReferencedBy { addrs: vec![] },
            Body::MgPull {
                group: 7,
                epoch: 0,
                tombs: false,
                after: "".into(),
            },
            Body::MgPull {
                group: u32::MAX,
                epoch: 99,
                tombs: true,
                after: "p/q".into(),
            },
            Body::MgRows {
                rows: vec![
                    Row::Record(record("a")),
                    Row::Tomb {
                        name: "b".into(),
                        version: 4,
                    },
                ],
                more: true,
            },
            Body::MgRows {
                rows: vec![],
                more: false,
            },
            Body::MoveReport {
                group: 3,
                to: 2,
                ready: true,
                epoch: 12,
            },
            Body::DrainReport {
                slot: 1,
                epoch: 40,
                drain: 38,
                index: 3,
                left: 7,
                copies: 2,
                unplaceable: 7,
            },
            Body::Error {
                code: Code::Moving,
                message: "moving".into(),
            },
            Body::MgGather {
                groups: vec![9],
                slot: 1,
                from: GatherCursor::default(),
            },
            Body::MgGather {
                groups: vec![0, 7, u32::MAX],
                slot: u16::MAX,
                from: GatherCursor {
                    tombs: true,
                    group: 200,
                    after: "a/b".into(),
                },
            },
            Body::MgGathered {
                rows: vec![
                    Row::Record(record("c")),
                    Row::Tomb {
                        name: "d".into(),
                        version: 7,
                    },
                ],
                next: Some(GatherCursor {
                    tombs: false,
                    group: 3,
                    after: "d".into(),
                }),
            },
            Body::MgGathered {
                rows: vec![],
                next: None,
            },
            Body::PutAbandoned { replica: 1 << 90 },
            Body::PadTo { size: 1200 },
        ]
    }

    #[test]
    fn every_kind_has_its_class_and_round_trips() {
        let samples = samples();
        for kind in Kind::all() {
            assert_eq!(Kind::from_number(kind as u8), Some(kind));
            let body = samples
                .iter()
                .find(|b| b.kind() == kind)
                .unwrap_or_else(|| panic!("samples() has no {kind:?}"));
            let bytes = Msg::new(3, 4, body.clone()).encode().unwrap();
            assert_eq!(peek(&bytes).unwrap().kind, kind as u8);
            assert_eq!(Msg::decode(&bytes).unwrap().body.kind(), kind);
            let class = kind.class();
            assert_eq!(is_client_request(kind as u8), class == Class::TenantRequest);
            assert_eq!(is_answer(kind as u8), class == Class::Answer);
            assert_eq!(is_control(kind as u8), class == Class::Control);
        }
        assert_eq!(Kind::all().count(), 39);
        for unknown in [0, 40, 63, 255] {
            assert_eq!(Kind::from_number(unknown), None);
            assert!(!is_client_request(unknown) && !is_answer(unknown) && !is_control(unknown));
        }
        // The classes as the gate's number lists had them before the
        // table: a kind moving class is a change of what the gate admits.
        let numbers = |class: Class| -> Vec<u8> {
            Kind::all()
                .filter(|k| k.class() == class)
                .map(|k| k as u8)
                .collect()
        };
        assert_eq!(numbers(Class::TenantRequest), [1, 3, 4, 5, 6, 8, 9, 21, 35]);
        assert_eq!(
            numbers(Class::Answer),
            [2, 7, 10, 13, 14, 16, 18, 23, 25, 28, 34, 36, 39]
        );
        assert_eq!(numbers(Class::Control), [20, 30]);
        assert_eq!(KIND_GET_TABLE, 15);
        assert_eq!(Kind::GetTable.class(), Class::Internal);
    }

    #[test]
    fn every_message_round_trips() {
        for body in samples() {
            let m = Msg::new(77, 0xabc, body);
            let bytes = m.encode().unwrap();
            assert_eq!(Msg::decode(&bytes).unwrap(), m);
            // Every strict prefix is rejected, never accepted or panicking
            // (a table's bytes are opaque here: the table decoder checks them).
            let header_only = matches!(m.body, Body::Table { .. });
            // Except a cut before an optional trailing field, which
            // decodes as the message without it (as an older node sent it).
            let mut older = m.clone();
            if let Body::Register { keys, .. } | Body::Heartbeat { keys, .. } = &mut older.body {
                *keys = None;
            }
            for cut in 0..if header_only { 28 } else { bytes.len() } {
                match Msg::decode(&bytes[..cut]) {
                    Ok(d) if older != m && d == older => {}
                    r => assert!(r.is_err(), "{m:?} cut at {cut}"),
                }
            }
        }
    }

    #[test]
    fn names_are_bounded() {
        assert!(check_name("").is_err());
        assert!(check_name(&"n".repeat(MAX_NAME)).is_ok());
        let long = "n".repeat(10_000);
        assert!(check_name(&long).unwrap_err().contains("10000 bytes"));
        // A 10,000-byte name on the wire is refused with the reason.
        let bytes = Msg::new(1, 0, Body::Get { name: long }).encode().unwrap();
        let err = Msg::decode(&bytes).unwrap_err();
        assert!(err.to_string().contains("limit is 4096"), "{err}");
        let bytes = Msg::new(1, 0, Body::Get { name: "".into() })
            .encode()
            .unwrap();
        assert!(Msg::decode(&bytes)
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }

    #[test]
    fn oversized_datagram_is_refused() {
        let big = vec![0u8; MAX_DATAGRAM + 1];
        assert_eq!(
            Msg::decode(&big),
            Err(WireError::TooLarge(MAX_DATAGRAM + 1))
        );
    }

    /// The decoding error of an empty page of `body` whose row count
    /// (just before its one-byte trailer) is made `count`.
    fn with_row_count(body: Body, count: u16) -> String {
        let mut bytes = Msg::new(1, 0, body).encode().unwrap();
        let at = bytes.len() - 3;
        bytes[at..at + 2].copy_from_slice(&count.to_be_bytes());
        Msg::decode(&bytes).unwrap_err().to_string()
    }

    #[test]
    fn handover_pages_are_bounded() {
        // A count above the limit is refused before anything is allocated.
        let body = Body::MgRows {
            rows: vec![],
            more: false,
        };
        let err = with_row_count(body, u16::MAX);
        assert!(err.contains("limit is 2048"), "{err}");
        // A flag other than 0 or 1, and an unknown row kind, are refused.
        let mut bytes = Msg::new(
            1,
            0,
            Body::MgRows {
                rows: vec![Row::Tomb {
                    name: "n".into(),
                    version: 1,
                }],
                more: false,
            },
        )
        .encode()
        .unwrap();
        let last = bytes.len() - 1;
        bytes[last] = 2;
        assert!(Msg::decode(&bytes)
            .unwrap_err()
            .to_string()
            .contains("more flag"));
        bytes[last] = 0;
        bytes[30] = 5;
        assert!(Msg::decode(&bytes)
            .unwrap_err()
            .to_string()
            .contains("row kind 5"));
        // A full page of the largest rows still fits one datagram only if the
        // sender trims it: encoding refuses an oversized one instead.
        let big = Record {
            name: "n".repeat(MAX_NAME),
            ..record("x")
        };
        let rows = vec![Row::Record(big); 20];
        assert!(matches!(
            Msg::new(1, 0, Body::MgRows { rows, more: true }).encode(),
            Err(WireError::TooLarge(_))
        ));
    }

    #[test]
    fn gather_pages_and_cursors_are_bounded() {
        // A row count above the limit is refused before any allocation.
        let body = Body::MgGathered {
            rows: vec![],
            next: None,
        };
        let err = with_row_count(body, u16::MAX);
        assert!(err.contains("limit is 2048"), "{err}");
        // A next-page flag or a tombstone flag other than 0 or 1.
        let mut bytes = Msg::new(
            1,
            0,
            Body::MgGathered {
                rows: vec![],
                next: None,
            },
        )
        .encode()
        .unwrap();
        let last = bytes.len() - 1;
        bytes[last] = 7;
        let err = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("next-page flag"), "{err}");
        let gather = |after: String| {
            Msg::new(
                1,
                0,
                Body::MgGather {
                    groups: vec![1],
                    slot: 0,
                    from: GatherCursor {
                        tombs: false,
                        group: 1,
                        after,
                    },
                },
            )
            .encode()
            .unwrap()
        };
        let mut bytes = gather("x".into());
        let at = bytes.len() - 1 - 2 - 4 - 1;
        bytes[at] = 3;
        let err = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("gather tombstone flag"), "{err}");
        // A cursor name longer than any object name is refused.
        let err = Msg::decode(&gather("n".repeat(MAX_NAME + 1)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("gather cursor"), "{err}");
        // A group count above the limit is refused before any allocation.
        let mut bytes = gather("x".into());
        bytes[28..30].copy_from_slice(&u16::MAX.to_be_bytes());
        let err = Msg::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("limit is 4096"), "{err}");
    }

    fn key(byte: u8) -> crate::key::ClusterKey {
        crate::key::ClusterKey::from_bytes(&[byte; crate::auth::KEY_LEN])
    }

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn sealed_messages_round_trip_and_check() {
        use crate::auth::{check_seal, AuthError};
        let k = key(1);
        for body in samples() {
            let m = Msg::new(77, 0xabc, body);
            let bytes = m.seal(&k, NOW).unwrap();
            assert_eq!(bytes.len(), m.encode().unwrap().len() + SEAL_LEN);
            assert_eq!(Msg::decode(&bytes).unwrap(), m, "a tenant reads it too");
            assert!(check_seal(&bytes, &k, NOW + 5).is_ok(), "{m:?}");
            assert!(peek(&bytes).unwrap().sealed);
            let plain = m.encode().unwrap();
            assert!(!peek(&plain).unwrap().sealed);
            assert_eq!(check_seal(&plain, &k, NOW), Err(AuthError::Unsealed));
        }
    }

    #[test]
    fn a_flipped_bit_a_wrong_key_a_stale_or_missing_tag_is_refused() {
        use crate::auth::{check_seal, AuthError, WINDOW_MS};
        let k = key(1);
        let m = Msg::new(
            9,
            3,
            Body::DrainReport {
                slot: 1,
                epoch: 40,
                drain: 38,
                index: 3,
                left: 0,
                copies: 0,
                unplaceable: 0,
            },
        );
        let good = m.seal(&k, NOW).unwrap();
        // Every bit, header and clock included, is covered by the tag.
        for i in 0..good.len() * 8 {
            let mut b = good.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(check_seal(&b, &k, NOW).is_err(), "bit {i} flipped");
        }
        assert_eq!(check_seal(&good, &key(2), NOW), Err(AuthError::BadTag));
        let late = NOW + WINDOW_MS + 1;
        assert_eq!(
            check_seal(&good, &k, late),
            Err(AuthError::Stale(WINDOW_MS + 1))
        );
        assert!(check_seal(&good, &k, NOW - WINDOW_MS).is_ok());
        // A tag cut short, or dropped with the flag left set.
        for cut in 1..=SEAL_LEN {
            let b = &good[..good.len() - cut];
            assert!(check_seal(b, &k, NOW).is_err(), "cut by {cut}");
        }
        // The flag cleared and the seal stripped: an unsealed message.
        let mut stripped = good[..good.len() - SEAL_LEN].to_vec();
        stripped[3] &= !SEALED;
        assert_eq!(check_seal(&stripped, &k, NOW), Err(AuthError::Unsealed));
        // A sealed flag on a message too short for a seal is refused.
        let mut short = Msg::new(1, 0, Body::GetTable).encode().unwrap();
        short[3] |= SEALED;
        assert!(Msg::decode(&short).is_err());
        assert_eq!(check_seal(&short, &k, NOW), Err(AuthError::Unsealed));
    }

    #[test]
    fn sync_lists_above_their_limits_are_refused() {
        let over = |kind: u8, max: usize| {
            let mut b = b"S6\x04".to_vec();
            b.push(kind);
            b.extend_from_slice(&[0; 24]);
            b.extend_from_slice(&((max + 1) as u16).to_be_bytes());
            b.extend_from_slice(&[0; 64]);
            Msg::decode(&b)
        };
        assert!(over(32, MAX_SYNC_ENTRIES).is_err());
        assert!(over(33, MAX_SYNC_SUMS).is_err());
        assert!(over(34, MAX_SYNC_SUMS).is_err());
        // A deleted flag other than 0 or 1 is refused.
        let m = Msg::new(
            1,
            2,
            Body::SyncCheck {
                entries: vec![SyncEntry {
                    name: "n".into(),
                    copy: 3,
                    version: 4,
                    deleted: true,
                }],
            },
        );
        let mut b = m.encode().unwrap();
        let last = b.len() - 1;
        b[last] = 2;
        assert!(Msg::decode(&b).is_err());
    }

    proptest! {
        #[test]
        fn sealed_messages_never_panic_or_pass_when_damaged(at in 0usize..400, byte in any::<u8>(), which in 0usize..40) {
            let all = samples();
            let m = Msg::new(5, 9, all[which % all.len()].clone());
            let k = key(7);
            let mut b = m.seal(&k, NOW).unwrap();
            let i = at % b.len();
            let changed = b[i] != byte;
            b[i] = byte;
            let _ = Msg::decode(&b);
            let checked = crate::auth::check_seal(&b, &k, NOW);
            prop_assert!(!changed || checked.is_err());
            for receiver in [crate::auth::Receiver::Mn, crate::auth::Receiver::On] {
                let mut gate = crate::auth::Gate::new(k.clone(), receiver);
                let _ = gate.admit(&b, NOW);
            }
        }

        #[test]
        fn a_gate_never_panics_nor_takes_unsealed_internal_kinds(bytes in proptest::collection::vec(any::<u8>(), 0..300), kind in 0u8..=255) {
            let mut b = b"S6\x04".to_vec();
            b.push(kind);
            b.extend_from_slice(&bytes);
            for receiver in [crate::auth::Receiver::Mn, crate::auth::Receiver::On] {
                let mut gate = crate::auth::Gate::new(key(3), receiver);
                for buf in [&b[..], &bytes[..]] {
                    if let crate::auth::Verdict::Accept { msg, sealed, .. } = gate.admit(buf, NOW) {
                        prop_assert!(!sealed, "a random datagram passed as sealed");
                        // Only the orchestrator's table request is taken
                        // without any seal; a metadata node takes nothing.
                        let k = msg.kind();
                        let open = receiver == crate::auth::Receiver::On && k == KIND_GET_TABLE;
                        prop_assert!(open, "unsealed kind {k} taken");
                    }
                }
            }
        }

        #[test]
        fn random_tenant_sealed_bytes_never_panic_nor_pass(
            kind in prop_oneof![Just(1u8), Just(3), Just(4), Just(5), Just(6), Just(8), Just(9), Just(21), 0u8..64],
            body in proptest::collection::vec(any::<u8>(), 0..200),
            id in "[a-z*]{0,8}",
            at_offset in 0u64..120_000,
            tag in proptest::collection::vec(any::<u8>(), 0..20),
        ) {
            // A well-formed header and trailer around random bytes, with
            // the tenant flag: a metadata node never takes it, whatever
            // the tenant it names.
            let mut b = b"S6\x04".to_vec();
            b.push(kind | TENANT);
            b.extend_from_slice(&[0; 24]);
            b.extend_from_slice(&body);
            b.extend_from_slice(id.as_bytes());
            b.push(id.len() as u8);
            b.extend_from_slice(&(NOW - 60_000 + at_offset).to_be_bytes());
            b.extend_from_slice(&tag);
            let _ = Msg::decode(&b);
            let _ = tenant_parts(&b);
            for receiver in [crate::auth::Receiver::Mn, crate::auth::Receiver::On] {
                let mut gate = crate::auth::Gate::new(key(3), receiver);
                let verdict = gate.admit(&b, NOW);
                let taken = matches!(verdict, crate::auth::Verdict::Accept { .. });
                prop_assert!(!taken, "random bytes passed a tenant's seal");
            }
        }

        #[test]
        fn tenant_sealed_requests_never_pass_when_damaged(at in 0usize..200, byte in any::<u8>(), which in 0usize..40) {
            let cred = crate::tenant::TenantCredential::issue(&key(7), crate::tenant::ADMIN).unwrap();
            // A tenant's Link is taken only with a genuine link proof.
            let proved = Body::Link {
                record: record("l"),
                proof: crate::auth::LinkProof::of(&record("l"), NOW + 1)
                    .seal(&key(7), crate::tenant::ADMIN),
            };
            let all: Vec<Body> = samples()
                .into_iter()
                .filter(|b| is_client_request(Msg::new(0, 0, b.clone()).kind()))
                .filter(|b| !matches!(b, Body::Link { .. }))
                .chain([proved])
                .collect();
            let m = Msg::new(5, 9, all[which % all.len()].clone());
            let mut b = m.seal_tenant(&cred, NOW).unwrap();
            let i = at % b.len();
            let changed = b[i] != byte;
            b[i] = byte;
            let _ = Msg::decode(&b);
            let mut gate = crate::auth::Gate::new(key(7), crate::auth::Receiver::Mn);
            let taken = matches!(gate.admit(&b, NOW), crate::auth::Verdict::Accept { .. });
            prop_assert!(!changed || !taken, "a damaged tenant request passed");
            prop_assert!(changed || taken, "an intact tenant request was refused");
        }

        #[test]
        fn gather_messages_never_panic_when_damaged(at in 0usize..200, byte in any::<u8>()) {
            let msg = Msg::new(
                5,
                9,
                Body::MgGathered {
                    rows: vec![Row::Record(record("c")), Row::Tomb { name: "d".into(), version: 7 }],
                    next: Some(GatherCursor { tombs: true, group: 3, after: "d".into() }),
                },
            );
            let mut b = msg.encode().unwrap();
            let i = at % b.len();
            b[i] = byte;
            let _ = Msg::decode(&b);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Msg::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_after_a_valid_header(kind in 0u8..40, rest in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut bytes = b"S6\x04".to_vec();
            bytes.push(kind);
            bytes.extend_from_slice(&[0; 24]);
            bytes.extend_from_slice(&rest);
            let _ = Msg::decode(&bytes);
        }
    }
}
