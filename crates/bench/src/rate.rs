//! Rate generators: when a control operation's next operation starts.
//! Open rates (`every`, Poisson) give the gap to the next arrival, whatever
//! the ones before are doing; a closed loop keeps N in flight. All are
//! seeded, so a run with the same `--seed` asks for the same sequence.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::spec::RateLaw;

/// The arrivals of an open rate.
pub struct Arrivals {
    law: RateLaw,
    rng: StdRng,
    /// Time of the last arrival since the start (the sum of the gaps).
    clock: Duration,
    /// The next arrival of a trace.
    next: usize,
}

impl Arrivals {
    /// Arrivals by `law`, drawn from `seed`.
    pub fn new(law: RateLaw, seed: u64) -> Arrivals {
        Arrivals {
            law,
            rng: StdRng::seed_from_u64(seed),
            clock: Duration::ZERO,
            next: 0,
        }
    }

    /// The gap before the next arrival; `None` when no more arrive: a
    /// trace's end, or a closed loop, whose operations start when others
    /// end (see [`closed_loop`]).
    pub fn next_gap(&mut self) -> Option<Duration> {
        let gap = match &self.law {
            RateLaw::Every(interval) => *interval,
            RateLaw::Poisson(mean) => {
                // Inverse transform of the exponential law: with U uniform
                // on [0, 1), -ln(1 - U) has mean 1 (and 1 - U is never 0).
                let uniform: f64 = self.rng.random();
                mean.mul_f64(-(1.0 - uniform).ln())
            }
            // A trace file not read yet has no times: the run refuses it
            // before it starts (see `Spec::read_trace_files`).
            RateLaw::ClosedLoop(_) | RateLaw::TraceFile { .. } => return None,
            RateLaw::IncreaseDecrease {
                low,
                high,
                step,
                every,
            } => {
                Duration::from_secs_f64(1.0 / bounded_level(*low, *high, *step, *every, self.clock))
            }
            RateLaw::Ramp { from, to, over } => {
                let done = (self.clock.as_secs_f64() / over.as_secs_f64()).min(1.0);
                Duration::from_secs_f64(
                    from.as_secs_f64() + (to.as_secs_f64() - from.as_secs_f64()) * done,
                )
            }
            RateLaw::Steps(steps) => step_gap(steps, self.clock),
            RateLaw::Trace(times) => {
                let at = *times.get(self.next)?;
                self.next += 1;
                at.saturating_sub(self.clock)
            }
        };
        self.clock += gap;
        Some(gap)
    }
}

/// The rate (arrivals per second) of an increase-decrease law at `clock`:
/// the `k`-th interval of length `every` has `low + k·step`, capped at
/// `high`, until `high` is reached, then goes down by `step` to `low`,
/// and so on (a triangle wave with a period of `2n` intervals, `n` the
/// steps from `low` to `high`).
pub fn bounded_level(low: f64, high: f64, step: f64, every: Duration, clock: Duration) -> f64 {
    let steps = ((high - low) / step).ceil().max(0.0) as u64;
    if steps == 0 || every.is_zero() {
        return low;
    }
    let interval = clock.as_nanos() / every.as_nanos();
    let phase = (interval % u128::from(2 * steps)) as u64;
    if phase <= steps {
        (low + phase as f64 * step).min(high)
    } else {
        (high - (phase - steps) as f64 * step).max(low)
    }
}

/// The gap of the step that holds `clock` (each lasts its `for`; the last
/// one, or the last listed, lasts to the end).
fn step_gap(steps: &[(Duration, Option<Duration>)], clock: Duration) -> Duration {
    let mut start = Duration::ZERO;
    for (every, lasting) in steps {
        match lasting {
            Some(lasting) if clock >= start + *lasting => start += *lasting,
            _ => return *every,
        }
    }
    steps
        .last()
        .map_or(Duration::from_secs(1), |(every, _)| *every)
}

