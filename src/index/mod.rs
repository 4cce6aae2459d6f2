//! DRAM indexes.
//!
//! Engines map a table's 8-byte primary key to an opaque 8-byte tuple address (a PM offset, a
//! cache-entry id, ...). Indexes live only in DRAM: engines rebuild them at recovery by scanning
//! their storage, so nothing here is persisted and bulk insertion is the path that matters.
//!
//! - [`HashIndex`]: point operations only: cache-line buckets read optimistically, sharded
//!   writers.
//! - [`OrderedIndex`]: point operations plus ascending/descending range scans, over a B+-tree
//!   with optimistic lock coupling (`btree.rs`, shared with the secondary index).
//! - [`PrimaryIndex`]: either of the two, chosen at run time by [`PrimaryIndexKind`].
//! - [`SecondaryIndex`]: a non-unique ordered set of `(secondary key, primary key)` pairs, keyed
//!   by [`secondary_key`], a stable hash of the indexed columns.
//!
//! All indexes are safe to share between threads (`&self` methods). Every single-key operation is
//! atomic with respect to the others on the same key; scans and `for_each` are not snapshots.

mod btree;
mod hash;
mod ordered;
pub mod pm;
mod primary;
mod secondary;
mod sync;

pub use btree::{HintChain, LeafHint};
pub use hash::HashIndex;
pub use ordered::OrderedIndex;
pub use primary::{PrimaryIndex, PrimaryIndexKind};
pub(crate) use secondary::fnv1a_64;
pub use secondary::{secondary_key, SecondaryIndex};

/// Where a table's primary index lives, chosen when the table is created (issue 17).
///
/// - `dram`: a DRAM index ([`PrimaryIndex`]), rebuilt by a heap scan at recovery.
/// - `pm`: a persistent index ([`pm::PmHashIndex`] or [`pm::PmOrderedIndex`]) that recovery finds
///   in the pool instead of rebuilding it (Falcon §4, §5.3), so recovery does not scan the heap.
///   Only engines that update in place can keep one (Falcon §2.1: an out-of-place engine such as
///   Zen would rewrite an index entry on every update).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum IndexPlacement {
    /// In DRAM, rebuilt at recovery.
    #[default]
    Dram,
    /// In PM, recovered with the index's own recovery function.
    Pm,
}

impl IndexPlacement {
    /// Every placement.
    pub const ALL: [IndexPlacement; 2] = [IndexPlacement::Dram, IndexPlacement::Pm];

    /// The name used in configuration, serde and [`FromStr`](std::str::FromStr).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dram => "dram",
            Self::Pm => "pm",
        }
    }
}

impl std::fmt::Display for IndexPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for IndexPlacement {
    type Err = String;

    /// Parses `dram` or `pm`, ignoring ASCII case.
    fn from_str(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("unknown index placement `{name}` (expected `dram` or `pm`)"))
    }
}

/// A secondary index's lookup, whatever backs it (DRAM or PM), for the engines' shared
/// `lookup_secondary`.
pub(crate) trait SecondaryLookup {
    /// Appends to `out` the primary keys paired with `secondary_key`; returns how many.
    fn lookup(&self, secondary_key: u64, out: &mut Vec<u64>) -> usize;
}

impl SecondaryLookup for SecondaryIndex {
    fn lookup(&self, secondary_key: u64, out: &mut Vec<u64>) -> usize {
        SecondaryIndex::lookup(self, secondary_key, out)
    }
}

/// Errors reported by the index layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// A range scan was requested from an index that keeps no key order.
    #[error("range scans need an ordered index, but this primary index is a hash index")]
    ScanUnsupported,
    /// An index kind name did not parse.
    #[error("unknown index kind `{0}` (expected `hash` or `ordered`)")]
    UnknownKind(String),
    /// A bulk build was given a key twice.
    #[error("a bulk index build was given key {0} twice")]
    BulkDuplicateKey(u64),
    /// A sorted bulk build was given a key that is not above the key before it.
    #[error("a sorted bulk index build was given key {0} after a key at least as large")]
    BulkKeyOrder(u64),
}

/// The first entry `scan` visits, telling it to stop there: `first_at_or_after` and
/// `last_at_or_before` of the ordered indexes, DRAM and PM, over their forward and reverse scans.
pub(crate) fn first_visited(
    scan: impl FnOnce(&mut dyn FnMut(u64, u64) -> bool),
) -> Option<(u64, u64)> {
    let mut first = None;
    scan(&mut |k, v| {
        first = Some((k, v));
        false
    });
    first
}

