//! TPC-C's random functions (clause 2.1.6, 4.3.2): NURand with its C constants, last names from
//! syllables, and random a-strings and n-strings.

use rand::Rng;

/// The syllables of customer last names (clause 4.3.2.3).
const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

/// The last name for `number` in 0..=999: the syllables of its three decimal digits.
pub fn last_name(number: u64, out: &mut Vec<u8>) {
    out.clear();
    for digit in [number / 100 % 10, number / 10 % 10, number % 10] {
        out.extend_from_slice(SYLLABLES[digit as usize].as_bytes());
    }
}

/// The constants `C` of NURand for the three values of `A` (clause 2.1.6.1): one set for the
/// load and one for the run, the run's `C_LAST` chosen so that its distance to the load's obeys
/// clause 2.1.6.1 (|C_RUN − C_LOAD| in 65..=119, but neither 96 nor 112).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NuRandConstants {
    /// C for customer last names (A = 255).
    pub c_last: u64,
    /// C for customer ids (A = 1023).
    pub c_id: u64,
    /// C for item ids (A = 8191).
    pub ol_i_id: u64,
}

impl NuRandConstants {
    /// Random constants for loading.
    pub fn for_load(rng: &mut impl Rng) -> NuRandConstants {
        NuRandConstants {
            c_last: rng.gen_range(0..=255),
            c_id: rng.gen_range(0..=1023),
            ol_i_id: rng.gen_range(0..=8191),
        }
    }

    /// Constants for the run, given the load's: `c_id` and `ol_i_id` are drawn afresh,
    /// `c_last` at a permitted distance from the load's.
    pub fn for_run(load: &NuRandConstants, rng: &mut impl Rng) -> NuRandConstants {
        let c_last = loop {
            let c: u64 = rng.gen_range(0..=255);
            let delta = c.abs_diff(load.c_last);
            if (65..=119).contains(&delta) && delta != 96 && delta != 112 {
                break c;
            }
        };
        NuRandConstants {
            c_last,
            c_id: rng.gen_range(0..=1023),
            ol_i_id: rng.gen_range(0..=8191),
        }
    }
}

/// NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y − x + 1)) + x (clause 2.1.6).
pub fn nurand(rng: &mut impl Rng, a: u64, c: u64, x: u64, y: u64) -> u64 {
    (((rng.gen_range(0..=a) | rng.gen_range(x..=y)) + c) % (y - x + 1)) + x
}

const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A random a-string of length `min..=max` (clause 4.3.2.2), written into `out`.
pub fn astring(rng: &mut impl Rng, min: usize, max: usize, out: &mut Vec<u8>) {
    out.clear();
    let len = rng.gen_range(min..=max);
    out.extend((0..len).map(|_| ALPHANUMERIC[rng.gen_range(0..ALPHANUMERIC.len())]));
}

/// A random n-string (digits) of length `min..=max`, written into `out`.
pub fn nstring(rng: &mut impl Rng, min: usize, max: usize, out: &mut Vec<u8>) {
    out.clear();
    let len = rng.gen_range(min..=max);
    out.extend((0..len).map(|_| b'0' + rng.gen_range(0..10u8)));
}

/// A random a-string of `min..=max` bytes of which 10% hold "ORIGINAL" at a random position
/// (I_DATA and S_DATA, clause 4.3.3.1).
pub fn data_with_original(rng: &mut impl Rng, min: usize, max: usize, out: &mut Vec<u8>) {
    astring(rng, min, max, out);
    if rng.gen_range(0..10) == 0 {
        let at = rng.gen_range(0..=out.len() - 8);
        out[at..at + 8].copy_from_slice(b"ORIGINAL");
    }
}

/// A state: two random upper-case letters (clause 4.3.3.1).
pub fn state(rng: &mut impl Rng, out: &mut Vec<u8>) {
    out.clear();
    out.extend((0..2).map(|_| rng.gen_range(b'A'..=b'Z')));
}

/// A zip code: 4 random digits and "11111" (clause 4.3.2.7).
pub fn zip(rng: &mut impl Rng, out: &mut Vec<u8>) {
    nstring(rng, 4, 4, out);
    out.extend_from_slice(b"11111");
}

/// The bytes of a fixed-length text column up to its first zero (the padding).
pub fn trimmed(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn last_names_follow_the_syllables() {
        let mut s = Vec::new();
        last_name(0, &mut s);
        assert_eq!(s, b"BARBARBAR");
        last_name(371, &mut s);
        assert_eq!(s, b"PRICALLYOUGHT");
        last_name(999, &mut s);
        assert_eq!(s, b"EINGEINGEING");
    }

    #[test]
    fn nurand_stays_in_range_and_is_skewed() {
        let mut rng = StdRng::seed_from_u64(1);
        let c = NuRandConstants::for_load(&mut rng);
        let mut counts = vec![0u32; 3001];
        for _ in 0..200_000 {
            let v = nurand(&mut rng, 1023, c.c_id, 1, 3000);
            assert!((1..=3000).contains(&v));
            counts[v as usize] += 1;
        }
        let max = *counts.iter().max().unwrap();
        let mean = 200_000 / 3000;
        assert!(
            max > 3 * mean,
            "NURand is non-uniform: max {max}, mean {mean}"
        );
    }

    #[test]
    fn run_constant_obeys_the_delta_rule() {
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..100 {
            let load = NuRandConstants::for_load(&mut rng);
            let run = NuRandConstants::for_run(&load, &mut rng);
            let d = run.c_last.abs_diff(load.c_last);
            assert!((65..=119).contains(&d) && d != 96 && d != 112);
        }
    }

    #[test]
    fn strings_have_their_lengths() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut s = Vec::new();
        let mut originals = 0;
        for _ in 0..1000 {
            data_with_original(&mut rng, 26, 50, &mut s);
            assert!((26..=50).contains(&s.len()));
            originals += s.windows(8).any(|w| w == b"ORIGINAL") as u32;
        }
        assert!((50..150).contains(&originals), "{originals} of 1000");
        zip(&mut rng, &mut s);
        assert_eq!(s.len(), 9);
        assert!(s.ends_with(b"11111"));
        assert_eq!(trimmed(b"ab\0\0"), b"ab");
    }
}
