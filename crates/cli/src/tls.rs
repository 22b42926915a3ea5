//! TLS flags of the NBD servers (`strata serve`, `strata daemon`), named
//! as qemu-nbd names them, and the rule that NBD beyond loopback needs TLS
//! unless forced.

use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use strata_nbd::TlsCredentials;

/// TLS for NBD clients.
#[derive(Args, Debug, Default)]
pub struct TlsArgs {
    /// Require TLS, with the credentials in DIR laid out as for QEMU's
    /// tls-creds-x509 object (server-cert.pem, server-key.pem, and
    /// ca-cert.pem for --tls-verify-peer) or its tls-creds-psk object
    /// (keys.psk, IDENTITY:HEXKEY lines). Clients connect as with
    /// qemu-nbd --tls-creds (qemu's tls-creds=, libnbd's nbds://).
    #[arg(long = "tls-creds", value_name = "DIR", value_parser = crate::stdio::directory())]
    tls_creds: Option<PathBuf>,
    /// Require client certificates signed by DIR/ca-cert.pem (QEMU's
    /// verify-peer).
    #[arg(long = "tls-verify-peer", requires = "tls_creds")]
    tls_verify_peer: bool,
    /// Serve NBD without TLS on an address beyond loopback: anyone who
    /// can reach it reads and writes the disks, in the clear.
    #[arg(long = "allow-plaintext", conflicts_with = "tls_creds")]
    allow_plaintext: bool,
}

impl TlsArgs {
    /// The credentials to serve with, loaded; `None` for plain text.
    /// `tcp_host` is the NBD TCP address (`None`: Unix socket only) and
    /// `bind_flag` the flag that set it, for the error message: plain text
    /// beyond loopback is refused unless `--allow-plaintext`.
    pub fn credentials(
        &self,
        tcp_host: Option<&str>,
        bind_flag: &str,
    ) -> Result<Option<TlsCredentials>> {
        if let Some(dir) = &self.tls_creds {
            let creds = TlsCredentials::load(dir, self.tls_verify_peer)
                .with_context(|| format!("--tls-creds {}", dir.display()))?;
            return Ok(Some(creds));
        }
        if let Some(host) = tcp_host {
            if !self.allow_plaintext && !is_loopback(host) {
                bail!(
                    "{bind_flag} {host} serves NBD beyond loopback without TLS, where anyone \
                     who can reach it reads and writes the disks: add --tls-creds DIR \
                     (server-cert.pem and server-key.pem, or keys.psk, as for qemu-nbd), or pass \
                     --allow-plaintext if the network is trusted"
                );
            }
        }
        Ok(None)
    }
}

/// Whether every address `host` names is a loopback address. A name that
/// does not resolve counts as not loopback.
fn is_loopback(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return ip.is_loopback();
    }
    match (bare, 0).to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback() {
        assert!(is_loopback("127.0.0.1"));
        assert!(is_loopback("127.1.2.3"));
        assert!(is_loopback("::1"));
        assert!(is_loopback("[::1]"));
        assert!(is_loopback("localhost"));
        assert!(!is_loopback("0.0.0.0"));
        assert!(!is_loopback("::"));
        assert!(!is_loopback("192.0.2.1"));
        assert!(!is_loopback("no-such-host.invalid"));
    }

    #[test]
    fn plaintext_beyond_loopback_is_refused() {
        let plain = TlsArgs::default();
        assert!(plain.credentials(Some("127.0.0.1"), "--bind").is_ok());
        assert!(plain.credentials(None, "--bind").is_ok());
        let err = plain
            .credentials(Some("0.0.0.0"), "--bind")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--tls-creds") && err.contains("--allow-plaintext"));
        let forced = TlsArgs {
            allow_plaintext: true,
            ..TlsArgs::default()
        };
        assert!(forced.credentials(Some("0.0.0.0"), "--bind").is_ok());
    }
}
