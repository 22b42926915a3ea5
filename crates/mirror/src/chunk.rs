//! The per-chunk state machine and the adaptive prefetch policy, pure:
//! no I/O, no clock, no threads. [`crate::mirror`] drives it under a lock.
//!
//! States, as in Nicolae et al. (JPDC 2016), plus one for an on-demand
//! fetch in flight:
//!
//! - `Remote`: only in the repository (and maybe at peers);
//! - `Fetching`: an on-demand fetch (a read, or a partial write) is in flight;
//! - `Prefetch`: a prefetch is in flight (from an advertisement or a trace);
//! - `Local`: prefetched and stored, not yet read here;
//! - `Read`: stored and read here;
//! - `Written`: written here. Never advertised or served: the data is
//!   this host's alone.
//!
//! The adaptive policy (the paper's *unmatched* rule): every chunk
//! prefetched from an advertisement and not (yet) read counts as
//! unmatched. When the count reaches the threshold, prefetching stops and
//! later advertisements are *declined* (remembered, not fetched). When
//! `resume_hits` declined chunks have since been read on demand from a
//! peer, the patterns have converged again: prefetching resumes, the
//! unmatched count starts from zero, and the declined chunks that peers
//! advertised after the one just read (what this mirror is about to read,
//! if it follows them) are queued in advertisement order. A threshold of 0 never prefetches; `None`
//! never stops.

use std::collections::VecDeque;

/// State of one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// Not here.
    Remote,
    /// On-demand fetch in flight.
    Fetching,
    /// Prefetch in flight; `trace` when it follows a recorded trace.
    Prefetch {
        /// Prefetched along a trace rather than from an advertisement.
        trace: bool,
    },
    /// Prefetched, stored, not read yet.
    Local {
        /// Prefetched along a trace rather than from an advertisement.
        trace: bool,
    },
    /// Stored and read.
    Read,
    /// Written locally: never served to peers.
    Written,
}

impl ChunkState {
    /// Whether the stored data is the image's (may be served and advertised).
    pub fn holds_image_data(self) -> bool {
        matches!(self, ChunkState::Local { .. } | ChunkState::Read)
    }

    /// Byte stored in the on-disk state map (in-flight states are stored
    /// as `Remote`: after a crash they are fetched again).
    pub fn to_byte(self) -> u8 {
        match self {
            ChunkState::Remote | ChunkState::Fetching | ChunkState::Prefetch { .. } => 0,
            ChunkState::Local { trace: false } => 1,
            ChunkState::Local { trace: true } => 2,
            ChunkState::Read => 3,
            ChunkState::Written => 4,
        }
    }

    /// Inverse of [`ChunkState::to_byte`]; `None` for an unknown byte.
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0 => ChunkState::Remote,
            1 => ChunkState::Local { trace: false },
            2 => ChunkState::Local { trace: true },
            3 => ChunkState::Read,
            4 => ChunkState::Written,
            _ => return None,
        })
    }
}

/// What a read or write must do about a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The data is here.
    Ready,
    /// The caller now owns an on-demand fetch of the chunk.
    Fetch,
    /// Someone else is fetching it: wait, then ask again.
    Wait,
}

/// Why a chunk is prefetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchKind {
    /// A peer advertised it.
    Advert,
    /// It comes next in the recorded trace.
    Trace,
}

/// Prefetch settings.
#[derive(Debug, Clone, Copy)]
pub struct PolicyConfig {
    /// Unmatched prefetched chunks that stop prefetching; 0 disables
    /// prefetching, `None` never stops it.
    pub unmatched_threshold: Option<u32>,
    /// Declined chunks later read on demand from peers that resume it.
    pub resume_hits: u32,
    /// How far ahead of the furthest read position a trace is prefetched.
    pub trace_window: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            unmatched_threshold: Some(512),
            resume_hits: 16,
            trace_window: 64,
        }
    }
}

/// Counters of the policy, for statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PolicyCounters {
    /// Whether advertisement prefetching is on now.
    pub prefetch_on: bool,
    /// Prefetched (from advertisements) chunks not matched by a read since
    /// the last resume.
    pub unmatched: u32,
    /// Times prefetching was switched off.
    pub switched_off: u32,
    /// Times prefetching was switched back on.
    pub switched_on: u32,
    /// Advertisements declined while off.
    pub declined: u64,
}

