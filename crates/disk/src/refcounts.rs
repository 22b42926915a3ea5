//! Counting every reference to the clusters of one qcow2 file and
//! comparing the counts with the stored refcounts (and, on request,
//! fixing them): the core of `check`, and the repair a writer runs on an
//! image a crash left dirty.

use std::collections::{HashMap, HashSet};

use strata_format::entry::{L1Entry, OFFSET_MASK};
use strata_format::header::{Header, EXT_BITMAPS};
use strata_format::{refcount, ExtendedL2, HeaderExtension, L2Mapping};

use crate::allocator::Allocator;
use crate::error::{DiskError, Result};
use crate::layer::Layer;

/// What to repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// Report only.
    None,
    /// Drop leaked references.
    Leaks,
    /// Fix every refcount mismatch.
    All,
}

/// Result of a check, with qemu-img's fields in its order (that of QEMU's
/// QDict), each counter left out when zero as qemu-img leaves it out;
/// Strata's own details come last.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CheckReport {
    /// First byte after the last used cluster.
    #[serde(skip_serializing_if = "is_zero")]
    pub image_end_offset: u64,
    /// Compressed clusters.
    #[serde(skip_serializing_if = "is_zero")]
    pub compressed_clusters: u64,
    /// Guest clusters.
    #[serde(skip_serializing_if = "is_zero")]
    pub total_clusters: u64,
    /// Errors that may corrupt data.
    #[serde(skip_serializing_if = "is_zero")]
    pub corruptions: u64,
    /// Corruptions repaired.
    #[serde(skip_serializing_if = "is_zero")]
    pub corruptions_fixed: u64,
    /// Errors that stopped the check from completing.
    pub check_errors: u64,
    /// Clusters with a refcount but no reference.
    #[serde(skip_serializing_if = "is_zero")]
    pub leaks: u64,
    /// Leaks repaired.
    #[serde(skip_serializing_if = "is_zero")]
    pub leaks_fixed: u64,
    /// Guest clusters with a host cluster in this file (data,
    /// preallocated zeros, compressed).
    #[serde(skip_serializing_if = "is_zero")]
    pub allocated_clusters: u64,
    /// The file checked.
    pub filename: String,
    /// Always "qcow2".
    pub format: String,
    /// Allocated clusters not following the previous one of their L2
    /// table on the host, plus every compressed cluster.
    #[serde(skip_serializing_if = "is_zero")]
    pub fragmented_clusters: u64,
    /// One line per problem found (qemu-img writes them to stderr).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<String>,
    /// State of the Strata chain index, if the image has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain_index: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl CheckReport {
    /// qemu-img's exit code: 0 clean, 2 corrupt, 3 leaks only.
    pub fn exit_code(&self) -> i32 {
        if self.check_errors > 0 {
            1
        } else if self.corruptions > 0 {
            2
        } else if self.leaks > 0 {
            3
        } else {
            0
        }
    }
}

/// Rebuilds refcounts from references (after a crash left the image dirty).
pub(crate) fn repair_refcounts(top: &Layer) -> Result<()> {
    run(top, Repair::All).map(|_| ())
}

pub(crate) fn run(layer: &Layer, repair: Repair) -> Result<CheckReport> {
    run_counting(layer, repair).map(|(report, _)| report)
}

/// A data cluster that overlaps metadata: its L2 entry's offset in the
/// file. A guest write there would overwrite the metadata.
pub(crate) type Overlap = u64;

