//! [`HashIndex`]: a concurrent u64 → u64 hash map for point lookups.

use std::fmt;
use std::hash::{BuildHasher, Hasher};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use super::mix64;

/// Fewest shards: even a single-threaded engine gets a few, so that recovery threads and the
/// first workers rarely meet on one lock.
const MIN_SHARDS: usize = 8;
/// Most shards: each costs a cache-padded lock and its own table that grows separately, and
/// contention is already rare at 4 shards per thread.
const MAX_SHARDS: usize = 64;
/// Bytes of one table slot: the key and the address, with no padding.
const SLOT_BYTES: usize = std::mem::size_of::<(u64, u64)>();
/// hashbrown keeps one control byte per bucket.
const CONTROL_BYTES_PER_BUCKET: usize = 1;
/// hashbrown mirrors one SIMD group of control bytes past the end of every allocated table.
const TRAILING_CONTROL_BYTES: usize = 16;
/// DashMap stores each shard as a cache-padded `RwLock<RawTable>` (a lock word plus 32 bytes of
/// table header, padded to 128 bytes on x86_64 and aarch64).
const SHARD_HEADER_BYTES: usize = 128;

/// Four shards per hardware thread (DashMap's own rule) keeps the chance that two threads want
/// the same shard low; the clamp bounds the fixed cost on big machines and tiny tables.
fn shard_count() -> usize {
    let threads = std::thread::available_parallelism().map_or(MIN_SHARDS / 4, usize::from);
    (threads * 4)
        .next_power_of_two()
        .clamp(MIN_SHARDS, MAX_SHARDS)
}

/// Hashes a u64 key with one seeded [`mix64`] instead of SipHash: keys come from the engine, not
/// from an adversary, and bulk insertion at recovery is dominated by hashing cost otherwise.
///
/// The per-index random seed keeps two indexes from sharing a bucket order, which would make
/// copying one into another (iterate one, insert into the other) degrade to quadratic time.
#[derive(Clone)]
struct SeededKeyHasher {
    seed: u64,
}

impl BuildHasher for SeededKeyHasher {
    type Hasher = KeyHasher;

    #[inline]
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher { state: self.seed }
    }
}

struct KeyHasher {
    state: u64,
}

impl Hasher for KeyHasher {
    #[inline]
    fn write_u64(&mut self, key: u64) {
        self.state = mix64(self.state ^ key);
    }

    // Only u64 keys are hashed, which reach `write_u64`; this fallback keeps the hasher correct
    // for any other input anyway.
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word) ^ chunk.len() as u64);
        }
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }
}

/// A concurrent hash map from an 8-byte primary key to an 8-byte tuple address.
///
/// Built on a sharded [`DashMap`]: each operation locks one shard, so every method is atomic
/// with respect to the others on the same key. No key order is kept; use
/// [`OrderedIndex`](super::OrderedIndex) for range scans.
pub struct HashIndex {
    map: DashMap<u64, u64, SeededKeyHasher>,
    shards: usize,
}

impl HashIndex {
    /// Creates an empty index.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// Creates an empty index that holds `capacity` entries without rehashing, so that recovery
    /// can presize it from the number of rows it is about to insert.
    pub fn with_capacity(capacity: usize) -> Self {
        let shards = shard_count();
        let hasher = SeededKeyHasher {
            seed: rand::random(),
        };
        // DashMap splits the capacity evenly, but hashed keys fill shards unevenly (binomially):
        // add four standard deviations of headroom per shard so that none rehashes.
        let per_shard = capacity.div_ceil(shards);
        let headroom = if per_shard == 0 {
            0
        } else {
            4 * (per_shard as f64).sqrt().ceil() as usize
        };
        let capacity = (per_shard + headroom) * shards;
        Self {
            map: DashMap::with_capacity_and_hasher_and_shard_amount(capacity, hasher, shards),
            shards,
        }
    }

