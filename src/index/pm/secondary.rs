//! [`PmSecondaryIndex`]: a persistent non-unique index of `(secondary key, primary key)` pairs,
//! so that a table with secondary indexes (TPC-C's customer by last name, order by customer)
//! recovers without a heap scan either (issue 17; Falcon §5.3 "Index Recovery").

use std::fmt;
use std::sync::Arc;

use crate::alloc::{PageManager, PageTag};
use crate::index::mix64;
use crate::pmem::Pool;

use super::ordered::{OrderedRecoveryStats, PmOrderedError, PmOrderedIndex};

/// Low bits of a stored key that come from the primary key's hash; the high bits are the
/// secondary key's.
const PK_BITS: u32 = 20;
const PK_MASK: u64 = (1 << PK_BITS) - 1;

/// Spare leaf slots [`PmSecondaryIndex::reserve`] keeps: each insert splits at most one leaf, and
/// far fewer than this many inserts run between two reservations of all threads together.
const SPARE_LEAVES: usize = 256;

/// A persistent, concurrent set of `(secondary key, primary key)` pairs over a
/// [`PmOrderedIndex`], with the API of [`SecondaryIndex`](crate::index::SecondaryIndex).
///
/// # Encoding (a departure: the PM ordered index has one-word keys)
///
/// A pair is stored as the entry `(high 44 bits of the secondary key | low 20 bits of
/// mix64(primary key)) → primary key`, so that a lookup is one range scan over the 2^20 keys
/// sharing the secondary key's prefix, and the primary key itself is stored exactly (as the
/// value). Two primary keys of one prefix whose hashes share the low 20 bits probe to the next
/// free stored key within the prefix (linear probing; removal finds a pair by its value, so holes
/// left by removals need no tombstones). A lookup therefore returns every primary key paired with
/// the secondary key, plus, rarely, those of another secondary key sharing its 44-bit prefix:
/// the contract of [`SecondaryIndex::lookup`](crate::index::SecondaryIndex::lookup) already asks
/// callers to re-check the columns of every row returned (secondary keys are hashes).
///
/// Every operation is a few single-key operations of the PM ordered index, each atomic with
/// respect to a crash; an insert checks for the pair first, so repeating one after a crash (as
/// Falcon's recovery does) never stores a pair twice.
pub struct PmSecondaryIndex {
    pairs: PmOrderedIndex,
}

impl PmSecondaryIndex {
    /// Creates an empty index in pages tagged `tag` (which must own no page yet); the caller
    /// records [`root`](Self::root) to find it at recovery.
    pub fn create(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        tag: PageTag,
    ) -> Result<Self, PmOrderedError> {
        Ok(Self {
            pairs: PmOrderedIndex::create(pool, pages, tag)?,
        })
    }

    /// Recovers the index whose root is `root` ([`PmOrderedIndex::recover`]: one PM line per
    /// leaf, no pair read).
    pub fn recover(
        pool: Arc<Pool>,
        pages: Arc<PageManager>,
        root: u64,
    ) -> Result<(Self, OrderedRecoveryStats), PmOrderedError> {
        let (pairs, stats) = PmOrderedIndex::recover(pool, pages, root)?;
        Ok((Self { pairs }, stats))
    }

    /// The root offset to record.
    pub fn root(&self) -> u64 {
        self.pairs.root()
    }

    fn prefix(secondary_key: u64) -> u64 {
        secondary_key & !PK_MASK
    }

    /// The stored key of the pair, if present.
    fn find(&self, secondary_key: u64, primary_key: u64) -> Option<u64> {
        let prefix = Self::prefix(secondary_key);
        let mut found = None;
        self.pairs.scan_range(prefix..=prefix | PK_MASK, |k, pk| {
            if pk == primary_key {
                found = Some(k);
                false
            } else {
                true
            }
        });
        found
    }

    /// Adds the pair; adding a pair already present does nothing. `Err` only when PM is full
    /// (see [`reserve`](Self::reserve)).
    pub fn insert(&self, secondary_key: u64, primary_key: u64) -> Result<(), PmOrderedError> {
        if self.find(secondary_key, primary_key).is_some() {
            return Ok(());
        }
        let prefix = Self::prefix(secondary_key);
        let mut low = mix64(primary_key) & PK_MASK;
        for _ in 0..=PK_MASK {
            match self.pairs.insert_new(prefix | low, primary_key)? {
                Ok(()) => return Ok(()),
                Err(existing) if existing == primary_key => return Ok(()),
                Err(_) => low = (low + 1) & PK_MASK,
            }
        }
        // 2^20 primary keys under one 44-bit prefix: the probe sequence is exhausted.
        Err(PmOrderedError::InvalidArgument(format!(
            "more than {} primary keys share secondary key prefix {prefix:#x}",
            PK_MASK + 1
        )))
    }

    /// Removes the pair; returns whether it was present.
    pub fn remove(&self, secondary_key: u64, primary_key: u64) -> bool {
        match self.find(secondary_key, primary_key) {
            Some(k) => self.pairs.remove_if(k, primary_key),
            None => false,
        }
    }

