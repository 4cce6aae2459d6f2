//! [`OrderedIndex`]: a concurrent ordered u64 → u64 map with range scans.

use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_skiplist::SkipMap;
use parking_lot::{Mutex, MutexGuard};

use super::mix64;

/// Lock stripes serialising mutations of keys that hash together; a power of two.
const KEY_LOCK_STRIPES: usize = 64;

/// Keeps each stripe on its own cache line so that threads locking different stripes do not
/// bounce a shared line.
#[repr(align(64))]
#[derive(Default)]
struct KeyLock(Mutex<()>);

/// Expected heap bytes of one crossbeam-skiplist node whose key and value together take
/// `payload` bytes.
///
/// A node is `value, key, refcount-and-height word (8 bytes), tower of 8-byte pointers`, with a
/// tower height `h` drawn as 1 + trailing zeros of a random word, i.e. P(h) = 2^-h capped at 32
/// (mean 2). Each node is a separate allocation; glibc malloc adds an 8-byte header and rounds to
/// 16 bytes (32 at least). The result is the expectation of that size over the height
/// distribution: 53 bytes for a 16-byte payload, against 40 bytes for the mean node alone.
pub(crate) const fn expected_skiplist_node_bytes(payload: usize) -> usize {
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

/// Expected bytes per entry of a `u64 → u64` skiplist.
const NODE_BYTES: usize = expected_skiplist_node_bytes(16);

/// A concurrent ordered map from an 8-byte primary key to an 8-byte tuple address, with
/// ascending and descending range scans.
///
/// Built on a lock-free [`SkipMap`]. Reads (`get`, scans, `for_each`) take no lock. Mutations take
/// one of 64 striped mutexes chosen by key hash, because SkipMap has no conditional update:
/// `insert_new`, `remove_if` and `replace_if` are a check followed by a change, which must not
/// interleave with another mutation of the same key. Values are stored as [`AtomicU64`] so that
/// updating an existing key is an in-place store: replacing a SkipMap node instead would unlink
/// the old node before linking the new one, letting a concurrent `get` see the key as absent.
pub struct OrderedIndex {
    map: SkipMap<u64, AtomicU64>,
    key_locks: Box<[KeyLock]>,
}

impl OrderedIndex {
    /// Creates an empty index. A skiplist cannot be presized: nodes are allocated one by one.
    pub fn new() -> Self {
        Self {
            map: SkipMap::new(),
            key_locks: (0..KEY_LOCK_STRIPES).map(|_| KeyLock::default()).collect(),
        }
    }

    /// Locks the stripe of `key`; hashed so that keys sharing low bits spread over the stripes.
    #[inline]
    fn lock_key(&self, key: u64) -> MutexGuard<'_, ()> {
        let stripe = (mix64(key) as usize) & (KEY_LOCK_STRIPES - 1);
        self.key_locks[stripe].0.lock()
    }

    /// Returns the address stored for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        self.map
            .get(&key)
            .map(|entry| entry.value().load(Ordering::Acquire))
    }

    /// Inserts `key → addr` only if `key` is absent; otherwise leaves the index unchanged and
    /// returns the address already stored.
    pub fn insert_new(&self, key: u64, addr: u64) -> Result<(), u64> {
        let _guard = self.lock_key(key);
        match self.map.get(&key) {
            Some(existing) => Err(existing.value().load(Ordering::Acquire)),
            None => {
                self.map.insert(key, AtomicU64::new(addr));
                Ok(())
            }
        }
    }

    /// Stores `key → addr` whether or not `key` is present, returning the previous address.
    pub fn upsert(&self, key: u64, addr: u64) -> Option<u64> {
        let _guard = self.lock_key(key);
        match self.map.get(&key) {
            Some(existing) => Some(existing.value().swap(addr, Ordering::AcqRel)),
            None => {
                self.map.insert(key, AtomicU64::new(addr));
                None
            }
        }
    }

    /// Removes `key`, returning its address.
    pub fn remove(&self, key: u64) -> Option<u64> {
        let _guard = self.lock_key(key);
        self.map
            .remove(&key)
            .map(|entry| entry.value().load(Ordering::Acquire))
    }

    /// Removes `key` only if it maps to exactly `addr`; returns whether it was removed.
    ///
    /// Lets a transaction delete the version it saw without clobbering a newer one.
    pub fn remove_if(&self, key: u64, addr: u64) -> bool {
        let _guard = self.lock_key(key);
        match self.map.get(&key) {
            Some(entry) if entry.value().load(Ordering::Acquire) == addr => entry.remove(),
            _ => false,
        }
    }

    /// Replaces the address of `key` with `new` only if it currently is `expected`; returns
    /// whether it was replaced. An absent key is never inserted.
    ///
    /// Out-of-place engines use it to swing a key to a new tuple version, compare-and-swap style.
    pub fn replace_if(&self, key: u64, expected: u64, new: u64) -> bool {
        let _guard = self.lock_key(key);
        // Under the stripe lock no other mutation of `key` runs, so a plain check-then-store
        // would do; the CAS costs the same and states the intent.
        self.map.get(&key).is_some_and(|entry| {
            entry
                .value()
                .compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
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

    /// Removes every entry.
    pub fn clear(&self) {
        // Hold every stripe (always in index order, and mutators hold one at most, so this cannot
        // deadlock) so that no conditional mutation straddles the clear.
        let _guards: Vec<_> = self.key_locks.iter().map(|lock| lock.0.lock()).collect();
        self.map.clear();
    }

    /// Calls `f(key, addr)` for every entry in ascending key order.
    ///
    /// Takes no lock, so `f` may modify the index. Not a snapshot: each visited entry was present
    /// at some moment during the walk, and entries changed concurrently may or may not be seen.
    pub fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        for entry in self.map.iter() {
            f(*entry.key(), entry.value().load(Ordering::Acquire));
        }
    }

    /// Visits entries with keys `>= from` in ascending order, calling `f(key, addr)` until it
    /// returns `false` or `limit` entries were visited. Returns the number of calls to `f`.
    ///
    /// Same consistency as [`for_each`](Self::for_each): not a snapshot.
    pub fn scan(&self, from: u64, limit: usize, f: impl FnMut(u64, u64) -> bool) -> usize {
        visit(self.map.range(from..), limit, f)
    }

    /// Visits the entries whose keys fall in `range` in ascending order, calling `f(key, addr)`
    /// until it returns `false`. Returns the number of calls to `f`. An inverted range (start
    /// after end) visits nothing rather than panicking.
    pub fn scan_range(
        &self,
        range: impl RangeBounds<u64>,
        f: impl FnMut(u64, u64) -> bool,
    ) -> usize {
        if range_is_empty(&range) {
            return 0;
        }
        visit(self.map.range(range), usize::MAX, f)
    }

    /// Visits entries with keys `<= upto` in descending order, calling `f(key, addr)` until it
    /// returns `false` or `limit` entries were visited. Returns the number of calls to `f`.
    ///
    /// For "latest first" reads such as TPC-C Order-Status finding a customer's newest order.
    /// Each step back is a fresh O(log n) search (skiplist links point forward only), so short
    /// limits are cheap and long reverse walks cost more than forward ones.
    pub fn scan_rev(&self, upto: u64, limit: usize, f: impl FnMut(u64, u64) -> bool) -> usize {
        visit(self.map.range(..=upto).rev(), limit, f)
    }

    /// The entry with the smallest key `>= key`.
    pub fn first_at_or_after(&self, key: u64) -> Option<(u64, u64)> {
        self.map
            .lower_bound(Bound::Included(&key))
            .map(|entry| (*entry.key(), entry.value().load(Ordering::Acquire)))
    }

    /// The entry with the largest key `<= key`.
    pub fn last_at_or_before(&self, key: u64) -> Option<(u64, u64)> {
        self.map
            .upper_bound(Bound::Included(&key))
            .map(|entry| (*entry.key(), entry.value().load(Ordering::Acquire)))
    }

    /// Estimated DRAM bytes used by the index.
    ///
    /// Entries × the expected node allocation (key, value, refcount-and-height word and on
    /// average two 8-byte tower pointers, plus malloc's header and rounding: 53 bytes), plus the
    /// fixed skiplist head (32 tower pointers) and the lock stripes. Removed nodes still awaiting
    /// epoch-based reclamation are not counted.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + KEY_LOCK_STRIPES * std::mem::size_of::<KeyLock>()
            + self.len() * NODE_BYTES
    }
}