/// Counts, compares and (with `repair`) fixes refcounts; also returns the
/// L2 entries whose data cluster overlaps metadata.
pub(crate) fn run_counting(layer: &Layer, repair: Repair) -> Result<(CheckReport, Vec<Overlap>)> {
    let h = layer
        .header()
        .ok_or_else(|| DiskError::Invalid("check works on qcow2 images".into()))?;
    let clusters = layer.file_len().div_ceil(h.cluster_size());
    if clusters > MAX_CHECK_CLUSTERS {
        return Err(DiskError::Invalid(format!(
            "{}: {clusters} host clusters is more than check can count ({MAX_CHECK_CLUSTERS}); \
             is the file sparse and far larger than its data?",
            layer.path().display()
        )));
    }
    let mut c = Counter::new(layer, &h);
    c.collect_metadata(&h)?;
    c.count_metadata(&h)?;
    let mut report = CheckReport {
        filename: layer.path().display().to_string(),
        format: "qcow2".into(),
        total_clusters: h.size.div_ceil(h.cluster_size()),
        ..Default::default()
    };
    let mut fixes: Vec<(u64, u64, u64)> = Vec::new();
    let flags = std::mem::take(&mut c.copied_flags);
    let mut copied_at: Vec<(u64, bool, &'static str)> = flags;
    copied_at.sort_unstable_by_key(|f| f.0);
    let mut next_flag = 0;
    let counted = c.refs.len() as u64;
    let mut mismatched: HashSet<u64, ahash::RandomState> = HashSet::default();
    let mut highest: Option<u64> = None;
    c.for_each_stored(&h, counted, &mut |cluster, have, c: &mut Counter| {
        let want = u64::from(c.refs.get(cluster as usize).copied().unwrap_or(0));
        // qemu's image end: past the last cluster of the file that is
        // referenced or has a refcount.
        if (want > 0 || have > 0) && cluster < counted {
            highest = Some(cluster);
        }
        if want != have {
            mismatched.insert(cluster);
            if have > want && cluster >= counted {
                // A refcount past the end of the file: qemu-img does not
                // look there, so it is not counted (but still repaired).
                c.msg(format!(
                    "Leaked cluster {cluster} refcount={have} reference={want} \
                     (beyond the end of the file; not counted, as by qemu-img)"
                ));
                if repair != Repair::None {
                    fixes.push((cluster, want, have));
                }
            } else if have > want {
                report.leaks += 1;
                c.msg(format!("Leaked cluster {cluster} refcount={have} reference={want}"));
                if repair != Repair::None {
                    fixes.push((cluster, want, have));
                }
            } else {
                report.corruptions += 1;
                c.msg(format!("ERROR cluster {cluster} refcount={have} reference={want}"));
                if repair == Repair::All {
                    fixes.push((cluster, want, have));
                }
            }
        }
        while next_flag < copied_at.len() && copied_at[next_flag].0 == cluster {
            let (_, copied, what) = copied_at[next_flag];
            if copied != (have == 1) {
                report.corruptions += 1;
                c.msg(format!(
                    "ERROR OFLAG_COPIED {what}: cluster {cluster} has COPIED={} but refcount={have}",
                    u8::from(copied)
                ));
            }
            next_flag += 1;
        }
    })?;
    report.corruptions += c.corruptions;
    for (cluster, m) in std::mem::take(&mut c.overlap_findings) {
        if !mismatched.contains(&cluster) {
            report.corruptions += 1;
        }
        c.msg(format!("ERROR {m}"));
    }
    if !fixes.is_empty() {
        let mut alloc = Allocator::load(layer)?;
        for (cluster, value, had) in &fixes {
            alloc.set_refcount(layer, *cluster, *value)?;
            if had > value {
                report.leaks_fixed += 1;
            } else {
                report.corruptions_fixed += 1;
            }
        }
        layer.file.sync()?;
    }
    report.image_end_offset = highest.map_or(0, |last| (last + 1) * c.cs);
    report.allocated_clusters = c.allocated;
    report.fragmented_clusters = c.fragmented;
    report.compressed_clusters = c.compressed;
    report.messages = c.messages;
    // Relocating rewrites L2 entries in place: not when tables overlap
    // (an "entry" may be other metadata) nor when snapshots may share the
    // L2 table (the new cluster's refcount would not be one).
    let overlaps = if c.tangled || h.nb_snapshots > 0 {
        Vec::new()
    } else {
        c.overlaps
    };
    Ok((report, overlaps))
}

/// Counts references to every cluster of one file.
struct Counter<'a> {
    layer: &'a Layer,
    cs: u64,
    cluster_bits: u32,
    version: u32,
    /// L2 entries are 128 bits (subcluster bitmaps).
    extended: bool,
    refs: Vec<u32>,
    corruptions: u64,
    messages: Vec<String>,
    /// (cluster, COPIED flag, what) of active L1/L2 entries.
    copied_flags: Vec<(u64, bool, &'static str)>,
    allocated: u64,
    fragmented: u64,
    compressed: u64,
    /// Where the next data cluster of the current L2 table would be if
    /// contiguous (qemu's fragmentation measure).
    next_contiguous: Option<u64>,
    /// Host clusters of the active metadata and what they hold.
    metadata: HashMap<u64, &'static str, ahash::RandomState>,
    /// L2 entries (their file offsets) whose data overlaps metadata.
    overlaps: Vec<Overlap>,
    /// Overlaps found (host cluster, message). Each counts as a corruption
    /// only when the refcount comparison does not already report that
    /// cluster, so that the count is qemu-img's whenever qemu-img sees the
    /// damage.
    overlap_findings: Vec<(u64, String)>,
    /// Metadata structures overlap one another: L2 "entries" may then be
    /// other metadata, and nothing is relocated.
    tangled: bool,
}

/// Largest file (in clusters) check counts references for: 4 bytes each,
/// so at most 256 MiB of counters (16 TiB of 64 KiB clusters).
const MAX_CHECK_CLUSTERS: u64 = 1 << 26;

/// Messages kept in a report; counts stay exact beyond it.
pub(crate) const MAX_MESSAGES: usize = 1000;

impl<'a> Counter<'a> {
    fn new(layer: &'a Layer, h: &Header) -> Counter<'a> {
        let cs = h.cluster_size();
        let clusters = layer.file_len().div_ceil(cs);
        Counter {
            layer,
            cs,
            cluster_bits: h.cluster_bits,
            version: h.version,
            extended: h.extended_l2(),
            refs: vec![0; clusters as usize],
            corruptions: 0,
            messages: Vec::new(),
            copied_flags: Vec::new(),
            allocated: 0,
            fragmented: 0,
            compressed: 0,
            next_contiguous: None,
            metadata: HashMap::default(),
            overlaps: Vec::new(),
            overlap_findings: Vec::new(),
            tangled: false,
        }
    }

    /// Records which host clusters hold the active metadata, before any
    /// reference is counted, so that a data cluster overlapping one can be
    /// reported (a guest write there would overwrite it). Metadata
    /// structures that overlap one another are reported here. Structures
    /// beyond the end of the file or misaligned are left to the count.
    fn collect_metadata(&mut self, h: &Header) -> Result<()> {
        let cs = self.cs;
        self.claim(0, cs, "the image header");
        let l1_len = u64::from(h.l1_size) * 8;
        self.claim(h.l1_table_offset, l1_len, "the L1 table");
        let rt_len = u64::from(h.refcount_table_clusters) * cs;
        self.claim(h.refcount_table_offset, rt_len, "the refcount table");
        if self.within(h.refcount_table_offset, rt_len) {
            for raw in words(&self.read(h.refcount_table_offset, rt_len)?) {
                if raw != 0 && raw.is_multiple_of(cs) {
                    self.claim(raw, cs, "a refcount block");
                }
            }
        }
        if self.within(h.l1_table_offset, l1_len) {
            for raw in words(&self.read(h.l1_table_offset, l1_len)?) {
                if let Ok(e) = L1Entry::decode(raw, cs) {
                    if e.l2_offset != 0 {
                        self.claim(e.l2_offset, cs, "an L2 table");
                    }
                }
            }
        }
        if h.chain_index_valid() {
            if let Some(ext) = h.chain_index() {
                let len = ext.region_len.div_ceil(cs) * cs;
                self.claim(ext.region_offset, len, "the chain index region");
            }
        }
        Ok(())
    }

    /// Whether `[offset, offset + len)` lies inside the file.
    fn within(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.layer.file_len())
    }

    /// Records `[offset, offset + len)` as holding `what`, reporting an
    /// overlap with metadata recorded before.
    fn claim(&mut self, offset: u64, len: u64, what: &'static str) {
        if len == 0 || !self.within(offset, len) || !offset.is_multiple_of(self.cs) {
            return;
        }
        for c in offset / self.cs..(offset + len).div_ceil(self.cs) {
            if let Some(other) = self.metadata.insert(c, what) {
                self.tangled = true;
                let m = format!(
                    "{what} at 0x{offset:x} overlaps {other} (host cluster 0x{:x})",
                    c * self.cs
                );
                self.overlap_findings.push((c, m));
                return;
            }
        }
    }

    /// Reports a data cluster of guest offset `guest` (L2 entry at file
    /// offset `at`) whose host clusters `[first, last]` hold metadata.
    fn check_data_overlap(&mut self, guest: u64, at: u64, first: u64, last: u64) {
        let hit = (first / self.cs..=last / self.cs)
            .find_map(|c| self.metadata.get(&c).map(|w| (c * self.cs, *w)));
        if let Some((cluster, what)) = hit {
            let m = format!(
                "data cluster of guest offset 0x{guest:x} is host cluster 0x{cluster:x}, \
                 which holds {what}: a guest write there would overwrite it"
            );
            self.overlap_findings.push((cluster / self.cs, m));
            self.overlaps.push(at);
        }
    }

    fn msg(&mut self, m: String) {
        if self.messages.len() < MAX_MESSAGES {
            self.messages.push(m);
        }
    }

    fn corrupt(&mut self, m: String) {
        self.corruptions += 1;
        self.msg(format!("ERROR {m}"));
    }

    /// Adds one reference to every cluster of `[offset, offset+len)`.
    /// Returns false if the range lies beyond the end of the file.
    fn inc(&mut self, offset: u64, len: u64, what: &str) -> bool {
        if len == 0 {
            return true;
        }
        let first = offset / self.cs;
        // A hostile offset near 2^64 must not overflow: treat it as past EOF.
        let last = offset
            .checked_add(len - 1)
            .map_or(u64::MAX, |e| e / self.cs);
        if last >= self.refs.len() as u64 {
            self.corrupt(format!(
                "{what} at 0x{offset:x} lies beyond the end of the file (0x{:x})",
                self.layer.file_len()
            ));
            return false;
        }
        for c in first..=last {
            self.refs[c as usize] = self.refs[c as usize].saturating_add(1);
        }
        true
    }

    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        self.layer.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    fn count_metadata(&mut self, h: &Header) -> Result<()> {
        self.inc(0, self.cs, "header");
        self.count_l1(h.l1_table_offset, h.l1_size, true)?;
        let rt_len = u64::from(h.refcount_table_clusters) * self.cs;
        self.inc(h.refcount_table_offset, rt_len, "refcount table");
        for (i, raw) in words(&self.read(h.refcount_table_offset, rt_len)?).enumerate() {
            if raw == 0 {
                continue;
            }
            if raw & 0x1ff != 0 || raw % self.cs != 0 {
                self.corrupt(format!("refcount table entry {i} 0x{raw:x} is misaligned"));
                continue;
            }
            self.inc(raw, self.cs, "refcount block");
        }
        if h.nb_snapshots > 0 {
            self.count_snapshots(h)?;
        }
        for ext in &h.extensions {
            if let HeaderExtension::Other { kind, data } = ext {
                if *kind == EXT_BITMAPS {
                    self.count_bitmaps(data)?;
                }
            }
        }
        Ok(())
    }

    fn count_l1(&mut self, offset: u64, entries: u32, active: bool) -> Result<()> {
        let len = u64::from(entries) * 8;
        if !self.inc(offset, len, "L1 table") {
            return Ok(());
        }
        let l1 = self.read(offset, len)?;
        for (i, raw) in words(&l1).enumerate() {
            let entry = match L1Entry::decode(raw, self.cs) {
                Ok(e) => e,
                Err(e) => {
                    self.corrupt(format!("L1 entry {i}: {e}"));
                    continue;
                }
            };
            if entry.l2_offset == 0 {
                continue;
            }
            if !self.inc(entry.l2_offset, self.cs, "L2 table") {
                continue;
            }
            if active {
                self.copied_flags
                    .push((entry.l2_offset / self.cs, entry.copied, "L2 table"));
            }
            self.count_l2(entry.l2_offset, active, i as u64)?;
        }
        Ok(())
    }

    /// Counts the references of the L2 table at `table`, the one of L1
    /// entry `l1_index`.
    fn count_l2(&mut self, table: u64, active: bool, l1_index: u64) -> Result<()> {
        // qemu measures contiguity within one L2 table only.
        self.next_contiguous = None;
        let l2 = self.read(table, self.cs)?;
        let w: Vec<u64> = words(&l2).collect();
        let step = if self.extended { 2 } else { 1 };
        for (i, pair) in w.chunks_exact(step).enumerate() {
            let decoded = if self.extended {
                // One mapping for the whole cluster: its host cluster (the
                // reference to count), or zeros when only zero bits are set.
                ExtendedL2::decode(pair[0], pair[1], self.cluster_bits).map(|e| match e.cluster {
                    L2Mapping::Unallocated if e.zero != 0 => L2Mapping::Zero {
                        prealloc: None,
                        copied: false,
                    },
                    c => c,
                })
            } else {
                L2Mapping::decode(pair[0], self.cluster_bits, self.version)
            };
            let m = match decoded {
                Ok(m) => m,
                Err(e) => {
                    self.corrupt(format!("L2 table 0x{table:x} entry {i}: {e}"));
                    continue;
                }
            };
            // qemu counts a cluster allocated when it has a host cluster
            // (data, preallocated zeros, compressed): zero clusters without
            // one and extended entries without one are not.
            if matches!(
                m,
                L2Mapping::Unallocated | L2Mapping::Zero { prealloc: None, .. }
            ) {
                continue;
            }
            let Some((first, last)) = m.host_range() else {
                continue;
            };
            let compressed = matches!(m, L2Mapping::Compressed { .. });
            // Compressed clusters are never written in place: only what a
            // guest write would land on counts.
            if active && !compressed {
                let entries = self.cs / (8 * step as u64);
                let guest = (l1_index * entries + i as u64) << self.cluster_bits;
                let at = table + i as u64 * 8 * step as u64;
                self.check_data_overlap(guest, at, first, last);
            }
            if active {
                self.count_fragment(&m);
            }
            if !self.inc(first, last - first + 1, "data cluster") {
                continue;
            }
            if active {
                if let L2Mapping::Data {
                    host_offset,
                    copied,
                }
                | L2Mapping::Zero {
                    prealloc: Some(host_offset),
                    copied,
                } = m
                {
                    self.copied_flags
                        .push((host_offset / self.cs, copied, "data cluster"));
                }
            }
        }
        Ok(())
    }

    /// Counts an allocated cluster of the active table as qemu-img does:
    /// a compressed cluster is fragmented by nature; another one when it
    /// does not follow the previous one of the same L2 table on the host.
    fn count_fragment(&mut self, m: &L2Mapping) {
        self.allocated += 1;
        match *m {
            L2Mapping::Compressed { .. } => {
                self.compressed += 1;
                self.fragmented += 1;
            }
            L2Mapping::Data { host_offset, .. }
            | L2Mapping::Zero {
                prealloc: Some(host_offset),
                ..
            } => {
                if self.next_contiguous.is_some_and(|n| n != host_offset) {
                    self.fragmented += 1;
                }
                self.next_contiguous = Some(host_offset + self.cs);
            }
            _ => {}
        }
    }

    fn count_snapshots(&mut self, h: &Header) -> Result<()> {
        // A table of at most 65536 entries of at most ~132 KiB each; read
        // what the file holds up to a bound, and let the parser check.
        let avail = self.layer.file_len().saturating_sub(h.snapshots_offset);
        let len = avail.min(64 << 20);
        let buf = self.read(h.snapshots_offset, len)?;
        let (snaps, table_len) = match strata_format::snapshot::parse_table(&buf, h.nb_snapshots) {
            Ok(t) => t,
            Err(e) => {
                self.corrupt(format!("snapshot table: {e}"));
                return Ok(());
            }
        };
        self.inc(h.snapshots_offset, table_len, "snapshot table");
        for s in snaps {
            if u64::from(s.l1_size) > strata_format::MAX_L1_ENTRIES
                || s.l1_table_offset % self.cs != 0
            {
                self.corrupt(format!("snapshot '{}' has an invalid L1 table", s.name));
                continue;
            }
            self.count_l1(s.l1_table_offset, s.l1_size, false)?;
        }
        Ok(())
    }

    fn count_bitmaps(&mut self, ext: &[u8]) -> Result<()> {
        if ext.len() < 24 {
            self.corrupt("bitmaps extension is truncated".into());
            return Ok(());
        }
        let nb = u32::from_be_bytes(ext[0..4].try_into().unwrap_or([0; 4]));
        let dir_size = u64::from_be_bytes(ext[8..16].try_into().unwrap_or([0; 8]));
        let dir_off = u64::from_be_bytes(ext[16..24].try_into().unwrap_or([0; 8]));
        if dir_size > 64 << 20 || !self.inc(dir_off, dir_size, "bitmap directory") {
            return Ok(());
        }
        let dir = self.read(dir_off, dir_size)?;
        let mut at = 0usize;
        for _ in 0..nb {
            let Some(e) = dir.get(at..at + 24) else { break };
            let table_off = u64::from_be_bytes(e[0..8].try_into().unwrap_or([0; 8]));
            let table_size = u64::from(u32::from_be_bytes(e[8..12].try_into().unwrap_or([0; 4])));
            let name_size = usize::from(u16::from_be_bytes([e[18], e[19]]));
            let extra = u32::from_be_bytes(e[20..24].try_into().unwrap_or([0; 4])) as usize;
            at = (at + 24 + extra + name_size).div_ceil(8) * 8;
            if table_size > strata_format::MAX_L1_ENTRIES
                || !self.inc(table_off, table_size * 8, "bitmap table")
            {
                continue;
            }
            for raw in words(&self.read(table_off, table_size * 8)?) {
                let off = raw & OFFSET_MASK;
                if off > 1 {
                    self.inc(off, self.cs, "bitmap data");
                }
            }
        }
        Ok(())
    }

    /// Calls `f(cluster, stored refcount)` for every cluster below `count`
    /// or covered by a refcount block, reading one block at a time.
    fn for_each_stored(
        &mut self,
        h: &Header,
        count: u64,
        f: &mut dyn FnMut(u64, u64, &mut Counter),
    ) -> Result<()> {
        let rt_len = u64::from(h.refcount_table_clusters) * self.cs;
        let table = self.read(h.refcount_table_offset, rt_len)?;
        let epb = refcount::entries_per_block(self.cs, h.refcount_order);
        let mut cluster = 0u64;
        for raw in words(&table) {
            let first = cluster;
            let usable = raw != 0
                && raw % self.cs == 0
                && raw
                    .checked_add(self.cs)
                    .is_some_and(|end| end <= self.layer.file_len());
            if !usable && first >= count {
                break;
            }
            let block = if usable {
                Some(self.read(raw, self.cs)?)
            } else {
                None
            };
            for i in 0..epb {
                let have = block
                    .as_ref()
                    .map_or(0, |b| refcount::get(b, i, h.refcount_order));
                if first + i >= count && have == 0 {
                    continue;
                }
                f(first + i, have, self);
            }
            cluster += epb;
        }
        while cluster < count {
            f(cluster, 0, self);
            cluster += 1;
        }
        Ok(())
    }
}

fn words(buf: &[u8]) -> impl Iterator<Item = u64> + '_ {
    buf.chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap_or([0; 8])))
}
