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
//! TLS is rustls with the `ring` backend, TLS 1.2 and 1.3. Pre-shared
//! keys (QEMU's `tls-creds-psk`) are not offered: rustls has no external
//! PSK support.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// The CA file, in QEMU's layout.
pub const CA_CERT: &str = "ca-cert.pem";
/// The server's certificate file, in QEMU's layout.
pub const SERVER_CERT: &str = "server-cert.pem";
/// The server's key file, in QEMU's layout.
pub const SERVER_KEY: &str = "server-key.pem";

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
    acceptor: TlsAcceptor,
    dir: PathBuf,
    verify_peer: bool,
}

impl fmt::Debug for TlsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsCredentials")
            .field("dir", &self.dir)
            .field("verify_peer", &self.verify_peer)
            .finish_non_exhaustive()
    }
}

impl TlsCredentials {
    /// Reads the credentials in `dir` (QEMU's `tls-creds-x509` layout).
    /// With `verify_peer`, clients must present a certificate that chains
    /// to `ca-cert.pem`; without, client certificates are not asked for.
    pub fn load(dir: &Path, verify_peer: bool) -> Result<TlsCredentials, TlsError> {
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
            acceptor: TlsAcceptor::from(Arc::new(config)),
            dir: dir.to_path_buf(),
            verify_peer,
        })
    }

    /// The directory the credentials came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether clients must present a certificate.
    pub fn verify_peer(&self) -> bool {
        self.verify_peer
    }

    pub(crate) fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }
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
