//! [`PrimaryIndex`]: a hash or ordered index chosen at run time.

use std::fmt;
use std::ops::RangeBounds;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{HashIndex, HintChain, IndexError, LeafHint, OrderedIndex};

/// Which structure backs a [`PrimaryIndex`]; configured per table by name (`hash`, `ordered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrimaryIndexKind {
    /// [`HashIndex`]: cheapest point operations, no range scans.
    Hash,
    /// [`OrderedIndex`]: point operations and range scans.
    Ordered,
}

impl PrimaryIndexKind {
    /// The lowercase name used in configuration, serde and [`FromStr`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hash => "hash",
            Self::Ordered => "ordered",
        }
    }
}

impl fmt::Display for PrimaryIndexKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PrimaryIndexKind {
    type Err = IndexError;

    /// Parses `hash` or `ordered`, ignoring ASCII case.
    fn from_str(name: &str) -> Result<Self, IndexError> {
        [Self::Hash, Self::Ordered]
            .into_iter()
            .find(|kind| kind.as_str().eq_ignore_ascii_case(name))
            .ok_or_else(|| IndexError::UnknownKind(name.to_owned()))
    }
}

/// A primary-key index of either kind, forwarding every operation to it.
///
/// Range scans exist only on [`PrimaryIndex::Ordered`]; on [`PrimaryIndex::Hash`] they return
/// [`IndexError::ScanUnsupported`].
// The ordered variant embeds the tree's node arena directory (~1 KiB) inline. There is one index
// per table, so the size does not matter, whereas boxing would add a pointer chase to every lookup.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum PrimaryIndex {
    /// Backed by a [`HashIndex`].
    Hash(HashIndex),
    /// Backed by an [`OrderedIndex`].
    Ordered(OrderedIndex),
}

/// Forwards a call to whichever index backs `self`.
macro_rules! forward {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            PrimaryIndex::Hash(index) => index.$method($($arg),*),
            PrimaryIndex::Ordered(index) => index.$method($($arg),*),
        }
    };
}

impl PrimaryIndex {
    /// Creates an empty index of `kind`.
    pub fn new(kind: PrimaryIndexKind) -> Self {
        Self::with_capacity(kind, 0)
    }

    /// Creates an empty index of `kind` presized for `capacity` entries. Only a hash index can be
    /// presized; an ordered one allocates per entry and ignores `capacity`.
    pub fn with_capacity(kind: PrimaryIndexKind, capacity: usize) -> Self {
        match kind {
            PrimaryIndexKind::Hash => Self::Hash(HashIndex::with_capacity(capacity)),
            PrimaryIndexKind::Ordered => Self::Ordered(OrderedIndex::new()),
        }
    }

    /// Builds an index of `kind` holding `entries` (key, address), whose keys must be strictly
    /// ascending (an index leaf checkpoint's order), without inserting them one by one: a hash
    /// index is filled shard by shard in parallel and takes `spare` more entries without
    /// growing ([`HashIndex::from_entries`]); an ordered one is built bottom up
    /// ([`OrderedIndex::from_sorted`]). An error names a key out of order or given twice.
    pub fn from_sorted(
        kind: PrimaryIndexKind,
        entries: &[(u64, u64)],
        spare: usize,
    ) -> Result<Self, IndexError> {
        Self::from_sorted_by(kind, entries, |&pair| pair, spare)
    }

    /// [`from_sorted`](Self::from_sorted) over records of any type, `key_addr` giving each
    /// one's key and address (FIR's recovery builds from its checkpoint's entries in place).
    pub fn from_sorted_by<T: Sync>(
        kind: PrimaryIndexKind,
        entries: &[T],
        key_addr: impl Fn(&T) -> (u64, u64) + Sync,
        spare: usize,
    ) -> Result<Self, IndexError> {
        let key = |e: &T| key_addr(e).0;
        if let Some(w) = entries.windows(2).find(|w| key(&w[0]) >= key(&w[1])) {
            return Err(IndexError::BulkKeyOrder(key(&w[1])));
        }
        Ok(match kind {
            PrimaryIndexKind::Hash => {
                Self::Hash(HashIndex::from_entries_by(entries, &key_addr, spare)?)
            }
            PrimaryIndexKind::Ordered => {
                Self::Ordered(OrderedIndex::from_sorted(entries.iter().map(&key_addr))?)
            }
        })
    }

    /// The kind of index backing this one.
    pub fn kind(&self) -> PrimaryIndexKind {
        match self {
            Self::Hash(_) => PrimaryIndexKind::Hash,
            Self::Ordered(_) => PrimaryIndexKind::Ordered,
        }
    }