/// Follows a recorded first-read order: which chunk to prefetch next.
#[derive(Debug, Clone)]
struct TraceCursor {
    order: Vec<u32>,
    /// Position in `order` of each chunk, `u32::MAX` if absent.
    position: Vec<u32>,
    /// One past the furthest position read so far.
    read_pos: usize,
    /// Next position to consider for prefetch.
    next: usize,
}

impl TraceCursor {
    fn new(order: Vec<u32>, chunks: u32) -> Self {
        let mut position = vec![u32::MAX; chunks as usize];
        let mut kept = Vec::with_capacity(order.len());
        for c in order {
            if c < chunks && position[c as usize] == u32::MAX {
                position[c as usize] = kept.len() as u32;
                kept.push(c);
            }
        }
        TraceCursor {
            order: kept,
            position,
            read_pos: 0,
            next: 0,
        }
    }

    fn on_read(&mut self, c: u32) {
        let p = self.position[c as usize];
        if p != u32::MAX {
            self.read_pos = self.read_pos.max(p as usize + 1);
            self.next = self.next.max(self.read_pos);
        }
    }
}

/// The states of every chunk of one mirror, and the prefetch policy.
#[derive(Debug, Clone)]
pub struct ChunkTable {
    states: Vec<ChunkState>,
    config: PolicyConfig,
    counters: PolicyCounters,
    hits: u32,
    queue: VecDeque<u32>,
    queued: Vec<bool>,
    declined: Vec<u32>,
    declined_mark: Vec<bool>,
    trace: Option<TraceCursor>,
    first_reads: Vec<u32>,
    ever_read: Vec<bool>,
}

impl ChunkTable {
    /// A table of `chunks` chunks in the given states (all `Remote` for a
    /// new mirror); in-flight states are taken as `Remote`.
    pub fn new(states: Vec<ChunkState>, config: PolicyConfig) -> Self {
        let n = states.len();
        let states: Vec<ChunkState> = states
            .into_iter()
            .map(|s| match s {
                ChunkState::Fetching | ChunkState::Prefetch { .. } => ChunkState::Remote,
                s => s,
            })
            .collect();
        let ever_read = states.iter().map(|s| *s == ChunkState::Read).collect();
        ChunkTable {
            states,
            config,
            counters: PolicyCounters {
                prefetch_on: config.unmatched_threshold != Some(0),
                ..Default::default()
            },
            hits: 0,
            queue: VecDeque::new(),
            queued: vec![false; n],
            declined: Vec::new(),
            declined_mark: vec![false; n],
            trace: None,
            first_reads: Vec::new(),
            ever_read,
        }
    }

    /// Prefetches along `order` (a recorded trace) from now on.
    pub fn set_trace(&mut self, order: Vec<u32>) {
        self.trace = Some(TraceCursor::new(order, self.states.len() as u32));
    }

    /// Number of chunks.
    pub fn len(&self) -> u32 {
        self.states.len() as u32
    }

    /// Whether the image has no chunks.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// State of chunk `c`.
    pub fn state(&self, c: u32) -> ChunkState {
        self.states[c as usize]
    }

    /// All states.
    pub fn states(&self) -> &[ChunkState] {
        &self.states
    }

    /// Policy counters.
    pub fn counters(&self) -> PolicyCounters {
        self.counters
    }

    /// Chunks in the order they were first read here (the trace).
    pub fn first_reads(&self) -> &[u32] {
        &self.first_reads
    }

    fn note_read(&mut self, c: u32) {
        if !self.ever_read[c as usize] {
            self.ever_read[c as usize] = true;
            self.first_reads.push(c);
        }
        if let Some(t) = &mut self.trace {
            t.on_read(c);
        }
    }

    /// A read of chunk `c` starts.
    pub fn begin_read(&mut self, c: u32) -> Access {
        match self.states[c as usize] {
            ChunkState::Read | ChunkState::Written => Access::Ready,
            ChunkState::Local { trace } => {
                if !trace {
                    self.counters.unmatched = self.counters.unmatched.saturating_sub(1);
                }
                self.states[c as usize] = ChunkState::Read;
                self.note_read(c);
                Access::Ready
            }
            ChunkState::Remote => {
                self.states[c as usize] = ChunkState::Fetching;
                self.note_read(c);
                Access::Fetch
            }
            ChunkState::Prefetch { trace } => {
                // The read claims the prefetch (it lands as Read, matched).
                // An advertisement prefetch waits at its peer behind every
                // on-demand reply, so the read fetches on demand too and
                // the first copy to land wins; a trace prefetch is already
                // ahead of the reads and is simply awaited.
                self.states[c as usize] = ChunkState::Fetching;
                self.note_read(c);
                if trace {
                    Access::Wait
                } else {
                    Access::Fetch
                }
            }
            ChunkState::Fetching => Access::Wait,
        }
    }

