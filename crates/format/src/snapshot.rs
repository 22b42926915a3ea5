//! The internal snapshot table.

use crate::error::{FormatError, Reader};

/// Largest extra-data section QEMU accepts in a snapshot table entry.
const MAX_EXTRA_DATA: u32 = 1024;

/// One internal snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// Offset of the snapshot's L1 table.
    pub l1_table_offset: u64,
    /// Entries in that L1 table.
    pub l1_size: u32,
    /// Unique ID string.
    pub id: String,
    /// Name.
    pub name: String,
    /// Creation time, seconds since the epoch.
    pub date_sec: u32,
    /// Guest clock at creation, nanoseconds.
    pub vm_clock_nsec: u64,
    /// VM state size in bytes.
    pub vm_state_size: u64,
    /// Virtual disk size when the snapshot was taken, if recorded.
    pub disk_size: Option<u64>,
}

/// Parses `count` snapshot table entries from `buf`. Returns the entries and
/// the table's length in bytes.
pub fn parse_table(buf: &[u8], count: u32) -> Result<(Vec<SnapshotEntry>, u64), FormatError> {
    let r = Reader::new(buf, "snapshot table");
    let mut at = 0usize;
    // Each entry takes at least 40 bytes, so `count` is bounded by the buffer.
    let mut out = Vec::with_capacity((count as usize).min(buf.len() / 40));
    for _ in 0..count {
        let l1_table_offset = r.u64(at)?;
        let l1_size = r.u32(at + 8)?;
        let id_len = r.u16(at + 12)? as usize;
        let name_len = r.u16(at + 14)? as usize;
        let date_sec = r.u32(at + 16)?;
        let vm_clock_nsec = r.u64(at + 24)?;
        let vm_state_small = r.u32(at + 32)?;
        let extra_len = r.u32(at + 36)?;
        if extra_len > MAX_EXTRA_DATA {
            return Err(FormatError::invalid(
                "snapshot extra data",
                format!("{extra_len} bytes (at most {MAX_EXTRA_DATA})"),
            ));
        }
        let extra_at = at + 40;
        let extra = r.bytes(extra_at, extra_len as usize)?;
        let er = Reader::new(extra, "snapshot extra data");
        let vm_state_size = er.u64(0).unwrap_or(u64::from(vm_state_small));
        let disk_size = er.u64(8).ok();
        let id_at = extra_at + extra_len as usize;
        let id = String::from_utf8_lossy(r.bytes(id_at, id_len)?).into_owned();
        let name = String::from_utf8_lossy(r.bytes(id_at + id_len, name_len)?).into_owned();
        out.push(SnapshotEntry {
            l1_table_offset,
            l1_size,
            id,
            name,
            date_sec,
            vm_clock_nsec,
            vm_state_size,
            disk_size,
        });
        at = (id_at + id_len + name_len).div_ceil(8) * 8;
    }
    Ok((out, at as u64))
}
