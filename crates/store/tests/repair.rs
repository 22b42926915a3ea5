//! Repair in the metadata node's state machine, step by step: a storage
//! node declared dead makes the coordinator copy what it held, a finished
//! copy rewrites the record under a new version, and a failed or
//! superseded copy frees what it wrote; a drain scan reports only for the
//! drain it began under, and refreshes a stale metadata copy naming the
//! drained node from its coordinator; so does the repair scan for a copy
//! naming a dead node. (The socket runtime and the copy
//! itself are exercised by `crates/cli/tests/store.rs`.) Also: a small
//! object is inlined in its record only where the metadata copies keep
//! its class's redundancy, for a Post and a Link alike.

use strata_store::metadata::database::MetaDb;
use strata_store::metadata::state::{MnCore, Out};
use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
use strata_store_protocol::table::{Device, Drain, MnEntry, Params, SnEntry, State, Table};
use strata_store_protocol::wire::{Body, Msg};

const CLIENT: u32 = 7;

fn table() -> Table {
    let layout = Layout::new(DEFAULT_CLUSTER_PREFIX, 4);
    Table {
        epoch: 1,
        layout,
        routed: false,
        params: Params {
            n_m: 1,
            w_m: 1,
            n_d: 3,
            w_d: 2,
            data_fragments: 0,
        },
        buckets: vec![],
        mns: vec![MnEntry {
            uuid: 1,
            slot: 0,
            endpoint: strata_store_protocol::wire::no_endpoint(),
            state: State::Up,
        }],
        mg_owner: vec![0; layout.mg_count()],
        sns: (1..=4)
            .map(|index| SnEntry {
                uuid: 100 + index as u64,
                index,
                endpoint: strata_store_protocol::wire::no_endpoint(),
                capacity: 1 << 40,
                free: 1 << 40,
                objects: 0,
                device: Device::Ssd,
                state: State::Up,
            })
            .collect(),
        moves: vec![],
        stand_ins: vec![],
        drains: vec![],
        keys: Vec::new(),
        on_keys: None,
        revoked: Vec::new(),
    }
}

/// A core with one object posted: its record.
fn core_with_object(dir: &std::path::Path, name: &str) -> (MnCore<u32>, Table) {
    let t = table();
    let db = MetaDb::open(&dir.join("m.redb")).unwrap();
    let mut core = MnCore::new(db, t.clone(), 0, 42);
    post(&mut core, &t, name, 0);
    (core, t)
}

/// Posts `name` (1,000 bytes) through `core` at `now`.
fn post(core: &mut MnCore<u32>, t: &Table, name: &str, now: u64) {
    let coord = t.meta_addrs(name)[0];
    // Request ids differ per Post: a resent one is answered from the
    // reply cache.
    let begin = Msg::new(
        1 + 2 * now,
        coord,
        Body::PostBegin {
            name: name.into(),
            size: 1000,
            class: None,
        },
    );
    let version = match &core.handle(now, CLIENT, begin)[..] {
        [Out::Reply(_, m)] => match &m.body {
            Body::PostPlan {
                version, replicas, ..
            } => {
                assert_eq!(replicas.len(), 3);
                *version
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let commit = Msg::new(
        2 + 2 * now,
        coord,
        Body::PostCommit {
            name: name.into(),
            version,
            crc: 0xabcd,
            attributes: b"etag and type".to_vec(),
            fragment_crcs: Vec::new(),
        },
    );
    let outs = core.handle(now + 1, CLIENT, commit);
    assert!(
        outs.iter()
            .any(|o| matches!(o, Out::Reply(_, m) if matches!(m.body, Body::Done { .. }))),
        "{outs:?}"
    );
}

fn record(core: &MnCore<u32>, t: &Table, name: &str) -> strata_store_protocol::wire::Record {
    let mg = t.layout.mg_of(t.meta_addrs(name)[0]).unwrap();
    core.db().get(mg, name).unwrap().unwrap()
}

/// Marks the storage node holding `replica` dead; returns its index.
fn kill_holder(core: &mut MnCore<u32>, t: &mut Table, replica: u128) -> u16 {
    let index = t.layout.sn_of(replica).unwrap();
    for s in &mut t.sns {
        if s.index == index {
            s.state = State::Dead;
        }
    }
    core.set_table(t.clone());
    index
}

fn copies(outs: &[Out<u32>]) -> Vec<(u64, Vec<u128>, Vec<u128>, u32)> {
    outs.iter()
        .filter_map(|o| match o {
            Out::Copy {
                version,
                sources,
                targets,
                crc,
                ..
            } => Some((*version, sources.clone(), targets.clone(), *crc)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_dead_node_s_replica_is_copied_and_the_record_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, mut t) = core_with_object(dir.path(), "a/obj");
    let before = record(&core, &t, "a/obj");
    // Nothing to do while every node is up.
    assert!(copies(&core.tick(10)).is_empty());
    let dead = kill_holder(&mut core, &mut t, before.replicas[0]);
    let outs = core.tick(20);
    let copy = copies(&outs);
    assert_eq!(copy.len(), 1, "{outs:?}");
    let (version, sources, targets, crc) = copy[0].clone();
    assert_eq!((version, crc), (before.version, 0xabcd));
    assert_eq!(
        sources,
        before.replicas[1..].to_vec(),
        "copies come from live replicas"
    );
    assert_eq!(targets.len(), 1);
    let target_node = t.layout.sn_of(targets[0]).unwrap();
    assert!(
        target_node != dead
            && !before
                .replicas
                .iter()
                .any(|&r| t.layout.sn_of(r) == Some(target_node)),
        "the new replica goes to a node the object does not use"
    );
    // No second copy while the first runs.
    assert!(copies(&core.tick(30)).is_empty());
    let outs = core.copy_done(40, "a/obj", version, targets.clone(), Ok(1));
    assert!(!outs.iter().any(|o| matches!(o, Out::Free(_))), "{outs:?}");
    let after = record(&core, &t, "a/obj");
    assert_eq!(after.version, before.version + 1);
    assert_eq!(
        after.replicas,
        [before.replicas[1], before.replicas[2], targets[0]]
    );
    assert_eq!((after.size, after.crc), (before.size, before.crc));
    assert_eq!(
        after.attributes, b"etag and type",
        "a repair keeps the attributes"
    );
    assert_eq!(core.repair_count(), 0);
    // Repaired: later passes leave it alone.
    assert!(copies(&core.tick(5_000)).is_empty());
}

#[test]
fn a_failed_copy_frees_its_target_and_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, mut t) = core_with_object(dir.path(), "b/obj");
    let before = record(&core, &t, "b/obj");
    kill_holder(&mut core, &mut t, before.replicas[2]);
    let (version, _, targets, _) = copies(&core.tick(10))[0].clone();
    let outs = core.copy_done(20, "b/obj", version, targets.clone(), Err("refused".into()));
    assert_eq!(outs, vec![Out::Free(targets[0])]);
    assert_eq!(
        record(&core, &t, "b/obj"),
        before,
        "the record is unchanged"
    );
    // The next pass (a second later) tries again.
    assert_eq!(copies(&core.tick(1_100)).len(), 1);
}

#[test]
fn a_copy_overtaken_by_a_new_post_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, mut t) = core_with_object(dir.path(), "c/obj");
    let before = record(&core, &t, "c/obj");
    kill_holder(&mut core, &mut t, before.replicas[1]);
    let (version, _, targets, _) = copies(&core.tick(10))[0].clone();
    // The client posts a new version while the copy runs.
    let coord = t.meta_addrs("c/obj")[0];
    let begin = Msg::new(
        9,
        coord,
        Body::PostBegin {
            name: "c/obj".into(),
            size: 10,
            class: None,
        },
    );
    core.handle(15, CLIENT, begin);
    let outs = core.copy_done(20, "c/obj", version, targets.clone(), Ok(1));
    assert_eq!(outs, vec![Out::Free(targets[0])], "the copy is freed");
    assert_eq!(record(&core, &t, "c/obj"), before);
    // A report for a copy the core does not know frees its targets too.
    let outs = core.copy_done(30, "c/obj", version, targets.clone(), Ok(1));
    assert_eq!(outs, vec![Out::Free(targets[0])]);
}

/// The drain reports in `outs`: (scan epoch, drain, node index, left).
fn drain_reports(outs: &[Out<u32>]) -> Vec<(u64, u64, u16, u64)> {
    outs.iter()
        .filter_map(|o| match o {
            Out::ToOn(Msg {
                body:
                    Body::DrainReport {
                        epoch,
                        drain,
                        index,
                        left,
                        ..
                    },
                ..
            }) => Some((*epoch, *drain, *index, *left)),
            _ => None,
        })
        .collect()
}

/// One tick of `core` at `now`, every copy it starts failing at once (so
/// the scan never waits for copies, and records keep their replicas).
fn tick_failing_copies(core: &mut MnCore<u32>, now: u64) -> Vec<Out<u32>> {
    let outs = core.tick(now);
    for o in &outs {
        if let Out::Copy {
            name,
            version,
            targets,
            ..
        } = o
        {
            core.copy_done(now, name, *version, targets.clone(), Err("failed".into()));
        }
    }
    outs
}

/// A scan that began under a drain that was then cancelled and started
/// again reports nothing (it may have passed groups while the node took
/// Posts again); the next scan reports for the new drain.
#[test]
fn a_drain_scan_reports_only_for_the_drain_it_began_under() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, mut t) = core_with_object(dir.path(), "d/0");
    // More records than one step of the scan looks at.
    for i in 1..40 {
        post(&mut core, &t, &format!("d/{i}"), 2 * i);
    }
    let drain = |since| Drain {
        index: 1,
        since,
        left: 0,
        copies: 0,
        unplaceable: 0,
        unreported: 1,
    };
    t.epoch = 2;
    t.drains = vec![drain(2)];
    core.set_table(t.clone());
    let outs = tick_failing_copies(&mut core, 100);
    assert!(!copies(&outs).is_empty(), "no drain copy started");
    assert!(
        drain_reports(&outs).is_empty(),
        "the scan ended in one step"
    );
    // Cancelled, then started again, before the scan ends: it ends with
    // no report.
    t.epoch = 4;
    t.drains = vec![drain(4)];
    core.set_table(t.clone());
    let outs = tick_failing_copies(&mut core, 120);
    assert_eq!(drain_reports(&outs), vec![], "a report for the old drain");
    assert_eq!(core.repair_count(), 0);
    // The next scan (a second later) reports for the new drain.
    let reports: Vec<_> = (0..10)
        .flat_map(|k| drain_reports(&tick_failing_copies(&mut core, 1_200 + k * 20)))
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let (epoch, since, index, left) = reports[0];
    assert_eq!((epoch, since, index), (4, 4, 1));
    assert!(left > 0, "no record names the drained node");
}

