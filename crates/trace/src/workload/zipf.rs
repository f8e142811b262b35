//! `zipf`: Zipf(theta) popularity over the working set's blocks.
//!
//! Ranks come from [`ZipfSampler`], a rejection-inversion sampler (the method of
//! `rand_distr::Zipf`, Hörmann & Derflinger) with O(1) memory and setup, made cheaper: the
//! flat head of the envelope needs no second draw, and a squeeze test avoids the second
//! `powf` for most samples. Rank r (0 = most popular) maps to block `(a*r + b) mod n` with a
//! seeded `a` near n/phi and coprime to `n`, so the popular blocks are scattered evenly over
//! the working set.

use super::Space;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Zipf(s) over ranks `1..=n`: P(k) proportional to k^-s; s = 0 is uniform.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ZipfSampler {
    n: f64,
    s: f64,
    /// Total mass of the envelope: 1 on [0, 1), x^-s on [1, n).
    t: f64,
    /// 1 / (1 - s), unused when s = 1.
    q: f64,
}

impl ZipfSampler {
    pub fn new(n: u64, s: f64) -> Self {
        assert!(n >= 1 && s >= 0.0 && s.is_finite());
        let nf = n as f64;
        let (t, q) = if s == 1.0 {
            (1.0 + nf.ln(), 0.0)
        } else {
            let q = 1.0 / (1.0 - s);
            ((nf.powf(1.0 - s) - s) * q, q)
        };
        ZipfSampler { n: nf, s, t, q }
    }

