//! The prefetch thread: takes the next chunk the adaptive policy or the
//! trace allows, and fetches it.

use super::*;

impl Inner {
    pub(super) fn next_job(&self) -> Option<(u32, Option<PrefetchKind>)> {
        let mut t = self.table.lock();
        loop {
            if self.stopping() {
                return None;
            }
            if let Some((c, k)) = t.next_prefetch() {
                return Some((c, Some(k)));
            }
            if self.config.fill {
                if let Some(c) = (0..t.len()).find(|c| t.state(*c) == ChunkState::Remote) {
                    // Claimed as a trace-like prefetch: not counted as unmatched.
                    t.claim_fill(c);
                    return Some((c, None));
                }
            }
            self.changed.wait_for(&mut t, Duration::from_millis(200));
        }
    }

    pub(super) fn prefetch_loop(self: Arc<Self>) {
        while let Some((c, kind)) = self.next_job() {
            match self.fetch(c, false) {
                Ok((data, source)) => {
                    match source {
                        Source::Peer => bump(&self.counters.peer_prefetch),
                        Source::Repo => bump(&self.counters.repo_prefetch),
                    }
                    if kind == Some(PrefetchKind::Trace) {
                        bump(&self.counters.trace_prefetch);
                    }
                    if let Err(e) = self.land(c, &data) {
                        tracing::warn!("prefetch of chunk {c}: {e}");
                    }
                }
                Err(e) => {
                    tracing::warn!("prefetch of chunk {c} failed: {e}");
                    self.table.lock().prefetch_failed(c);
                    self.changed.notify_all();
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}