    /// A write starts that covers chunk `c` whole (`whole`) or in part.
    /// `Ready` means the caller may write (the chunk is now `Written`).
    pub fn begin_write(&mut self, c: u32, whole: bool) -> Access {
        match self.states[c as usize] {
            ChunkState::Fetching | ChunkState::Prefetch { .. } => Access::Wait,
            ChunkState::Remote if !whole => {
                self.states[c as usize] = ChunkState::Fetching;
                Access::Fetch
            }
            ChunkState::Local { trace } => {
                if !trace {
                    self.counters.unmatched = self.counters.unmatched.saturating_sub(1);
                }
                self.states[c as usize] = ChunkState::Written;
                Access::Ready
            }
            _ => {
                self.states[c as usize] = ChunkState::Written;
                Access::Ready
            }
        }
    }

    /// Whether fetched data for `c` may still be stored (nobody wrote the
    /// chunk or stored it meanwhile).
    pub fn may_land(&self, c: u32) -> bool {
        matches!(
            self.states[c as usize],
            ChunkState::Fetching | ChunkState::Prefetch { .. } | ChunkState::Remote
        )
    }

    /// Fetched data for `c` was stored; returns the new state.
    pub fn landed(&mut self, c: u32) -> ChunkState {
        let new = match self.states[c as usize] {
            ChunkState::Prefetch { trace } => {
                if !trace {
                    self.counters.unmatched += 1;
                    if let Some(t) = self.config.unmatched_threshold {
                        if self.counters.prefetch_on && self.counters.unmatched >= t {
                            self.switch_off();
                        }
                    }
                }
                ChunkState::Local { trace }
            }
            // A fetch that timed out and was redone elsewhere: either copy
            // is the image's data.
            ChunkState::Remote => ChunkState::Local { trace: false },
            ChunkState::Fetching => ChunkState::Read,
            other => other,
        };
        self.states[c as usize] = new;
        new
    }

    /// Stops prefetching: what was queued counts as declined from now on.
    fn switch_off(&mut self) {
        self.counters.prefetch_on = false;
        self.counters.switched_off += 1;
        while let Some(c) = self.queue.pop_front() {
            self.queued[c as usize] = false;
            if self.states[c as usize] == ChunkState::Remote && !self.declined_mark[c as usize] {
                self.declined_mark[c as usize] = true;
                self.declined.push(c);
                self.counters.declined += 1;
            }
        }
    }

    /// A fetch of `c` failed: it is `Remote` again (if nobody wrote it).
    pub fn fetch_failed(&mut self, c: u32) {
        if matches!(
            self.states[c as usize],
            ChunkState::Fetching | ChunkState::Prefetch { .. }
        ) {
            self.states[c as usize] = ChunkState::Remote;
        }
    }

    /// A prefetch of `c` failed: `Remote` again, unless a read claimed it
    /// (the read's own fetch is under way).
    pub fn prefetch_failed(&mut self, c: u32) {
        if matches!(self.states[c as usize], ChunkState::Prefetch { .. }) {
            self.states[c as usize] = ChunkState::Remote;
        }
    }

    /// A peer advertised chunk `c` (validated `< len()`).
    pub fn on_advert(&mut self, c: u32) {
        if self.states[c as usize] != ChunkState::Remote {
            return;
        }
        if self.counters.prefetch_on {
            if !self.queued[c as usize] {
                self.queued[c as usize] = true;
                self.queue.push_back(c);
            }
        } else if self.config.unmatched_threshold != Some(0) && !self.declined_mark[c as usize] {
            self.declined_mark[c as usize] = true;
            self.declined.push(c);
            self.counters.declined += 1;
        }
    }

    /// An on-demand read of `c` was served by a peer: if `c` was declined,
    /// the patterns converge again.
    pub fn demand_from_peer(&mut self, c: u32) {
        if self.counters.prefetch_on || !self.declined_mark[c as usize] {
            return;
        }
        self.hits += 1;
        if self.hits >= self.config.resume_hits.max(1) {
            self.counters.prefetch_on = true;
            self.counters.switched_on += 1;
            self.counters.unmatched = 0;
            self.hits = 0;
            // Peers advertise in their read order, and we now read where
            // they read: what they advertised after this chunk is what we
            // will read next.
            let declined = std::mem::take(&mut self.declined);
            let after = declined.iter().position(|d| *d == c).map_or(0, |i| i + 1);
            for (i, d) in declined.into_iter().enumerate() {
                self.declined_mark[d as usize] = false;
                let wanted = i >= after && self.states[d as usize] == ChunkState::Remote;
                if wanted && !self.queued[d as usize] {
                    self.queued[d as usize] = true;
                    self.queue.push_back(d);
                }
            }
        }
    }

