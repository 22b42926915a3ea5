//! Deterministic simulation of storage nodes running the real core.
//!
//! Several storage nodes run [`StorageCore`] and its [`PutMachine`]s on
//! simulated disks, driven by a seeded generator: clients Post replicas
//! down chains of nodes, Get them, delete and rewrite them; nodes crash
//! and restart; links between chain hops break (TCP's loss: a connection
//! loses everything from some message on) and messages of different
//! connections are reordered by random delays; collection rounds run on
//! every node while Posts are under way. A simulated disk keeps what was
//! synced: a crash drops unsynced bytes and names, may tear the last
//! write, and the simulation also rots or tears replica files in place,
//! as a failing medium would. Checks:
//! - a chain acknowledges `copies` only when its first `copies` hops hold
//!   the replica durably (synced, renamed and the name synced): an
//!   acknowledgement of the whole chain means every hop synced;
//! - an acknowledged, committed replica always reads back whole, with its
//!   CRC, across crashes; after healing, every one still does;
//! - a read never serves a torn or rotten replica as good, and whatever
//!   it serves as good is exactly the bytes of a Put of that address;
//! - the collector never removes a replica that is referenced or whose
//!   Put is in flight.
//!
//! Simplifications: each Put has its own connection (the real nodes
//! reuse them); Gets and Frees are executed at the node at once, with
//! the same decisions as the shell; disk writes never fail.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashSet};
use strata_store::storage::collect::RoundId;
use strata_store::storage::core::StorageCore;
use strata_store::storage::file::{check_header, file_name, parse_name, verified, CHECKSUM_OFFSET};
use strata_store::storage::put::{PutAction, PutEvent, PutMachine, PutPhase, PutReply};
use strata_store_protocol::addr::{Addr, Layout, DEFAULT_CLUSTER_PREFIX};
use strata_store_protocol::data::Request;

const NODES: u16 = 4;
const CLIENTS: usize = 4;
const CHAIN: usize = 3;
const CAPACITY: u64 = 1 << 30;
/// How long a node waits for more of a Put's data before calling it
/// broken (the shell's read timeout).
const READ_TIMEOUT_MS: u64 = 500;
/// How long a node waits for the next hop's answer.
const ANSWER_TIMEOUT_MS: u64 = 1_000;
/// How long a client waits for its Put's answer.
const CLIENT_TIMEOUT_MS: u64 = 4_000;
/// Most time between an acknowledgement and its commit: well inside the
/// grace, as the metadata nodes' data deadline makes it.
const COMMIT_MAX_MS: u64 = 300;
/// Replicas younger than this are never collected.
const GRACE_MS: u64 = 5_000;
/// Simulated time of the faulty phase; healing follows.
const RUN_MS: u64 = 60_000;

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(strata_store_protocol::addr::splitmix64(seed).max(1))
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

/// A file's bytes now, and what survives a crash.
#[derive(Default)]
struct Inode {
    data: Vec<u8>,
    synced: Vec<u8>,
    /// Writes since the last sync, oldest first: a crash keeps a prefix.
    pending: Vec<(usize, Vec<u8>)>,
    mtime: u64,
}

/// A simulated disk: inodes, the names now, and the names as of the last
/// directory sync.
#[derive(Default)]
struct Disk {
    inodes: BTreeMap<u64, Inode>,
    names: BTreeMap<String, u64>,
    durable: BTreeMap<String, u64>,
    next: u64,
}

impl Disk {
    fn create(&mut self, name: &str, now: u64) {
        self.next += 1;
        self.inodes.insert(
            self.next,
            Inode {
                mtime: now,
                ..Inode::default()
            },
        );
        self.names.insert(name.to_string(), self.next);
    }
    fn write(&mut self, name: &str, at: usize, bytes: &[u8], now: u64) {
        let Some(inode) = self.names.get(name).and_then(|i| self.inodes.get_mut(i)) else {
            return;
        };
        apply(&mut inode.data, at, bytes);
        inode.pending.push((at, bytes.to_vec()));
        inode.mtime = now;
    }
    fn len(&self, name: &str) -> usize {
        self.read(name).map_or(0, |d| d.len())
    }
    fn sync(&mut self, name: &str) {
        if let Some(inode) = self.names.get(name).and_then(|i| self.inodes.get_mut(i)) {
            inode.synced = inode.data.clone();
            inode.pending.clear();
        }
    }
    fn rename(&mut self, from: &str, to: &str) {
        if let Some(id) = self.names.remove(from) {
            self.names.insert(to.to_string(), id);
        }
    }
    fn sync_names(&mut self) {
        self.durable = self.names.clone();
    }
    fn unlink(&mut self, name: &str) {
        self.names.remove(name);
    }
    fn read(&self, name: &str) -> Option<&[u8]> {
        Some(&self.inodes.get(self.names.get(name)?)?.data)
    }
    /// What a crash would leave under `name`, if anything.
    fn durable(&self, name: &str) -> Option<&[u8]> {
        Some(&self.inodes.get(self.durable.get(name)?)?.synced)
    }
    /// Unsynced names and bytes are lost; of each file's unsynced writes,
    /// a prefix survives, the last of them possibly torn.
    fn crash(&mut self, rng: &mut Rng) {
        self.names = self.durable.clone();
        let live: BTreeSet<u64> = self.names.values().copied().collect();
        self.inodes.retain(|id, _| live.contains(id));
        for inode in self.inodes.values_mut() {
            let mut data = inode.synced.clone();
            let kept = rng.below(inode.pending.len() as u64 + 1) as usize;
            for (i, (at, bytes)) in inode.pending.iter().take(kept).enumerate() {
                let torn = i + 1 == kept && rng.chance(50);
                let n = if torn {
                    rng.below(bytes.len() as u64) as usize
                } else {
                    bytes.len()
                };
                apply(&mut data, *at, &bytes[..n]);
            }
            inode.data = data.clone();
            inode.synced = data;
            inode.pending.clear();
        }
    }
}