/// Walks entries until `f` declines or `limit` entries were visited.
fn visit<'a>(
    entries: impl Iterator<Item = crossbeam_skiplist::map::Entry<'a, u64, AtomicU64>>,
    limit: usize,
    mut f: impl FnMut(u64, u64) -> bool,
) -> usize {
    let mut visited = 0;
    for entry in entries.take(limit) {
        visited += 1;
        if !f(*entry.key(), entry.value().load(Ordering::Acquire)) {
            break;
        }
    }
    visited
}

/// Whether `range` can hold no key, detected up front because callers may compute inverted
/// bounds (e.g. `from..to` with `from > to`) and such a range should simply be empty.
fn range_is_empty(range: &impl RangeBounds<u64>) -> bool {
    match (range.start_bound(), range.end_bound()) {
        (Bound::Included(&start), Bound::Included(&end)) => start > end,
        (Bound::Included(&start), Bound::Excluded(&end))
        | (Bound::Excluded(&start), Bound::Included(&end)) => start >= end,
        (Bound::Excluded(&start), Bound::Excluded(&end)) => start >= end || start + 1 == end,
        (Bound::Excluded(&start), Bound::Unbounded) => start == u64::MAX,
        (Bound::Unbounded, Bound::Excluded(&end)) => end == 0,
        _ => false,
    }
}

