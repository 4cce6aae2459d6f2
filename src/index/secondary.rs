//! [`SecondaryIndex`]: a non-unique ordered index from a hashed column key to primary keys.

use std::fmt;

use crossbeam_skiplist::SkipSet;

use super::mix64;

/// FNV-1a 64-bit offset basis.
const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64-bit prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Expected heap bytes of one crossbeam-skiplist node whose key and value together take
/// `payload` bytes.
///
/// A node is `value, key, refcount-and-height word (8 bytes), tower of 8-byte pointers`, with a
/// tower height `h` drawn as 1 + trailing zeros of a random word, i.e. P(h) = 2^-h capped at 32
/// (mean 2). Each node is a separate allocation; glibc malloc adds an 8-byte header and rounds to
/// 16 bytes (32 at least). The result is the expectation of that size over the height
/// distribution: 53 bytes for a 16-byte payload, against 40 bytes for the mean node alone.
const fn expected_skiplist_node_bytes(payload: usize) -> usize {
    const MAX_HEIGHT: usize = 32;
    const fn allocation(payload: usize, height: usize) -> usize {
        let requested = payload + 8 + 8 * height;
        let chunk = (requested + 8).div_ceil(16) * 16;
        if chunk < 32 {
            32
        } else {
            chunk
        }
    }
    // Sum allocation(h) × 2^-h in fixed point with 31 fractional bits; the capped height 32
    // carries the remaining mass 2^-31.
    let mut total: u64 = allocation(payload, MAX_HEIGHT) as u64;
    let mut height = 1;
    while height < MAX_HEIGHT {
        total += (allocation(payload, height) as u64) << (31 - height);
        height += 1;
    }
    ((total + (1 << 30)) >> 31) as usize
}

/// Expected bytes per entry: a skiplist node keyed by two u64s with no value.
const NODE_BYTES: usize = expected_skiplist_node_bytes(16);

fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// Hashes the bytes of the indexed columns into a 64-bit secondary key.
///
/// The hash is fixed and platform-independent: FNV-1a 64 over every part in turn, each preceded
/// by its length as an 8-byte little-endian integer (so that `["ab", "c"]` and `["a", "bc"]`
/// differ), then the murmur3 `fmix64` finaliser (FNV's high bits are weak for short inputs). The
/// same columns thus give the same key in every process and Rust release.
///
/// Distinct column values can collide, so callers must re-check the columns of every row that a
/// [`SecondaryIndex::lookup`] returns.
pub fn secondary_key(parts: &[&[u8]]) -> u64 {
    let hash = parts.iter().fold(FNV_OFFSET_BASIS, |hash, part| {
        let hash = fnv1a(hash, &(part.len() as u64).to_le_bytes());
        fnv1a(hash, part)
    });
    mix64(hash)
}

/// A non-unique ordered index of `(secondary key, primary key)` pairs.
///
/// Secondary keys are usually [`secondary_key`] hashes of the indexed columns; several rows may
/// share one. Built on a lock-free [`SkipSet`] ordered by `(secondary key, primary key)`, so a
/// lookup is one seek followed by a forward walk, and every method is atomic per pair.
pub struct SecondaryIndex {
    entries: SkipSet<(u64, u64)>,
}

impl SecondaryIndex {
    /// Creates an empty index.
    pub fn new() -> Self {
        Self {
            entries: SkipSet::new(),
        }
    }

    /// Adds the pair `(secondary_key, primary_key)`; adding a pair already present does nothing.
    pub fn insert(&self, secondary_key: u64, primary_key: u64) {
        // get_or_insert leaves an existing node alone, where insert would replace it and briefly
        // hide the pair from concurrent lookups.
        self.entries.get_or_insert((secondary_key, primary_key));
    }

    /// Removes the pair; returns whether it was present.
    pub fn remove(&self, secondary_key: u64, primary_key: u64) -> bool {
        self.entries.remove(&(secondary_key, primary_key)).is_some()
    }

    /// Appends to `out` every primary key paired with `secondary_key`, in ascending order, and
    /// returns how many were appended. `out` is not cleared, so one buffer can be reused.
    ///
    /// Not a snapshot: pairs inserted or removed concurrently may or may not be seen.
    pub fn lookup(&self, secondary_key: u64, out: &mut Vec<u64>) -> usize {
        let before = out.len();
        out.extend(
            self.entries
                .range((secondary_key, 0)..=(secondary_key, u64::MAX))
                .map(|entry| entry.value().1),
        );
        out.len() - before
    }

    /// Whether the pair is present.
    pub fn contains(&self, secondary_key: u64, primary_key: u64) -> bool {
        self.entries.contains(&(secondary_key, primary_key))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the index holds no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Removes every pair.
    pub fn clear(&self) {
        self.entries.clear();
    }

    /// Estimated DRAM bytes used by the index.
    ///
    /// Pairs × the expected skiplist node allocation (16-byte pair, refcount-and-height word and
    /// on average two 8-byte tower pointers, plus malloc's header and rounding: 53 bytes), plus
    /// the fixed skiplist head. Removed nodes awaiting epoch-based reclamation are not counted.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.len() * NODE_BYTES
    }
}

