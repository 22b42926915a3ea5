//! Arbitrary bytes through the object store's prefix table decoder
//! (`strata_store_protocol::table::Table::decode`), as a client or node
//! reads the orchestrator's `Table` answer. Nothing may panic; a table that
//! decodes must decode again, equal, from its own encoding, and every
//! lookup a node or client makes on it must answer without panicking.

#![no_main]

#[path = "common/store.rs"]
mod store;

use libfuzzer_sys::fuzz_target;
use store::{key, TENANT};
use strata_store_protocol::auth::{Gate, Receiver};
use strata_store_protocol::table::Table;
use strata_store_protocol::wire::{Body, Msg};

/// Bounds the per-input work of the lookups.
const MAX_LOOKUPS: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Ok(table) = Table::decode(data) else {
        return;
    };
    let bytes = table.encode();
    assert_eq!(
        Table::decode(&bytes).as_ref(),
        Ok(&table),
        "table round trip"
    );
    // As the orchestrator sends it: in a `Table` answer.
    let answer = Msg::new(1, 0, Body::Table { bytes });
    if let Ok(datagram) = answer.encode() {
        let decoded = Msg::decode(&datagram).expect("an encoded answer decodes");
        let Body::Table { bytes } = decoded.body else {
            panic!("a Table answer decoded as {:?}", decoded.body);
        };
        assert_eq!(Table::decode(&bytes).as_ref(), Ok(&table));
    }
    lookups(&table, data);
});

/// The table's lookups, at addresses and names taken from the input.
fn lookups(table: &Table, data: &[u8]) {
    for name in ["", "a", "big/x", "acme/obj", "/", "big"] {
        let addrs = table.meta_addrs(name);
        assert_eq!(addrs.len(), usize::from(table.params_for(name).n_m));
        for a in addrs {
            let _ = table.mn_endpoint(a);
        }
    }
    for chunk in data.chunks_exact(16).take(MAX_LOOKUPS) {
        let addr = u128::from_be_bytes(chunk.try_into().expect("16 bytes"));
        let _ = table.mn_endpoint(addr);
        let _ = table.sn_endpoint(addr);
        if let Some(mg) = table.layout.mg_of(addr) {
            let _ = (table.move_of(mg), table.home_of(mg), table.restoring(mg));
        }
        let index = (addr >> 64) as u16;
        let _ = (
            table.groups_of(index),
            table.drain_of(index),
            table.retiring(index),
        );
        let _ = table.keys_of(addr as u64);
    }
    let _ = table.gc_mns().count();
    let _ = table.max_n_d();
    let _ = table.min_generation(TENANT);
    // A metadata node's gate follows the table's revocations.
    let mut gate = Gate::new(key(), Receiver::Mn);
    gate.follow_table(table);
}
