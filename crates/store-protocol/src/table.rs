//! The prefix table the orchestrator publishes: layout, replication
//! parameters, which metadata node owns which metadata group, and every
//! storage node with its prefix, capacity, device type and state.
//!
//! It also says how a metadata or replica address becomes a socket
//! address, the one place where the two network modes differ:
//! - *mapped*: the address is looked up in the table and the message goes to
//!   the owning node's endpoint (loopback, or any host without routing
//!   control); the address itself travels in the message;
//! - *routed*: the message goes to the address itself, at the owning node's
//!   port, and the network's routes for each node's prefix deliver it.

use crate::addr::{Addr, Layout, MAX_META_REPLICAS};
use crate::class::StorageClass;
use crate::wire::{Fingerprints, Reader, WireError, Writer, MAX_DATA_REPLICAS};
use std::net::{Ipv6Addr, SocketAddr};

mod invariants;
pub use invariants::{ensure, InvariantError};

/// Replication parameters: (N, W, 1) for metadata and for data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Metadata replicas.
    pub n_m: u8,
    /// Metadata acknowledgements before a write is acknowledged.
    pub w_m: u8,
    /// Data replicas.
    pub n_d: u8,
    /// Data acknowledgements before a write is acknowledged.
    pub w_d: u8,
    /// Data fragments (k) when the data is erasure-coded: `ec(k, N_d -
    /// k)`, W_d being the fragments that must be durable (at least k);
    /// 0 when it is kept as N_d replicas.
    pub data_fragments: u8,
}

impl Params {
    /// Checks 1 ≤ W ≤ N ≤ 16, and for an erasure-coded class its bounds
    /// ([`StorageClass::validate`]) and k ≤ W_d.
    pub fn validate(&self) -> Result<(), String> {
        let ok = |n: u8, w: u8, max: usize| w >= 1 && w <= n && (n as usize) <= max;
        if !ok(self.n_m, self.w_m, MAX_META_REPLICAS) || !ok(self.n_d, self.w_d, MAX_DATA_REPLICAS)
        {
            return Err(format!(
                "replication N_m={} W_m={} N_d={} W_d={} is invalid: need 1 <= W <= N <= 16",
                self.n_m, self.w_m, self.n_d, self.w_d
            ));
        }
        if self.data_fragments > 0 {
            self.class().validate()?;
            if self.w_d < self.data_fragments {
                return Err(format!(
                    "{} with W_d={} is invalid: at least the {} data fragments must be \
                     durable before a Post is acknowledged",
                    self.class(),
                    self.w_d,
                    self.data_fragments
                ));
            }
        }
        Ok(())
    }

    /// The data's storage class.
    pub fn class(&self) -> StorageClass {
        StorageClass::from_counts(self.n_d, self.data_fragments)
    }

    /// Whether an object of `size` bytes kept as these parameters say is
    /// stored inside its record on the N_m metadata copies
    /// ([`StorageClass::may_inline`]: at most
    /// [`crate::class::MAX_INLINE`] bytes, and enough copies to keep the
    /// class's redundancy).
    pub fn inlines(&self, size: u64) -> bool {
        self.class().may_inline(size, self.n_m)
    }

    /// These parameters with the data kept in `class` instead: N_d its
    /// nodes, and W_d all of them for erasure coding (a fragment fewer
    /// is a failure fewer to survive) or the same quorum, at most N_d,
    /// for replicas.
    pub fn with_class(self, class: StorageClass) -> Params {
        let n_d = class.nodes();
        Params {
            n_d,
            w_d: match class {
                StorageClass::Replicated { .. } => self.w_d.min(n_d).max(1),
                StorageClass::ErasureCoded { .. } => n_d,
            },
            data_fragments: class.data_fragments(),
            ..self
        }
    }
}

impl Default for Params {
    fn default() -> Self {
        Params {
            n_m: 1,
            w_m: 1,
            n_d: 1,
            w_d: 1,
            data_fragments: 0,
        }
    }
}

/// Device types a storage node may declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// Solid-state: preferred for small objects.
    Ssd = 0,
    /// Rotating disk: preferred for large objects.
    Hdd = 1,
}

impl Device {
    /// From its wire value.
    pub fn from_u8(v: u8) -> Device {
        if v == 1 {
            Device::Hdd
        } else {
            Device::Ssd
        }
    }
    /// Lower-case name.
    pub fn name(&self) -> &'static str {
        match self {
            Device::Ssd => "ssd",
            Device::Hdd => "hdd",
        }
    }
}

/// Node states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Serving.
    Up = 0,
    /// Missed heartbeats for longer than the short-failure timer.
    Down = 1,
    /// Retired by an operator.
    Retired = 2,
    /// Silent for longer than the definitive-failure timer: its replicas
    /// are being re-created elsewhere (a node that comes back is up again,
    /// but the replicas it held are no longer referenced).
    Dead = 3,
}

impl State {
    /// From its wire value; an unknown one is refused (read leniently, a
    /// damaged byte could retire a node or bring a dead one back).
    fn from_u8(v: u8) -> Result<State, WireError> {
        Ok(match v {
            0 => State::Up,
            1 => State::Down,
            2 => State::Retired,
            3 => State::Dead,
            _ => return Err(WireError::Invalid(format!("node state {v}"))),
        })
    }
    /// Lower-case name.
    pub fn name(&self) -> &'static str {
        match self {
            State::Up => "up",
            State::Down => "down",
            State::Retired => "retired",
            State::Dead => "dead",
        }
    }
}

/// A metadata node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MnEntry {
    /// Persistent identity.
    pub uuid: u64,
    /// Slot (metadata groups are assigned to slots).
    pub slot: u16,
    /// UDP endpoint.
    pub endpoint: SocketAddr,
    /// State.
    pub state: State,
}

/// A storage node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnEntry {
    /// Persistent identity.
    pub uuid: u64,
    /// Prefix index (the node owns `Layout::sn_prefix(index)`).
    pub index: u16,
    /// TCP endpoint.
    pub endpoint: SocketAddr,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Free bytes at the last heartbeat.
    pub free: u64,
    /// Replicas held at the last heartbeat.
    pub objects: u64,
    /// Device type.
    pub device: Device,
    /// State.
    pub state: State,
}