fn apply(data: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    if data.len() < at + bytes.len() {
        data.resize(at + bytes.len(), 0);
    }
    data[at..at + bytes.len()].copy_from_slice(bytes);
}

fn replica_name(addr: Addr) -> String {
    format!("r/{}", file_name(addr))
}

/// What travels on a data connection.
#[derive(Clone, Debug)]
enum Wire {
    Header {
        addr: Addr,
        size: u64,
        chain: Vec<Addr>,
    },
    Data(Vec<u8>),
    Checksum(u32),
    Answer(PutReply),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    Client(usize),
    Node(u16),
}

struct Conn {
    from: Peer,
    to: u16,
    broken: bool,
    /// Per direction (to the node, back from it): when the last message
    /// arrives, so a connection stays in order.
    last_at: [u64; 2],
}

#[derive(Debug)]
enum Ev {
    Deliver {
        conn: usize,
        back: bool,
        msg: Wire,
    },
    ReadTimeout {
        conn: usize,
    },
    AnswerTimeout {
        conn: usize,
    },
    Synced {
        node: u16,
        life: u64,
        conn: usize,
    },
    Installed {
        node: u16,
        life: u64,
        conn: usize,
    },
    Crash {
        node: u16,
    },
    Restart {
        node: u16,
    },
    Collect {
        node: u16,
    },
    CollectAnswer {
        node: u16,
        life: u64,
        round: RoundId,
    },
    Client {
        client: usize,
    },
    ClientTimeout {
        client: usize,
        conn: usize,
    },
    Commit {
        client: usize,
        post: usize,
    },
    Rot {
        node: u16,
    },
}

struct Node {
    up: bool,
    /// Bumped by each crash: disk completions of an earlier life are void.
    life: u64,
    disk: Disk,
    core: StorageCore,
    puts: BTreeMap<usize, NodePut>,
    tmp_seq: u64,
}

struct NodePut {
    machine: PutMachine,
    tmp: String,
    down: Option<usize>,
    awaiting: bool,
}

/// A Post a client made: its replicas and data.
#[derive(Clone)]
struct Post {
    addrs: Vec<Addr>,
    data: Vec<u8>,
    bad_checksum: bool,
    conn: usize,
    /// Durable copies acknowledged.
    copies: usize,
}

#[derive(Default)]
struct Client {
    posting: Option<usize>,
    committed: Vec<usize>,
}

#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    acks: u64,
    whole_chains: u64,
    short_chains: u64,
    crashes: u64,
    collected: u64,
    damaged_reads: u64,
    good_reads: u64,
    rewrites: u64,
}

