//! A Falcon table's indexes. The primary index: in DRAM ([`PrimaryIndex`], rebuilt by the heap scan at
//! recovery) or in PM ([`PmHashIndex`] / [`PmOrderedIndex`], recovered by their own recovery
//! functions, Falcon §4 and §5.3 "Index Recovery"). The placement is chosen when the table is
//! created ([`IndexPlacement`]) and recorded in the catalog; a PM index's root is recorded in the
//! meta page (`layout::meta::ROOTS_AT`).
//!
//! Both PM indexes make every single-key operation atomic with respect to a crash, which is what
//! lets recovery repeat the index operation of a committed window entry whether or not it
//! reached PM (`recovery.rs`).
//!
//! The secondary indexes ([`TableSecondary`]) follow the table's placement: a PM table keeps
//! them in PM too ([`PmSecondaryIndex`]), so that its recovery scans no heap.

use crate::alloc::{AllocError, PageManager, PageTag};
use crate::engine::TxError;
use crate::index::pm::{
    PmHashError, PmHashIndex, PmOrderedError, PmOrderedIndex, PmSecondaryIndex,
};
use crate::index::{
    HintChain, IndexError, IndexPlacement, LeafHint, PrimaryIndex, PrimaryIndexKind,
    SecondaryIndex, SecondaryLookup,
};
use crate::pmem::Pool;
use std::sync::Arc;

/// A table's primary index, wherever it lives.
// The DRAM ordered index embeds its node arena directory inline (see `PrimaryIndex`); one per
// table, so the size does not matter and boxing would add a pointer chase to every lookup.
#[allow(clippy::large_enum_variant)]
pub(crate) enum TableIndex {
    /// In DRAM.
    Dram(PrimaryIndex),
    /// A persistent hash index (point operations only).
    PmHash(PmHashIndex),
    /// A persistent ordered index (range scans too).
    PmOrdered(PmOrderedIndex),
}

/// Forwards a call to whichever index backs `self`.
macro_rules! forward {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            TableIndex::Dram(index) => index.$method($($arg),*),
            TableIndex::PmHash(index) => index.$method($($arg),*),
            TableIndex::PmOrdered(index) => index.$method($($arg),*),
        }
    };
}

/// A PM index's failure to grow, as a transaction error: PM full when a page was refused.
fn grow_error(table: &str, alloc: Option<AllocError>, other: String) -> TxError {
    match alloc {
        Some(e) => crate::engine::common::pm_full(
            format_args!("the persistent index of table '{table}'"),
            e,
        ),
        None => TxError::PmFull(format!(
            "the persistent index of table '{table}' cannot grow: {other}"
        )),
    }
}

fn hash_error(table: &str, e: PmHashError) -> TxError {
    match e {
        PmHashError::Alloc(a) => grow_error(table, Some(a), String::new()),
        other => grow_error(table, None, other.to_string()),
    }
}

fn ordered_error(table: &str, e: PmOrderedError) -> TxError {
    match e {
        PmOrderedError::Alloc(a) => grow_error(table, Some(a), String::new()),
        other => grow_error(table, None, other.to_string()),
    }
}

impl TableIndex {
    /// An empty DRAM index of `kind`.
    pub fn dram(kind: PrimaryIndexKind) -> TableIndex {
        TableIndex::Dram(PrimaryIndex::new(kind))
    }

    /// Creates an empty persistent index of `kind` in pages tagged `tag`.
    pub fn create_pm(
        kind: PrimaryIndexKind,
        pool: &Arc<Pool>,
        pages: &Arc<PageManager>,
        tag: PageTag,
    ) -> Result<TableIndex, String> {
        Ok(match kind {
            PrimaryIndexKind::Hash => TableIndex::PmHash(
                PmHashIndex::create(pool.clone(), pages.clone(), tag).map_err(|e| e.to_string())?,
            ),
            PrimaryIndexKind::Ordered => TableIndex::PmOrdered(
                PmOrderedIndex::create(pool.clone(), pages.clone(), tag)
                    .map_err(|e| e.to_string())?,
            ),
        })
    }