/// Where a metadata group's handover to a new owner stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MovePhase {
    /// The new owner copies the group's rows; the old owner serves everything.
    Copying = 0,
    /// The first copy is done; the orchestrator will freeze the group when
    /// few enough others are frozen (a frozen group refuses new changes).
    Copied = 1,
    /// The old owner refuses new changes of the group; once nothing is in
    /// flight there, the new owner takes the final copy and the
    /// orchestrator gives it the group.
    Frozen = 2,
    /// The previous owner is dead: the new owner (already named in
    /// `mg_owner`) gathers the group's rows from every live metadata node
    /// and refuses changes and Gets of it until the orchestrator has its
    /// ready report. `frozen_epoch` holds the epoch the restore started at.
    Restoring = 3,
}

/// A metadata group being handed over to another metadata node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// The group.
    pub group: u32,
    /// The slot taking it over.
    pub to: u16,
    /// Where the handover stands.
    pub phase: MovePhase,
    /// The table epoch at which the group was frozen (0 unless frozen):
    /// the old owner seals the group for that freeze only, so a final copy
    /// taken under an earlier freeze that was called off never counts.
    /// For a restore, the epoch it started at: a ready report must name it,
    /// so a report from a restore that was reassigned never counts.
    pub frozen_epoch: u64,
}

/// A metadata group standing in for its home: its home metadata node is
/// down (not dead), so another node owns it meanwhile, and gets it back
/// through a handover when the home node is up again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandIn {
    /// The group.
    pub group: u32,
    /// The slot it goes back to (never its current owner).
    pub home: u16,
}

/// A storage node being drained before retirement (`strata store node
/// remove`): no new object is placed on it, the metadata nodes' repair
/// re-places each replica it holds on another node, and once every
/// metadata node owning groups reports that none of its rows names it any
/// more, the orchestrator marks it [`State::Retired`]. Its liveness state
/// stays in [`SnEntry::state`]: a draining node may also be down or dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drain {
    /// Prefix index of the storage node.
    pub index: u16,
    /// The table epoch the drain started at: a metadata node's report
    /// counts only for a scan that started with a table at least as new.
    pub since: u64,
    /// Records (coordinator rows) still naming a replica on the node,
    /// summed over the latest reports (before the first, the node's
    /// replica count at its last heartbeat).
    pub left: u64,
    /// Metadata copies (non-coordinator rows) still naming it: they are
    /// updated when the repaired record is replicated to them.
    pub copies: u64,
    /// Of `left`, records no other storage node has room or a place for:
    /// the drain waits for capacity.
    pub unplaceable: u64,
    /// Metadata nodes owning groups whose report for the current group
    /// layout has not come yet (the drain waits for them).
    pub unreported: u16,
}

/// Version of the optional trailing section of the encoded table that
/// holds the keyring fingerprints of the orchestrator and of each node
/// (tables stored before it existed end after the drains and decode with
/// none).
const KEYS_SECTION: u8 = 1;

/// Version of the optional trailing section of the encoded table that
/// lists tenants' minimum credential generations (tables stored before
/// it existed end after the fingerprints and decode with none; a table
/// with revocations always writes the fingerprint section, maybe empty,
/// before it).
const REVOKED_SECTION: u8 = 1;

/// Version of the optional trailing section of the encoded table that
/// gives the data fragments of the cluster's and each bucket's
/// parameters ([`Params::data_fragments`]): written only when one is
/// erasure-coded (always after the fingerprint and revocation sections,
/// maybe empty); a table without it keeps every class replicated.
const CLASSES_SECTION: u8 = 1;

/// Most tenants the revocation list holds: 12 bytes each, so at most
/// 24 KiB of the table's datagram ([`crate::wire::MAX_DATAGRAM`]).
pub const MAX_REVOKED_TENANTS: usize = 2048;

// The revocation list never takes more than its 24 KiB share of the
// table's datagram.
const _: () = assert!(MAX_REVOKED_TENANTS * 12 <= 24 * 1024);

/// Version of the optional trailing section of the encoded table that
/// lists storage nodes being drained (tables stored before it existed end
/// after the stand-ins and decode with none).
const DRAINS_SECTION: u8 = 1;

/// Version of the optional trailing section of the encoded table that
/// lists groups standing in for a down metadata node (tables stored
/// before it existed end after the handovers and decode with none).
const STAND_INS_SECTION: u8 = 1;

/// Version of the optional trailing section of the encoded table that
/// lists handovers (tables stored before it existed end after the storage
/// nodes and decode with no handover).
const MOVES_SECTION: u8 = 1;

/// The prefix table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Bumped on every change.
    pub epoch: u64,
    /// Address layout.
    pub layout: Layout,
    /// Routed mode: send to object and metadata addresses themselves.
    pub routed: bool,
    /// Cluster-wide replication.
    pub params: Params,
    /// Per-bucket overrides (bucket = name up to the first '/').
    pub buckets: Vec<(String, Params)>,
    /// Metadata nodes.
    pub mns: Vec<MnEntry>,
    /// Owner slot of each metadata group.
    pub mg_owner: Vec<u16>,
    /// Storage nodes.
    pub sns: Vec<SnEntry>,
    /// Metadata groups being handed over (at most one entry per group).
    pub moves: Vec<Move>,
    /// Metadata groups standing in for a down node (at most one entry per
    /// group).
    pub stand_ins: Vec<StandIn>,
    /// Storage nodes being drained before retirement (at most one entry
    /// per node).
    pub drains: Vec<Drain>,
    /// The keyring fingerprints each node (by identity) last reported in
    /// its registration or heartbeat, sorted by identity; a node of an
    /// older build reports none. Not kept across an orchestrator restart.
    pub keys: Vec<(u64, Fingerprints)>,
    /// The orchestrator's own keyring fingerprints, if it published them.
    pub on_keys: Option<Fingerprints>,
    /// Per tenant that has had a credential revoked, by
    /// [`crate::tenant::tenant_id_hash`], the lowest credential generation
    /// still valid (at least 1), sorted by hash without repeats; at most
    /// [`MAX_REVOKED_TENANTS`]. A tenant not listed has minimum 0. Kept
    /// across orchestrator restarts (stored with the table).
    pub revoked: Vec<(u64, u32)>,
}

