//! The binary primitives of the store's messages: a writer, a bounds-checked
//! reader, and the errors of decoding.

use crate::addr::Addr;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Largest metadata datagram we send or accept.
pub const MAX_DATAGRAM: usize = 65_000;
/// Longest object name, in bytes.
pub const MAX_NAME: usize = 4096;
/// Why a message could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The message ended before a field did.
    #[error("message truncated at byte {0}")]
    Truncated(usize),
    /// The message does not start with the store's magic and version.
    #[error("not a Strata store message (bad magic or version)")]
    BadMagic,
    /// The message kind is unknown.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// A field is out of its allowed range.
    #[error("invalid field: {0}")]
    Invalid(String),
    /// Bytes were left over after the message.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// The message is too large for one datagram.
    #[error("message of {0} bytes exceeds the {MAX_DATAGRAM}-byte datagram limit")]
    TooLarge(usize),
}

/// Checks an object name: 1 to 4,096 bytes of UTF-8 without NUL.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("object name is empty; give a name of 1 to 4096 bytes".into());
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "object name is {} bytes; the limit is {MAX_NAME}",
            name.len()
        ));
    }
    if name.contains('\0') {
        return Err("object name contains a NUL byte".into());
    }
    Ok(())
}

/// Appends fields to a buffer.
#[derive(Default)]
pub struct Writer {
    /// The bytes written so far.
    pub buf: Vec<u8>,
}

impl Writer {
    /// Appends a byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    /// Appends a big-endian u16.
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    /// Appends a big-endian u32.
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    /// Appends a big-endian u64.
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    /// Appends an address.
    pub fn addr(&mut self, v: Addr) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    /// Appends a length-prefixed (u16) byte string.
    pub fn bytes16(&mut self, v: &[u8]) {
        self.u16(v.len().min(u16::MAX as usize) as u16);
        self.buf
            .extend_from_slice(&v[..v.len().min(u16::MAX as usize)]);
    }
    /// Appends a string.
    pub fn str(&mut self, v: &str) {
        self.bytes16(v.as_bytes());
    }
    /// Appends a count-prefixed list of addresses.
    pub fn addrs(&mut self, v: &[Addr]) {
        self.u8(v.len().min(255) as u8);
        for &a in v.iter().take(255) {
            self.addr(a);
        }
    }
    /// Appends a socket address.
    pub fn sockaddr(&mut self, v: SocketAddr) {
        let ip = match v.ip() {
            IpAddr::V4(ip) => ip.to_ipv6_mapped(),
            IpAddr::V6(ip) => ip,
        };
        self.addr(u128::from(ip));
        self.u16(v.port());
    }
}

/// Reads fields from a buffer, with bounds checks.
pub struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    /// Takes `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() - self.pos < n {
            return Err(WireError::Truncated(self.buf.len()));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    /// Reads a byte.
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    /// Reads a big-endian u16.
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    /// Reads a big-endian u32.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    /// Reads a big-endian u64.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    /// Reads an address.
    pub fn addr(&mut self) -> Result<Addr, WireError> {
        Ok(u128::from_be_bytes(self.array()?))
    }
    /// Reads a u16-length-prefixed byte string.
    pub fn bytes16(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    /// Reads a string of at most `max` bytes.
    pub fn str(&mut self, max: usize, what: &str) -> Result<String, WireError> {
        let b = self.bytes16()?;
        if b.len() > max {
            return Err(WireError::Invalid(format!(
                "{what} is {} bytes; the limit is {max}",
                b.len()
            )));
        }
        String::from_utf8(b.to_vec())
            .map_err(|_| WireError::Invalid(format!("{what} is not UTF-8")))
    }
    /// Reads an object name (checked with [`check_name`]).
    pub fn name(&mut self) -> Result<String, WireError> {
        let name = self.str(MAX_NAME, "object name")?;
        check_name(&name).map_err(WireError::Invalid)?;
        Ok(name)
    }
    /// Reads a list of at most `max` addresses.
    pub fn addrs(&mut self, max: usize, what: &str) -> Result<Vec<Addr>, WireError> {
        let n = self.u8()? as usize;
        if n > max {
            return Err(WireError::Invalid(format!(
                "{n} {what}; the limit is {max}"
            )));
        }
        (0..n).map(|_| self.addr()).collect()
    }
    /// Reads a socket address.
    pub fn sockaddr(&mut self) -> Result<SocketAddr, WireError> {
        let ip = Ipv6Addr::from(self.addr()?);
        let port = self.u16()?;
        let ip = match ip.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(ip),
        };
        Ok(SocketAddr::new(ip, port))
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Skips the zero bytes that pad a request up to the end ([`crate::wire::Msg::encode_padded`]);
    /// any other byte is left for [`Reader::finish`] to refuse.
    pub fn skip_padding(&mut self) {
        if self.buf[self.pos..].iter().all(|&b| b == 0) {
            self.pos = self.buf.len();
        }
    }
    /// Fails if bytes remain.
    pub fn finish(&self) -> Result<(), WireError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}
