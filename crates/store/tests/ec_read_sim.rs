//! Deterministic simulation of erasure-coded reads with the whole-object
//! cache.
//!
//! Storage nodes hold fragments of objects in ec(2,1) and ec(4,2) and
//! each runs a real [`ObjectCache`]; clients read the objects with the
//! real [`ReadPlan`] (the machine the client's Get carries out): first
//! the whole object from the node of fragment 0 (`GetObject`: from its
//! cache, or gathered there with a `ReadPlan` of its own and admitted
//! through [`ObjectCache::begin_fill`], as the node's shell does), then,
//! if that fails, k fragments, hedged and replaced as the plan says,
//! decoded with the real [`StripeCoder`]. A seeded generator drives a
//! simulated network (delays, hence reordering, and message loss) and
//! the faults: nodes lost in the middle of Gets (the fragment-0 node and
//! others; a lost node drops its connections and its cache), a
//! partition between a client and a fragment-0 node (healed later),
//! fragments rotted on disk, and overwrites and Deletes racing Gets (a
//! metadata write is acknowledged, then its old fragments are freed over
//! the network). Checks, each with the seed in its message:
//! - a Get that succeeds returns exactly the bytes of a version of its
//!   name that was live at some instant during the Get (never one whose
//!   overwrite or Delete was acknowledged before the Get began);
//! - a Get fails only when fewer than k fragments of its version were
//!   reachable and intact throughout it, and says so;
//! - a stripe is decoded from exactly k shards that arrived;
//! - every Get ends, within a bound the timeouts give;
//! - under the partition, Gets succeed from k other fragments;
//! - a node's cache never holds an entry for a fragment-0 address it
//!   freed.
//!
//! `SIM_SEEDS=N` runs N seeds (16 by default, a few seconds), `SIM_SKIP=K` starts K
//! seeds later.
//!
//! Simplifications: metadata is one instant, linearizable map; a
//! fragment stream is modelled as one request per shard (a node lost
//! mid-stream stalls the next one); a node serves at once.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use strata_store::storage::object_cache::{Fill, ObjectCache};
use strata_store_client::erasure::StripeCoder;
use strata_store_client::read_plan::{Action, Event, ReadPlan};
use strata_store_protocol::addr::Addr;
use strata_store_protocol::class::StripeLayout;

const NODES: usize = 7;
const CLIENTS: usize = 3;
const NAMES: usize = 6;
/// The name kept in ec(4,2) and never rotted: the partition's object.
const PARTITIONED_NAME: usize = 0;
/// A read silent this long has failed (the client's reply stall).
const STALL_MS: u64 = 200;
const HEDGE_MS: u64 = 25;
const MAX_DELAY_MS: u64 = 60;
const LOSS_PERCENT: u64 = 1;
/// Most time between an overwrite's or Delete's acknowledgement and the
/// sending of the Free of one of its old fragments.
const FREE_SPREAD_MS: u64 = 150;
const CACHE_BUDGET: u64 = 24 << 20;
/// Simulated time in which Gets and faults start; the rest drains.
const RUN_MS: u64 = 8_000;

/// xorshift64* seeded through splitmix64: small and reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(strata_store_protocol::addr::splitmix64(seed ^ 0xec).max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Who sends and receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Client(usize),
    Node(usize),
    Meta,
}

/// A read request's tag: the reader, the request and the fragment.
#[derive(Clone, Copy, Debug)]
struct Ask {
    reader: u64,
    id: u64,
    index: usize,
}

enum Msg {
    /// `GetObject` to the node of fragment 0.
    GetWhole {
        ask: Ask,
        version: usize,
    },
    /// Shards `first..upto` of a fragment.
    GetShards {
        ask: Ask,
        addr: Addr,
        shard: usize,
        first: u64,
        upto: u64,
    },
    Free {
        addr: Addr,
    },
    Whole {
        ask: Ask,
        data: Option<Arc<Vec<u8>>>,
    },
    Shards {
        ask: Ask,
        bytes: Option<Vec<u8>>,
    },
}

impl Msg {
    fn ask(&self) -> Option<Ask> {
        match self {
            Msg::GetWhole { ask, .. }
            | Msg::GetShards { ask, .. }
            | Msg::Whole { ask, .. }
            | Msg::Shards { ask, .. } => Some(*ask),
            Msg::Free { .. } => None,
        }
    }
}

enum Ev {
    Deliver {
        from: End,
        from_life: u64,
        to: End,
        msg: Msg,
    },
    Timeout(Ask),
    Hedge {
        reader: u64,
        pass: u64,
    },
    StartGet {
        client: usize,
        name: usize,
    },
    Write {
        name: usize,
    },
    Delete {
        name: usize,
    },
    Crash,
    Restart {
        node: usize,
    },
    Rot,
    /// The metadata sends the Free of an old fragment.
    Free {
        node: usize,
        addr: Addr,
    },
    Partition {
        client: usize,
        on: bool,
    },
}

