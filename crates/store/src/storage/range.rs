//! Serving a ranged read ([`Request::GetRange`]): the chunks of a
//! replica file covering the range asked, sent with `sendfile` after the
//! CRC-32C of each from the file's chunk table
//! ([`crate::storage::file`]), so a node reads only what the range
//! needs; the client checks each chunk and keeps the bytes asked. A
//! replica of layout 1 has no table: the reply says so, and the client
//! reads it whole.
//!
//! [`Request::GetRange`]: strata_store_protocol::data::Request::GetRange

use crate::storage::file::{file_name, Header, CHUNK_SIZE, FILE_HEADER, VERSION_CHUNKED};
use crate::storage::reader::{
    open_checked, reply_err, send_body, Opening, ReadStats, ReplicaDir, Route,
};
use crate::storage::scheduled::{Body, ScheduledSender};
use crate::storage::sendfile::set_cork;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;
use strata_store_client::range_body::{REPLY_CHUNKED, REPLY_WHOLE};
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::data::Authority;
use strata_store_protocol::range::{check_range, ChunkSpan};
use strata_store_protocol::Error;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;

/// How a read's body goes out: through the node's RS3 sender
/// (`schedule`), as the tenant's (a node's own reads as tenant ""), when
/// the node runs one and it is on.
pub(super) fn read_route<'a>(
    schedule: Option<&'a ScheduledSender>,
    authority: &'a Authority,
) -> Route<'a> {
    let tenant = match authority {
        Authority::Tenant { tenant, .. } => tenant.as_str(),
        Authority::Node => "",
    };
    match schedule {
        Some(sender) if sender.enabled() => Route::Scheduled(sender, tenant),
        _ => Route::Direct,
    }
}

/// What opening a replica for a range found.
enum RangeOpened {
    Missing,
    Damaged,
    /// The range does not fit the replica: the reason.
    Refused(String),
    /// A layout 1 replica: no chunk table.
    Whole,
    /// The chunks to send and their CRCs (big-endian, 4 bytes each).
    Chunked {
        header: Header,
        file: std::fs::File,
        span: ChunkSpan,
        crcs: Vec<u8>,
    },
}

/// Opens the replica at `path` for `length` bytes from `offset` and
/// reads the CRCs of the chunks covering them (blocking).
fn open_range(path: &Path, addr: Addr, offset: u64, length: u64) -> RangeOpened {
    let (file, header) = match open_checked(path) {
        Opening::NotOpened(_) => return RangeOpened::Missing,
        Opening::Damaged { .. } => return RangeOpened::Damaged,
        Opening::Whole { file, header } => (file, header),
    };
    if let Err(why) = check_range(offset, length, header.size) {
        return RangeOpened::Refused(format!("replica {}: {why}", fmt_addr(addr)));
    }
    let Some(table) = header.table_offset() else {
        return RangeOpened::Whole;
    };
    let span = ChunkSpan::covering(offset, length, header.size, CHUNK_SIZE);
    // Bounded: a range is at most MAX_RANGE bytes, so 4 bytes for each
    // of at most MAX_RANGE / CHUNK_SIZE + 1 chunks.
    let mut crcs = vec![0u8; span.count as usize * 4];
    if file
        .read_exact_at(&mut crcs, table + span.first * 4)
        .is_err()
    {
        return RangeOpened::Damaged;
    }
    RangeOpened::Chunked {
        header,
        file,
        span,
        crcs,
    }
}

