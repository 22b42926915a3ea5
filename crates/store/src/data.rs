//! TCP data frames between clients and storage nodes, and between storage
//! nodes along a replication chain.
//!
//! Request: `S6D1`, kind (u8), replica address (16 bytes), then
//! - Put: size (u64), forward chain (u8 count ≤ 15, addresses), the data,
//!   and the data's CRC-32C (u32);
//! - Get and Free: nothing more.
//!
//! Reply: status (u8, 0 = ok), then for Put the number of durable copies
//! (u8); for Get the size (u64), the data, and a trailer: status (u8, 0 =
//! checksum verified) and the CRC-32C (u32); errors carry a message.

use crate::addr::Addr;
use crate::wire::{Reader, WireError, Writer, MAX_DATA_REPLICAS, MAX_OBJECT};
use crate::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const MAGIC: [u8; 4] = *b"S6D1";
/// Size of the fixed request prefix.
pub const HEADER: usize = 21;

/// Data frame kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Store a replica and forward it along `chain`.
    Put {
        /// This replica's address.
        addr: Addr,
        /// Size of the data that follows.
        size: u64,
        /// Replicas still to write after this one.
        chain: Vec<Addr>,
    },
    /// Read a replica.
    Get {
        /// Replica address.
        addr: Addr,
    },
    /// Free a replica.
    Free {
        /// Replica address.
        addr: Addr,
    },
}

impl Request {
    /// Encodes the request header (for Put, the data follows it).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf.extend_from_slice(&MAGIC);
        match self {
            Request::Put { addr, size, chain } => {
                w.u8(1);
                w.addr(*addr);
                w.u64(*size);
                w.addrs(chain);
            }
            Request::Get { addr } => {
                w.u8(2);
                w.addr(*addr);
            }
            Request::Free { addr } => {
                w.u8(3);
                w.addr(*addr);
            }
        }
        w.buf
    }

    /// Decodes the fixed prefix; for Put, `rest` reads the size and chain.
    pub fn decode_prefix(prefix: &[u8; HEADER]) -> Result<(u8, Addr), WireError> {
        let mut r = Reader::new(prefix);
        if r.take(4)? != MAGIC {
            return Err(WireError::BadMagic);
        }
        let kind = r.u8()?;
        if !(1..=3).contains(&kind) {
            return Err(WireError::UnknownKind(kind));
        }
        Ok((kind, r.addr()?))
    }
}

/// Reads one request header from a stream. `Ok(None)` on a clean EOF
/// before the first byte.
pub async fn read_request<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Request>, Error> {
    let mut prefix = [0u8; HEADER];
    match r.read(&mut prefix[..1]).await {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(e) => return Err(Error::io("reading a data request", e)),
    }
    r.read_exact(&mut prefix[1..])
        .await
        .map_err(|e| Error::io("reading a data request header", e))?;
    let (kind, addr) = Request::decode_prefix(&prefix)?;
    Ok(Some(match kind {
        1 => {
            let size = r
                .read_u64()
                .await
                .map_err(|e| Error::io("reading a Put size", e))?;
            if size > MAX_OBJECT {
                return Err(Error::Wire(WireError::Invalid(format!(
                    "Put of {size} bytes exceeds the {MAX_OBJECT}-byte object limit"
                ))));
            }
            let n = r
                .read_u8()
                .await
                .map_err(|e| Error::io("reading a Put chain", e))? as usize;
            if n >= MAX_DATA_REPLICAS {
                return Err(Error::Wire(WireError::Invalid(format!(
                    "forward chain of {n} replicas; the limit is {}",
                    MAX_DATA_REPLICAS - 1
                ))));
            }
            let mut chain = Vec::with_capacity(n);
            for _ in 0..n {
                chain.push(
                    r.read_u128()
                        .await
                        .map_err(|e| Error::io("reading a Put chain", e))?,
                );
            }
            Request::Put { addr, size, chain }
        }
        2 => Request::Get { addr },
        _ => Request::Free { addr },
    }))
}

/// Writes an error reply: status 1 and a message.
pub async fn write_error<W: AsyncWrite + Unpin>(w: &mut W, message: &str) -> std::io::Result<()> {
    let mut wr = Writer::default();
    wr.u8(1);
    wr.str(message);
    w.write_all(&wr.buf).await?;
    w.flush().await
}

/// Reads a reply status; an error status becomes [`Error::Remote`] with
/// the node's message.
pub async fn read_status<R: AsyncRead + Unpin>(r: &mut R, what: &str) -> Result<(), Error> {
    let status = r
        .read_u8()
        .await
        .map_err(|e| Error::io(format!("{what}: reading the reply"), e))?;
    if status == 0 {
        return Ok(());
    }
    let len = r
        .read_u16()
        .await
        .map_err(|e| Error::io(format!("{what}: reading the error"), e))? as usize;
    let mut msg = vec![0u8; len];
    r.read_exact(&mut msg)
        .await
        .map_err(|e| Error::io(format!("{what}: reading the error"), e))?;
    Err(Error::Remote {
        code: crate::Code::Unavailable,
        message: format!("{what}: {}", String::from_utf8_lossy(&msg)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        for req in [
            Request::Put {
                addr: 7,
                size: 100,
                chain: vec![1, 2],
            },
            Request::Get { addr: 9 },
            Request::Free { addr: u128::MAX },
        ] {
            let bytes = req.encode();
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let back = rt
                .block_on(read_request(&mut bytes.as_slice()))
                .unwrap()
                .unwrap();
            assert_eq!(back, req);
            for cut in 1..bytes.len() {
                assert!(rt.block_on(read_request(&mut &bytes[..cut])).is_err());
            }
        }
    }

    #[test]
    fn hostile_headers_are_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut bad = Request::Get { addr: 1 }.encode();
        bad[0] = b'X';
        assert!(rt.block_on(read_request(&mut bad.as_slice())).is_err());
        let mut huge = Request::Put {
            addr: 1,
            size: 0,
            chain: vec![],
        }
        .encode();
        huge[HEADER..HEADER + 8].copy_from_slice(&u64::MAX.to_be_bytes());
        let err = rt.block_on(read_request(&mut huge.as_slice())).unwrap_err();
        assert!(err.to_string().contains("object limit"), "{err}");
        let mut chain = Request::Put {
            addr: 1,
            size: 0,
            chain: vec![],
        }
        .encode();
        chain[HEADER + 8] = 200;
        let err = rt
            .block_on(read_request(&mut chain.as_slice()))
            .unwrap_err();
        assert!(err.to_string().contains("forward chain"), "{err}");
    }
}
