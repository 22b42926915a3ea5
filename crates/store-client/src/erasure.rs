//! Erasure coding of objects ([`StorageClass::ErasureCoded`]): stripes
//! encoded and decoded with the `reed-solomon-erasure` crate, and an
//! object's fragments read as streams, a stripe at a time, from any k of
//! them. Clients use it for Posts and Gets; metadata nodes for repair;
//! storage nodes to gather the objects they serve whole. What a read
//! asks for and when is decided by [`crate::read_plan`]; this module
//! carries it out over TCP.
//!
//! [`StorageClass::ErasureCoded`]: strata_store_protocol::class::StorageClass

use crate::read_plan::{Action, Event, ReadPlan};
use crate::stream::read_status;
use crate::transport::{guarded, Guarded, REPLY_STALL};
use reed_solomon_erasure::galois_8::ReedSolomon;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::class::StripeLayout;
use strata_store_protocol::wire::Fragments;
use strata_store_protocol::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::task::{AbortHandle, JoinSet};

/// Encodes and decodes the stripes of one object.
pub struct StripeCoder {
    layout: StripeLayout,
    codec: ReedSolomon,
}

fn coding_error(what: &str, e: reed_solomon_erasure::Error) -> Error {
    Error::Corrupt(format!("erasure coding: {what}: {e:?}"))
}

impl StripeCoder {
    /// A coder for stripes of `layout`.
    pub fn new(layout: StripeLayout) -> Result<StripeCoder, Error> {
        let codec = ReedSolomon::new(layout.data, layout.parity)
            .map_err(|e| coding_error("setting up the codec", e))?;
        Ok(StripeCoder { layout, codec })
    }

    /// The layout this coder works on.
    pub fn layout(&self) -> StripeLayout {
        self.layout
    }

    /// The parity shards of one stripe, whose data `stripe` holds
    /// ([`StripeLayout::stripe_data`] bytes, zero-padded at the end).
    pub fn encode(&mut self, stripe: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        let (k, m, shard) = (self.layout.data, self.layout.parity, self.layout.shard);
        if stripe.len() != k * shard {
            return Err(Error::Corrupt(format!(
                "erasure coding: a stripe of {} bytes where its layout has {}",
                stripe.len(),
                k * shard
            )));
        }
        let data: Vec<&[u8]> = stripe.chunks(shard).collect();
        let mut parity = vec![vec![0u8; shard]; m];
        self.codec
            .encode_sep(&data, &mut parity)
            .map_err(|e| coding_error("encoding a stripe", e))?;
        Ok(parity)
    }

    /// The `k` data shards of a stripe from `shards`: at least `k` of its
    /// shards, by fragment index (data first, then parity), each checked
    /// before it came here. Data shards present are taken as they are;
    /// missing ones are decoded.
    pub fn decode(&mut self, shards: Vec<(usize, Vec<u8>)>) -> Result<Vec<Vec<u8>>, Error> {
        let (k, m, shard) = (self.layout.data, self.layout.parity, self.layout.shard);
        let mut slots: Vec<Option<Vec<u8>>> = vec![None; k + m];
        for (index, bytes) in shards {
            if index >= k + m || bytes.len() != shard {
                return Err(Error::Corrupt(format!(
                    "erasure coding: shard {index} of {} bytes, where ec({k},{m}) has shards 0 to {} of {shard}",
                    bytes.len(),
                    k + m - 1
                )));
            }
            slots[index] = Some(bytes);
        }
        if slots[..k].iter().any(Option::is_none) {
            self.codec
                .reconstruct_data(&mut slots)
                .map_err(|e| coding_error("decoding a stripe", e))?;
        }
        slots.truncate(k);
        slots
            .into_iter()
            .enumerate()
            .map(|(index, shard)| {
                shard.ok_or_else(|| {
                    Error::Corrupt(format!("erasure coding: data shard {index} not restored"))
                })
            })
            .collect()
    }
}