    /// The next chunk to prefetch, now claimed (`Prefetch`): trace first,
    /// then advertisements while the policy allows.
    pub fn next_prefetch(&mut self) -> Option<(u32, PrefetchKind)> {
        if let Some(t) = &mut self.trace {
            while t.next < t.order.len() && t.next < t.read_pos + self.config.trace_window as usize
            {
                let c = t.order[t.next];
                t.next += 1;
                if self.states[c as usize] == ChunkState::Remote {
                    self.states[c as usize] = ChunkState::Prefetch { trace: true };
                    return Some((c, PrefetchKind::Trace));
                }
            }
        }
        while self.counters.prefetch_on {
            let c = self.queue.pop_front()?;
            self.queued[c as usize] = false;
            if self.states[c as usize] == ChunkState::Remote {
                self.states[c as usize] = ChunkState::Prefetch { trace: false };
                return Some((c, PrefetchKind::Advert));
            }
        }
        None
    }

    /// Claims remote chunk `c` for a background fill (counted like a trace
    /// prefetch: it never stops the adaptive policy).
    pub fn claim_fill(&mut self, c: u32) {
        if self.states[c as usize] == ChunkState::Remote {
            self.states[c as usize] = ChunkState::Prefetch { trace: true };
        }
    }

    /// Whether every chunk is stored here.
    pub fn complete(&self) -> bool {
        self.states.iter().all(|s| {
            matches!(
                s,
                ChunkState::Local { .. } | ChunkState::Read | ChunkState::Written
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(n: u32, threshold: Option<u32>, resume: u32) -> ChunkTable {
        ChunkTable::new(
            vec![ChunkState::Remote; n as usize],
            PolicyConfig {
                unmatched_threshold: threshold,
                resume_hits: resume,
                trace_window: 4,
            },
        )
    }

    /// Prefetches whatever is queued and lands it.
    fn drain(t: &mut ChunkTable) -> Vec<u32> {
        let mut got = Vec::new();
        while let Some((c, _)) = t.next_prefetch() {
            t.landed(c);
            got.push(c);
        }
        got
    }

    #[test]
    fn read_fetch_and_local_transitions() {
        let mut t = table(4, Some(512), 16);
        assert_eq!(t.begin_read(0), Access::Fetch);
        assert_eq!(t.begin_read(0), Access::Wait);
        assert!(t.may_land(0));
        assert_eq!(t.landed(0), ChunkState::Read);
        assert_eq!(t.begin_read(0), Access::Ready);
        // A failed fetch leaves it remote; the next read fetches again.
        assert_eq!(t.begin_read(1), Access::Fetch);
        t.fetch_failed(1);
        assert_eq!(t.state(1), ChunkState::Remote);
        assert_eq!(t.first_reads(), &[0, 1]);
    }

    #[test]
    fn writes_are_never_image_data() {
        let mut t = table(3, Some(512), 16);
        assert_eq!(t.begin_write(0, true), Access::Ready);
        assert_eq!(t.state(0), ChunkState::Written);
        assert!(!t.state(0).holds_image_data());
        // A partial write of a remote chunk fetches it first.
        assert_eq!(t.begin_write(1, false), Access::Fetch);
        t.landed(1);
        assert_eq!(t.begin_write(1, false), Access::Ready);
        assert_eq!(t.state(1), ChunkState::Written);
        // A late fetch never overwrites a written chunk.
        assert!(!t.may_land(1));
        t.on_advert(0);
        assert_eq!(t.next_prefetch(), None);
    }

    #[test]
    fn prefetch_claimed_by_read_lands_as_read_and_matched() {
        let mut t = table(4, Some(512), 16);
        t.on_advert(2);
        assert_eq!(t.next_prefetch(), Some((2, PrefetchKind::Advert)));
        assert_eq!(t.begin_read(2), Access::Fetch);
        assert_eq!(t.begin_read(2), Access::Wait);
        assert_eq!(t.landed(2), ChunkState::Read);
        assert!(!t.may_land(2), "the second copy is dropped");
        assert_eq!(t.counters().unmatched, 0);
    }

    #[test]
    fn divergent_reads_stop_prefetch_and_converging_reads_resume_it() {
        let mut t = table(100, Some(8), 4);
        // A peer reads 0..20 while we read 50..: everything we prefetch is unread.
        for c in 0..20 {
            t.on_advert(c);
        }
        let got = drain(&mut t);
        assert_eq!(got, (0..8).collect::<Vec<_>>(), "stops at the threshold");
        let k = t.counters();
        assert!(!k.prefetch_on);
        assert_eq!((k.unmatched, k.switched_off), (8, 1));
        for c in 50..60 {
            assert_eq!(t.begin_read(c), Access::Fetch);
            t.landed(c);
        }
        // Later advertisements are declined.
        for c in 20..40 {
            t.on_advert(c);
        }
        assert_eq!(t.next_prefetch(), None);
        assert_eq!(
            t.counters().declined,
            12 + 20,
            "queued chunks count as declined"
        );
        // Our reads move to where the peer read: declined chunks come from peers.
        for c in 8..11 {
            assert_eq!(t.begin_read(c), Access::Fetch);
            t.landed(c);
            t.demand_from_peer(c);
            assert!(!t.counters().prefetch_on, "not before {} hits", 4);
        }
        // A chunk that was never declined does not count.
        assert_eq!(t.begin_read(60), Access::Fetch);
        t.demand_from_peer(60);
        assert!(!t.counters().prefetch_on);
        assert_eq!(t.begin_read(20), Access::Fetch);
        t.landed(20);
        t.demand_from_peer(20);
        let k = t.counters();
        assert!(k.prefetch_on);
        assert_eq!((k.switched_on, k.unmatched), (1, 0));
        // The declined chunks advertised after chunk 20 are prefetched, in order.
        let got = drain(&mut t);
        assert_eq!(
            got,
            (21..29).collect::<Vec<_>>(),
            "until the threshold again"
        );
        assert_eq!(t.counters().switched_off, 2);
    }

    #[test]
    fn threshold_zero_never_prefetches_and_unlimited_never_stops() {
        let mut zero = table(50, Some(0), 1);
        let mut unlimited = table(50, None, 1);
        for c in 0..50 {
            zero.on_advert(c);
            unlimited.on_advert(c);
        }
        assert!(drain(&mut zero).is_empty());
        zero.begin_read(3);
        zero.demand_from_peer(3);
        assert!(!zero.counters().prefetch_on);
        assert_eq!(drain(&mut unlimited).len(), 50);
        assert!(unlimited.counters().prefetch_on);
        assert!(unlimited.complete());
    }

    #[test]
    fn trace_prefetch_stays_within_the_window_ahead_of_reads() {
        let mut t = table(20, Some(0), 1);
        t.set_trace(vec![5, 3, 9, 1, 7, 2, 99, 5]);
        let first: Vec<u32> = std::iter::from_fn(|| t.next_prefetch().map(|(c, _)| c)).collect();
        assert_eq!(first, vec![5, 3, 9, 1], "window of 4");
        // A read of a chunk under trace prefetch waits for it (no second fetch).
        assert_eq!(t.begin_read(1), Access::Wait);
        for c in &first {
            t.landed(*c);
        }
        assert_eq!(t.begin_read(5), Access::Ready);
        assert_eq!(t.begin_read(3), Access::Ready);
        let more: Vec<u32> = std::iter::from_fn(|| t.next_prefetch().map(|(c, _)| c)).collect();
        assert_eq!(
            more,
            vec![7, 2],
            "out-of-range and repeated entries are dropped"
        );
        assert_eq!(
            t.counters().unmatched,
            0,
            "trace prefetch is not adaptive prefetch"
        );
    }

    #[test]
    fn state_bytes_round_trip_and_in_flight_is_remote() {
        for s in [
            ChunkState::Remote,
            ChunkState::Local { trace: true },
            ChunkState::Local { trace: false },
            ChunkState::Read,
            ChunkState::Written,
        ] {
            assert_eq!(ChunkState::from_byte(s.to_byte()), Some(s));
        }
        assert_eq!(ChunkState::Fetching.to_byte(), 0);
        assert_eq!(ChunkState::from_byte(9), None);
        let t = ChunkTable::new(
            vec![ChunkState::Fetching, ChunkState::Read],
            PolicyConfig::default(),
        );
        assert_eq!(t.state(0), ChunkState::Remote);
    }
}
