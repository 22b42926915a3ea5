//! Arbitrary bytes through every parser of `strata-format`.
//!
//! The input is the start of an image file. Nothing may panic, hang or
//! allocate more than the input justifies; whatever parses must survive an
//! encode → parse round trip unchanged.

#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_format::entry::{decode_reftable_entry, ExtendedL2, L1Entry, L2Mapping, SUBCLUSTERS};
use strata_format::header::{Header, V3_HEADER_LEN};
use strata_format::index::{ChainIndexExt, LayerIdentity, LINEAGE_RECORD_BYTES};
use strata_format::{refcount, snapshot};

/// Bounds the per-input work on large inputs.
const MAX_WORDS: usize = 4096;

fuzz_target!(|data: &[u8]| {
    // The cluster size first, as the engine does it.
    let _ = Header::peek_cluster_bits(data);

    // The file is at least as long as the input; let its last 8 bytes say
    // how much longer, so tables "beyond the input" but inside the file are
    // reachable too.
    let mut lens = vec![data.len() as u64];
    if let Some(tail) = data.len().checked_sub(8).map(|at| &data[at..]) {
        let extra = u64::from_be_bytes(tail.try_into().unwrap());
        lens.push((data.len() as u64).saturating_add(extra));
    }
    for file_len in lens {
        if let Ok(h) = Header::parse(data, file_len) {
            parsed(data, file_len, &h);
        }
    }

    // The sub-parsers on their own, on any bytes.
    let _ = ChainIndexExt::parse(data);
    for rec in data.chunks(LINEAGE_RECORD_BYTES as usize).take(64) {
        if let Ok(id) = LayerIdentity::decode(rec) {
            assert_eq!(LayerIdentity::decode(&id.encode()), Ok(id));
        }
    }
    if data.len() >= 4 {
        let count = u32::from_be_bytes(data[..4].try_into().unwrap());
        let _ = snapshot::parse_table(&data[4..], count);
    }
});

/// Everything a valid header leads to.
fn parsed(data: &[u8], file_len: u64, h: &Header) {
    let cs = h.cluster_size();
    assert!(h.cluster_bits >= 9 && h.cluster_bits <= 21);
    assert!(u64::from(h.l1_size) >= Header::l1_entries_for(h.cluster_bits, h.size));
    assert!(h.l1_table_offset + u64::from(h.l1_size) * 8 <= file_len);
    assert!(h.refcount_table_offset + u64::from(h.refcount_table_clusters) * cs <= file_len);

    // L1 entries: the table if the input holds it, else any words.
    let l1 = slice_at(data, h.l1_table_offset, u64::from(h.l1_size) * 8).unwrap_or(data);
    for raw in words(l1) {
        if let Ok(e) = L1Entry::decode(raw, cs) {
            assert_eq!(e.l2_offset % cs, 0);
            assert!(e.l2_offset < 1 << 56);
        }
    }

    // L2 entries: every word of the input, as this image would read them,
    // and every pair of words as an extended (128-bit) entry.
    for raw in words(data) {
        l2_entry(raw, h.cluster_bits, h.version);
    }
    let w: Vec<u64> = words(data).collect();
    for pair in w.chunks_exact(2) {
        extended_l2_entry(pair[0], pair[1], h.cluster_bits);
    }

    // Refcount table entries and refcount blocks of this width.
    let rt = slice_at(
        data,
        h.refcount_table_offset,
        u64::from(h.refcount_table_clusters) * cs,
    )
    .unwrap_or(data);
    for raw in words(rt) {
        let _ = decode_reftable_entry(raw, cs);
    }
    refcounts(data, h.refcount_order);

    // The snapshot table, if the input holds its start.
    if h.nb_snapshots > 0 {
        if let Some(table) = data.get(h.snapshots_offset.min(usize::MAX as u64) as usize..) {
            if let Ok((snaps, len)) = snapshot::parse_table(table, h.nb_snapshots) {
                assert_eq!(snaps.len(), h.nb_snapshots as usize);
                // The last entry's padding to 8 bytes may lie past the end.
                assert!(len <= (table.len() as u64).div_ceil(8) * 8);
            }
        }
    }

    // The chain index descriptor survives its own round trip.
    if let Some(ext) = h.chain_index() {
        assert_eq!(ChainIndexExt::parse(&ext.encode()).as_ref(), Ok(ext));
    }

    // Header round trip. Encoding normalises a v3 header to at least
    // V3_HEADER_LEN bytes (it always stores compression_type); nothing else
    // may change.
    if let Ok(buf) = h.encode() {
        assert!(buf.len() as u64 <= cs);
        let back = Header::parse(&buf, file_len)
            .unwrap_or_else(|e| panic!("encoded header does not parse: {e}\n{h:#?}"));
        let mut want = h.clone();
        if want.version == 3 {
            want.header_length = want.header_length.max(V3_HEADER_LEN);
        }
        assert_eq!(back, want);
    }
}