    /// Appends to `out` every primary key paired with `secondary_key` (and, rarely, with another
    /// secondary key of the same 44-bit prefix: callers re-check), in ascending order; returns how
    /// many were appended.
    pub fn lookup(&self, secondary_key: u64, out: &mut Vec<u64>) -> usize {
        let prefix = Self::prefix(secondary_key);
        let start = out.len();
        self.pairs.scan_range(prefix..=prefix | PK_MASK, |_, pk| {
            out.push(pk);
            true
        });
        out[start..].sort_unstable();
        out.len() - start
    }

    /// Whether the pair is present.
    pub fn contains(&self, secondary_key: u64, primary_key: u64) -> bool {
        self.find(secondary_key, primary_key).is_some()
    }

    /// Makes sure the next inserts cannot fail for want of a leaf: Falcon calls it before its
    /// commit mark, after which the commit's inserts must succeed.
    pub fn reserve(&self) -> Result<(), PmOrderedError> {
        self.pairs.reserve(SPARE_LEAVES)
    }

    /// Calls `f(secondary key prefix, primary key)` for every pair (the stored key's secondary
    /// half: compare with a secondary key through [`same_prefix`](Self::same_prefix)).
    pub fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        self.pairs.for_each(|k, pk| f(Self::prefix(k), pk));
    }

    /// Whether a prefix given by [`for_each`](Self::for_each) is that of `secondary_key`.
    pub fn same_prefix(prefix: u64, secondary_key: u64) -> bool {
        Self::prefix(secondary_key) == prefix
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether the index holds no pairs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// DRAM bytes used (the ordered index's inner nodes and leaf metadata).
    pub fn memory_bytes(&self) -> usize {
        self.pairs.memory_bytes()
    }

    /// PM bytes owned.
    pub fn pm_bytes(&self) -> u64 {
        self.pairs.pm_bytes()
    }
}

// Summarise instead of printing every pair.
impl fmt::Debug for PmSecondaryIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PmSecondaryIndex")
            .field("root", &self.root())
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::SecondaryIndex;
    use crate::pmem::{PersistenceDomain, PoolOptions};
    use proptest::prelude::*;

    fn index() -> PmSecondaryIndex {
        let opts = PoolOptions::new("pmsec", PersistenceDomain::Adr).with_counting(false);
        let pool = Arc::new(Pool::create_in_memory(16 << 20, &opts).unwrap());
        let pages = Arc::new(PageManager::format(&pool).unwrap());
        let tag = PageTag {
            kind: 9,
            owner: 1,
            value: 0,
        };
        PmSecondaryIndex::create(pool, pages, tag).unwrap()
    }

    fn lookup(index: &PmSecondaryIndex, key: u64) -> Vec<u64> {
        let mut out = Vec::new();
        assert_eq!(index.lookup(key, &mut out), out.len());
        out
    }

    #[test]
    fn pairs_sharing_a_prefix_and_a_hash_slot_probe_and_stay_exact() {
        let idx = index();
        // Find two primary keys whose hashes share the low bits: they take one stored key.
        let mut by_low = std::collections::HashMap::new();
        let (a, b) = (0u64..)
            .find_map(|pk| {
                by_low
                    .insert(mix64(pk) & PK_MASK, pk)
                    .map(|other| (other, pk))
            })
            .unwrap();
        let sec = 0xABCD_0000_0000_0000;
        idx.insert(sec, a).unwrap();
        idx.insert(sec, b).unwrap();
        idx.insert(sec, b).unwrap(); // present: no effect
        assert_eq!(idx.len(), 2);
        let mut both = vec![a, b];
        both.sort_unstable();
        assert_eq!(lookup(&idx, sec), both);
        assert!(idx.remove(sec, a));
        assert!(!idx.remove(sec, a));
        // b is now behind a hole: still found, and not added twice.
        assert!(idx.contains(sec, b));
        idx.insert(sec, b).unwrap();
        assert_eq!(idx.len(), 1);
        assert_eq!(lookup(&idx, sec), [b]);
        assert_eq!(lookup(&idx, sec + (1 << PK_BITS)), Vec::<u64>::new());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Against the DRAM secondary index (exact pairs): the same answers on every key whose
        /// prefix no other key shares (the model's keys are spread so that none does).
        #[test]
        fn matches_the_dram_secondary_index(
            ops in proptest::collection::vec((0u8..3, 0u64..6, 0u64..40), 1..200)
        ) {
            let pm = index();
            let dram = SecondaryIndex::new();
            let sec = |s: u64| mix64(s + 1);
            for &(op, s, pk) in &ops {
                match op {
                    0 => { pm.insert(sec(s), pk).unwrap(); dram.insert(sec(s), pk); }
                    1 => prop_assert_eq!(pm.remove(sec(s), pk), dram.remove(sec(s), pk)),
                    _ => prop_assert_eq!(pm.contains(sec(s), pk), dram.contains(sec(s), pk)),
                }
                prop_assert_eq!(pm.len(), dram.len());
            }
            for s in 0..6 {
                let mut want = Vec::new();
                dram.lookup(sec(s), &mut want);
                prop_assert_eq!(lookup(&pm, sec(s)), want);
            }
        }
    }
}