impl Table {
    /// A table of epoch 1 with this layout and replication, no bucket and
    /// no node yet, in mapped mode: what a new cluster starts from.
    pub fn new(layout: Layout, params: Params) -> Table {
        Table {
            epoch: 1,
            layout,
            routed: false,
            params,
            buckets: Vec::new(),
            mns: Vec::new(),
            mg_owner: Vec::new(),
            sns: Vec::new(),
            moves: Vec::new(),
            stand_ins: Vec::new(),
            drains: Vec::new(),
            keys: Vec::new(),
            on_keys: None,
            revoked: Vec::new(),
        }
    }

    /// Replication parameters for `name` (its bucket's, or the cluster's).
    pub fn params_for(&self, name: &str) -> Params {
        let bucket = name.split('/').next().unwrap_or("");
        self.buckets
            .iter()
            .find(|(b, _)| name.contains('/') && b == bucket)
            .map(|(_, p)| *p)
            .unwrap_or(self.params)
    }

    /// The metadata addresses of `name`, coordinator first.
    pub fn meta_addrs(&self, name: &str) -> Vec<Addr> {
        self.layout
            .meta_addrs(name.as_bytes(), self.params_for(name).n_m as usize)
    }

    /// The metadata node owning metadata address `addr`.
    pub fn mn_for(&self, addr: Addr) -> Option<&MnEntry> {
        let mg = self.layout.mg_of(addr)? as usize;
        let slot = *self.mg_owner.get(mg)?;
        self.mns.iter().find(|m| m.slot == slot)
    }

    /// The handover of group `mg`, if one is under way.
    pub fn move_of(&self, mg: u32) -> Option<&Move> {
        self.moves.iter().find(|m| m.group == mg)
    }

    /// The home slot of group `mg`, if it stands in for a down node.
    pub fn home_of(&self, mg: u32) -> Option<u16> {
        self.stand_ins
            .iter()
            .find(|s| s.group == mg)
            .map(|s| s.home)
    }

    /// Whether group `mg` is being restored (its previous owner is dead).
    pub fn restoring(&self, mg: u32) -> bool {
        self.move_of(mg)
            .is_some_and(|m| m.phase == MovePhase::Restoring)
    }

    /// The metadata nodes a storage node's collection round must ask: all
    /// but the dead ones that own no group and take none over (their rows
    /// were restored elsewhere, and a dead node never answers).
    pub fn gc_mns(&self) -> impl Iterator<Item = &MnEntry> {
        self.mns.iter().filter(|m| {
            m.state != State::Dead
                || self.groups_of(m.slot) > 0
                || self.moves.iter().any(|mv| mv.to == m.slot)
        })
    }

    /// Number of groups slot `slot` owns.
    pub fn groups_of(&self, slot: u16) -> usize {
        self.mg_owner.iter().filter(|&&s| s == slot).count()
    }

    /// The drain of the storage node with prefix index `index`, if it is
    /// being retired.
    pub fn drain_of(&self, index: u16) -> Option<&Drain> {
        self.drains.iter().find(|d| d.index == index)
    }

    /// Whether the storage node with prefix index `index` is being
    /// drained: it takes no new replica, and a replica on it does not
    /// count toward N_d.
    pub fn retiring(&self, index: u16) -> bool {
        self.drain_of(index).is_some()
    }

    /// The largest N_d of the cluster and its bucket overrides.
    pub fn max_n_d(&self) -> u8 {
        self.buckets
            .iter()
            .map(|(_, p)| p.n_d)
            .chain([self.params.n_d])
            .max()
            .unwrap_or(1)
    }

    /// The storage node owning replica address `addr`.
    pub fn sn_for(&self, addr: Addr) -> Option<&SnEntry> {
        let index = self.layout.sn_of(addr)?;
        self.sns.iter().find(|s| s.index == index)
    }

    /// Where to send a metadata message for `addr`: the owning metadata
    /// node's endpoint (mapped), or `addr` at that node's port (routed).
    pub fn mn_endpoint(&self, addr: Addr) -> Option<SocketAddr> {
        self.mn_for(addr)
            .map(|m| self.endpoint_for(addr, m.endpoint))
    }

    /// Where to connect for replica address `addr`: the owning storage
    /// node's endpoint (mapped), or `addr` at that node's port (routed).
    pub fn sn_endpoint(&self, addr: Addr) -> Option<SocketAddr> {
        self.sn_for(addr)
            .map(|s| self.endpoint_for(addr, s.endpoint))
    }

    fn endpoint_for(&self, addr: Addr, node: SocketAddr) -> SocketAddr {
        if self.routed {
            SocketAddr::new(Ipv6Addr::from(addr).into(), node.port())
        } else {
            node
        }
    }