    /// Where the index lives.
    pub fn placement(&self) -> IndexPlacement {
        match self {
            TableIndex::Dram(_) => IndexPlacement::Dram,
            _ => IndexPlacement::Pm,
        }
    }

    /// Whether the index lives in PM.
    #[inline]
    pub fn is_pm(&self) -> bool {
        !matches!(self, TableIndex::Dram(_))
    }

    /// The root offset of a PM index (0 for a DRAM one).
    pub fn root(&self) -> u64 {
        match self {
            TableIndex::Dram(_) => 0,
            TableIndex::PmHash(index) => index.root(),
            TableIndex::PmOrdered(index) => index.root(),
        }
    }

    /// The address stored for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        forward!(self.get(key))
    }

    /// Starts loading what a lookup of `key` will read: the bucket of a hash index. Not for an
    /// ordered index, DRAM or PM: finding its leaf is a whole inner-node descent, which the
    /// lookup that follows repeats (the DRAM ordered index does nothing here for that reason).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        match self {
            TableIndex::Dram(index) => index.prefetch(key),
            TableIndex::PmHash(index) => index.prefetch(key),
            TableIndex::PmOrdered(_) => {}
        }
    }

    /// Inserts `key → addr` only if `key` is absent (`Ok(Ok(()))`), else returns the address
    /// stored (`Ok(Err(existing))`). `Err` when a PM index could not grow (PM full).
    #[inline]
    pub fn insert_new(&self, table: &str, key: u64, addr: u64) -> Result<Result<(), u64>, TxError> {
        match self {
            TableIndex::Dram(index) => Ok(index.insert_new(key, addr)),
            TableIndex::PmHash(index) => index
                .insert_new(key, addr)
                .map_err(|e| hash_error(table, e)),
            TableIndex::PmOrdered(index) => index
                .insert_new(key, addr)
                .map_err(|e| ordered_error(table, e)),
        }
    }

    /// [`get`](Self::get) that also returns where a DRAM ordered index's descent ended, for the
    /// insert at commit to start there ([`insert_new_at`](Self::insert_new_at)).
    #[inline]
    pub fn get_for_insert(&self, key: u64) -> (Option<u64>, Option<LeafHint>) {
        match self {
            TableIndex::Dram(index) => index.get_for_insert(key),
            _ => (self.get(key), None),
        }
    }

    /// [`insert_new`](Self::insert_new) starting at the hinted leaf (a DRAM ordered index; the
    /// others ignore the hint).
    #[inline]
    pub fn insert_new_at(
        &self,
        table: &str,
        key: u64,
        addr: u64,
        hint: Option<LeafHint>,
        chain: &mut HintChain,
    ) -> Result<Result<(), u64>, TxError> {
        match self {
            TableIndex::Dram(index) => Ok(index.insert_new_at(key, addr, hint, chain)),
            _ => self.insert_new(table, key, addr),
        }
    }

    /// Stores `key → addr`, returning the previous address. `Err` when a PM index could not
    /// grow (PM full).
    pub fn upsert(&self, table: &str, key: u64, addr: u64) -> Result<Option<u64>, TxError> {
        match self {
            TableIndex::Dram(index) => Ok(index.upsert(key, addr)),
            TableIndex::PmHash(index) => index.upsert(key, addr).map_err(|e| hash_error(table, e)),
            TableIndex::PmOrdered(index) => {
                index.upsert(key, addr).map_err(|e| ordered_error(table, e))
            }
        }
    }

    /// Removes `key` only if it maps to exactly `addr`; returns whether it was removed.
    #[inline]
    pub fn remove_if(&self, key: u64, addr: u64) -> bool {
        forward!(self.remove_if(key, addr))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        forward!(self.len())
    }

    /// Calls `f(key, addr)` for every entry (`f` must not modify a DRAM index).
    pub fn for_each(&self, f: impl FnMut(u64, u64)) {
        forward!(self.for_each(f))
    }

    /// DRAM bytes used by the index.
    pub fn memory_bytes(&self) -> usize {
        forward!(self.memory_bytes())
    }

    /// PM bytes owned by the index (0 for a DRAM one).
    pub fn pm_bytes(&self) -> u64 {
        match self {
            TableIndex::Dram(_) => 0,
            TableIndex::PmHash(index) => index.pm_bytes(),
            TableIndex::PmOrdered(index) => index.pm_bytes(),
        }
    }

    /// Collects the hits of a range scan into `hits` (cleared first); a hash index refuses.
    pub fn collect_scan_hits(
        &self,
        table_name: &str,
        from: u64,
        reverse: bool,
        limit: usize,
        hits: &mut Vec<(u64, u64)>,
    ) -> Result<(), TxError> {
        let index = match self {
            TableIndex::Dram(index) => {
                return crate::engine::common::collect_scan_hits(
                    index, table_name, from, reverse, limit, hits,
                )
            }
            TableIndex::PmOrdered(index) => index,
            TableIndex::PmHash(_) => {
                return Err(TxError::Unsupported(format!(
                    "table {table_name}: {}",
                    IndexError::ScanUnsupported
                )))
            }
        };
        hits.clear();
        let collect = |k: u64, v: u64| {
            hits.push((k, v));
            true
        };
        if reverse {
            index.scan_rev(from, limit, collect);
        } else {
            index.scan(from, limit, collect);
        }
        Ok(())
    }
}

