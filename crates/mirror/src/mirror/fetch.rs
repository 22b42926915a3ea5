//! Fetching chunks: from the peers that hold them, else from the
//! repository through a bounded gate, checked against the manifest and
//! landed in the mirror file; and the reads and writes that need them.

use super::*;

/// Most chunks fetched at once for one read request.
const PARALLEL_FETCHES: usize = 8;
/// Most repository reads in flight from one mirror.
const REPO_READS: usize = 16;
/// How long a mirror that is not first in line for a chunk waits for the
/// first one to announce its repository fetch before fetching it itself.
const REPO_DEFER: Duration = Duration::from_millis(50);
/// Chunks either side of a wanted one: a peer holding or fetching one of
/// them is reading the same region, so it may well fetch this one too.
const NEARBY: u32 = 8;

/// A counting semaphore: bounds this mirror's load on the repository.
#[derive(Default)]
pub(super) struct Gate {
    used: Mutex<usize>,
    freed: Condvar,
}

impl Gate {
    fn acquire(&self, limit: usize) {
        let mut used = self.used.lock();
        while *used >= limit {
            self.freed.wait(&mut used);
        }
        *used += 1;
    }

    fn release(&self) {
        *self.used.lock() -= 1;
        self.freed.notify_one();
    }
}

/// A mirror's rank for chunk `c` (lower goes first): FNV-1a of its
/// peer address and the chunk number, so every mirror computes the same
/// order without talking.
fn rank(addr: &str, c: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in addr.bytes().chain(c.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Inner {
    /// Fetches and checks chunk `c`: peers first (up to two), then the
    /// repository. A peer that advertises the chunk while this fetch
    /// waits for a repository slot is asked instead: mirrors reading the
    /// same region at once then share one repository read.
    pub(super) fn fetch(&self, c: u32, demand: bool) -> Result<(Vec<u8>, Source)> {
        let timeout = if demand {
            self.config.demand_timeout
        } else {
            self.config.prefetch_timeout
        };
        let mut asked = 0;
        let mut waited = false;
        let mut deferred = false;
        let busy_until = Instant::now() + timeout;
        loop {
            let mut busy = false;
            for link in self.holders(c) {
                asked += 1;
                match link.request(c, demand, timeout) {
                    Ok(data) if self.manifest.verify(c, &data) => return Ok((data, Source::Peer)),
                    Ok(_) => {
                        tracing::warn!(
                            "peer {} sent chunk {c} that fails its digest; ignoring that peer",
                            link.remote
                        );
                        bump(&self.counters.corrupt_from_peers);
                        link.mark_suspect();
                    }
                    Err(PeerMiss::Timeout) => bump(&self.counters.peer_timeouts),
                    Err(PeerMiss::Unavailable) => bump(&self.counters.peer_unavailable),
                    Err(PeerMiss::Busy) => {
                        bump(&self.counters.peer_busy);
                        busy = true;
                    }
                }
            }
            if busy && Instant::now() < busy_until {
                // Holders are saturated: more will hold it soon.
                let mut t = self.table.lock();
                self.changed.wait_for(&mut t, Duration::from_millis(20));
                continue;
            }
            if !waited && self.wait_for_coming(c, timeout) {
                waited = true;
                continue;
            }
            if !deferred {
                deferred = true;
                if self.defer_to_peers(c) {
                    continue;
                }
            }
            self.repo_gate.acquire(REPO_READS);
            if asked == 0 && !self.holders(c).is_empty() {
                self.repo_gate.release();
                continue;
            }
            for l in self.peers.lock().links.iter() {
                l.announce_fetch(c);
            }
            let data = self.read_repo_gated(c);
            self.repo_gate.release();
            return Ok((data?, Source::Repo));
        }
    }

    /// Mirrors reading the same region at once would each fetch a chunk
    /// nobody holds yet from the repository. So a mirror goes first only
    /// if it ranks first for the chunk among itself and its peers (a hash
    /// of chunk and address); otherwise, when a peer reads nearby, it
    /// waits up to [`REPO_DEFER`] for an announcement or an advertisement.
    /// Returns `true` if it waited.
    pub(super) fn defer_to_peers(&self, c: u32) -> bool {
        let Some(me) = self.identity.as_ref().map(|i| i.listen.as_str()) else {
            return false;
        };
        let mine = rank(me, c);
        let lo = c.saturating_sub(NEARBY);
        let hi = c
            .saturating_add(NEARBY)
            .min(self.manifest.chunks().saturating_sub(1));
        let (outranked, nearby) = {
            let p = self.peers.lock();
            let usable = || p.links.iter().filter(|l| l.usable());
            let outranked = usable().any(|l| (rank(&l.remote, c), l.remote.as_str()) < (mine, me));
            let nearby =
                usable().any(|l| (lo..=hi).any(|n| n != c && (l.holds(n) || l.is_fetching(n))));
            (outranked, nearby)
        };
        if !outranked || !nearby {
            return false;
        }
        let arrived = |i: &Self| {
            let p = i.peers.lock();
            p.links
                .iter()
                .any(|l| l.usable() && (l.holds(c) || l.is_fetching(c)))
        };
        let deadline = Instant::now() + REPO_DEFER;
        let mut t = self.table.lock();
        while !arrived(self) && !self.stopping() {
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                break;
            }
        }
        bump(&self.counters.repo_deferred);
        true
    }

    /// If a peer announced it is fetching `c` from the repository, waits
    /// (up to `timeout`) for its advertisement; `true` if it waited.
    pub(super) fn wait_for_coming(&self, c: u32, timeout: Duration) -> bool {
        let coming = |i: &Self| {
            let p = i.peers.lock();
            let fetching = p.links.iter().any(|l| l.usable() && l.is_fetching(c));
            let held = p.links.iter().any(|l| l.usable() && l.holds(c));
            fetching && !held
        };
        let mut t = self.table.lock();
        if !coming(self) {
            return false;
        }
        let deadline = Instant::now() + timeout;
        while coming(self) && !self.stopping() {
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                break;
            }
        }
        true
    }

    /// Reads and checks chunk `c` from the repository, waiting for a slot.
    pub(super) fn read_repo(&self, c: u32) -> Result<Vec<u8>> {
        self.repo_gate.acquire(REPO_READS);
        let data = self.read_repo_gated(c);
        self.repo_gate.release();
        data
    }

    /// Reads and checks chunk `c` from the repository (slot held).
    pub(super) fn read_repo_gated(&self, c: u32) -> Result<Vec<u8>> {
        let (off, len) = self.manifest.extent(c);
        let mut data = vec![0u8; len];
        self.repo.read(off, &mut data)?;
        if !self.manifest.verify(c, &data) {
            return Err(MirrorError::Repo {
                repo: self.repo.describe(),
                detail: format!(
                    "chunk {c} (offset {off}) does not match the manifest: the image changed since `strata mirror digest`"
                ),
            });
        }
        Ok(data)
    }

    /// Stores fetched data if the chunk still wants it; wakes waiters.
    pub(super) fn land(&self, c: u32, data: &[u8]) -> Result<()> {
        let mut t = self.table.lock();
        if t.may_land(c) {
            let (off, _) = self.manifest.extent(c);
            self.store
                .image
                .write_all_at(data, off)
                .map_err(io_err(format!(
                    "cannot write '{}'",
                    self.store.image_path.display()
                )))?;
            let new = t.landed(c);
            self.store.set(c, new)?;
            if new.holds_image_data() {
                let mut p = self.peers.lock();
                p.acquired.push(c);
                for l in &p.links {
                    l.advertise(&[c]);
                }
            }
        }
        drop(t);
        self.changed.notify_all();
        Ok(())
    }

    /// Runs an on-demand fetch this thread owns.
    pub(super) fn fetch_owned(&self, c: u32) -> Result<()> {
        match self.fetch(c, true) {
            Ok((data, source)) => {
                match source {
                    Source::Peer => {
                        bump(&self.counters.peer_demand);
                        self.table.lock().demand_from_peer(c);
                    }
                    Source::Repo => bump(&self.counters.repo_demand),
                }
                self.land(c, &data)
            }
            Err(e) => {
                self.table.lock().fetch_failed(c);
                self.changed.notify_all();
                Err(e)
            }
        }
    }

    /// Waits for someone else's fetch of `c`; past the demand timeout,
    /// takes it over from the repository.
    pub(super) fn wait_for(&self, c: u32) -> Result<()> {
        let deadline = Instant::now() + self.config.demand_timeout + self.config.prefetch_timeout;
        let mut t = self.table.lock();
        loop {
            match t.state(c) {
                ChunkState::Fetching | ChunkState::Prefetch { .. } => {}
                _ => return Ok(()),
            }
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                drop(t);
                let data = self.read_repo(c)?;
                bump(&self.counters.repo_demand);
                return self.land(c, &data);
            }
        }
    }

    /// Makes chunks `first..=last` readable.
    pub(super) fn ensure_read(&self, first: u32, last: u32) -> Result<()> {
        let mut owned = Vec::new();
        let mut waits = Vec::new();
        {
            let mut t = self.table.lock();
            for c in first..=last {
                match t.begin_read(c) {
                    Access::Ready => {}
                    Access::Fetch => owned.push(c),
                    Access::Wait => waits.push(c),
                }
            }
        }
        if !owned.is_empty() {
            self.changed.notify_all();
        }
        // A random order: mirrors reading the same request at once fetch
        // different chunks from the repository first, then trade them.
        let mut rng =
            Rng::new(Instant::now().duration_since(self.started).as_nanos() as u64 ^ first as u64);
        for i in (1..owned.len()).rev() {
            owned.swap(i, rng.below(i + 1));
        }
        let result = std::thread::scope(|s| {
            let mut results = Vec::new();
            for group in owned.chunks(owned.len().div_ceil(PARALLEL_FETCHES).max(1)) {
                results.push(s.spawn(move || group.iter().try_for_each(|c| self.fetch_owned(*c))));
            }
            results
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(MirrorError::Invalid("fetch thread panicked".into()))
                    })
                })
                .collect::<Result<Vec<()>>>()
        });
        result?;
        for c in waits {
            self.wait_for(c)?;
            // The other fetch may have failed: ask again.
            self.ensure_read(c, c)?;
        }
        Ok(())
    }

    /// Makes chunk `c` writable (`whole`: the write covers it all).
    pub(super) fn ensure_write(&self, c: u32, whole: bool) -> Result<()> {
        loop {
            let access = self.table.lock().begin_write(c, whole);
            match access {
                Access::Ready => return Ok(()),
                Access::Fetch => self.fetch_owned(c)?,
                Access::Wait => self.wait_for(c)?,
            }
        }
    }
}