    /// Encodes the table.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.epoch);
        w.addr(self.layout.cluster);
        w.u8(self.layout.mg_bits);
        w.u8(u8::from(self.routed));
        put_params(&mut w, &self.params);
        w.u16(self.buckets.len() as u16);
        for (b, p) in &self.buckets {
            w.str(b);
            put_params(&mut w, p);
        }
        w.u16(self.mns.len() as u16);
        for m in &self.mns {
            w.u64(m.uuid);
            w.u16(m.slot);
            w.sockaddr(m.endpoint);
            w.u8(m.state as u8);
        }
        for &o in &self.mg_owner {
            w.u16(o);
        }
        w.u16(self.sns.len() as u16);
        for s in &self.sns {
            w.u64(s.uuid);
            w.u16(s.index);
            w.sockaddr(s.endpoint);
            w.u64(s.capacity);
            w.u64(s.free);
            w.u64(s.objects);
            w.u8(s.device as u8);
            w.u8(s.state as u8);
        }
        w.u8(MOVES_SECTION);
        w.u32(self.moves.len() as u32);
        for m in &self.moves {
            w.u32(m.group);
            w.u16(m.to);
            w.u8(m.phase as u8);
            w.u64(m.frozen_epoch);
        }
        w.u8(STAND_INS_SECTION);
        w.u32(self.stand_ins.len() as u32);
        for s in &self.stand_ins {
            w.u32(s.group);
            w.u16(s.home);
        }
        w.u8(DRAINS_SECTION);
        w.u32(self.drains.len() as u32);
        for d in &self.drains {
            w.u16(d.index);
            w.u64(d.since);
            w.u64(d.left);
            w.u64(d.copies);
            w.u64(d.unplaceable);
            w.u16(d.unreported);
        }
        let coded = std::iter::once(&self.params)
            .chain(self.buckets.iter().map(|(_, p)| p))
            .any(|p| p.data_fragments > 0);
        // Left out when empty (it decodes the same), unless revocations
        // or classes follow it.
        if self.on_keys.is_some() || !self.keys.is_empty() || !self.revoked.is_empty() || coded {
            w.u8(KEYS_SECTION);
            match &self.on_keys {
                Some(k) => {
                    w.u8(1);
                    w.prints(k);
                }
                None => w.u8(0),
            }
            let n = self.keys.len().min(u16::MAX as usize);
            w.u16(n as u16);
            for (uuid, k) in &self.keys[..n] {
                w.u64(*uuid);
                w.prints(k);
            }
        }
        if !self.revoked.is_empty() || coded {
            w.u8(REVOKED_SECTION);
            let n = self.revoked.len().min(MAX_REVOKED_TENANTS);
            w.u32(n as u32);
            for (hash, min) in &self.revoked[..n] {
                w.u64(*hash);
                w.u32(*min);
            }
        }
        if coded {
            w.u8(CLASSES_SECTION);
            w.u8(self.params.data_fragments);
            for (_, p) in &self.buckets {
                w.u8(p.data_fragments);
            }
        }
        w.buf
    }

    /// Decodes a table.
    pub fn decode(buf: &[u8]) -> Result<Table, WireError> {
        let mut r = Reader::new(buf);
        let epoch = r.u64()?;
        let cluster = r.addr()?;
        let mg_bits = r.u8()?;
        if !(4..=crate::addr::MAX_MG_BITS).contains(&mg_bits) {
            return Err(WireError::Invalid(format!("{mg_bits} metadata-group bits")));
        }
        let layout = Layout::new(cluster, mg_bits);
        let routed = match r.u8()? {
            0 => false,
            1 => true,
            m => return Err(WireError::Invalid(format!("network mode {m}"))),
        };
        let params = get_params(&mut r)?;
        let n = r.u16()? as usize;
        let mut buckets = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            buckets.push((r.str(255, "bucket name")?, get_params(&mut r)?));
        }
        let n = r.u16()? as usize;
        let mut mns = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            mns.push(MnEntry {
                uuid: r.u64()?,
                slot: r.u16()?,
                endpoint: r.sockaddr()?,
                state: State::from_u8(r.u8()?)?,
            });
        }
        let mg_owner = (0..layout.mg_count())
            .map(|_| r.u16())
            .collect::<Result<Vec<_>, _>>()?;
        let n = r.u16()? as usize;
        let mut sns = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            sns.push(SnEntry {
                uuid: r.u64()?,
                index: r.u16()?,
                endpoint: r.sockaddr()?,
                capacity: r.u64()?,
                free: r.u64()?,
                objects: r.u64()?,
                device: Device::from_u8(r.u8()?),
                state: State::from_u8(r.u8()?)?,
            });
        }
        let moves = if r.remaining() == 0 {
            // Written before handovers existed.
            Vec::new()
        } else {
            get_moves(&mut r, &mg_owner, &mns)?
        };
        let stand_ins = if r.remaining() == 0 {
            // Written before stand-ins existed.
            Vec::new()
        } else {
            get_stand_ins(&mut r, &mg_owner, &mns)?
        };
        let drains = if r.remaining() == 0 {
            // Written before drains existed.
            Vec::new()
        } else {
            get_drains(&mut r, &sns, epoch)?
        };
        let (keys, on_keys) = if r.remaining() == 0 {
            // Written before fingerprints were published.
            (Vec::new(), None)
        } else {
            get_keys(&mut r)?
        };
        let revoked = if r.remaining() == 0 {
            // Written before revocations existed, or none revoked.
            Vec::new()
        } else {
            get_revoked(&mut r)?
        };
        let mut params = params;
        if r.remaining() > 0 {
            expect_section(&mut r, CLASSES_SECTION, "storage class")?;
            for p in std::iter::once(&mut params).chain(buckets.iter_mut().map(|(_, p)| p)) {
                p.data_fragments = r.u8()?;
                p.validate().map_err(WireError::Invalid)?;
            }
        }
        r.finish()?;
        Ok(Table {
            epoch,
            layout,
            routed,
            params,
            buckets,
            mns,
            mg_owner,
            sns,
            moves,
            stand_ins,
            drains,
            keys,
            on_keys,
            revoked,
        })
    }

    /// The lowest credential generation of tenant `tenant` still valid (0
    /// unless one was revoked).
    pub fn min_generation(&self, tenant: &str) -> u32 {
        let hash = crate::tenant::tenant_id_hash(tenant);
        self.revoked
            .binary_search_by_key(&hash, |(h, _)| *h)
            .map_or(0, |i| self.revoked[i].1)
    }

    /// Raises tenant `tenant`'s minimum generation to `below` (never
    /// lowers it); returns the minimum now in force. Refused when the
    /// list is full ([`MAX_REVOKED_TENANTS`]) and the tenant is not in it.
    pub fn raise_min_generation(&mut self, tenant: &str, below: u32) -> Result<u32, String> {
        let hash = crate::tenant::tenant_id_hash(tenant);
        match self.revoked.binary_search_by_key(&hash, |(h, _)| *h) {
            Ok(i) => {
                let min = &mut self.revoked[i].1;
                *min = (*min).max(below);
                Ok(*min)
            }
            Err(_) if below == 0 => Ok(0),
            Err(_) if self.revoked.len() >= MAX_REVOKED_TENANTS => Err(format!(
                "the revocation list already holds {MAX_REVOKED_TENANTS} tenants, its limit \
                 (it must fit in the table's datagram); tenant '{tenant}' was not revoked: \
                 rotate the cluster key (which revokes every credential) to start a new list"
            )),
            Err(i) => {
                self.revoked.insert(i, (hash, below));
                Ok(below)
            }
        }
    }

    /// The keyring fingerprints node `uuid` last reported, if any.
    pub fn keys_of(&self, uuid: u64) -> Option<Fingerprints> {
        self.keys
            .binary_search_by_key(&uuid, |(u, _)| *u)
            .ok()
            .map(|i| self.keys[i].1)
    }

    /// Records the keyring fingerprints node `uuid` reported (keeps the
    /// list sorted by identity).
    pub fn set_keys_of(&mut self, uuid: u64, prints: Fingerprints) {
        match self.keys.binary_search_by_key(&uuid, |(u, _)| *u) {
            Ok(i) => self.keys[i].1 = prints,
            Err(i) => self.keys.insert(i, (uuid, prints)),
        }
    }
}