/// One fragment, where it is served and how to ask for it.
#[derive(Clone, Debug)]
pub struct FragmentSource {
    /// Its index in the record (0..k+m).
    pub index: usize,
    /// Its replica address.
    pub addr: Addr,
    /// Its storage node's data endpoint.
    pub endpoint: SocketAddr,
    /// The encoded Get request for it, credentials included.
    pub request: Vec<u8>,
    /// Idle connections to take one from, and to give it back to once
    /// the fragment is read whole (`None`: a new connection each time).
    pub pool: Option<Arc<StreamPool>>,
}

/// Idle data connections for fragment reads, by storage node endpoint:
/// a new connection costs the node its buffers and a thread wake-up per
/// fragment, which cost more than the fragment itself on a cold read of
/// a 1 MiB object. At most [`POOL_PER_NODE`] per node and
/// [`POOL_TOTAL`] in all.
#[derive(Debug, Default)]
pub struct StreamPool {
    idle: Mutex<HashMap<SocketAddr, Vec<Guarded<TcpStream>>>>,
}

/// Idle connections a [`StreamPool`] keeps per node.
pub const POOL_PER_NODE: usize = 16;
/// Idle connections a [`StreamPool`] keeps in all.
pub const POOL_TOTAL: usize = 256;

impl StreamPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Vec<Guarded<TcpStream>>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self, endpoint: SocketAddr) -> Option<Guarded<TcpStream>> {
        let mut idle = self.lock();
        let stream = idle.get_mut(&endpoint).and_then(Vec::pop);
        if idle.get(&endpoint).is_some_and(Vec::is_empty) {
            idle.remove(&endpoint);
        }
        stream
    }

    fn keep(&self, endpoint: SocketAddr, stream: Guarded<TcpStream>) {
        let mut idle = self.lock();
        if idle.values().map(Vec::len).sum::<usize>() >= POOL_TOTAL {
            return;
        }
        let for_node = idle.entry(endpoint).or_default();
        if for_node.len() < POOL_PER_NODE {
            for_node.push(stream);
        }
    }
}

/// A fragment being read: its stream, positioned after the bytes read.
struct OpenFragment {
    index: usize,
    addr: Addr,
    stream: BufReader<Guarded<TcpStream>>,
    crc: u32,
    /// Where the stream goes back once the fragment is read whole.
    home: Option<(SocketAddr, Arc<StreamPool>)>,
}

/// Bytes of buffering per fragment stream: a stripe's shard or less.
const FRAGMENT_BUFFER: usize = 64 * 1024;

/// Connects to `source`, sends its Get, reads the reply's status and
/// size (which must be `len`), then skips `skip` bytes of it (a
/// replacement for a fragment that failed part way), counting them in
/// its CRC.
async fn open_fragment(source: FragmentSource, len: u64, skip: u64) -> Result<OpenFragment, Error> {
    let (index, addr) = (source.index, source.addr);
    let io = move |e| Error::io(format!("reading fragment {index} ({})", fmt_addr(addr)), e);
    let idle = source.pool.as_ref().and_then(|p| p.take(source.endpoint));
    let (stream, have) = match idle {
        // An idle connection the node closed meanwhile fails before any
        // answer: a new one then.
        Some(stream) => match ask_fragment(stream, &source.request, io).await {
            Ok(answer) => answer,
            Err(_) => {
                let stream = crate::transport::connect_data(source.endpoint).await?;
                ask_fragment(guarded(stream, REPLY_STALL), &source.request, io).await?
            }
        },
        None => {
            let stream = crate::transport::connect_data(source.endpoint).await?;
            ask_fragment(guarded(stream, REPLY_STALL), &source.request, io).await?
        }
    };
    if have != len {
        return Err(Error::Corrupt(format!(
            "fragment {} ({}) holds {have} bytes; its object's layout says {len}",
            source.index,
            fmt_addr(source.addr)
        )));
    }
    let mut fragment = OpenFragment {
        index: source.index,
        addr: source.addr,
        stream,
        crc: 0,
        home: source.pool.map(|pool| (source.endpoint, pool)),
    };
    // Allocated only for a replacement that skips (the common open reads
    // from the start).
    let mut buffer = vec![0u8; if skip > 0 { FRAGMENT_BUFFER } else { 0 }];
    let mut left = skip;
    while left > 0 {
        let n = left.min(FRAGMENT_BUFFER as u64) as usize;
        fragment
            .stream
            .read_exact(&mut buffer[..n])
            .await
            .map_err(io)?;
        fragment.crc = crc32c::crc32c_append(fragment.crc, &buffer[..n]);
        left -= n as u64;
    }
    Ok(fragment)
}

