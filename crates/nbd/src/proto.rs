//! The NBD wire format: constants, and pure encoders and decoders of the
//! fixed-newstyle handshake and the transmission phase.
//!
//! Nothing here does I/O or keeps state, so every decoder can be fed
//! arbitrary bytes (proptest, fuzzers). Decoders validate every field they
//! return; callers still check values against the export (sizes, ranges).
//! All integers on the wire are big-endian.

use thiserror::Error;

// ---------------------------------------------------------------- magics

/// `NBDMAGIC`, first word of the server greeting.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`, second word of the greeting and first of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of every transmission request (compact headers).
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ------------------------------------------------------ handshake flags

/// Server handshake flag: fixed newstyle negotiation.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Server handshake flag: may omit the 124 zero bytes after EXPORT_NAME.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: omit the 124 zero bytes after EXPORT_NAME.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// --------------------------------------------------- transmission flags

/// Always set.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// The export refuses writes.
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// `NBD_CMD_FLUSH` is supported.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// `NBD_CMD_FLAG_FUA` is supported.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// The medium is rotational (never set by Strata).
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
/// `NBD_CMD_TRIM` is supported.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// `NBD_CMD_WRITE_ZEROES` (and `NO_HOLE`) is supported.
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// `NBD_CMD_FLAG_DF` is supported on reads (structured replies only).
pub const FLAG_SEND_DF: u16 = 1 << 7;
/// Flush and FUA on one connection cover writes made on every other.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// `NBD_CMD_CACHE` is supported.
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
/// `NBD_CMD_FLAG_FAST_ZERO` is supported on write-zeroes.
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// -------------------------------------------------------------- options

/// Select an export and enter transmission (cannot report errors).
pub const OPT_EXPORT_NAME: u32 = 1;
/// End the negotiation.
pub const OPT_ABORT: u32 = 2;
/// List the exports.
pub const OPT_LIST: u32 = 3;
/// Upgrade to TLS (unsupported).
pub const OPT_STARTTLS: u32 = 5;
/// Describe an export.
pub const OPT_INFO: u32 = 6;
/// Describe an export and enter transmission.
pub const OPT_GO: u32 = 7;
/// Use structured replies.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// List metadata contexts.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// Select metadata contexts.
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// 64-bit request and reply headers (unsupported: answered `ERR_UNSUP`).
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// -------------------------------------------------------- option replies

/// The option succeeded (or a list ended).
pub const REP_ACK: u32 = 1;
/// One export of `OPT_LIST`.
pub const REP_SERVER: u32 = 2;
/// One piece of information of `OPT_INFO`/`OPT_GO`.
pub const REP_INFO: u32 = 3;
/// One metadata context.
pub const REP_META_CONTEXT: u32 = 4;
/// Bit set in every error reply.
pub const REP_FLAG_ERROR: u32 = 1 << 31;
/// The option is not known.
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
/// The option is refused by policy.
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
/// The option is malformed or not valid now.
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
/// Not available on this platform.
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
/// TLS is required first.
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
/// No such export.
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
/// The server is shutting down.
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
/// The client must ask for block sizes first.
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
/// The request or its reply is too large.
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;

// ----------------------------------------------------------- info types

/// Size and transmission flags.
pub const INFO_EXPORT: u16 = 0;
/// Canonical export name.
pub const INFO_NAME: u16 = 1;
/// Human-readable description.
pub const INFO_DESCRIPTION: u16 = 2;
/// Minimum, preferred and maximum block sizes.
pub const INFO_BLOCK_SIZE: u16 = 3;

// -------------------------------------------------------------- commands

/// Read.
pub const CMD_READ: u16 = 0;
/// Write (payload follows the header).
pub const CMD_WRITE: u16 = 1;
/// Disconnect (no reply).
pub const CMD_DISC: u16 = 2;
/// Make completed writes durable.
pub const CMD_FLUSH: u16 = 3;
/// Discard (advisory).
pub const CMD_TRIM: u16 = 4;
/// Prefetch.
pub const CMD_CACHE: u16 = 5;
/// Write zeroes without a payload.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// Query metadata contexts.
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flag: force unit access.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag: write-zeroes must not leave a hole.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag: read reply in one content chunk.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag: block status for one extent only.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag: write-zeroes only if faster than a write.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ------------------------------------------------------ structured replies

