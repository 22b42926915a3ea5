//! The metadata database's scans: a page of names for a List, a group's
//! records for repair, a group's rows for a handover, and a page of the
//! whole database for a restore. Each reads through group commit's open
//! transaction when there is one ([`reading!`]), as every read does.

use super::{group_end, key, MetaDb, RECORDS, TOMBS};
use redb::ReadableTable;
use strata_store_protocol::error::{DatabaseResult, Error};
use strata_store_protocol::wire::{decode_record, GatherCursor, ListEntry, Record, Row};

impl MetaDb {
    /// Up to `limit` entries of groups `mgs` whose names start with `prefix`
    /// and sort after `after`, in name order; and whether more remain.
    pub fn list(
        &self,
        mgs: &[u32],
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<(Vec<ListEntry>, bool), Error> {
        let what = || {
            self.at(format_args!(
                "listing the names under {prefix:?} after {after:?}"
            ))
        };
        reading!(self, what, |tx| {
            let t = tx.open_table(RECORDS).database(what)?;
            let mut out: Vec<ListEntry> = Vec::new();
            let mut more = false;
            for &mg in mgs {
                let start = if after >= prefix {
                    let mut k = key(mg, after);
                    k.push(0);
                    k
                } else {
                    key(mg, prefix)
                };
                let end = (mg as u64 + 1).to_be_bytes();
                let end_key: Vec<u8> = if mg == u32::MAX {
                    vec![0xff; 5]
                } else {
                    end[4..].to_vec()
                };
                let mut taken = 0;
                for row in t
                    .range(start.as_slice()..end_key.as_slice())
                    .database(what)?
                {
                    let (k, v) = row.database(what)?;
                    let name_bytes = &k.value()[4..];
                    if !name_bytes.starts_with(prefix.as_bytes()) {
                        break;
                    }
                    if taken == limit {
                        more = true;
                        break;
                    }
                    if let Ok(r) = decode_record(v.value()) {
                        out.push(ListEntry {
                            name: r.name,
                            size: r.size,
                            version: r.version,
                            crc: r.crc,
                            attributes: r.attributes,
                        });
                        taken += 1;
                    }
                }
            }
            out.sort_by(|a, b| a.name.cmp(&b.name));
            out.dedup_by(|a, b| a.name == b.name);
            if out.len() > limit {
                out.truncate(limit);
                more = true;
            }
            Ok((out, more))
        })
    }

    /// Up to `limit` records of group `mg` whose names sort after `after`
    /// (from the group's first when `None`), in name order. Repair walks a
    /// node's records with it, a batch at a time.
    pub fn records_after(
        &self,
        mg: u32,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        let what = || {
            self.at(format_args!(
                "reading the records of group {mg} after {after:?}"
            ))
        };
        reading!(self, what, |tx| {
            let t = tx.open_table(RECORDS).database(what)?;
            let start = match after {
                Some(name) => {
                    let mut k = key(mg, name);
                    k.push(0);
                    k
                }
                None => key(mg, ""),
            };
            let end: Vec<u8> = match mg.checked_add(1) {
                Some(next) => next.to_be_bytes().to_vec(),
                None => vec![0xff; 5],
            };
            let mut out = Vec::new();
            for row in t.range(start.as_slice()..end.as_slice()).database(what)? {
                if out.len() >= limit {
                    break;
                }
                let (k, v) = row.database(what)?;
                // A row that does not decode was refused when written; skip it
                // rather than stop repair for every other object.
                if let Ok(r) = self.decode_row(k.value(), v.value()) {
                    out.push(r);
                }
            }
            Ok(out)
        })
    }

    /// One page of group `mg`'s records (or tombstones, with `tombs`) whose
    /// names sort after `after` ("" from the first), in name order: at most
    /// `max_rows` rows and about `max_bytes` encoded bytes (a handover copies
    /// a group a datagram at a time). The flag says whether more follow.
    pub fn group_rows(
        &self,
        mg: u32,
        tombs: bool,
        after: &str,
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<(Vec<Row>, bool), Error> {
        let what = || {
            self.at(format_args!(
                "reading the {} of group {mg} after {after:?}",
                if tombs { "tombstones" } else { "records" }
            ))
        };
        reading!(self, what, |tx| {
            let mut start = key(mg, after);
            if !after.is_empty() {
                start.push(0);
            }
            let end = group_end(mg);
            let mut rows = Vec::new();
            let mut bytes = 0;
            // A page holds at least one row, so a copy always progresses.
            let mut full = |rows: &Vec<Row>, size: usize| {
                bytes += size;
                !rows.is_empty() && (rows.len() >= max_rows || bytes > max_bytes)
            };
            if tombs {
                let t = tx.open_table(TOMBS).database(what)?;
                for row in t.range(start.as_slice()..end.as_slice()).database(what)? {
                    let (k, v) = row.database(what)?;
                    let Ok(name) = std::str::from_utf8(&k.value()[4..]) else {
                        continue;
                    };
                    if full(&rows, name.len() + 11) {
                        return Ok((rows, true));
                    }
                    rows.push(Row::Tomb {
                        name: name.to_string(),
                        version: v.value(),
                    });
                }
            } else {
                let t = tx.open_table(RECORDS).database(what)?;
                for row in t.range(start.as_slice()..end.as_slice()).database(what)? {
                    let (k, v) = row.database(what)?;
                    if full(&rows, v.value().len() + 1) {
                        return Ok((rows, true));
                    }
                    // Rows that do not decode were refused when written.
                    if let Ok(r) = self.decode_row(k.value(), v.value()) {
                        rows.push(Row::Record(r));
                    }
                }
            }
            Ok((rows, false))
        })
    }

    /// One page of a scan of the whole database (every group, records
    /// then tombstones) from `from`, keeping the rows whose name `wanted`
    /// accepts: at most `max_rows` rows and about `max_bytes` bytes, and at
    /// most `max_scan` rows looked at, so one page never takes long. The
    /// second value is where the next page starts (`None`: done).
    pub fn gather(
        &self,
        from: &GatherCursor,
        wanted: impl Fn(&str) -> bool,
        max_rows: usize,
        max_bytes: usize,
        max_scan: usize,
    ) -> Result<(Vec<Row>, Option<GatherCursor>), Error> {
        let what = || {
            self.at(format_args!(
                "gathering rows from group {} after {:?}",
                from.group, from.after
            ))
        };
        reading!(self, what, |tx| {
            let mut start = key(from.group, &from.after);
            if !from.after.is_empty() {
                start.push(0);
            }
            let mut rows = Vec::new();
            let mut bytes = 0;
            let mut scanned = 0;
            // Where a page cut short resumes: after the last key looked at.
            let cursor = |tombs: bool, k: &[u8]| {
                let group = k
                    .get(..4)
                    .and_then(|b| <[u8; 4]>::try_from(b).ok())
                    .map_or(0, u32::from_be_bytes);
                let after = k
                    .get(4..)
                    .and_then(|n| std::str::from_utf8(n).ok())
                    .unwrap_or("")
                    .to_string();
                GatherCursor {
                    tombs,
                    group,
                    after,
                }
            };
            if !from.tombs {
                let t = tx.open_table(RECORDS).database(what)?;
                let mut last: Option<Vec<u8>> = None;
                for row in t.range(start.as_slice()..).database(what)? {
                    let (k, v) = row.database(what)?;
                    // The page ends before a row that would take it past
                    // `max_bytes` (a record with a long name, rename link and
                    // attributes is over 10 KiB), but holds at least one.
                    let over = !rows.is_empty() && bytes + v.value().len() + 1 > max_bytes;
                    if scanned >= max_scan || rows.len() >= max_rows || over {
                        if let Some(l) = &last {
                            return Ok((rows, Some(cursor(false, l))));
                        }
                    }
                    scanned += 1;
                    last = Some(k.value().to_vec());
                    let Some(name) = k.value().get(4..).and_then(|n| std::str::from_utf8(n).ok())
                    else {
                        continue;
                    };
                    if !wanted(name) {
                        continue;
                    }
                    // Rows that do not decode were refused when written.
                    if let Ok(r) = self.decode_row(k.value(), v.value()) {
                        bytes += v.value().len() + 1;
                        rows.push(Row::Record(r));
                    }
                }
                // Records are done: tombstones next, from the start.
                start = Vec::new();
            }
            let t = tx.open_table(TOMBS).database(what)?;
            let mut last: Option<Vec<u8>> = None;
            for row in t.range(start.as_slice()..).database(what)? {
                let (k, v) = row.database(what)?;
                if scanned >= max_scan || rows.len() >= max_rows || bytes > max_bytes {
                    let l = last.clone().unwrap_or_default();
                    // A page cut before any tombstone resumes at their start.
                    let mut c = cursor(true, &l);
                    if l.is_empty() {
                        c = GatherCursor {
                            tombs: true,
                            ..GatherCursor::default()
                        };
                    }
                    return Ok((rows, Some(c)));
                }
                scanned += 1;
                last = Some(k.value().to_vec());
                let Some(name) = k.value().get(4..).and_then(|n| std::str::from_utf8(n).ok())
                else {
                    continue;
                };
                if wanted(name) {
                    bytes += name.len() + 11;
                    rows.push(Row::Tomb {
                        name: name.to_string(),
                        version: v.value(),
                    });
                }
            }
            Ok((rows, None))
        })
    }
}