struct Sim {
    rng: Rng,
    now: u64,
    seq: u64,
    layout: Layout,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Ev>>,
    nodes: Vec<Node>,
    conns: Vec<Conn>,
    clients: Vec<Client>,
    posts: Vec<Post>,
    next_id: u64,
    loss: u64,
    /// Every version of data ever sent to an address.
    versions: BTreeMap<Addr, Vec<Vec<u8>>>,
    /// Replicas the metadata would name: committed and not deleted.
    referenced: BTreeSet<Addr>,
    /// Acknowledged durable, committed, not deleted or damaged: must read
    /// back as this.
    holds: BTreeMap<Addr, Vec<u8>>,
    /// Replicas the simulation rotted or tore in place.
    damaged: BTreeSet<Addr>,
    counts: Counts,
    trace: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 4);
        let nodes = (1..=NODES)
            .map(|index| Node {
                up: true,
                life: 0,
                disk: Disk::default(),
                core: StorageCore::new(index, CAPACITY, 0, 0),
                puts: BTreeMap::new(),
                tmp_seq: 0,
            })
            .collect();
        let mut rng = Rng::new(seed);
        let loss = 1 + rng.below(4);
        let mut sim = Sim {
            rng,
            now: 0,
            seq: 0,
            layout,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            nodes,
            conns: Vec::new(),
            clients: (0..CLIENTS).map(|_| Client::default()).collect(),
            posts: Vec::new(),
            next_id: 1,
            loss,
            versions: BTreeMap::new(),
            referenced: BTreeSet::new(),
            holds: BTreeMap::new(),
            damaged: BTreeSet::new(),
            counts: Counts::default(),
            trace: 0,
        };
        for client in 0..CLIENTS {
            sim.later(0, 100, Ev::Client { client });
        }
        for node in 1..=NODES {
            sim.later(1_000, 2_000, Ev::Collect { node });
            sim.later(5_000, 20_000, Ev::Crash { node });
            sim.later(3_000, 30_000, Ev::Rot { node });
        }
        sim
    }

    fn at(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Some(ev));
        self.queue
            .push(Reverse((self.now + delay, self.seq, self.events.len() - 1)));
    }

    fn later(&mut self, least: u64, spread: u64, ev: Ev) {
        let delay = least + self.rng.below(spread);
        self.at(delay, ev);
    }

    fn node(&mut self, index: u16) -> &mut Node {
        &mut self.nodes[index as usize - 1]
    }

    fn healing(&self) -> bool {
        self.now >= RUN_MS
    }

    /// Runs until nothing is left to do after the faulty phase.
    fn run(&mut self) {
        while let Some(Reverse((at, _, id))) = self.queue.pop() {
            self.now = at;
            let Some(ev) = self.events[id].take() else {
                continue;
            };
            self.trace = strata_store_protocol::addr::splitmix64(self.trace ^ at ^ kind(&ev));
            self.handle(ev);
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { conn, back, msg } => self.deliver(conn, back, msg),
            Ev::ReadTimeout { conn } => {
                let to = self.conns[conn].to;
                if self
                    .node(to)
                    .puts
                    .get(&conn)
                    .is_some_and(|p| p.machine.phase() == PutPhase::Receiving)
                {
                    self.feed(to, conn, Feed::Event(PutEvent::Broken));
                }
            }
            Ev::AnswerTimeout { conn } => self.answer_timeout(conn),
            Ev::Synced { node, life, conn } => {
                if self.node(node).life == life {
                    let tmp = self.node(node).puts.get(&conn).map(|p| p.tmp.clone());
                    if let Some(tmp) = tmp {
                        self.node(node).disk.sync(&tmp);
                        self.feed(node, conn, Feed::Event(PutEvent::Synced));
                    }
                }
            }
            Ev::Installed { node, life, conn } => {
                if self.node(node).life == life && self.node(node).puts.contains_key(&conn) {
                    self.node(node).disk.sync_names();
                    self.feed(node, conn, Feed::Installed);
                }
            }
            Ev::Crash { node } => self.crash(node),
            Ev::Restart { node } => self.restart(node),
            Ev::Collect { node } => self.collect(node),
            Ev::CollectAnswer { node, life, round } => self.collect_answer(node, life, round),
            Ev::Client { client } => self.client_step(client),
            Ev::ClientTimeout { client, conn } => {
                if self.clients[client]
                    .posting
                    .is_some_and(|p| self.posts[p].conn == conn)
                {
                    self.clients[client].posting = None;
                    self.break_conn(conn);
                    self.later(0, 200, Ev::Client { client });
                }
            }
            Ev::Commit { client, post } => self.commit(client, post),
            Ev::Rot { node } => self.rot(node),
        }
    }

    // ---- the network ----

    fn connect(&mut self, from: Peer, to: u16) -> usize {
        let broken = !self.node(to).up;
        self.conns.push(Conn {
            from,
            to,
            broken,
            last_at: [0; 2],
        });
        self.conns.len() - 1
    }

    fn send(&mut self, conn: usize, back: bool, msg: Wire) {
        if self.conns[conn].broken {
            return;
        }
        if !self.healing() && self.rng.chance(self.loss) {
            self.break_conn(conn);
            return;
        }
        let delay = 1 + self.rng.below(40);
        let dir = back as usize;
        let at = (self.now + delay).max(self.conns[conn].last_at[dir]);
        self.conns[conn].last_at[dir] = at;
        self.at(at - self.now, Ev::Deliver { conn, back, msg });
    }

    /// The connection loses everything from now on; its node notices when
    /// it next waits for data.
    fn break_conn(&mut self, conn: usize) {
        if !self.conns[conn].broken {
            self.conns[conn].broken = true;
            self.at(READ_TIMEOUT_MS, Ev::ReadTimeout { conn });
        }
    }

    fn deliver(&mut self, conn: usize, back: bool, msg: Wire) {
        if self.conns[conn].broken {
            return;
        }
        if back {
            let answer = match msg {
                Wire::Answer(reply) => reply,
                other => panic!("only answers travel back: {other:?}"),
            };
            match self.conns[conn].from {
                Peer::Client(client) => self.client_answer(client, conn, answer),
                Peer::Node(node) => self.downstream_answer(node, conn, answer),
            }
            return;
        }
        let to = self.conns[conn].to;
        if !self.node(to).up {
            return;
        }
        match msg {
            Wire::Header { addr, size, chain } => self.put_header(to, conn, addr, size, chain),
            Wire::Data(chunk) => {
                if self.node(to).puts.contains_key(&conn) {
                    self.feed(to, conn, Feed::Data(chunk));
                }
            }
            Wire::Checksum(crc) => {
                if self.node(to).puts.contains_key(&conn) {
                    self.feed(to, conn, Feed::Event(PutEvent::Checksum(crc)));
                }
            }
            Wire::Answer(_) => panic!("an answer sent downstream"),
        }
    }
}