/// Chunk flag: last chunk of the reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Chunk type: nothing (final chunk only).
pub const REPLY_TYPE_NONE: u16 = 0;
/// Chunk type: data at an offset.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Chunk type: zeroes at an offset.
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Chunk type: block status descriptors of one context.
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Chunk type: error for the whole request.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
/// Chunk type: error at an offset.
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// ---------------------------------------------------------------- errors

/// Operation not permitted (write to a read-only export).
pub const EPERM: u32 = 1;
/// I/O error.
pub const EIO: u32 = 5;
/// Out of memory.
pub const ENOMEM: u32 = 12;
/// Invalid argument.
pub const EINVAL: u32 = 22;
/// No space (write beyond the end).
pub const ENOSPC: u32 = 28;
/// Value too large.
pub const EOVERFLOW: u32 = 75;
/// Not supported (fast zero that would not be fast).
pub const ENOTSUP: u32 = 95;
/// The server is shutting down.
pub const ESHUTDOWN: u32 = 108;

// ------------------------------------------------------ base:allocation

/// The only metadata context Strata serves.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Extent flag: not allocated.
pub const STATE_HOLE: u32 = 1 << 0;
/// Extent flag: reads as zeroes.
pub const STATE_ZERO: u32 = 1 << 1;

// ---------------------------------------------------------------- limits

/// Longest string the protocol allows (export names, queries, messages).
pub const MAX_STRING: usize = 4096;
/// Size of a request header.
pub const REQUEST_LEN: usize = 28;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Size of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Size of an option request header.
pub const OPTION_HEADER_LEN: usize = 16;
/// Size of an option reply header.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Size of the server greeting.
pub const GREETING_LEN: usize = 18;

/// Something on the wire that does not follow the protocol.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtoError {
    /// A magic number is wrong: the peer does not speak NBD (or lost sync).
    #[error("bad magic {found:#x} (expected {expected:#x})")]
    BadMagic {
        /// What the protocol requires.
        expected: u64,
        /// What arrived.
        found: u64,
    },
    /// The client set handshake flags the server did not offer.
    #[error("unknown client flags {0:#x}")]
    UnknownClientFlags(u32),
    /// A field says more data follows than the message holds, or less.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// A string is longer than the protocol allows.
    #[error("{0} longer than {MAX_STRING} bytes")]
    TooLong(&'static str),
    /// A string is not UTF-8 or contains NUL.
    #[error("{0} is not a valid string (UTF-8 without NUL)")]
    BadString(&'static str),
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(w)
}

/// Validates a protocol string: UTF-8, no NUL, at most [`MAX_STRING`].
pub fn parse_string<'a>(bytes: &'a [u8], what: &'static str) -> Result<&'a str, ProtoError> {
    if bytes.len() > MAX_STRING {
        return Err(ProtoError::TooLong(what));
    }
    let s = std::str::from_utf8(bytes).map_err(|_| ProtoError::BadString(what))?;
    if s.contains('\0') {
        return Err(ProtoError::BadString(what));
    }
    Ok(s)
}

/// Takes a length-prefixed (u32) string off the front of `data`.
fn take_string<'a>(data: &mut &'a [u8], what: &'static str) -> Result<&'a str, ProtoError> {
    if data.len() < 4 {
        return Err(ProtoError::Malformed(what));
    }
    let len = be32(data, 0) as usize;
    let rest = &data[4..];
    if len > rest.len() {
        return Err(ProtoError::Malformed(what));
    }
    let s = parse_string(&rest[..len], what)?;
    *data = &rest[len..];
    Ok(s)
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

// ================================================================ handshake

/// The server's first message: magics and handshake flags.
pub fn encode_greeting(flags: u16) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&flags.to_be_bytes());
    b
}

/// Decodes the server greeting (client side; used by tests).
pub fn parse_greeting(b: &[u8; GREETING_LEN]) -> Result<u16, ProtoError> {
    check_magic64(NBDMAGIC, be64(b, 0))?;
    check_magic64(IHAVEOPT, be64(b, 8))?;
    Ok(be16(b, 16))
}

fn check_magic64(expected: u64, found: u64) -> Result<(), ProtoError> {
    if found == expected {
        Ok(())
    } else {
        Err(ProtoError::BadMagic { expected, found })
    }
}

/// What the client's flags word asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientFlags {
    /// The client speaks fixed newstyle.
    pub fixed_newstyle: bool,
    /// Omit the zero padding after `NBD_OPT_EXPORT_NAME`.
    pub no_zeroes: bool,
}