impl Default for SecondaryIndex {
    fn default() -> Self {
        Self::new()
    }
}

// Summarise instead of printing every pair.
impl fmt::Debug for SecondaryIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecondaryIndex")
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_estimate_matches_the_hand_computed_expectation() {
        // h=1: 48 B × 1/2, h=2: 48 × 1/4, h=3: 64 × 1/8, h=4: 64 × 1/16, h=5: 80 × 1/32, ...
        assert_eq!(expected_skiplist_node_bytes(16), 53);
    }

    fn lookup(index: &SecondaryIndex, secondary_key: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let appended = index.lookup(secondary_key, &mut out);
        assert_eq!(appended, out.len());
        out
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        assert_eq!(fnv1a(FNV_OFFSET_BASIS, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET_BASIS, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET_BASIS, b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn secondary_key_is_stable_across_builds() {
        // Pinned (and cross-checked with an independent Python implementation) so that an
        // accidental change of the hash is noticed.
        let key = secondary_key(&[b"BARBARBAR", &7u32.to_le_bytes()]);
        assert_eq!(key, secondary_key(&[b"BARBARBAR", &7u32.to_le_bytes()]));
        assert_eq!(key, PINNED_SECONDARY_KEY);
    }
    const PINNED_SECONDARY_KEY: u64 = 0xaf90_eabb_7644_35a4;

    #[test]
    fn secondary_key_distinguishes_part_boundaries() {
        let ab_c = secondary_key(&[b"ab", b"c"]);
        assert_ne!(ab_c, secondary_key(&[b"a", b"bc"]));
        assert_ne!(ab_c, secondary_key(&[b"abc"]));
        assert_ne!(ab_c, secondary_key(&[b"ab", b"c", b""]));
        assert_ne!(secondary_key(&[b"", b"a"]), secondary_key(&[b"a", b""]));
        assert_ne!(secondary_key(&[]), secondary_key(&[b""]));
        assert_ne!(ab_c, secondary_key(&[b"ab", b"d"]));
    }

    #[test]
    fn lookup_returns_all_and_only_the_matching_pks_in_order() {
        let index = SecondaryIndex::new();
        for (sec, pk) in [
            (5, 30),
            (5, 10),
            (4, 99),
            (6, 1),
            (5, 20),
            (5, u64::MAX),
            (5, 0),
        ] {
            index.insert(sec, pk);
        }
        index.insert(5, 10); // duplicate pair: no effect
        assert_eq!(index.len(), 7);
        assert_eq!(lookup(&index, 5), [0, 10, 20, 30, u64::MAX]);
        assert_eq!(lookup(&index, 4), [99]);
        assert_eq!(lookup(&index, 7), Vec::<u64>::new());

        assert!(index.remove(5, 20));
        assert!(!index.remove(5, 20));
        assert!(
            !index.remove(4, 10),
            "pair with another secondary key must not match"
        );
        assert!(index.remove(5, u64::MAX));
        assert_eq!(lookup(&index, 5), [0, 10, 30]);
        assert!(index.contains(5, 30));
        assert!(!index.contains(5, 20));
        assert!(!index.contains(6, 30));
        assert_eq!(index.len(), 5);

        // lookup appends rather than overwrites.
        let mut out = vec![42];
        assert_eq!(index.lookup(4, &mut out), 1);
        assert_eq!(out, [42, 99]);

        index.clear();
        assert!(index.is_empty());
        assert_eq!(lookup(&index, 5), Vec::<u64>::new());
    }

    #[test]
    fn extreme_secondary_keys_do_not_leak_into_neighbours() {
        let index = SecondaryIndex::new();
        index.insert(0, 1);
        index.insert(u64::MAX, 2);
        index.insert(u64::MAX - 1, 3);
        assert_eq!(lookup(&index, 0), [1]);
        assert_eq!(lookup(&index, u64::MAX), [2]);
        assert_eq!(lookup(&index, u64::MAX - 1), [3]);
    }

    #[test]
    fn memory_bytes_grows_with_entries_within_a_sane_range() {
        let index = SecondaryIndex::new();
        let empty = index.memory_bytes();
        for pk in 0..100_000u64 {
            index.insert(secondary_key(&[&(pk % 1000).to_le_bytes()]), pk);
        }
        assert_eq!(index.len(), 100_000);
        let full = index.memory_bytes();
        let per_entry = full as f64 / 100_000.0;
        assert!(full > empty);
        assert!(
            (16.0..200.0).contains(&per_entry),
            "{per_entry} bytes per entry"
        );
    }
}
