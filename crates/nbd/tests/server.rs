//! The server in process, on a loopback port, spoken to by a tiny
//! hand-written client: enough to prove the handshake, the commands and
//! the error paths. Real clients (qemu, libnbd, fio) are tested from the
//! `strata` binary's tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_disk::{create, CreateOptions, Disk, OpenOptions};
use strata_nbd::proto::*;
use strata_nbd::{Export, Server, ServerConfig, ShutdownHandle};

const SIZE: u64 = 4 << 20;

struct Running {
    addr: SocketAddr,
    handle: ShutdownHandle,
    done: std::sync::mpsc::Receiver<Result<(), String>>,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Running {
    fn stop(self) -> Result<(), String> {
        self.handle.shutdown();
        self.done
            .recv_timeout(Duration::from_secs(20))
            .expect("server did not stop")
    }
}

fn image(dir: &Path, name: &str) -> Arc<Disk> {
    image_of(dir, name, SIZE)
}

fn image_of(dir: &Path, name: &str, size: u64) -> Arc<Disk> {
    let path = dir.join(name);
    create(
        &path,
        &CreateOptions {
            size: Some(size),
            ..CreateOptions::default()
        },
    )
    .unwrap();
    Arc::new(Disk::open(&path, &OpenOptions::read_write()).unwrap())
}

fn start(read_only: bool, handshake_timeout: Duration) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let exports = vec![
        Export::new("disk", image(dir.path(), "a.qcow2"), read_only).unwrap(),
        Export::new("other", image(dir.path(), "b.qcow2"), read_only).unwrap(),
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ServerConfig {
        tcp: Some(("127.0.0.1".into(), 0)),
        handshake_timeout,
        ..ServerConfig::default()
    };
    let server = rt.block_on(Server::bind(exports, config)).unwrap();
    let addr = server.tcp_addr().unwrap();
    let handle = server.shutdown_handle();
    let (tx, done) = std::sync::mpsc::channel();
    rt.spawn(async move {
        let r = server.run().await.map_err(|e| e.to_string());
        let _ = tx.send(r);
    });
    Running {
        addr,
        handle,
        done,
        _rt: rt,
        _dir: dir,
    }
}

/// A minimal NBD client.
struct Client {
    s: TcpStream,
    structured: bool,
    /// Offset of each request in flight, to place read chunks.
    offsets: std::collections::HashMap<u64, u64>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut g = [0u8; GREETING_LEN];
        s.read_exact(&mut g).unwrap();
        let flags = parse_greeting(&g).unwrap();
        assert_eq!(flags, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        Client {
            s,
            structured: false,
            offsets: Default::default(),
        }
    }

    /// Sends an option; returns every reply up to the final one.
    fn opt(&mut self, option: u32, data: &[u8]) -> Vec<(u32, Vec<u8>)> {
        self.s.write_all(&encode_option(option, data)).unwrap();
        let mut out = Vec::new();
        loop {
            let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
            self.s.read_exact(&mut h).unwrap();
            let h = parse_option_reply_header(&h).unwrap();
            assert_eq!(h.option, option);
            let mut p = vec![0u8; h.length as usize];
            self.s.read_exact(&mut p).unwrap();
            let last = h.reply == REP_ACK || h.reply & REP_FLAG_ERROR != 0;
            out.push((h.reply, p));
            if last {
                return out;
            }
        }
    }

    /// Full negotiation: structured replies, base:allocation, GO.
    /// Returns (size, transmission flags).
    fn go(&mut self, name: &str, structured: bool) -> (u64, u16) {
        if structured {
            assert_eq!(self.opt(OPT_STRUCTURED_REPLY, &[]), vec![(REP_ACK, vec![])]);
            let r = self.opt(
                OPT_SET_META_CONTEXT,
                &encode_meta_context_request(name, &[BASE_ALLOCATION]),
            );
            assert_eq!(r.len(), 2);
            assert_eq!(r[0].0, REP_META_CONTEXT);
            assert_eq!(&r[0].1[4..], BASE_ALLOCATION.as_bytes());
            self.structured = true;
        }
        let r = self.opt(OPT_GO, &encode_info_request(name, &[INFO_BLOCK_SIZE]));
        assert_eq!(r.last().unwrap().0, REP_ACK, "{r:?}");
        let mut size_flags = None;
        let mut block = None;
        for (t, p) in &r[..r.len() - 1] {
            assert_eq!(*t, REP_INFO);
            match u16::from_be_bytes([p[0], p[1]]) {
                INFO_EXPORT => {
                    size_flags = Some((
                        u64::from_be_bytes(p[2..10].try_into().unwrap()),
                        u16::from_be_bytes([p[10], p[11]]),
                    ))
                }
                INFO_BLOCK_SIZE => {
                    block = Some((
                        u32::from_be_bytes(p[2..6].try_into().unwrap()),
                        u32::from_be_bytes(p[6..10].try_into().unwrap()),
                        u32::from_be_bytes(p[10..14].try_into().unwrap()),
                    ))
                }
                _ => {}
            }
        }
        assert_eq!(block, Some((1, 4096, 32 << 20)));
        size_flags.unwrap()
    }