    /// Returns the address stored for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        self.map.get(&key).map(|entry| *entry)
    }

    /// Inserts `key → addr` only if `key` is absent; otherwise leaves the index unchanged and
    /// returns the address already stored.
    pub fn insert_new(&self, key: u64, addr: u64) -> Result<(), u64> {
        match self.map.entry(key) {
            Entry::Occupied(existing) => Err(*existing.get()),
            Entry::Vacant(slot) => {
                slot.insert(addr);
                Ok(())
            }
        }
    }

    /// Stores `key → addr` whether or not `key` is present, returning the previous address.
    #[inline]
    pub fn upsert(&self, key: u64, addr: u64) -> Option<u64> {
        self.map.insert(key, addr)
    }

    /// Removes `key`, returning its address.
    #[inline]
    pub fn remove(&self, key: u64) -> Option<u64> {
        self.map.remove(&key).map(|(_, addr)| addr)
    }

    /// Removes `key` only if it maps to exactly `addr`; returns whether it was removed.
    ///
    /// Lets a transaction delete the version it saw without clobbering a newer one.
    pub fn remove_if(&self, key: u64, addr: u64) -> bool {
        self.map
            .remove_if(&key, |_, stored| *stored == addr)
            .is_some()
    }

    /// Replaces the address of `key` with `new` only if it currently is `expected`; returns
    /// whether it was replaced. An absent key is never inserted.
    ///
    /// Out-of-place engines use it to swing a key to a new tuple version, compare-and-swap style.
    pub fn replace_if(&self, key: u64, expected: u64, new: u64) -> bool {
        match self.map.get_mut(&key) {
            Some(mut stored) if *stored == expected => {
                *stored = new;
                true
            }
            _ => false,
        }
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the index holds no entries.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Removes every entry, keeping the allocated capacity for a rebuild.
    pub fn clear(&self) {
        self.map.clear();
    }

    /// Calls `f(key, addr)` for every entry, in no particular order.
    ///
    /// Each shard stays read-locked while its entries are visited, so `f` must not modify this
    /// index (that would deadlock); collect first and modify afterwards. Not a snapshot: entries
    /// changed concurrently in shards not yet visited may or may not be seen.
    pub fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        for entry in self.map.iter() {
            f(*entry.key(), *entry.value());
        }
    }

    /// Estimated DRAM bytes used by the index.
    ///
    /// Counted: the table slots (`capacity × 8/7` buckets, since hashbrown keeps 1/8 of its
    /// buckets free, × 16 bytes of key and address), one control byte per bucket plus a trailing
    /// 16-byte control group per shard, and 128 bytes of cache-padded lock and table header per
    /// shard. Not counted: allocator rounding of the few large table allocations. Reflects
    /// capacity rather than entries, so it does not shrink after [`clear`](Self::clear).
    pub fn memory_bytes(&self) -> usize {
        let capacity = self.map.capacity();
        let buckets = capacity * 8 / 7;
        let tables = if capacity == 0 {
            0
        } else {
            buckets * (SLOT_BYTES + CONTROL_BYTES_PER_BUCKET) + self.shards * TRAILING_CONTROL_BYTES
        };
        std::mem::size_of::<Self>() + self.shards * SHARD_HEADER_BYTES + tables
    }
}

impl Default for HashIndex {
    fn default() -> Self {
        Self::new()
    }
}

// Summarise instead of deriving: DashMap's Debug would print every entry.
impl fmt::Debug for HashIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashIndex")
            .field("len", &self.len())
            .field("shards", &self.shards)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_new_refuses_duplicates_and_reports_the_existing_addr() {
        let index = HashIndex::new();
        assert_eq!(index.insert_new(7, 100), Ok(()));
        assert_eq!(index.insert_new(7, 200), Err(100));
        assert_eq!(index.get(7), Some(100));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn upsert_and_remove_return_the_previous_addr() {
        let index = HashIndex::new();
        assert_eq!(index.upsert(1, 10), None);
        assert_eq!(index.upsert(1, 11), Some(10));
        assert_eq!(index.get(1), Some(11));
        assert_eq!(index.remove(1), Some(11));
        assert_eq!(index.remove(1), None);
        assert_eq!(index.get(1), None);
        assert!(index.is_empty());
    }

    #[test]
    fn remove_if_needs_the_exact_addr() {
        let index = HashIndex::new();
        index.upsert(3, 30);
        assert!(!index.remove_if(3, 31));
        assert_eq!(index.get(3), Some(30));
        assert!(!index.remove_if(4, 30));
        assert!(index.remove_if(3, 30));
        assert_eq!(index.get(3), None);
        assert!(!index.remove_if(3, 30));
    }

    #[test]
    fn replace_if_swaps_only_the_expected_addr_and_never_inserts() {
        let index = HashIndex::new();
        index.upsert(5, 50);
        assert!(!index.replace_if(5, 49, 51));
        assert_eq!(index.get(5), Some(50));
        assert!(index.replace_if(5, 50, 51));
        assert_eq!(index.get(5), Some(51));
        assert!(!index.replace_if(6, 0, 60));
        assert_eq!(index.get(6), None);
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn clear_and_for_each_see_every_entry() {
        let index = HashIndex::with_capacity(1000);
        for key in 0..1000 {
            index.insert_new(key, key * 2).unwrap();
        }
        let mut sum = 0;
        let mut visited = 0;
        index.for_each(|key, addr| {
            assert_eq!(addr, key * 2);
            sum += key;
            visited += 1;
        });
        assert_eq!((visited, sum), (1000, 999 * 1000 / 2));
        index.clear();
        assert!(index.is_empty());
        assert_eq!(index.get(10), None);
    }

    #[test]
    fn with_capacity_presizes_every_shard() {
        let index = HashIndex::with_capacity(100_000);
        let before = index.memory_bytes();
        assert!(index.map.capacity() >= 100_000);
        for key in 0..100_000 {
            index.upsert(key, key);
        }
        assert_eq!(index.memory_bytes(), before, "presized index must not grow");
    }

    #[test]
    fn strided_keys_spread_over_the_shards() {
        // Composite keys often share their low bits; the hasher must not map them together.
        let hasher = SeededKeyHasher { seed: 0 };
        let buckets: std::collections::HashSet<u64> = (0..256u64)
            .map(|k| hasher.hash_one(k << 24) >> 58)
            .collect();
        assert_eq!(buckets.len(), 64);
    }

    #[test]
    fn memory_bytes_grows_with_entries_within_a_sane_range() {
        let index = HashIndex::new();
        let empty = index.memory_bytes();
        assert!(empty < 64 * 1024, "empty index costs {empty} bytes");
        for key in 0..100_000u64 {
            index.upsert(key.wrapping_mul(0x9e37_79b9_7f4a_7c15), key);
        }
        let full = index.memory_bytes();
        let per_entry = full as f64 / 100_000.0;
        assert!(full > empty);
        assert!(
            (16.0..200.0).contains(&per_entry),
            "{per_entry} bytes per entry"
        );
    }
}
