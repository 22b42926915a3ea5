//! TLS credentials for `NBD_OPT_STARTTLS`, read from a directory laid out
//! as QEMU's `tls-creds-x509` object (and `qemu-nbd --tls-creds`) expects:
//!
//! - `server-cert.pem`: the server's certificate (with any intermediate
//!   certificates after it);
//! - `server-key.pem`: its private key (PKCS#8, PKCS#1 or SEC1);
//! - `ca-cert.pem`: the certificate authorities that client certificates
//!   must chain to; read only when clients must present certificates
//!   (QEMU's `verify-peer`).
//!
//! or, for pre-shared keys, as QEMU's `tls-creds-psk` object expects:
//!
//! - `keys.psk`: one `IDENTITY:HEXKEY` line per client (GnuTLS's
//!   `psktool` format); a client proves it knows the key of the identity
//!   it names, and the server proves it knows it too.
//!
//! Certificates are served by rustls with the `ring` backend, TLS 1.2 and
//! 1.3. Pre-shared keys are served by OpenSSL (Debian's libssl), since
//! rustls has no external PSK support: TLS 1.3 with a PSK binder, or
//! TLS 1.2 with the ECDHE-PSK and PSK cipher suites, as GnuTLS clients
//! (QEMU, libnbd) offer them.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use openssl::ssl::{Ssl, SslContext, SslMethod, SslVersion};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_openssl::SslStream;
use tokio_rustls::TlsAcceptor;

/// The CA file, in QEMU's layout.
pub const CA_CERT: &str = "ca-cert.pem";
/// The server's certificate file, in QEMU's layout.
pub const SERVER_CERT: &str = "server-cert.pem";
/// The server's key file, in QEMU's layout.
pub const SERVER_KEY: &str = "server-key.pem";
/// The pre-shared keys file, in QEMU's `tls-creds-psk` layout.
pub const PSK_KEYS: &str = "keys.psk";

/// The largest `keys.psk` read: far more than any real list of clients,
/// and a bound on what a wrong path could make the server load.
const PSK_FILE_LIMIT: u64 = 1 << 20;
/// The longest identity and key accepted (OpenSSL's own limits are 256
/// and 512 bytes).
const PSK_IDENTITY_LIMIT: usize = 128;
const PSK_KEY_LIMIT: usize = 256;
/// TLS 1.2 suites offered with pre-shared keys, strongest first: the
/// ephemeral-key suites give forward secrecy; the plain PSK ones are what
/// GnuTLS offers when asked for `+PSK` only.
const PSK_TLS12_SUITES: &str = "ECDHE-PSK-CHACHA20-POLY1305:ECDHE-PSK-AES256-CBC-SHA384:\
    ECDHE-PSK-AES128-CBC-SHA256:PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256:\
    PSK-CHACHA20-POLY1305";

/// A TLS session over a client's stream, whichever library runs it.
pub(crate) trait TlsIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> TlsIo for T {}

/// Why TLS credentials could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A credentials file is missing, unreadable or holds no usable PEM.
    #[error("TLS credentials: {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The files were read but do not make a usable configuration (a key
    /// that does not match its certificate, say).
    #[error("TLS credentials in {dir}: {reason}")]
    Config {
        /// The credentials directory.
        dir: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// Loaded server credentials: every connection's TLS session is made
/// from them. Cheap to clone.
#[derive(Clone)]
pub struct TlsCredentials {
    acceptor: Acceptor,
    dir: PathBuf,
    verify_peer: bool,
}

/// The library that runs the sessions, by kind of credentials.
#[derive(Clone)]
enum Acceptor {
    /// Certificates, through rustls.
    X509(TlsAcceptor),
    /// Pre-shared keys, through OpenSSL.
    Psk(SslContext),
}

impl fmt::Debug for TlsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsCredentials")
            .field("dir", &self.dir)
            .field("psk", &self.uses_psk())
            .field("verify_peer", &self.verify_peer)
            .finish_non_exhaustive()
    }
}