/// One version of a name: its bytes and where its fragments are.
struct Version {
    name: usize,
    data: Arc<Vec<u8>>,
    crc: u32,
    layout: StripeLayout,
    addrs: Vec<Addr>,
    nodes: Vec<usize>,
    crcs: Vec<u32>,
    /// When it was acknowledged, and its overwrite or Delete, in
    /// events handled (finer than milliseconds: a Get and a write of the
    /// same millisecond are ordered).
    live_from: u64,
    live_until: Option<u64>,
}

struct Node {
    alive: bool,
    /// Bumped at each crash: messages of an older life are lost.
    life: u64,
    cache: &'static ObjectCache,
    disk: HashMap<Addr, Vec<u8>>,
    /// Fragment addresses freed here, and when.
    freed: HashMap<Addr, u64>,
}

enum Purpose {
    Get {
        client: usize,
    },
    Gather {
        node: usize,
        fill: Fill<'static>,
        reply_to: (End, Ask),
    },
}

/// A read in progress: the real plan, and what carrying it out needs.
struct Reader {
    owner: End,
    version: usize,
    plan: ReadPlan,
    purpose: Purpose,
    asks: HashMap<usize, u64>,
    whole_ask: Option<u64>,
    /// Open fragments' running CRC-32C.
    open: HashMap<usize, u32>,
    shards: HashMap<usize, Vec<u8>>,
    output: Vec<u8>,
    pass: u64,
    started: u64,
    /// When it started, in events handled.
    started_tick: u64,
    /// Fragments a message of which the network lost.
    lost: HashSet<usize>,
}

#[derive(Default, Debug)]
struct Stats {
    gets: u64,
    succeeded: u64,
    failed: u64,
    not_found: u64,
    whole_served: u64,
    from_fragments: u64,
    hits: u64,
    gathers_refused: u64,
    crash_mid_get_first: u64,
    crash_mid_get_other: u64,
    partitioned_gets_ok: u64,
    rotted_caught: u64,
    raced_frees: u64,
}

struct Sim {
    seed: u64,
    rng: Rng,
    now: u64,
    /// Events handled so far.
    tick: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: HashMap<u64, Ev>,
    nodes: Vec<Node>,
    versions: Vec<Version>,
    live: Vec<Option<usize>>,
    next_addr: Addr,
    readers: BTreeMap<u64, Reader>,
    next_id: u64,
    /// Node outages: node, from, until.
    outages: Vec<(usize, u64, Option<u64>)>,
    /// Partitions: client, node, from, until.
    partitions: Vec<(usize, usize, u64, Option<u64>)>,
    /// Rotted fragments: version, index, when.
    rotted: Vec<(usize, usize, u64)>,
    stats: Stats,
    /// The longest Get, in simulated ms.
    longest: u64,
}

/// Every fragment of `data` in `layout`, by index.
fn encode(layout: StripeLayout, data: &[u8]) -> Vec<Vec<u8>> {
    let mut coder = StripeCoder::new(layout).expect("a valid layout");
    let mut out = vec![Vec::new(); layout.data + layout.parity];
    for stripe in 0..layout.stripes as usize {
        let mut bytes = vec![0u8; layout.stripe_data()];
        let start = (stripe * layout.stripe_data()).min(data.len());
        let end = (start + layout.stripe_data()).min(data.len());
        bytes[..end - start].copy_from_slice(&data[start..end]);
        for (index, shard) in bytes.chunks(layout.shard).enumerate() {
            out[index].extend_from_slice(shard);
        }
        for (index, parity) in coder
            .encode(&bytes)
            .expect("encoding")
            .into_iter()
            .enumerate()
        {
            out[layout.data + index].extend_from_slice(&parity);
        }
    }
    out
}