/// A number for each kind of event, for the trace.
fn kind(ev: &Ev) -> u64 {
    match ev {
        Ev::Deliver { conn, back, .. } => (*conn as u64) << 8 | *back as u64,
        Ev::ReadTimeout { .. } => 1,
        Ev::AnswerTimeout { .. } => 2,
        Ev::Synced { .. } => 3,
        Ev::Installed { .. } => 4,
        Ev::Crash { node } => 5 | (*node as u64) << 4,
        Ev::Restart { .. } => 6,
        Ev::Collect { .. } => 7,
        Ev::CollectAnswer { .. } => 8,
        Ev::Client { .. } => 9,
        Ev::ClientTimeout { .. } => 10,
        Ev::Commit { .. } => 11,
        Ev::Rot { .. } => 12,
    }
}

/// What a node's Put is fed.
enum Feed<'a> {
    Data(Vec<u8>),
    Event(PutEvent<'a>),
    Installed,
}

// ---- a node executing its core's actions ----
impl Sim {
    fn put_header(&mut self, to: u16, conn: usize, addr: Addr, size: u64, chain: Vec<Addr>) {
        let layout = self.layout;
        let req = Request::Put {
            addr,
            size,
            chain: chain.clone(),
        };
        let coordinator = matches!(self.conns[conn].from, Peer::Client(_)).then_some(7);
        let node = self.node(to);
        let exists = node.disk.read(&replica_name(addr)).is_some();
        let checked = node.core.check_request(&layout, &req, None);
        let admitted = checked.and_then(|()| {
            node.core
                .admit_put(addr, size, chain, coordinator, exists, u64::MAX)
        });
        match admitted {
            Err(refusal) => self.send(conn, true, Wire::Answer(PutReply::Error(refusal.message))),
            Ok((machine, first)) => {
                let node = self.node(to);
                node.tmp_seq += 1;
                let tmp = format!("t/{addr:032x}.{}", node.tmp_seq);
                node.puts.insert(
                    conn,
                    NodePut {
                        machine,
                        tmp,
                        down: None,
                        awaiting: false,
                    },
                );
                self.execute(to, conn, first, &[]);
            }
        }
    }

    /// Feeds one Put of node `to` and executes what it answers.
    fn feed(&mut self, to: u16, conn: usize, feed: Feed) {
        let node = &mut self.nodes[to as usize - 1];
        let Some(put) = node.puts.get_mut(&conn) else {
            return;
        };
        let (actions, chunk) = match feed {
            Feed::Data(chunk) => (put.machine.handle(PutEvent::Data(&chunk)), chunk),
            Feed::Event(ev) => (put.machine.handle(ev), Vec::new()),
            Feed::Installed => (node.core.installed(&mut put.machine), Vec::new()),
        };
        self.execute(to, conn, actions, &chunk);
    }

    fn execute(&mut self, to: u16, conn: usize, actions: Vec<PutAction>, chunk: &[u8]) {
        for action in actions {
            self.perform(to, conn, action, chunk);
        }
        let node = self.node(to);
        if !node
            .puts
            .get(&conn)
            .is_some_and(|p| p.machine.phase() == PutPhase::Done)
        {
            return;
        }
        if let Some(put) = node.puts.remove(&conn) {
            node.core.end_put(&put.machine);
            // The next hop's connection is closed with the Put.
            if let Some(down) = put.down {
                self.break_conn(down);
            }
        }
    }

