//! The parts of bodies shared by several kinds, each written and read
//! in one place: records (also the metadata database's value format),
//! handover rows, gather cursors, tickets, address lists, counts and
//! flags. Every count is checked against its bound before anything is
//! allocated.

use super::body::{
    Fragments, GatherCursor, Record, RenameLink, Row, MAX_ATTRIBUTES, MAX_DATA_REPLICAS,
    MAX_INLINE, MAX_OBJECT, MAX_PULL_ROWS, MAX_REFERENCED, MAX_TICKET,
};
use crate::addr::{Addr, MAX_META_REPLICAS};
use crate::codec::{Reader, WireError, Writer, MAX_NAME};

pub(super) fn put_record(w: &mut Writer, r: &Record) {
    w.str(&r.name);
    w.u64(r.size);
    w.u32(r.crc);
    w.u64(r.version);
    w.addrs(&r.meta);
    w.addrs(&r.replicas);
    match &r.rename {
        None => w.u8(0),
        Some(RenameLink::To(n)) => {
            w.u8(1);
            w.str(n);
        }
        Some(RenameLink::From(n)) => {
            w.u8(2);
            w.str(n);
        }
    }
    w.bytes16(&r.attributes);
    put_fragments(w, r.fragments.as_ref());
    match &r.inline {
        None => w.u8(0),
        Some(data) => {
            w.u8(1);
            w.bytes16(data);
        }
    }
}

/// Reads what [`put_record`] wrote after the fragments: an inline
/// object's bytes, checked against `record` before they are kept. At
/// most [`MAX_INLINE`] bytes (refused before anything is allocated),
/// exactly the record's size, matching its CRC-32C, and only in a record
/// with no replica or fragment (its bytes are nowhere else).
pub(super) fn get_inline(r: &mut Reader, record: &Record) -> Result<Option<Vec<u8>>, WireError> {
    if !flag(r, "inline data flag")? {
        return Ok(None);
    }
    let name = &record.name;
    let data = r.bytes16()?;
    if data.len() > MAX_INLINE {
        return Err(WireError::Invalid(format!(
            "the record of {name:?} holds {} inline bytes; the limit is {MAX_INLINE}",
            data.len()
        )));
    }
    if data.len() as u64 != record.size {
        return Err(WireError::Invalid(format!(
            "the record of {name:?} holds {} inline bytes for an object of {} bytes",
            data.len(),
            record.size
        )));
    }
    if !record.replicas.is_empty() || record.fragments.is_some() {
        return Err(WireError::Invalid(format!(
            "the record of {name:?} holds inline bytes and also names {} replicas",
            record.replicas.len()
        )));
    }
    check_inline_crc(name, data, record.crc)?;
    Ok(Some(data.to_vec()))
}

/// Checks inline bytes of object `name` against their CRC-32C `crc`.
pub(super) fn check_inline_crc(name: &str, data: &[u8], crc: u32) -> Result<(), WireError> {
    let actual = crc32c::crc32c(data);
    if actual != crc {
        return Err(WireError::Invalid(format!(
            "the inline bytes of {name:?} have CRC-32C {actual:08x}, not the {crc:08x} \
             given with them: they were damaged"
        )));
    }
    Ok(())
}

/// An erasure-coded record's fragments: the data count (0 for a
/// replicated record, and nothing more), then each fragment's CRC-32C.
fn put_fragments(w: &mut Writer, fragments: Option<&Fragments>) {
    match fragments {
        None => w.u8(0),
        Some(f) => {
            w.u8(f.data);
            w.u8(f.crcs.len() as u8);
            for &crc in &f.crcs {
                w.u32(crc);
            }
        }
    }
}

