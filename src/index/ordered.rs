//! [`OrderedIndex`]: a concurrent ordered u64 → u64 map with range scans, over the B+-tree of
//! [`btree`](super::btree) (optimistic lock coupling; the module documents the design).

use std::fmt;
use std::ops::{Bound, RangeBounds};

use super::btree::{BTree, HintChain, LeafHint};
use super::IndexError;

/// A concurrent ordered map from an 8-byte primary key to an 8-byte tuple address, with
/// ascending and descending range scans.
///
/// A B+-tree with optimistic lock coupling: point reads and scans take no lock and write nothing
/// shared, and a lookup costs a few cache misses. Every mutation locks the one leaf it changes
/// (plus a parent when a node splits or an empty leaf is unlinked), so conditional mutations
/// (`insert_new`, `remove_if`, `replace_if`) are atomic with respect to every other operation on
/// the same key.
pub struct OrderedIndex {
    tree: BTree<1>,
}

impl OrderedIndex {
    /// Creates an empty index.
    pub fn new() -> Self {
        Self { tree: BTree::new() }
    }

    /// Builds an index holding `entries` (key, address), whose keys must be strictly ascending,
    /// bottom up: full leaves in key order, then each inner level over the one below (FIR
    /// §4.4.2's rebuild from an index leaf checkpoint). O(n), with no descent or lock per key.
    /// An error names the first key that is not above the one before it.
    pub fn from_sorted(entries: impl IntoIterator<Item = (u64, u64)>) -> Result<Self, IndexError> {
        BTree::from_sorted(entries.into_iter().map(|(k, a)| ([k], a)))
            .map(|tree| Self { tree })
            .map_err(|[key]| IndexError::BulkKeyOrder(key))
    }

