//! The fixed-newstyle handshake: greeting, client flags and option
//! haggling, up to the choice of an export.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::command::MAX_PAYLOAD;
use crate::export::{Export, BASE_ALLOCATION_ID};
use crate::exports::ExportSet;
use crate::proto::{self, *};
use crate::ConnError;

/// Longest option data read into memory. Generous for every option the
/// server knows (a 4 KiB name plus a few 4 KiB queries).
pub const MAX_OPTION_DATA: u32 = 16 * 1024;

/// Longest option data skipped (answered `NBD_REP_ERR_TOO_BIG`); longer
/// than this and the client is dropped rather than read for long.
const MAX_OPTION_SKIP: u32 = 1024 * 1024;

/// Preferred block size advertised: a page.
pub const PREFERRED_BLOCK: u32 = 4096;

/// What the handshake settled.
#[derive(Debug)]
pub(crate) struct Negotiated {
    /// The chosen export.
    pub export: Arc<Export>,
    /// Structured replies are in use.
    pub structured: bool,
    /// `base:allocation` is selected.
    pub block_status: bool,
}

struct State {
    structured: bool,
    /// Export of the last `SET_META_CONTEXT` and whether it selected
    /// `base:allocation`.
    meta: Option<(Arc<Export>, bool)>,
}

impl State {
    fn negotiated(&self, export: &Arc<Export>) -> Negotiated {
        // Block status is valid only if the contexts were set for the
        // export actually chosen.
        let block_status = match &self.meta {
            Some((e, selected)) => *selected && Arc::ptr_eq(e, export),
            None => false,
        };
        Negotiated {
            export: export.clone(),
            structured: self.structured,
            block_status,
        }
    }
}

/// Runs the handshake. `Ok(None)` means the client ended it (ABORT).
///
/// Reads are unbuffered on purpose: the client may send its first
/// requests right after `NBD_OPT_GO`, and those bytes must stay in the
/// socket for the transmission phase.
pub(crate) async fn handshake<S>(
    io: &mut S,
    exports: &ExportSet,
) -> Result<Option<Negotiated>, ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    io.write_all(&encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES))
        .await?;
    io.flush().await?;
    let client = parse_client_flags(io.read_u32().await?)?;
    // Clients that do not set FIXED_NEWSTYLE are still answered in fixed
    // newstyle: the spec allows it, and such clients only send
    // EXPORT_NAME, which has no reply to confuse them.
    let mut st = State {
        structured: false,
        meta: None,
    };
    loop {
        let mut hdr = [0u8; OPTION_HEADER_LEN];
        io.read_exact(&mut hdr).await?;
        let h = parse_option_header(&hdr)?;
        let mut out = Vec::new();
        if h.length > MAX_OPTION_DATA {
            // EXPORT_NAME cannot be answered with an error; for anything
            // else skip the data (bounded) and say it was too big.
            if h.option == OPT_EXPORT_NAME || h.length > MAX_OPTION_SKIP {
                return Err(ConnError::Refused(format!(
                    "option {} with {} bytes of data",
                    h.option, h.length
                )));
            }
            skip(io, u64::from(h.length)).await?;
            encode_option_error(&mut out, h.option, REP_ERR_TOO_BIG, "option data too long");
            io.write_all(&out).await?;
            continue;
        }
        let mut data = vec![0u8; h.length as usize];
        io.read_exact(&mut data).await?;
        match h.option {
            OPT_EXPORT_NAME => {
                let name = parse_export_name(&data)?;
                let Some(export) = exports.get(name) else {
                    // No way to report an error: the spec says close.
                    return Err(ConnError::Refused(format!("no export named '{name}'")));
                };
                let neg = st.negotiated(&export);
                let flags = export.transmission_flags(neg.structured);
                io.write_all(&encode_export_name_reply(
                    export.size(),
                    flags,
                    client.no_zeroes,
                ))
                .await?;
                io.flush().await?;
                return Ok(Some(neg));
            }
            OPT_ABORT => {
                encode_option_reply(&mut out, h.option, REP_ACK, &[]);
                // The client may already have closed: that is fine.
                let _ = io.write_all(&out).await;
                let _ = io.flush().await;
                return Ok(None);
            }
            OPT_LIST => {
                if data.is_empty() {
                    for e in exports.list() {
                        encode_rep_server(&mut out, h.option, e.name());
                    }
                    encode_option_reply(&mut out, h.option, REP_ACK, &[]);
                } else {
                    encode_option_error(&mut out, h.option, REP_ERR_INVALID, "LIST takes no data");
                }
            }
            OPT_INFO | OPT_GO => {
                if let Some(export) = info(&mut out, h.option, &data, exports, &st) {
                    if h.option == OPT_GO {
                        io.write_all(&out).await?;
                        io.flush().await?;
                        return Ok(Some(st.negotiated(&export)));
                    }
                }
            }
            OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    st.structured = true;
                    encode_option_reply(&mut out, h.option, REP_ACK, &[]);
                } else {
                    encode_option_error(
                        &mut out,
                        h.option,
                        REP_ERR_INVALID,
                        "STRUCTURED_REPLY takes no data",
                    );
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                meta_context(&mut out, h.option, &data, exports, &mut st);
            }
            _ => {
                // Includes STARTTLS and EXTENDED_HEADERS: clients fall
                // back (plain text, compact headers) on ERR_UNSUP.
                encode_option_error(
                    &mut out,
                    h.option,
                    REP_ERR_UNSUP,
                    &format!("option {} is not supported", h.option),
                );
            }
        }
        io.write_all(&out).await?;
        io.flush().await?;
    }
}

