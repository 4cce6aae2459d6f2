//! Record numbers to engine keys, and the request-distribution key chooser.

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::generators::{ScrambledZipfianGenerator, SkewedLatestGenerator};
use super::YcsbError;

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const MIX_M1: u64 = 0xBF58_476D_1CE4_E5B9;
const MIX_M2: u64 = 0x94D0_49BB_1331_11EB;
const MIX_M1_INV: u64 = mod_inverse(MIX_M1);
const MIX_M2_INV: u64 = mod_inverse(MIX_M2);

/// Inverse of an odd `a` modulo 2^64 by Newton's iteration (each step doubles the
/// number of correct low bits; `a` itself is correct to 3 bits).
const fn mod_inverse(a: u64) -> u64 {
    let mut x = a;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// Inverse of `x ^ (x >> s)`.
const fn unxorshift(y: u64, s: u32) -> u64 {
    let mut x = y;
    let mut shift = s;
    while shift < 64 {
        x ^= y >> shift;
        shift += s;
    }
    x
}

/// splitmix64's finaliser: a bijection on u64 with good avalanche.
pub(crate) fn mix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(MIX_M1);
    let z = (z ^ (z >> 27)).wrapping_mul(MIX_M2);
    z ^ (z >> 31)
}

/// Maps a record number to the 8-byte key the engine stores.
///
/// YCSB hashes record numbers (`insertorder=hashed`, the default) so that inserts do
/// not arrive in key order; it uses `fnv_hash64`, which is not injective on u64 (and
/// drops the sign bit), so two records could share a key. We use splitmix64 (add the
/// golden gamma, then its finaliser) instead: a bijection, so keys are unique and
/// [`key_to_record`] recovers the record number. Key 0 only comes from record
/// 2^64 − gamma, which is never reached.
pub fn build_key(record: u64) -> u64 {
    mix64(record.wrapping_add(GOLDEN_GAMMA))
}

/// Inverse of [`build_key`]: e.g. to acknowledge an [`Op::Insert`](super::Op::Insert)
/// or to check which record a key belongs to.
pub fn key_to_record(key: u64) -> u64 {
    let z = unxorshift(key, 31).wrapping_mul(MIX_M2_INV);
    let z = unxorshift(z, 27).wrapping_mul(MIX_M1_INV);
    unxorshift(z, 30).wrapping_sub(GOLDEN_GAMMA)
}

/// YCSB `requestdistribution`: which records reads, updates and scans go to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Distribution {
    /// Every existing record equally likely.
    Uniform,
    /// Scrambled zipfian with constant `theta` (0 <= theta < 1; 0 means uniform).
    Zipfian {
        /// Skew; YCSB's default is [`ZIPFIAN_CONSTANT`](super::ZIPFIAN_CONSTANT).
        theta: f64,
    },
    /// The most recently inserted records are hottest (workload D); theta is YCSB's
    /// fixed [`ZIPFIAN_CONSTANT`](super::ZIPFIAN_CONSTANT).
    Latest,
}

#[derive(Debug, Clone)]
enum Chooser {
    Uniform,
    /// Its item count is the key space, which may exceed the live record count.
    Zipfian(ScrambledZipfianGenerator),
    Latest(SkewedLatestGenerator),
}

/// Picks record numbers according to a [`Distribution`].
///
/// `Zipfian { theta: 0.0 }` is served by the uniform chooser, since a zipfian with theta
/// 0 is uniform and Gray's method does not support it.
#[derive(Debug, Clone)]
pub struct KeyChooser {
    distribution: Distribution,
    record_count: u64,
    chooser: Chooser,
}

impl KeyChooser {
    /// A chooser over `record_count` records (must be > 0).
    pub fn new(distribution: Distribution, record_count: u64) -> Result<Self, YcsbError> {
        if record_count == 0 {
            return Err(YcsbError::EmptyRange("key chooser over 0 records"));
        }
        let chooser = match distribution {
            Distribution::Uniform => Chooser::Uniform,
            // Float pattern: matches 0.0 and -0.0.
            Distribution::Zipfian { theta: 0.0 } => Chooser::Uniform,
            Distribution::Zipfian { theta } => Chooser::Zipfian(
                ScrambledZipfianGenerator::with_theta(0, record_count, theta)?,
            ),
            Distribution::Latest => Chooser::Latest(SkewedLatestGenerator::new(record_count)?),
        };
        Ok(Self {
            distribution,
            record_count,
            chooser,
        })
    }