/// Two metadata nodes sharing every name: each owns half the groups, and
/// with N_m = 2 a name's two addresses lie in different halves. Returns
/// (the core owning `name`'s coordinator address, the other, the table).
fn coordinator_and_copy(dir: &std::path::Path, name: &str) -> (MnCore<u32>, MnCore<u32>, Table) {
    let mut t = table();
    t.params.n_m = 2;
    let mut second = t.mns[0].clone();
    (second.uuid, second.slot) = (2, 1);
    t.mns.push(second);
    let half = t.mg_owner.len() / 2;
    for (g, owner) in t.mg_owner.iter_mut().enumerate() {
        *owner = u16::from(g >= half);
    }
    let slot_of = |a| t.mg_owner[t.layout.mg_of(a).unwrap() as usize];
    let [coord, copy] = t.meta_addrs(name)[..] else {
        panic!("two metadata addresses")
    };
    assert_ne!(slot_of(coord), slot_of(copy));
    let open = |slot: u16| {
        let db = MetaDb::open(&dir.join(format!("m{slot}.redb"))).unwrap();
        MnCore::new(db, t.clone(), slot, 42 + u64::from(slot))
    };
    (open(slot_of(coord)), open(slot_of(copy)), t)
}

/// The metadata messages in `outs` (replication, refresh requests).
fn to_meta(outs: Vec<Out<u32>>) -> Vec<Msg> {
    outs.into_iter()
        .filter_map(|o| match o {
            Out::ToMeta(m) => Some(m),
            _ => None,
        })
        .collect()
}

/// Starts the drain of SN `index` at epoch 2 in `t`, as both metadata
/// nodes (coordinator and copy) report it, and gives them the table.
fn start_drain(t: &mut Table, index: u16, cores: &mut [&mut MnCore<u32>]) {
    t.epoch = 2;
    t.drains = vec![Drain {
        index,
        since: 2,
        left: 0,
        copies: 0,
        unplaceable: 0,
        unreported: 2,
    }];
    for core in cores {
        core.set_table(t.clone());
    }
}

/// The version the copy core holds at `name`'s second address (0: none).
/// Posts `name` at time 0 and hands the coordinator's first resend of its
/// replication to the copy, which then holds version 1.
fn post_and_replicate(coord: &mut MnCore<u32>, copy: &mut MnCore<u32>, t: &Table, name: &str) {
    post(coord, t, name, 0);
    let [replicate] = &to_meta(coord.tick(200))[..] else {
        panic!("one resend of the replication")
    };
    copy.handle(201, 1000, replicate.clone());
}

fn copy_version(core: &MnCore<u32>, t: &Table, name: &str) -> u64 {
    let mg = t.layout.mg_of(t.meta_addrs(name)[1]).unwrap();
    core.db().get(mg, name).unwrap().map_or(0, |r| r.version)
}

