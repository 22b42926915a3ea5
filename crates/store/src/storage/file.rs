//! The replica file's layout and what a read of it may serve, without
//! touching a file: the I/O shell ([`crate::storage::replicas`]) and the
//! simulation hand it the bytes they read.
//!
//! A replica file is a 20-byte header (magic, version, 3 reserved bytes,
//! size, CRC-32C of the data) followed by the data and, from version 2,
//! the chunk table: the CRC-32C (u32, big-endian) of every
//! [`CHUNK_SIZE`] bytes of the data, the last chunk shorter, so a
//! ranged read checks the chunks it serves without reading the rest.
//! Version 1 files (no table) are still read: a range of one is read
//! whole and cut by the client. The checksum is
//! written last, after every data byte, and the file is synced before it
//! is renamed into place, so a file in place is whole unless the medium
//! failed. A read still checks the length, and the checksum is checked
//! on every read: by the node for a small replica, read whole, and by the
//! client for a larger one sent with `sendfile`, against the stored
//! CRC-32C the reply's trailer carries. A replica that fails either is
//! never taken for good.

use strata_store_protocol::addr::Addr;

/// The first bytes of every replica file.
pub const FILE_MAGIC: [u8; 4] = *b"S6RP";
/// Length of a replica file's header: magic, version, 3 reserved bytes,
/// size, CRC-32C.
pub const FILE_HEADER: usize = 20;
/// Where in the header the data's CRC-32C lies.
pub const CHECKSUM_OFFSET: u64 = 16;
/// The layout version this node writes: 2, with the chunk table.
const FILE_VERSION: u8 = 2;
/// The first layout, without a chunk table: still read.
pub const VERSION_WHOLE: u8 = 1;
/// The layout with a chunk table after the data.
pub const VERSION_CHUNKED: u8 = 2;

/// Bytes of data one entry of the chunk table covers. 64 KiB: a ranged
/// read serves at most one chunk more than asked at each end, so an
/// 8 MiB range (aws-cli's) reads under 2% more than it keeps, and a
/// range of a few KiB reads at most 128 KiB; the table costs 4 bytes per
/// chunk (0.006%, 64 KiB for a 1 GiB object), and one chunk is what a
/// client holds in memory while it checks it.
pub const CHUNK_SIZE: u64 = 64 * 1024;

/// Bytes of the chunk table of a replica of `size` bytes (`None` on
/// overflow, which only a damaged header can ask).
pub fn table_len(size: u64) -> Option<u64> {
    size.div_ceil(CHUNK_SIZE).checked_mul(4)
}

/// The header of a replica of `size` bytes in the layout this node
/// writes, its checksum still zero (it is written at [`CHECKSUM_OFFSET`]
/// once the data has arrived whole, after the chunk table).
pub fn header(size: u64) -> [u8; FILE_HEADER] {
    let mut header = [0u8; FILE_HEADER];
    header[..4].copy_from_slice(&FILE_MAGIC);
    header[4] = FILE_VERSION;
    header[8..16].copy_from_slice(&size.to_be_bytes());
    header
}

/// What a replica file's header says, once its length agrees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Data bytes after the header.
    pub size: u64,
    /// The CRC-32C the data had when it was written.
    pub stored_crc: u32,
    /// The layout version: [`VERSION_WHOLE`] or [`VERSION_CHUNKED`].
    pub version: u8,
}

impl Header {
    /// Where the chunk table starts in the file, if the layout has one.
    pub fn table_offset(&self) -> Option<u64> {
        (self.version == VERSION_CHUNKED).then_some(FILE_HEADER as u64 + self.size)
    }
}

