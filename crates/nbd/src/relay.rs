//! The transmission phase of a TLS connection.
//!
//! The transmission loop does blocking I/O on a std socket from its own
//! threads. Rather than teach it TLS, a TLS connection gets a Unix socket
//! pair: the loop serves one end as it would any client, and a task
//! relays between the other end and the TLS session, encrypting and
//! decrypting. The session moves into the relay as it is, so bytes the
//! client sent right after its last option, already decrypted and
//! buffered in the session, are the first the loop reads.

use std::io::ErrorKind;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::handshake::Negotiated;
use crate::transmission::{self, Limits, Socket};

/// Bytes moved per read, each way. More than a TLS record (16 KiB), so a
/// large read reply crosses in few steps.
const CHUNK: usize = 256 * 1024;

/// Once the transmission loop has closed its end, how long the relay may
/// still take to pass on the last replies and see the client close. A
/// client that neither reads nor closes is cut off after it.
const LINGER: Duration = Duration::from_secs(10);

/// Serves the transmission phase over `tls` until the client leaves or
/// the server shuts down, as [`transmission::serve`] does for a plain
/// socket.
pub(crate) async fn serve<S>(
    tls: S,
    neg: Negotiated,
    shutdown: watch::Receiver<bool>,
    peer: String,
    limits: Limits,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (inner, outer) = match socket_pair() {
        Ok(pair) => pair,
        Err(e) => {
            tracing::warn!(peer, "cannot relay the TLS connection: {e}");
            return;
        }
    };
    let transmit = transmission::serve(Socket::Unix(inner), neg, shutdown, peer.clone(), limits);
    let relayed = relay(tls, outer);
    tokio::pin!(transmit, relayed);
    tokio::select! {
        r = &mut relayed => {
            // The client is gone or broke TLS: the relay's end is closed
            // now, so the loop sees the connection end and finishes.
            if let Err(e) = r {
                tracing::info!(peer, "TLS connection failed: {e}");
            }
            transmit.await;
        }
        () = &mut transmit => {
            match tokio::time::timeout(LINGER, relayed).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::info!(peer, "TLS connection failed: {e}"),
                Err(_) => tracing::info!(
                    peer,
                    "TLS client did not close within {LINGER:?} of the end: cut off"
                ),
            }
        }
    }
}

/// The loop's end (blocking) and the relay's end (on tokio).
fn socket_pair() -> std::io::Result<(StdUnixStream, UnixStream)> {
    let (inner, outer) = StdUnixStream::pair()?;
    outer.set_nonblocking(true)?;
    Ok((inner, UnixStream::from_std(outer)?))
}

/// Copies both ways between the TLS session and the local socket until
/// both directions have ended. An error on either side ends both.
async fn relay<S>(tls: S, local: UnixStream) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut tls_read, mut tls_write) = tokio::io::split(tls);
    let (mut local_read, mut local_write) = local.into_split();
    let inbound = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match tls_read.read(&mut buf).await {
                Ok(n) => n,
                // A client that closes TCP without TLS's close_notify:
                // take it as the end of its requests.
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => 0,
                Err(e) => return Err(e),
            };
            if n == 0 {
                // The loop finishes what is in flight, then closes.
                let _ = local_write.shutdown().await;
                return Ok(());
            }
            if local_write.write_all(&buf[..n]).await.is_err() {
                // The loop has closed: read on and drop what the client
                // still sends, so that closing does not reset the
                // connection before the last replies reach it.
                return drain(&mut tls_read, &mut buf).await;
            }
        }
    };
    let outbound = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = local_read.read(&mut buf).await?;
            if n == 0 {
                // Sends close_notify, then ends TCP's sending side.
                return tls_write.shutdown().await;
            }
            tls_write.write_all(&buf[..n]).await?;
            tls_write.flush().await?;
        }
    };
    tokio::try_join!(inbound, outbound)?;
    Ok(())
}

/// Reads until the end of the stream, dropping what comes.
async fn drain<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> std::io::Result<()> {
    loop {
        match r.read(buf).await {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}