/// A metadata copy that missed its coordinator's later writes for good
/// (the replication lost, as when the coordinator crashes) and names a
/// drained node asks the coordinator during the drain scan, which pushes
/// its newer record, then its tombstone: the copy stops holding the drain.
#[test]
fn a_stale_metadata_copy_naming_a_drained_node_is_refreshed_by_its_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let name = "e/obj";
    let (mut coord, mut copy, mut t) = coordinator_and_copy(dir.path(), name);
    let copy_addr = t.meta_addrs(name)[1];
    // Version 1 reaches the copy; version 2's replication is lost.
    post_and_replicate(&mut coord, &mut copy, &t, name);
    assert_eq!(copy_version(&copy, &t, name), 1);
    let v1 = record(&coord, &t, name);
    post(&mut coord, &t, name, 300);
    let v2 = record(&coord, &t, name);
    assert_eq!((v2.version, copy_version(&copy, &t, name)), (2, 1));
    // Drain a node both versions use (3 of 4 nodes each).
    let index = v1
        .replicas
        .iter()
        .filter_map(|&a| t.layout.sn_of(a))
        .find(|&i| v2.replicas.iter().any(|&a| t.layout.sn_of(a) == Some(i)))
        .unwrap();
    start_drain(&mut t, index, &mut [&mut coord, &mut copy]);
    // The copy's scan asks the coordinator, which pushes version 2.
    let refresh = |copy: &mut MnCore<u32>, now| {
        let asks: Vec<Msg> = to_meta(copy.tick(now))
            .into_iter()
            .filter(|m| matches!(m.body, Body::Refresh { .. }))
            .collect();
        assert_eq!(asks.len(), 1, "{asks:?}");
        asks[0].clone()
    };
    let ask = refresh(&mut copy, 1_000);
    assert_eq!(
        ask.body,
        Body::Refresh {
            name: name.into(),
            version: 1,
            copy: copy_addr
        }
    );
    let [push] = &to_meta(coord.handle(1_001, 1001, ask.clone()))[..] else {
        panic!("one push")
    };
    assert_eq!(push.target, copy_addr);
    copy.handle(1_002, 1000, push.clone());
    assert_eq!(copy_version(&copy, &t, name), 2);
    // Nothing newer: nothing pushed. A copy address that is not one of
    // the name's is refused.
    let mut same = ask.clone();
    same.body = Body::Refresh {
        name: name.into(),
        version: 2,
        copy: copy_addr,
    };
    assert!(to_meta(coord.handle(1_003, 1001, same)).is_empty());
    let mut bogus = ask;
    bogus.body = Body::Refresh {
        name: name.into(),
        version: 1,
        copy: copy_addr ^ 1,
    };
    let outs = coord.handle(1_004, 1001, bogus);
    assert!(
        matches!(&outs[..], [Out::Reply(1001, m)] if matches!(&m.body, Body::Error { message, .. } if message.contains("not one of its metadata copies"))),
        "{outs:?}"
    );
    // Deleted at the coordinator, the tombstone lost on its way: the
    // tombstone (at the version it deleted) is pushed on the next pass.
    let del = Msg::new(
        77,
        t.meta_addrs(name)[0],
        Body::Delete {
            name: name.into(),
            if_version: 0,
            keep_data: false,
        },
    );
    coord.handle(1_100, CLIENT, del);
    let ask = refresh(&mut copy, 2_100);
    let [push] = &to_meta(coord.handle(2_101, 1001, ask))[..] else {
        panic!("one push")
    };
    assert_eq!(
        push.body,
        Body::Unreplicate {
            name: name.into(),
            version: 2
        }
    );
    copy.handle(2_102, 1000, push.clone());
    assert_eq!(copy_version(&copy, &t, name), 0);
    // The next pass finds no copy naming the node, and asks nothing.
    let outs = copy.tick(3_200);
    assert!(to_meta(outs.clone()).is_empty(), "{outs:?}");
    let reports: Vec<_> = outs
        .iter()
        .filter_map(|o| match o {
            Out::ToOn(Msg {
                body: Body::DrainReport { left, copies, .. },
                ..
            }) => Some((*left, *copies)),
            _ => None,
        })
        .collect();
    assert_eq!(reports, vec![(0, 0)]);
}

/// A metadata copy that missed the repair of a dead node's replica for
/// good (the rewrite's replication lost, as when the coordinator crashes
/// or its resends give up) asks the coordinator during the repair scan,
/// which pushes the repaired record: afterwards no copy names the dead
/// node, and a current copy asks nothing.
#[test]
fn a_stale_metadata_copy_naming_a_dead_node_is_refreshed_by_its_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let name = "e/obj";
    let (mut coord, mut copy, mut t) = coordinator_and_copy(dir.path(), name);
    let copy_addr = t.meta_addrs(name)[1];
    post_and_replicate(&mut coord, &mut copy, &t, name);
    let before = record(&coord, &t, name);
    assert_eq!(copy_version(&copy, &t, name), before.version);
    // The node holding its first replica is declared dead; the
    // coordinator copies that replica and rewrites the record, whose
    // replication to the copy is lost.
    let dead = t.layout.sn_of(before.replicas[0]).unwrap();
    for s in &mut t.sns {
        if s.index == dead {
            s.state = State::Dead;
        }
    }
    t.epoch = 2;
    coord.set_table(t.clone());
    copy.set_table(t.clone());
    let outs = coord.tick(1_000);
    let [(version, _, targets, _)] = &copies(&outs)[..] else {
        panic!("one repair copy: {outs:?}")
    };
    coord.copy_done(1_010, name, *version, targets.clone(), Ok(1));
    let repaired = record(&coord, &t, name);
    assert!(repaired
        .replicas
        .iter()
        .all(|&a| t.layout.sn_of(a) != Some(dead)));
    let names_dead = |copy: &MnCore<u32>| {
        let mg = t.layout.mg_of(copy_addr).unwrap();
        let row = copy.db().get(mg, name).unwrap().unwrap();
        row.replicas
            .iter()
            .any(|&a| t.layout.sn_of(a) == Some(dead))
    };
    assert!(names_dead(&copy));
    // The copy's scan asks its coordinator, which pushes the repaired
    // record.
    let asks: Vec<Msg> = to_meta(copy.tick(2_000))
        .into_iter()
        .filter(|m| matches!(m.body, Body::Refresh { .. }))
        .collect();
    let [ask] = &asks[..] else {
        panic!("one refresh request: {asks:?}")
    };
    assert_eq!(
        ask.body,
        Body::Refresh {
            name: name.into(),
            version: before.version,
            copy: copy_addr
        }
    );
    let [push] = &to_meta(coord.handle(2_001, 1001, ask.clone()))[..] else {
        panic!("one push")
    };
    assert_eq!(push.target, copy_addr);
    copy.handle(2_002, 1000, push.clone());
    assert_eq!(copy_version(&copy, &t, name), repaired.version);
    assert!(!names_dead(&copy));
    // Current now: the next pass asks nothing.
    let outs = copy.tick(3_100);
    assert!(to_meta(outs.clone()).is_empty(), "{outs:?}");
}