impl TlsCredentials {
    /// Reads the credentials in `dir`: certificates when it holds
    /// `server-cert.pem` (QEMU's `tls-creds-x509` layout), else pre-shared
    /// keys when it holds `keys.psk` (`tls-creds-psk`).
    ///
    /// With certificates and `verify_peer`, clients must present a
    /// certificate that chains to `ca-cert.pem`; without, client
    /// certificates are not asked for. With pre-shared keys every client
    /// proves its key, so `verify_peer` changes nothing.
    pub fn load(dir: &Path, verify_peer: bool) -> Result<TlsCredentials, TlsError> {
        if !dir.join(SERVER_CERT).exists() && dir.join(PSK_KEYS).exists() {
            return Self::load_psk(dir, verify_peer);
        }
        if !dir.join(SERVER_CERT).exists() {
            return Err(TlsError::File {
                path: dir.join(SERVER_CERT),
                reason: format!(
                    "not found: the directory must hold {SERVER_CERT} and {SERVER_KEY} \
                     (QEMU's tls-creds-x509 layout) or {PSK_KEYS} (tls-creds-psk)"
                ),
            });
        }
        Self::load_x509(dir, verify_peer)
    }

    /// Certificates, through rustls.
    fn load_x509(dir: &Path, verify_peer: bool) -> Result<TlsCredentials, TlsError> {
        let certs = read_certs(&dir.join(SERVER_CERT))?;
        let key_path = dir.join(SERVER_KEY);
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| TlsError::File {
            reason: pem_reason(&e, "private key"),
            path: key_path,
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config_error = |reason: String| TlsError::Config {
            dir: dir.to_path_buf(),
            reason,
        };
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| config_error(e.to_string()))?;
        let builder = if verify_peer {
            let roots = read_roots(&dir.join(CA_CERT)).map_err(|e| match e {
                TlsError::File { path, reason } => TlsError::File {
                    path,
                    reason: format!("{reason} (it is needed to check client certificates)"),
                },
                other => other,
            })?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| config_error(format!("cannot check client certificates: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(certs, key).map_err(|e| {
            config_error(format!(
                "{SERVER_CERT} and {SERVER_KEY} do not make a usable pair: {e}"
            ))
        })?;
        Ok(TlsCredentials {
            acceptor: Acceptor::X509(TlsAcceptor::from(Arc::new(config))),
            dir: dir.to_path_buf(),
            verify_peer,
        })
    }

    /// Pre-shared keys, through OpenSSL.
    fn load_psk(dir: &Path, verify_peer: bool) -> Result<TlsCredentials, TlsError> {
        let keys = read_psk_keys(&dir.join(PSK_KEYS))?;
        let context = psk_context(keys).map_err(|e| TlsError::Config {
            dir: dir.to_path_buf(),
            reason: format!("OpenSSL refused the pre-shared key setup: {e}"),
        })?;
        Ok(TlsCredentials {
            acceptor: Acceptor::Psk(context),
            dir: dir.to_path_buf(),
            verify_peer,
        })
    }

    /// Whether the credentials are pre-shared keys (else certificates).
    pub fn uses_psk(&self) -> bool {
        matches!(self.acceptor, Acceptor::Psk(_))
    }

    /// The directory the credentials came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether clients must present a certificate.
    pub fn verify_peer(&self) -> bool {
        self.verify_peer
    }

    /// Runs the server's side of a TLS handshake on `io`.
    pub(crate) async fn accept<S>(&self, io: S) -> Result<Box<dyn TlsIo>, String>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match &self.acceptor {
            Acceptor::X509(acceptor) => match acceptor.accept(io).await {
                Ok(session) => Ok(Box::new(session)),
                Err(e) => Err(e.to_string()),
            },
            Acceptor::Psk(context) => {
                let ssl = Ssl::new(context).map_err(|e| e.to_string())?;
                let mut session = SslStream::new(ssl, io).map_err(|e| e.to_string())?;
                Pin::new(&mut session)
                    .accept()
                    .await
                    .map_err(|e| psk_failure(&e))?;
                Ok(Box::new(session))
            }
        }
    }
}