/// Checks a replica file's first bytes (`start`, at most
/// [`FILE_HEADER`] of them) against its length `file_len`: `None` when the
/// file is damaged (short, wrong magic, a version this node does not
/// know, or a length other than the header and its layout say, as a
/// torn write leaves it).
pub fn check_header(start: &[u8], file_len: u64) -> Option<Header> {
    let header: &[u8; FILE_HEADER] = start.get(..FILE_HEADER)?.try_into().ok()?;
    if header[..4] != FILE_MAGIC {
        return None;
    }
    let version = header[4];
    let size = u64::from_be_bytes(header[8..16].try_into().ok()?);
    let stored_crc = u32::from_be_bytes(header[16..20].try_into().ok()?);
    let table = match version {
        VERSION_WHOLE => 0,
        VERSION_CHUNKED => table_len(size)?,
        _ => return None,
    };
    let expected = size.checked_add(FILE_HEADER as u64)?.checked_add(table)?;
    (file_len == expected).then_some(Header {
        size,
        stored_crc,
        version,
    })
}

/// The chunk table of data arriving in pieces of any size: a CRC-32C
/// per [`CHUNK_SIZE`] bytes, the last chunk shorter, and the whole
/// data's CRC-32C combined from them, so each byte is checksummed once.
#[derive(Debug, Default)]
pub struct ChunkTable {
    /// The finished chunks' CRCs, big-endian.
    table: Vec<u8>,
    /// The CRC of the chunk being filled, and its bytes so far.
    crc: u32,
    filled: u64,
    /// The CRC of the finished chunks' data.
    finished_crc: u32,
}

impl ChunkTable {
    /// Takes the next bytes of the data.
    pub fn push(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = (CHUNK_SIZE - self.filled).min(data.len() as u64) as usize;
            self.crc = crc32c::crc32c_append(self.crc, &data[..room]);
            self.filled += room as u64;
            data = &data[room..];
            if self.filled == CHUNK_SIZE {
                self.close_chunk();
            }
        }
    }

    /// The CRC-32C of every byte pushed so far.
    pub fn data_crc(&self) -> u32 {
        crc32c::crc32c_combine(self.finished_crc, self.crc, self.filled as usize)
    }

    fn close_chunk(&mut self) {
        self.finished_crc = self.data_crc();
        self.table.extend_from_slice(&self.crc.to_be_bytes());
        self.crc = 0;
        self.filled = 0;
    }

    /// The table's bytes, once every byte of the data was pushed: what
    /// follows the data in the file ([`table_len`] bytes).
    pub fn finish(mut self) -> Vec<u8> {
        if self.filled > 0 {
            self.close_chunk();
        }
        self.table
    }
}