/// Two metadata nodes, by slot, exchanging datagrams instantly: every 20
/// ms from `from` to `to` both tick, and every metadata message (a reply
/// to its sender, a `ToMeta` to the slot owning its target) is delivered
/// at once, unless `drop` selects it. Returns the messages delivered.
fn run_pair(
    cores: &mut [MnCore<u32>; 2],
    t: &Table,
    from: u64,
    to: u64,
    drop: &dyn Fn(&Msg) -> bool,
) -> Vec<Msg> {
    let mut delivered = Vec::new();
    let mut now = from;
    while now < to {
        let mut queue: std::collections::VecDeque<(u16, u32, Msg)> = Default::default();
        for slot in 0..2u16 {
            let outs = cores[slot as usize].tick(now);
            route(t, slot, outs, &mut queue);
        }
        while let Some((slot, sender, msg)) = queue.pop_front() {
            if drop(&msg) {
                continue;
            }
            delivered.push(msg.clone());
            let outs = cores[slot as usize].handle(now, sender, msg);
            route(t, slot, outs, &mut queue);
        }
        now += 20;
    }
    delivered
}

/// Queues the metadata messages among `outs` of the core at `slot`.
fn route(
    t: &Table,
    slot: u16,
    outs: Vec<Out<u32>>,
    queue: &mut std::collections::VecDeque<(u16, u32, Msg)>,
) {
    for o in outs {
        match o {
            Out::Reply(peer, m) if peer >= 1000 => {
                queue.push_back(((peer - 1000) as u16, 1000 + u32::from(slot), m))
            }
            Out::ToMeta(m) => {
                let owner = t.mn_for(m.target).unwrap().slot;
                queue.push_back((owner, 1000 + u32::from(slot), m));
            }
            _ => {}
        }
    }
}

/// A coordinator and a copy (as `coordinator_and_copy`), in an array by
/// slot, with anti-entropy passes every second; and the coordinator's
/// slot.
fn sync_pair(dir: &std::path::Path, name: &str) -> ([MnCore<u32>; 2], u16, Table) {
    let (mut coord, mut copy, t) = coordinator_and_copy(dir, name);
    let coord_slot = t.mn_for(t.meta_addrs(name)[0]).unwrap().slot;
    coord.set_sync_interval(1_000);
    copy.set_sync_interval(1_000);
    let cores = if coord_slot == 0 {
        [coord, copy]
    } else {
        [copy, coord]
    };
    (cores, coord_slot, t)
}

/// The copy's newest state of `name` at its second metadata address:
/// (record version, tombstone).
fn copy_state(cores: &[MnCore<u32>; 2], coord_slot: u16, t: &Table, name: &str) -> (u64, u64) {
    let copy = &cores[1 - coord_slot as usize];
    let mg = t.layout.mg_of(t.meta_addrs(name)[1]).unwrap();
    (
        copy.db().get(mg, name).unwrap().map_or(0, |r| r.version),
        copy.db().tombstone(mg, name).unwrap(),
    )
}

fn is_replication(m: &Msg) -> bool {
    matches!(m.body, Body::Replicate { .. } | Body::Unreplicate { .. })
}

/// A metadata copy that missed a write for good (every Replicate of it
/// lost until the coordinator gave up its resends) gets the newest
/// version at the next anti-entropy pass: the coordinator's digest
/// differs from the copy's, the group is checked name by name, the copy
/// asks for what it lacks and the coordinator pushes it. Then a pass over
/// copies in step costs one digest and its empty answer.
#[test]
fn a_metadata_copy_that_missed_a_write_is_brought_up_to_date_by_anti_entropy() {
    let dir = tempfile::tempdir().unwrap();
    let name = "e/obj";
    let (mut cores, cs, t) = sync_pair(dir.path(), name);
    let c = cs as usize;
    post(&mut cores[c], &t, name, 0);
    run_pair(&mut cores, &t, 100, 300, &|_| false);
    assert_eq!(copy_state(&cores, cs, &t, name), (1, 0));
    // Version 2: every replication message to the copy is lost, and the
    // resends give up after 60 s; so is every anti-entropy push (the
    // same Replicate) meanwhile.
    post(&mut cores[c], &t, name, 300);
    let lost = run_pair(&mut cores, &t, 320, 61_000, &is_replication);
    assert!(
        lost.iter()
            .any(|m| matches!(m.body, Body::SyncCheck { .. })),
        "passes ran"
    );
    assert_eq!(record(&cores[c], &t, name).version, 2);
    assert_eq!(copy_state(&cores, cs, &t, name), (1, 0));
    // Nothing lost any more: the next pass brings the copy up to date.
    let sent = run_pair(&mut cores, &t, 61_000, 63_100, &|_| false);
    assert_eq!(copy_state(&cores, cs, &t, name), (2, 0));
    let kinds: Vec<_> = sent
        .iter()
        .map(|m| std::mem::discriminant(&m.body))
        .collect();
    for body in [
        Body::SyncDigest { sums: vec![] },
        Body::SyncDiff { pairs: vec![] },
        Body::SyncCheck { entries: vec![] },
    ] {
        assert!(kinds.contains(&std::mem::discriminant(&body)), "{sent:?}");
    }
    // In step: a pass is one digest and its empty answer.
    let sent = run_pair(&mut cores, &t, 63_100, 64_100, &|_| false);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(matches!(sent[0].body, Body::SyncDigest { ref sums } if sums.len() == 1));
    assert_eq!(sent[1].body, Body::SyncDiff { pairs: vec![] });
}

/// A metadata copy that missed a Delete for good loses the record at the
/// next anti-entropy pass (it gets the tombstone, at the version deleted),
/// and one that missed both the Post and the Delete gets the tombstone.
#[test]
fn a_metadata_copy_that_missed_a_delete_loses_the_record_by_anti_entropy() {
    let dir = tempfile::tempdir().unwrap();
    let name = "e/obj";
    let (mut cores, cs, t) = sync_pair(dir.path(), name);
    let c = cs as usize;
    let coord_addr = t.meta_addrs(name)[0];
    post(&mut cores[c], &t, name, 0);
    run_pair(&mut cores, &t, 100, 300, &|_| false);
    assert_eq!(copy_state(&cores, cs, &t, name), (1, 0));
    let delete = |cores: &mut [MnCore<u32>; 2], req, now| {
        let del = Msg::new(
            req,
            coord_addr,
            Body::Delete {
                name: name.into(),
                if_version: 0,
                keep_data: false,
            },
        );
        cores[c].handle(now, CLIENT, del);
    };
    delete(&mut cores, 77, 300);
    run_pair(&mut cores, &t, 320, 61_000, &is_replication);
    assert_eq!(
        copy_state(&cores, cs, &t, name),
        (1, 0),
        "the Delete was lost"
    );
    run_pair(&mut cores, &t, 61_000, 63_100, &|_| false);
    assert_eq!(copy_state(&cores, cs, &t, name), (0, 1));
    // Posted again and deleted again, the copy missing both.
    let other = (0..)
        .map(|i| format!("e/o{i}"))
        .find(|n| {
            let a = t.meta_addrs(n);
            t.mn_for(a[0]).unwrap().slot == cs && t.mn_for(a[1]).unwrap().slot != cs
        })
        .unwrap();
    post(&mut cores[c], &t, &other, 64_000);
    let del = Msg::new(
        99,
        t.meta_addrs(&other)[0],
        Body::Delete {
            name: other.clone(),
            if_version: 0,
            keep_data: false,
        },
    );
    cores[c].handle(64_010, CLIENT, del);
    run_pair(&mut cores, &t, 64_020, 125_000, &is_replication);
    assert_eq!(copy_state(&cores, cs, &t, &other), (0, 0));
    run_pair(&mut cores, &t, 125_000, 127_100, &|_| false);
    assert_eq!(copy_state(&cores, cs, &t, &other), (0, 1));
    assert_eq!(copy_state(&cores, cs, &t, name), (0, 1));
}