/// Reads the fingerprint section: a known section version, the
/// orchestrator's fingerprints if flagged, and one entry per node,
/// sorted by identity without repeats.
/// The fingerprints of each node (by identity) and of the orchestrator.
type KeySection = (Vec<(u64, Fingerprints)>, Option<Fingerprints>);

fn get_keys(r: &mut Reader) -> Result<KeySection, WireError> {
    expect_section(r, KEYS_SECTION, "fingerprint")?;
    let on_keys = match r.u8()? {
        0 => None,
        1 => Some(r.prints()?),
        x => {
            return Err(WireError::Invalid(format!(
                "orchestrator fingerprint flag {x}"
            )))
        }
    };
    let n = r.u16()? as usize;
    let mut keys: Vec<(u64, Fingerprints)> = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let uuid = r.u64()?;
        if keys.last().is_some_and(|(u, _)| *u >= uuid) {
            return Err(WireError::Invalid(format!(
                "fingerprints of node {uuid:016x} out of order"
            )));
        }
        keys.push((uuid, r.prints()?));
    }
    Ok((keys, on_keys))
}

/// Reads a table section's version byte and refuses any but `want`.
fn expect_section(r: &mut Reader, want: u8, what: &str) -> Result<(), WireError> {
    let version = r.u8()?;
    if version != want {
        return Err(WireError::Invalid(format!(
            "table {what} section version {version}; this build reads version {want}"
        )));
    }
    Ok(())
}

/// Reads and checks the revocation section: a known section version, at
/// most [`MAX_REVOKED_TENANTS`] entries, sorted by tenant hash without
/// repeats, each with a minimum generation of at least 1.
fn get_revoked(r: &mut Reader) -> Result<Vec<(u64, u32)>, WireError> {
    expect_section(r, REVOKED_SECTION, "revocation")?;
    let n = r.u32()? as usize;
    if n > MAX_REVOKED_TENANTS {
        return Err(WireError::Invalid(format!(
            "table revocation list of {n} tenants; the limit is {MAX_REVOKED_TENANTS}"
        )));
    }
    let mut revoked: Vec<(u64, u32)> = Vec::with_capacity(n);
    for _ in 0..n {
        let hash = r.u64()?;
        let min = r.u32()?;
        if revoked.last().is_some_and(|(h, _)| *h >= hash) {
            return Err(WireError::Invalid(format!(
                "revocation of tenant hash {hash:016x} out of order"
            )));
        }
        if min == 0 {
            return Err(WireError::Invalid(format!(
                "revocation of tenant hash {hash:016x} with minimum generation 0 (revokes nothing)"
            )));
        }
        revoked.push((hash, min));
    }
    Ok(revoked)
}

/// Reads and checks the drain section: a known section version, at most
/// one entry per storage node, nodes that exist and are not retired
/// already, a start no later than the table itself, and no more
/// unplaceable records than records left.
fn get_drains(r: &mut Reader, sns: &[SnEntry], epoch: u64) -> Result<Vec<Drain>, WireError> {
    expect_section(r, DRAINS_SECTION, "drain")?;
    let n = r.u32()? as usize;
    if n > sns.len() {
        return Err(WireError::Invalid(format!(
            "{n} drains for {} storage nodes",
            sns.len()
        )));
    }
    let mut out: Vec<Drain> = Vec::with_capacity(n);
    for _ in 0..n {
        let d = Drain {
            index: r.u16()?,
            since: r.u64()?,
            left: r.u64()?,
            copies: r.u64()?,
            unplaceable: r.u64()?,
            unreported: r.u16()?,
        };
        if out.iter().any(|o| o.index == d.index) {
            return Err(WireError::Invalid(format!(
                "drain of storage node {} listed twice",
                d.index
            )));
        }
        match sns.iter().find(|s| s.index == d.index) {
            None => {
                return Err(WireError::Invalid(format!(
                    "drain of storage node {}, which the table does not hold",
                    d.index
                )))
            }
            Some(s) if s.state == State::Retired => {
                return Err(WireError::Invalid(format!(
                    "drain of storage node {}, which is retired already",
                    d.index
                )))
            }
            Some(_) => {}
        }
        if d.since > epoch {
            return Err(WireError::Invalid(format!(
                "drain of storage node {} starts at epoch {}, after the table's {epoch}",
                d.index, d.since
            )));
        }
        if d.unplaceable > d.left {
            return Err(WireError::Invalid(format!(
                "drain of storage node {}: {} unplaceable of {} left",
                d.index, d.unplaceable, d.left
            )));
        }
        out.push(d);
    }
    Ok(out)
}

