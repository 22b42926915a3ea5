//! The one table of message kinds: every kind with its number and its
//! class (who sends it). Encoding ([`Body::kind`]), decoding
//! ([`Kind::from_number`]) and the gate ([`is_client_request`] and the
//! others) all read it.

use super::body::Body;

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
    /// [`Body::DamagedReplicas`].
    DamagedReplicas = 40,
    /// [`Body::BadReplica`].
    BadReplica = 41,
    /// [`Body::PostInline`].
    PostInline = 42,
    /// [`Body::GetRepairCounts`].
    GetRepairCounts = 43,
    /// [`Body::RepairCounts`].
    RepairCounts = 44,
}

/// The one table of message kinds: each kind, in number order, with its
/// class. Encoding, decoding and the gate all read it.
const KINDS: [(Kind, Class); 44] = [
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
    (Kind::DamagedReplicas, Class::Internal),
    (Kind::BadReplica, Class::TenantRequest),
    (Kind::PostInline, Class::TenantRequest),
    (Kind::GetRepairCounts, Class::Internal),
    (Kind::RepairCounts, Class::Answer),
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
            Body::DamagedReplicas { .. } => Kind::DamagedReplicas,
            Body::BadReplica { .. } => Kind::BadReplica,
            Body::PostInline { .. } => Kind::PostInline,
            Body::GetRepairCounts => Kind::GetRepairCounts,
            Body::RepairCounts(_) => Kind::RepairCounts,
        }
    }
}