/// Runs `operation` back to back on `in_flight` threads, so that exactly
/// that many are in flight until `stop` turns true or `limit` operations
/// have started; each call gets its sequence number (from 0). Returns how
/// many ran.
pub fn closed_loop<F>(in_flight: u32, limit: Option<u64>, stop: &AtomicBool, operation: F) -> u64
where
    F: Fn(u64) + Sync,
{
    let started = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..in_flight {
            scope.spawn(|| loop {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let sequence = started.fetch_add(1, Ordering::SeqCst);
                if limit.is_some_and(|limit| sequence >= limit) {
                    return;
                }
                operation(sequence);
            });
        }
    });
    let started = started.load(Ordering::SeqCst);
    limit.map_or(started, |limit| started.min(limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::time::Instant;

    fn mean_and_variance(values: &[f64]) -> (f64, f64) {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, variance)
    }

    /// 10,000 Poisson arrivals with a mean gap of 100 ms: the gaps'
    /// mean and variance are those of the exponential law (m, m²), and
    /// the counts in 500 ms windows have mean and variance 5 (Poisson).
    #[test]
    fn poisson_arrivals_follow_the_law() {
        let mean_gap = 0.1;
        let mut arrivals = Arrivals::new(RateLaw::Poisson(Duration::from_millis(100)), 29);
        let gaps: Vec<f64> = (0..10_000)
            .map(|_| arrivals.next_gap().expect("open rate").as_secs_f64())
            .collect();
        let (mean, variance) = mean_and_variance(&gaps);
        // The sample mean's standard error is m/100: 5% is five of them.
        assert!((mean - mean_gap).abs() < 0.05 * mean_gap, "mean gap {mean}");
        assert!(
            (variance - mean_gap * mean_gap).abs() < 0.12 * mean_gap * mean_gap,
            "gap variance {variance}"
        );
        let mut clock = 0.0;
        let window = 0.5;
        let mut counts = vec![0.0; 1];
        for gap in gaps {
            clock += gap;
            let index = (clock / window) as usize;
            if index >= counts.len() {
                counts.resize(index + 1, 0.0);
            }
            counts[index] += 1.0;
        }
        counts.pop(); // the last window is cut short
        let (count_mean, count_variance) = mean_and_variance(&counts);
        assert!((count_mean - 5.0).abs() < 0.25, "mean count {count_mean}");
        assert!(
            (count_variance - 5.0).abs() < 0.85,
            "count variance {count_variance}"
        );
    }

    #[test]
    fn every_is_exact_and_seeds_repeat() {
        let mut every = Arrivals::new(RateLaw::Every(Duration::from_millis(250)), 1);
        assert!((0..100).all(|_| every.next_gap() == Some(Duration::from_millis(250))));
        let law = RateLaw::Poisson(Duration::from_secs(1));
        let draw = |seed| {
            let mut a = Arrivals::new(law.clone(), seed);
            (0..20).map(|_| a.next_gap()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert_eq!(Arrivals::new(RateLaw::ClosedLoop(3), 1).next_gap(), None);
    }

    /// A trace is replayed exactly, then ends; a ramp's gaps go from
    /// `from` to `to` and stay; steps change the gap at their ends.
    #[test]
    fn traces_ramps_and_steps() {
        let ms = Duration::from_millis;
        let times = vec![ms(500), ms(1250), ms(1250), ms(3000)];
        let mut trace = Arrivals::new(RateLaw::Trace(times.clone()), 1);
        let mut clock = Duration::ZERO;
        let mut replayed = Vec::new();
        while let Some(gap) = trace.next_gap() {
            clock += gap;
            replayed.push(clock);
        }
        assert_eq!(replayed, times);
        let ramp = RateLaw::Ramp {
            from: ms(1000),
            to: ms(100),
            over: Duration::from_secs(10),
        };
        let mut arrivals = Arrivals::new(ramp, 1);
        let gaps: Vec<Duration> = (0..40).map(|_| arrivals.next_gap().unwrap()).collect();
        assert_eq!(gaps[0], ms(1000));
        assert!(gaps.windows(2).all(|w| w[1] <= w[0]), "{gaps:?}");
        assert_eq!(gaps[39], ms(100));
        let steps = RateLaw::Steps(vec![
            (ms(500), Some(Duration::from_secs(2))),
            (ms(100), None),
        ]);
        let mut arrivals = Arrivals::new(steps, 1);
        let gaps: Vec<Duration> = (0..8).map(|_| arrivals.next_gap().unwrap()).collect();
        assert_eq!(
            gaps,
            [
                ms(500),
                ms(500),
                ms(500),
                ms(500),
                ms(100),
                ms(100),
                ms(100),
                ms(100)
            ]
        );
    }

    /// An increase-decrease law: the arrivals in each second follow the
    /// triangle 2, 4, 6, 8, 10, 8, 6, 4, 2, ... (within one arrival, as a
    /// gap that starts in one second may end in the next), and no gap is
    /// shorter than 1/high or longer than 1/low.
    #[test]
    fn increase_decrease_moves_between_its_bounds() {
        let law = RateLaw::IncreaseDecrease {
            low: 2.0,
            high: 10.0,
            step: 2.0,
            every: Duration::from_secs(1),
        };
        let mut arrivals = Arrivals::new(law, 1);
        let mut clock = 0.0;
        let mut counts = vec![0i64; 24];
        while clock < 24.0 {
            let gap = arrivals.next_gap().expect("open rate").as_secs_f64();
            assert!((0.1 - 1e-9..=0.5 + 1e-9).contains(&gap), "gap {gap}");
            clock += gap;
            if let Some(count) = counts.get_mut(clock as usize) {
                *count += 1;
            }
        }
        let triangle = [2, 4, 6, 8, 10, 8, 6, 4];
        for (second, count) in counts.iter().enumerate() {
            let expected = triangle[second % 8];
            assert!(
                (count - expected).abs() <= 1,
                "second {second}: {count} arrivals, not {expected}: {counts:?}"
            );
        }
        let total: i64 = counts.iter().sum();
        assert!(
            (total - 3 * 48).abs() <= 3,
            "{total} arrivals in three periods"
        );
        // A step that does not divide the span stops at the bounds.
        let level = |s: u64| {
            bounded_level(
                1.0,
                4.0,
                2.0,
                Duration::from_secs(1),
                Duration::from_secs(s),
            )
        };
        assert_eq!(
            (0..6).map(level).collect::<Vec<_>>(),
            [1.0, 3.0, 4.0, 2.0, 1.0, 3.0]
        );
        assert_eq!(
            bounded_level(
                5.0,
                5.0,
                1.0,
                Duration::from_secs(1),
                Duration::from_secs(9)
            ),
            5.0
        );
    }

    /// Three in flight, each taking 5 ms: never more than three at once,
    /// and three busy nearly all the time (busy time / wall time ≈ 3).
    #[test]
    fn closed_loop_holds_n_in_flight() {
        let in_flight = AtomicU32::new(0);
        let most = AtomicU32::new(0);
        let busy_micros = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let begun = Instant::now();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(400));
                stop.store(true, Ordering::SeqCst);
            });
            let ran = closed_loop(3, None, &stop, |_| {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let start = Instant::now();
                std::thread::sleep(Duration::from_millis(5));
                busy_micros.fetch_add(start.elapsed().as_micros() as u64, Ordering::SeqCst);
                in_flight.fetch_sub(1, Ordering::SeqCst);
            });
            assert!(ran >= 3 * 40, "only {ran} operations in 400 ms");
        });
        let wall = begun.elapsed().as_micros() as f64;
        let held = busy_micros.load(Ordering::SeqCst) as f64 / wall;
        assert_eq!(most.load(Ordering::SeqCst), 3);
        assert!(held > 2.7, "held {held} in flight on average, not 3");
        let stop = AtomicBool::new(false);
        assert_eq!(closed_loop(4, Some(10), &stop, |_| {}), 10);
    }
}