/// The (left, copies) of the drain reports in `outs`.
fn drain_counts(outs: &[Out<u32>]) -> Vec<(u64, u64)> {
    outs.iter()
        .filter_map(|o| match o {
            Out::ToOn(Msg {
                body: Body::DrainReport { left, copies, .. },
                ..
            }) => Some((*left, *copies)),
            _ => None,
        })
        .collect()
}

/// A coordinator still resending an old version that names a drained
/// node counts it as a record left, though its own row has moved on to a
/// version that does not: the copy may apply the old version after its
/// own scan passed the name (as it does here), and only a report that
/// counts the resend keeps the orchestrator from retiring the node on
/// scans that all missed that row.
#[test]
fn a_replication_still_resent_that_names_a_drained_node_counts_as_left() {
    let dir = tempfile::tempdir().unwrap();
    let name = "r/obj";
    let (mut coord, mut copy, mut t) = coordinator_and_copy(dir.path(), name);
    // Versions acknowledged by the coordinator alone (W_m = 1), their
    // replication to the copy lost, until one no longer uses a node the
    // first used.
    post(&mut coord, &t, name, 0);
    let first = record(&coord, &t, name);
    let sn = |a| t.layout.sn_of(a).unwrap();
    let mut now = 0;
    let index = loop {
        now += 10;
        post(&mut coord, &t, name, now);
        let latest = record(&coord, &t, name);
        let dropped = first
            .replicas
            .iter()
            .map(|&a| sn(a))
            .find(|&i| latest.replicas.iter().all(|&a| sn(a) != i));
        if let Some(i) = dropped {
            break i;
        }
        assert!(now < 200, "placement never left a node out");
    };
    assert_eq!(copy_version(&copy, &t, name), 0);
    start_drain(&mut t, index, &mut [&mut coord, &mut copy]);
    // The copy's scan finds nothing yet.
    assert_eq!(drain_counts(&copy.tick(1_000)), vec![(0, 0)]);
    // The coordinator's row does not name the node, but the first
    // version's replication, still resent, does.
    let outs = coord.tick(1_000);
    assert_eq!(drain_counts(&outs), vec![(1, 0)], "{outs:?}");
    // That resend lands at the copy after its scan: the copy now names
    // the node (its next scan counts it, and asks for a refresh), and
    // acknowledges it.
    let resends = to_meta(outs);
    let old = resends
        .iter()
        .find(|m| matches!(&m.body, Body::Replicate { record } if record.version == first.version))
        .expect("the first version resent");
    let acks = copy.handle(1_001, 1000, old.clone());
    assert_eq!(copy_version(&copy, &t, name), first.version);
    for ack in acks {
        if let Out::Reply(_, m) = ack {
            coord.handle(1_002, 1001, m);
        }
    }
    // Acknowledged: nothing of it is left at the coordinator, and the
    // copy's next scan reports the row it wrote.
    let outs = coord.tick(2_100);
    assert_eq!(drain_counts(&outs), vec![(0, 0)], "{outs:?}");
    assert_eq!(drain_counts(&copy.tick(2_100)), vec![(0, 1)]);
}