/// Says why a pre-shared-key handshake failed. OpenSSL's own text for a
/// client whose identity or key is wrong is a bare "no shared cipher" or
/// an internal error code.
fn psk_failure(e: &openssl::ssl::Error) -> String {
    match e.ssl_error() {
        Some(stack) => format!(
            "{stack} (with pre-shared keys this means the client named an identity \
             missing from {PSK_KEYS}, holds another key, or offered no PSK suite)"
        ),
        None => e.to_string(),
    }
}

/// The OpenSSL context for pre-shared keys: TLS 1.2 and 1.3, no
/// certificate, the key looked up by the identity the client names.
fn psk_context(keys: HashMap<Vec<u8>, Vec<u8>>) -> Result<SslContext, openssl::error::ErrorStack> {
    let mut builder = SslContext::builder(SslMethod::tls_server())?;
    builder.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    builder.set_cipher_list(PSK_TLS12_SUITES)?;
    builder.set_psk_server_callback(move |_ssl, identity, key_out| {
        // An unknown identity gets length 0, which OpenSSL turns into a
        // failed handshake; it never learns whether the name exists.
        let Some(key) = identity.and_then(|name| keys.get(name)) else {
            return Ok(0);
        };
        if key.len() > key_out.len() {
            return Ok(0);
        }
        key_out[..key.len()].copy_from_slice(key);
        Ok(key.len())
    });
    Ok(builder.build())
}

/// Reads `keys.psk`: `IDENTITY:HEXKEY` lines, as GnuTLS's `psktool`
/// writes them. Blank lines are skipped; anything else malformed is an
/// error naming its line.
fn read_psk_keys(path: &Path) -> Result<HashMap<Vec<u8>, Vec<u8>>, TlsError> {
    let file_error = |reason: String| TlsError::File {
        path: path.to_path_buf(),
        reason,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| file_error(format!("cannot read it: {e}")))?
        .len();
    if size > PSK_FILE_LIMIT {
        return Err(file_error(format!(
            "{size} bytes, more than the {PSK_FILE_LIMIT} a key list may hold"
        )));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| file_error(format!("cannot read it: {e}")))?;
    let mut keys = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (identity, key) = parse_psk_line(line)
            .map_err(|reason| file_error(format!("line {}: {reason}", index + 1)))?;
        keys.insert(identity, key);
    }
    if keys.is_empty() {
        return Err(file_error(
            "holds no key: write IDENTITY:HEXKEY lines, e.g. with `psktool -u NAME -p FILE`".into(),
        ));
    }
    Ok(keys)
}

/// One `IDENTITY:HEXKEY` line.
fn parse_psk_line(line: &str) -> Result<(Vec<u8>, Vec<u8>), String> {
    let (identity, hex) = line
        .split_once(':')
        .ok_or("not IDENTITY:HEXKEY (no colon)")?;
    if identity.is_empty() || identity.len() > PSK_IDENTITY_LIMIT {
        return Err(format!(
            "the identity must have 1 to {PSK_IDENTITY_LIMIT} bytes"
        ));
    }
    let key = decode_hex(hex.trim()).ok_or("the key is not an even number of hex digits")?;
    if key.is_empty() || key.len() > PSK_KEY_LIMIT {
        return Err(format!("the key must have 1 to {PSK_KEY_LIMIT} bytes"));
    }
    Ok((identity.as_bytes().to_vec(), key))
}

/// Hex digits to bytes; `None` for an odd count or a non-hex digit.
fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.as_bytes()
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(text, 16).ok()
        })
        .collect()
}

/// Every certificate in a PEM file; at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |reason: String| TlsError::File {
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(pem_reason(&e, "certificate")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(pem_reason(&e, "certificate")))?;
    if certs.is_empty() {
        return Err(file_error("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// The trust anchors for client certificates.
fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::File {
            path: path.to_path_buf(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

/// Says what was wrong with a PEM file, for a person.
fn pem_reason(e: &rustls_pki_types::pem::Error, what: &str) -> String {
    match e {
        rustls_pki_types::pem::Error::Io(io) => format!("cannot read it: {io}"),
        rustls_pki_types::pem::Error::NoItemsFound => format!("holds no PEM {what}"),
        other => format!("not valid PEM: {other}"),
    }
}