/// Decodes the client flags; any bit the server did not offer is an
/// error, and the spec then requires closing the connection.
pub fn parse_client_flags(raw: u32) -> Result<ClientFlags, ProtoError> {
    if raw & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(ProtoError::UnknownClientFlags(raw));
    }
    Ok(ClientFlags {
        fixed_newstyle: raw & FLAG_C_FIXED_NEWSTYLE != 0,
        no_zeroes: raw & FLAG_C_NO_ZEROES != 0,
    })
}

/// The fixed part of an option request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option (`OPT_*`).
    pub option: u32,
    /// Bytes of option data that follow.
    pub length: u32,
}

/// Decodes an option header, checking its magic.
pub fn parse_option_header(b: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, ProtoError> {
    check_magic64(IHAVEOPT, be64(b, 0))?;
    Ok(OptionHeader {
        option: be32(b, 8),
        length: be32(b, 12),
    })
}

/// Encodes an option request (client side; used by tests).
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_HEADER_LEN + data.len());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// The data of `NBD_OPT_EXPORT_NAME`: the whole payload is the name.
pub fn parse_export_name(data: &[u8]) -> Result<&str, ProtoError> {
    parse_string(data, "export name")
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    /// Export name ("" is the default export).
    pub name: &'a str,
    /// Information types asked for (`INFO_*`), as sent.
    pub requests: Vec<u16>,
}

/// Decodes the data of `NBD_OPT_INFO`/`NBD_OPT_GO`. The data must be
/// exactly a name, a count and that many 16-bit requests.
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest<'_>, ProtoError> {
    let mut rest = data;
    let name = take_string(&mut rest, "export name")?;
    if rest.len() < 2 {
        return Err(ProtoError::Malformed("information request count"));
    }
    let n = be16(rest, 0) as usize;
    let list = &rest[2..];
    if list.len() != n * 2 {
        return Err(ProtoError::Malformed("information request list"));
    }
    let requests = list.chunks_exact(2).map(|c| be16(c, 0)).collect();
    Ok(InfoRequest { name, requests })
}

/// Encodes the data of `NBD_OPT_INFO`/`NBD_OPT_GO` (client side).
pub fn encode_info_request(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut out = Vec::new();
    put_string(&mut out, name);
    out.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    for r in requests {
        out.extend_from_slice(&r.to_be_bytes());
    }
    out
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest<'a> {
    /// Export the contexts are for.
    pub export: &'a str,
    /// Queries, each `namespace:leaf`.
    pub queries: Vec<&'a str>,
}

/// Decodes a metadata-context option. The count is checked against the
/// bytes present before anything is allocated for it.
pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest<'_>, ProtoError> {
    let mut rest = data;
    let export = take_string(&mut rest, "export name")?;
    if rest.len() < 4 {
        return Err(ProtoError::Malformed("query count"));
    }
    let n = be32(rest, 0) as usize;
    rest = &rest[4..];
    // Every query takes at least its 4-byte length.
    if n > rest.len() / 4 {
        return Err(ProtoError::Malformed("query count"));
    }
    let mut queries = Vec::with_capacity(n);
    for _ in 0..n {
        queries.push(take_string(&mut rest, "query")?);
    }
    if !rest.is_empty() {
        return Err(ProtoError::Malformed("metadata context request"));
    }
    Ok(MetaContextRequest { export, queries })
}

/// Encodes a metadata-context option's data (client side).
pub fn encode_meta_context_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    put_string(&mut out, export);
    out.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        put_string(&mut out, q);
    }
    out
}