    /// A rank in `1..=n`.
    #[inline]
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> u64 {
        loop {
            let pt = rng.gen::<f64>() * self.t;
            if pt < 1.0 {
                // The envelope's flat head [0, 1) is exactly rank 1's mass: always accepted.
                return 1;
            }
            // Inverse of the envelope's CDF on [1, n).
            let inv = if self.s == 1.0 {
                (pt - 1.0).exp()
            } else {
                ((pt * (1.0 - self.s) + self.s).ln() * self.q).exp()
            };
            let x = (inv + 1.0).floor().min(self.n);
            // Accept with probability (inv / x)^s; r in [(x-1)/x, 1).
            let r = inv / x;
            let v: f64 = rng.gen();
            // Squeeze, tight to first order in 1 - r so that powf is rarely needed (Bernoulli):
            // for s <= 1, (1/r)^s <= 1 + s(1-r)/r, so r^s >= r / (r + s(1 - r));
            // for s >= 1, r^s >= 1 - s(1 - r). Exact for s = 1.
            let lower = if self.s <= 1.0 {
                r / (r + self.s * (1.0 - r))
            } else {
                1.0 - self.s * (1.0 - r)
            };
            if v < lower || (self.s != 1.0 && v < r.powf(self.s)) {
                return x as u64;
            }
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct ZipfGen {
    space: Space,
    sampler: ZipfSampler,
    n: u64,
    inv_n: f64,
    a: u64,
    b: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl ZipfGen {
    pub fn new(space: Space, min_size: u64, theta: f64, setup: &mut ChaCha8Rng) -> Self {
        let n = space.blocks(min_size);
        // A multiplier near n/phi (Fibonacci hashing): the blocks of ranks 0, 1, 2, ... then
        // land far apart from each other (three-distance theorem). A small seeded jitter makes
        // the layout differ between seeds; the first coprime value from there keeps it a
        // bijection.
        let a = if n < 3 {
            1
        } else {
            let golden = (n as f64 * 0.618_033_988_749_894_9) as u64;
            let mut a = golden + setup.gen_range(0..=n / 1000);
            while gcd(a, n) != 1 {
                a += 1;
            }
            a % n
        };
        let b = setup.gen_range(0..n);
        ZipfGen {
            space,
            sampler: ZipfSampler::new(n, theta),
            n,
            inv_n: 1.0 / n as f64,
            a,
            b,
        }
    }

    /// The block of popularity rank `rank` (0 = most popular): `(a*rank + b) mod n`.
    #[inline]
    pub fn block(&self, rank: u64) -> u64 {
        let n = self.n;
        let m = if n <= u32::MAX as u64 {
            // a, rank < n <= 2^32, so the product fits; a u64 division costs more than the
            // whole Zipf draw, so estimate the quotient in f64 (the quotient is below 2^32,
            // so the estimate is off by at most one) and correct.
            let p = self.a * rank;
            let q = (p as f64 * self.inv_n) as u64;
            let mut m = p.wrapping_sub(q.wrapping_mul(n)) as i64;
            if m < 0 {
                m += n as i64;
            } else if m >= n as i64 {
                m -= n as i64;
            }
            m as u64
        } else {
            (u128::from(self.a) * u128::from(rank) % u128::from(n)) as u64
        };
        let m = m + self.b;
        if m >= n {
            m - n
        } else {
            m
        }
    }

    #[inline]
    pub fn next(&mut self, len: u64, rng: &mut ChaCha8Rng) -> u64 {
        let rank = self.sampler.sample(rng) - 1;
        self.space.offset(self.block(rank), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Sampled frequencies match the exact pmf closely for several exponents.
    #[test]
    fn sampler_matches_pmf() {
        let n = 50u64;
        let draws = 400_000;
        for s in [0.0, 0.5, 0.9, 1.0, 1.2, 2.0] {
            let z = ZipfSampler::new(n, s);
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let mut counts = vec![0u64; n as usize + 1];
            for _ in 0..draws {
                let k = z.sample(&mut rng);
                assert!((1..=n).contains(&k));
                counts[k as usize] += 1;
            }
            let h: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
            for k in 1..=n {
                let p = (k as f64).powf(-s) / h;
                let expect = p * draws as f64;
                let sd = (draws as f64 * p * (1.0 - p)).sqrt();
                let got = counts[k as usize] as f64;
                assert!(
                    (got - expect).abs() < 5.0 * sd + 1.0,
                    "s={s} k={k}: got {got}, expected {expect:.0} (sd {sd:.0})"
                );
            }
        }
    }

    #[test]
    fn block_map_is_a_bijection() {
        for n in [1u64, 2, 3, 10, 64, 97, 1000, 4096] {
            let space = Space {
                wss: n * 4096,
                align: 4096,
            };
            let mut rng = ChaCha8Rng::seed_from_u64(n);
            let g = ZipfGen::new(space, 4096, 1.0, &mut rng);
            let mut seen = vec![false; n as usize];
            for r in 0..n {
                let b = g.block(r);
                assert!(!seen[b as usize], "n={n}: block {b} twice");
                seen[b as usize] = true;
            }
        }
    }

    #[test]
    fn block_map_matches_exact_modulo() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for n in [5u64, 1 << 20, 1_000_003, (1 << 32) - 5, u32::MAX as u64] {
            let space = Space {
                wss: n * 512,
                align: 512,
            };
            let g = ZipfGen::new(space, 512, 1.0, &mut rng);
            for r in (0..2000).map(|_| rng.gen_range(0..n)).chain([0, 1, n - 1]) {
                let want =
                    ((u128::from(g.a) * u128::from(r) + u128::from(g.b)) % u128::from(n)) as u64;
                assert_eq!(g.block(r), want, "n={n} r={r}");
            }
        }
    }

    #[test]
    fn wide_block_map_is_in_range() {
        let space = Space {
            wss: 1 << 60,
            align: 512,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let g = ZipfGen::new(space, 512, 1.0, &mut rng);
        assert!(g.n > u32::MAX as u64);
        for r in [0, 1, 12345, g.n - 1] {
            let want =
                ((u128::from(g.a) * u128::from(r) + u128::from(g.b)) % u128::from(g.n)) as u64;
            assert_eq!(g.block(r), want);
        }
        assert_ne!(g.block(0), g.block(1));
    }
}