/// Reads and checks the stand-in section: a known section version, at
/// most one entry per group, groups in range, home slots that exist and
/// do not own the group already.
fn get_stand_ins(
    r: &mut Reader,
    mg_owner: &[u16],
    mns: &[MnEntry],
) -> Result<Vec<StandIn>, WireError> {
    let mg_count = mg_owner.len();
    expect_section(r, STAND_INS_SECTION, "stand-in")?;
    let n = r.u32()? as usize;
    if n > mg_count {
        return Err(WireError::Invalid(format!(
            "{n} stand-in groups for {mg_count} groups"
        )));
    }
    let mut out: Vec<StandIn> = Vec::with_capacity(n);
    for _ in 0..n {
        let group = r.u32()?;
        let home = r.u16()?;
        if group as usize >= mg_count || out.iter().any(|s| s.group == group) {
            return Err(WireError::Invalid(format!(
                "stand-in for group {group}: out of range or listed twice"
            )));
        }
        if !mns.iter().any(|m| m.slot == home) {
            return Err(WireError::Invalid(format!(
                "group {group} stands in for slot {home}, which no metadata node holds"
            )));
        }
        if mg_owner.get(group as usize) == Some(&home) {
            return Err(WireError::Invalid(format!(
                "group {group} stands in for slot {home}, which owns it"
            )));
        }
        out.push(StandIn { group, home });
    }
    Ok(out)
}

/// Reads and checks the handover section: a known section version, at most
/// one move per group, groups in range, target slots that exist.
fn get_moves(r: &mut Reader, mg_owner: &[u16], mns: &[MnEntry]) -> Result<Vec<Move>, WireError> {
    let mg_count = mg_owner.len();
    let owner = |g: u32| mg_owner.get(g as usize).copied();
    expect_section(r, MOVES_SECTION, "handover")?;
    let n = r.u32()? as usize;
    if n > mg_count {
        return Err(WireError::Invalid(format!(
            "{n} group handovers for {mg_count} groups"
        )));
    }
    let mut moves: Vec<Move> = Vec::with_capacity(n);
    for _ in 0..n {
        let group = r.u32()?;
        let to = r.u16()?;
        let phase = match r.u8()? {
            0 => MovePhase::Copying,
            1 => MovePhase::Copied,
            2 => MovePhase::Frozen,
            3 => MovePhase::Restoring,
            p => return Err(WireError::Invalid(format!("handover phase {p}"))),
        };
        let frozen_epoch = r.u64()?;
        if group as usize >= mg_count || moves.iter().any(|m| m.group == group) {
            return Err(WireError::Invalid(format!(
                "handover of group {group}: out of range or listed twice"
            )));
        }
        if !mns.iter().any(|m| m.slot == to) {
            return Err(WireError::Invalid(format!(
                "handover of group {group} to slot {to}, which no metadata node holds"
            )));
        }
        // A restored group is owned by its new node from the start (the old
        // one is dead): a table saying otherwise would have two owners.
        if phase == MovePhase::Restoring && owner(group) != Some(to) {
            return Err(WireError::Invalid(format!(
                "restore of group {group} to slot {to}, which does not own it"
            )));
        }
        moves.push(Move {
            group,
            to,
            phase,
            frozen_epoch,
        });
    }
    Ok(moves)
}

fn put_params(w: &mut Writer, p: &Params) {
    w.u8(p.n_m);
    w.u8(p.w_m);
    w.u8(p.n_d);
    w.u8(p.w_d);
}