/// Appends an option reply: header and payload.
pub fn encode_option_reply(out: &mut Vec<u8>, option: u32, reply: u32, payload: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends an error reply with a message (truncated to the protocol's
/// string limit, on a character boundary).
pub fn encode_option_error(out: &mut Vec<u8>, option: u32, reply: u32, message: &str) {
    encode_option_reply(out, option, reply, truncate(message, MAX_STRING).as_bytes());
}

/// Appends an `NBD_REP_SERVER` reply naming one export.
pub fn encode_rep_server(out: &mut Vec<u8>, option: u32, name: &str) {
    let mut payload = Vec::with_capacity(4 + name.len());
    put_string(&mut payload, name);
    encode_option_reply(out, option, REP_SERVER, &payload);
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_EXPORT`.
pub fn encode_info_export(out: &mut Vec<u8>, option: u32, size: u64, flags: u16) {
    let mut p = [0u8; 12];
    p[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    p[2..10].copy_from_slice(&size.to_be_bytes());
    p[10..12].copy_from_slice(&flags.to_be_bytes());
    encode_option_reply(out, option, REP_INFO, &p);
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_BLOCK_SIZE`.
pub fn encode_info_block_size(out: &mut Vec<u8>, option: u32, min: u32, preferred: u32, max: u32) {
    let mut p = [0u8; 14];
    p[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    p[2..6].copy_from_slice(&min.to_be_bytes());
    p[6..10].copy_from_slice(&preferred.to_be_bytes());
    p[10..14].copy_from_slice(&max.to_be_bytes());
    encode_option_reply(out, option, REP_INFO, &p);
}

/// Appends `NBD_REP_INFO` carrying a string (`INFO_NAME`, `INFO_DESCRIPTION`).
pub fn encode_info_string(out: &mut Vec<u8>, option: u32, info: u16, s: &str) {
    let s = truncate(s, MAX_STRING);
    let mut p = Vec::with_capacity(2 + s.len());
    p.extend_from_slice(&info.to_be_bytes());
    p.extend_from_slice(s.as_bytes());
    encode_option_reply(out, option, REP_INFO, &p);
}

/// Appends `NBD_REP_META_CONTEXT`.
pub fn encode_meta_context(out: &mut Vec<u8>, option: u32, id: u32, name: &str) {
    let mut p = Vec::with_capacity(4 + name.len());
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(name.as_bytes());
    encode_option_reply(out, option, REP_META_CONTEXT, &p);
}

/// The reply to `NBD_OPT_EXPORT_NAME`: size, flags and, unless the client
/// negotiated `NO_ZEROES`, 124 bytes of padding.
pub fn encode_export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(134);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; 124]);
    }
    out
}

/// The fixed part of an option reply (client side; used by tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option replied to.
    pub option: u32,
    /// The reply type (`REP_*`).
    pub reply: u32,
    /// Bytes of payload that follow.
    pub length: u32,
}

/// Decodes an option reply header (client side; used by tests).
pub fn parse_option_reply_header(
    b: &[u8; OPTION_REPLY_HEADER_LEN],
) -> Result<OptionReplyHeader, ProtoError> {
    check_magic64(OPTION_REPLY_MAGIC, be64(b, 0))?;
    Ok(OptionReplyHeader {
        option: be32(b, 8),
        reply: be32(b, 12),
        length: be32(b, 16),
    })
}

// ============================================================ transmission

/// A transmission request header, decoded but not yet checked against the
/// export (see [`crate::command::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags (`CMD_FLAG_*`).
    pub flags: u16,
    /// Command type (`CMD_*`), possibly unknown.
    pub command: u16,
    /// Opaque cookie echoed in the reply.
    pub handle: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length (for writes, the payload that follows).
    pub length: u32,
}

/// Decodes a request header. Only the magic can be wrong here: a bad
/// magic means the stream lost sync and the connection must end.
pub fn parse_request(b: &[u8; REQUEST_LEN]) -> Result<Request, ProtoError> {
    let magic = be32(b, 0);
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic {
            expected: REQUEST_MAGIC as u64,
            found: magic as u64,
        });
    }
    Ok(Request {
        flags: be16(b, 4),
        command: be16(b, 6),
        handle: be64(b, 8),
        offset: be64(b, 16),
        length: be32(b, 24),
    })
}

/// Encodes a request header (client side; used by tests).
pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.command.to_be_bytes());
    b[8..16].copy_from_slice(&r.handle.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.length.to_be_bytes());
    b
}

/// A simple reply header (any data follows separately).
pub fn encode_simple_reply(error: u32, handle: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// Decodes a simple reply header into (error, handle) (client side).
pub fn parse_simple_reply(b: &[u8; SIMPLE_REPLY_LEN]) -> Result<(u32, u64), ProtoError> {
    let magic = be32(b, 0);
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            expected: SIMPLE_REPLY_MAGIC as u64,
            found: magic as u64,
        });
    }
    Ok((be32(b, 4), be64(b, 8)))
}

/// The header of one structured reply chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Chunk flags (`REPLY_FLAG_*`).
    pub flags: u16,
    /// Chunk type (`REPLY_TYPE_*`).
    pub kind: u16,
    /// The request's handle.
    pub handle: u64,
    /// Payload bytes that follow.
    pub length: u32,
}

