//! The core's decisions, each test failing if its decision broke.

use super::*;
use crate::storage::put::{PutEvent, PutPhase, PutReply};
use strata_store_protocol::addr::DEFAULT_CLUSTER_PREFIX;

const INDEX: u16 = 3;

fn layout() -> Layout {
    Layout::new(DEFAULT_CLUSTER_PREFIX, 4)
}

fn addr(id: u64) -> Addr {
    layout().replica_addr(INDEX, id)
}

fn core() -> StorageCore {
    StorageCore::new(INDEX, 1 << 20, 0, 0)
}

fn is_reply(a: &PutAction) -> bool {
    matches!(a, PutAction::Reply(_))
}

/// A Put of `data` admitted and fed its data and checksum.
fn received(core: &mut StorageCore, data: &[u8], chain: Vec<Addr>) -> (PutMachine, Vec<PutAction>) {
    let (mut put, _) = core
        .admit_put(addr(1), data.len() as u64, chain, None, false, u64::MAX)
        .expect("admitted");
    let mut actions = Vec::new();
    for chunk in data.chunks(3) {
        actions.extend(put.handle(PutEvent::Data(chunk)));
    }
    actions.extend(put.handle(PutEvent::Checksum(crc32c::crc32c(data))));
    (put, actions)
}

#[test]
fn a_put_is_acknowledged_only_after_its_sync_and_install() {
    let mut core = core();
    let (mut put, actions) = received(&mut core, b"hello world", vec![]);
    assert!(
        !actions.iter().any(is_reply),
        "replied before the sync: {actions:?}"
    );
    assert_eq!(actions.last(), Some(&PutAction::Sync));
    // An install reported before the sync does nothing.
    assert!(core.installed(&mut put).is_empty());
    assert_eq!(core.objects(), 0);
    let actions = put.handle(PutEvent::Synced);
    assert_eq!(actions, vec![PutAction::Install]);
    let actions = core.installed(&mut put);
    assert_eq!(actions, vec![PutAction::Reply(PutReply::Ack { copies: 1 })]);
    assert_eq!(core.objects(), 1);
    // Header, 11 bytes of data and the chunk table's one entry.
    assert_eq!(core.used(), 11 + FILE_HEADER as u64 + 4);
}

#[test]
fn a_chain_answer_before_the_sync_does_not_acknowledge() {
    let mut core = core();
    let (mut put, actions) = received(&mut core, b"abcdef", vec![addr(9)]);
    assert!(actions.contains(&PutAction::ForwardChecksum {
        crc: crc32c::crc32c(b"abcdef")
    }));
    // The next replica finished first: its answer waits for this one.
    assert!(put.handle(PutEvent::ForwardAnswer(Some(1))).is_empty());
    assert!(put.handle(PutEvent::Synced).iter().all(|a| !is_reply(a)));
    let actions = core.installed(&mut put);
    assert_eq!(actions, vec![PutAction::Reply(PutReply::Ack { copies: 2 })]);
}

#[test]
fn a_failed_next_hop_leaves_one_copy_acknowledged() {
    let mut core = core();
    let (mut put, _) = received(&mut core, b"xyz", vec![addr(9), addr(10)]);
    put.handle(PutEvent::Synced);
    assert_eq!(core.installed(&mut put), vec![PutAction::AwaitForward]);
    let actions = put.handle(PutEvent::ForwardAnswer(None));
    assert_eq!(actions, vec![PutAction::Reply(PutReply::Ack { copies: 1 })]);
}

#[test]
fn a_hostile_next_hop_cannot_overflow_the_copy_count() {
    let mut core = core();
    let (mut put, _) = received(&mut core, b"xyz", vec![addr(9)]);
    put.handle(PutEvent::Synced);
    core.installed(&mut put);
    let actions = put.handle(PutEvent::ForwardAnswer(Some(u8::MAX)));
    assert_eq!(
        actions,
        vec![PutAction::Reply(PutReply::Ack { copies: 255 })]
    );
}

#[test]
fn a_forward_that_fails_midway_stops_forwarding_and_the_checksum_too() {
    let mut core = core();
    let (mut put, first) = core
        .admit_put(addr(1), 4, vec![addr(9)], None, false, u64::MAX)
        .expect("admitted");
    assert!(first
        .iter()
        .any(|a| matches!(a, PutAction::OpenForward { next, .. } if *next == addr(9))));
    assert_eq!(
        put.handle(PutEvent::Data(b"ab")),
        vec![PutAction::Write, PutAction::Forward]
    );
    put.handle(PutEvent::ForwardFailed);
    assert_eq!(put.handle(PutEvent::Data(b"cd")), vec![PutAction::Write]);
    let actions = put.handle(PutEvent::Checksum(crc32c::crc32c(b"abcd")));
    assert!(!actions
        .iter()
        .any(|a| matches!(a, PutAction::ForwardChecksum { .. })));
    put.handle(PutEvent::Synced);
    assert_eq!(
        core.installed(&mut put),
        vec![PutAction::Reply(PutReply::Ack { copies: 1 })]
    );
}

