//! Sending a file's bytes on a socket without copying them through user
//! space: `sendfile(2)` from the page cache straight to the socket, on a
//! non-blocking socket driven by tokio's readiness, so a client that
//! stops reading holds nothing but its own connection.

use std::os::fd::AsRawFd;
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Most bytes asked of one `sendfile` call: the task then yields to the
/// others on its worker instead of filling a deep socket buffer at once.
const MOST_PER_CALL: usize = 4 << 20;

/// How a zero-copy send ended short of its length.
#[derive(Debug)]
pub enum SendError {
    /// The socket took nothing for `stall`: the peer stopped reading.
    Stalled {
        /// Bytes sent before it stopped.
        sent: u64,
    },
    /// The socket or the file failed.
    Io(std::io::Error),
}

/// Sends up to `length` bytes of `file` from `offset` on `socket`, waiting
/// at most `stall` for the socket to take more each time it is full.
/// Returns the bytes sent: fewer than `length` only when the file ended
/// first (it was cut short under us).
pub async fn send_file(
    socket: &TcpStream,
    file: &std::fs::File,
    offset: u64,
    length: u64,
    stall: Duration,
) -> Result<u64, SendError> {
    let mut sent = 0u64;
    while sent < length {
        let want = (length - sent).min(MOST_PER_CALL as u64) as usize;
        match send_some(socket, file, offset + sent, want) {
            Ok(0) => break,
            Ok(n) => sent += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                match tokio::time::timeout(stall, socket.writable()).await {
                    Err(_) => return Err(SendError::Stalled { sent }),
                    Ok(Err(e)) => return Err(SendError::Io(e)),
                    Ok(Ok(())) => {}
                }
            }
            Err(e) => return Err(SendError::Io(e)),
        }
    }
    Ok(sent)
}

/// Sends what fits now, at most `want` bytes of `file` from `offset`, on
/// `socket` (one `sendfile` call, through tokio so that a full socket
/// clears its readiness). Also used by the scheduler to send one slice.
pub fn send_some(
    socket: &TcpStream,
    file: &std::fs::File,
    offset: u64,
    want: usize,
) -> std::io::Result<usize> {
    let offset = libc::off_t::try_from(offset).map_err(|_| {
        std::io::Error::other(format!("offset {offset} beyond what sendfile takes"))
    })?;
    socket.try_io(Interest::WRITABLE, || {
        let mut at = offset;
        // SAFETY: both descriptors are open for the call's duration (we
        // hold their owners), and `at` is a valid off_t we own.
        let n = unsafe { libc::sendfile(socket.as_raw_fd(), file.as_raw_fd(), &mut at, want) };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    })
}

/// Holds back partial frames on `socket` while `corked` (TCP_CORK), so a
/// body sent in several `sendfile` calls leaves in full-size segments,
/// as nginx's `tcp_nopush` does; uncorking sends what is held at once.
pub fn set_cork(socket: &TcpStream, corked: bool) {
    let value: libc::c_int = corked.into();
    // SAFETY: setsockopt on a socket we hold, with a c_int we own.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    }

    fn file_of(bytes: &[u8]) -> std::fs::File {
        let mut file = tempfile::tempfile().expect("a temporary file");
        file.write_all(bytes).expect("writing it");
        file
    }

    /// A connected pair: the tokio end that sends, the std end that reads.
    async fn pair() -> (TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let reader =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (sender, _) = listener.accept().expect("accept");
        sender.set_nonblocking(true).expect("non-blocking");
        (TcpStream::from_std(sender).expect("tokio stream"), reader)
    }

    #[test]
    fn the_range_asked_arrives_whole_and_exact() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let file = file_of(&data);
        runtime().block_on(async {
            let (sender, mut reader) = pair().await;
            let reading = std::thread::spawn(move || {
                let mut got = Vec::new();
                reader.read_to_end(&mut got).expect("reading");
                got
            });
            let sent = send_file(&sender, &file, 20, 2_500_000, Duration::from_secs(5))
                .await
                .expect("sent");
            assert_eq!(sent, 2_500_000);
            drop(sender);
            assert!(reading.join().expect("reader") == data[20..2_500_020]);
        });
    }

    #[test]
    fn a_file_cut_short_ends_the_send_early_and_says_how_much_went() {
        let file = file_of(&[5u8; 1000]);
        runtime().block_on(async {
            let (sender, _reader) = pair().await;
            let sent = send_file(&sender, &file, 100, 5000, Duration::from_secs(5))
                .await
                .expect("sent");
            assert_eq!(sent, 900);
        });
    }

    #[test]
    fn a_peer_that_stops_reading_is_given_up_after_the_stall_limit() {
        let file = file_of(&vec![1u8; 64 << 20]);
        runtime().block_on(async {
            let (sender, _reader) = pair().await;
            let started = std::time::Instant::now();
            let outcome = send_file(&sender, &file, 0, 64 << 20, Duration::from_millis(300)).await;
            let Err(SendError::Stalled { sent }) = outcome else {
                panic!("a peer that reads nothing took the whole file: {outcome:?}");
            };
            assert!(sent > 0 && sent < 64 << 20, "sent {sent}");
            let waited = started.elapsed();
            assert!(
                waited >= Duration::from_millis(300),
                "gave up after {waited:?}"
            );
        });
    }
}
