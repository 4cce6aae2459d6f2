//! Field values: random ones for throughput runs, deterministic ones for crash checks.

use rand::Rng;

use super::keys::mix64;

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// Maps a byte onto printable ASCII `'!'..='~'` (94 symbols; the small modulo bias does
/// not matter for payload bytes).
fn printable(b: u8) -> u8 {
    b'!' + b % 94
}

/// Fills `buf` with random printable ASCII, like YCSB's `RandomByteIterator` (one RNG
/// word per 8 bytes, to keep value generation off the benchmark's critical path).
pub fn fill_field<R: Rng + ?Sized>(rng: &mut R, buf: &mut [u8]) {
    for chunk in buf.chunks_mut(8) {
        let word = rng.next_u64().to_le_bytes();
        for (b, w) in chunk.iter_mut().zip(word) {
            *b = printable(w);
        }
    }
}

/// Seed of the deterministic stream for one (key, field, version). Each input goes
/// through the mixer before the next is folded in, so nearby tuples give unrelated
/// streams.
fn field_seed(key: u64, field: u32, version: u64) -> u64 {
    mix64(mix64(mix64(key) ^ u64::from(field)).wrapping_add(GOLDEN_GAMMA) ^ version)
}

/// Calls `f` with each byte of the deterministic value of (key, field, version).
fn for_each_deterministic_byte(
    key: u64,
    field: u32,
    version: u64,
    len: usize,
    mut f: impl FnMut(usize, u8),
) {
    let mut state = field_seed(key, field, version);
    let mut i = 0;
    while i < len {
        // splitmix64 stream: a counter advanced by the golden gamma, then mixed.
        state = state.wrapping_add(GOLDEN_GAMMA);
        for w in mix64(state).to_le_bytes().into_iter().take(len - i) {
            f(i, printable(w));
            i += 1;
        }
    }
}

/// Fills `buf` with printable bytes that depend only on (`key`, `field`, `version`) and
/// `buf.len()`.
///
/// Writers that stamp each update with a per-record version (e.g. a counter kept in the
/// record or the transaction id) let a crash-recovery check recompute the expected value
/// with [`verify_field`] instead of keeping a copy of every value; a torn or stale write
/// then shows up as a mismatch for the version found.
pub fn deterministic_field(key: u64, field: u32, version: u64, buf: &mut [u8]) {
    for_each_deterministic_byte(key, field, version, buf.len(), |i, b| buf[i] = b);
}

/// Whether `buf` is exactly what [`deterministic_field`] writes for (`key`, `field`,
/// `version`) at this length; does not allocate.
pub fn verify_field(key: u64, field: u32, version: u64, buf: &[u8]) -> bool {
    let mut ok = true;
    for_each_deterministic_byte(key, field, version, buf.len(), |i, b| ok &= buf[i] == b);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn fill_field_is_printable_and_random() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut a = [0u8; 100];
        let mut b = [0u8; 100];
        fill_field(&mut rng, &mut a);
        fill_field(&mut rng, &mut b);
        assert!(a.iter().all(|c| c.is_ascii_graphic()));
        assert_ne!(a, b);
        // Every position is written, including a short tail chunk.
        let mut c = [0u8; 13];
        fill_field(&mut rng, &mut c);
        assert!(c.iter().all(|x| x.is_ascii_graphic()));
        let distinct: std::collections::HashSet<_> = a.iter().chain(&b).collect();
        assert!(distinct.len() > 60, "{}", distinct.len());
    }

    #[test]
    fn deterministic_field_is_reproducible_and_checkable() {
        let mut a = [0u8; 100];
        let mut b = [0u8; 100];
        deterministic_field(42, 3, 7, &mut a);
        deterministic_field(42, 3, 7, &mut b);
        assert_eq!(a, b);
        assert!(a.iter().all(|c| c.is_ascii_graphic()));
        assert!(verify_field(42, 3, 7, &a));
        for (k, f, v) in [(43, 3, 7), (42, 4, 7), (42, 3, 8), (0, 0, 0)] {
            deterministic_field(k, f, v, &mut b);
            assert_ne!(a, b, "({k},{f},{v})");
            assert!(!verify_field(42, 3, 7, &b));
        }
        // A prefix is the same stream, so a shorter field is a prefix of a longer one.
        let mut short = [0u8; 13];
        deterministic_field(42, 3, 7, &mut short);
        assert_eq!(short, a[..13]);
        // Any single-byte corruption is detected.
        for i in [0, 7, 8, 99] {
            let mut c = a;
            c[i] ^= 1;
            assert!(!verify_field(42, 3, 7, &c), "byte {i}");
        }
        assert!(verify_field(1, 1, 1, &[]));
    }
}