/// Sends a fragment's Get `request` on `stream` and reads the answer's
/// status and size.
async fn ask_fragment(
    mut stream: Guarded<TcpStream>,
    request: &[u8],
    io: impl Fn(std::io::Error) -> Error + Copy,
) -> Result<(BufReader<Guarded<TcpStream>>, u64), Error> {
    stream.write_all(request).await.map_err(io)?;
    let mut stream = BufReader::with_capacity(FRAGMENT_BUFFER, stream);
    read_status(&mut stream, "reading a fragment").await?;
    let have = stream.read_u64().await.map_err(io)?;
    Ok((stream, have))
}

/// Reads the next `shard` bytes of `fragment`.
async fn read_shard(
    mut fragment: OpenFragment,
    shard: usize,
) -> (OpenFragment, Result<Vec<u8>, Error>) {
    // Read into spare capacity: no zeroing of a buffer about to be
    // overwritten.
    let mut bytes = Vec::with_capacity(shard);
    let read = (&mut fragment.stream)
        .take(shard as u64)
        .read_to_end(&mut bytes)
        .await
        .and_then(|n| match n == shard {
            true => Ok(n),
            false => Err(std::io::ErrorKind::UnexpectedEof.into()),
        });
    match read {
        Ok(_) => {
            fragment.crc = crc32c::crc32c_append(fragment.crc, &bytes);
            (fragment, Ok(bytes))
        }
        Err(e) => {
            let at = fmt_addr(fragment.addr);
            let index = fragment.index;
            (
                fragment,
                Err(Error::io(format!("reading fragment {index} ({at})"), e)),
            )
        }
    }
}

/// Why a fragment read failed: the fragment, and whether its bytes were
/// wrong (a CRC or size mismatch, to be reported and repaired) rather
/// than unreachable.
#[derive(Debug)]
pub struct FragmentFailure {
    /// The fragment's index.
    pub index: usize,
    /// Its replica address.
    pub addr: Addr,
    /// Its bytes were wrong.
    pub damaged: bool,
    /// What happened.
    pub error: Error,
}

/// Reads an object's stripes from any `k` of its fragments, carrying out
/// the decisions of a [`ReadPlan`]: it starts with the first `k` of the
/// order it is given, replaces a fragment that fails by the next one
/// (which skips what was already read), with a hedge delay asks for one
/// fragment more if the first stripe has not come by then (keeping the
/// first `k` to answer), and reads again without a fragment that failed
/// its checksum. A read may first ask fragment 0's node for the whole
/// object ([`FragmentReader::asks_whole`]), which its caller does.
pub struct FragmentReader {
    coder: StripeCoder,
    crcs: Vec<u32>,
    /// The sources by fragment index (`None`: served by no known node).
    sources: Vec<Option<FragmentSource>>,
    plan: ReadPlan,
    /// The plan's actions not carried out yet.
    pending: VecDeque<Action>,
    /// Fragments open, between shards.
    open: Vec<OpenFragment>,
    /// The current stripe's shards that arrived, by fragment index.
    shards: Vec<(usize, Vec<u8>)>,
    tasks: JoinSet<ShardRead>,
    reads: HashMap<usize, AbortHandle>,
    hedge: Option<Duration>,
    hedge_at: Option<Instant>,
    pass_started: Instant,
    /// Fragments that failed so far.
    pub failures: Vec<FragmentFailure>,
    /// Per fragment read, the time its first shard took (a latency
    /// sample of its node).
    pub first_shard: Vec<(usize, Duration)>,
    /// The fragments opened, in the order they were (a fragment opened
    /// again in a later pass is listed again).
    pub opened: Vec<usize>,
}