/// A Post planned before a coordinator restart, committed after it: a
/// repair has meanwhile taken the planned version (for the old data), so
/// the commit is refused rather than acknowledged over the repair's record.
#[test]
fn a_post_commit_after_a_restart_is_not_acknowledged_over_a_repair() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, mut t) = core_with_object(dir.path(), "f/obj");
    let coord = t.meta_addrs("f/obj")[0];
    let begin = Msg::new(
        31,
        coord,
        Body::PostBegin {
            name: "f/obj".into(),
            size: 10,
            class: None,
        },
    );
    let planned = match &core.handle(10, CLIENT, begin)[..] {
        [Out::Reply(_, m)] => match m.body {
            Body::PostPlan { version, .. } => version,
            ref other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    // The restart loses the plan; a repair then takes its version.
    drop(core);
    let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
    let mut core = MnCore::new(db, t.clone(), 0, 43);
    let before = record(&core, &t, "f/obj");
    kill_holder(&mut core, &mut t, before.replicas[0]);
    let (version, _, targets, _) = copies(&core.tick(20))[0].clone();
    core.copy_done(30, "f/obj", version, targets, Ok(1));
    assert_eq!(record(&core, &t, "f/obj").version, planned);
    let commit = Msg::new(
        32,
        coord,
        Body::PostCommit {
            name: "f/obj".into(),
            version: planned,
            crc: 0x1234,
            attributes: Vec::new(),
            fragment_crcs: Vec::new(),
        },
    );
    let outs = core.handle(40, CLIENT, commit);
    assert!(
        matches!(&outs[..], [Out::Reply(_, m)] if matches!(m.body, Body::Error { code: strata_store_protocol::wire::Code::Conflict, .. })),
        "{outs:?}"
    );
}

// Authentication: every datagram goes through the gate of the socket
// runtime (`node::mn_receive`, `node::on_receive`) before the core sees
// it. Forged internal messages (unsealed, or sealed with another key)
// change nothing; the same messages sealed with the cluster key do.

mod unauthenticated {
    use super::*;
    use strata_store::metadata::server::mn_receive;
    use strata_store::orchestrator::server::on_receive;
    use strata_store::orchestrator::state::OnCore;
    use strata_store_protocol::auth::{unix_ms, ClusterKey, Gate, Receiver, KEY_LEN};
    use strata_store_protocol::table::{Move, MovePhase};
    use strata_store_protocol::wire::{Code, Record, Role, Row};

    fn cluster_key() -> ClusterKey {
        ClusterKey::from_bytes(&[0x5a; KEY_LEN])
    }

    fn other_key() -> ClusterKey {
        ClusterKey::from_bytes(&[0x5b; KEY_LEN])
    }

    /// The message unsealed, sealed with another key, and sealed with
    /// the cluster key (in that order).
    fn forms(msg: &Msg) -> [Vec<u8>; 3] {
        [
            msg.encode().unwrap(),
            msg.seal(&other_key(), unix_ms()).unwrap(),
            msg.seal(&cluster_key(), unix_ms()).unwrap(),
        ]
    }

    fn receive(core: &mut MnCore<u32>, gate: &mut Gate, bytes: &[u8]) -> Vec<Out<u32>> {
        let outs = mn_receive(core, gate, unix_ms(), 10, CLIENT, None, bytes);
        outs.into_iter().map(|(o, _)| o).collect()
    }

    /// A refusal as unauthenticated, or, where that would be longer than
    /// the datagram, the request to pad it (nothing done either way).
    fn refusal(outs: &[Out<u32>]) -> bool {
        matches!(outs, [Out::Reply(_, m)] if matches!(&m.body, Body::Error { code: Code::Unauthenticated, .. } | Body::PadTo { .. }))
    }

    #[test]
    fn a_forged_replicate_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let t = table();
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        let mut core = MnCore::new(db, t.clone(), 0, 42);
        let mut gate = Gate::new(cluster_key(), Receiver::Mn);
        let name = "forged/object";
        let meta = t.meta_addrs(name);
        let rec = Record {
            name: name.into(),
            size: 5,
            crc: 1,
            version: 9,
            meta: meta.clone(),
            replicas: vec![t.layout.sn_prefix(1) | 77],
            rename: None,
            attributes: Vec::new(),
            fragments: None,
            inline: None,
        };
        let msg = Msg::new(5, meta[0], Body::Replicate { record: rec });
        let [plain, wrong, good] = forms(&msg);
        for bytes in [&plain, &wrong] {
            let outs = receive(&mut core, &mut gate, bytes);
            assert!(refusal(&outs), "{outs:?}");
            let mg = t.layout.mg_of(meta[0]).unwrap();
            assert_eq!(core.db().get(mg, name).unwrap(), None);
        }
        receive(&mut core, &mut gate, &good);
        assert_eq!(record(&core, &t, name).version, 9);
    }

    /// A `SyncCheck` makes a metadata copy that is behind ask its
    /// coordinator, only when sealed with the cluster key.
    #[test]
    fn a_forged_sync_check_asks_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let name = "e/obj";
        let (_coord, mut copy, t) = coordinator_and_copy(dir.path(), name);
        let copy_addr = t.meta_addrs(name)[1];
        let mut gate = Gate::new(cluster_key(), Receiver::Mn);
        let entry = strata_store_protocol::wire::SyncEntry {
            name: name.into(),
            copy: copy_addr,
            version: 3,
            deleted: false,
        };
        let msg = Msg::new(
            5,
            copy_addr,
            Body::SyncCheck {
                entries: vec![entry],
            },
        );
        let [plain, wrong, good] = forms(&msg);
        for bytes in [&plain, &wrong] {
            let outs = receive(&mut copy, &mut gate, bytes);
            assert!(refusal(&outs), "{outs:?}");
        }
        let outs = receive(&mut copy, &mut gate, &good);
        let ask = Body::Refresh {
            name: name.into(),
            version: 0,
            copy: copy_addr,
        };
        assert!(
            matches!(&outs[..], [Out::ToMeta(m)] if m.body == ask && m.target == t.meta_addrs(name)[0]),
            "{outs:?}"
        );
    }

    #[test]
    fn a_forged_handover_page_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let name = "moving/object";
        let mut t = table();
        t.mns.push(MnEntry {
            uuid: 2,
            slot: 1,
            endpoint: strata_store_protocol::wire::no_endpoint(),
            state: State::Up,
        });
        let group = t.layout.mg_of(t.meta_addrs(name)[0]).unwrap();
        t.moves.push(Move {
            group,
            to: 1,
            phase: MovePhase::Copying,
            frozen_epoch: 0,
        });
        let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
        let mut core = MnCore::new(db, t.clone(), 1, 43);
        let mut gate = Gate::new(cluster_key(), Receiver::Mn);
        // The new owner asks the old one for the group's first page.
        let pull = core
            .tick(1)
            .into_iter()
            .find_map(|o| match o {
                Out::ToMeta(m) if matches!(m.body, Body::MgPull { .. }) => Some(m),
                _ => None,
            })
            .expect("a pull of the group being taken over");
        let row = Row::Record(Record {
            name: name.into(),
            size: 5,
            crc: 1,
            version: 3,
            meta: t.meta_addrs(name),
            replicas: vec![t.layout.sn_prefix(1) | 9],
            rename: None,
            attributes: Vec::new(),
            fragments: None,
            inline: None,
        });
        let page = pull.reply(Body::MgRows {
            rows: vec![row],
            more: true,
        });
        let [plain, wrong, good] = forms(&page);
        for bytes in [&plain, &wrong] {
            // An answer is dropped silently (never answered back).
            assert_eq!(receive(&mut core, &mut gate, bytes), vec![]);
            assert_eq!(core.db().get(group, name).unwrap(), None);
        }
        receive(&mut core, &mut gate, &good);
        assert_eq!(core.db().get(group, name).unwrap().unwrap().version, 3);
    }

    fn on_table() -> Table {
        let mut t = table();
        t.epoch = 1;
        t.params.n_d = 2;
        t.mns.clear();
        t.sns.clear();
        t.mg_owner.clear();
        t
    }

    /// The orchestrator refused a datagram as unauthenticated (or asked
    /// for it padded, where the refusal is longer than the datagram).
    fn assert_unauthenticated(reply: &Option<Body>) {
        assert!(
            matches!(
                reply,
                Some(
                    Body::Error {
                        code: Code::Unauthenticated,
                        ..
                    } | Body::PadTo { .. }
                )
            ),
            "{reply:?}"
        );
    }

    /// Sends `bytes` to the orchestrator; the answer's body, if any.
    fn ask(on: &mut OnCore, gate: &mut Gate, bytes: &[u8]) -> Option<Body> {
        let answer = on_receive(on, gate, unix_ms(), 0, bytes)?;
        Some(Msg::decode(&answer).unwrap().body)
    }

    fn sealed(body: Body) -> Vec<u8> {
        Msg::new(strata_store_client::transport::request_id(), 0, body)
            .seal(&cluster_key(), unix_ms())
            .unwrap()
    }

    #[test]
    fn a_forged_retire_or_drain_report_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut on = OnCore::open(&dir.path().join("on.redb"), on_table(), 2, 0).unwrap();
        let mut gate = Gate::new(cluster_key(), Receiver::On);
        for (role, uuid) in [
            (Role::Mn, 1),
            (Role::Mn, 2),
            (Role::Sn, 11),
            (Role::Sn, 12),
            (Role::Sn, 13),
        ] {
            let body = Body::Register {
                role,
                uuid,
                endpoint: "127.0.0.1:9".parse().unwrap(),
                capacity: 100,
                free: 100,
                device: 0,
                keys: None,
            };
            let reply = ask(&mut on, &mut gate, &sealed(body));
            assert!(matches!(reply, Some(Body::Registered { .. })), "{reply:?}");
        }
        // A forged retire: refused, no drain.
        let retire = Msg::new(77, 0, Body::Retire { uuid: 11 });
        let [plain, wrong, good] = forms(&retire);
        for bytes in [&plain, &wrong] {
            assert_unauthenticated(&ask(&mut on, &mut gate, bytes));
            assert!(!on.table().retiring(1));
        }
        assert_eq!(
            ask(&mut on, &mut gate, &good),
            Some(Body::Done { version: 0 })
        );
        assert!(on.table().retiring(1));
        // The same datagram again (a replay): refused.
        assert_unauthenticated(&ask(&mut on, &mut gate, &good));
        // Forged "nothing left" reports from every metadata node: the
        // node is not retired early.
        let since = on.table().drain_of(1).unwrap().since;
        let report = |slot: u16, epoch: u64| Body::DrainReport {
            slot,
            epoch,
            drain: since,
            index: 1,
            left: 0,
            copies: 0,
            unplaceable: 0,
        };
        let epoch = on.table().epoch;
        for slot in [0, 1] {
            let msg = Msg::new(80 + slot as u64, 0, report(slot, epoch));
            let [plain, wrong, _] = forms(&msg);
            for bytes in [&plain, &wrong] {
                ask(&mut on, &mut gate, bytes);
            }
        }
        assert!(on.table().retiring(1));
        assert_eq!(on.table().drain_of(1).unwrap().unreported, 2);
        // Sealed reports count: a first clean round, then a second from
        // passes that began at the epoch it published.
        for slot in [0, 1] {
            ask(&mut on, &mut gate, &sealed(report(slot, epoch)));
        }
        assert!(on.table().retiring(1), "retired on one round");
        let confirm = on.table().epoch;
        assert!(confirm > epoch);
        for slot in [0, 1] {
            ask(&mut on, &mut gate, &sealed(report(slot, confirm)));
        }
        assert!(!on.table().retiring(1));
        assert_eq!(on.table().sns[0].state, State::Retired);
    }
}