fn get_params(r: &mut Reader) -> Result<Params, WireError> {
    let p = Params {
        n_m: r.u8()?,
        w_m: r.u8()?,
        n_d: r.u8()?,
        w_d: r.u8()?,
        data_fragments: 0,
    };
    p.validate().map_err(WireError::Invalid)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::DEFAULT_CLUSTER_PREFIX;

    fn table() -> Table {
        let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 4);
        Table {
            epoch: 3,
            layout,
            routed: false,
            params: Params {
                n_m: 3,
                w_m: 2,
                n_d: 3,
                w_d: 2,
                data_fragments: 0,
            },
            buckets: vec![("cold".into(), Params::default())],
            mns: vec![MnEntry {
                uuid: 1,
                slot: 0,
                endpoint: "127.0.0.1:1".parse().unwrap(),
                state: State::Up,
            }],
            mg_owner: vec![0; 16],
            sns: vec![SnEntry {
                uuid: 2,
                index: 1,
                endpoint: "[::1]:2".parse().unwrap(),
                capacity: 100,
                free: 50,
                objects: 4,
                device: Device::Hdd,
                state: State::Down,
            }],
            moves: vec![],
            stand_ins: vec![],
            drains: vec![],
            keys: Vec::new(),
            on_keys: None,
            revoked: Vec::new(),
        }
    }

    #[test]
    fn fingerprints_round_trip_and_an_older_table_has_none() {
        let mut t = table();
        let older = t.encode();
        t.on_keys = Some(Fingerprints {
            active: 5,
            other: Some(6),
        });
        t.set_keys_of(
            9,
            Fingerprints {
                active: 5,
                other: None,
            },
        );
        t.set_keys_of(
            2,
            Fingerprints {
                active: 6,
                other: Some(5),
            },
        );
        t.set_keys_of(
            9,
            Fingerprints {
                active: 6,
                other: None,
            },
        );
        assert_eq!(t.keys.iter().map(|(u, _)| *u).collect::<Vec<_>>(), [2, 9]);
        assert_eq!(t.keys_of(9).map(|k| k.active), Some(6));
        assert_eq!(t.keys_of(3), None);
        let bytes = t.encode();
        assert_eq!(Table::decode(&bytes).unwrap(), t);
        // A table without the section (older, or nothing reported).
        assert_eq!(&bytes[..older.len()], &older[..]);
        let back = Table::decode(&older).unwrap();
        assert!(back.keys.is_empty() && back.on_keys.is_none());
        for cut in older.len() + 1..bytes.len() {
            assert!(Table::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // An unknown section version, nodes out of order.
        let mut bad = bytes.clone();
        bad[older.len()] = 2;
        let err = Table::decode(&bad).unwrap_err().to_string();
        assert!(err.contains("fingerprint section version 2"), "{err}");
        let mut unsorted = t.clone();
        unsorted.keys.swap(0, 1);
        assert!(Table::decode(&unsorted.encode()).is_err());
    }

    #[test]
    fn revocations_round_trip_and_bad_or_huge_lists_are_refused() {
        let mut t = table();
        assert_eq!(t.min_generation("acme"), 0);
        assert_eq!(t.raise_min_generation("acme", 1), Ok(1));
        assert_eq!(t.raise_min_generation("bee", 3), Ok(3));
        // Never lowered.
        assert_eq!(t.raise_min_generation("bee", 2), Ok(3));
        let back = Table::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        assert_eq!(
            (back.min_generation("acme"), back.min_generation("bee")),
            (1, 3)
        );
        assert_eq!(back.min_generation("cat"), 0);
        // A full list refuses a new tenant but still raises a listed one.
        let mut full = table();
        full.revoked = (0..MAX_REVOKED_TENANTS as u64)
            .map(|h| (h * 2 + 1, 1))
            .collect();
        let err = full.raise_min_generation("acme", 1).unwrap_err();
        assert!(err.contains("2048"), "{err}");
        assert_eq!(Table::decode(&full.encode()).unwrap(), full);
        // Damaged lists: out of order, a zero minimum, too many, another
        // section version. The section is the table's tail.
        let tail_of = |t: &Table| {
            let bytes = t.encode();
            let at = bytes.len() - (4 + 1 + 12 * t.revoked.len());
            (bytes[..at].to_vec(), bytes[at..].to_vec())
        };
        let mut two = table();
        two.revoked = vec![(5, 1), (9, 2)];
        let (head, tail) = tail_of(&two);
        let mut swapped = tail.clone();
        swapped[5..17].copy_from_slice(&tail[17..29]);
        swapped[17..29].copy_from_slice(&tail[5..17]);
        let mut zero = tail.clone();
        zero[13..17].copy_from_slice(&0u32.to_be_bytes());
        let mut huge = tail.clone();
        huge[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        let mut version = tail.clone();
        version[0] = 2;
        for (bad, want) in [
            (swapped, "out of order"),
            (zero, "generation 0"),
            (huge, "limit is 2048"),
            (version, "revocation section version 2"),
        ] {
            let mut bytes = head.clone();
            bytes.extend_from_slice(&bad);
            let err = Table::decode(&bytes).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
        let mut cut = head.clone();
        cut.extend_from_slice(&tail[..20]);
        assert!(Table::decode(&cut).is_err());
    }

    #[test]
    fn table_round_trips_and_resolves() {
        let t = table();
        let back = Table::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        let a = t.meta_addrs("x")[0];
        assert_eq!(t.mn_for(a).unwrap().uuid, 1);
        assert_eq!(t.sn_for(t.layout.replica_addr(1, 9)).unwrap().uuid, 2);
        assert!(t.sn_for(t.layout.replica_addr(2, 9)).is_none());
        assert_eq!(t.params_for("cold/a").n_d, 1);
        assert_eq!(t.params_for("cold").n_d, 3);
        assert_eq!(t.params_for("hot/a").n_d, 3);
        let mut routed = t.clone();
        routed.routed = true;
        let r = Table::decode(&routed.encode()).unwrap();
        assert!(r.routed);
        let replica = t.layout.replica_addr(1, 9);
        assert_eq!(t.sn_endpoint(replica), Some("[::1]:2".parse().unwrap()));
        assert_eq!(
            r.sn_endpoint(replica),
            Some(SocketAddr::new(Ipv6Addr::from(replica).into(), 2))
        );
        assert_eq!(
            r.mn_endpoint(a),
            Some(SocketAddr::new(Ipv6Addr::from(a).into(), 1))
        );
        let bytes = t.encode();
        for cut in 0..bytes.len() {
            // The handover, stand-in and drain sections are optional: a
            // table cut right before one is a valid table written before
            // they existed.
            if ![5, 10, 15].contains(&(bytes.len() - cut)) {
                assert!(Table::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        assert_eq!(Table::decode(&bytes[..bytes.len() - 15]).unwrap(), t);
        assert_eq!(Table::decode(&bytes[..bytes.len() - 10]).unwrap(), t);
        assert_eq!(Table::decode(&bytes[..bytes.len() - 5]).unwrap(), t);
    }

    fn with_moves() -> Table {
        let mut t = table();
        t.mns.push(MnEntry {
            uuid: 9,
            slot: 1,
            endpoint: "127.0.0.1:3".parse().unwrap(),
            state: State::Up,
        });
        t.moves = vec![
            Move {
                group: 3,
                to: 1,
                phase: MovePhase::Copying,
                frozen_epoch: 0,
            },
            Move {
                group: 15,
                to: 1,
                phase: MovePhase::Frozen,
                frozen_epoch: 77,
            },
        ];
        t
    }

    #[test]
    fn handovers_round_trip_and_bad_ones_are_refused() {
        let t = with_moves();
        let bytes = t.encode();
        let back = Table::decode(&bytes).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.move_of(15).unwrap().frozen_epoch, 77);
        assert!(back.move_of(4).is_none());
        for cut in 0..bytes.len() {
            if ![5, 10, 15 + 2 * 15].contains(&(bytes.len() - cut)) {
                assert!(Table::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        let refused = |mut bad: Table, what: &str| {
            let err = Table::decode(&bad.encode()).unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
            bad.moves.clear();
            assert!(Table::decode(&bad.encode()).is_ok());
        };
        let mut bad = t.clone();
        bad.moves[1].group = 16;
        refused(bad, "out of range");
        let mut bad = t.clone();
        bad.moves[1].group = 3;
        refused(bad, "listed twice");
        let mut bad = t.clone();
        bad.moves[0].to = 7;
        refused(bad, "no metadata node");
        // An unknown phase or section version, or a huge count.
        // (Past the empty stand-in and drain sections, 5 bytes each.)
        let n = bytes.len() - 10;
        let mut b = bytes.clone();
        b[n - 9] = 9;
        assert!(Table::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("phase 9"));
        let mut b = bytes.clone();
        b[n - 2 * 15 - 5] = 2;
        assert!(Table::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("version 2"));
        let mut b = bytes.clone();
        b[n - 2 * 15 - 4..n - 2 * 15].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Table::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("handovers"));
    }

    #[test]
    fn restores_round_trip_and_must_name_the_owner() {
        let mut t = with_moves();
        t.mns[0].state = State::Dead;
        t.mg_owner[5] = 1;
        t.moves.push(Move {
            group: 5,
            to: 1,
            phase: MovePhase::Restoring,
            frozen_epoch: 41,
        });
        t.moves.sort_by_key(|m| m.group);
        let back = Table::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        assert!(back.restoring(5));
        assert!(!back.restoring(3) && !back.restoring(15));
        assert_eq!(back.mns[0].state, State::Dead);
        // The dead node still owns groups, so storage nodes still ask it.
        assert_eq!(back.gc_mns().count(), 2);
        // Owning none, it is no longer asked.
        let mut empty = back.clone();
        for o in &mut empty.mg_owner {
            *o = 1;
        }
        assert_eq!(empty.gc_mns().map(|m| m.slot).collect::<Vec<_>>(), vec![1]);
        // A restore to a slot that does not own the group is refused.
        let mut bad = t.clone();
        bad.mg_owner[5] = 0;
        let err = Table::decode(&bad.encode()).unwrap_err().to_string();
        assert!(err.contains("does not own it"), "{err}");
    }

    #[test]
    fn stand_ins_round_trip_and_bad_ones_are_refused() {
        let mut t = with_moves();
        t.mns[0].state = State::Down;
        t.mg_owner[4] = 1;
        t.mg_owner[9] = 1;
        t.stand_ins = vec![StandIn { group: 4, home: 0 }, StandIn { group: 9, home: 0 }];
        let bytes = t.encode();
        let back = Table::decode(&bytes).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.home_of(4), Some(0));
        assert_eq!(back.home_of(5), None);
        for cut in 0..bytes.len() {
            // Cut before the stand-in section (or the handovers): an older table.
            if ![5, 10 + 2 * 6, 15 + 2 * 6 + 2 * 15].contains(&(bytes.len() - cut)) {
                assert!(Table::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        let refused = |bad: Table, what: &str| {
            let err = Table::decode(&bad.encode()).unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
        };
        let mut bad = t.clone();
        bad.stand_ins[1].group = 16;
        refused(bad, "out of range");
        let mut bad = t.clone();
        bad.stand_ins[1].group = 4;
        refused(bad, "listed twice");
        let mut bad = t.clone();
        bad.stand_ins[0].home = 7;
        refused(bad, "no metadata node");
        let mut bad = t.clone();
        bad.stand_ins[0].home = 1;
        refused(bad, "which owns it");
        // An unknown section version, or a huge count.
        let n = bytes.len() - 5 - 2 * 6;
        let mut b = bytes.clone();
        b[n - 5] = 2;
        let err = Table::decode(&b).unwrap_err().to_string();
        assert!(err.contains("stand-in section version 2"), "{err}");
        let mut b = bytes.clone();
        b[n - 4..n].copy_from_slice(&u32::MAX.to_be_bytes());
        let err = Table::decode(&b).unwrap_err().to_string();
        assert!(err.contains("stand-in groups"), "{err}");
    }

    #[test]
    fn drains_round_trip_and_bad_ones_are_refused() {
        let mut t = table();
        t.sns[0].state = State::Up;
        t.sns.push(SnEntry {
            uuid: 5,
            index: 2,
            endpoint: "[::1]:5".parse().unwrap(),
            capacity: 100,
            free: 100,
            objects: 0,
            device: Device::Ssd,
            state: State::Retired,
        });
        t.drains = vec![Drain {
            index: 1,
            since: 2,
            left: 9,
            copies: 4,
            unplaceable: 3,
            unreported: 1,
        }];
        let bytes = t.encode();
        let back = Table::decode(&bytes).unwrap();
        assert_eq!(back, t);
        assert!(back.retiring(1) && !back.retiring(2));
        assert_eq!(back.drain_of(1).unwrap().left, 9);
        for cut in 0..bytes.len() {
            // Cut before the drain section (or the ones before it).
            if ![5 + 36, 10 + 36, 15 + 36].contains(&(bytes.len() - cut)) {
                assert!(Table::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        let refused = |bad: Table, what: &str| {
            let err = Table::decode(&bad.encode()).unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
        };
        let mut bad = t.clone();
        bad.drains.push(bad.drains[0]);
        refused(bad, "listed twice");
        let mut bad = t.clone();
        bad.drains[0].index = 7;
        refused(bad, "does not hold");
        let mut bad = t.clone();
        bad.drains[0].index = 2;
        refused(bad, "retired already");
        let mut bad = t.clone();
        bad.drains[0].since = 4;
        refused(bad, "after the table's 3");
        let mut bad = t.clone();
        bad.drains[0].unplaceable = 10;
        refused(bad, "unplaceable");
        // An unknown section version, a huge count, an unknown node state.
        let n = bytes.len() - 36;
        let mut b = bytes.clone();
        b[n - 5] = 2;
        let err = Table::decode(&b).unwrap_err().to_string();
        assert!(err.contains("drain section version 2"), "{err}");
        let mut b = bytes.clone();
        b[n - 4..n].copy_from_slice(&u32::MAX.to_be_bytes());
        let err = Table::decode(&b).unwrap_err().to_string();
        assert!(err.contains("drains for 2 storage nodes"), "{err}");
        let mut b = bytes.clone();
        // The second storage node's state byte: just before the handover
        // section (5), the stand-in section (5) and the drains (5 + 36).
        b[n - 5 - 10 - 1] = 9;
        let err = Table::decode(&b).unwrap_err().to_string();
        assert!(err.contains("node state 9"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn table_decode_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = Table::decode(&bytes);
        }

        #[test]
        fn damaged_tables_never_panic(at in 0usize..400, byte in proptest::prelude::any::<u8>()) {
            let mut b = with_moves().encode();
            let i = at % b.len();
            b[i] = byte;
            let _ = Table::decode(&b);
        }
    }
}