/// Reads what [`put_fragments`] wrote for a record with `replicas`
/// replica addresses: an erasure-coded record has one fragment per
/// address, at least one of parity, and at most [`MAX_DATA_REPLICAS`].
fn get_fragments(r: &mut Reader, replicas: usize) -> Result<Option<Fragments>, WireError> {
    let data = r.u8()?;
    if data == 0 {
        return Ok(None);
    }
    let count = r.u8()? as usize;
    if count > MAX_DATA_REPLICAS || count != replicas || count <= data as usize {
        return Err(WireError::Invalid(format!(
            "an erasure-coded record of {data} data fragments lists {count} fragment \
             checksums for {replicas} fragment addresses (they must be equal, above \
             {data} and at most {MAX_DATA_REPLICAS})"
        )));
    }
    let crcs = (0..count).map(|_| r.u32()).collect::<Result<_, _>>()?;
    Ok(Some(Fragments { data, crcs }))
}

pub(super) fn get_record(r: &mut Reader) -> Result<Record, WireError> {
    let mut record = get_record_fields(r)?;
    record.attributes = get_attributes(r)?;
    record.fragments = get_fragments(r, record.replicas.len())?;
    record.inline = get_inline(r, &record)?;
    Ok(record)
}

/// A record's attributes: at most [`MAX_ATTRIBUTES`] bytes, refused
/// before anything is allocated if longer.
pub(super) fn get_attributes(r: &mut Reader) -> Result<Vec<u8>, WireError> {
    let bytes = r.bytes16()?;
    if bytes.len() > MAX_ATTRIBUTES {
        return Err(WireError::Invalid(format!(
            "attributes of {} bytes; the limit is {MAX_ATTRIBUTES}",
            bytes.len()
        )));
    }
    Ok(bytes.to_vec())
}

/// A record's fields before its attributes (the whole record as rows
/// written before attributes existed hold it), with empty attributes.
fn get_record_fields(r: &mut Reader) -> Result<Record, WireError> {
    let name = r.name()?;
    let size = r.u64()?;
    if size > MAX_OBJECT {
        return Err(WireError::Invalid(format!(
            "object size {size} exceeds the {MAX_OBJECT}-byte limit"
        )));
    }
    Ok(Record {
        name,
        size,
        crc: r.u32()?,
        version: r.u64()?,
        meta: r.addrs(MAX_META_REPLICAS, "metadata addresses")?,
        replicas: r.addrs(MAX_DATA_REPLICAS, "replicas")?,
        rename: match r.u8()? {
            0 => None,
            1 => Some(RenameLink::To(r.name()?)),
            2 => Some(RenameLink::From(r.name()?)),
            k => return Err(WireError::Invalid(format!("rename link kind {k}"))),
        },
        attributes: Vec::new(),
        fragments: None,
        inline: None,
    })
}

/// A ticket's bytes, at most [`MAX_TICKET`] (checked by the storage node
/// that takes it, not here).
pub(super) fn get_ticket(r: &mut Reader) -> Result<Vec<u8>, WireError> {
    let b = r.bytes16()?;
    if b.len() > MAX_TICKET {
        return Err(WireError::Invalid(format!(
            "ticket of {} bytes; the limit is {MAX_TICKET}",
            b.len()
        )));
    }
    Ok(b.to_vec())
}

/// A u16-counted list of addresses, at most [`MAX_REFERENCED`].
pub(super) fn get_addr_list(r: &mut Reader) -> Result<Vec<Addr>, WireError> {
    get_bounded_addrs(r, MAX_REFERENCED, "addresses in one message")
}

/// A u16-counted list of at most `max` addresses (`what` names them in
/// the error), refused before anything is allocated if the count is
/// larger.
pub(super) fn get_bounded_addrs(
    r: &mut Reader,
    max: usize,
    what: &str,
) -> Result<Vec<Addr>, WireError> {
    let n = r.u16()? as usize;
    if n > max {
        return Err(WireError::Invalid(format!(
            "{n} {what}; the limit is {max}"
        )));
    }
    (0..n).map(|_| r.addr()).collect()
}

/// Encodes a record alone (the metadata database's value format).
pub fn encode_record(rec: &Record) -> Vec<u8> {
    let mut w = Writer::default();
    put_record(&mut w, rec);
    w.buf
}

