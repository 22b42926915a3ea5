//! A token bucket: caps the bytes per second through a repository server
//! or out of a mirror to its peers. There is no kernel traffic shaping
//! here; this is how experiments get a bandwidth limit.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A shared bandwidth cap. Callers take tokens before they send; when the
/// bucket is empty they sleep until enough have accumulated.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A bucket refilled at `bytes_per_sec`, holding at most `burst` bytes.
    pub fn new(bytes_per_sec: u64, burst: u64) -> Self {
        let burst = burst.max(1) as f64;
        TokenBucket {
            rate: bytes_per_sec.max(1) as f64,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes `n` bytes of tokens, sleeping as long as the cap requires.
    /// Takers are served in turn: the debt of one is the wait of the next.
    pub fn take(&self, n: u64) {
        let wait = {
            let mut s = self.state.lock();
            let now = Instant::now();
            let refill = now.duration_since(s.1).as_secs_f64() * self.rate;
            s.0 = (s.0 + refill).min(self.burst) - n as f64;
            s.1 = now;
            if s.0 >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-s.0 / self.rate)
            }
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_the_rate() {
        let b = TokenBucket::new(1_000_000, 10_000);
        let t = Instant::now();
        for _ in 0..30 {
            b.take(10_000);
        }
        let secs = t.elapsed().as_secs_f64();
        // 300 kB at 1 MB/s, less the initial burst.
        assert!(secs > 0.25 && secs < 1.0, "{secs}");
    }
}