fn l2_entry(raw: u64, cluster_bits: u32, version: u32) {
    let cs = 1u64 << cluster_bits;
    let Ok(m) = L2Mapping::decode(raw, cluster_bits, version) else {
        return;
    };
    match m {
        L2Mapping::Data { host_offset, .. } => {
            assert!(host_offset != 0 && host_offset % cs == 0 && host_offset < 1 << 56);
            let back =
                L2Mapping::decode(L2Mapping::encode_data(host_offset), cluster_bits, version);
            assert_eq!(
                back,
                Ok(L2Mapping::Data {
                    host_offset,
                    copied: true
                })
            );
        }
        L2Mapping::Zero { prealloc, .. } => {
            assert!(version >= 3);
            assert!(prealloc.is_none_or(|p| p % cs == 0 && p != 0));
        }
        L2Mapping::Compressed {
            host_offset,
            max_len,
        } => {
            assert!(host_offset < 1 << 56);
            // At most 2^(cluster_bits - 8) sectors: two clusters.
            assert!(max_len >= 1 && max_len <= 2 * cs);
        }
        L2Mapping::Unallocated => {}
    }
    if let Some((first, last)) = m.host_range() {
        assert!(first <= last);
    }
}

/// An extended L2 entry that decodes is consistent: no subcluster both
/// allocated and zero, none allocated without a host cluster, no bitmap on
/// a compressed cluster, and what it encodes decodes back.
fn extended_l2_entry(raw: u64, bitmap: u64, cluster_bits: u32) {
    let Ok(e) = ExtendedL2::decode(raw, bitmap, cluster_bits) else {
        return;
    };
    assert_eq!(e.alloc & e.zero, 0);
    match e.cluster {
        L2Mapping::Compressed { .. } => assert_eq!((e.alloc, e.zero), (0, 0)),
        L2Mapping::Unallocated => assert_eq!(e.alloc, 0),
        L2Mapping::Data { .. } => {}
        L2Mapping::Zero { .. } => panic!("extended entries have no zero flag"),
    }
    for i in 0..SUBCLUSTERS {
        let _ = e.subcluster(i);
    }
    if let Some((host, _)) = e.host() {
        let (w0, w1) = ExtendedL2::encode(host, e.alloc, e.zero);
        let back = ExtendedL2::decode(w0, w1, cluster_bits).expect("encoded entry decodes");
        assert_eq!((back.alloc, back.zero, back.host()), (e.alloc, e.zero, Some((host, true))));
    }
}

/// Refcount entries of width 2^order read back what was written, without
/// touching their neighbours.
fn refcounts(data: &[u8], order: u32) {
    let mut block = data.iter().take(4096).copied().collect::<Vec<u8>>();
    if block.len() < 16 {
        return;
    }
    let max = refcount::max_refcount(order);
    let entries = refcount::entries_per_block(block.len() as u64, order);
    for (i, raw) in words(data).enumerate().take(64) {
        let index = raw % (entries + 2); // also one past the end
        let value = raw.rotate_left(i as u32) & max;
        let neighbour = refcount::get(&block, index ^ 1, order);
        refcount::set(&mut block, index, order, value);
        if index < entries {
            assert_eq!(refcount::get(&block, index, order), value);
            assert_eq!(refcount::get(&block, index ^ 1, order), neighbour);
        } else {
            assert_eq!(refcount::get(&block, index, order), 0);
        }
    }
}

fn slice_at(data: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    data.get(start..end)
}

fn words(buf: &[u8]) -> impl Iterator<Item = u64> + '_ {
    buf.chunks_exact(8)
        .take(MAX_WORDS)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
}