/// Encodes a chunk header.
pub fn encode_chunk_header(h: &ChunkHeader) -> [u8; CHUNK_HEADER_LEN] {
    let mut b = [0u8; CHUNK_HEADER_LEN];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&h.flags.to_be_bytes());
    b[6..8].copy_from_slice(&h.kind.to_be_bytes());
    b[8..16].copy_from_slice(&h.handle.to_be_bytes());
    b[16..20].copy_from_slice(&h.length.to_be_bytes());
    b
}

/// Decodes a chunk header (client side; used by tests).
pub fn parse_chunk_header(b: &[u8; CHUNK_HEADER_LEN]) -> Result<ChunkHeader, ProtoError> {
    let magic = be32(b, 0);
    if magic != STRUCTURED_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            expected: STRUCTURED_REPLY_MAGIC as u64,
            found: magic as u64,
        });
    }
    Ok(ChunkHeader {
        flags: be16(b, 4),
        kind: be16(b, 6),
        handle: be64(b, 8),
        length: be32(b, 16),
    })
}

/// Length of an `OFFSET_DATA` chunk header plus its offset field.
pub const OFFSET_DATA_HEADER_LEN: usize = CHUNK_HEADER_LEN + 8;

/// The header and offset of an `OFFSET_DATA` chunk whose `data_len`
/// bytes follow. `None` when the data cannot fit one chunk (the length
/// field is 32 bits and includes the offset).
pub fn encode_offset_data_header(
    flags: u16,
    handle: u64,
    offset: u64,
    data_len: usize,
) -> Option<[u8; OFFSET_DATA_HEADER_LEN]> {
    let length = u32::try_from(data_len.checked_add(8)?).ok()?;
    let mut b = [0u8; OFFSET_DATA_HEADER_LEN];
    b[..CHUNK_HEADER_LEN].copy_from_slice(&encode_chunk_header(&ChunkHeader {
        flags,
        kind: REPLY_TYPE_OFFSET_DATA,
        handle,
        length,
    }));
    b[CHUNK_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
    Some(b)
}

/// Length of a whole `OFFSET_HOLE` chunk.
pub const OFFSET_HOLE_LEN: usize = CHUNK_HEADER_LEN + 12;

/// A whole `OFFSET_HOLE` chunk.
pub fn encode_offset_hole(flags: u16, handle: u64, offset: u64, len: u32) -> [u8; OFFSET_HOLE_LEN] {
    let mut b = [0u8; OFFSET_HOLE_LEN];
    b[..CHUNK_HEADER_LEN].copy_from_slice(&encode_chunk_header(&ChunkHeader {
        flags,
        kind: REPLY_TYPE_OFFSET_HOLE,
        handle,
        length: 12,
    }));
    b[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + 8].copy_from_slice(&offset.to_be_bytes());
    b[CHUNK_HEADER_LEN + 8..].copy_from_slice(&len.to_be_bytes());
    b
}

/// A whole `NONE` chunk (always final).
pub fn encode_none_chunk(handle: u64) -> [u8; CHUNK_HEADER_LEN] {
    encode_chunk_header(&ChunkHeader {
        flags: REPLY_FLAG_DONE,
        kind: REPLY_TYPE_NONE,
        handle,
        length: 0,
    })
}

/// Appends a final `ERROR` chunk with a message (truncated to fit).
pub fn encode_error_chunk(out: &mut Vec<u8>, handle: u64, error: u32, message: &str) {
    // The message length is a 16-bit field and the spec caps strings.
    let msg = truncate(message, MAX_STRING);
    out.extend_from_slice(&encode_chunk_header(&ChunkHeader {
        flags: REPLY_FLAG_DONE,
        kind: REPLY_TYPE_ERROR,
        handle,
        length: 6 + msg.len() as u32,
    }));
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg.as_bytes());
}

/// Decodes the payload of an error chunk into (error, message).
pub fn parse_error_payload(p: &[u8]) -> Result<(u32, &str), ProtoError> {
    if p.len() < 6 {
        return Err(ProtoError::Malformed("error chunk"));
    }
    let len = be16(p, 4) as usize;
    if len > p.len() - 6 {
        return Err(ProtoError::Malformed("error chunk"));
    }
    Ok((be32(p, 0), parse_string(&p[6..6 + len], "error message")?))
}

/// One block status descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Bytes described (non-zero).
    pub length: u32,
    /// Context flags (`STATE_*` for base:allocation).
    pub flags: u32,
}