fn new_cache() -> &'static ObjectCache {
    // A Fill borrows its cache for as long as the gathering runs, which
    // outlives any one event here; the cache's entries are removed when
    // its node is lost or the run ends, so only the empty shell leaks.
    Box::leak(Box::new(ObjectCache::new(CACHE_BUDGET)))
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let nodes = (0..NODES)
            .map(|_| Node {
                alive: true,
                life: 0,
                cache: new_cache(),
                disk: HashMap::new(),
                freed: HashMap::new(),
            })
            .collect();
        Sim {
            seed,
            rng: Rng::new(seed),
            now: 0,
            tick: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            nodes,
            versions: Vec::new(),
            live: vec![None; NAMES],
            next_addr: 1,
            readers: BTreeMap::new(),
            next_id: 1,
            outages: Vec::new(),
            partitions: Vec::new(),
            rotted: Vec::new(),
            stats: Stats::default(),
            longest: 0,
        }
    }

    fn at(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((self.now + delay, self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn life(&self, end: End) -> u64 {
        match end {
            End::Node(n) => self.nodes[n].life,
            _ => 0,
        }
    }

    fn partitioned(&self, a: End, b: End) -> bool {
        let pair = match (a, b) {
            (End::Client(c), End::Node(n)) | (End::Node(n), End::Client(c)) => (c, n),
            _ => return false,
        };
        self.partitions
            .iter()
            .any(|&(c, n, _, until)| (c, n) == pair && until.is_none())
    }

    /// Sends `msg`; whether the network lost it (the reader it is for
    /// is told, if it is in the map).
    fn send(&mut self, from: End, to: End, msg: Msg) -> bool {
        if self.rng.chance(LOSS_PERCENT) {
            if let Some(ask) = msg.ask() {
                if let Some(reader) = self.readers.get_mut(&ask.reader) {
                    reader.lost.insert(ask.index);
                }
            }
            return true;
        }
        if self.partitioned(from, to) {
            return false;
        }
        let delay = match self.rng.chance(10) {
            true => MAX_DELAY_MS,
            false => 1 + self.rng.below(20),
        };
        let from_life = self.life(from);
        self.at(
            delay,
            Ev::Deliver {
                from,
                from_life,
                to,
                msg,
            },
        );
        false
    }

    // ---- metadata: writes, overwrites and Deletes ----

    fn write(&mut self, name: usize) {
        let (k, m) = match name == PARTITIONED_NAME || self.rng.chance(50) {
            true => (4u8, 2u8),
            false => (2u8, 1u8),
        };
        let size = match self.rng.chance(15) {
            true => (1 << 20) + 1 + self.rng.below(1 << 20),
            false => 1 + self.rng.below(64 << 10),
        };
        let id = self.versions.len() as u64;
        let mut data = Vec::with_capacity(size as usize + 8);
        data.extend_from_slice(&id.to_be_bytes());
        while (data.len() as u64) < size {
            data.extend_from_slice(&self.rng.next().to_le_bytes());
        }
        data.truncate(size as usize);
        let layout = StripeLayout::new(size, k, m);
        let fragments = encode(layout, &data);
        let mut nodes: Vec<usize> = Vec::new();
        while nodes.len() < fragments.len() {
            let node = self.rng.below(NODES as u64) as usize;
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        let mut addrs = Vec::new();
        let mut crcs = Vec::new();
        for (fragment, &node) in fragments.into_iter().zip(&nodes) {
            let addr = self.next_addr;
            self.next_addr += 1;
            crcs.push(crc32c::crc32c(&fragment));
            addrs.push(addr);
            // The Put is done before its acknowledgement (Puts are the
            // other simulations' subject).
            self.nodes[node].disk.insert(addr, fragment);
        }
        self.versions.push(Version {
            name,
            crc: crc32c::crc32c(&data),
            data: Arc::new(data),
            layout,
            addrs,
            nodes,
            crcs,
            live_from: self.tick,
            live_until: None,
        });
        let old = self.live[name].replace(self.versions.len() - 1);
        if let Some(old) = old {
            self.retire(old);
        }
    }

    fn delete(&mut self, name: usize) {
        if let Some(old) = self.live[name].take() {
            self.retire(old);
        }
    }

    /// The metadata acknowledged the overwrite or Delete of `version`:
    /// its fragments are freed, over the network.
    fn retire(&mut self, version: usize) {
        self.versions[version].live_until = Some(self.tick);
        let frees: Vec<(usize, Addr)> = {
            let v = &self.versions[version];
            v.nodes
                .iter()
                .copied()
                .zip(v.addrs.iter().copied())
                .collect()
        };
        for (node, addr) in frees {
            // Each Free leaves on its own time (a coordinator frees the
            // old fragments after the acknowledgement), so a fragment-0
            // node may have freed while the others still serve.
            let later = self.rng.below(FREE_SPREAD_MS);
            self.at(later, Ev::Free { node, addr });
        }
    }

    // ---- the nodes ----

    fn at_node(&mut self, node: usize, from: End, msg: Msg) {
        match msg {
            Msg::Free { addr } => {
                // As the shell: the fragment goes first, then the entry.
                self.nodes[node].disk.remove(&addr);
                let in_flight = self.readers.values().any(|r| {
                    matches!(r.purpose, Purpose::Gather { node: n, .. } if n == node)
                        && self.versions[r.version].addrs[0] == addr
                });
                self.stats.raced_frees += u64::from(in_flight);
                self.nodes[node].cache.remove(addr);
                self.nodes[node].freed.insert(addr, self.now);
            }
            Msg::GetShards {
                ask,
                addr,
                shard,
                first,
                upto,
            } => {
                let bytes = self.nodes[node].disk.get(&addr).and_then(|fragment| {
                    let range = first as usize * shard..upto as usize * shard;
                    fragment.get(range).map(<[u8]>::to_vec)
                });
                self.send(End::Node(node), from, Msg::Shards { ask, bytes });
            }
            Msg::GetWhole { ask, version } => self.get_whole(node, from, ask, version),
            Msg::Whole { ask, data } => self.whole_arrived(ask, data),
            Msg::Shards { ask, bytes } => self.shards_arrived(ask, bytes),
        }
        self.check_cache(node);
    }

    /// `GetObject`, as `storage/whole.rs` serves it.
    fn get_whole(&mut self, node: usize, from: End, ask: Ask, version: usize) {
        let v = &self.versions[version];
        let (addr, size, crc, layout) = (v.addrs[0], v.data.len() as u64, v.crc, v.layout);
        let cache = self.nodes[node].cache;
        if let Some(data) = cache.get(addr, size, crc) {
            self.stats.hits += 1;
            self.send(
                End::Node(node),
                from,
                Msg::Whole {
                    ask,
                    data: Some(data),
                },
            );
            return;
        }
        if size > cache.max_object() {
            self.send(End::Node(node), from, Msg::Whole { ask, data: None });
            return;
        }
        let fill = cache.begin_fill(addr);
        if !self.nodes[node].disk.contains_key(&addr) {
            self.stats.gathers_refused += 1;
            self.send(End::Node(node), from, Msg::Whole { ask, data: None });
            return;
        }
        let total = layout.data + layout.parity;
        let plan = ReadPlan::new(
            layout.data,
            total,
            layout.stripes,
            (0..total).collect(),
            false,
            false,
        );
        let purpose = Purpose::Gather {
            node,
            fill,
            reply_to: (from, ask),
        };
        self.start_reader(End::Node(node), version, plan, purpose);
    }

    /// Every fragment-0 address a node freed has no entry in its cache.
    fn check_cache(&self, node: usize) {
        let n = &self.nodes[node];
        for (&addr, &when) in &n.freed {
            assert!(
                !n.cache.holds(addr),
                "seed {}: node {node}'s cache holds fragment-0 address {addr}, freed at {when} ms (now {} ms)",
                self.seed,
                self.now
            );
        }
    }

    fn crash(&mut self, node: usize) {
        if !self.nodes[node].alive {
            return;
        }
        for reader in self.readers.values() {
            if let Purpose::Get { .. } = reader.purpose {
                let v = &self.versions[reader.version];
                if v.nodes[0] == node {
                    self.stats.crash_mid_get_first += 1;
                } else if v.nodes.contains(&node) {
                    self.stats.crash_mid_get_other += 1;
                }
            }
        }
        let n = &mut self.nodes[node];
        n.alive = false;
        n.life += 1;
        // The process is gone: its gatherings (their fills) and its cache.
        let cache = n.cache;
        self.readers
            .retain(|_, r| !matches!(r.purpose, Purpose::Gather { node: at, .. } if at == node));
        for v in &self.versions {
            cache.remove(v.addrs[0]);
        }
        self.nodes[node].cache = new_cache();
        self.outages.push((node, self.now, None));
    }

    fn restart(&mut self, node: usize) {
        self.nodes[node].alive = true;
        for outage in self.outages.iter_mut() {
            if outage.0 == node && outage.2.is_none() {
                outage.2 = Some(self.now);
            }
        }
    }

    // ---- readers: the real plan carried out ----

    fn start_reader(&mut self, owner: End, version: usize, mut plan: ReadPlan, purpose: Purpose) {
        let id = self.id();
        let actions = plan.start();
        let reader = Reader {
            owner,
            version,
            plan,
            purpose,
            asks: HashMap::new(),
            whole_ask: None,
            open: HashMap::new(),
            shards: HashMap::new(),
            output: Vec::new(),
            pass: 0,
            started: self.now,
            started_tick: self.tick,
            lost: HashSet::new(),
        };
        self.readers.insert(id, reader);
        self.carry_out(id, actions);
    }

    fn start_get(&mut self, client: usize, name: usize) {
        let Some(version) = self.live[name] else {
            self.stats.not_found += 1;
            return;
        };
        self.stats.gets += 1;
        let layout = self.versions[version].layout;
        let total = layout.data + layout.parity;
        // The replica choice's order, here at random.
        let mut order: Vec<usize> = (0..total).collect();
        for i in (1..total).rev() {
            order.swap(i, self.rng.below(i as u64 + 1) as usize);
        }
        let plan = ReadPlan::new(layout.data, total, layout.stripes, order, true, true);
        self.start_reader(End::Client(client), version, plan, Purpose::Get { client });
    }

    fn carry_out(&mut self, id: u64, actions: Vec<Action>) {
        // Out of the map while its actions are carried out.
        let Some(mut reader) = self.readers.remove(&id) else {
            return;
        };
        let mut queue: std::collections::VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            let (owner, version) = (reader.owner, reader.version);
            let layout = self.versions[version].layout;
            match action {
                Action::AskWhole => {
                    let ask = Ask {
                        reader: id,
                        id: self.id(),
                        index: 0,
                    };
                    reader.whole_ask = Some(ask.id);
                    let to = End::Node(self.versions[version].nodes[0]);
                    self.send(owner, to, Msg::GetWhole { ask, version });
                    self.at(STALL_MS, Ev::Timeout(ask));
                }
                Action::Restart => {
                    reader.output.clear();
                    reader.shards.clear();
                    reader.asks.clear();
                    reader.open.clear();
                    reader.pass += 1;
                }
                Action::ArmHedge => {
                    let pass = reader.pass;
                    self.at(HEDGE_MS, Ev::Hedge { reader: id, pass });
                }
                Action::Open { index, stripe } | Action::Continue { index, stripe } => {
                    let first = match action {
                        Action::Open { .. } => {
                            reader.open.insert(index, 0);
                            0
                        }
                        _ => stripe,
                    };
                    let ask = Ask {
                        reader: id,
                        id: self.id(),
                        index,
                    };
                    reader.asks.insert(index, ask.id);
                    let v = &self.versions[version];
                    let msg = Msg::GetShards {
                        ask,
                        addr: v.addrs[index],
                        shard: layout.shard,
                        first,
                        upto: stripe + 1,
                    };
                    let to = End::Node(v.nodes[index]);
                    if self.send(owner, to, msg) {
                        reader.lost.insert(index);
                    }
                    self.at(STALL_MS, Ev::Timeout(ask));
                }
                Action::Cancel(index) => {
                    reader.asks.remove(&index);
                    reader.open.remove(&index);
                }
                Action::Decode(used) => {
                    let mut distinct = used.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    assert!(
                        distinct.len() == layout.data
                            && used.len() == layout.data
                            && used.iter().all(|i| reader.shards.contains_key(i)),
                        "seed {}: a stripe decoded from {used:?} where ec({},{}) needs {} shards that arrived (have {:?})",
                        self.seed,
                        layout.data,
                        layout.parity,
                        layout.data,
                        reader.shards.keys().collect::<Vec<_>>()
                    );
                    let shards = used
                        .iter()
                        .map(|i| (*i, reader.shards.remove(i).unwrap_or_default()))
                        .collect();
                    reader.shards.clear();
                    let mut coder = StripeCoder::new(layout).expect("a valid layout");
                    let size = self.versions[version].data.len();
                    for shard in coder.decode(shards).expect("k intact shards decode") {
                        let take = (size - reader.output.len()).min(shard.len());
                        reader.output.extend_from_slice(&shard[..take]);
                    }
                }
                Action::Verify => {
                    let v = &self.versions[version];
                    let mut bad: Vec<usize> = reader
                        .open
                        .iter()
                        .filter(|(i, crc)| v.crcs[**i] != **crc)
                        .map(|(i, _)| *i)
                        .collect();
                    bad.sort_unstable();
                    let object_ok = reader.output.len() == v.data.len()
                        && crc32c::crc32c(&reader.output) == v.crc;
                    if !bad.is_empty() {
                        self.stats.rotted_caught += 1;
                    }
                    let more = reader.plan.on(Event::Verified { bad, object_ok });
                    queue.extend(more);
                }
                Action::Done => return self.read_done(reader, Ok(())),
                Action::GiveUp(why) => return self.read_done(reader, Err(why)),
            }
        }
        self.readers.insert(id, reader);
    }

    fn on_event(&mut self, id: u64, event: Event) {
        let Some(reader) = self.readers.get_mut(&id) else {
            return;
        };
        let actions = reader.plan.on(event);
        self.carry_out(id, actions);
    }

    fn whole_arrived(&mut self, ask: Ask, data: Option<Arc<Vec<u8>>>) {
        let Some(reader) = self.readers.get_mut(&ask.reader) else {
            return;
        };
        if reader.whole_ask != Some(ask.id) {
            return;
        }
        reader.whole_ask = None;
        let v = &self.versions[reader.version];
        // Checked against the record's size and CRC-32C, as the client does.
        let served = data.filter(|d| d.len() == v.data.len() && crc32c::crc32c(d) == v.crc);
        let event = match served {
            Some(data) => {
                reader.output = data.to_vec();
                Event::WholeServed
            }
            None => Event::WholeFailed,
        };
        self.on_event(ask.reader, event);
    }

    fn shards_arrived(&mut self, ask: Ask, bytes: Option<Vec<u8>>) {
        let Some(reader) = self.readers.get_mut(&ask.reader) else {
            return;
        };
        if reader.asks.get(&ask.index) != Some(&ask.id) {
            return;
        }
        reader.asks.remove(&ask.index);
        let shard = self.versions[reader.version].layout.shard;
        let event = match bytes {
            Some(bytes) if bytes.len() >= shard => {
                let crc = reader.open.entry(ask.index).or_insert(0);
                *crc = crc32c::crc32c_append(*crc, &bytes);
                reader
                    .shards
                    .insert(ask.index, bytes[bytes.len() - shard..].to_vec());
                Event::ShardArrived(ask.index)
            }
            _ => {
                reader.open.remove(&ask.index);
                Event::ShardFailed {
                    index: ask.index,
                    damaged: false,
                }
            }
        };
        self.on_event(ask.reader, event);
    }

    fn timeout(&mut self, ask: Ask) {
        let Some(reader) = self.readers.get_mut(&ask.reader) else {
            return;
        };
        if reader.whole_ask == Some(ask.id) {
            reader.whole_ask = None;
            self.on_event(ask.reader, Event::WholeFailed);
        } else if reader.asks.get(&ask.index) == Some(&ask.id) {
            reader.asks.remove(&ask.index);
            reader.open.remove(&ask.index);
            let event = Event::ShardFailed {
                index: ask.index,
                damaged: false,
            };
            self.on_event(ask.reader, event);
        }
    }

    fn read_done(&mut self, reader: Reader, result: Result<(), String>) {
        match reader.purpose {
            Purpose::Gather {
                node,
                fill,
                reply_to: (to, ask),
            } => {
                let data = result.ok().map(|()| Arc::new(reader.output));
                if let Some(data) = &data {
                    fill.admit(self.versions[reader.version].crc, data.clone());
                }
                self.send(End::Node(node), to, Msg::Whole { ask, data });
                self.check_cache(node);
            }
            Purpose::Get { client } => self.get_done(client, reader, result),
        }
    }

    fn get_done(&mut self, client: usize, reader: Reader, result: Result<(), String>) {
        let seed = self.seed;
        let (from, until) = (reader.started, self.now);
        self.longest = self.longest.max(until - from);
        let v = &self.versions[reader.version];
        let layout = v.layout;
        let bound = STALL_MS * (2 + layout.stripes * (layout.data + layout.parity + 1) as u64 * 2);
        assert!(
            until - from <= bound,
            "seed {seed}: a Get of {:?} took {} ms, more than the timeouts allow ({bound} ms)",
            v.name,
            until - from
        );
        match result {
            Ok(()) => {
                self.stats.succeeded += 1;
                if reader.plan.failed().is_empty() && reader.pass == 0 {
                    self.stats.whole_served += 1;
                } else {
                    self.stats.from_fragments += 1;
                }
                let name = v.name;
                let matching = self
                    .versions
                    .iter()
                    .position(|w| w.name == name && *w.data == reader.output);
                let Some(found) = matching else {
                    panic!(
                        "seed {seed}: a Get of name {name} at {from}-{until} ms returned {} bytes of no version of it",
                        reader.output.len()
                    );
                };
                let w = &self.versions[found];
                let (began, ended) = (reader.started_tick, self.tick);
                let live_during =
                    w.live_from <= ended && w.live_until.is_none_or(|end| end > began);
                assert!(
                    live_during,
                    "seed {seed}: a Get of name {name} at {from}-{until} ms (events {began}-{ended}) returned \
                     version {found}, live from event {} to {:?}: a stale read",
                    w.live_from,
                    w.live_until
                );
                let first = v.nodes[0];
                if self.partitions.iter().any(|&(c, n, start, end)| {
                    c == client && n == first && start <= from && end.is_none_or(|e| e >= until)
                }) {
                    self.stats.partitioned_gets_ok += 1;
                }
            }
            Err(why) => {
                self.stats.failed += 1;
                let usable = self.usable_fragments(client, &reader, from, until);
                assert!(
                    usable.len() < layout.data,
                    "seed {seed}: a Get of version {} (ec({},{})) at {from}-{until} ms failed ({why}) \
                     though fragments {usable:?} were reachable and intact throughout",
                    reader.version,
                    layout.data,
                    layout.parity
                );
                assert!(
                    why.contains(&format!("fewer than {} of the", layout.data))
                        || why.contains("fails its checksum"),
                    "seed {seed}: an unclear error: {why}"
                );
            }
        }
    }

    /// The fragments of `reader`'s version that were reachable from
    /// `client` and intact from `from` to `until`, and none of whose
    /// messages the network lost.
    fn usable_fragments(
        &self,
        client: usize,
        reader: &Reader,
        from: u64,
        until: u64,
    ) -> Vec<usize> {
        let v = &self.versions[reader.version];
        let overlaps =
            |start: u64, end: Option<u64>| start <= until && end.is_none_or(|e| e >= from);
        (0..v.addrs.len())
            .filter(|&i| {
                let node = v.nodes[i];
                let down = self
                    .outages
                    .iter()
                    .any(|&(n, start, end)| n == node && overlaps(start, end));
                let cut = self
                    .partitions
                    .iter()
                    .any(|&(c, n, start, end)| c == client && n == node && overlaps(start, end));
                let rotten = self.rotted.iter().any(|&(version, index, when)| {
                    version == reader.version && index == i && when <= until
                });
                let freed = self.nodes[node]
                    .freed
                    .get(&v.addrs[i])
                    .is_some_and(|&t| t <= until);
                !down && !cut && !rotten && !freed && !reader.lost.contains(&i)
            })
            .collect()
    }

    // ---- the run ----

    fn schedule(&mut self) {
        for name in 0..NAMES {
            self.write(name);
        }
        let mut t = 0;
        while t < RUN_MS {
            t += 1 + self.rng.below(8);
            let client = self.rng.below(CLIENTS as u64) as usize;
            let name = self.rng.below(NAMES as u64) as usize;
            self.at(t, Ev::StartGet { client, name });
            // Overwrites and Deletes just after a Get began: they race
            // its gathering and its fragment reads.
            if self.rng.chance(4) && name != PARTITIONED_NAME {
                let after = t + self.rng.below(40);
                match self.rng.chance(25) {
                    true => self.at(after, Ev::Delete { name }),
                    false => self.at(after, Ev::Write { name }),
                }
            }
            if self.rng.chance(1) {
                let when = t + self.rng.below(30);
                self.at(when, Ev::Crash);
            }
            if self.rng.chance(1) {
                self.at(t, Ev::Rot);
            }
        }
        // The partition: client 0 from the node of the partitioned
        // name's fragment 0, for a while, with Gets of it meanwhile.
        let start = 1_000 + self.rng.below(RUN_MS / 2);
        self.at(
            start,
            Ev::Partition {
                client: 0,
                on: true,
            },
        );
        for _ in 0..8 {
            let when = start + 1 + self.rng.below(1_500);
            self.at(
                when,
                Ev::StartGet {
                    client: 0,
                    name: PARTITIONED_NAME,
                },
            );
        }
        self.at(
            start + 2_000,
            Ev::Partition {
                client: 0,
                on: false,
            },
        );
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver {
                from,
                from_life,
                to,
                msg,
            } => {
                // A lost node's connections are gone, and so is what
                // they carried.
                if self.life(from) != from_life || self.partitioned(from, to) {
                    return;
                }
                if let End::Node(n) = from {
                    if !self.nodes[n].alive {
                        return;
                    }
                }
                match to {
                    End::Node(n) if !self.nodes[n].alive => {}
                    End::Node(n) => self.at_node(n, from, msg),
                    End::Client(_) => match msg {
                        Msg::Whole { ask, data } => self.whole_arrived(ask, data),
                        Msg::Shards { ask, bytes } => self.shards_arrived(ask, bytes),
                        _ => {}
                    },
                    End::Meta => {}
                }
            }
            Ev::Timeout(ask) => {
                let owner = self.readers.get(&ask.reader).map(|r| r.owner);
                self.timeout(ask);
                if let Some(End::Node(n)) = owner {
                    self.check_cache(n);
                }
            }
            Ev::Hedge { reader, pass } => {
                if self.readers.get(&reader).is_some_and(|r| r.pass == pass) {
                    self.on_event(reader, Event::HedgeFired);
                }
            }
            Ev::StartGet { client, name } => self.start_get(client, name),
            Ev::Write { name } => self.write(name),
            Ev::Delete { name } => self.delete(name),
            Ev::Crash => {
                // At most one node is down at a time; often the node of
                // fragment 0 of an object being read.
                if self.nodes.iter().any(|n| !n.alive) {
                    return;
                }
                let reading: Vec<usize> = self.readers.values().map(|r| r.version).collect();
                let node = match reading.is_empty() || self.rng.chance(30) {
                    true => self.rng.below(NODES as u64) as usize,
                    false => {
                        let v =
                            &self.versions[reading[self.rng.below(reading.len() as u64) as usize]];
                        match self.rng.chance(50) {
                            true => v.nodes[0],
                            false => v.nodes[self.rng.below(v.nodes.len() as u64) as usize],
                        }
                    }
                };
                self.crash(node);
                let down = 100 + self.rng.below(800);
                self.at(down, Ev::Restart { node });
            }
            Ev::Restart { node } => self.restart(node),
            Ev::Free { node, addr } => {
                self.send(End::Meta, End::Node(node), Msg::Free { addr });
            }
            Ev::Rot => {
                let names: Vec<usize> = (0..NAMES)
                    .filter(|&n| n != PARTITIONED_NAME && self.live[n].is_some())
                    .collect();
                if names.is_empty() {
                    return;
                }
                let name = names[self.rng.below(names.len() as u64) as usize];
                let version = self.live[name].expect("live");
                let v = &self.versions[version];
                let index = self.rng.below(v.addrs.len() as u64) as usize;
                let (node, addr) = (v.nodes[index], v.addrs[index]);
                let at = self.rng.below(v.layout.fragment_len()) as usize;
                if let Some(fragment) = self.nodes[node].disk.get_mut(&addr) {
                    fragment[at] ^= 0x5a;
                    self.rotted.push((version, index, self.now));
                }
            }
            Ev::Partition { client, on, .. } => {
                if on {
                    let version = self.live[PARTITIONED_NAME].expect("never deleted");
                    let node = self.versions[version].nodes[0];
                    self.partitions.push((client, node, self.now, None));
                } else {
                    for p in self.partitions.iter_mut() {
                        if p.3.is_none() {
                            p.3 = Some(self.now);
                        }
                    }
                }
            }
        }
    }

    fn run(&mut self) {
        self.schedule();
        while let Some(Reverse((when, seq))) = self.queue.pop() {
            self.now = when;
            self.tick += 1;
            let ev = self.events.remove(&seq).expect("a scheduled event");
            self.handle(ev);
        }
        assert!(
            self.readers.is_empty(),
            "seed {}: {} reads never ended",
            self.seed,
            self.readers.len()
        );
        for node in 0..NODES {
            self.check_cache(node);
            let cache = self.nodes[node].cache;
            for v in &self.versions {
                cache.remove(v.addrs[0]);
            }
        }
    }
}

fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let first = var("SIM_SKIP", 0);
    first..first + var("SIM_SEEDS", 16)
}