    fn perform(&mut self, to: u16, conn: usize, action: PutAction, chunk: &[u8]) {
        let now = self.now;
        let life = self.node(to).life;
        let Some(tmp) = self.node(to).puts.get(&conn).map(|p| p.tmp.clone()) else {
            return;
        };
        match action {
            PutAction::CreateTemp { header } => {
                let disk = &mut self.node(to).disk;
                disk.create(&tmp, now);
                disk.write(&tmp, 0, &header, now);
            }
            PutAction::OpenForward { next, chain, size } => {
                let Some(index) = self.layout.sn_of(next).filter(|i| (1..=NODES).contains(i))
                else {
                    return self.feed(to, conn, Feed::Event(PutEvent::ForwardFailed));
                };
                if !self.node(index).up {
                    // Refused at once: nothing listens there.
                    return self.feed(to, conn, Feed::Event(PutEvent::ForwardFailed));
                }
                let down = self.connect(Peer::Node(to), index);
                if let Some(put) = self.node(to).puts.get_mut(&conn) {
                    put.down = Some(down);
                }
                self.send(
                    down,
                    false,
                    Wire::Header {
                        addr: next,
                        size,
                        chain,
                    },
                );
            }
            PutAction::Write => {
                let disk = &mut self.node(to).disk;
                let end = disk.len(&tmp);
                disk.write(&tmp, end, chunk, now);
            }
            PutAction::Forward => self.forward(to, conn, Wire::Data(chunk.to_vec())),
            PutAction::ForwardChecksum { crc } => self.forward(to, conn, Wire::Checksum(crc)),
            PutAction::WriteChecksum { crc, table } => {
                let disk = &mut self.node(to).disk;
                let end = disk.len(&tmp);
                disk.write(&tmp, end, &table, now);
                disk.write(&tmp, CHECKSUM_OFFSET as usize, &crc.to_be_bytes(), now);
            }
            PutAction::Sync => self.later(
                1,
                20,
                Ev::Synced {
                    node: to,
                    life,
                    conn,
                },
            ),
            PutAction::Install => {
                let addr = self.node(to).puts[&conn].machine.addr();
                self.node(to).disk.rename(&tmp, &replica_name(addr));
                // A new file: whatever rotted before is gone.
                self.damaged.remove(&addr);
                self.later(
                    1,
                    20,
                    Ev::Installed {
                        node: to,
                        life,
                        conn,
                    },
                );
            }
            PutAction::AwaitForward => {
                let down = self.node(to).puts.get_mut(&conn).and_then(|p| {
                    p.awaiting = true;
                    p.down
                });
                match down {
                    Some(down) => self.at(ANSWER_TIMEOUT_MS, Ev::AnswerTimeout { conn: down }),
                    None => self.feed(to, conn, Feed::Event(PutEvent::ForwardAnswer(None))),
                }
            }
            PutAction::Reply(reply) => {
                if let PutReply::Ack { copies } = reply {
                    let addr = self.node(to).puts[&conn].machine.addr();
                    assert!(
                        self.node(to).disk.durable(&replica_name(addr)).is_some(),
                        "node {to} acknowledged {addr:x} ({copies} copies) before it was durable"
                    );
                }
                self.send(conn, true, Wire::Answer(reply));
            }
            PutAction::RemoveTemp => self.node(to).disk.unlink(&tmp),
            PutAction::ReportAbandoned { replica, .. } => {
                assert!(
                    !self.holds.contains_key(&replica),
                    "a committed replica {replica:x} was reported abandoned"
                );
            }
        }
    }

    fn forward(&mut self, to: u16, conn: usize, msg: Wire) {
        let down = self.node(to).puts.get(&conn).and_then(|p| p.down);
        match down {
            Some(down) => self.send(down, false, msg),
            None => self.feed(to, conn, Feed::Event(PutEvent::ForwardFailed)),
        }
    }

    /// The next hop answered on `down`: feed the Put that forwarded there.
    fn downstream_answer(&mut self, node: u16, down: usize, reply: PutReply) {
        if !self.node(node).up {
            return;
        }
        let Some(conn) = self
            .node(node)
            .puts
            .iter()
            .find(|(_, p)| p.down == Some(down))
            .map(|(c, _)| *c)
        else {
            return;
        };
        let copies = match reply {
            PutReply::Ack { copies } => Some(copies),
            PutReply::Error(_) => None,
        };
        self.feed(node, conn, Feed::Event(PutEvent::ForwardAnswer(copies)));
    }

    fn answer_timeout(&mut self, down: usize) {
        let Peer::Node(node) = self.conns[down].from else {
            return;
        };
        let waiting = self
            .node(node)
            .puts
            .iter()
            .find(|(_, p)| p.down == Some(down) && p.awaiting)
            .map(|(c, _)| *c);
        if let Some(conn) = waiting {
            self.feed(node, conn, Feed::Event(PutEvent::ForwardAnswer(None)));
        }
    }

    fn crash(&mut self, index: u16) {
        if self.healing() || !self.node(index).up {
            return;
        }
        self.counts.crashes += 1;
        let node = &mut self.nodes[index as usize - 1];
        node.up = false;
        node.life += 1;
        node.puts.clear();
        node.disk.crash(&mut self.rng);
        for conn in 0..self.conns.len() {
            let c = &self.conns[conn];
            if c.to == index || c.from == Peer::Node(index) {
                self.break_conn(conn);
            }
        }
        self.later(200, 2_000, Ev::Restart { node: index });
    }