/// The murmur3 64-bit finaliser: a bijection whose every output bit depends on every input bit.
///
/// Used wherever a key picks a bucket, shard or lock stripe, so that keys sharing low bits
/// (composite keys, strided ids) still spread evenly.
#[inline]
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// A slice of `len` values made by `make`, in memory that asked for transparent huge pages
/// before it was first written ([`advise_huge_pages`](crate::pmem::platform::advise_huge_pages)):
/// index node arenas and hash segments are megabytes read at random, and with 4 KiB pages each
/// descent step or bucket probe would also pay a TLB miss and a page walk (issue 13).
pub(crate) fn slice_on_huge_pages<T>(len: usize, make: impl FnMut() -> T) -> Box<[T]> {
    let mut values: Vec<T> = Vec::with_capacity(len);
    #[cfg(not(loom))]
    crate::pmem::platform::advise_huge_pages(
        values.as_ptr().cast(),
        len * std::mem::size_of::<T>(),
    );
    values.extend(std::iter::repeat_with(make).take(len));
    values.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_slice_on_huge_pages_holds_what_make_made_in_order() {
        for len in [0, 1, 3 << 20] {
            let mut next = 0u64;
            let slice = slice_on_huge_pages(len, || {
                next += 1;
                next
            });
            assert_eq!(slice.len(), len);
            assert!(slice.iter().zip(1..).all(|(&v, i)| v == i));
        }
        // 24 MiB certainly holds an aligned 2 MiB; where the kernel takes the advice (Linux
        // with transparent huge pages) its mapping carries it.
        let slice = slice_on_huge_pages(3 << 20, || 0u64);
        let start = slice.as_ptr().cast::<u8>();
        let aligned = start.wrapping_add(start.align_offset(2 << 20));
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            assert_eq!(
                crate::pmem::platform::huge_pages_advised_at(aligned),
                Some(true)
            );
        }
    }

    #[test]
    fn mix64_is_a_bijection_on_samples_and_spreads_low_bits() {
        assert_eq!(mix64(0), 0);
        let mut seen = std::collections::HashSet::new();
        for k in 0..10_000u64 {
            assert!(seen.insert(mix64(k << 20)));
        }
        // Keys differing only in high bits must still land in different low-bit buckets.
        let buckets: std::collections::HashSet<u64> =
            (0..64u64).map(|k| mix64(k << 32) & 63).collect();
        assert!(
            buckets.len() > 32,
            "only {} of 64 buckets used",
            buckets.len()
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Get(u64),
        InsertNew(u64, u64),
        Upsert(u64, u64),
        Remove(u64),
        RemoveIf(u64, u64),
        ReplaceIf(u64, u64, u64),
        Scan(u64, usize),
        ScanRev(u64, usize),
    }

    // A small key and address space so that ops hit existing keys and matching addresses often.
    fn op_strategy() -> impl Strategy<Value = Op> {
        let key = 0u64..24;
        let addr = 0u64..4;
        prop_oneof![
            key.clone().prop_map(Op::Get),
            (key.clone(), addr.clone()).prop_map(|(k, a)| Op::InsertNew(k, a)),
            (key.clone(), addr.clone()).prop_map(|(k, a)| Op::Upsert(k, a)),
            key.clone().prop_map(Op::Remove),
            (key.clone(), addr.clone()).prop_map(|(k, a)| Op::RemoveIf(k, a)),
            (key.clone(), addr.clone(), addr).prop_map(|(k, e, n)| Op::ReplaceIf(k, e, n)),
            (key.clone(), 0usize..8).prop_map(|(k, l)| Op::Scan(k, l)),
            (key, 0usize..8).prop_map(|(k, l)| Op::ScanRev(k, l)),
        ]
    }

    fn apply_to_model(model: &mut BTreeMap<u64, u64>, op: &Op) -> String {
        match *op {
            Op::Get(k) => format!("{:?}", model.get(&k).copied()),
            Op::InsertNew(k, a) => {
                let result = match model.get(&k) {
                    Some(&existing) => Err(existing),
                    None => {
                        model.insert(k, a);
                        Ok(())
                    }
                };
                format!("{result:?}")
            }
            Op::Upsert(k, a) => format!("{:?}", model.insert(k, a)),
            Op::Remove(k) => format!("{:?}", model.remove(&k)),
            Op::RemoveIf(k, a) => {
                let hit = model.get(&k) == Some(&a);
                if hit {
                    model.remove(&k);
                }
                format!("{hit}")
            }
            Op::ReplaceIf(k, e, n) => {
                let hit = model.get(&k) == Some(&e);
                if hit {
                    model.insert(k, n);
                }
                format!("{hit}")
            }
            Op::Scan(from, limit) => {
                let seen: Vec<_> = model.range(from..).take(limit).collect();
                format!("{seen:?}")
            }
            Op::ScanRev(upto, limit) => {
                let seen: Vec<_> = model.range(..=upto).rev().take(limit).collect();
                format!("{seen:?}")
            }
        }
    }

    fn apply_to_index(index: &PrimaryIndex, op: &Op) -> String {
        match *op {
            Op::Get(k) => format!("{:?}", index.get(k)),
            Op::InsertNew(k, a) => format!("{:?}", index.insert_new(k, a)),
            Op::Upsert(k, a) => format!("{:?}", index.upsert(k, a)),
            Op::Remove(k) => format!("{:?}", index.remove(k)),
            Op::RemoveIf(k, a) => format!("{}", index.remove_if(k, a)),
            Op::ReplaceIf(k, e, n) => format!("{}", index.replace_if(k, e, n)),
            Op::Scan(from, limit) => {
                let mut seen = Vec::new();
                match index.scan(from, limit, |k, a| {
                    seen.push((k, a));
                    true
                }) {
                    Ok(visited) => assert_eq!(visited, seen.len()),
                    Err(IndexError::ScanUnsupported) => return "no-scan".into(),
                    Err(e) => panic!("unexpected error {e}"),
                }
                format!("{seen:?}")
            }
            Op::ScanRev(upto, limit) => {
                let mut seen = Vec::new();
                match index.scan_rev(upto, limit, |k, a| {
                    seen.push((k, a));
                    true
                }) {
                    Ok(visited) => assert_eq!(visited, seen.len()),
                    Err(IndexError::ScanUnsupported) => return "no-scan".into(),
                    Err(e) => panic!("unexpected error {e}"),
                }
                format!("{seen:?}")
            }
        }
    }

    /// Runs `ops` on an index of `kind` bulk-built from `start` and on a model holding `start`.
    fn check_against_model(
        kind: PrimaryIndexKind,
        start: &BTreeMap<u64, u64>,
        ops: &[Op],
    ) -> Result<(), TestCaseError> {
        let entries: Vec<(u64, u64)> = start.iter().map(|(&k, &a)| (k, a)).collect();
        let index = PrimaryIndex::from_sorted(kind, &entries, 0).unwrap();
        let mut model = start.clone();
        for (step, op) in ops.iter().enumerate() {
            let expected = apply_to_model(&mut model, op);
            let actual = apply_to_index(&index, op);
            let scan_on_hash =
                kind == PrimaryIndexKind::Hash && matches!(op, Op::Scan(..) | Op::ScanRev(..));
            if scan_on_hash {
                prop_assert_eq!(actual, "no-scan", "step {}: {:?}", step, op);
            } else {
                prop_assert_eq!(actual, expected, "step {}: {:?}", step, op);
            }
            prop_assert_eq!(
                index.len(),
                model.len(),
                "len after step {}: {:?}",
                step,
                op
            );
        }
        let mut contents = BTreeMap::new();
        index.for_each(|k, a| {
            assert!(contents.insert(k, a).is_none(), "key {k} visited twice");
        });
        prop_assert_eq!(contents, model);
        Ok(())
    }

    #[test]
    fn a_sorted_bulk_build_refuses_keys_out_of_order_whatever_the_kind() {
        for kind in [PrimaryIndexKind::Hash, PrimaryIndexKind::Ordered] {
            let got = PrimaryIndex::from_sorted(kind, &[(1, 0), (3, 0), (2, 0)], 0).err();
            assert_eq!(got, Some(IndexError::BulkKeyOrder(2)), "{kind}");
            let got = PrimaryIndex::from_sorted(kind, &[(1, 0), (1, 5)], 0).err();
            assert_eq!(got, Some(IndexError::BulkKeyOrder(1)), "{kind}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]

        #[test]
        fn ordered_and_hash_indexes_match_a_btreemap_model(
            ops in proptest::collection::vec(op_strategy(), 1..80)
        ) {
            check_against_model(PrimaryIndexKind::Ordered, &BTreeMap::new(), &ops)?;
            check_against_model(PrimaryIndexKind::Hash, &BTreeMap::new(), &ops)?;
        }

        /// The same, from an index bulk-built by `PrimaryIndex::from_sorted`.
        #[test]
        fn bulk_built_indexes_match_a_btreemap_model(
            start in proptest::collection::btree_map(0u64..24, 0u64..4, 0..24),
            ops in proptest::collection::vec(op_strategy(), 1..80)
        ) {
            check_against_model(PrimaryIndexKind::Ordered, &start, &ops)?;
            check_against_model(PrimaryIndexKind::Hash, &start, &ops)?;
        }
    }
}