    /// Whether the `scan*`, `first_at_or_after` and `last_at_or_before` methods are available.
    pub fn supports_scans(&self) -> bool {
        matches!(self, Self::Ordered(_))
    }

    /// Returns the address stored for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        forward!(self.get(key))
    }

    /// Starts loading what a lookup of `key` will read, so that a transaction that knows its
    /// keys can overlap the misses: the bucket of a hash index. An ordered index has no single
    /// place to prefetch (its lookup is a descent), so this does nothing there.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        if let Self::Hash(index) = self {
            index.prefetch(key);
        }
    }

    /// Inserts `key → addr` only if `key` is absent; otherwise returns the address already stored.
    #[inline]
    pub fn insert_new(&self, key: u64, addr: u64) -> Result<(), u64> {
        forward!(self.insert_new(key, addr))
    }

    /// [`get`](Self::get) that also returns, for an ordered index, the leaf its descent ended in,
    /// so that an insert of `key` at commit can start there
    /// ([`insert_new_at`](Self::insert_new_at)). A hash index has no descent to save: `None`.
    #[inline]
    pub fn get_for_insert(&self, key: u64) -> (Option<u64>, Option<LeafHint>) {
        match self {
            Self::Hash(index) => (index.get(key), None),
            Self::Ordered(index) => {
                let (found, hint) = index.get_for_insert(key);
                (found, Some(hint))
            }
        }
    }

    /// [`insert_new`](Self::insert_new) starting at the leaf of `hint` when there is one and it is
    /// unchanged (see [`OrderedIndex::insert_new_at`]); the same result either way.
    #[inline]
    pub fn insert_new_at(
        &self,
        key: u64,
        addr: u64,
        hint: Option<LeafHint>,
        chain: &mut HintChain,
    ) -> Result<(), u64> {
        match (self, hint) {
            (Self::Ordered(index), Some(hint)) => index.insert_new_at(key, addr, hint, chain),
            _ => self.insert_new(key, addr),
        }
    }

    /// Stores `key → addr`, returning the previous address.
    #[inline]
    pub fn upsert(&self, key: u64, addr: u64) -> Option<u64> {
        forward!(self.upsert(key, addr))
    }

    /// Removes `key`, returning its address.
    #[inline]
    pub fn remove(&self, key: u64) -> Option<u64> {
        forward!(self.remove(key))
    }

    /// Removes `key` only if it maps to exactly `addr`; returns whether it was removed.
    #[inline]
    pub fn remove_if(&self, key: u64, addr: u64) -> bool {
        forward!(self.remove_if(key, addr))
    }

    /// Replaces the address of `key` with `new` only if it currently is `expected`; returns
    /// whether it was replaced. An absent key is never inserted.
    #[inline]
    pub fn replace_if(&self, key: u64, expected: u64, new: u64) -> bool {
        forward!(self.replace_if(key, expected, new))
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        forward!(self.len())
    }

    /// Whether the index holds no entries.
    #[inline]
    pub fn is_empty(&self) -> bool {
        forward!(self.is_empty())
    }

    /// Removes every entry.
    pub fn clear(&self) {
        forward!(self.clear())
    }

    /// Calls `f(key, addr)` for every entry: in ascending key order for an ordered index, in no
    /// particular order for a hash index. `f` must not modify the index (a hash index keeps a
    /// shard locked while visiting it).
    pub fn for_each(&self, f: impl FnMut(u64, u64)) {
        forward!(self.for_each(f))
    }

    /// Estimated DRAM bytes used by the index; see [`HashIndex::memory_bytes`] and
    /// [`OrderedIndex::memory_bytes`] for what is counted.
    pub fn memory_bytes(&self) -> usize {
        forward!(self.memory_bytes())
    }

    fn ordered(&self) -> Result<&OrderedIndex, IndexError> {
        match self {
            Self::Ordered(index) => Ok(index),
            Self::Hash(_) => Err(IndexError::ScanUnsupported),
        }
    }

    /// [`OrderedIndex::scan`]: ascending from `from`, at most `limit` entries, until `f` returns
    /// `false`; returns the number of calls to `f`.
    pub fn scan(
        &self,
        from: u64,
        limit: usize,
        f: impl FnMut(u64, u64) -> bool,
    ) -> Result<usize, IndexError> {
        Ok(self.ordered()?.scan(from, limit, f))
    }

    /// [`OrderedIndex::scan_range`]: ascending over `range` until `f` returns `false`; returns
    /// the number of calls to `f`.
    pub fn scan_range(
        &self,
        range: impl RangeBounds<u64>,
        f: impl FnMut(u64, u64) -> bool,
    ) -> Result<usize, IndexError> {
        Ok(self.ordered()?.scan_range(range, f))
    }

    /// [`OrderedIndex::scan_rev`]: descending from `upto`, at most `limit` entries, until `f`
    /// returns `false`; returns the number of calls to `f`.
    pub fn scan_rev(
        &self,
        upto: u64,
        limit: usize,
        f: impl FnMut(u64, u64) -> bool,
    ) -> Result<usize, IndexError> {
        Ok(self.ordered()?.scan_rev(upto, limit, f))
    }

    /// [`OrderedIndex::first_at_or_after`]: the entry with the smallest key `>= key`.
    pub fn first_at_or_after(&self, key: u64) -> Result<Option<(u64, u64)>, IndexError> {
        Ok(self.ordered()?.first_at_or_after(key))
    }

    /// [`OrderedIndex::last_at_or_before`]: the entry with the largest key `<= key`.
    pub fn last_at_or_before(&self, key: u64) -> Result<Option<(u64, u64)>, IndexError> {
        Ok(self.ordered()?.last_at_or_before(key))
    }
}