impl FragmentReader {
    /// A reader of the object `size` bytes, `fragments`, from `sources`
    /// in the order to try them; with `whole`, the read asks fragment
    /// 0's node for the whole object first.
    pub fn new(
        size: u64,
        fragments: &Fragments,
        sources: Vec<FragmentSource>,
        hedge: Option<Duration>,
        whole: bool,
    ) -> Result<FragmentReader, Error> {
        let layout = StripeLayout::new(size, fragments.data, fragments.parity());
        let total = layout.data + layout.parity;
        let order: Vec<usize> = sources.iter().map(|s| s.index).collect();
        let mut by_index: Vec<Option<FragmentSource>> = vec![None; total];
        for source in sources {
            if source.index >= total {
                return Err(Error::Corrupt(format!(
                    "fragment {} of an object of {total} fragments",
                    source.index
                )));
            }
            let index = source.index;
            by_index[index] = Some(source);
        }
        let mut plan = ReadPlan::new(
            layout.data,
            total,
            layout.stripes,
            order,
            whole,
            hedge.is_some(),
        );
        let pending = plan.start().into();
        Ok(FragmentReader {
            coder: StripeCoder::new(layout)?,
            crcs: fragments.crcs.clone(),
            sources: by_index,
            plan,
            pending,
            open: Vec::new(),
            shards: Vec::new(),
            tasks: JoinSet::new(),
            reads: HashMap::new(),
            hedge,
            hedge_at: None,
            pass_started: Instant::now(),
            failures: Vec::new(),
            first_shard: Vec::new(),
            opened: Vec::new(),
        })
    }

    /// The layout of the object's stripes.
    pub fn layout(&self) -> StripeLayout {
        self.coder.layout()
    }

    /// Whether the plan asks fragment 0's node for the whole object
    /// first: the caller does, then tells [`FragmentReader::whole_read`].
    pub fn asks_whole(&self) -> bool {
        self.pending.front() == Some(&Action::AskWhole)
    }

    /// How the whole-object read went; `true` if that ends the read.
    pub fn whole_read(&mut self, served: bool) -> bool {
        if !self.asks_whole() {
            return false;
        }
        let event = match served {
            true => Event::WholeServed,
            false => Event::WholeFailed,
        };
        self.pending = self.plan.on(event).into();
        self.pending.front() == Some(&Action::Done)
    }

    fn failed(&mut self, index: usize, addr: Addr, error: Error) {
        let damaged = matches!(error, Error::Corrupt(_));
        self.failures.push(FragmentFailure {
            index,
            addr,
            damaged,
            error,
        });
    }

    /// The error of a read given up: the plan's reason and each
    /// fragment's error.
    fn given_up(&self, why: &str) -> Error {
        let reasons: Vec<String> = self
            .failures
            .iter()
            .map(|f| format!("fragment {}: {}", f.index, f.error.report()))
            .collect();
        Error::Corrupt(format!("{why} ({})", reasons.join("; ")))
    }

    /// Starts reading fragment `index` from stripe `stripe` on.
    fn open(&mut self, index: usize, stripe: u64) {
        let layout = self.coder.layout();
        let Some(source) = self.sources.get(index).cloned().flatten() else {
            return;
        };
        self.opened.push(index);
        let skip = stripe * layout.shard as u64;
        let read = open_and_read(source, layout.fragment_len(), skip, layout.shard);
        self.reads.insert(index, self.tasks.spawn(read));
    }

    /// Reads the next shard of the open fragment `index`.
    fn continue_read(&mut self, index: usize) {
        let shard = self.coder.layout().shard;
        let Some(at) = self.open.iter().position(|f| f.index == index) else {
            return;
        };
        let fragment = self.open.swap_remove(at);
        let read = async move {
            let (fragment, bytes) = read_shard(fragment, shard).await;
            (Ok(fragment), bytes)
        };
        self.reads.insert(index, self.tasks.spawn(read));
    }

    /// Drops every read of the last pass.
    fn restart(&mut self) {
        self.tasks.abort_all();
        self.reads.clear();
        self.open.clear();
        self.shards.clear();
        self.hedge_at = None;
        self.pass_started = Instant::now();
    }

