//! Reading and writing the TCP data frames ([`strata_store_protocol::data`])
//! on async streams: a storage node reads requests and writes error
//! replies; a client or a forwarding node reads reply statuses; a client
//! writes a Put's body and reads a Get's.

use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::data::{
    CodedObject, Incoming, Proof, Request, HEADER, MAX_SCHEDULE_TEXT, MODE_NONE, MODE_SEALED,
    MODE_TICKET,
};
use strata_store_protocol::key::TAG_LEN;
use strata_store_protocol::wire::{WireError, Writer, MAX_DATA_REPLICAS, MAX_OBJECT, MAX_TICKET};
use strata_store_protocol::{Code, Error};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes moved per read or write of an object's data.
const CHUNK: usize = 256 * 1024;

/// Reads one request header and its credentials from a stream.
/// `Ok(None)` on a clean EOF before the first byte.
pub async fn read_request<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Incoming>, Error> {
    let mut prefix = [0u8; HEADER];
    match r.read(&mut prefix[..1]).await {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(e) => return Err(Error::io("reading a data request", e)),
    }
    r.read_exact(&mut prefix[1..])
        .await
        .map_err(|e| Error::io("reading a data request header", e))?;
    let (kind, addr) = Request::decode_prefix(&prefix)
        .map_err(|e| Error::malformed("a data request's header", e))?;
    let req = match kind {
        1 => {
            let size = r
                .read_u64()
                .await
                .map_err(|e| Error::io("reading a Put size", e))?;
            if size > MAX_OBJECT {
                return Err(Error::malformed(
                    "a Put request's size",
                    WireError::Invalid(format!(
                        "Put of {size} bytes exceeds the {MAX_OBJECT}-byte object limit"
                    )),
                ));
            }
            let n = r
                .read_u8()
                .await
                .map_err(|e| Error::io("reading a Put chain", e))? as usize;
            if n >= MAX_DATA_REPLICAS {
                return Err(Error::malformed(
                    "a Put request's forward chain",
                    WireError::Invalid(format!(
                        "forward chain of {n} replicas; the limit is {}",
                        MAX_DATA_REPLICAS - 1
                    )),
                ));
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
        3 => Request::Free { addr },
        6 => {
            let io = |e| Error::io("reading a GetRange request", e);
            let offset = r.read_u64().await.map_err(io)?;
            let length = r.read_u64().await.map_err(io)?;
            strata_store_protocol::range::check_request(offset, length)
                .map_err(|why| Error::malformed("a GetRange request", WireError::Invalid(why)))?;
            Request::GetRange {
                addr,
                offset,
                length,
            }
        }
        5 => Request::GetObject {
            addr,
            object: read_coded_object(r, addr).await?,
        },
        _ => {
            let n = r
                .read_u16()
                .await
                .map_err(|e| Error::io("reading Schedule settings", e))?
                as usize;
            if n > MAX_SCHEDULE_TEXT {
                return Err(Error::malformed(
                    "a Schedule request's settings",
                    WireError::Invalid(format!(
                        "{n} bytes of settings; the limit is {MAX_SCHEDULE_TEXT}"
                    )),
                ));
            }
            let mut text = vec![0u8; n];
            r.read_exact(&mut text)
                .await
                .map_err(|e| Error::io("reading Schedule settings", e))?;
            let settings = String::from_utf8(text).map_err(|_| {
                Error::malformed(
                    "a Schedule request's settings",
                    WireError::Invalid("the settings are not UTF-8".into()),
                )
            })?;
            Request::Schedule { addr, settings }
        }
    };
    let io = |e| Error::io("reading a data request's credentials", e);
    let proof = match r.read_u8().await.map_err(io)? {
        MODE_NONE => Proof::None,
        MODE_SEALED => {
            let at = r.read_u64().await.map_err(io)?;
            let mut tag = [0u8; TAG_LEN];
            r.read_exact(&mut tag).await.map_err(io)?;
            Proof::Sealed { at, tag }
        }
        MODE_TICKET => {
            let n = r.read_u16().await.map_err(io)? as usize;
            if n > MAX_TICKET {
                return Err(Error::malformed(
                    "a data request's ticket",
                    WireError::Invalid(format!("ticket of {n} bytes; the limit is {MAX_TICKET}")),
                ));
            }
            let mut t = vec![0u8; n];
            r.read_exact(&mut t).await.map_err(io)?;
            Proof::Ticket(t)
        }
        m => {
            return Err(Error::malformed(
                "a data request's credentials",
                WireError::Invalid(format!("credential mode {m} (0 none, 1 sealed, 2 ticket)")),
            ))
        }
    };
    Ok(Some(Incoming { req, proof }))
}

/// Reads a GetObject's description of its object, bounded and checked
/// ([`CodedObject::check`]) before anything is allocated.
async fn read_coded_object<R: AsyncRead + Unpin>(
    r: &mut R,
    addr: Addr,
) -> Result<CodedObject, Error> {
    let io = |e| Error::io("reading a GetObject request", e);
    let size = r.read_u64().await.map_err(io)?;
    let crc = r.read_u32().await.map_err(io)?;
    let data = r.read_u8().await.map_err(io)?;
    let count = r.read_u8().await.map_err(io)? as usize;
    if count > MAX_DATA_REPLICAS || size > MAX_OBJECT {
        return Err(Error::malformed(
            "a GetObject request",
            WireError::Invalid(format!(
                "{count} fragments of an object of {size} bytes (at most \
                 {MAX_DATA_REPLICAS} fragments and {MAX_OBJECT} bytes)"
            )),
        ));
    }
    let mut fragments = Vec::with_capacity(count);
    for _ in 0..count {
        fragments.push((
            r.read_u128().await.map_err(io)?,
            r.read_u32().await.map_err(io)?,
        ));
    }
    let object = CodedObject {
        size,
        crc,
        data,
        fragments,
    };
    object
        .check(addr)
        .map_err(|why| Error::malformed("a GetObject request", WireError::Invalid(why)))?;
    Ok(object)
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
        code: Code::Unavailable,
        message: format!("{what}: {}", String::from_utf8_lossy(&msg)),
    })
}