    /// The shell's open: temporary files are Puts never acknowledged;
    /// the replica files are counted.
    fn restart(&mut self, index: u16) {
        let node = &mut self.nodes[index as usize - 1];
        let tmp: Vec<String> = node
            .disk
            .names
            .keys()
            .filter(|n| n.starts_with("t/"))
            .cloned()
            .collect();
        for name in tmp {
            node.disk.unlink(&name);
        }
        let (mut used, mut objects) = (0, 0);
        for name in node.disk.names.keys().filter(|n| n.starts_with("r/")) {
            used += node.disk.len(name) as u64;
            objects += 1;
        }
        node.core = StorageCore::new(index, CAPACITY, used, objects);
        node.up = true;
        if !self.healing() {
            self.later(3_000, 20_000, Ev::Crash { node: index });
        }
    }

    // ---- collection ----

    fn collect(&mut self, index: u16) {
        if self.node(index).up {
            let now = self.now;
            let node = self.node(index);
            let files: Vec<(Addr, u64)> = node
                .disk
                .names
                .iter()
                .filter_map(|(name, id)| {
                    let addr = parse_name(name.strip_prefix("r/")?)?;
                    Some((addr, now.saturating_sub(node.disk.inodes[id].mtime)))
                })
                .collect();
            let (round, _) = node.core.begin_collection(files, GRACE_MS);
            let life = node.life;
            // The metadata nodes answer after a while.
            self.later(
                1,
                2_000,
                Ev::CollectAnswer {
                    node: index,
                    life,
                    round,
                },
            );
        }
        if self.now < RUN_MS + 20_000 {
            self.later(500, 2_000, Ev::Collect { node: index });
        }
    }

    fn collect_answer(&mut self, index: u16, life: u64, round: RoundId) {
        if !self.node(index).up || self.node(index).life != life {
            return;
        }
        let referenced: HashSet<Addr> = self.referenced.iter().copied().collect();
        let node = &mut self.nodes[index as usize - 1];
        let remove = node.core.finish_collection(round, &referenced);
        for addr in remove {
            assert!(
                !self.referenced.contains(&addr),
                "collected the referenced replica {addr:x}"
            );
            assert!(
                !self.holds.contains_key(&addr),
                "collected the held replica {addr:x}"
            );
            assert!(
                !node.puts.values().any(|p| p.machine.addr() == addr),
                "collected {addr:x} while its Put is in flight"
            );
            let name = replica_name(addr);
            let len = node.disk.len(&name) as u64;
            if node.disk.read(&name).is_some() {
                node.disk.unlink(&name);
                node.core.removed(len);
                self.counts.collected += 1;
            }
        }
    }

    /// A failing medium: a replica file rots or is torn in place.
    fn rot(&mut self, index: u16) {
        if self.healing() {
            return;
        }
        let pick = self.rng.next();
        let tear = self.rng.chance(50);
        let node = &mut self.nodes[index as usize - 1];
        let names: Vec<String> = node
            .disk
            .names
            .keys()
            .filter(|n| n.starts_with("r/"))
            .cloned()
            .collect();
        if let Some(name) = names.get((pick % names.len().max(1) as u64) as usize) {
            let id = node.disk.names[name];
            let inode = node.disk.inodes.get_mut(&id).expect("named inode");
            if tear {
                let keep = (pick >> 8) as usize % inode.data.len().max(1);
                inode.data.truncate(keep);
            } else {
                // Bytes 4..8 (version, reserved) are left alone: rot
                // anywhere else (the data, its checksum or its chunk
                // table).
                let at = (pick >> 8) as usize % (inode.data.len() - 4);
                let at = if at < 4 { at } else { at + 4 };
                inode.data[at] ^= 1 << ((pick >> 40) % 8);
            }
            inode.synced = inode.data.clone();
            let addr = parse_name(&name[2..]).expect("a replica name");
            self.damaged.insert(addr);
            self.holds.remove(&addr);
        }
        self.later(5_000, 20_000, Ev::Rot { node: index });
    }
}

// ---- clients and the checks ----
impl Sim {
    fn client_step(&mut self, client: usize) {
        if self.healing() {
            return;
        }
        let roll = self.rng.below(100);
        if roll < 45 || self.clients[client].committed.is_empty() {
            let addrs = self.fresh_chain();
            // The answer or the timeout takes the client's next step.
            return self.post(client, addrs);
        } else if roll < 65 {
            let i = self.rng.below(self.clients[client].committed.len() as u64) as usize;
            let post = self.clients[client].committed.swap_remove(i);
            let addrs = self.posts[post].addrs.clone();
            self.delete(&addrs);
            if self.rng.chance(60) {
                // Written again at the same addresses, as a repair would.
                self.counts.rewrites += 1;
                return self.post(client, addrs);
            }
        } else {
            let addr = *self
                .versions
                .keys()
                .nth(self.rng.below(self.versions.len() as u64) as usize)
                .expect("a version");
            self.get(addr);
        }
        self.later(1, 300, Ev::Client { client });
    }

