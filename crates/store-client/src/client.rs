//! The client: metadata calls over UDP (as deterministic state machines,
//! [`Call`], so the simulation drives the same logic) and data over TCP.

use crate::stream::read_status;
use crate::transport::{fetch_table, request_id};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::RwLock;
use std::time::Duration;
use strata_store_protocol::addr::Addr;
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::data::{Credential, Request};
use strata_store_protocol::table::Table;
use strata_store_protocol::tenant::TenantCredential;
use strata_store_protocol::wire::{
    check_name, Body, Code, ListEntry, Msg, Record, RenameLink, MAX_DATAGRAM,
};
use strata_store_protocol::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeek, AsyncSeekExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// What a [`Call`] wants next.
#[derive(Debug)]
pub enum Step {
    /// Send this message (to the MN owning `msg.target`) and wait until the
    /// given time (ms) for a reply.
    Send(Msg, u64),
    /// Finished.
    Done(Result<Body, Error>),
}

/// One metadata request with its retry policy: each target is tried
/// `attempts` times with `timeout_ms` between tries; a `NotFound` answer
/// falls through to the next target when `fall_through` is set (a Get whose
/// metadata is not at this address yet). So do answers from a node that
/// does not (or no longer, or not yet) hold the address's group; a
/// "not found" elsewhere is then not final: the call ends with that
/// node's answer, so the caller refreshes its table and asks again.
pub struct Call {
    targets: Vec<Addr>,
    body: Body,
    req: u64,
    idx: usize,
    tries: u32,
    attempts: u32,
    timeout_ms: u64,
    fall_through: bool,
    last_error: Option<Error>,
    /// An address answered WrongAddress or Moving: the error to report if
    /// no other address has the record.
    stale: Option<Error>,
    /// Bytes to pad the request to: a node answers a request it did not
    /// authenticate (a refusal) only when the answer is no longer, and
    /// asks for padding ([`Body::PadTo`]) otherwise.
    pad: usize,
}

impl Call {
    /// A call of `body` to `targets` in order.
    pub fn new(req: u64, targets: Vec<Addr>, body: Body, attempts: u32, timeout_ms: u64) -> Call {
        Call {
            targets,
            body,
            req,
            idx: 0,
            tries: 0,
            attempts: attempts.max(1),
            timeout_ms,
            fall_through: false,
            last_error: None,
            stale: None,
            pad: 0,
        }
    }

    /// The same call afresh, under a new request id (a node may have
    /// cached its answer to the old one).
    pub fn again(&self, req: u64) -> Call {
        Call {
            targets: self.targets.clone(),
            body: self.body.clone(),
            req,
            idx: 0,
            tries: 0,
            attempts: self.attempts,
            timeout_ms: self.timeout_ms,
            fall_through: self.fall_through,
            last_error: None,
            stale: None,
            pad: self.pad,
        }
    }

    /// Lets `NotFound` answers and timeouts move on to the next target.
    pub fn falling_through(mut self) -> Call {
        self.fall_through = true;
        self
    }

    /// The request id.
    pub fn req(&self) -> u64 {
        self.req
    }

    /// The least length to pad the request to when sending it
    /// ([`Msg::seal_tenant_padded`]): 0 until a node asked for more.
    pub fn pad(&self) -> usize {
        self.pad
    }

    fn send(&mut self, now: u64) -> Step {
        self.tries += 1;
        let msg = Msg::new(self.req, self.targets[self.idx], self.body.clone());
        Step::Send(msg, now + self.timeout_ms)
    }

    /// The first step.
    pub fn start(&mut self, now: u64) -> Step {
        if self.targets.is_empty() {
            return Step::Done(Err(Error::Invalid("no metadata address to ask".into())));
        }
        self.send(now)
    }

    /// The deadline passed without a reply.
    pub fn on_timeout(&mut self, now: u64) -> Step {
        if self.tries < self.attempts {
            return self.send(now);
        }
        self.last_error = Some(Error::Timeout(format!(
            "metadata address {} did not answer after {} attempts",
            strata_store_protocol::addr::fmt_addr(self.targets[self.idx]),
            self.tries
        )));
        self.next_target(now)
    }

    fn next_target(&mut self, now: u64) -> Step {
        if self.fall_through && self.idx + 1 < self.targets.len() {
            self.idx += 1;
            self.tries = 0;
            return self.send(now);
        }
        // A node that may hold the record could not say: the other
        // answers (not found, no answer) are not final.
        if let Some(stale) = self.stale.take() {
            return Step::Done(Err(stale));
        }
        Step::Done(Err(self.last_error.take().unwrap_or_else(|| {
            Error::Timeout("no metadata node answered".into())
        })))
    }