    /// The next thing that happened to a read: a shard, a failure, or
    /// the hedge delay passing.
    async fn next_event(&mut self) -> Result<Event, Error> {
        loop {
            let joined = match self.hedge_at {
                Some(at) => {
                    match tokio::time::timeout_at(at.into(), self.tasks.join_next_with_id()).await {
                        Ok(joined) => joined,
                        Err(_) => {
                            self.hedge_at = None;
                            return Ok(Event::HedgeFired);
                        }
                    }
                }
                None => self.tasks.join_next_with_id().await,
            };
            let Some(joined) = joined else {
                // The plan waits only for reads it started.
                return Err(Error::Peer("the fragment reads ended early".to_string()));
            };
            let (task, (opened, bytes)) = match joined {
                Ok(read) => read,
                Err(join) if join.is_cancelled() => continue,
                Err(join) => {
                    return Err(Error::Peer(format!("a fragment read stopped: {join}")));
                }
            };
            let index = match &opened {
                Ok(fragment) => fragment.index,
                Err((index, _)) => *index,
            };
            // A read cancelled (or of a pass restarted) after it ended is
            // not the fragment's current read, even if it was opened
            // again since.
            if self.reads.get(&index).map(AbortHandle::id) != Some(task) {
                continue;
            }
            self.reads.remove(&index);
            if !self.plan.is_reading(index) {
                continue;
            }
            return Ok(match (opened, bytes) {
                (Ok(fragment), Ok(bytes)) => {
                    if self.plan.stripe() == 0 {
                        self.first_shard.push((index, self.pass_started.elapsed()));
                    }
                    self.shards.push((index, bytes));
                    self.open.push(fragment);
                    Event::ShardArrived(index)
                }
                (Ok(fragment), Err(e)) => {
                    self.failed(index, fragment.addr, e);
                    self.shard_failed(index)
                }
                (Err((_, addr)), result) => {
                    let e = result.err().unwrap_or_else(|| {
                        Error::Peer(format!("fragment {index} could not be opened"))
                    });
                    self.failed(index, addr, e);
                    self.shard_failed(index)
                }
            });
        }
    }

    /// The plan's event for the last failure (of fragment `index`).
    fn shard_failed(&self, index: usize) -> Event {
        let damaged = self.failures.last().is_some_and(|f| f.damaged);
        Event::ShardFailed { index, damaged }
    }

    /// The next stripe's `k` data shards, or `None` after the last one
    /// of this pass.
    pub async fn next_stripe(&mut self) -> Option<Result<Vec<Vec<u8>>, Error>> {
        loop {
            while let Some(action) = self.pending.pop_front() {
                match action {
                    Action::Restart => self.restart(),
                    Action::ArmHedge => {
                        self.hedge_at = self.hedge.map(|delay| Instant::now() + delay);
                    }
                    Action::Open { index, stripe } => self.open(index, stripe),
                    Action::Continue { index, .. } => self.continue_read(index),
                    Action::Cancel(index) => {
                        // Its stream closes with it.
                        if let Some(read) = self.reads.remove(&index) {
                            read.abort();
                        }
                        self.open.retain(|f| f.index != index);
                    }
                    Action::Decode(used) => {
                        let shards: Vec<(usize, Vec<u8>)> = std::mem::take(&mut self.shards)
                            .into_iter()
                            .filter(|(index, _)| used.contains(index))
                            .collect();
                        return Some(self.coder.decode(shards));
                    }
                    Action::GiveUp(why) => return Some(Err(self.given_up(&why))),
                    Action::Verify => {
                        // Back at the front for finish.
                        self.pending.push_front(Action::Verify);
                        return None;
                    }
                    Action::AskWhole | Action::Done => {
                        self.pending.push_front(action);
                        return None;
                    }
                }
            }
            let event = match self.next_event().await {
                Ok(event) => event,
                Err(e) => return Some(Err(e)),
            };
            self.pending = self.plan.on(event).into();
        }
    }