/// Decodes a record encoded by [`encode_record`], or by a build before
/// records had attributes, fragments or inline bytes: those end before
/// the attributes' length, the fragments' or the inline flag, and decode
/// with none (a metadata database keeps its old rows). Inline bytes are
/// checked as on the wire ([`get_inline`]).
pub fn decode_record(buf: &[u8]) -> Result<Record, WireError> {
    let mut r = Reader::new(buf);
    let mut rec = get_record_fields(&mut r)?;
    if r.remaining() > 0 {
        rec.attributes = get_attributes(&mut r)?;
    }
    if r.remaining() > 0 {
        rec.fragments = get_fragments(&mut r, rec.replicas.len())?;
    }
    if r.remaining() > 0 {
        rec.inline = get_inline(&mut r, &rec)?;
    }
    r.finish()?;
    Ok(rec)
}

/// Writes at most [`MAX_PULL_ROWS`] rows (the sender keeps pages smaller).
pub(super) fn put_rows(w: &mut Writer, rows: &[Row]) {
    let n = rows.len().min(MAX_PULL_ROWS);
    w.u16(n as u16);
    for row in &rows[..n] {
        match row {
            Row::Record(r) => {
                w.u8(0);
                put_record(w, r);
            }
            Row::Tomb { name, version } => {
                w.u8(1);
                w.str(name);
                w.u64(*version);
            }
        }
    }
}

/// Reads a page of rows; a count above [`MAX_PULL_ROWS`] is refused before
/// anything is allocated.
pub(super) fn get_rows(r: &mut Reader) -> Result<Vec<Row>, WireError> {
    let n = r.u16()? as usize;
    if n > MAX_PULL_ROWS {
        return Err(WireError::Invalid(format!(
            "{n} rows in one page; the limit is {MAX_PULL_ROWS}"
        )));
    }
    let mut rows = Vec::with_capacity(n);
    for _ in 0..n {
        rows.push(match r.u8()? {
            0 => Row::Record(get_record(r)?),
            1 => Row::Tomb {
                name: r.name()?,
                version: r.u64()?,
            },
            k => return Err(WireError::Invalid(format!("row kind {k}"))),
        });
    }
    Ok(rows)
}

pub(super) fn put_cursor(w: &mut Writer, c: &GatherCursor) {
    w.u8(c.tombs as u8);
    w.u32(c.group);
    w.str(&c.after);
}

pub(super) fn get_cursor(r: &mut Reader) -> Result<GatherCursor, WireError> {
    Ok(GatherCursor {
        tombs: flag(r, "gather tombstone flag")?,
        group: r.u32()?,
        after: r.str(MAX_NAME, "gather cursor")?,
    })
}

/// The count of an anti-entropy list, refused above `max` before
/// anything is allocated.
pub(super) fn sync_count(r: &mut Reader, max: usize, what: &str) -> Result<usize, WireError> {
    let n = r.u16()? as usize;
    if n > max {
        return Err(WireError::Invalid(format!(
            "{n} sync {what} in one message; the limit is {max}"
        )));
    }
    Ok(n)
}