    fn fresh_chain(&mut self) -> Vec<Addr> {
        let mut nodes: Vec<u16> = (1..=NODES).collect();
        for i in (1..nodes.len()).rev() {
            nodes.swap(i, self.rng.below(i as u64 + 1) as usize);
        }
        nodes[..CHAIN]
            .iter()
            .map(|&n| {
                self.next_id += 1;
                self.layout.replica_addr(n, self.next_id)
            })
            .collect()
    }

    fn post(&mut self, client: usize, addrs: Vec<Addr>) {
        let size = match self.rng.below(10) {
            0 => 0,
            1..=6 => 1 + self.rng.below(600),
            _ => 600 + self.rng.below(3_000),
        };
        let data: Vec<u8> = (0..size).map(|_| self.rng.next() as u8).collect();
        let bad_checksum = self.rng.chance(3);
        let first = self.layout.sn_of(addrs[0]).expect("a storage address");
        let conn = self.connect(Peer::Client(client), first);
        for addr in &addrs {
            self.versions.entry(*addr).or_default().push(data.clone());
        }
        self.posts.push(Post {
            addrs: addrs.clone(),
            data: data.clone(),
            bad_checksum,
            conn,
            copies: 0,
        });
        self.clients[client].posting = Some(self.posts.len() - 1);
        let header = Wire::Header {
            addr: addrs[0],
            size,
            chain: addrs[1..].to_vec(),
        };
        self.send(conn, false, header);
        let mut at = 0;
        while at < data.len() {
            let n = (1 + self.rng.below(700) as usize).min(data.len() - at);
            self.send(conn, false, Wire::Data(data[at..at + n].to_vec()));
            at += n;
        }
        let crc = crc32c::crc32c(&data) ^ bad_checksum as u32;
        self.send(conn, false, Wire::Checksum(crc));
        self.at(CLIENT_TIMEOUT_MS, Ev::ClientTimeout { client, conn });
    }

    fn client_answer(&mut self, client: usize, conn: usize, reply: PutReply) {
        let Some(post) = self.clients[client]
            .posting
            .filter(|&p| self.posts[p].conn == conn)
        else {
            return;
        };
        self.clients[client].posting = None;
        if let PutReply::Ack { copies } = reply {
            self.acknowledged(post, copies);
            self.later(0, COMMIT_MAX_MS, Ev::Commit { client, post });
        } else {
            self.later(1, 300, Ev::Client { client });
        }
    }

    /// A chain's acknowledgement of `copies`: its first `copies` hops
    /// hold the data durably, whole.
    fn acknowledged(&mut self, post: usize, copies: u8) {
        let Post {
            addrs,
            data,
            bad_checksum,
            ..
        } = self.posts[post].clone();
        assert!(
            !bad_checksum,
            "a Put whose checksum was wrong was acknowledged"
        );
        assert!(
            (1..=CHAIN).contains(&(copies as usize)),
            "{copies} copies acknowledged for a chain of {CHAIN}"
        );
        self.counts.acks += 1;
        self.posts[post].copies = copies as usize;
        if copies as usize == CHAIN {
            self.counts.whole_chains += 1;
        } else {
            self.counts.short_chains += 1;
        }
        for &addr in &addrs[..copies as usize] {
            let index = self.layout.sn_of(addr).expect("a storage address");
            if self.damaged.contains(&addr) {
                // Rotted since its install, as a failing medium may.
                continue;
            }
            let durable = self.node(index).disk.durable(&replica_name(addr));
            let file = durable
                .unwrap_or_else(|| panic!("acknowledged {addr:x} is not durable on node {index}"));
            assert_eq!(
                read_file(file),
                Some(data.clone()),
                "acknowledged {addr:x} is not durable whole on node {index}"
            );
        }
    }

    fn commit(&mut self, client: usize, post: usize) {
        let Post { addrs, data, .. } = self.posts[post].clone();
        let copies = self.posts[post].copies;
        for (i, &addr) in addrs.iter().enumerate() {
            self.referenced.insert(addr);
            // Only the copies acknowledged are known durable (and not
            // rotted since).
            if i < copies && !self.damaged.contains(&addr) {
                self.holds.insert(addr, data.clone());
            }
        }
        self.clients[client].committed.push(post);
        self.later(1, 300, Ev::Client { client });
    }

    /// The metadata forgets the object, then its replicas are freed (a
    /// Free to a node that is down is lost: the collector frees it).
    fn delete(&mut self, addrs: &[Addr]) {
        let layout = self.layout;
        for &addr in addrs {
            self.referenced.remove(&addr);
            self.holds.remove(&addr);
            let index = layout.sn_of(addr).expect("a storage address");
            let node = self.node(index);
            if !node.up
                || node
                    .core
                    .check_request(&layout, &Request::Free { addr }, None)
                    .is_err()
            {
                continue;
            }
            let name = replica_name(addr);
            if node.disk.read(&name).is_some() {
                let len = node.disk.len(&name) as u64;
                node.disk.unlink(&name);
                node.core.removed(len);
            }
        }
    }