    /// After the last stripe of a pass: checks each fragment read against
    /// its node's trailer and the record's CRC-32C, and, with
    /// `object_ok`, whether the decoded object matched its own. `Ok(true)`:
    /// the read is done; `Ok(false)`: read again without the fragments
    /// that failed (rewind the output, then [`FragmentReader::next_stripe`]);
    /// an error: too few fragments are left (each failure is also in
    /// [`FragmentReader::failures`]).
    pub async fn finish(&mut self, object_ok: bool) -> Result<bool, Error> {
        if self.pending.front() != Some(&Action::Verify) {
            return Err(Error::Peer(
                "the fragment read is not at its end; read every stripe first".to_string(),
            ));
        }
        self.pending.pop_front();
        let mut bad = Vec::new();
        for mut fragment in std::mem::take(&mut self.open) {
            let at = fmt_addr(fragment.addr);
            let io = |e| Error::io(format!("reading fragment {} ({at})", fragment.index), e);
            let trailer = async {
                let verified = fragment.stream.read_u8().await.map_err(io)? == 0;
                let _node_crc = fragment.stream.read_u32().await.map_err(io)?;
                Ok::<bool, Error>(verified)
            };
            let want = self.crcs.get(fragment.index).copied();
            let problem = match trailer.await {
                Ok(verified) if verified && want == Some(fragment.crc) => {
                    // In step (nothing past the trailer): reusable.
                    if let Some((endpoint, pool)) = &fragment.home {
                        if fragment.stream.buffer().is_empty() {
                            pool.keep(*endpoint, fragment.stream.into_inner());
                        }
                    }
                    continue;
                }
                Ok(_) => Error::Corrupt(format!(
                    "fragment {} ({at}) failed its checksum (got {:08x}, want {:08x})",
                    fragment.index,
                    fragment.crc,
                    want.unwrap_or(0)
                )),
                Err(e) => e,
            };
            self.failed(fragment.index, fragment.addr, problem);
            bad.push(fragment.index);
        }
        self.pending = self.plan.on(Event::Verified { bad, object_ok }).into();
        match self.pending.front() {
            Some(Action::Done) => Ok(true),
            Some(Action::GiveUp(why)) => Err(self.given_up(&why.clone())),
            _ => Ok(false),
        }
    }
}

/// Reads a whole object of `size` bytes and CRC-32C `crc` into memory
/// from any k of its `sources` (in the order given): a fragment that
/// fails is left out of the next attempt, while k are left (the
/// decisions are [`ReadPlan`]'s). Returns the object and the fragments
/// that failed on the way (to report them).
pub async fn gather_object(
    size: u64,
    crc: u32,
    fragments: &Fragments,
    sources: Vec<FragmentSource>,
    hedge: Option<Duration>,
) -> Result<(Vec<u8>, Vec<FragmentFailure>), Error> {
    let mut reader = FragmentReader::new(size, fragments, sources, hedge, false)?;
    let mut object = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(1 << 30));
    loop {
        object.clear();
        while let Some(stripe) = reader.next_stripe().await {
            for shard in stripe? {
                let take = (size - object.len() as u64).min(shard.len() as u64) as usize;
                object.extend_from_slice(&shard[..take]);
            }
        }
        let object_ok = object.len() as u64 == size && crc32c::crc32c(&object) == crc;
        if reader.finish(object_ok).await? {
            return Ok((object, std::mem::take(&mut reader.failures)));
        }
    }
}

/// What a shard-reading task gives back: the fragment (or, if it could
/// not be opened, its index and address) and the shard.
type ShardRead = (Result<OpenFragment, (usize, Addr)>, Result<Vec<u8>, Error>);

