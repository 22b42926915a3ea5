//! The messages themselves: [`Msg`], its [`Body`] and the records, rows
//! and entries bodies carry, with the bounds on each list.

use super::frame::{HEADER_LEN, SEAL_LEN};
use crate::addr::Addr;
use crate::class::StorageClass;
use crate::error::Code;
use crate::key::Fingerprints;
use std::net::SocketAddr;

pub use crate::class::{MAX_DATA_REPLICAS, MAX_INLINE};

/// Largest object the store accepts (1 TiB).
pub const MAX_OBJECT: u64 = 1 << 40;

/// Longest ticket a `PostPlan` or `Found` carries ([`crate::auth::Ticket`]),
/// and longest link proof a `Link` or `LinkProof` carries
/// ([`crate::auth::LinkProof`]).
pub const MAX_TICKET: usize = 512;

/// Longest attributes a record carries: opaque bytes its writer stores
/// with the object (the S3 gateway keeps an object's ETag, content type
/// and user metadata there). Bounded so a record fits one datagram and
/// the metadata node's read cache stays small.
pub const MAX_ATTRIBUTES: usize = 2048;

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
    /// Opaque bytes the Post stored with the object (at most
    /// [`MAX_ATTRIBUTES`]); kept by renames and repairs.
    pub attributes: Vec<u8>,
    /// For an erasure-coded object, its fragments' coding and checksums:
    /// `replicas[i]` then holds fragment `i`. `None` for replicas.
    pub fragments: Option<Fragments>,
    /// The object's bytes, for an object kept inside its record (at most
    /// [`MAX_INLINE`], no replicas, and `crc` their CRC-32C: checked
    /// whenever the record is decoded). `None` for an object on storage
    /// nodes, and for an empty one, whose record alone says all of it.
    pub inline: Option<Vec<u8>>,
}

impl Record {
    /// Whether the record holds all of its object: an empty object, or
    /// one kept inline. Such a record names no replica, so repair,
    /// drains and scrubs have nothing to do for it, and a Get reads no
    /// storage node.
    pub fn holds_its_data(&self) -> bool {
        self.replicas.is_empty() && (self.size == 0 || self.inline.is_some())
    }
}

/// An erasure-coded object's fragments, beside [`Record::replicas`]
/// (fragment `i` at `replicas[i]`; the first `data` are the data
/// fragments, the rest parity). The layout of each follows from the
/// object's size ([`crate::class::StripeLayout`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fragments {
    /// Data fragments (k): any `data` fragments give the object back.
    pub data: u8,
    /// CRC-32C of each fragment, by index: checked end to end before a
    /// fragment is decoded.
    pub crcs: Vec<u32>,
}