    /// A Get: what the node serves as good must be a version sent to the
    /// address, and a held replica must be served, whole.
    fn get(&mut self, addr: Addr) {
        let index = self.layout.sn_of(addr).expect("a storage address");
        let layout = self.layout;
        let node = self.node(index);
        if !node.up {
            return;
        }
        assert!(node
            .core
            .check_request(&layout, &Request::Get { addr }, None)
            .is_ok());
        let served = node.disk.read(&replica_name(addr)).map(read_file);
        match served {
            Some(Some(data)) => {
                self.counts.good_reads += 1;
                assert!(
                    !self.damaged.contains(&addr),
                    "damaged replica {addr:x} served as good"
                );
                assert!(
                    self.versions.get(&addr).is_some_and(|v| v.contains(&data)),
                    "{addr:x} served bytes no Put sent"
                );
                if let Some(held) = self.holds.get(&addr) {
                    assert_eq!(
                        &data, held,
                        "{addr:x} served an older version than the acknowledged one"
                    );
                }
            }
            Some(None) => {
                self.counts.damaged_reads += 1;
                assert!(
                    !self.holds.contains_key(&addr),
                    "held replica {addr:x} reads as damaged"
                );
            }
            None => assert!(
                !self.holds.contains_key(&addr),
                "held replica {addr:x} is gone from node {index}"
            ),
        }
    }

    /// After healing: every node up, every held replica whole.
    fn check_healed(&mut self) {
        for index in 1..=NODES {
            assert!(self.node(index).up, "node {index} still down after healing");
            assert!(
                self.node(index).puts.is_empty(),
                "node {index} still has Puts in flight"
            );
            assert!(self.node(index).core.in_flight().is_empty());
        }
        let held: Vec<Addr> = self.holds.keys().copied().collect();
        for addr in held {
            self.get(addr);
        }
        for &addr in &self.damaged {
            let index = self.layout.sn_of(addr).expect("a storage address");
            if let Some(file) = self.nodes[index as usize - 1]
                .disk
                .read(&replica_name(addr))
            {
                assert_eq!(
                    read_file(file),
                    None,
                    "damaged replica {addr:x} reads as good"
                );
            }
        }
    }
}

/// What a Get and a ranged read serve as good from a replica file: its
/// data if the header, length and checksum agree and (layout 2) every
/// chunk's CRC in the table is its chunk's (the shell's decisions), else
/// `None`.
fn read_file(file: &[u8]) -> Option<Vec<u8>> {
    let header = check_header(file, file.len() as u64)?;
    let start = strata_store::storage::file::FILE_HEADER;
    let end = start + usize::try_from(header.size).ok()?;
    let data = file.get(start..end)?;
    if header.table_offset().is_some() {
        let mut table = strata_store::storage::file::ChunkTable::default();
        table.push(data);
        if file.get(end..)? != table.finish() {
            return None;
        }
    }
    verified(&header, crc32c::crc32c(data), data.len() as u64).then(|| data.to_vec())
}

fn simulate(seed: u64) -> Sim {
    let mut sim = Sim::new(seed);
    sim.run();
    sim.check_healed();
    sim
}

fn seeds() -> std::ops::Range<u64> {
    let base = std::env::var("STORAGE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let count = std::env::var("STORAGE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    base..base + count
}

#[test]
fn storage_nodes_under_crashes_broken_links_and_collection_lose_no_acknowledged_replica() {
    let mut total = Counts::default();
    for seed in seeds() {
        let sim = std::panic::catch_unwind(|| simulate(seed)).unwrap_or_else(|_| {
            panic!("seed {seed} failed; replay with STORAGE_SIM_SEED={seed} STORAGE_SIM_SEEDS=1")
        });
        let c = sim.counts;
        total.acks += c.acks;
        total.whole_chains += c.whole_chains;
        total.short_chains += c.short_chains;
        total.crashes += c.crashes;
        total.collected += c.collected;
        total.damaged_reads += c.damaged_reads;
        total.good_reads += c.good_reads;
        total.rewrites += c.rewrites;
    }
    eprintln!("{total:?}");
    // The faults were there: otherwise the checks checked nothing.
    assert!(
        total.whole_chains > 100 && total.short_chains > 10,
        "{total:?}"
    );
    assert!(
        total.crashes > 20 && total.collected > 20 && total.rewrites > 20,
        "{total:?}"
    );
    assert!(
        total.damaged_reads > 0 && total.good_reads > 100,
        "{total:?}"
    );
}

#[test]
fn the_storage_simulation_is_deterministic() {
    let a = Sim::new(7);
    drop(a);
    let trace = |seed| {
        let sim = simulate(seed);
        (sim.trace, sim.counts.acks, sim.counts.collected, sim.now)
    };
    assert_eq!(trace(7), trace(7), "the same seed ran two ways");
    assert_ne!(trace(7), trace(8), "two seeds ran the same way");
}