/// `core`'s answer to a tenant's report that `replica` of `name` failed
/// its CRC, and what else it asked for.
fn report_bad(
    core: &mut MnCore<u32>,
    t: &Table,
    name: &str,
    replica: u128,
    now: u64,
) -> (u64, Vec<Out<u32>>) {
    let coord = t.meta_addrs(name)[0];
    let report = Msg::new(
        900 + now,
        coord,
        Body::BadReplica {
            name: name.into(),
            replica,
        },
    );
    let outs = core.handle(now, CLIENT, report);
    core.check_invariants().expect("a sound metadata node");
    let version = outs
        .iter()
        .find_map(|o| match o {
            Out::Reply(_, m) => match m.body {
                Body::Done { version } => Some(version),
                ref other => panic!("{other:?}"),
            },
            _ => None,
        })
        .expect("an answer");
    (version, outs)
}

/// The replicas `outs` frees.
fn frees(outs: &[Out<u32>]) -> Vec<u128> {
    outs.iter()
        .filter_map(|o| match o {
            Out::Free(a) => Some(*a),
            _ => None,
        })
        .collect()
}

/// A tenant's report of a replica failing its CRC: the coordinator
/// copies the object from the other replicas (the reported one last, used
/// only if it verifies), and only once that copy is committed does the
/// record drop the reported replica, which is then freed.
#[test]
fn a_replica_reported_damaged_is_replaced_by_a_verified_copy_then_freed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, t) = core_with_object(dir.path(), "g/obj");
    let before = record(&core, &t, "g/obj");
    let bad = before.replicas[1];
    let (version, outs) = report_bad(&mut core, &t, "g/obj", bad, 10);
    assert_eq!(version, before.version);
    let copy = copies(&outs);
    assert_eq!(copy.len(), 1, "the repair starts at once: {outs:?}");
    let (version, sources, targets, crc) = copy[0].clone();
    assert_eq!((version, crc), (before.version, before.crc));
    assert_eq!(
        sources,
        [before.replicas[0], before.replicas[2], bad],
        "the reported replica is the last resort"
    );
    assert_eq!(targets.len(), 1);
    assert!(!before.replicas.contains(&targets[0]));
    assert!(frees(&outs).is_empty(), "nothing freed before the copy");
    assert_eq!(record(&core, &t, "g/obj"), before);
    // A second report of the same replica while the copy runs starts
    // nothing more.
    let (_, outs) = report_bad(&mut core, &t, "g/obj", bad, 15);
    assert!(copies(&outs).is_empty(), "{outs:?}");
    let outs = core.copy_done(20, "g/obj", version, targets.clone(), Ok(1));
    assert_eq!(frees(&outs), [bad], "the damaged replica is freed");
    let after = record(&core, &t, "g/obj");
    assert_eq!(after.version, before.version + 1);
    assert_eq!(
        after.replicas,
        [before.replicas[0], before.replicas[2], targets[0]]
    );
    core.check_invariants().unwrap();
    // Repaired: the next passes copy nothing, and forget the address.
    assert!(copies(&core.tick(2_000)).is_empty());
    assert!(copies(&core.tick(4_000)).is_empty());
    assert_eq!(core.damaged_count(), 0);
}

/// A wrong (or hostile) report never loses data: while no copy verifies,
/// the record keeps every replica, the reported one included, and
/// nothing of it is freed.
#[test]
fn a_report_whose_copy_fails_keeps_every_replica() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, t) = core_with_object(dir.path(), "h/obj");
    let before = record(&core, &t, "h/obj");
    let (_, outs) = report_bad(&mut core, &t, "h/obj", before.replicas[0], 10);
    let (version, _, targets, _) = copies(&outs)[0].clone();
    let outs = core.copy_done(20, "h/obj", version, targets.clone(), Err("crc".into()));
    assert_eq!(frees(&outs), targets, "only the failed copy is freed");
    assert_eq!(record(&core, &t, "h/obj"), before);
    // The scan tries again (the report is kept while its record names it).
    let outs = core.tick(2_000);
    assert_eq!(copies(&outs).len(), 1, "{outs:?}");
    assert!(frees(&outs).is_empty());
    assert_eq!(record(&core, &t, "h/obj"), before);
    core.check_invariants().unwrap();
}