/// One of a table's secondary indexes: in DRAM (rebuilt by the heap scan at recovery) or, for a
/// table whose indexes are in PM, a [`PmSecondaryIndex`] recovered without one. Its placement
/// follows the table's (`IndexPlacement`).
pub(crate) enum TableSecondary {
    /// In DRAM.
    Dram(SecondaryIndex),
    /// In PM.
    Pm(PmSecondaryIndex),
}

impl TableSecondary {
    /// Whether the index lives in PM.
    pub fn is_pm(&self) -> bool {
        matches!(self, TableSecondary::Pm(_))
    }

    /// Adds the pair (a present pair is left alone). `Err` when a PM index could not grow.
    pub fn insert(&self, table: &str, secondary: u64, key: u64) -> Result<(), TxError> {
        match self {
            TableSecondary::Dram(index) => {
                index.insert(secondary, key);
                Ok(())
            }
            TableSecondary::Pm(index) => index
                .insert(secondary, key)
                .map_err(|e| ordered_error(table, e)),
        }
    }

    /// Removes the pair; returns whether it was present.
    pub fn remove(&self, secondary: u64, key: u64) -> bool {
        match self {
            TableSecondary::Dram(index) => index.remove(secondary, key),
            TableSecondary::Pm(index) => index.remove(secondary, key),
        }
    }

    /// Whether the pair is present.
    pub fn contains(&self, secondary: u64, key: u64) -> bool {
        match self {
            TableSecondary::Dram(index) => index.contains(secondary, key),
            TableSecondary::Pm(index) => index.contains(secondary, key),
        }
    }

    /// Makes sure a PM index has room for the inserts of a commit before its commit mark, after
    /// which they must not fail (a DRAM index always has room).
    pub fn reserve(&self, table: &str) -> Result<(), TxError> {
        match self {
            TableSecondary::Dram(_) => Ok(()),
            TableSecondary::Pm(index) => index.reserve().map_err(|e| ordered_error(table, e)),
        }
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        match self {
            TableSecondary::Dram(index) => index.len(),
            TableSecondary::Pm(index) => index.len(),
        }
    }

    /// DRAM bytes used.
    pub fn memory_bytes(&self) -> usize {
        match self {
            TableSecondary::Dram(index) => index.memory_bytes(),
            TableSecondary::Pm(index) => index.memory_bytes(),
        }
    }

    /// PM bytes owned (0 in DRAM).
    pub fn pm_bytes(&self) -> u64 {
        match self {
            TableSecondary::Dram(_) => 0,
            TableSecondary::Pm(index) => index.pm_bytes(),
        }
    }
}

impl SecondaryLookup for TableSecondary {
    fn lookup(&self, secondary: u64, out: &mut Vec<u64>) -> usize {
        match self {
            TableSecondary::Dram(index) => index.lookup(secondary, out),
            TableSecondary::Pm(index) => index.lookup(secondary, out),
        }
    }
}