    /// A record number in `[0, record_count)`.
    pub fn next_key<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        self.next_key_below(rng, self.record_count)
    }

    /// A record number in `[0, count)`, for a record count that grows with inserts.
    ///
    /// Zipfian: as YCSB, draws over a fixed key space and rejects records that do not
    /// exist yet. YCSB sizes that space up front from the expected inserts; we instead
    /// double it when `count` outgrows it (which moves the hot set, once per doubling)
    /// and shrink it if `count` falls below half, so rejection stays cheap.
    /// Latest: `count - 1` is the hottest. Uniform: over `[0, count)`.
    ///
    /// Panics if `count` is 0.
    pub fn next_key_below<R: Rng + ?Sized>(&mut self, rng: &mut R, count: u64) -> u64 {
        assert!(count > 0, "key choice over 0 records");
        match &mut self.chooser {
            Chooser::Uniform => rng.gen_range(0..count),
            Chooser::Zipfian(gen) => {
                let space = gen.item_count();
                if count > space {
                    gen.set_item_count(count.max(space.saturating_mul(2)))
                        .expect("count > 0");
                } else if count < space / 2 {
                    gen.set_item_count(count).expect("count > 0");
                }
                loop {
                    let r = gen.next(rng);
                    if r < count {
                        return r;
                    }
                }
            }
            Chooser::Latest(gen) => gen.next(rng, count),
        }
    }

    /// The distribution this chooser was built from.
    pub fn distribution(&self) -> Distribution {
        self.distribution
    }

    /// The record count given at construction (the range of [`next_key`](Self::next_key)).
    pub fn record_count(&self) -> u64 {
        self.record_count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::ycsb::fnv_hash64;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::collections::HashSet;

    #[test]
    fn mixer_constants_invert() {
        assert_eq!(MIX_M1.wrapping_mul(MIX_M1_INV), 1);
        assert_eq!(MIX_M2.wrapping_mul(MIX_M2_INV), 1);
        for s in [27, 30, 31] {
            for x in [0u64, 1, u64::MAX, 0xDEAD_BEEF_0123_4567] {
                assert_eq!(unxorshift(x ^ (x >> s), s), x);
            }
        }
    }

    #[test]
    fn build_key_is_injective_and_inverts() {
        let mut seen = HashSet::with_capacity(1_000_000);
        for r in 1..=1_000_000u64 {
            let k = build_key(r);
            assert!(seen.insert(k), "collision at record {r}");
            assert_eq!(key_to_record(k), r);
        }
        let mut rng = StdRng::seed_from_u64(2);
        for r in [0u64, u64::MAX, 1 << 63]
            .into_iter()
            .chain((0..10_000).map(|_| rng.gen()))
        {
            assert_eq!(key_to_record(build_key(r)), r);
            assert_eq!(build_key(key_to_record(r)), r);
        }
        assert_ne!(build_key(0), 0);
        // Neighbouring records must not be neighbouring keys (unordered inserts).
        assert!(build_key(1).abs_diff(build_key(2)) > 1 << 32);
    }

    #[test]
    fn chooser_validates() {
        assert!(KeyChooser::new(Distribution::Uniform, 0).is_err());
        assert!(KeyChooser::new(Distribution::Zipfian { theta: 1.0 }, 10).is_err());
        assert!(KeyChooser::new(Distribution::Zipfian { theta: -0.1 }, 10).is_err());
        assert!(KeyChooser::new(Distribution::Latest, 1).is_ok());
    }

    #[test]
    fn zipfian_theta_zero_is_uniform() {
        let mut a = KeyChooser::new(Distribution::Zipfian { theta: 0.0 }, 1000).unwrap();
        let mut b = KeyChooser::new(Distribution::Uniform, 1000).unwrap();
        let mut ra = StdRng::seed_from_u64(4);
        let mut rb = StdRng::seed_from_u64(4);
        for _ in 0..1000 {
            assert_eq!(a.next_key(&mut ra), b.next_key(&mut rb));
        }
    }

    #[test]
    fn chooser_ranges_and_growth() {
        let mut rng = StdRng::seed_from_u64(6);
        for dist in [
            Distribution::Uniform,
            Distribution::Zipfian { theta: 0.99 },
            Distribution::Zipfian { theta: 0.7 },
            Distribution::Latest,
        ] {
            let mut kc = KeyChooser::new(dist, 1000).unwrap();
            assert_eq!(kc.record_count(), 1000);
            assert_eq!(kc.distribution(), dist);
            for _ in 0..5000 {
                assert!(kc.next_key(&mut rng) < 1000);
            }
            let mut grown = 0;
            for _ in 0..20_000 {
                let k = kc.next_key_below(&mut rng, 3000);
                assert!(k < 3000, "{dist:?}");
                grown += usize::from(k >= 1000);
            }
            assert!(grown > 500, "{dist:?}: {grown}");
            for _ in 0..1000 {
                assert!(kc.next_key_below(&mut rng, 10) < 10);
            }
        }
    }

    #[test]
    fn zipfian_chooser_hot_record_is_scrambled_head() {
        let mut kc = KeyChooser::new(Distribution::Zipfian { theta: 0.99 }, 5000).unwrap();
        let mut rng = StdRng::seed_from_u64(8);
        let mut counts = vec![0u32; 5000];
        for _ in 0..50_000 {
            counts[kc.next_key(&mut rng) as usize] += 1;
        }
        let hot = counts
            .iter()
            .enumerate()
            .max_by_key(|&(_, c)| *c)
            .unwrap()
            .0;
        assert_eq!(hot as u64, fnv_hash64(0) % 5000);
    }
}