impl Fragments {
    /// Parity fragments (m).
    pub fn parity(&self) -> u8 {
        (self.crcs.len() as u8).saturating_sub(self.data)
    }
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

// The largest record (a name and a rename link of the longest, the
// largest attributes and inline bytes, every address) in a `Found` with
// the longest ticket, sealed, fits one datagram; so does a handover page,
// which holds at least one row.
const _: () = assert!(
    HEADER_LEN
        + 2 * (2 + crate::codec::MAX_NAME)
        + 8
        + 4
        + 8
        + 1
        + 2 * (2 + 16 * MAX_DATA_REPLICAS)
        + 2
        + MAX_ATTRIBUTES
        + 2
        + MAX_DATA_REPLICAS * 4
        + 1
        + 2
        + MAX_INLINE
        + 2
        + MAX_TICKET
        + SEAL_LEN
        <= crate::codec::MAX_DATAGRAM
);

/// One listed object (an inline object's bytes are not listed: a
/// listing's page holds names, not data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntry {
    /// The object name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Version.
    pub version: u64,
    /// CRC-32C of the whole object.
    pub crc: u32,
    /// The record's attributes ([`Record::attributes`]), so a listing
    /// needs no Get per name.
    pub attributes: Vec<u8>,
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
        /// The storage class of this object, if not its bucket's.
        class: Option<StorageClass>,
    },
    /// Coordinator → client: where to stream the data.
    PostPlan {
        /// Version this Post will create.
        version: u64,
        /// The size the Post announced (its ticket binds it).
        size: u64,
        /// Replica addresses, first one first; for an erasure-coded
        /// object, fragment `i` goes to `replicas[i]`.
        replicas: Vec<Addr>,
        /// The Put ticket for those replicas ([`crate::auth::Ticket`]),
        /// filled in by the node's runtime; empty when none was issued.
        ticket: Vec<u8>,
        /// Data fragments (k) of an erasure-coded object, whose parity
        /// fragments are the rest of `replicas`; 0 for replicas.
        data_fragments: u8,
    },
    /// Client → coordinator: data is durable on W_d replicas; commit.
    PostCommit {
        /// Object name.
        name: String,
        /// Version from the plan.
        version: u64,
        /// CRC-32C of the data.
        crc: u32,
        /// The record's attributes (at most [`MAX_ATTRIBUTES`]), known
        /// only once the data has streamed.
        attributes: Vec<u8>,
        /// The CRC-32C of each fragment of an erasure-coded object, by
        /// index (empty for replicas).
        fragment_crcs: Vec<u32>,
    },
    /// Client → coordinator: Post a small object in one request, its
    /// bytes kept inside its record ([`Record::inline`]): an empty one
    /// always, one of at most [`MAX_INLINE`] bytes if its class allows
    /// ([`crate::class::StorageClass::may_inline`]; refused otherwise).
    /// There is no data phase to plan: the coordinator begins and
    /// commits at once, and answers as it answers a [`Body::PostCommit`]
    /// (once the record is durable on W_m metadata copies).
    PostInline {
        /// Object name.
        name: String,
        /// The storage class of this object, if not its bucket's (it
        /// decides whether the object may be inlined).
        class: Option<StorageClass>,
        /// CRC-32C of `data`, checked on decoding.
        crc: u32,
        /// The object's bytes (at most [`MAX_INLINE`]).
        data: Vec<u8>,
        /// The record's attributes (at most [`MAX_ATTRIBUTES`]).
        attributes: Vec<u8>,
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
        /// The record: an inline object's bytes with it.
        record: Record,
        /// The Get ticket for its replicas ([`crate::auth::Ticket`]),
        /// filled in by the node's runtime; empty for an empty or inline
        /// object (no storage node is asked) or when none was issued.
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
    /// Storage node → every metadata node: these replicas of the node
    /// failed a re-read (bad header, wrong length or CRC-32C mismatch) in
    /// its scrub. A metadata node repairs each record it coordinates that
    /// names one: a new copy from a replica that verifies, then the record
    /// drops the damaged address and the replica is freed. Addresses no
    /// record names are ignored. Sealed with the cluster key; answered
    /// `Done` with the number of addresses taken (at most
    /// [`MAX_DAMAGED`]).
    DamagedReplicas {
        /// The damaged replica addresses (at most [`MAX_DAMAGED`]).
        addrs: Vec<Addr>,
    },
    /// Tenant → the coordinator address of `name`: reading `replica` of
    /// `name` gave bytes that failed the record's CRC-32C (or the node
    /// refused it as damaged), and another replica served the object. The
    /// coordinator treats it like a storage node's report: a copy from a
    /// replica that verifies first, so a wrong report loses nothing.
    /// Answered `Done` (version 0 when ignored: no record, or a record
    /// that does not name `replica`).
    BadReplica {
        /// Object name.
        name: String,
        /// The replica that failed.
        replica: Addr,
    },
    /// Operator → metadata node, sealed with the cluster key: what has
    /// your repair done since you started? Answered
    /// [`Body::RepairCounts`] (`strata store status`).
    GetRepairCounts,
    /// Metadata node → operator: its repair counters since it started.
    RepairCounts(RepairCounts),
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

/// A metadata node's repair since it started: copies of replicas and
/// rebuilds of erasure-coded fragments started, committed and failed,
/// and what is under way now (its `/metrics`, and `strata store status`
/// through [`Body::RepairCounts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RepairCounts {
    /// Replica copies started.
    pub copies_started: u64,
    /// Fragment rebuilds started.
    pub rebuilds_started: u64,
    /// Copies and rebuilds committed into their record.
    pub committed: u64,
    /// Copies and rebuilds that failed or were overtaken (their new
    /// replicas freed).
    pub failed: u64,
    /// Copies and rebuilds under way now.
    pub in_flight: u64,
    /// Replica addresses reported damaged and not repaired yet.
    pub damaged_waiting: u64,
}

/// Most addresses one `Referenced` message carries.
pub const MAX_REFERENCED: usize = 2048;

/// Most addresses one [`Body::DamagedReplicas`] report carries: a
/// storage node batches its scrub's findings in reports of at most this
/// many, and a metadata node never takes more from one datagram.
pub const MAX_DAMAGED: usize = 256;

// A full report (a u16 count, 16 bytes an address) with its header and
// seal fits one datagram.
const _: () = assert!(HEADER_LEN + 2 + MAX_DAMAGED * 16 + SEAL_LEN <= crate::codec::MAX_DATAGRAM);

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
}