/// Writes a Put's body after its header: `size` bytes read from `data`,
/// then their CRC-32C as the trailer, and flushes; returns the CRC.
/// `progress` is told how many bytes went out so far. Input that ends
/// early is an error, and no trailer is written: the node then discards
/// what it got.
pub async fn write_put_body<W: AsyncWrite + Unpin, R: AsyncRead + Unpin>(
    s: &mut W,
    size: u64,
    data: &mut R,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u32, Error> {
    let io = |e| Error::io("sending object data", e);
    let mut buf = vec![0u8; CHUNK];
    let mut crc = 0u32;
    let mut done = 0u64;
    while done < size {
        let want = (size - done).min(CHUNK as u64) as usize;
        let n = data
            .read(&mut buf[..want])
            .await
            .map_err(|e| Error::io("reading the input", e))?;
        if n == 0 {
            // Nothing more to send: the input is shorter than the size
            // the Put announced.
            return Err(Error::io(
                format!("the input ended after {done} of {size} bytes"),
                std::io::ErrorKind::UnexpectedEof.into(),
            ));
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        s.write_all(&buf[..n]).await.map_err(io)?;
        done += n as u64;
        progress(done);
    }
    s.write_all(&crc.to_be_bytes()).await.map_err(io)?;
    s.flush().await.map_err(io)?;
    Ok(crc)
}

/// Reads the body of a storage node's Get reply (after its status): the
/// size, which must be `size`, the data, streamed to `out`, and the
/// trailer. The node's flag must say the replica was whole, and the data
/// must match the CRC-32C `crc` the metadata records (the node sends its
/// data unchecked with `sendfile`: this is the end-to-end check);
/// `replica` names the replica in the errors. A wrong size or checksum is
/// [`Error::Corrupt`] (the replica is damaged), a stream that ends early
/// [`Error::Peer`].
pub async fn read_get_body<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    s: &mut R,
    replica: Addr,
    size: u64,
    crc: u32,
    out: &mut W,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), Error> {
    let io = |e| Error::io("reading object data", e);
    let have = s.read_u64().await.map_err(io)?;
    if have != size {
        return Err(Error::Corrupt(format!(
            "replica {} holds {have} bytes; the metadata says {size}",
            fmt_addr(replica)
        )));
    }
    // One chunk at most, whatever the size says.
    let mut buf = vec![0u8; CHUNK.min(size as usize)];
    let mut got = 0u32;
    let mut done = 0u64;
    while done < size {
        let want = (size - done).min(CHUNK as u64) as usize;
        let n = s.read(&mut buf[..want]).await.map_err(io)?;
        if n == 0 {
            // The node went away: not a sign of a damaged replica.
            return Err(Error::Peer(format!(
                "storage node closed the stream after {done} of {size} bytes"
            )));
        }
        got = crc32c::crc32c_append(got, &buf[..n]);
        out.write_all(&buf[..n])
            .await
            .map_err(|e| Error::io("writing the output", e))?;
        done += n as u64;
        progress(done);
    }
    let verified = s.read_u8().await.map_err(io)? == 0;
    let _node_crc = s.read_u32().await.map_err(io)?;
    if !verified || got != crc {
        return Err(Error::Corrupt(format!(
            "replica {} failed its checksum (got {got:08x}, want {crc:08x})",
            fmt_addr(replica)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_store_protocol::addr::Addr;
    use strata_store_protocol::data::{Authority, Credential, MAGIC};
    use strata_store_protocol::key::{ClusterKey, KEY_LEN, WINDOW_MS};
    use strata_store_protocol::ticket::{Ticket, TicketOp};
    use strata_store_protocol::ErrorKind;

    const NOW: u64 = 1_700_000_000_000;

    fn key(b: u8) -> ClusterKey {
        ClusterKey::from_bytes(&[b; KEY_LEN])
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    fn read(rt: &tokio::runtime::Runtime, bytes: &[u8]) -> Result<Incoming, Error> {
        rt.block_on(read_request(&mut &bytes[..]))
            .and_then(|r| r.ok_or_else(|| Error::Peer("no request before the end".into())))
    }

    fn put() -> Request {
        Request::Put {
            addr: 7,
            size: 100,
            chain: vec![1, 2],
        }
    }

    fn ticket(op: TicketOp, expires: u64, size: u64, replicas: Vec<Addr>) -> Vec<u8> {
        Ticket {
            op,
            expires,
            size,
            replicas,
            coordinator: 0,
            tenant: "acme".into(),
        }
        .seal(&key(1))
    }

    #[test]
    fn requests_round_trip_with_each_credential() {
        let rt = rt();
        let k = key(1);
        let t = ticket(TicketOp::Put, NOW + 1, 100, vec![7, 1, 2]);
        for req in [
            put(),
            Request::Get { addr: 9 },
            Request::Free { addr: u128::MAX },
        ] {
            for cred in [
                Credential::None,
                Credential::Seal(&k),
                Credential::Ticket(&t),
            ] {
                let bytes = req.encode_at(cred, NOW);
                let back = read(&rt, &bytes).unwrap();
                assert_eq!(back.req, req);
                match (cred, &back.proof) {
                    (Credential::None, Proof::None) => {}
                    (Credential::Seal(_), Proof::Sealed { at, .. }) => assert_eq!(*at, NOW),
                    (Credential::Ticket(t), Proof::Ticket(b)) => assert_eq!(t, &b[..]),
                    other => panic!("{other:?}"),
                }
                for cut in 1..bytes.len() {
                    assert!(read(&rt, &bytes[..cut]).is_err());
                }
            }
        }
    }

    #[test]
    fn ranged_reads_round_trip_and_malformed_ones_are_refused() {
        let rt = rt();
        let range = |offset, length| Request::GetRange {
            addr: 9,
            offset,
            length,
        };
        let good = range(5, 100);
        assert_eq!(read(&rt, &good.encode(Credential::None)).unwrap().req, good);
        let max = range(0, strata_store_protocol::range::MAX_RANGE);
        assert_eq!(read(&rt, &max.encode(Credential::None)).unwrap().req, max);
        for (bad, why) in [
            (range(5, 0), "empty range"),
            (range(u64::MAX, 1), "past 2^64"),
            (range(0, u64::MAX), "split it"),
        ] {
            let error = read(&rt, &bad.encode(Credential::None)).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Malformed);
            assert!(error.report().to_string().contains(why), "{error}");
        }
        // A Get ticket of the replica allows its ranges, and no other's.
        let k = key(1);
        let t = ticket(TicketOp::Get, NOW + 1000, 100, vec![9]);
        let sent = read(&rt, &good.encode(Credential::Ticket(&t))).unwrap();
        assert!(sent.authorize(Some(&k), NOW).is_ok());
        let other = Request::GetRange {
            addr: 8,
            offset: 5,
            length: 100,
        };
        let sent = read(&rt, &other.encode(Credential::Ticket(&t))).unwrap();
        let refused = sent.authorize(Some(&k), NOW).unwrap_err();
        assert!(refused.contains("does not cover replica"), "{refused}");
    }

    #[test]
    fn hostile_get_object_headers_are_refused() {
        let rt = rt();
        let object = |data: u8, fragments: Vec<(Addr, u32)>| Request::GetObject {
            addr: 7,
            object: CodedObject {
                size: 100,
                crc: 1,
                data,
                fragments,
            },
        };
        let good = object(2, vec![(7, 1), (8, 2), (9, 3)]);
        let back = read(&rt, &good.encode(Credential::None)).unwrap();
        assert_eq!(back.req, good);
        for (bad, why) in [
            (object(2, vec![(8, 1), (7, 2), (9, 3)]), "fragment 0"),
            (object(3, vec![(7, 1), (8, 2), (9, 3)]), "more than k"),
            (object(0, vec![(7, 1), (8, 2)]), "more than k"),
        ] {
            let error = read(&rt, &bad.encode(Credential::None)).unwrap_err();
            assert!(error.report().to_string().contains(why), "{error}");
        }
        // A count above 16 is refused before anything is allocated.
        let mut huge = good.encode(Credential::None);
        huge[HEADER + 8 + 4 + 1] = 200;
        let error = read(&rt, &huge).unwrap_err();
        assert!(
            error.report().to_string().contains("200 fragments"),
            "{error}"
        );
    }

    #[test]
    fn hostile_headers_are_refused() {
        let rt = rt();
        let mut bad = Request::Get { addr: 1 }.encode(Credential::None);
        bad[0] = b'X';
        assert!(read(&rt, &bad).is_err());
        // The version before credentials existed is refused as such.
        let mut old = Request::Get { addr: 1 }.encode(Credential::None);
        old[3] = b'1';
        let err = read(&rt, &old).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Malformed);
        assert!(err.report().to_string().contains("bad magic"), "{err}");
        let zero = Request::Put {
            addr: 1,
            size: 0,
            chain: vec![],
        };
        let mut huge = zero.encode(Credential::None);
        huge[HEADER..HEADER + 8].copy_from_slice(&u64::MAX.to_be_bytes());
        let err = read(&rt, &huge).unwrap_err();
        assert!(err.report().to_string().contains("object limit"), "{err}");
        let mut chain = zero.encode(Credential::None);
        chain[HEADER + 8] = 200;
        let err = read(&rt, &chain).unwrap_err();
        assert!(err.report().to_string().contains("forward chain"), "{err}");
        let mut mode = zero.encode(Credential::None);
        *mode.last_mut().unwrap() = 9;
        let err = read(&rt, &mode).unwrap_err();
        assert!(
            err.report().to_string().contains("credential mode 9"),
            "{err}"
        );
        let mut long = zero.encode(Credential::None);
        *long.last_mut().unwrap() = MODE_TICKET;
        long.extend_from_slice(&(MAX_TICKET as u16 + 1).to_be_bytes());
        let err = read(&rt, &long).unwrap_err();
        assert!(
            err.report().to_string().contains("ticket of 513 bytes"),
            "{err}"
        );
    }

    #[test]
    fn seals_are_checked() {
        let rt = rt();
        let k = key(1);
        for req in [put(), Request::Get { addr: 9 }, Request::Free { addr: 3 }] {
            let good = read(&rt, &req.encode_at(Credential::Seal(&k), NOW)).unwrap();
            assert_eq!(good.authorize(Some(&k), NOW), Ok(Authority::Node));
            // Within the window either way, and not beyond.
            assert!(good.authorize(Some(&k), NOW + WINDOW_MS).is_ok());
            let err = good.authorize(Some(&k), NOW + WINDOW_MS + 1).unwrap_err();
            assert!(err.contains("clocks apart, or a replay"), "{err}");
            let err = good.authorize(Some(&key(2)), NOW).unwrap_err();
            assert!(err.contains("does not match"), "{err}");
            assert!(good
                .authorize(None, NOW)
                .unwrap_err()
                .contains("no cluster key"));
            let plain = read(&rt, &req.encode_at(Credential::None, NOW)).unwrap();
            let err = plain.authorize(Some(&k), NOW).unwrap_err();
            assert!(
                err.starts_with("unauthenticated") && err.contains("nothing done"),
                "{err}"
            );
        }
        // Every flipped bit of a sealed header is refused, on decoding or
        // on the check.
        let bytes = put().encode_at(Credential::Seal(&k), NOW);
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            if let Ok(got) = read(&rt, &b) {
                assert!(got.authorize(Some(&k), NOW).is_err(), "bit {i} passed");
            }
        }
    }

    #[test]
    fn tickets_allow_only_what_they_were_issued_for() {
        let rt = rt();
        let k = key(1);
        let check = |req: &Request, t: &[u8]| {
            read(&rt, &req.encode(Credential::Ticket(t)))
                .unwrap()
                .authorize(Some(&k), NOW)
        };
        let put_t = ticket(TicketOp::Put, NOW + 1000, 100, vec![7, 1, 2]);
        assert_eq!(
            check(&put(), &put_t),
            Ok(Authority::Tenant {
                coordinator: 0,
                tenant: "acme".into()
            })
        );
        let refused = |r: Result<Authority, String>, want: &str| {
            let err = r.unwrap_err();
            assert!(err.contains(want) && err.contains("nothing done"), "{err}");
        };
        // Another size, another chain, another first replica.
        let bigger = Request::Put {
            addr: 7,
            size: 101,
            chain: vec![1, 2],
        };
        refused(
            check(&bigger, &put_t),
            "of 100 bytes but this one sends 101",
        );
        let shorter = Request::Put {
            addr: 7,
            size: 100,
            chain: vec![1],
        };
        refused(check(&shorter, &put_t), "but this one writes");
        let second = Request::Put {
            addr: 1,
            size: 100,
            chain: vec![2],
        };
        refused(check(&second, &put_t), "but this one writes");
        // A Put ticket reads nothing, a Get ticket writes nothing, and
        // neither frees.
        refused(
            check(&Request::Get { addr: 7 }, &put_t),
            "for a Put, not a Get",
        );
        let get_t = ticket(TicketOp::Get, NOW + 1000, 100, vec![7, 1, 2]);
        assert_eq!(
            check(&Request::Get { addr: 1 }, &get_t),
            Ok(Authority::Tenant {
                coordinator: 0,
                tenant: "acme".into()
            })
        );
        refused(
            check(&Request::Get { addr: 8 }, &get_t),
            "does not cover replica",
        );
        refused(check(&put(), &get_t), "for a Get, not a Put");
        refused(
            check(&Request::Free { addr: 7 }, &get_t),
            "needs the cluster key's seal",
        );
        // Expired, forged (another key), damaged, empty.
        let old = ticket(TicketOp::Get, NOW - 1, 100, vec![7]);
        refused(check(&Request::Get { addr: 7 }, &old), "expired 1 ms ago");
        let forged = Ticket {
            op: TicketOp::Get,
            expires: NOW + 1000,
            size: 100,
            replicas: vec![7],
            coordinator: 0,
            tenant: "acme".into(),
        }
        .seal(&key(2));
        refused(check(&Request::Get { addr: 7 }, &forged), "does not match");
        let mut damaged = get_t.clone();
        damaged[6] ^= 1;
        refused(check(&Request::Get { addr: 7 }, &damaged), "does not match");
        refused(check(&Request::Get { addr: 7 }, &[]), "malformed");
    }

    proptest::proptest! {
        #[test]
        fn random_requests_never_panic_nor_pass(kind in 1u8..=3, rest in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            let rt = rt();
            let mut b = MAGIC.to_vec();
            b.push(kind);
            b.extend_from_slice(&rest);
            if let Ok(got) = read(&rt, &b) {
                proptest::prop_assert!(got.authorize(Some(&key(1)), NOW).is_err());
            }
        }
    }
}