/// Appends a final `BLOCK_STATUS` chunk for one context. `None` when
/// there are no extents (the spec requires at least one) or too many.
pub fn encode_block_status(
    out: &mut Vec<u8>,
    flags: u16,
    handle: u64,
    context: u32,
    extents: &[Extent],
) -> Option<()> {
    if extents.is_empty() || extents.iter().any(|e| e.length == 0) {
        return None;
    }
    let length = u32::try_from(4 + 8 * extents.len()).ok()?;
    out.extend_from_slice(&encode_chunk_header(&ChunkHeader {
        flags,
        kind: REPLY_TYPE_BLOCK_STATUS,
        handle,
        length,
    }));
    out.extend_from_slice(&context.to_be_bytes());
    for e in extents {
        out.extend_from_slice(&e.length.to_be_bytes());
        out.extend_from_slice(&e.flags.to_be_bytes());
    }
    Some(())
}

/// Decodes a `BLOCK_STATUS` payload into (context, extents).
pub fn parse_block_status(p: &[u8]) -> Result<(u32, Vec<Extent>), ProtoError> {
    if p.len() < 12 || !(p.len() - 4).is_multiple_of(8) {
        return Err(ProtoError::Malformed("block status chunk"));
    }
    let extents = p[4..]
        .chunks_exact(8)
        .map(|c| Extent {
            length: be32(c, 0),
            flags: be32(c, 4),
        })
        .collect();
    Ok((be32(p, 0), extents))
}