    /// A reply arrived; `None` if it is not for this call.
    pub fn on_reply(&mut self, now: u64, msg: Msg) -> Option<Step> {
        if msg.req != self.req {
            return None;
        }
        Some(match msg.body {
            // Nothing was done: the same request again, padded so that
            // the node may say why it refused it. Only a growing size is
            // taken, so this ends.
            Body::PadTo { size } => {
                let size = size as usize;
                if size <= self.pad || size > strata_store_protocol::wire::MAX_DATAGRAM {
                    return None;
                }
                self.pad = (size + strata_store_protocol::auth::PAD_SLACK)
                    .min(strata_store_protocol::wire::MAX_DATAGRAM);
                self.tries = self.tries.saturating_sub(1);
                self.send(now)
            }
            Body::Error {
                code: code @ (Code::NotFound | Code::Unavailable),
                message,
            } if self.fall_through => {
                // Keep the most telling error: NotFound beats a timeout.
                self.last_error = Some(Error::Remote { code, message });
                self.next_target(now)
            }
            Body::Error {
                code: code @ (Code::WrongAddress | Code::Moving),
                message,
            } if self.fall_through => {
                self.stale = Some(Error::Remote { code, message });
                self.next_target(now)
            }
            Body::Error { code, message } => Step::Done(Err(Error::Remote { code, message })),
            body => Step::Done(Ok(body)),
        })
    }
}

/// What a Post did.
#[derive(Clone, Debug)]
pub struct PutResult {
    /// The version created.
    pub version: u64,
    /// CRC-32C of the data.
    pub crc: u32,
    /// Durable copies when acknowledged.
    pub copies: u8,
    /// Replica addresses.
    pub replicas: Vec<Addr>,
}

/// A client of one cluster.
pub struct Client {
    on: SocketAddr,
    table: RwLock<Arc<Table>>,
    /// Idle UDP sockets for metadata calls: a call takes one and gives it
    /// back, so a busy client does not bind a socket per request (a late
    /// reply to an earlier call is told apart by its request id). Each
    /// keeps its receive buffer: zeroing a fresh 64 KiB one took a tenth of
    /// a zero-byte Get's client time.
    sockets: std::sync::Mutex<Vec<(UdpSocket, Vec<u8>)>>,
    /// Idle data connections by storage node endpoint, each at a request
    /// boundary (the storage node serves requests one after another).
    conns: std::sync::Mutex<HashMap<SocketAddr, Vec<TcpStream>>>,
    /// The tenant's credential: every metadata request is sealed with it
    /// ([`strata_store_protocol::tenant`]).
    credential: TenantCredential,
}

/// Idle UDP sockets a client keeps.
const IDLE_SOCKETS: usize = 64;
/// Idle data connections a client keeps per storage node.
const IDLE_CONNS_PER_NODE: usize = 32;
/// Idle data connections a client keeps in all.
const IDLE_CONNS_TOTAL: usize = 256;

const META_TIMEOUT_MS: u64 = 400;
/// How long a call is retried while the table moves under it (a metadata
/// group handed over between nodes, or given to a stand-in while its node
/// is down: each retry refreshes the table).
const MOVING_RETRY_MS: u64 = 20_000;
const META_ATTEMPTS: u32 = 5;
/// A commit waits for W_m acknowledgements: give it longer.
const COMMIT_ATTEMPTS: u32 = 20;
const CHUNK: usize = 256 * 1024;

impl Client {
    /// Connects to the cluster whose orchestrator listens on `on`, as the
    /// tenant of `credential` (which seals every metadata request).
    pub async fn connect(on: SocketAddr, credential: TenantCredential) -> Result<Client, Error> {
        let table = fetch_table(on, None).await.map_err(|e| match e {
            Error::Timeout(_) => Error::Timeout(format!(
                "no orchestrator answered at {on}; is `strata store up` running there?"
            )),
            e => e,
        })?;
        Ok(Client {
            on,
            table: RwLock::new(Arc::new(table)),
            sockets: std::sync::Mutex::new(Vec::new()),
            conns: std::sync::Mutex::new(HashMap::new()),
            credential,
        })
    }

    /// The tenant this client acts as.
    pub fn credential(&self) -> &TenantCredential {
        &self.credential
    }

    /// The prefix table in use.
    pub fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Fetches the table again (after a node joined or moved).
    pub async fn refresh(&self) -> Result<(), Error> {
        let t = fetch_table(self.on, None).await?;
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(t);
        Ok(())
    }