impl Default for OrderedIndex {
    fn default() -> Self {
        Self::new()
    }
}

// Summarise instead of printing every entry.
impl fmt::Debug for OrderedIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrderedIndex")
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys 10, 20, ..., 100 mapping to key + 1.
    fn tens() -> OrderedIndex {
        let index = OrderedIndex::new();
        for key in (10..=100).step_by(10) {
            index.insert_new(key, key + 1).unwrap();
        }
        index
    }

    fn collect_scan(index: &OrderedIndex, from: u64, limit: usize) -> Vec<u64> {
        let mut keys = Vec::new();
        let visited = index.scan(from, limit, |key, addr| {
            assert_eq!(addr, key + 1);
            keys.push(key);
            true
        });
        assert_eq!(visited, keys.len());
        keys
    }

    fn collect_range(index: &OrderedIndex, range: impl RangeBounds<u64>) -> Vec<u64> {
        let mut keys = Vec::new();
        index.scan_range(range, |key, _| {
            keys.push(key);
            true
        });
        keys
    }

    fn collect_rev(index: &OrderedIndex, upto: u64, limit: usize) -> Vec<u64> {
        let mut keys = Vec::new();
        index.scan_rev(upto, limit, |key, _| {
            keys.push(key);
            true
        });
        keys
    }

    #[test]
    fn node_estimate_matches_the_hand_computed_expectation() {
        // h=1: 48 B × 1/2, h=2: 48 × 1/4, h=3: 64 × 1/8, h=4: 64 × 1/16, h=5: 80 × 1/32, ...
        assert_eq!(expected_skiplist_node_bytes(16), 53);
    }

    #[test]
    fn insert_new_refuses_duplicates_and_reports_the_existing_addr() {
        let index = OrderedIndex::new();
        assert_eq!(index.insert_new(7, 100), Ok(()));
        assert_eq!(index.insert_new(7, 200), Err(100));
        assert_eq!(index.get(7), Some(100));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn upsert_remove_remove_if_replace_if() {
        let index = OrderedIndex::new();
        assert_eq!(index.upsert(1, 10), None);
        assert_eq!(index.upsert(1, 11), Some(10));
        assert_eq!(index.get(1), Some(11));
        assert!(
            !index.remove_if(1, 10),
            "wrong expected addr must not remove"
        );
        assert!(
            !index.replace_if(1, 10, 12),
            "wrong expected addr must not replace"
        );
        assert_eq!(index.get(1), Some(11));
        assert!(index.replace_if(1, 11, 12));
        assert_eq!(index.get(1), Some(12));
        assert!(
            !index.replace_if(2, 0, 20),
            "absent key must not be inserted"
        );
        assert_eq!(index.get(2), None);
        assert!(index.remove_if(1, 12));
        assert!(!index.remove_if(1, 12));
        assert_eq!(index.remove(1), None);
        index.upsert(3, 30);
        assert_eq!(index.remove(3), Some(30));
        assert!(index.is_empty());
    }

    #[test]
    fn scan_visits_ascending_from_a_key_between_entries_up_to_the_limit() {
        let index = tens();
        assert_eq!(collect_scan(&index, 0, 3), [10, 20, 30]);
        assert_eq!(collect_scan(&index, 35, 3), [40, 50, 60]);
        assert_eq!(collect_scan(&index, 40, 2), [40, 50]);
        assert_eq!(collect_scan(&index, 85, 10), [90, 100]);
        assert_eq!(collect_scan(&index, 101, 10), Vec::<u64>::new());
        assert_eq!(collect_scan(&index, 0, 0), Vec::<u64>::new());
    }

    #[test]
    fn scan_stops_when_f_returns_false() {
        let index = tens();
        let mut keys = Vec::new();
        let visited = index.scan(0, 100, |key, _| {
            keys.push(key);
            key < 30
        });
        assert_eq!(keys, [10, 20, 30]);
        assert_eq!(visited, 3);
    }

    #[test]
    fn scan_rev_visits_descending_from_keys_at_or_before() {
        let index = tens();
        assert_eq!(collect_rev(&index, 55, 2), [50, 40]);
        assert_eq!(collect_rev(&index, 50, 2), [50, 40]);
        assert_eq!(collect_rev(&index, u64::MAX, 3), [100, 90, 80]);
        assert_eq!(collect_rev(&index, 25, 10), [20, 10]);
        assert_eq!(collect_rev(&index, 9, 10), Vec::<u64>::new());
        let mut keys = Vec::new();
        let visited = index.scan_rev(100, 10, |key, _| {
            keys.push(key);
            key > 80
        });
        assert_eq!((keys, visited), (vec![100, 90, 80], 3));
    }

    #[test]
    fn scan_range_honours_every_bound_kind() {
        let index = tens();
        assert_eq!(collect_range(&index, 20..=40), [20, 30, 40]);
        assert_eq!(collect_range(&index, 20..40), [20, 30]);
        assert_eq!(
            collect_range(&index, (Bound::Excluded(20), Bound::Included(40))),
            [30, 40]
        );
        assert_eq!(
            collect_range(&index, (Bound::Excluded(20), Bound::Excluded(40))),
            [30]
        );
        assert_eq!(collect_range(&index, ..30), [10, 20]);
        assert_eq!(collect_range(&index, ..=30), [10, 20, 30]);
        assert_eq!(collect_range(&index, 85..), [90, 100]);
        assert_eq!(collect_range(&index, ..).len(), 10);
        assert_eq!(collect_range(&index, 15..25), [20]);
        // Inverted and degenerate ranges are empty, not a panic.
        let (high, low) = (50, 20); // through variables, as callers compute them
        assert!(collect_range(&index, high..low).is_empty());
        assert!(collect_range(&index, 30..30).is_empty());
        assert!(collect_range(&index, (Bound::Excluded(30), Bound::Excluded(31))).is_empty());
        assert!(collect_range(&index, (Bound::Excluded(u64::MAX), Bound::Unbounded)).is_empty());
        assert!(collect_range(&index, ..0).is_empty());
        let mut keys = Vec::new();
        let visited = index.scan_range(.., |key, _| {
            keys.push(key);
            keys.len() < 4
        });
        assert_eq!((keys, visited), (vec![10, 20, 30, 40], 4));
    }

    #[test]
    fn range_is_empty_agrees_with_btreemap_on_valid_ranges() {
        let model: std::collections::BTreeMap<u64, ()> = (0..8).map(|k| (k, ())).collect();
        let bounds = |v: u64| [Bound::Included(v), Bound::Excluded(v), Bound::Unbounded];
        for start in (0..8).flat_map(bounds) {
            for end in (0..8).flat_map(bounds) {
                let range = (start, end);
                let empty = range_is_empty(&range);
                // BTreeMap panics on inverted ranges, exactly the ones reported empty up front.
                let model_len = std::panic::catch_unwind(|| model.range(range).count());
                match model_len {
                    Ok(len) => assert!(!empty || len == 0, "{range:?}"),
                    Err(_) => assert!(empty, "{range:?} should be empty"),
                }
            }
        }
    }

    #[test]
    fn first_at_or_after_and_last_at_or_before() {
        let index = tens();
        assert_eq!(index.first_at_or_after(35), Some((40, 41)));
        assert_eq!(index.first_at_or_after(40), Some((40, 41)));
        assert_eq!(index.first_at_or_after(101), None);
        assert_eq!(index.last_at_or_before(35), Some((30, 31)));
        assert_eq!(index.last_at_or_before(30), Some((30, 31)));
        assert_eq!(index.last_at_or_before(9), None);
    }

    #[test]
    fn clear_and_for_each() {
        let index = tens();
        let mut keys = Vec::new();
        index.for_each(|key, _| keys.push(key));
        assert_eq!(keys, (10..=100).step_by(10).collect::<Vec<_>>());
        index.clear();
        assert!(index.is_empty());
        assert_eq!(index.first_at_or_after(0), None);
    }

    #[test]
    fn readers_never_see_a_present_key_as_absent_while_it_is_updated() {
        let index = OrderedIndex::new();
        index.insert_new(1, 0).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for addr in 1..20_000 {
                    assert!(index.replace_if(1, addr - 1, addr));
                    index.upsert(1, addr);
                }
                done.store(true, Ordering::Release);
            });
            while !done.load(Ordering::Acquire) {
                assert!(index.get(1).is_some());
            }
        });
    }

    #[test]
    fn memory_bytes_grows_with_entries_within_a_sane_range() {
        let index = OrderedIndex::new();
        let empty = index.memory_bytes();
        for key in 0..100_000u64 {
            index.upsert(key, key);
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
