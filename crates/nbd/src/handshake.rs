//! The fixed-newstyle handshake: greeting, client flags and option
//! haggling, up to the choice of an export.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::command::MAX_PAYLOAD;
use crate::export::{Export, BASE_ALLOCATION_ID};
use crate::exports::ExportSet;
use crate::proto::{self, *};
use crate::tls::{TlsCredentials, TlsIo};
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

/// The client's stream once the handshake is over: as accepted, or
/// wrapped in the TLS session that `NBD_OPT_STARTTLS` started.
pub(crate) enum Stream<S> {
    /// No TLS.
    Plain(S),
    /// TLS. Bytes the client sent after its last option may already sit
    /// decrypted in the session's buffer: keep reading through it.
    Tls(Box<dyn TlsIo>),
}

/// Runs the handshake. `Ok(None)` means the client ended it (ABORT).
///
/// With `tls`, the server is in the protocol's FORCEDTLS mode: before
/// `NBD_OPT_STARTTLS` every option but STARTTLS and ABORT is refused with
/// `NBD_REP_ERR_TLS_REQD` (`NBD_OPT_EXPORT_NAME`, which cannot be refused,
/// closes the connection); after it, the TLS handshake runs on the same
/// stream and option haggling starts over inside TLS.
///
/// Reads are unbuffered on purpose: the client may send its first
/// requests right after `NBD_OPT_GO`, and those bytes must stay in the
/// socket (or the TLS session) for the transmission phase.
pub(crate) async fn handshake<S>(
    mut io: S,
    exports: &ExportSet,
    tls: Option<&TlsCredentials>,
) -> Result<Option<(Negotiated, Stream<S>)>, ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    io.write_all(&encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES))
        .await?;
    io.flush().await?;
    let client = parse_client_flags(io.read_u32().await?)?;
    let Some(tls) = tls else {
        // Clients that do not set FIXED_NEWSTYLE are still answered in
        // fixed newstyle: the spec allows it, and such clients only send
        // EXPORT_NAME, which has no reply to confuse them.
        let negotiated = haggle(&mut io, exports, client, false).await?;
        return Ok(negotiated.map(|n| (n, Stream::Plain(io))));
    };
    if !client.fixed_newstyle {
        // Such a client cannot send STARTTLS, and the spec forbids TLS
        // without fixed newstyle: nothing it can send would be served.
        return Err(ConnError::Refused(
            "TLS is required and the client does not speak fixed newstyle".into(),
        ));
    }
    if !before_tls(&mut io).await? {
        return Ok(None);
    }
    let mut io = tls
        .accept(io)
        .await
        .map_err(|e| ConnError::Refused(format!("TLS handshake failed: {e}")))?;
    let negotiated = haggle(&mut io, exports, client, true).await?;
    Ok(negotiated.map(|n| (n, Stream::Tls(io))))
}

/// Option haggling before TLS in FORCEDTLS mode. `Ok(true)` once
/// STARTTLS was acknowledged (the TLS handshake comes next), `Ok(false)`
/// on ABORT.
async fn before_tls<S>(io: &mut S) -> Result<bool, ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let mut hdr = [0u8; OPTION_HEADER_LEN];
        io.read_exact(&mut hdr).await?;
        let h = parse_option_header(&hdr)?;
        if h.option == OPT_EXPORT_NAME {
            // It cannot be answered with an error: the spec says close.
            return Err(ConnError::Refused(
                "NBD_OPT_EXPORT_NAME before TLS on a server that requires TLS".into(),
            ));
        }
        if h.length > MAX_OPTION_SKIP {
            return Err(ConnError::Refused(format!(
                "option {} with {} bytes of data before TLS",
                h.option, h.length
            )));
        }
        // No option before TLS needs its data.
        skip(io, u64::from(h.length)).await?;
        let mut out = Vec::new();
        match h.option {
            OPT_ABORT => {
                encode_option_reply(&mut out, h.option, REP_ACK, &[]);
                // The client may already have closed: that is fine.
                let _ = io.write_all(&out).await;
                let _ = io.flush().await;
                return Ok(false);
            }
            OPT_STARTTLS if h.length == 0 => {
                encode_option_reply(&mut out, h.option, REP_ACK, &[]);
                io.write_all(&out).await?;
                io.flush().await?;
                return Ok(true);
            }
            OPT_STARTTLS => {
                encode_option_error(
                    &mut out,
                    h.option,
                    REP_ERR_INVALID,
                    "STARTTLS takes no data",
                );
            }
            _ => {
                encode_option_error(
                    &mut out,
                    h.option,
                    REP_ERR_TLS_REQD,
                    "this server requires TLS: send NBD_OPT_STARTTLS first",
                );
            }
        }
        io.write_all(&out).await?;
        io.flush().await?;
    }
}