    /// Runs a call over UDP, on an idle socket of this client's. An answer
    /// that the address's group is elsewhere or being handed over (nothing
    /// was done) makes it refresh the table and try again, for a while.
    pub async fn run(&self, call: Call) -> Result<Body, Error> {
        let start = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        let mut call = call;
        loop {
            let next = call.again(request_id());
            match self.run_once(call).await {
                Err(Error::Remote {
                    code: Code::WrongAddress | Code::Moving,
                    message,
                }) if start.elapsed() < Duration::from_millis(MOVING_RETRY_MS) => {
                    tracing::debug!("retrying after a refreshed table: {message}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                    let _ = self.refresh().await;
                    call = next;
                }
                // A node that does not answer may have been replaced by a
                // stand-in (its groups given to another node while it is
                // down): ask again if the table now sends elsewhere.
                Err(Error::Timeout(message))
                    if start.elapsed() < Duration::from_millis(MOVING_RETRY_MS) =>
                {
                    let old = self.table();
                    let _ = self.refresh().await;
                    let new = self.table();
                    let moved = next
                        .targets
                        .iter()
                        .any(|&a| old.mn_endpoint(a) != new.mn_endpoint(a));
                    if !moved {
                        return Err(Error::Timeout(message));
                    }
                    tracing::debug!("retrying on a refreshed table: {message}");
                    call = next;
                }
                other => return other,
            }
        }
    }

    async fn run_once(&self, call: Call) -> Result<Body, Error> {
        let idle = self.sockets.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let (sock, mut buf) = match idle {
            Some(s) => s,
            None => (
                bind_udp(meta_over_ipv6(&self.table())).await?,
                vec![0u8; MAX_DATAGRAM + 1],
            ),
        };
        let result = run_call_on(&sock, &mut buf, &self.table(), &self.credential, call).await;
        // The reply was taken, so the socket is most likely empty now:
        // forget its readiness, or the next call's first receive would be
        // a system call that finds nothing. (A datagram still queued is a
        // stale one; the next call's own reply wakes it again.)
        let _ = sock.try_io(tokio::io::Interest::READABLE, || {
            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
        });
        let mut idle = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_SOCKETS {
            idle.push((sock, buf));
        }
        result
    }

    /// An idle data connection to the node owning `addr`, or a new one;
    /// `true` when it was idle (and so may have been closed meanwhile).
    async fn data_conn(&self, addr: Addr) -> Result<(TcpStream, bool), Error> {
        let table = self.table();
        if let Some(endpoint) = table.sn_endpoint(addr) {
            let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            let idle = conns.get_mut(&endpoint).and_then(Vec::pop);
            // Routed mode keys connections by replica address: drop empty
            // entries so the map does not grow with every object read.
            if conns.get(&endpoint).is_some_and(Vec::is_empty) {
                conns.remove(&endpoint);
            }
            drop(conns);
            if let Some(s) = idle {
                return Ok((s, true));
            }
        }
        Ok((connect_replica(&table, addr).await?, false))
    }

    /// Keeps a data connection that is at a request boundary.
    fn keep_conn(&self, stream: TcpStream) {
        let Ok(endpoint) = stream.peer_addr() else {
            return;
        };
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.values().map(Vec::len).sum::<usize>() >= IDLE_CONNS_TOTAL {
            return;
        }
        let idle = conns.entry(endpoint).or_default();
        if idle.len() < IDLE_CONNS_PER_NODE {
            idle.push(stream);
        }
    }

    fn coordinator(&self, name: &str) -> Result<Addr, Error> {
        check_name(name).map_err(Error::Invalid)?;
        Ok(self.table().meta_addrs(name)[0])
    }

    /// Reads an object's metadata from the first metadata address that has it.
    pub async fn stat(&self, name: &str) -> Result<Record, Error> {
        Ok(self.stat_ticketed(name).await?.0)
    }

    /// [`Client::stat`], with the Get ticket the metadata node issued for
    /// the record's replicas (empty for an empty object).
    async fn stat_ticketed(&self, name: &str) -> Result<(Record, Vec<u8>), Error> {
        let body = Body::Get {
            name: name.to_string(),
        };
        self.look_up(name, body, "Get", |answer| match answer {
            Body::Found { record, ticket } => Ok((record, ticket)),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// [`Client::stat`], with the link proof the metadata node issued to
    /// this client's tenant for the record's replicas (empty when it has
    /// none): what a rename's `Link` of them under a new name must carry
    /// ([`strata_store_protocol::auth::LinkProof`]).
    async fn stat_for_link(&self, name: &str) -> Result<(Record, Vec<u8>), Error> {
        let body = Body::GetLinkProof {
            name: name.to_string(),
        };
        self.look_up(name, body, "GetLinkProof", |answer| match answer {
            Body::LinkProof { record, proof } => Ok((record, proof)),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Asks `name`'s metadata addresses (falling through to the next on a
    /// miss) with `request`, and takes the record and credential `pick`
    /// finds in the answer (it gives back any other answer), if the record
    /// is `name`'s.
    async fn look_up(
        &self,
        name: &str,
        request: Body,
        kind: &str,
        pick: impl Fn(Body) -> Result<(Record, Vec<u8>), Box<Body>>,
    ) -> Result<(Record, Vec<u8>), Error> {
        check_name(name).map_err(Error::Invalid)?;
        let targets = self.table().meta_addrs(name);
        let call = Call::new(
            request_id(),
            targets,
            request,
            META_ATTEMPTS,
            META_TIMEOUT_MS,
        )
        .falling_through();
        match pick(self.run(call).await?) {
            Ok((record, credential)) if record.name == name => Ok((record, credential)),
            Ok((record, _)) => Err(Error::Invalid(format!(
                "unexpected answer to {kind}: the record of '{}', not '{name}'",
                record.name
            ))),
            Err(other) => Err(unexpected(kind, &other)),
        }
    }

    /// Posts an object of `size` bytes read from `data`; `progress` is told
    /// how many bytes went out so far.
    pub async fn put<R: AsyncRead + Unpin>(
        &self,
        name: &str,
        size: u64,
        data: &mut R,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<PutResult, Error> {
        let coord = self.coordinator(name)?;
        let begin = Call::new(
            request_id(),
            vec![coord],
            Body::PostBegin {
                name: name.to_string(),
                size,
            },
            META_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        let (version, replicas, ticket) = match self.run(begin).await? {
            Body::PostPlan {
                version,
                replicas,
                ticket,
                ..
            } if !replicas.is_empty() => (version, replicas, ticket),
            other => return Err(unexpected("PostBegin", &other)),
        };
        let w_d = self.table().params_for(name).w_d;
        let sent = self
            .send_data(&replicas, &ticket, size, data, progress)
            .await;
        let (crc, copies) = match sent {
            Ok((crc, copies)) if copies >= w_d => (crc, copies),
            other => {
                let abort = Call::new(
                    request_id(),
                    vec![coord],
                    Body::PostAbort {
                        name: name.to_string(),
                        version,
                    },
                    2,
                    META_TIMEOUT_MS,
                );
                let _ = self.run(abort).await;
                return Err(match other {
                    Err(e) => e,
                    Ok((_, copies)) => Error::Remote {
                        code: Code::Unavailable,
                        message: format!(
                            "only {copies} of the W_d={w_d} data replicas were written; the Post was dropped"
                        ),
                    },
                });
            }
        };
        let commit = Call::new(
            request_id(),
            vec![coord],
            Body::PostCommit {
                name: name.to_string(),
                version,
                crc,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(commit).await? {
            Body::Done { .. } => Ok(PutResult {
                version,
                crc,
                copies,
                replicas,
            }),
            other => Err(unexpected("PostCommit", &other)),
        }
    }

    /// Streams the data to the first replica, which forwards it along the
    /// chain; returns the CRC-32C and the number of durable copies.
    async fn send_data<R: AsyncRead + Unpin>(
        &self,
        replicas: &[Addr],
        ticket: &[u8],
        size: u64,
        data: &mut R,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(u32, u8), Error> {
        let first = replicas[0];
        let mut s = self.connect_sn(first).await?;
        let header = Request::Put {
            addr: first,
            size,
            chain: replicas[1..].to_vec(),
        }
        .encode(Credential::Ticket(ticket));
        let io = |e| Error::io("sending object data", e);
        s.write_all(&header).await.map_err(io)?;
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
                return Err(Error::Invalid(format!(
                    "the input ended after {done} of {size} bytes"
                )));
            }
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            s.write_all(&buf[..n]).await.map_err(io)?;
            done += n as u64;
            progress(done);
        }
        s.write_all(&crc.to_be_bytes()).await.map_err(io)?;
        s.flush().await.map_err(io)?;
        read_status(&mut s, "storing the object").await?;
        let copies = s
            .read_u8()
            .await
            .map_err(|e| Error::io("reading the Put reply", e))?;
        Ok((crc, copies))
    }

    async fn connect_sn(&self, addr: Addr) -> Result<TcpStream, Error> {
        let table = self.table();
        connect_replica(&table, addr).await
    }

    /// Reads an object into `out` from the first replica that serves it
    /// whole and verified; returns its metadata.
    pub async fn get<W: AsyncWrite + AsyncSeek + Unpin>(
        &self,
        name: &str,
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Record, Error> {
        let (record, ticket) = self.stat_ticketed(name).await?;
        if record.size == 0 && record.crc == crc32c::crc32c(&[]) {
            // The metadata says everything an empty object holds, so there is
            // no data to fetch: a Get is one metadata round trip, as in the
            // design's zero-size measurements. A record whose checksum does
            // not fit an empty object goes through the replicas and fails
            // there with the mismatch.
            return Ok(record);
        }
        let mut last = None;
        for &replica in &record.replicas {
            // An idle connection the node closed meanwhile fails before any
            // byte of the object arrives: try that replica again afresh.
            for _ in 0..2 {
                out.seek(std::io::SeekFrom::Start(0))
                    .await
                    .map_err(|e| Error::io("rewinding the output", e))?;
                let (stream, reused) = match self.data_conn(replica).await {
                    Ok(c) => c,
                    Err(e) => {
                        // That node is unreachable: the next replica.
                        last = Some(e);
                        break;
                    }
                };
                match self
                    .read_replica(stream, replica, &ticket, &record, out, progress)
                    .await
                {
                    Ok(stream) => {
                        self.keep_conn(stream);
                        return Ok(record);
                    }
                    Err((e, started)) => {
                        let stale = reused && !started;
                        last = Some(e);
                        if !stale {
                            break;
                        }
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Corrupt(format!("{name:?} has no replica"))))
    }

    /// Reads one replica over `s`; gives the stream back at a request
    /// boundary, or the error and whether the node had started answering.
    async fn read_replica<W: AsyncWrite + Unpin>(
        &self,
        mut s: TcpStream,
        replica: Addr,
        ticket: &[u8],
        record: &Record,
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<TcpStream, (Error, bool)> {
        let io = |e| Error::io("reading object data", e);
        let before = |e| (e, false);
        s.write_all(&Request::Get { addr: replica }.encode(Credential::Ticket(ticket)))
            .await
            .map_err(io)
            .map_err(before)?;
        read_status(&mut s, "reading the replica")
            .await
            .map_err(before)?;
        self.stream_replica(&mut s, replica, record, out, progress)
            .await
            .map_err(|e| (e, true))?;
        Ok(s)
    }

    /// The body of a Get reply: size, data, trailer.
    async fn stream_replica<W: AsyncWrite + Unpin>(
        &self,
        s: &mut TcpStream,
        replica: Addr,
        record: &Record,
        out: &mut W,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), Error> {
        read_get_body(s, replica, record.size, record.crc, out, progress).await?;
        out.flush()
            .await
            .map_err(|e| Error::io("writing the output", e))
    }

    /// Reads a whole object into memory.
    pub async fn get_bytes(&self, name: &str) -> Result<(Record, Vec<u8>), Error> {
        let mut cur = std::io::Cursor::new(Vec::new());
        let rec = self.get(name, &mut cur, &|_| {}).await?;
        let mut v = cur.into_inner();
        v.truncate(rec.size as usize);
        Ok((rec, v))
    }

    /// Deletes an object (acknowledged once W_m metadata nodes deleted it).
    ///
    /// An object left half renamed shares its replicas with its other
    /// name: then only the name goes, and the data stays with the other.
    pub async fn delete(&self, name: &str) -> Result<u64, Error> {
        let record = match self.stat(name).await {
            Ok(r) => r,
            // Let the coordinator give its own answer (deleted, not found).
            Err(_) => return self.delete_if(name, 0, false).await,
        };
        let keep = match &record.rename {
            Some(RenameLink::To(other) | RenameLink::From(other)) => self
                .stat(other)
                .await
                .is_ok_and(|o| shares_replicas(&o, &record)),
            None => false,
        };
        self.delete_if(name, record.version, keep).await
    }

    async fn delete_if(&self, name: &str, if_version: u64, keep_data: bool) -> Result<u64, Error> {
        let call = Call::new(
            request_id(),
            vec![self.coordinator(name)?],
            Body::Delete {
                name: name.to_string(),
                if_version,
                keep_data,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(call).await {
            Ok(Body::Done { version }) => Ok(version),
            Ok(other) => Err(unexpected("Delete", &other)),
            Err(Error::Remote {
                code: Code::Deleted,
                message,
            }) => Err(Error::Remote {
                code: Code::NotFound,
                message,
            }),
            Err(e) => Err(e),
        }
    }

    /// Renames an object: no data moves. See [`Client::rename_with`].
    pub async fn rename(&self, from: &str, to: &str) -> Result<Record, Error> {
        self.rename_with(from, to, &|_| {}).await
    }

    /// Renames an object in four metadata steps, calling `after_step`
    /// after each (tests stop a rename there):
    /// 1. mark `from` as being renamed to `to`;
    /// 2. bind the replicas under `to`, marked as renamed from `from`;
    /// 3. drop `from`, keeping the data;
    /// 4. clear the mark on `to`.
    ///
    /// A rename stopped after step 2 leaves both names on the same
    /// replicas, each naming the other: deleting either keeps the data
    /// ([`Client::delete`]), and running the rename again finishes it.
    ///
    /// The old name is looked up with a link proof for its replicas
    /// (issued to this tenant), which the `Link` of step 2 carries: a
    /// metadata node binds only replicas a tenant proves it may read.
    pub async fn rename_with(
        &self,
        from: &str,
        to: &str,
        after_step: &(dyn Fn(RenameStep) + Sync),
    ) -> Result<Record, Error> {
        check_name(to).map_err(Error::Invalid)?;
        let (mut record, proof) = self.stat_for_link(from).await?;
        if from == to {
            return Ok(record);
        }
        if let Some(RenameLink::To(other) | RenameLink::From(other)) = &record.rename {
            let shared = self
                .stat(other)
                .await
                .is_ok_and(|o| shares_replicas(&o, &record));
            if shared && other != to {
                return Err(Error::Invalid(format!(
                    "{from:?} still shares its data with {other:?} after an interrupted \
                     rename; finish that one first (strata obj mv {from} {other}, or \
                     strata obj rm one of the two names)"
                )));
            }
        }
        let marked = self
            .update(&record, Some(RenameLink::To(to.to_string())))
            .await?;
        after_step(RenameStep::Marked);
        record.name = to.to_string();
        record.rename = Some(RenameLink::From(from.to_string()));
        let call = Call::new(
            request_id(),
            vec![self.coordinator(to)?],
            Body::Link {
                record: record.clone(),
                proof,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(call).await {
            Ok(Body::Done { version }) => record.version = version,
            Ok(other) => return Err(unexpected("Link", &other)),
            // An earlier, interrupted run of this rename bound it already
            // (`Exists`), or this one did and its answer was lost (a
            // resend refused or timed out): the replicas are bound, so
            // the mark on `from` must stay.
            Err(e) => match self.stat(to).await {
                Ok(bound) if shares_replicas(&bound, &record) => {
                    tracing::debug!("{to:?} holds the replicas already: {e}");
                    record = bound;
                }
                _ => {
                    // Nothing shares the replicas: take the mark off again.
                    if let Ok(marked_record) = self.stat(from).await {
                        let _ = self.update(&marked_record, None).await;
                    }
                    return Err(e);
                }
            },
        }
        after_step(RenameStep::Linked);
        self.delete_if(from, marked, true).await?;
        after_step(RenameStep::Dropped);
        let version = self.update(&record, None).await?;
        record.rename = None;
        record.version = version;
        Ok(record)
    }

    /// Replaces `record`'s rename link; returns the new version.
    async fn update(&self, record: &Record, rename: Option<RenameLink>) -> Result<u64, Error> {
        let mut new = record.clone();
        new.rename = rename;
        let call = Call::new(
            request_id(),
            vec![self.coordinator(&record.name)?],
            Body::Update {
                record: new,
                if_version: record.version,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(call).await? {
            Body::Done { version } => Ok(version),
            other => Err(unexpected("Update", &other)),
        }
    }

    /// One page of names starting with `prefix` after `after`, gathered
    /// from every metadata node; the second value is the cursor for the
    /// next page (`None` at the end).
    pub async fn list(
        &self,
        prefix: &str,
        after: &str,
        limit: u32,
    ) -> Result<(Vec<ListEntry>, Option<String>), Error> {
        // A List asks each metadata node once, and a node lists the rows it
        // holds. A group handed over between the table this client used
        // and the nodes' answers could be missed: its new owner was not
        // asked and its old one had dropped it. So the page counts only
        // if group ownership was the same in fresh tables before and after
        // it. A node whose group moved answers WrongAddress or Moving and
        // lists nothing: then too, refresh and ask again.
        let start = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            let _ = self.refresh().await;
            let owners = self.table().mg_owner.clone();
            let page = self.list_once(prefix, after, limit).await;
            let in_time = start.elapsed() < Duration::from_millis(MOVING_RETRY_MS);
            match page {
                Err(Error::Remote {
                    code: Code::WrongAddress | Code::Moving,
                    message,
                }) if in_time => {
                    tracing::debug!("listing again after a refreshed table: {message}");
                }
                Ok(page) => {
                    let _ = self.refresh().await;
                    if self.table().mg_owner == owners || !in_time {
                        return Ok(page);
                    }
                    tracing::debug!("listing again: metadata groups moved meanwhile");
                }
                other => return other,
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// One scatter-gather of a List page over every metadata node.
    async fn list_once(
        &self,
        prefix: &str,
        after: &str,
        limit: u32,
    ) -> Result<(Vec<ListEntry>, Option<String>), Error> {
        let table = self.table();
        let limit = limit.clamp(1, 1000);
        let mut calls = tokio::task::JoinSet::new();
        for mn in &table.mns {
            // Ask through a group the node owns and keeps: a group being
            // handed over may be sealed, which refuses everything.
            let owned = |mg: &usize| table.mg_owner.get(*mg) == Some(&mn.slot);
            let moving = |mg: &usize| table.moves.iter().any(|m| m.group as usize == *mg);
            let mut groups = (0..table.mg_owner.len()).filter(owned);
            let Some(mg) = groups
                .clone()
                .find(|mg| !moving(mg))
                .or_else(|| groups.next())
            else {
                continue;
            };
            let target = table.layout.meta_prefix() | ((mg as u128) << (64 - table.layout.mg_bits));
            let call = Call::new(
                request_id(),
                vec![target],
                Body::List {
                    prefix: prefix.to_string(),
                    after: after.to_string(),
                    limit,
                },
                META_ATTEMPTS,
                META_TIMEOUT_MS,
            );
            let table = table.clone();
            let credential = self.credential.clone();
            calls.spawn(async move { run_call(&table, &credential, call).await });
        }
        let mut all: Vec<ListEntry> = Vec::new();
        let mut more = false;
        while let Some(page) = calls.join_next().await {
            let page = page.map_err(|e| Error::Invalid(format!("list task failed: {e}")))?;
            match page? {
                Body::ListPage { entries, more: m } => {
                    more |= m;
                    all.extend(entries);
                }
                other => return Err(unexpected("List", &other)),
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name).then(b.version.cmp(&a.version)));
        all.dedup_by(|a, b| a.name == b.name);
        if all.len() > limit as usize {
            all.truncate(limit as usize);
            more = true;
        }
        let cursor = if more {
            all.last().map(|e| e.name.clone())
        } else {
            None
        };
        Ok((all, cursor))
    }
}

/// Runs a metadata call over UDP, resolving addresses through `table`.
/// Connects to the storage node that owns replica address `addr`.
async fn connect_replica(table: &Table, addr: Addr) -> Result<TcpStream, Error> {
    let endpoint = table.sn_endpoint(addr).ok_or_else(|| {
        Error::Invalid(format!(
            "replica address {} is in no storage node's prefix",
            strata_store_protocol::addr::fmt_addr(addr)
        ))
    })?;
    let s = TcpStream::connect(endpoint)
        .await
        .map_err(|e| Error::io(format!("connecting to storage node {endpoint}"), e))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Copies an object for repair: reads it from the first of `sources` that
/// serves all `size` bytes with the CRC-32C `crc` (and the node's own
/// checksum verified), streaming it to `targets[0]`, which forwards it to
/// the other targets. A source that fails its checksum is not committed:
/// the connection to the target is dropped before the CRC trailer, so the
/// target discards what it got. Returns the number of copies written.
/// Both requests are sealed with the cluster `key` (a repair copy is a
/// metadata node's).
pub async fn copy_replica(
    table: &Table,
    key: &ClusterKey,
    sources: &[Addr],
    targets: &[Addr],
    size: u64,
    crc: u32,
) -> Result<u8, Error> {
    if targets.is_empty() {
        return Err(Error::Invalid("a copy needs a target".into()));
    }
    let limit = Duration::from_millis(30_000 + size / (16 << 20) * 1000);
    let mut last = None;
    for &source in sources {
        match tokio::time::timeout(limit, copy_from(table, key, source, targets, size, crc)).await {
            Ok(Ok(copies)) => return Ok(copies),
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                last = Some(Error::Invalid(format!(
                    "copying from {} took longer than {limit:?}",
                    strata_store_protocol::addr::fmt_addr(source)
                )))
            }
        }
    }
    Err(last.unwrap_or_else(|| Error::Invalid("no live replica to copy from".into())))
}

async fn copy_from(
    table: &Table,
    key: &ClusterKey,
    source: Addr,
    targets: &[Addr],
    size: u64,
    crc: u32,
) -> Result<u8, Error> {
    let io = |e| Error::io("copying a replica", e);
    let mut from = connect_replica(table, source).await?;
    from.write_all(&Request::Get { addr: source }.encode(Credential::Seal(key)))
        .await
        .map_err(io)?;
    read_status(&mut from, "reading the replica to copy").await?;
    let mut to = connect_replica(table, targets[0]).await?;
    let header = Request::Put {
        addr: targets[0],
        size,
        chain: targets[1..].to_vec(),
    };
    to.write_all(&header.encode(Credential::Seal(key)))
        .await
        .map_err(io)?;
    // On any error `to` is dropped before the CRC trailer: the target
    // discards what it received.
    read_get_body(&mut from, source, size, crc, &mut to, &|_| {}).await?;
    to.write_all(&crc.to_be_bytes()).await.map_err(io)?;
    to.flush().await.map_err(io)?;
    read_status(&mut to, "storing the copy").await?;
    to.read_u8().await.map_err(io)
}

/// Reads the body of a storage node's Get reply (after its status): the
/// size, which must be `size`, the data, streamed to `out`, and the
/// trailer. The node must have verified its own checksum and the data
/// must match the CRC-32C `crc` the metadata records.
async fn read_get_body<W: AsyncWrite + Unpin>(
    s: &mut TcpStream,
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
            strata_store_protocol::addr::fmt_addr(replica)
        )));
    }
    let mut buf = vec![0u8; CHUNK.min(size as usize)];
    let mut got = 0u32;
    let mut done = 0u64;
    while done < size {
        let want = (size - done).min(CHUNK as u64) as usize;
        let n = s.read(&mut buf[..want]).await.map_err(io)?;
        if n == 0 {
            return Err(Error::Corrupt(format!(
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
            strata_store_protocol::addr::fmt_addr(replica)
        )));
    }
    Ok(())
}

/// The steps of [`Client::rename_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenameStep {
    /// The old name is marked.
    Marked,
    /// The new name is bound.
    Linked,
    /// The old name is gone.
    Dropped,
}

/// Whether two records share a replica address.
fn shares_replicas(a: &Record, b: &Record) -> bool {
    a.replicas.iter().any(|r| b.replicas.contains(r))
}

/// Runs one metadata call on a fresh UDP socket, sealed with `credential`.
pub async fn run_call(
    table: &Table,
    credential: &TenantCredential,
    call: Call,
) -> Result<Body, Error> {
    let sock = bind_udp(meta_over_ipv6(table)).await?;
    run_call_on(
        &sock,
        &mut vec![0u8; MAX_DATAGRAM + 1],
        table,
        credential,
        call,
    )
    .await
}

/// Whether metadata messages go to IPv6 socket addresses.
pub fn meta_over_ipv6(table: &Table) -> bool {
    table.routed || table.mns.iter().any(|m| m.endpoint.is_ipv6())
}

/// A UDP socket for metadata calls: IPv6 when the metadata nodes are
/// reached over IPv6 (routed mode sends to metadata addresses).
async fn bind_udp(ipv6: bool) -> Result<UdpSocket, Error> {
    let any = if ipv6 { "[::]:0" } else { "0.0.0.0:0" };
    UdpSocket::bind(any)
        .await
        .map_err(|e| Error::io("binding a UDP socket", e))
}

/// Runs `call` on `sock`, receiving into `buf` (at least a datagram and a
/// byte long), ignoring replies to other calls. Each send is sealed anew
/// with `credential` (a resend carries a fresh clock).
async fn run_call_on(
    sock: &UdpSocket,
    buf: &mut [u8],
    table: &Table,
    credential: &TenantCredential,
    mut call: Call,
) -> Result<Body, Error> {
    let start = tokio::time::Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    let mut step = call.start(now());
    loop {
        let (msg, deadline) = match step {
            Step::Done(r) => return r,
            Step::Send(msg, deadline) => (msg, deadline),
        };
        let endpoint = table.mn_endpoint(msg.target);
        let bytes = msg.seal_tenant_padded(
            credential,
            strata_store_protocol::auth::unix_ms(),
            call.pad(),
        );
        if let (Some(ep), Ok(bytes)) = (endpoint, bytes) {
            let _ = sock.send_to(&bytes, ep).await;
        }
        step = loop {
            let until = start + Duration::from_millis(deadline);
            match tokio::time::timeout_at(until, sock.recv_from(buf)).await {
                Err(_) | Ok(Err(_)) => break call.on_timeout(now()),
                Ok(Ok((n, _))) => {
                    if let Ok(reply) = Msg::decode(&buf[..n]) {
                        if let Some(s) = call.on_reply(now(), reply) {
                            break s;
                        }
                    }
                }
            }
        };
    }
}

fn unexpected(what: &str, body: &Body) -> Error {
    Error::Invalid(format!("unexpected answer to {what}: {body:?}"))
}

/// Asks a storage node to free a replica (sealed with the cluster `key`:
/// only nodes free replicas).
pub async fn free_replica(endpoint: SocketAddr, addr: Addr, key: &ClusterKey) -> Result<(), Error> {
    let mut s = TcpStream::connect(endpoint)
        .await
        .map_err(|e| Error::io(format!("connecting to {endpoint}"), e))?;
    s.write_all(&Request::Free { addr }.encode(Credential::Seal(key)))
        .await
        .map_err(|e| Error::io("sending Free", e))?;
    read_status(&mut s, "freeing a replica").await
}
