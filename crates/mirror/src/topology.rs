//! Which peers a mirror links to.
//!
//! The paper used a fixed ring: each mirror talks to its two neighbours,
//! so a chunk crosses N/2 hops and one slow host slows its neighbours.
//! Here every mirror links to `fanout` peers drawn uniformly at random
//! from the candidates (a static list, or the rendezvous list kept by the
//! repository), and accepts links from anyone, so the overlay is a random
//! graph of average degree about `2 * fanout`: its diameter grows as
//! log N and a lost peer costs each neighbour one link of several. A
//! mirror whose links drop below `fanout` draws again (random peer
//! sampling), at every dial round.

/// A small deterministic generator (xorshift64*), seeded per mirror.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a constant).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// A generator seeded from the operating system.
    pub fn from_os() -> Self {
        let mut b = [0u8; 8];
        let _ = getrandom::fill(&mut b);
        Rng::new(u64::from_le_bytes(b))
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Up to `want` distinct candidates other than `me` and not in `have`,
/// drawn uniformly at random.
pub fn sample(
    candidates: &[String],
    me: &str,
    have: &[String],
    want: usize,
    rng: &mut Rng,
) -> Vec<String> {
    let mut pool: Vec<&String> = candidates
        .iter()
        .filter(|c| c.as_str() != me && !have.contains(c))
        .collect();
    pool.sort();
    pool.dedup();
    let mut out = Vec::new();
    while out.len() < want && !pool.is_empty() {
        let i = rng.below(pool.len());
        out.push(pool.swap_remove(i).clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_distinct_others() {
        let c: Vec<String> = (0..10).map(|i| format!("h{i}")).collect();
        let mut rng = Rng::new(42);
        let s = sample(&c, "h3", &["h4".to_string()], 5, &mut rng);
        assert_eq!(s.len(), 5);
        assert!(!s.contains(&"h3".to_string()) && !s.contains(&"h4".to_string()));
        let mut d = s.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), 5);
        assert_eq!(sample(&c, "h0", &[], 50, &mut rng).len(), 9);
    }

    #[test]
    fn random_graph_is_connected_and_spreads_load() {
        // 32 mirrors, fanout 3, links symmetric: every mirror reaches every
        // other, and no mirror has more than a few times the mean degree.
        let names: Vec<String> = (0..32).map(|i| format!("m{i}")).collect();
        let mut adj = vec![std::collections::BTreeSet::new(); 32];
        for i in 0..32 {
            let mut rng = Rng::new(i as u64 + 1);
            for n in sample(&names, &names[i], &[], 3, &mut rng) {
                let j: usize = n[1..].parse().unwrap();
                adj[i].insert(j);
                adj[j].insert(i);
            }
        }
        let mut seen = [false; 32];
        let mut stack = vec![0];
        while let Some(v) = stack.pop() {
            if !std::mem::replace(&mut seen[v], true) {
                stack.extend(adj[v].iter().copied());
            }
        }
        assert!(seen.iter().all(|s| *s));
        assert!(adj.iter().all(|a| a.len() >= 3 && a.len() <= 16));
    }
}