/// Serves `length` bytes from `offset` of the replica `addr` stored in
/// `dir` (see the module documentation for the reply). A range outside
/// the replica is refused with the reason; the connection goes on.
pub(super) async fn get_range(
    mut w: BufWriter<OwnedWriteHalf>,
    dir: &ReplicaDir,
    (addr, offset, length): (Addr, u64, u64),
    stall: Duration,
    route: Route<'_>,
    stats: &ReadStats,
) -> Result<BufWriter<OwnedWriteHalf>, Error> {
    let path = dir.path.join(file_name(addr));
    let opened = tokio::task::spawn_blocking(move || open_range(&path, addr, offset, length))
        .await
        .map_err(|e| Error::Task {
            context: format!("reading a range of the replica {}", fmt_addr(addr)),
            source: Some(Box::new(e)),
        })?;
    let io = |e| Error::io("sending a range of a replica", e);
    let (header, file, span, crcs) = match opened {
        RangeOpened::Missing => {
            reply_err(&mut w, &format!("no replica at {}", fmt_addr(addr))).await?;
            return Ok(w);
        }
        RangeOpened::Damaged => {
            let why = format!(
                "replica {} is damaged (bad header, length or chunk table); it must be \
                 repaired from another copy",
                fmt_addr(addr)
            );
            reply_err(&mut w, &why).await?;
            return Ok(w);
        }
        RangeOpened::Refused(why) => {
            reply_err(&mut w, &why).await?;
            return Ok(w);
        }
        RangeOpened::Whole => {
            w.write_all(&[0, REPLY_WHOLE]).await.map_err(io)?;
            w.flush().await.map_err(io)?;
            return Ok(w);
        }
        RangeOpened::Chunked {
            header,
            file,
            span,
            crcs,
        } => (header, file, span, crcs),
    };
    debug_assert_eq!(header.version, VERSION_CHUNKED);
    w.write_all(&[0, REPLY_CHUNKED]).await.map_err(io)?;
    w.write_all(&header.size.to_be_bytes()).await.map_err(io)?;
    w.write_all(&(CHUNK_SIZE as u32).to_be_bytes())
        .await
        .map_err(io)?;
    w.write_all(&span.start.to_be_bytes()).await.map_err(io)?;
    w.write_all(&span.len.to_be_bytes()).await.map_err(io)?;
    w.write_all(&crcs).await.map_err(io)?;
    let body = Body::File {
        file,
        offset: FILE_HEADER as u64 + span.start,
        length: span.len,
    };
    let (mut w, sent, corked) = send_body(w, body, span.len, route, stall, addr).await?;
    stats.bytes_sent.fetch_add(sent, Ordering::Relaxed);
    stats.ranges.fetch_add(1, Ordering::Relaxed);
    // The chunks' CRCs are checked by the client; this flag says only
    // whether every byte was there.
    let whole = sent == span.len;
    w.write_all(&[u8::from(!whole)]).await.map_err(io)?;
    w.flush().await.map_err(io)?;
    if corked {
        set_cork(w.get_ref().as_ref(), false);
    }
    if !whole {
        tracing::warn!(
            "replica {} was cut short while a range of it was sent",
            fmt_addr(addr)
        );
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::file::{header, ChunkTable, CHECKSUM_OFFSET, VERSION_WHOLE};
    use proptest::prelude::*;
    use strata_store_client::range_body::{read_range_body, Asked, RangeAnswer};
    use strata_store_protocol::range::MAX_RANGE;

    /// A replica file of `data` in layout 2 (or 1 with `whole`); its path.
    fn replica(dir: &Path, data: &[u8], whole: bool) -> std::path::PathBuf {
        let mut bytes = header(data.len() as u64).to_vec();
        let at = CHECKSUM_OFFSET as usize;
        bytes[at..at + 4].copy_from_slice(&crc32c::crc32c(data).to_be_bytes());
        bytes.extend_from_slice(data);
        if whole {
            bytes[4] = VERSION_WHOLE;
        } else {
            let mut table = ChunkTable::default();
            table.push(data);
            bytes.extend_from_slice(&table.finish());
        }
        let path = dir.join(format!("r{}-{whole}", data.len()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// The reply `get_range` writes for what `open_range` found, built
    /// in memory: layout, size, chunk size, span, CRCs, chunks, trailer.
    fn reply(opened: RangeOpened) -> Vec<u8> {
        let RangeOpened::Chunked {
            header,
            file,
            span,
            crcs,
        } = opened
        else {
            panic!("not a chunked replica");
        };
        let mut out = vec![REPLY_CHUNKED];
        out.extend_from_slice(&header.size.to_be_bytes());
        out.extend_from_slice(&(CHUNK_SIZE as u32).to_be_bytes());
        out.extend_from_slice(&span.start.to_be_bytes());
        out.extend_from_slice(&span.len.to_be_bytes());
        out.extend_from_slice(&crcs);
        let mut chunks = vec![0u8; span.len as usize];
        file.read_exact_at(&mut chunks, FILE_HEADER as u64 + span.start)
            .unwrap();
        out.extend_from_slice(&chunks);
        out.push(0);
        out
    }

    /// Reads `reply` as a client asking `length` bytes from `offset` of
    /// an object of `size` bytes: what it handed on, or the error.
    fn client_reads(reply: &[u8], size: u64, offset: u64, length: u64) -> Result<Vec<u8>, Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let asked = Asked {
            replica: 7,
            size,
            offset,
            length,
        };
        let mut out = Vec::new();
        let mut handed = 0;
        let answer = rt.block_on(read_range_body(
            &mut &reply[..],
            asked,
            &mut out,
            &mut handed,
            &|_| {},
        ))?;
        assert_eq!(answer, RangeAnswer::Served);
        assert_eq!(handed, out.len() as u64);
        Ok(out)
    }

    proptest! {
        /// Random objects and ranges: the node's chunks and CRCs, read
        /// by the client, give back exactly the slice asked.
        #[test]
        fn a_range_read_back_is_the_slice(
            size in 1usize..400_000,
            a in 0usize..400_000,
            b in 0usize..400_000,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let data: Vec<u8> = (0..size).map(|i| (i * 131 % 253) as u8).collect();
            let path = replica(dir.path(), &data, false);
            let (x, y) = (a % size, b % size);
            let (offset, end) = (x.min(y), x.max(y) + 1);
            let length = (end - offset) as u64;
            let opened = open_range(&path, 7, offset as u64, length);
            let got = client_reads(&reply(opened), size as u64, offset as u64, length).unwrap();
            prop_assert!(got == data[offset..end]);
        }
    }

    #[test]
    fn a_flipped_chunk_fails_and_only_the_chunks_before_it_are_handed_on() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 249) as u8).collect();
        let path = replica(dir.path(), &data, false);
        let mut bytes = reply(open_range(&path, 7, 1000, 250_000));
        // The third chunk's first byte: after 29 bytes of head, 4 CRCs
        // and two chunks.
        bytes[29 + 16 + 2 * CHUNK_SIZE as usize] ^= 1;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (mut out, mut handed) = (Vec::new(), 0);
        let asked = Asked {
            replica: 7,
            size: 300_000,
            offset: 1000,
            length: 250_000,
        };
        let mut reply = &bytes[..];
        let read = read_range_body(&mut reply, asked, &mut out, &mut handed, &|_| {});
        let error = rt.block_on(read).unwrap_err();
        assert!(matches!(error, Error::Corrupt(_)), "{error}");
        assert!(error.to_string().contains("failed its checksum"), "{error}");
        assert_eq!(handed, 2 * CHUNK_SIZE - 1000);
        assert!(out == data[1000..2 * CHUNK_SIZE as usize]);
    }

    #[test]
    fn bad_ranges_old_layouts_and_torn_tables_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![3u8; 100_000];
        let path = replica(dir.path(), &data, false);
        for (offset, length, why) in [
            (99_999, 2, "beyond the object's 100000 bytes"),
            (0, 0, "empty range"),
            (u64::MAX, 1, "past 2^64"),
            (0, MAX_RANGE + 1, "split it"),
        ] {
            match open_range(&path, 7, offset, length) {
                RangeOpened::Refused(text) => assert!(text.contains(why), "{text}"),
                _ => panic!("[{offset}, +{length}) was not refused"),
            }
        }
        let old = replica(dir.path(), &data, true);
        assert!(matches!(open_range(&old, 7, 0, 10), RangeOpened::Whole));
        // A table cut short: the length no longer fits the header.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(matches!(open_range(&path, 7, 0, 10), RangeOpened::Damaged));
        let missing = dir.path().join("none");
        assert!(matches!(
            open_range(&missing, 7, 0, 10),
            RangeOpened::Missing
        ));
    }
}