#[test]
fn a_checksum_mismatch_is_refused_and_never_synced() {
    let mut core = core();
    let (mut put, _) = core
        .admit_put(addr(1), 3, vec![], None, false, u64::MAX)
        .expect("admitted");
    put.handle(PutEvent::Data(b"abc"));
    let actions = put.handle(PutEvent::Checksum(crc32c::crc32c(b"abd")));
    assert!(!actions.contains(&PutAction::Sync));
    assert_eq!(actions[0], PutAction::RemoveTemp);
    assert!(
        matches!(&actions[1], PutAction::Reply(PutReply::Error(m)) if m.contains("checksum mismatch"))
    );
    assert_eq!(put.phase(), PutPhase::Done);
    // A late sync or install changes nothing.
    assert!(put.handle(PutEvent::Synced).is_empty());
    assert!(core.installed(&mut put).is_empty());
    assert_eq!(core.objects(), 0);
}

#[test]
fn more_data_than_announced_or_an_early_checksum_breaks_the_put() {
    let mut core = core();
    let (mut put, _) = core
        .admit_put(addr(1), 2, vec![], None, false, u64::MAX)
        .expect("admitted");
    assert_eq!(
        put.handle(PutEvent::Data(b"abc")),
        vec![PutAction::RemoveTemp]
    );
    let (mut put, _) = core
        .admit_put(addr(2), 2, vec![], None, false, u64::MAX)
        .expect("admitted");
    assert_eq!(
        put.handle(PutEvent::Checksum(0)),
        vec![PutAction::RemoveTemp]
    );
}

#[test]
fn a_broken_tenant_put_is_reported_abandoned_and_its_temp_removed() {
    let mut core = core();
    let coordinator = 0xfd00_u128 << 112 | 7;
    let (mut put, _) = core
        .admit_put(addr(1), 10, vec![], Some(coordinator), false, u64::MAX)
        .expect("admitted");
    put.handle(PutEvent::Data(b"abc"));
    let actions = put.handle(PutEvent::Broken);
    assert_eq!(
        actions,
        vec![
            PutAction::RemoveTemp,
            PutAction::ReportAbandoned {
                coordinator,
                replica: addr(1)
            }
        ]
    );
    // A node's Put (no coordinator) has nobody to tell.
    let (mut put, _) = core
        .admit_put(addr(2), 10, vec![], None, false, u64::MAX)
        .expect("admitted");
    assert_eq!(put.handle(PutEvent::Broken), vec![PutAction::RemoveTemp]);
}

#[test]
fn a_put_broken_after_its_install_keeps_the_installed_file() {
    let mut core = core();
    let (mut put, _) = received(&mut core, b"abc", vec![addr(9)]);
    put.handle(PutEvent::Synced);
    core.installed(&mut put);
    assert!(!put
        .handle(PutEvent::Broken)
        .contains(&PutAction::RemoveTemp));
}

#[test]
fn addresses_outside_the_prefix_or_not_the_one_connected_to_are_refused() {
    let core = core();
    let layout = layout();
    let other = layout.replica_addr(INDEX + 1, 1);
    let put = Request::Put {
        addr: other,
        size: 1,
        chain: vec![],
    };
    let refusal = core.check_request(&layout, &put, None).unwrap_err();
    assert!(refusal
        .message
        .contains("not in this storage node's prefix"));
    assert_eq!(refusal.after, AfterRefusal::Close);
    let get = Request::Get { addr: other };
    assert_eq!(
        core.check_request(&layout, &get, None).unwrap_err().after,
        AfterRefusal::Continue
    );
    // The prefix itself is no replica.
    let prefix = Request::Get {
        addr: layout.sn_prefix(INDEX),
    };
    assert!(core.check_request(&layout, &prefix, None).is_err());
    let get = Request::Get { addr: addr(1) };
    assert!(core.check_request(&layout, &get, Some(addr(2))).is_err());
    assert!(core.check_request(&layout, &get, Some(addr(1))).is_ok());
}

#[test]
fn a_retired_node_refuses_puts_but_still_answers_gets() {
    let mut core = core();
    core.retire();
    let layout = layout();
    let put = Request::Put {
        addr: addr(1),
        size: 1,
        chain: vec![],
    };
    let refusal = core.check_request(&layout, &put, None).unwrap_err();
    assert!(refusal.message.contains("retired"));
    assert!(core
        .check_request(&layout, &Request::Get { addr: addr(1) }, None)
        .is_ok());
}