/// Option haggling up to the choice of an export; `in_tls` once TLS is
/// running. `Ok(None)` on ABORT.
async fn haggle<S>(
    io: &mut S,
    exports: &ExportSet,
    client: ClientFlags,
    in_tls: bool,
) -> Result<Option<Negotiated>, ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
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
            OPT_STARTTLS if in_tls => {
                encode_option_error(
                    &mut out,
                    h.option,
                    REP_ERR_INVALID,
                    "TLS is already running",
                );
            }
            _ => {
                // Includes STARTTLS without TLS credentials and
                // EXTENDED_HEADERS: clients fall back (plain text,
                // compact headers) on ERR_UNSUP.
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

#[cfg(test)]
mod tests {
    //! The option rules of TLS-required mode, spoken byte by byte over an
    //! in-memory stream, with a real rustls client for the TLS part and
    //! credentials made by the `openssl` command.

    use std::path::Path;
    use std::process::Command;

    use strata_disk::{create, CreateOptions, Disk, OpenOptions};
    use tokio::io::DuplexStream;
    use tokio::task::JoinHandle;
    use tokio_rustls::TlsConnector;

    use super::*;

    type Outcome = Result<Option<(Negotiated, Stream<DuplexStream>)>, ConnError>;

    /// A CA and a server certificate for 127.0.0.1 and localhost.
    fn credentials(dir: &Path) -> TlsCredentials {
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("the openssl command is needed for the TLS tests");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend(["-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2"]);
        ca.extend(["-subj", "/CN=test-ca"]);
        ca.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        ca.extend(["-addext", "keyUsage=critical,keyCertSign"]);
        openssl(&ca);
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", "server-key.pem", "-out", "server.csr"]);
        req.extend(["-subj", "/CN=localhost"]);
        openssl(&req);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-set_serial",
            "7",
            "-days",
            "2",
            "-out",
            "server-cert.pem",
            "-extfile",
            "server.ext",
        ]);
        TlsCredentials::load(dir, false).unwrap()
    }

    fn exports(dir: &Path) -> Arc<ExportSet> {
        let path = dir.join("disk.qcow2");
        create(
            &path,
            &CreateOptions {
                size: Some(1 << 20),
                ..CreateOptions::default()
            },
        )
        .unwrap();
        let disk = Arc::new(Disk::open(&path, &OpenOptions::read_write()).unwrap());
        Arc::new(ExportSet::new(vec![Export::new("disk", disk, false).unwrap()]).unwrap())
    }

    /// Starts the server's side; returns it and the client's end, past
    /// the greeting and the client flags.
    async fn start(
        dir: &Path,
        tls: Option<TlsCredentials>,
        flags: u32,
    ) -> (JoinHandle<Outcome>, DuplexStream) {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let exports = exports(dir);
        let task = tokio::spawn(async move { handshake(server, &exports, tls.as_ref()).await });
        let mut greeting = [0u8; GREETING_LEN];
        client.read_exact(&mut greeting).await.unwrap();
        client.write_u32(flags).await.unwrap();
        (task, client)
    }

    /// Sends an option and reads one reply: (reply type, payload).
    async fn ask<S: AsyncRead + AsyncWrite + Unpin>(
        io: &mut S,
        option: u32,
        data: &[u8],
    ) -> (u32, Vec<u8>) {
        io.write_all(&encode_option(option, data)).await.unwrap();
        io.flush().await.unwrap();
        reply(io, option).await
    }

    async fn reply<S: AsyncRead + Unpin>(io: &mut S, option: u32) -> (u32, Vec<u8>) {
        assert_eq!(io.read_u64().await.unwrap(), OPTION_REPLY_MAGIC);
        assert_eq!(io.read_u32().await.unwrap(), option);
        let kind = io.read_u32().await.unwrap();
        let mut payload = vec![0u8; io.read_u32().await.unwrap() as usize];
        io.read_exact(&mut payload).await.unwrap();
        (kind, payload)
    }

    fn connector(dir: &Path) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(dir.join("ca-cert.pem")).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        TlsConnector::from(Arc::new(config))
    }

    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};

    const FIXED: u32 = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;

    #[tokio::test]
    async fn options_before_tls_are_refused_and_export_name_closes() {
        let dir = tempfile::tempdir().unwrap();
        let creds = credentials(dir.path());
        let (task, mut c) = start(dir.path(), Some(creds), FIXED).await;
        let go = encode_info_request("disk", &[]);
        for (option, data) in [
            (OPT_LIST, &[][..]),
            (OPT_STRUCTURED_REPLY, &[]),
            (OPT_INFO, &go),
            (OPT_GO, &go),
            (OPT_EXTENDED_HEADERS, &[]),
            (99, b"unknown".as_slice()),
        ] {
            let (kind, message) = ask(&mut c, option, data).await;
            assert_eq!(kind, REP_ERR_TLS_REQD, "option {option}");
            assert!(String::from_utf8_lossy(&message).contains("STARTTLS"));
        }
        let (kind, _) = ask(&mut c, OPT_STARTTLS, b"x").await;
        assert_eq!(kind, REP_ERR_INVALID, "STARTTLS with data");
        c.write_all(&encode_option(OPT_EXPORT_NAME, b"disk"))
            .await
            .unwrap();
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Err(ConnError::Refused(_))));
        // Nothing was answered: the connection just closes.
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn abort_before_tls_is_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let creds = credentials(dir.path());
        let (task, mut c) = start(dir.path(), Some(creds), FIXED).await;
        assert_eq!(ask(&mut c, OPT_ABORT, &[]).await.0, REP_ACK);
        assert!(matches!(task.await.unwrap(), Ok(None)));
    }

    #[tokio::test]
    async fn client_without_fixed_newstyle_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let creds = credentials(dir.path());
        let (task, _c) = start(dir.path(), Some(creds), 0).await;
        assert!(matches!(task.await.unwrap(), Err(ConnError::Refused(_))));
    }

    #[tokio::test]
    async fn starttls_then_options_inside_tls_and_early_requests_kept() {
        let dir = tempfile::tempdir().unwrap();
        let creds = credentials(dir.path());
        let (task, mut c) = start(dir.path(), Some(creds), FIXED).await;
        assert_eq!(ask(&mut c, OPT_STARTTLS, &[]).await.0, REP_ACK);
        let name = ServerName::try_from("localhost").unwrap();
        let mut t = connector(dir.path()).connect(name, c).await.unwrap();
        // Haggling starts over inside TLS: no TLS_REQD any more.
        assert_eq!(ask(&mut t, OPT_STARTTLS, &[]).await.0, REP_ERR_INVALID);
        let (kind, _) = ask(&mut t, OPT_LIST, &[]).await;
        assert_eq!(kind, REP_SERVER);
        assert_eq!(reply(&mut t, OPT_LIST).await.0, REP_ACK);
        assert_eq!(ask(&mut t, OPT_STRUCTURED_REPLY, &[]).await.0, REP_ACK);
        // GO and a first request in one write, as fast clients do.
        let request = encode_request(&Request {
            flags: 0,
            command: CMD_READ,
            handle: 42,
            offset: 0,
            length: 512,
        });
        let mut both = encode_option(OPT_GO, &encode_info_request("disk", &[]));
        both.extend_from_slice(&request);
        t.write_all(&both).await.unwrap();
        t.flush().await.unwrap();
        loop {
            let (kind, _) = reply(&mut t, OPT_GO).await;
            if kind == REP_ACK {
                break;
            }
            assert_eq!(kind, REP_INFO);
        }
        let (neg, stream) = task.await.unwrap().unwrap().unwrap();
        assert_eq!(neg.export.name(), "disk");
        assert!(neg.structured);
        let Stream::Tls(mut s) = stream else {
            panic!("the session must be TLS")
        };
        let mut early = [0u8; REQUEST_LEN];
        s.read_exact(&mut early).await.unwrap();
        assert_eq!(early, request);
    }

    #[tokio::test]
    async fn garbage_instead_of_a_tls_handshake_fails() {
        let dir = tempfile::tempdir().unwrap();
        let creds = credentials(dir.path());
        let (task, mut c) = start(dir.path(), Some(creds), FIXED).await;
        assert_eq!(ask(&mut c, OPT_STARTTLS, &[]).await.0, REP_ACK);
        c.write_all(&[0x55; 512]).await.unwrap();
        let outcome = task.await.unwrap();
        assert!(
            matches!(&outcome, Err(ConnError::Refused(m)) if m.contains("TLS handshake")),
            "{:?}",
            outcome.err()
        );
    }

    #[tokio::test]
    async fn without_credentials_starttls_is_unsupported() {
        let dir = tempfile::tempdir().unwrap();
        let (task, mut c) = start(dir.path(), None, FIXED).await;
        assert_eq!(ask(&mut c, OPT_STARTTLS, &[]).await.0, REP_ERR_UNSUP);
        let (kind, _) = ask(&mut c, OPT_LIST, &[]).await;
        assert_eq!(kind, REP_SERVER);
        assert_eq!(reply(&mut c, OPT_LIST).await.0, REP_ACK);
        assert_eq!(ask(&mut c, OPT_ABORT, &[]).await.0, REP_ACK);
        assert!(matches!(task.await.unwrap(), Ok(None)));
    }
}