    /// Returns the address stored for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        self.tree.get([key])
    }

    /// Inserts `key → addr` only if `key` is absent; otherwise leaves the index unchanged and
    /// returns the address already stored.
    pub fn insert_new(&self, key: u64, addr: u64) -> Result<(), u64> {
        self.tree.insert_new([key], addr)
    }

    /// [`get`](Self::get) that also returns where its descent ended, for an insert of `key` to
    /// start there ([`insert_new_at`](Self::insert_new_at)).
    #[inline]
    pub fn get_for_insert(&self, key: u64) -> (Option<u64>, LeafHint) {
        self.tree.get_for_insert([key])
    }

    /// [`insert_new`](Self::insert_new) that goes straight to the hinted leaf while it is
    /// unchanged since the hint was taken (or changed only by the earlier inserts of `chain`), and
    /// descends from the root otherwise. Same result either way.
    #[inline]
    pub fn insert_new_at(
        &self,
        key: u64,
        addr: u64,
        observed: LeafHint,
        chain: &mut HintChain,
    ) -> Result<(), u64> {
        let (result, after) = self
            .tree
            .insert_new_at([key], addr, chain.current(observed));
        chain.advance(observed, after);
        result
    }

    /// Stores `key → addr` whether or not `key` is present, returning the previous address.
    pub fn upsert(&self, key: u64, addr: u64) -> Option<u64> {
        self.tree.upsert([key], addr)
    }

    /// Removes `key`, returning its address.
    pub fn remove(&self, key: u64) -> Option<u64> {
        self.tree.remove([key])
    }

    /// Removes `key` only if it maps to exactly `addr`; returns whether it was removed.
    ///
    /// Lets a transaction delete the version it saw without clobbering a newer one.
    pub fn remove_if(&self, key: u64, addr: u64) -> bool {
        self.tree.remove_if([key], addr)
    }

    /// Replaces the address of `key` with `new` only if it currently is `expected`; returns
    /// whether it was replaced. An absent key is never inserted.
    ///
    /// Out-of-place engines use it to swing a key to a new tuple version, compare-and-swap style.
    pub fn replace_if(&self, key: u64, expected: u64, new: u64) -> bool {
        self.tree.replace_if([key], expected, new)
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// Whether the index holds no entries.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.first_at_or_after(0).is_none()
    }

    /// Removes every entry.
    pub fn clear(&self) {
        let mut keys = Vec::new();
        self.for_each(|key, _| keys.push(key));
        for key in keys {
            self.remove(key);
        }
    }

    /// Calls `f(key, addr)` for every entry in ascending key order.
    ///
    /// Takes no lock, so `f` may modify the index. Not a snapshot: each visited entry was present
    /// at some moment during the walk, and entries changed concurrently may or may not be seen.
    pub fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        self.tree.walk(
            [0],
            false,
            usize::MAX,
            |_| true,
            |[k], a| {
                f(k, a);
                true
            },
        );
    }

    /// Visits entries with keys `>= from` in ascending order, calling `f(key, addr)` until it
    /// returns `false` or `limit` entries were visited. Returns the number of calls to `f`.
    ///
    /// Same consistency as [`for_each`](Self::for_each): not a snapshot.
    pub fn scan(&self, from: u64, limit: usize, mut f: impl FnMut(u64, u64) -> bool) -> usize {
        self.tree
            .walk([from], false, limit, |_| true, |[k], a| f(k, a))
    }

    /// Visits the entries whose keys fall in `range` in ascending order, calling `f(key, addr)`
    /// until it returns `false`. Returns the number of calls to `f`. An inverted range (start
    /// after end) visits nothing rather than panicking.
    pub fn scan_range(
        &self,
        range: impl RangeBounds<u64>,
        mut f: impl FnMut(u64, u64) -> bool,
    ) -> usize {
        if range_is_empty(&range) {
            return 0;
        }
        let from = match range.start_bound() {
            Bound::Included(&start) => start,
            Bound::Excluded(&start) => start + 1, // Not u64::MAX: the range is not empty.
            Bound::Unbounded => 0,
        };
        let end = range.end_bound().cloned();
        let in_range = move |[key]: [u64; 1]| match end {
            Bound::Included(end) => key <= end,
            Bound::Excluded(end) => key < end,
            Bound::Unbounded => true,
        };
        self.tree
            .walk([from], false, usize::MAX, in_range, |[k], a| f(k, a))
    }

    /// Visits entries with keys `<= upto` in descending order, calling `f(key, addr)` until it
    /// returns `false` or `limit` entries were visited. Returns the number of calls to `f`.
    ///
    /// For "latest first" reads such as TPC-C Order-Status finding a customer's newest order.
    pub fn scan_rev(&self, upto: u64, limit: usize, mut f: impl FnMut(u64, u64) -> bool) -> usize {
        self.tree
            .walk([upto], true, limit, |_| true, |[k], a| f(k, a))
    }

    /// The entry with the smallest key `>= key`.
    pub fn first_at_or_after(&self, key: u64) -> Option<(u64, u64)> {
        crate::index::first_visited(|f| {
            self.scan(key, 1, f);
        })
    }

    /// The entry with the largest key `<= key`.
    pub fn last_at_or_before(&self, key: u64) -> Option<(u64, u64)> {
        crate::index::first_visited(|f| {
            self.scan_rev(key, 1, f);
        })
    }

    /// DRAM bytes used by the index: every node allocated (linked, or free for reuse) plus the
    /// fixed part.
    pub fn memory_bytes(&self) -> usize {
        self.tree.memory_bytes()
    }
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
    use proptest::prelude::*;
    use std::sync::atomic::Ordering;

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
            (16.0..40.0).contains(&per_entry),
            "{per_entry} bytes per entry"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Upsert(u64, u64),
        Remove(u64),
        RemoveIf(u64, u64),
        ReplaceIf(u64, u64, u64),
        RemoveRange(u64, u64),
        Scan(u64, usize),
        ScanRev(u64, usize),
        /// Lookups of a batch of keys near `.0` (offsets `.1`) taking hints, the writes `.2`
        /// (key near `.0`, insert or remove) changing the tree meanwhile, then the batch's
        /// inserts from the hints through one chain, as a Falcon commit publishes its inserts.
        HintedBatch(u64, Vec<u64>, Vec<(u64, bool)>),
    }

    fn op_strategy(keys: u64) -> impl Strategy<Value = Op> {
        let key = 0..keys;
        let addr = 0u64..3;
        prop_oneof![
            4 => key.clone().prop_map(Op::Insert),
            2 => (key.clone(), addr.clone()).prop_map(|(k, a)| Op::Upsert(k, a)),
            2 => key.clone().prop_map(Op::Remove),
            1 => (key.clone(), addr.clone()).prop_map(|(k, a)| Op::RemoveIf(k, a)),
            1 => (key.clone(), addr.clone(), addr).prop_map(|(k, e, n)| Op::ReplaceIf(k, e, n)),
            1 => (key.clone(), 0u64..200).prop_map(|(k, n)| Op::RemoveRange(k, n)),
            1 => (key.clone(), 0usize..80).prop_map(|(k, l)| Op::Scan(k, l)),
            1 => (key.clone(), 0usize..80).prop_map(|(k, l)| Op::ScanRev(k, l)),
            2 => (
                key,
                proptest::collection::vec(0u64..64, 1..16),
                proptest::collection::vec((0u64..128, any::<bool>()), 0..48),
            )
                .prop_map(|(k, offsets, between)| Op::HintedBatch(k, offsets, between)),
        ]
    }

    /// The shortcut is taken while the hinted leaf is unchanged, and through a chain of inserts
    /// into one leaf; a leaf changed by anyone else sends the insert down from the root.
    #[test]
    fn hinted_inserts_skip_the_descent_only_while_the_leaf_is_unchanged() {
        let index = tens();
        let hints: Vec<_> = (1..=5)
            .map(|k| {
                let (found, hint) = index.get_for_insert(k);
                assert_eq!(found, None);
                hint
            })
            .collect();
        assert!(
            hints.windows(2).all(|w| w[0] == w[1]),
            "one leaf, one version"
        );
        let mut chain = HintChain::default();
        for (k, &hint) in (1..=5).zip(&hints) {
            let (result, after) = index.tree.insert_new_at([k], k + 1, chain.current(hint));
            assert_eq!(result, Ok(()));
            assert!(
                after.is_some(),
                "key {k}: the chain's shortcut was not taken"
            );
            chain.advance(hint, after);
        }
        // Another writer changes the leaf between the lookup and the insert.
        let (_, stale) = index.get_for_insert(6);
        index.insert_new(7, 8).unwrap();
        let (result, after) = index.tree.insert_new_at([6], 7, stale);
        assert_eq!((result, after), (Ok(()), None));
        // The hinted leaf splits before the insert: the key now belongs to the new right leaf.
        let full = OrderedIndex::new();
        for key in (1..=30).map(|k| k * 10) {
            full.insert_new(key, key + 1).unwrap();
        }
        let (_, before_split) = full.get_for_insert(295);
        full.insert_new(5, 6).unwrap();
        let (result, after) = full.tree.insert_new_at([295], 296, before_split);
        assert_eq!((result, after), (Ok(()), None));
        full.tree.check_invariants();
        // A stale hint never inserts a duplicate: the descent finds the key.
        let (_, stale) = index.get_for_insert(8);
        index.insert_new(8, 9).unwrap();
        assert_eq!(index.tree.insert_new_at([8], 0, stale).0, Err(9));
        index.tree.check_invariants();
        let mut all = Vec::new();
        index.for_each(|k, a| all.push((k, a)));
        let mut expected: Vec<_> = (1..=8).chain((10..=100).step_by(10)).collect();
        expected.sort_unstable();
        assert_eq!(
            all,
            expected.into_iter().map(|k| (k, k + 1)).collect::<Vec<_>>()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Enough keys and operations to split leaves and inner nodes, empty leaves and unlink
        /// them, and scan across leaf boundaries, against a `BTreeMap`.
        #[test]
        fn matches_a_btreemap_through_splits_and_unlinks(
            ops in proptest::collection::vec(op_strategy(3_000), 1..1_500)
        ) {
            let index = OrderedIndex::new();
            let mut model = std::collections::BTreeMap::new();
            for op in &ops {
                match *op {
                    Op::Insert(k) => {
                        let expected = model.get(&k).copied();
                        prop_assert_eq!(index.insert_new(k, k % 3).err(), expected);
                        model.entry(k).or_insert(k % 3);
                    }
                    Op::Upsert(k, a) => prop_assert_eq!(index.upsert(k, a), model.insert(k, a)),
                    Op::Remove(k) => prop_assert_eq!(index.remove(k), model.remove(&k)),
                    Op::RemoveIf(k, a) => {
                        let hit = model.get(&k) == Some(&a);
                        if hit {
                            model.remove(&k);
                        }
                        prop_assert_eq!(index.remove_if(k, a), hit);
                    }
                    Op::ReplaceIf(k, e, n) => {
                        let hit = model.get(&k) == Some(&e);
                        if hit {
                            model.insert(k, n);
                        }
                        prop_assert_eq!(index.replace_if(k, e, n), hit);
                    }
                    Op::RemoveRange(k, n) => {
                        for key in k..k + n {
                            prop_assert_eq!(index.remove(key), model.remove(&key));
                        }
                    }
                    Op::Scan(k, limit) => {
                        let mut seen = Vec::new();
                        index.scan(k, limit, |key, a| {
                            seen.push((key, a));
                            true
                        });
                        let expected: Vec<_> =
                            model.range(k..).take(limit).map(|(&k, &a)| (k, a)).collect();
                        prop_assert_eq!(seen, expected);
                    }
                    Op::HintedBatch(base, ref offsets, ref between) => {
                        let mut keys: Vec<u64> = offsets.iter().map(|o| base + o).collect();
                        keys.dedup();
                        let mut hints = Vec::new();
                        for &k in &keys {
                            let (found, hint) = index.get_for_insert(k);
                            prop_assert_eq!(found, model.get(&k).copied());
                            hints.push(hint);
                        }
                        for &(offset, insert) in between {
                            let k = base + offset;
                            if insert {
                                prop_assert_eq!(index.upsert(k, 2), model.insert(k, 2));
                            } else {
                                prop_assert_eq!(index.remove(k), model.remove(&k));
                            }
                        }
                        let mut chain = HintChain::default();
                        for (&k, hint) in keys.iter().zip(hints) {
                            let expected = model.get(&k).copied();
                            let result = index.insert_new_at(k, k % 3, hint, &mut chain);
                            prop_assert_eq!(result.err(), expected);
                            model.entry(k).or_insert(k % 3);
                        }
                    }
                    Op::ScanRev(k, limit) => {
                        let mut seen = Vec::new();
                        index.scan_rev(k, limit, |key, a| {
                            seen.push((key, a));
                            true
                        });
                        let expected: Vec<_> =
                            model.range(..=k).rev().take(limit).map(|(&k, &a)| (k, a)).collect();
                        prop_assert_eq!(seen, expected);
                        // The PM ordered index's inner-map lookup.
                        prop_assert_eq!(
                            index.tree.floor([k]),
                            model.range(..=k).next_back().map(|(&k, &a)| ([k], a))
                        );
                    }
                }
            }
            index.tree.check_invariants();
            let mut all = Vec::new();
            index.for_each(|k, a| all.push((k, a)));
            prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn ascending_inserts_fill_leaves_and_a_drained_prefix_leaves_no_empty_leaves() {
        let index = OrderedIndex::new();
        for key in 0..30_000u64 {
            index.insert_new(key, key).unwrap();
        }
        index.tree.check_invariants();
        // Ascending inserts keep leaves full (29–30 keys per 512-byte node); the arena's chunks
        // grow geometrically, so up to half of what it holds is not handed out yet.
        let per_entry = index.memory_bytes() as f64 / 30_000.0;
        assert!(per_entry < 40.0, "{per_entry} bytes per entry");
        // A queue: drain the low end (TPC-C NEW-ORDER). The emptied leaves are unlinked, so a
        // scan from the start reaches the first live key through one descent per leaf at most.
        for key in 0..29_000u64 {
            assert_eq!(index.remove(key), Some(key));
        }
        index.tree.check_invariants();
        let mut leaves = 0;
        let mut next = Some(0);
        let mut batch = crate::index::btree::LeafBatch::new();
        while let Some(from) = next {
            next = index.tree.read_leaf([from], false, &mut batch).map(|[k]| k);
            leaves += 1;
            if !batch.is_empty() {
                break;
            }
        }
        assert_eq!(
            leaves, 1,
            "the scan walked {leaves} leaves to its first key"
        );
        assert_eq!(index.first_at_or_after(0), Some((29_000, 29_000)));
        // Reused nodes: refilling does not grow the arena.
        let before = index.memory_bytes();
        for key in 30_000..50_000u64 {
            index.insert_new(key, key).unwrap();
        }
        assert_eq!(index.memory_bytes(), before);
        index.tree.check_invariants();
    }

    /// Writers insert and remove their own keys while readers check that keys no writer touches
    /// are always found, and that scans see strictly ascending keys containing every stable key in
    /// their range.
    #[test]
    fn concurrent_writers_and_scanners_keep_every_stable_key_visible() {
        const STABLE_EVERY: u64 = 7;
        const KEYS: u64 = 40_000;
        let index = OrderedIndex::new();
        for key in (0..KEYS).step_by(STABLE_EVERY as usize) {
            index.insert_new(key, key).unwrap();
        }
        let done = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for writer in 0..2u64 {
                let (index, done) = (&index, &done);
                scope.spawn(move || {
                    for round in 0..3u64 {
                        // Writer w owns keys ≡ 1 + w (mod 7), other than the stable ones.
                        let mine = (0..KEYS).filter(|k| k % STABLE_EVERY == 1 + writer);
                        for key in mine.clone() {
                            index.insert_new(key, key + round).unwrap();
                        }
                        for key in mine {
                            assert_eq!(index.remove(key), Some(key + round));
                        }
                    }
                    done.fetch_add(1, Ordering::AcqRel);
                });
            }
            let (index, done) = (&index, &done);
            scope.spawn(move || {
                let mut probe = 0u64;
                while done.load(Ordering::Acquire) < 2 {
                    probe = (probe + 7 * 101) % KEYS;
                    let stable = probe - probe % STABLE_EVERY;
                    assert_eq!(index.get(stable), Some(stable), "stable key lost");
                    let mut last = None;
                    let mut stable_seen = 0;
                    index.scan(stable, 300, |key, _| {
                        assert!(last.map_or(true, |l| l < key), "scan out of order");
                        last = Some(key);
                        stable_seen += u64::from(key % STABLE_EVERY == 0);
                        true
                    });
                    if let Some(last) = last {
                        assert_eq!(stable_seen, (last - stable) / STABLE_EVERY + 1);
                    }
                }
            });
        });
        index.tree.check_invariants();
        assert_eq!(index.len() as u64, KEYS.div_ceil(STABLE_EVERY));
    }

    /// Keys 0, 3, 6, ... below `n * 3`, mapping to key + 1.
    fn bulk(n: u64) -> OrderedIndex {
        OrderedIndex::from_sorted((0..n).map(|i| (i * 3, i * 3 + 1))).unwrap()
    }

    #[test]
    fn from_sorted_builds_a_balanced_tree_of_every_size() {
        // Sizes around the leaf and inner-node capacities, and one four levels deep.
        for n in [0u64, 1, 2, 29, 30, 31, 61, 930, 931, 962, 5_000, 100_000] {
            let index = bulk(n);
            index.tree.check_invariants();
            assert_eq!(index.len(), n as usize, "size {n}");
            let all = collect_scan(&index, 0, usize::MAX);
            assert_eq!(all, (0..n).map(|i| i * 3).collect::<Vec<_>>(), "size {n}");
            for i in 0..n.min(2_000) {
                assert_eq!(index.get(i * 3), Some(i * 3 + 1));
                assert_eq!(index.get(i * 3 + 1), None);
            }
        }
    }

    #[test]
    fn from_sorted_refuses_keys_out_of_order_or_repeated() {
        let err = |v: Vec<(u64, u64)>| OrderedIndex::from_sorted(v).err();
        assert_eq!(
            err(vec![(1, 0), (5, 0), (5, 1)]),
            Some(IndexError::BulkKeyOrder(5))
        );
        assert_eq!(
            err(vec![(1, 0), (5, 0), (4, 1)]),
            Some(IndexError::BulkKeyOrder(4))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// A bottom-up built tree holds exactly its entries and then behaves as a `BTreeMap`
        /// under inserts, removals and scans (its full leaves split, its leaves empty and unlink).
        #[test]
        fn from_sorted_then_changes_match_a_btreemap(
            start in prop::collection::btree_map(0u64..20_000, 0u64..1_000, 0..3_000),
            ops in prop::collection::vec((0u8..3, 0u64..20_000, 0u64..1_000), 0..600),
        ) {
            let index = OrderedIndex::from_sorted(start.iter().map(|(&k, &a)| (k, a))).unwrap();
            let mut model = start;
            index.tree.check_invariants();
            for (op, key, addr) in ops {
                match op {
                    0 => {
                        let expected = model.get(&key).copied();
                        prop_assert_eq!(index.insert_new(key, addr).err(), expected);
                        model.entry(key).or_insert(addr);
                    }
                    1 => prop_assert_eq!(index.upsert(key, addr), model.insert(key, addr)),
                    _ => prop_assert_eq!(index.remove(key), model.remove(&key)),
                }
            }
            index.tree.check_invariants();
            let mut seen = Vec::new();
            index.for_each(|k, a| seen.push((k, a)));
            prop_assert_eq!(seen, model.iter().map(|(&k, &a)| (k, a)).collect::<Vec<_>>());
            let from = model.keys().nth(model.len() / 2).copied().unwrap_or(0);
            let mut rev = Vec::new();
            index.scan_rev(from, 50, |k, _| { rev.push(k); true });
            prop_assert_eq!(rev, model.range(..=from).rev().take(50).map(|(&k, _)| k).collect::<Vec<_>>());
        }
    }
}