#[test]
fn an_existing_a_busy_or_an_oversized_replica_is_refused_and_drained() {
    let mut core = StorageCore::new(INDEX, 1000, 900, 1);
    let drained = |r: Result<(PutMachine, Vec<PutAction>), Refusal>| match r {
        Err(Refusal {
            message,
            after: AfterRefusal::Drain(n),
        }) => (message, n),
        other => panic!("not refused: {other:?}"),
    };
    let (m, n) = drained(core.admit_put(addr(1), 10, vec![], None, true, u64::MAX));
    assert!(m.contains("already exists"));
    assert_eq!(n, 14);
    let (m, _) = drained(core.admit_put(addr(1), 101, vec![], None, false, u64::MAX));
    assert!(m.contains("no room for 101 bytes (100 free)"), "{m}");
    // The file system's free space bounds it too.
    let (m, _) = drained(core.admit_put(addr(1), 60, vec![], None, false, 50));
    assert!(m.contains("(50 free)"), "{m}");
    let (first, _) = core
        .admit_put(addr(1), 10, vec![], None, false, u64::MAX)
        .expect("admitted");
    let (m, _) = drained(core.admit_put(addr(1), 10, vec![], None, false, u64::MAX));
    assert!(m.contains("being written"), "{m}");
    core.end_put(&first);
    assert!(core
        .admit_put(addr(1), 10, vec![], None, false, u64::MAX)
        .is_ok());
}

#[test]
fn the_collector_removes_only_aged_unreferenced_replicas_not_in_flight() {
    let mut core = core();
    let files = [
        (addr(1), 500),
        (addr(2), 500),
        (addr(3), 10),
        (addr(4), 500),
    ];
    let (busy, _) = core
        .admit_put(addr(4), 1, vec![], None, false, u64::MAX)
        .expect("admitted");
    let (round, candidates) = core.begin_collection(files, 100);
    assert_eq!(
        candidates,
        vec![addr(1), addr(2)],
        "young or in-flight replicas looked up"
    );
    let referenced = HashSet::from([addr(2)]);
    assert_eq!(core.finish_collection(round, &referenced), vec![addr(1)]);
    // A finished round removes nothing twice.
    assert!(core.finish_collection(round, &HashSet::new()).is_empty());
    core.end_put(&busy);
}

#[test]
fn a_replica_written_again_during_a_round_is_not_collected() {
    let mut core = core();
    let (round, candidates) = core.begin_collection([(addr(1), 500)], 100);
    assert_eq!(candidates, vec![addr(1)]);
    // Freed and written again while the metadata nodes are asked.
    let (put, _) = core
        .admit_put(addr(1), 1, vec![], None, false, u64::MAX)
        .expect("admitted");
    core.end_put(&put);
    assert!(core.finish_collection(round, &HashSet::new()).is_empty());
}

#[test]
fn a_replica_in_flight_when_the_round_ends_is_not_collected() {
    let mut core = core();
    let (round, _) = core.begin_collection([(addr(1), 500)], 100);
    let (_put, _) = core
        .admit_put(addr(1), 1, vec![], None, false, u64::MAX)
        .expect("admitted");
    assert!(core.finish_collection(round, &HashSet::new()).is_empty());
    let (round, candidates) = core.begin_collection([(addr(1), 500)], 100);
    assert!(candidates.is_empty());
    core.cancel_collection(round);
}

#[test]
fn removals_never_count_below_zero() {
    let mut core = StorageCore::new(INDEX, 100, 30, 1);
    core.removed(30);
    core.removed(30);
    assert_eq!((core.used(), core.objects()), (0, 0));
    assert_eq!(core.free(u64::MAX), 100);
}

#[test]
fn a_checksum_that_cannot_be_written_refuses_the_put_before_its_sync() {
    let mut core = core();
    let (mut put, actions) = received(&mut core, b"abc", vec![]);
    assert_eq!(actions.last(), Some(&PutAction::Sync));
    let actions = put.handle(PutEvent::WriteFailed("writing the replica: disk full"));
    assert_eq!(actions[0], PutAction::RemoveTemp);
    assert!(matches!(&actions[1], PutAction::Reply(PutReply::Error(m)) if m.contains("disk full")));
    // The sync that was queued is void: no install, no acknowledgement.
    assert!(put.handle(PutEvent::Synced).is_empty());
    assert!(core.installed(&mut put).is_empty());
}

#[test]
fn a_reply_that_does_not_get_through_reports_a_tenant_s_put_abandoned() {
    let mut core = core();
    let coordinator = 0xfd00_u128 << 112 | 7;
    let (mut put, _) = core
        .admit_put(addr(1), 1, vec![], Some(coordinator), false, u64::MAX)
        .expect("admitted");
    put.handle(PutEvent::Data(b"a"));
    put.handle(PutEvent::Checksum(crc32c::crc32c(b"a")));
    put.handle(PutEvent::Synced);
    assert!(matches!(
        core.installed(&mut put)[..],
        [PutAction::Reply(PutReply::Ack { copies: 1 })]
    ));
    assert_eq!(
        put.handle(PutEvent::Broken),
        vec![PutAction::ReportAbandoned {
            coordinator,
            replica: addr(1)
        }]
    );
}