/// A storage node's scrub report names addresses only: the repair scan
/// finds the record naming one and repairs it; an address no record
/// names is ignored and forgotten after a pass; a flood of reports is
/// held to a bound.
#[test]
fn a_storage_node_s_report_is_repaired_by_the_scan_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, t) = core_with_object(dir.path(), "k/obj");
    post(&mut core, &t, "k/other", 2);
    let before = record(&core, &t, "k/obj");
    let other = record(&core, &t, "k/other");
    let report = |req: u64, addrs: Vec<u128>| Msg::new(req, 0, Body::DamagedReplicas { addrs });
    let unnamed = before.replicas[2] ^ 0xffff;
    let outs = core.handle(10, 1, report(50, vec![before.replicas[2], unnamed]));
    assert!(
        matches!(&outs[..], [Out::Reply(_, m)] if m.body == Body::Done { version: 2 }),
        "{outs:?}"
    );
    let outs = core.tick(20);
    let copy = copies(&outs);
    assert_eq!(copy.len(), 1, "only the record naming it: {outs:?}");
    let (version, sources, targets, _) = copy[0].clone();
    assert_eq!(sources.last(), Some(&before.replicas[2]));
    assert_eq!(
        record(&core, &t, "k/other"),
        other,
        "the other is untouched"
    );
    let outs = core.copy_done(30, "k/obj", version, targets.clone(), Ok(1));
    assert_eq!(frees(&outs), [before.replicas[2]]);
    assert!(!record(&core, &t, "k/obj")
        .replicas
        .contains(&before.replicas[2]));
    // The unnamed address was forgotten at the end of the pass.
    assert!(copies(&core.tick(2_000)).is_empty());
    assert_eq!(core.damaged_count(), 0);
    // A flood of reports of addresses no record names is bounded, and
    // starts no copy.
    let mut kept = 0;
    for i in 0..40u64 {
        let addrs = (0..256u128).map(|j| (i as u128) << 20 | j).collect();
        let outs = core.handle(3_000 + i, 1, report(100 + i, addrs));
        if let [Out::Reply(_, m)] = &outs[..] {
            if let Body::Done { version } = m.body {
                kept = version;
            }
        }
        core.check_invariants().unwrap();
    }
    assert!(core.damaged_count() <= 4096, "{}", core.damaged_count());
    assert_eq!(kept, 0, "reports past the bound are dropped");
    assert!(copies(&core.tick(5_000)).is_empty());
    assert_eq!(core.damaged_count(), 0, "forgotten after a pass");
    assert_eq!(record(&core, &t, "k/other"), other);
}

/// A tenant's report naming a replica its object does not have, or an
/// object that does not exist, changes nothing.
#[test]
fn a_report_of_a_replica_the_record_does_not_name_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, t) = core_with_object(dir.path(), "m/obj");
    let before = record(&core, &t, "m/obj");
    let (version, outs) = report_bad(&mut core, &t, "m/obj", before.replicas[0] + 1, 10);
    assert_eq!(version, 0);
    assert!(copies(&outs).is_empty() && frees(&outs).is_empty());
    let (version, outs) = report_bad(&mut core, &t, "m/none", before.replicas[0], 11);
    assert_eq!(version, 0);
    assert!(copies(&outs).is_empty() && frees(&outs).is_empty());
    assert_eq!(core.damaged_count(), 0);
    assert!(copies(&core.tick(20)).is_empty());
    assert_eq!(record(&core, &t, "m/obj"), before);
}

/// Tenants' reports start at most 16 repairs a second: each costs a copy
/// of the whole object, and a tenant must not make the cluster copy its
/// objects without end.
#[test]
fn tenants_reports_are_taken_at_a_bounded_rate() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, t) = core_with_object(dir.path(), "n/0");
    for i in 1..20 {
        post(&mut core, &t, &format!("n/{i}"), 2 * i);
    }
    let mut started = 0;
    for i in 0..20 {
        let name = format!("n/{i}");
        let bad = record(&core, &t, &name).replicas[0];
        let (_, outs) = report_bad(&mut core, &t, &name, bad, 5_000 + i);
        started += copies(&outs).len();
    }
    assert_eq!(started, 16, "16 a second");
    // The next second takes more.
    let bad = record(&core, &t, "n/19").replicas[0];
    let (version, outs) = report_bad(&mut core, &t, "n/19", bad, 6_000);
    assert!(version > 0 && copies(&outs).len() == 1, "{outs:?}");
}

/// The answer of `core` to `body`, sent by the client to `name`'s
/// coordinator address.
fn ask(core: &mut MnCore<u32>, t: &Table, name: &str, req: u64, body: Body) -> Body {
    let coord = t.meta_addrs(name)[0];
    match &core.handle(req, CLIENT, Msg::new(req, coord, body))[..] {
        [Out::Reply(_, m)] => m.body.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn an_object_is_inlined_only_where_the_metadata_copies_keep_its_redundancy() {
    use strata_store_protocol::wire::{Code, Record};
    let dir = tempfile::tempdir().unwrap();
    // One metadata copy: enough for bucket "one" (one replica), too few
    // for the cluster's three replicas.
    let mut t = table();
    t.buckets = vec![(
        "one".into(),
        Params {
            n_d: 1,
            w_d: 1,
            ..t.params
        },
    )];
    let db = MetaDb::open(&dir.path().join("m.redb")).unwrap();
    let mut core = MnCore::new(db, t.clone(), 0, 42);
    let data = b"small enough to be kept in its record".to_vec();
    let post = |name: &str, data: &[u8]| Body::PostInline {
        name: name.into(),
        class: None,
        crc: crc32c::crc32c(data),
        data: data.to_vec(),
        attributes: Vec::new(),
    };
    assert!(matches!(
        ask(&mut core, &t, "one/a", 1, post("one/a", &data)),
        Body::Done { .. }
    ));
    let record = match ask(
        &mut core,
        &t,
        "one/a",
        2,
        Body::Get {
            name: "one/a".into(),
        },
    ) {
        Body::Found { record, ticket } => {
            assert!(ticket.is_empty(), "an inline object needs no ticket");
            record
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(record.inline.as_deref(), Some(&data[..]));
    assert!(record.replicas.is_empty());
    // replicated(3) on one metadata copy: refused, and nothing stored.
    match ask(&mut core, &t, "three/a", 3, post("three/a", &data)) {
        Body::Error {
            code: Code::BadRequest,
            message,
        } => assert!(
            message.contains("too few") && message.contains("PostBegin"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ask(
            &mut core,
            &t,
            "three/a",
            4,
            Body::Get {
                name: "three/a".into()
            }
        ),
        Body::Error {
            code: Code::NotFound,
            ..
        }
    ));
    // An empty object has nothing to lose: kept in its record anywhere.
    assert!(matches!(
        ask(&mut core, &t, "three/e", 5, post("three/e", &[])),
        Body::Done { .. }
    ));
    // A Link (a rename's second step) of the inline record follows the
    // same rule under its new name.
    let link = |name: &str| Body::Link {
        record: Record {
            name: name.into(),
            ..record.clone()
        },
        proof: Vec::new(),
    };
    match ask(&mut core, &t, "three/b", 6, link("three/b")) {
        Body::Error {
            code: Code::BadRequest,
            message,
        } => assert!(message.contains("too few"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ask(&mut core, &t, "one/b", 7, link("one/b")),
        Body::Done { .. }
    ));
}