/// A boolean byte: 0 or 1, anything else refused.
pub(super) fn flag(r: &mut Reader, what: &str) -> Result<bool, WireError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(WireError::Invalid(format!("{what} is {v}, not 0 or 1"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(attributes: Vec<u8>) -> Record {
        Record {
            name: "acme/photo.jpg".into(),
            size: 42,
            crc: 0x1234_5678,
            version: 3,
            meta: vec![1, 2],
            replicas: vec![9],
            rename: Some(RenameLink::From("acme/old.jpg".into())),
            attributes,
            fragments: None,
            inline: None,
        }
    }

    /// A record holding `data` inline.
    fn inline_record(data: &[u8]) -> Record {
        Record {
            size: data.len() as u64,
            crc: crc32c::crc32c(data),
            replicas: Vec::new(),
            inline: Some(data.to_vec()),
            ..record(b"{}".to_vec())
        }
    }

    #[test]
    fn inline_bytes_round_trip_and_a_row_without_them_decodes_with_none() {
        let full = inline_record(&[0xab; MAX_INLINE]);
        assert_eq!(decode_record(&encode_record(&full)).unwrap(), full);
        let tiny = inline_record(b"x");
        assert_eq!(decode_record(&encode_record(&tiny)).unwrap(), tiny);
        // A row of the build before inline bytes ends after its fragments.
        let mut older = encode_record(&record(Vec::new()));
        assert_eq!(older.pop(), Some(0));
        assert_eq!(decode_record(&older).unwrap(), record(Vec::new()));
    }

    #[test]
    fn inline_bytes_over_the_limit_damaged_or_beside_replicas_are_refused() {
        let refused = |record: &Record| decode_record(&encode_record(record)).unwrap_err();
        // One byte over the limit, refused before the bytes are read.
        let error = refused(&inline_record(&[1; MAX_INLINE + 1])).to_string();
        assert!(
            error.contains("4097 inline bytes; the limit is 4096"),
            "{error}"
        );
        // A flipped bit in the bytes: the CRC-32C no longer matches.
        let mut bytes = encode_record(&inline_record(b"hello, inline"));
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let error = decode_record(&bytes).unwrap_err().to_string();
        assert!(
            error.contains("CRC-32C") && error.contains("damaged"),
            "{error}"
        );
        // A size that is not the bytes', and bytes beside replicas.
        let mut wrong_size = inline_record(b"abc");
        wrong_size.size = 4;
        assert!(refused(&wrong_size)
            .to_string()
            .contains("object of 4 bytes"));
        let mut beside = inline_record(b"abc");
        beside.replicas = vec![9];
        assert!(refused(&beside)
            .to_string()
            .contains("also names 1 replicas"));
        // An inline flag other than 0 or 1.
        let mut bytes = encode_record(&record(Vec::new()));
        let last = bytes.len() - 1;
        bytes[last] = 2;
        let error = decode_record(&bytes).unwrap_err().to_string();
        assert!(error.contains("inline data flag"), "{error}");
    }

    #[test]
    fn a_row_written_before_attributes_decodes_with_none() {
        // The layout of a record before attributes existed, written field
        // by field: it ends after the rename link.
        let mut w = Writer::default();
        w.str("acme/photo.jpg");
        w.u64(42);
        w.u32(0x1234_5678);
        w.u64(3);
        w.addrs(&[1, 2]);
        w.addrs(&[9]);
        w.u8(2);
        w.str("acme/old.jpg");
        assert_eq!(decode_record(&w.buf).unwrap(), record(Vec::new()));
    }

    #[test]
    fn attributes_survive_a_round_trip_and_oversized_ones_are_refused() {
        let full = record(vec![7; MAX_ATTRIBUTES]);
        assert_eq!(decode_record(&encode_record(&full)).unwrap(), full);
        let mut bytes = encode_record(&record(Vec::new()));
        // Replace the empty attributes (and no fragments nor inline
        // bytes) with one byte too many.
        bytes.truncate(bytes.len() - 4);
        let mut w = Writer::default();
        w.bytes16(&vec![0; MAX_ATTRIBUTES + 1]);
        bytes.extend_from_slice(&w.buf);
        let error = decode_record(&bytes).unwrap_err().to_string();
        assert!(error.contains("2049") && error.contains("limit"), "{error}");
    }

    #[test]
    fn fragments_round_trip_and_must_match_the_addresses() {
        let mut coded = record(Vec::new());
        coded.replicas = vec![1, 2, 3];
        coded.fragments = Some(Fragments {
            data: 2,
            crcs: vec![10, 11, 12],
        });
        assert_eq!(decode_record(&encode_record(&coded)).unwrap(), coded);
        for (data, crcs) in [(2, vec![10, 11]), (3, vec![1, 2, 3]), (2, vec![1, 2, 3, 4])] {
            coded.fragments = Some(Fragments { data, crcs });
            let error = decode_record(&encode_record(&coded))
                .unwrap_err()
                .to_string();
            assert!(error.contains("fragment"), "{error}");
        }
    }
}