/// Reads entry `i` of a chunk table's `bytes` (4 per entry).
pub fn table_entry(bytes: &[u8], i: usize) -> Option<u32> {
    let at = i.checked_mul(4)?;
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Whether the data a read sent may be called good: all `header.size`
/// bytes of it (`sent`) were there and their CRC-32C (`crc`) is the one
/// stored. Anything else is reported bad in the reply's trailer, so a
/// reader never takes torn or rotten bytes for the replica.
pub fn verified(header: &Header, crc: u32, sent: u64) -> bool {
    sent == header.size && crc == header.stored_crc
}

/// The file name of the replica at `addr`: 32 hex digits.
pub fn file_name(addr: Addr) -> String {
    format!("{addr:032x}")
}

/// The replica address a file name holds, if it is one
/// ([`file_name`]'s 32 hex digits); other files are not replicas.
pub fn parse_name(name: &str) -> Option<Addr> {
    if name.len() != 32 {
        return None;
    }
    u128::from_str_radix(name, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(data: &[u8]) -> Vec<u8> {
        let mut file = header(data.len() as u64).to_vec();
        file[16..20].copy_from_slice(&crc32c::crc32c(data).to_be_bytes());
        file.extend_from_slice(data);
        let mut table = ChunkTable::default();
        table.push(data);
        file.extend_from_slice(&table.finish());
        file
    }

    /// A version 1 file: header and data, no table.
    fn version_1(data: &[u8]) -> Vec<u8> {
        let mut file = header(data.len() as u64).to_vec();
        file[4] = VERSION_WHOLE;
        file[16..20].copy_from_slice(&crc32c::crc32c(data).to_be_bytes());
        file.extend_from_slice(data);
        file
    }

    #[test]
    fn the_data_crc_combined_from_the_chunks_is_the_whole_data_s() {
        for size in [0, 1, 65_535, 65_536, 65_537, 200_000] {
            let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            let mut table = ChunkTable::default();
            for piece in data.chunks(10_000) {
                table.push(piece);
            }
            assert_eq!(table.data_crc(), crc32c::crc32c(&data), "{size} bytes");
        }
    }

    #[test]
    fn both_layouts_are_read_and_others_are_damaged() {
        let data = vec![7u8; 200_000];
        let v2 = whole(&data);
        assert_eq!(v2.len(), FILE_HEADER + 200_000 + 4 * 4);
        let h = check_header(&v2, v2.len() as u64).expect("a version 2 file");
        assert_eq!((h.version, h.table_offset()), (2, Some(200_020)));
        let v1 = version_1(&data);
        let h = check_header(&v1, v1.len() as u64).expect("a version 1 file");
        assert_eq!((h.version, h.table_offset()), (1, None));
        // A version 2 header on a file without its table is torn, and a
        // version 1 header on one with a table is too long.
        assert_eq!(check_header(&v2, v1.len() as u64), None);
        assert_eq!(check_header(&v1, v2.len() as u64), None);
        let mut v3 = v2.clone();
        v3[4] = 3;
        assert_eq!(check_header(&v3, v3.len() as u64), None);
    }

    proptest::proptest! {
        /// Whatever the pieces the data arrives in, the table holds the
        /// CRC of each chunk, the last one shorter.
        #[test]
        fn the_table_is_the_crc_of_each_chunk(
            size in 0usize..300_000,
            cuts in proptest::collection::vec(1usize..100_000, 0..8),
        ) {
            let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
            let mut table = ChunkTable::default();
            let mut rest = &data[..];
            for cut in cuts {
                let n = cut.min(rest.len());
                table.push(&rest[..n]);
                rest = &rest[n..];
            }
            table.push(rest);
            let table = table.finish();
            proptest::prop_assert_eq!(table.len() as u64, table_len(size as u64).unwrap());
            for (i, chunk) in data.chunks(CHUNK_SIZE as usize).enumerate() {
                proptest::prop_assert_eq!(table_entry(&table, i), Some(crc32c::crc32c(chunk)));
            }
            proptest::prop_assert_eq!(table_entry(&table, table.len() / 4), None);
        }
    }

    #[test]
    fn a_whole_file_s_header_is_read_back() {
        let file = whole(b"hello");
        let h = check_header(&file, file.len() as u64).expect("whole file");
        assert_eq!(h.size, 5);
        assert!(verified(&h, crc32c::crc32c(b"hello"), 5));
    }

    #[test]
    fn a_torn_file_is_damaged_whatever_its_header_says() {
        let file = whole(b"hello world");
        for cut in 0..file.len() {
            assert_eq!(check_header(&file[..cut], cut as u64), None, "cut at {cut}");
        }
    }

    #[test]
    fn a_bad_magic_or_a_size_that_overflows_is_damaged() {
        let mut file = whole(b"abc");
        file[0] = b'X';
        assert_eq!(check_header(&file, file.len() as u64), None);
        let mut file = whole(b"abc");
        file[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
        assert_eq!(check_header(&file, u64::MAX), None);
    }

    #[test]
    fn rotten_or_short_data_is_never_verified() {
        let h = Header {
            size: 4,
            stored_crc: crc32c::crc32c(b"abcd"),
            version: VERSION_CHUNKED,
        };
        assert!(!verified(&h, crc32c::crc32c(b"abce"), 4));
        assert!(!verified(&h, crc32c::crc32c(b"abc"), 3));
    }

    #[test]
    fn only_32_hex_digits_name_a_replica() {
        let addr = 0xfd00_0000_0000_0001_0000_0000_0000_002a_u128;
        assert_eq!(parse_name(&file_name(addr)), Some(addr));
        assert_eq!(parse_name("tmp"), None);
        assert_eq!(parse_name(&format!("{addr:032x}.1")), None);
    }
}