/// The longest prefix of `s` of at most `max` bytes ending on a character
/// boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn greeting_round_trip() {
        let g = encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(parse_greeting(&g), Ok(3));
        let mut bad = g;
        bad[0] = b'X';
        assert!(matches!(
            parse_greeting(&bad),
            Err(ProtoError::BadMagic { .. })
        ));
    }

    #[test]
    fn client_flags() {
        assert_eq!(
            parse_client_flags(3),
            Ok(ClientFlags {
                fixed_newstyle: true,
                no_zeroes: true
            })
        );
        assert_eq!(parse_client_flags(0), Ok(ClientFlags::default()));
        assert_eq!(
            parse_client_flags(4),
            Err(ProtoError::UnknownClientFlags(4))
        );
        assert!(parse_client_flags(0x8000_0001).is_err());
    }

    #[test]
    fn info_request_rejects_bad_lengths() {
        let good = encode_info_request("disk", &[INFO_BLOCK_SIZE, INFO_NAME]);
        let r = parse_info_request(&good).unwrap();
        assert_eq!(r.name, "disk");
        assert_eq!(r.requests, vec![INFO_BLOCK_SIZE, INFO_NAME]);
        // Truncated anywhere: rejected.
        for cut in 0..good.len() {
            assert!(parse_info_request(&good[..cut]).is_err(), "cut {cut}");
        }
        // Trailing garbage: rejected.
        let mut long = good.clone();
        long.push(0);
        assert!(parse_info_request(&long).is_err());
        // A name length pointing past the end.
        let mut huge = good;
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&huge).is_err());
    }

    #[test]
    fn strings_are_checked() {
        assert!(parse_export_name(b"a\0b").is_err());
        assert!(parse_export_name(&[0xff, 0xfe]).is_err());
        assert!(parse_export_name(&vec![b'a'; MAX_STRING + 1]).is_err());
        assert_eq!(parse_export_name(b""), Ok(""));
    }

    #[test]
    fn meta_context_count_is_bounded_by_data() {
        let mut d = Vec::new();
        put_string(&mut d, "");
        d.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            parse_meta_context_request(&d),
            Err(ProtoError::Malformed("query count"))
        );
        let ok = encode_meta_context_request("x", &["base:allocation", "qemu:dirty"]);
        let r = parse_meta_context_request(&ok).unwrap();
        assert_eq!(r.export, "x");
        assert_eq!(r.queries, vec!["base:allocation", "qemu:dirty"]);
    }

    #[test]
    fn request_bad_magic() {
        let mut b = encode_request(&Request {
            flags: 0,
            command: CMD_READ,
            handle: 1,
            offset: 0,
            length: 512,
        });
        b[3] ^= 1;
        assert!(matches!(
            parse_request(&b),
            Err(ProtoError::BadMagic { .. })
        ));
    }

    #[test]
    fn chunks() {
        let h = encode_offset_data_header(REPLY_FLAG_DONE, 7, 4096, 512).unwrap();
        let c = parse_chunk_header(h[..CHUNK_HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(c.kind, REPLY_TYPE_OFFSET_DATA);
        assert_eq!(c.length, 520);
        assert_eq!(be64(&h, CHUNK_HEADER_LEN), 4096);
        assert!(encode_offset_data_header(0, 7, 0, u32::MAX as usize).is_none());

        let hole = encode_offset_hole(0, 9, 8192, 4096);
        let c = parse_chunk_header(hole[..CHUNK_HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(
            (c.kind, c.length, c.handle),
            (REPLY_TYPE_OFFSET_HOLE, 12, 9)
        );

        let mut out = Vec::new();
        encode_error_chunk(&mut out, 3, EINVAL, "nope");
        let c = parse_chunk_header(out[..CHUNK_HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(c.flags, REPLY_FLAG_DONE);
        assert_eq!(
            parse_error_payload(&out[CHUNK_HEADER_LEN..]),
            Ok((EINVAL, "nope"))
        );

        let mut out = Vec::new();
        assert!(encode_block_status(&mut out, 0, 1, 1, &[]).is_none());
        let ext = [
            Extent {
                length: 65536,
                flags: STATE_HOLE | STATE_ZERO,
            },
            Extent {
                length: 512,
                flags: 0,
            },
        ];
        encode_block_status(&mut out, REPLY_FLAG_DONE, 1, 5, &ext).unwrap();
        assert_eq!(
            parse_block_status(&out[CHUNK_HEADER_LEN..]),
            Ok((5, ext.to_vec()))
        );
    }

    #[test]
    fn truncate_on_char_boundary() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

    proptest! {
        #[test]
        fn request_round_trip(flags: u16, command: u16, handle: u64, offset: u64, length: u32) {
            let r = Request { flags, command, handle, offset, length };
            prop_assert_eq!(parse_request(&encode_request(&r)), Ok(r));
        }

        #[test]
        fn request_never_panics(bytes in proptest::array::uniform28(any::<u8>())) {
            let _ = parse_request(&bytes);
        }

        #[test]
        fn option_header_round_trip(option: u32, data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let enc = encode_option(option, &data);
            let h = parse_option_header(enc[..16].try_into().unwrap()).unwrap();
            prop_assert_eq!(h, OptionHeader { option, length: data.len() as u32 });
        }

        #[test]
        fn info_request_round_trip(name in "[a-z0-9/._-]{0,64}", reqs in proptest::collection::vec(any::<u16>(), 0..8)) {
            let enc = encode_info_request(&name, &reqs);
            let r = parse_info_request(&enc).unwrap();
            prop_assert_eq!(r.name, name.as_str());
            prop_assert_eq!(r.requests, reqs);
        }

        #[test]
        fn option_parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_info_request(&data);
            let _ = parse_meta_context_request(&data);
            let _ = parse_export_name(&data);
            let _ = parse_error_payload(&data);
            let _ = parse_block_status(&data);
        }

        #[test]
        fn meta_round_trip(export in "[a-z]{0,16}", queries in proptest::collection::vec("[a-z:]{0,24}", 0..6)) {
            let qs: Vec<&str> = queries.iter().map(|s| s.as_str()).collect();
            let enc = encode_meta_context_request(&export, &qs);
            let r = parse_meta_context_request(&enc).unwrap();
            prop_assert_eq!(r.export, export.as_str());
            prop_assert_eq!(r.queries, qs);
        }

        #[test]
        fn simple_reply_round_trip(error: u32, handle: u64) {
            prop_assert_eq!(parse_simple_reply(&encode_simple_reply(error, handle)), Ok((error, handle)));
        }

        #[test]
        fn chunk_round_trip(flags: u16, kind: u16, handle: u64, length: u32) {
            let h = ChunkHeader { flags, kind, handle, length };
            prop_assert_eq!(parse_chunk_header(&encode_chunk_header(&h)), Ok(h));
        }

        #[test]
        fn option_reply_round_trip(option: u32, reply: u32, payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut out = Vec::new();
            encode_option_reply(&mut out, option, reply, &payload);
            let h = parse_option_reply_header(out[..20].try_into().unwrap()).unwrap();
            prop_assert_eq!(h, OptionReplyHeader { option, reply, length: payload.len() as u32 });
            prop_assert_eq!(&out[20..], &payload[..]);
        }
    }
}