    fn send(&mut self, command: u16, flags: u16, handle: u64, offset: u64, length: u32) {
        self.offsets.insert(handle, offset);
        self.s
            .write_all(&encode_request(&Request {
                flags,
                command,
                handle,
                offset,
                length,
            }))
            .unwrap();
    }

    /// Reads one whole reply: (handle, error, data chunks / block status).
    fn reply(&mut self, read_len: usize) -> Reply {
        if !self.structured {
            let mut h = [0u8; SIMPLE_REPLY_LEN];
            self.s.read_exact(&mut h).unwrap();
            let (error, handle) = parse_simple_reply(&h).unwrap();
            let mut data = Vec::new();
            if error == 0 && read_len > 0 {
                data = vec![0u8; read_len];
                self.s.read_exact(&mut data).unwrap();
            }
            return Reply {
                handle,
                error,
                data,
                holes: 0,
                extents: Vec::new(),
            };
        }
        let mut r = Reply {
            handle: 0,
            error: 0,
            data: vec![0u8; read_len],
            holes: 0,
            extents: Vec::new(),
        };
        loop {
            let mut h = [0u8; CHUNK_HEADER_LEN];
            self.s.read_exact(&mut h).unwrap();
            let h = parse_chunk_header(&h).unwrap();
            r.handle = h.handle;
            let mut p = vec![0u8; h.length as usize];
            self.s.read_exact(&mut p).unwrap();
            match h.kind {
                REPLY_TYPE_NONE => {}
                REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE => {
                    // Chunk offsets are absolute.
                    let off = u64::from_be_bytes(p[..8].try_into().unwrap());
                    let at = (off - self.offsets[&h.handle]) as usize;
                    if h.kind == REPLY_TYPE_OFFSET_DATA {
                        r.data[at..at + p.len() - 8].copy_from_slice(&p[8..]);
                    } else {
                        let n = u32::from_be_bytes(p[8..12].try_into().unwrap()) as usize;
                        r.data[at..at + n].fill(0);
                        r.holes += 1;
                    }
                }
                REPLY_TYPE_BLOCK_STATUS => {
                    let (ctx, ext) = parse_block_status(&p).unwrap();
                    assert_eq!(ctx, 1);
                    r.extents = ext;
                }
                REPLY_TYPE_ERROR => r.error = parse_error_payload(&p).unwrap().0,
                other => panic!("unexpected chunk type {other}"),
            }
            if h.flags & REPLY_FLAG_DONE != 0 {
                return r;
            }
        }
    }

    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

#[derive(Debug)]
struct Reply {
    handle: u64,
    error: u32,
    data: Vec<u8>,
    holes: usize,
    extents: Vec<Extent>,
}

#[test]
fn handshake_options() {
    let srv = start(false, Duration::from_secs(10));
    let mut c = Client::connect(srv.addr);
    let list = c.opt(OPT_LIST, &[]);
    let names: Vec<&[u8]> = list[..list.len() - 1]
        .iter()
        .map(|(t, p)| {
            assert_eq!(*t, REP_SERVER);
            &p[4..]
        })
        .collect();
    assert_eq!(names, vec![&b"disk"[..], &b"other"[..]]);
    assert_eq!(c.opt(OPT_LIST, b"x")[0].0, REP_ERR_INVALID);
    // Unknown options are refused and the handshake goes on.
    assert_eq!(c.opt(99, b"whatever")[0].0, REP_ERR_UNSUP);
    assert_eq!(c.opt(OPT_STARTTLS, &[])[0].0, REP_ERR_UNSUP);
    // Meta contexts need structured replies first.
    let r = c.opt(
        OPT_SET_META_CONTEXT,
        &encode_meta_context_request("disk", &[BASE_ALLOCATION]),
    );
    assert_eq!(r[0].0, REP_ERR_INVALID);
    assert_eq!(
        c.opt(OPT_INFO, &encode_info_request("nope", &[]))[0].0,
        REP_ERR_UNKNOWN
    );
    assert_eq!(c.opt(OPT_INFO, &[0, 0, 0, 9])[0].0, REP_ERR_INVALID);
    // Over-long option data: refused, and the stream stays in sync.
    assert_eq!(c.opt(OPT_INFO, &vec![0u8; 64 * 1024])[0].0, REP_ERR_TOO_BIG);
    c.opt(OPT_STRUCTURED_REPLY, &[]);
    let r = c.opt(
        OPT_LIST_META_CONTEXT,
        &encode_meta_context_request("disk", &[]),
    );
    assert_eq!(r[0].0, REP_META_CONTEXT);
    let r = c.opt(
        OPT_LIST_META_CONTEXT,
        &encode_meta_context_request("disk", &["qemu:dirty-bitmap:x"]),
    );
    assert_eq!(r, vec![(REP_ACK, vec![])]);
    let (size, flags) = c.go("other", false);
    assert_eq!(size, SIZE);
    for f in [
        FLAG_HAS_FLAGS,
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_SEND_FAST_ZERO,
        FLAG_CAN_MULTI_CONN,
        FLAG_SEND_DF,
    ] {
        assert_ne!(flags & f, 0, "flag {f:#x}");
    }
    assert_eq!(flags & FLAG_READ_ONLY, 0);

    // ABORT is acknowledged and the connection closes.
    let mut c = Client::connect(srv.addr);
    assert_eq!(c.opt(OPT_ABORT, &[]), vec![(REP_ACK, vec![])]);
    assert!(c.closed());
    srv.stop().unwrap();
}

#[test]
fn commands_and_errors() {
    let srv = start(false, Duration::from_secs(10));
    let mut c = Client::connect(srv.addr);
    c.go("disk", true);

    // Write a pattern, read it back.
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    c.send(CMD_WRITE, CMD_FLAG_FUA, 1, 1 << 20, 65536);
    c.s.write_all(&pattern).unwrap();
    let r = c.reply(0);
    assert_eq!((r.handle, r.error), (1, 0));
    c.send(CMD_READ, 0, 2, 1 << 20, 65536);
    let r = c.reply(65536);
    assert_eq!((r.handle, r.error), (2, 0));
    assert_eq!(r.data, pattern);

    // A long read over the data and a hole: the hole is not sent as data.
    c.send(CMD_READ, 0, 3, 1 << 20, 256 * 1024);
    let r = c.reply(256 * 1024);
    assert_eq!(r.error, 0);
    assert_eq!(&r.data[..65536], &pattern[..]);
    assert!(r.data[65536..].iter().all(|&b| b == 0));
    assert_eq!(r.holes, 1);

    // Block status: hole, data, hole.
    c.send(CMD_BLOCK_STATUS, 0, 4, 0, SIZE as u32);
    let r = c.reply(0);
    assert_eq!(r.error, 0);
    let got: Vec<(u32, u32)> = r.extents.iter().map(|e| (e.length, e.flags)).collect();
    assert_eq!(
        got,
        vec![
            (1 << 20, STATE_HOLE | STATE_ZERO),
            (65536, 0),
            ((SIZE - (1 << 20) - 65536) as u32, STATE_HOLE | STATE_ZERO)
        ]
    );
    c.send(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 5, 0, SIZE as u32);
    assert_eq!(c.reply(0).extents.len(), 1);

    // Fast zero of whole clusters works (zero clusters); with NO_HOLE it
    // cannot be fast.
    c.send(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 6, 1 << 20, 65536);
    assert_eq!(c.reply(0).error, 0);
    c.send(
        CMD_WRITE_ZEROES,
        CMD_FLAG_FAST_ZERO | CMD_FLAG_NO_HOLE,
        7,
        0,
        65536,
    );
    assert_eq!(c.reply(0).error, ENOTSUP);
    c.send(CMD_READ, 0, 8, 1 << 20, 4096);
    assert!(c.reply(4096).data.iter().all(|&b| b == 0));

    // Errors, each followed by a request that still works.
    c.send(CMD_READ, 0, 9, SIZE - 512, 1024);
    assert_eq!(c.reply(1024).error, EINVAL);
    c.send(CMD_WRITE, 0, 10, SIZE, 512);
    c.s.write_all(&[0u8; 512]).unwrap();
    assert_eq!(c.reply(0).error, ENOSPC);
    c.send(CMD_READ, 0, 11, 0, (32 << 20) + 1);
    assert_eq!(c.reply(0).error, EINVAL);
    c.send(42, 0, 12, 0, 0);
    assert_eq!(c.reply(0).error, EINVAL);
    c.send(CMD_READ, CMD_FLAG_NO_HOLE, 13, 0, 512);
    assert_eq!(c.reply(0).error, EINVAL);
    c.send(CMD_FLUSH, 0, 14, 0, 0);
    assert_eq!(c.reply(0).error, 0);
    c.send(CMD_TRIM, 0, 15, 0, SIZE as u32);
    assert_eq!(c.reply(0).error, 0);

    // Many requests in flight; every one answered once.
    for h in 100..164u64 {
        c.send(CMD_READ, 0, h, (h - 100) * 4096, 4096);
    }
    let mut seen: Vec<u64> = (0..64).map(|_| c.reply(4096).handle).collect();
    seen.sort();
    assert_eq!(seen, (100..164).collect::<Vec<_>>());

    // Many writes in flight: their small replies are batched by whichever
    // thread holds the socket; each is still sent once, whole, and the
    // data is all there.
    // Bursts of 16, each answered before the next is sent: a reply left
    // in the queue after a burst would never be sent (the client's read
    // times out).
    for burst in (200..456u64).collect::<Vec<_>>().chunks(16) {
        for &h in burst {
            c.send(CMD_WRITE, 0, h, (h - 200) * 4096, 4096);
            c.s.write_all(&[(h % 251) as u8; 4096]).unwrap();
        }
        let mut seen: Vec<u64> = burst
            .iter()
            .map(|_| {
                let r = c.reply(0);
                assert_eq!(r.error, 0, "handle {}", r.handle);
                r.handle
            })
            .collect();
        seen.sort();
        assert_eq!(seen, burst);
    }
    for h in 200..456u64 {
        c.send(CMD_READ, 0, h, (h - 200) * 4096, 4096);
        let r = c.reply(4096);
        assert!(r.data.iter().all(|&b| b == (h % 251) as u8), "write {h}");
    }

    c.send(CMD_DISC, 0, 99, 0, 0);
    assert!(c.closed());
    srv.stop().unwrap();
}

#[test]
fn read_only_and_simple_replies() {
    let srv = start(true, Duration::from_secs(10));
    let mut c = Client::connect(srv.addr);
    let (_, flags) = c.go("", false);
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    assert_eq!(flags & (FLAG_SEND_TRIM | FLAG_SEND_DF), 0);
    c.send(CMD_WRITE, 0, 1, 0, 4096);
    c.s.write_all(&[1u8; 4096]).unwrap();
    assert_eq!(c.reply(0).error, EPERM);
    c.send(CMD_TRIM, 0, 2, 0, 4096);
    assert_eq!(c.reply(0).error, EPERM);
    // Block status without a negotiated context.
    c.send(CMD_BLOCK_STATUS, 0, 3, 0, 4096);
    assert_eq!(c.reply(0).error, EINVAL);
    c.send(CMD_READ, 0, 4, 0, 4096);
    let r = c.reply(4096);
    assert_eq!((r.handle, r.error, r.data.len()), (4, 0, 4096));
    srv.stop().unwrap();
}

#[test]
fn bad_clients_do_not_hurt_others() {
    let srv = start(false, Duration::from_millis(500));

    // Stalls before sending anything: dropped after the timeout...
    let mut stalled = Client::connect(srv.addr);
    // ...while another client is served meanwhile.
    let mut good = Client::connect(srv.addr);
    good.go("disk", false);

    // Unknown client flags: the server closes.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    let mut g = [0u8; GREETING_LEN];
    s.read_exact(&mut g).unwrap();
    s.write_all(&0x8000_0000u32.to_be_bytes()).unwrap();
    assert!(matches!(s.read(&mut g), Ok(0) | Err(_)));

    // Garbage instead of an option.
    let mut c = Client::connect(srv.addr);
    c.s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert!(c.closed());

    // Bad request magic: that connection ends.
    let mut c = Client::connect(srv.addr);
    c.go("disk", true);
    c.s.write_all(&[0xffu8; REQUEST_LEN]).unwrap();
    assert!(c.closed());

    // A write over the maximum size: an error reply, then the close.
    let mut c = Client::connect(srv.addr);
    c.go("disk", false);
    c.send(CMD_WRITE, 0, 7, 0, 64 << 20);
    let r = c.reply(0);
    assert_eq!((r.handle, r.error), (7, EINVAL));
    assert!(c.closed());

    let started = Instant::now();
    assert!(stalled.closed());
    assert!(started.elapsed() < Duration::from_secs(5));

    // The good client was never disturbed.
    good.send(CMD_READ, 0, 1, 0, 512);
    assert_eq!(good.reply(512).error, 0);
    srv.stop().unwrap();
}

#[test]
fn shutdown_finishes_and_closes() {
    let srv = start(false, Duration::from_secs(10));
    let mut c = Client::connect(srv.addr);
    c.go("disk", false);
    c.send(CMD_WRITE, 0, 1, 0, 4096);
    c.s.write_all(&[5u8; 4096]).unwrap();
    assert_eq!(c.reply(0).error, 0);
    let idle = Client::connect(srv.addr);
    srv.stop().unwrap();
    assert!(c.closed());
    drop(idle);
}

/// Reads until the server closes the connection; false if it is still
/// open after `within` or sent more than `limit` bytes.
fn closes_within(s: &mut TcpStream, within: Duration, limit: usize) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    while Instant::now() < deadline && total <= limit {
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => total += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// Writes 32 MiB at `offset` from a new client; the time its reply took.
fn write_32_mib(addr: SocketAddr, offset: u64, fill: u8) -> Duration {
    let started = Instant::now();
    let mut c = Client::connect(addr);
    c.go("disk", false);
    c.send(CMD_WRITE, 0, 1, offset, 32 << 20);
    c.s.write_all(&vec![fill; 32 << 20]).unwrap();
    let r = c.reply(0);
    assert_eq!((r.handle, r.error), (1, 0), "the 32 MiB write failed");
    c.send(CMD_READ, 0, 2, offset + (16 << 20), 4096);
    let r = c.reply(4096);
    assert_eq!(r.error, 0);
    assert!(r.data.iter().all(|b| *b == fill), "the write did not land");
    started.elapsed()
}

#[test]
fn stalled_clients_cannot_pin_the_buffer_budget() {
    const STALL: Duration = Duration::from_secs(1);
    let dir = tempfile::tempdir().unwrap();
    let exports =
        vec![Export::new("disk", image_of(dir.path(), "big.qcow2", 64 << 20), false).unwrap()];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ServerConfig {
        tcp: Some(("127.0.0.1".into(), 0)),
        // Room for one request of the largest size at a time.
        buffer_budget: 32 << 20,
        stall_timeout: STALL,
        ..ServerConfig::default()
    };
    let server = rt.block_on(Server::bind(exports, config)).unwrap();
    let addr = server.tcp_addr().unwrap();
    let handle = server.shutdown_handle();
    let done = rt.spawn(server.run());

    // Announces a 32 MiB write, sends 1 MiB of it and stops: it holds the
    // whole budget.
    let mut halfway = Client::connect(addr);
    halfway.go("disk", false);
    halfway.send(CMD_WRITE, 0, 1, 0, 32 << 20);
    halfway.s.write_all(&vec![0x55; 1 << 20]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Another client's write waits for the budget, and goes through once
    // the stalled client is dropped.
    let took = write_32_mib(addr, 32 << 20, 0x66);
    assert!(
        took < STALL * 4,
        "a write waited {took:?} behind a client stalled mid-payload (stall timeout {STALL:?})"
    );
    assert!(closes_within(&mut halfway.s, Duration::from_secs(5), 0));

    // Asks for 32 MiB and reads none of it: its reply holds the budget
    // until the server gives up on writing it.
    let mut deaf = Client::connect(addr);
    deaf.go("disk", false);
    deaf.send(CMD_READ, 0, 1, 0, 32 << 20);
    std::thread::sleep(Duration::from_millis(200));
    let took = write_32_mib(addr, 32 << 20, 0x77);
    assert!(
        took < STALL * 4,
        "a write waited {took:?} behind a client that reads no reply (stall timeout {STALL:?})"
    );
    assert!(closes_within(&mut deaf.s, Duration::from_secs(5), 33 << 20));

    handle.shutdown();
    rt.block_on(done).unwrap().unwrap();
}