#[test]
fn erasure_coded_reads_survive_faults_and_never_serve_freed_objects() {
    let mut totals = Stats::default();
    let mut runs = 0;
    for seed in seeds() {
        let mut sim = Sim::new(seed);
        sim.run();
        let s = &sim.stats;
        eprintln!("seed {seed}: {s:?}, longest Get {} ms", sim.longest);
        assert!(
            s.partitioned_gets_ok > 0,
            "seed {seed}: no Get succeeded while its client was cut from fragment 0's node: {s:?}"
        );
        assert!(
            s.succeeded > s.gets / 2,
            "seed {seed}: most Gets failed: {s:?}"
        );
        totals.gets += s.gets;
        totals.hits += s.hits;
        totals.whole_served += s.whole_served;
        totals.from_fragments += s.from_fragments;
        totals.crash_mid_get_first += s.crash_mid_get_first;
        totals.crash_mid_get_other += s.crash_mid_get_other;
        totals.rotted_caught += s.rotted_caught;
        totals.raced_frees += s.raced_frees;
        totals.gathers_refused += s.gathers_refused;
        runs += 1;
    }
    // The faults the simulation is for did happen (over the seeds run).
    if runs > 0 {
        let t = &totals;
        assert!(
            t.hits > 0 && t.whole_served > 0 && t.from_fragments > 0,
            "{t:?}"
        );
        assert!(
            t.crash_mid_get_first > 0 && t.crash_mid_get_other > 0,
            "{t:?}"
        );
        assert!(t.rotted_caught > 0, "{t:?}");
        assert!(t.raced_frees + t.gathers_refused > 0, "{t:?}");
    }
}

#[test]
fn the_simulation_is_deterministic() {
    let mut a = Sim::new(7);
    a.run();
    let mut b = Sim::new(7);
    b.run();
    assert_eq!(format!("{:?}", a.stats), format!("{:?}", b.stats));
    assert_eq!(a.now, b.now);
}