/// Reads and drops `n` bytes without allocating them.
pub(crate) async fn skip<R: AsyncRead + Unpin>(r: &mut R, n: u64) -> std::io::Result<()> {
    let copied = tokio::io::copy(&mut r.take(n), &mut tokio::io::sink()).await?;
    if copied < n {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Answers INFO/GO into `out`; returns the export on success.
fn info(
    out: &mut Vec<u8>,
    option: u32,
    data: &[u8],
    exports: &ExportSet,
    st: &State,
) -> Option<Arc<Export>> {
    let req = match parse_info_request(data) {
        Ok(r) => r,
        Err(e) => {
            encode_option_error(out, option, REP_ERR_INVALID, &e.to_string());
            return None;
        }
    };
    let Some(export) = exports.get(req.name) else {
        encode_option_error(
            out,
            option,
            REP_ERR_UNKNOWN,
            &format!("no export named '{}'", req.name),
        );
        return None;
    };
    encode_info_export(
        out,
        option,
        export.size(),
        export.transmission_flags(st.structured),
    );
    // Sent whether asked or not (as qemu-nbd does): the 32 MiB maximum is
    // tighter than the protocol's default, so clients should know it.
    encode_info_block_size(out, option, 1, PREFERRED_BLOCK, MAX_PAYLOAD);
    if req.requests.contains(&INFO_NAME) {
        encode_info_string(out, option, INFO_NAME, export.name());
    }
    if req.requests.contains(&INFO_DESCRIPTION) {
        if let Some(d) = export.description() {
            encode_info_string(out, option, INFO_DESCRIPTION, d);
        }
    }
    encode_option_reply(out, option, REP_ACK, &[]);
    Some(export)
}

/// Answers LIST_META_CONTEXT / SET_META_CONTEXT into `out`.
fn meta_context(out: &mut Vec<u8>, option: u32, data: &[u8], exports: &ExportSet, st: &mut State) {
    let set = option == OPT_SET_META_CONTEXT;
    if set {
        // A SET replaces the selection even when it fails.
        st.meta = None;
    }
    if !st.structured {
        encode_option_error(
            out,
            option,
            REP_ERR_INVALID,
            "negotiate structured replies first",
        );
        return;
    }
    let req = match parse_meta_context_request(data) {
        Ok(r) => r,
        Err(e) => {
            encode_option_error(out, option, REP_ERR_INVALID, &e.to_string());
            return;
        }
    };
    let Some(export) = exports.get(req.export) else {
        encode_option_error(
            out,
            option,
            REP_ERR_UNKNOWN,
            &format!("no export named '{}'", req.export),
        );
        return;
    };
    let matches = if set {
        // "base:" alone selects nothing; unknown names are ignored.
        req.queries.contains(&proto::BASE_ALLOCATION)
    } else {
        req.queries.is_empty()
            || req
                .queries
                .iter()
                .any(|q| *q == "base:" || *q == proto::BASE_ALLOCATION)
    };
    if matches {
        // Ids in LIST replies are reserved: zero.
        let id = if set { BASE_ALLOCATION_ID } else { 0 };
        encode_meta_context(out, option, id, proto::BASE_ALLOCATION);
    }
    encode_option_reply(out, option, REP_ACK, &[]);
    if set {
        st.meta = Some((export.clone(), matches));
    }
}
