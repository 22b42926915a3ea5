//! The replica file's layout and what a read of it may serve, without
//! touching a file: the I/O shell ([`crate::storage::replicas`]) and the
//! simulation hand it the bytes they read.
//!
//! A replica file is a 20-byte header (magic, version, 3 reserved bytes,
//! size, CRC-32C of the data) followed by the data. The checksum is
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
/// The layout version this node writes.
const FILE_VERSION: u8 = 1;

/// The header of a replica of `size` bytes, its checksum still zero (it
/// is written at [`CHECKSUM_OFFSET`] once the data has arrived whole).
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
}

/// Checks a replica file's first bytes (`start`, at most
/// [`FILE_HEADER`] of them) against its length `file_len`: `None` when the
/// file is damaged (short, wrong magic, or a length other than the header
/// says, as a torn write leaves it).
pub fn check_header(start: &[u8], file_len: u64) -> Option<Header> {
    let header: &[u8; FILE_HEADER] = start.get(..FILE_HEADER)?.try_into().ok()?;
    if header[..4] != FILE_MAGIC {
        return None;
    }
    let size = u64::from_be_bytes(header[8..16].try_into().ok()?);
    let stored_crc = u32::from_be_bytes(header[16..20].try_into().ok()?);
    (file_len == size.checked_add(FILE_HEADER as u64)?).then_some(Header { size, stored_crc })
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
        file
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