impl From<HashIndex> for PrimaryIndex {
    fn from(index: HashIndex) -> Self {
        Self::Hash(index)
    }
}

impl From<OrderedIndex> for PrimaryIndex {
    fn from(index: OrderedIndex) -> Self {
        Self::Ordered(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    const KINDS: [PrimaryIndexKind; 2] = [PrimaryIndexKind::Hash, PrimaryIndexKind::Ordered];

    #[test]
    fn kind_names_round_trip_through_fromstr_display_and_serde() {
        for kind in KINDS {
            assert_eq!(kind.as_str().parse::<PrimaryIndexKind>(), Ok(kind));
            assert_eq!(kind.to_string(), kind.as_str());
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(
                serde_json::from_str::<PrimaryIndexKind>(&json).unwrap(),
                kind
            );
        }
        assert_eq!("Ordered".parse(), Ok(PrimaryIndexKind::Ordered));
        assert!(serde_json::from_str::<PrimaryIndexKind>("\"btree\"").is_err());
    }

    #[test]
    fn unknown_kind_names_are_refused_with_a_clear_error() {
        let err = "btree".parse::<PrimaryIndexKind>().unwrap_err();
        assert_eq!(err, IndexError::UnknownKind("btree".into()));
        let message = err.to_string();
        assert!(
            message.contains("btree") && message.contains("hash") && message.contains("ordered")
        );
        assert!("".parse::<PrimaryIndexKind>().is_err());
    }

    #[test]
    fn hash_primary_index_refuses_scans_with_the_typed_error() {
        let index = PrimaryIndex::new(PrimaryIndexKind::Hash);
        index.insert_new(1, 1).unwrap();
        assert!(!index.supports_scans());
        let never = |_, _| -> bool { panic!("a hash index must not visit entries") };
        assert_eq!(index.scan(0, 10, never), Err(IndexError::ScanUnsupported));
        assert_eq!(
            index.scan_range(.., never),
            Err(IndexError::ScanUnsupported)
        );
        assert_eq!(
            index.scan_rev(10, 10, never),
            Err(IndexError::ScanUnsupported)
        );
        assert_eq!(index.first_at_or_after(0), Err(IndexError::ScanUnsupported));
        assert_eq!(index.last_at_or_before(9), Err(IndexError::ScanUnsupported));
        assert!(IndexError::ScanUnsupported
            .to_string()
            .contains("ordered index"));
    }

    #[test]
    fn ordered_primary_index_forwards_scans() {
        let index = PrimaryIndex::with_capacity(PrimaryIndexKind::Ordered, 100);
        assert_eq!(index.kind(), PrimaryIndexKind::Ordered);
        assert!(index.supports_scans());
        for key in [30, 10, 20] {
            index.insert_new(key, key * 10).unwrap();
        }
        let mut seen = Vec::new();
        assert_eq!(
            index.scan_range(15.., |k, a| {
                seen.push((k, a));
                true
            }),
            Ok(2)
        );
        assert_eq!(seen, [(20, 200), (30, 300)]);
        assert_eq!(index.last_at_or_before(25), Ok(Some((20, 200))));
        assert_eq!(index.first_at_or_after(25), Ok(Some((30, 300))));
        index.clear();
        assert!(index.is_empty());
    }

    /// Two threads insert disjoint keys, then race on shared keys: every race must have exactly
    /// one winner, the final contents must follow from the winners, and len() must agree.
    #[test]
    fn concurrent_conditional_mutations_have_exactly_one_winner() {
        const OWN_KEYS: u64 = 5_000;
        const SHARED_KEYS: u64 = 2_000;
        const SHARED_BASE: u64 = 1 << 40;
        for kind in KINDS {
            let index = PrimaryIndex::new(kind);
            for key in SHARED_BASE..SHARED_BASE + SHARED_KEYS {
                index.insert_new(key, 0).unwrap();
            }
            let barrier = Barrier::new(2);
            let fresh = SHARED_BASE * 2;
            let (replaced, (removed, inserted)) = std::thread::scope(|scope| {
                let replacer = scope.spawn(|| {
                    for key in 0..OWN_KEYS {
                        index.insert_new(key, key).unwrap();
                    }
                    barrier.wait();
                    let mut replaced = Vec::new();
                    for key in SHARED_BASE..SHARED_BASE + SHARED_KEYS {
                        replaced.push(index.replace_if(key, 0, 1));
                        // Both threads also race to create the same fresh key.
                        let _ = index.insert_new(fresh + key, 1);
                    }
                    replaced
                });
                let remover = scope.spawn(|| {
                    for key in OWN_KEYS..2 * OWN_KEYS {
                        index.insert_new(key, key).unwrap();
                    }
                    barrier.wait();
                    let (mut removed, mut inserted) = (Vec::new(), Vec::new());
                    for key in SHARED_BASE..SHARED_BASE + SHARED_KEYS {
                        removed.push(index.remove_if(key, 0));
                        let outcome = index.insert_new(fresh + key, 2);
                        assert!(matches!(outcome, Ok(()) | Err(1)), "{outcome:?}");
                        inserted.push(outcome.is_ok());
                    }
                    (removed, inserted)
                });
                (replacer.join().unwrap(), remover.join().unwrap())
            });

            let mut expected_len = (2 * OWN_KEYS + SHARED_KEYS) as usize;
            for (i, key) in (SHARED_BASE..SHARED_BASE + SHARED_KEYS).enumerate() {
                // Both started from addr 0: whoever went first makes the other's condition fail.
                assert!(
                    replaced[i] != removed[i],
                    "{kind}: key {key} had {} winners",
                    if replaced[i] { 2 } else { 0 }
                );
                let expected = if replaced[i] { Some(1) } else { None };
                assert_eq!(index.get(key), expected, "{kind}: key {key}");
                expected_len += usize::from(replaced[i]);
                let fresh_addr = if inserted[i] { 2 } else { 1 };
                assert_eq!(index.get(fresh + key), Some(fresh_addr), "{kind}");
            }
            for key in 0..2 * OWN_KEYS {
                assert_eq!(index.get(key), Some(key), "{kind}");
            }
            assert_eq!(index.len(), expected_len, "{kind}");
            let mut counted = 0;
            index.for_each(|_, _| counted += 1);
            assert_eq!(counted, index.len(), "{kind}");
        }
    }

    /// Prints memory_bytes() per entry for each kind; run with `--ignored --nocapture`.
    #[test]
    #[ignore = "reporting aid, slow in debug builds"]
    fn report_memory_bytes_per_entry() {
        for entries in [100_000u64, 1_000_000] {
            for kind in KINDS {
                let index = PrimaryIndex::new(kind);
                for key in 0..entries {
                    index
                        .insert_new(key.wrapping_mul(0x9e37_79b9_7f4a_7c15), key)
                        .unwrap();
                }
                let per_entry = index.memory_bytes() as f64 / entries as f64;
                println!("{kind} at {entries}: {per_entry:.1} bytes/entry");
            }
            let presized = PrimaryIndex::with_capacity(PrimaryIndexKind::Hash, entries as usize);
            for key in 0..entries {
                presized.upsert(key, key);
            }
            let per_entry = presized.memory_bytes() as f64 / entries as f64;
            println!("hash (presized) at {entries}: {per_entry:.1} bytes/entry");
            let secondary = super::super::SecondaryIndex::new();
            for pk in 0..entries {
                secondary.insert(pk % 1000, pk);
            }
            let per_entry = secondary.memory_bytes() as f64 / entries as f64;
            println!("secondary at {entries}: {per_entry:.1} bytes/entry");
        }
    }
}