/// Opens `source` past `skip` bytes and reads one shard.
async fn open_and_read(source: FragmentSource, len: u64, skip: u64, shard: usize) -> ShardRead {
    let (index, addr) = (source.index, source.addr);
    match open_fragment(source, len, skip).await {
        Ok(fragment) => {
            let (fragment, bytes) = read_shard(fragment, shard).await;
            (Ok(fragment), bytes)
        }
        Err(e) => (Err((index, addr)), Err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(size: usize) -> Vec<u8> {
        (0..size).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Every fragment of `data` in `layout`, by index.
    fn fragments(layout: StripeLayout, data: &[u8]) -> Vec<Vec<u8>> {
        let mut coder = StripeCoder::new(layout).unwrap();
        let mut out = vec![Vec::new(); layout.data + layout.parity];
        for stripe in 0..layout.stripes as usize {
            let mut bytes = vec![0u8; layout.stripe_data()];
            let start = (stripe * layout.stripe_data()).min(data.len());
            let end = (start + layout.stripe_data()).min(data.len());
            bytes[..end - start].copy_from_slice(&data[start..end]);
            for (index, shard) in bytes.chunks(layout.shard).enumerate() {
                out[index].extend_from_slice(shard);
            }
            for (index, parity) in coder.encode(&bytes).unwrap().into_iter().enumerate() {
                out[layout.data + index].extend_from_slice(&parity);
            }
        }
        out
    }

    #[test]
    fn any_k_fragments_give_the_object_back() {
        for (size, k, m) in [(5000usize, 4u8, 2u8), (3 << 20, 4, 2), (100_000, 3, 3)] {
            let data = object(size);
            let layout = StripeLayout::new(size as u64, k, m);
            let all = fragments(layout, &data);
            let n = layout.data + layout.parity;
            // Every choice of k fragments among n (as bit masks).
            for mask in 0u32..(1 << n) {
                if mask.count_ones() as usize != layout.data {
                    continue;
                }
                let mut coder = StripeCoder::new(layout).unwrap();
                let mut back = Vec::new();
                for stripe in 0..layout.stripes as usize {
                    let range = stripe * layout.shard..(stripe + 1) * layout.shard;
                    let shards: Vec<(usize, Vec<u8>)> = (0..n)
                        .filter(|i| mask & (1 << i) != 0)
                        .map(|i| (i, all[i][range.clone()].to_vec()))
                        .collect();
                    for shard in coder.decode(shards).unwrap() {
                        back.extend_from_slice(&shard);
                    }
                }
                back.truncate(size);
                assert!(
                    back == data,
                    "{size} bytes, ec({k},{m}), fragments {mask:b}"
                );
            }
        }
    }

    /// Encoding and decoding speed of `ec(4,2)` on 1 MiB stripes, per
    /// core (one thread): `cargo test --release -p strata-store-client
    /// --lib coding_throughput -- --ignored --nocapture`. Decoding runs
    /// with two data fragments missing, the worst case of 4+2.
    #[test]
    #[ignore]
    fn coding_throughput() {
        let layout = StripeLayout::new(1 << 20, 4, 2);
        let stripe = object(layout.stripe_data());
        let mut coder = StripeCoder::new(layout).unwrap();
        let rounds = 128;
        let start = Instant::now();
        let mut parity = Vec::new();
        for _ in 0..rounds {
            parity = coder.encode(&stripe).unwrap();
        }
        let encode = start.elapsed();
        let shards: Vec<(usize, Vec<u8>)> = vec![
            (2, stripe[2 * layout.shard..3 * layout.shard].to_vec()),
            (3, stripe[3 * layout.shard..].to_vec()),
            (4, parity[0].clone()),
            (5, parity[1].clone()),
        ];
        // Copies made before the clock starts: a Get's shards arrive
        // owned, and copying them is no part of decoding.
        let copies: Vec<_> = (0..rounds).map(|_| shards.clone()).collect();
        let start = Instant::now();
        let mut restored = Vec::new();
        for copy in copies {
            restored = coder.decode(copy).unwrap();
        }
        let decode = start.elapsed();
        assert_eq!(restored[0], stripe[..layout.shard]);
        assert_eq!(restored[1], stripe[layout.shard..2 * layout.shard]);
        let bytes = (rounds * layout.stripe_data()) as f64;
        println!(
            "ec(4,2), 1 MiB stripes, one core: encode {:.2} GB/s, decode (2 data fragments lost) {:.2} GB/s",
            bytes / encode.as_secs_f64() / 1e9,
            bytes / decode.as_secs_f64() / 1e9
        );
    }

    #[test]
    fn fewer_than_k_fragments_are_an_error_not_a_guess() {
        let layout = StripeLayout::new(4096, 4, 2);
        let all = fragments(layout, &object(4096));
        let mut coder = StripeCoder::new(layout).unwrap();
        let three: Vec<(usize, Vec<u8>)> = [0, 4, 5].iter().map(|&i| (i, all[i].clone())).collect();
        assert!(coder.decode(three).is_err());
    }
}
