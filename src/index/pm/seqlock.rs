//! The version-word protocol both persistent indexes use for their lock-free readers: a seqlock
//! (Lameter; the optimistic reads of FPTree §4.2 and Dash §4.3). A writer makes the version odd
//! before it changes what the word guards and even again after; a reader reads the version,
//! then the data, then validates that the version did not move.
//!
//! The guarded data (PM words, read and written with relaxed atomic accesses) and the version
//! words are reached through [`VersionWord`], so that the same functions run over the pool's
//! words in the indexes ([`PmHashIndex`](super::PmHashIndex)'s bucket versions, which live in
//! PM, and [`PmOrderedIndex`](super::PmOrderedIndex)'s leaf versions, in DRAM) and over loom's
//! atomics in the model that checks the orderings (`tests/index_model.rs`, under `--cfg loom`).
//! The fences are `crate::index::sync`'s: loom's under `--cfg loom`.
//!
//! The orderings, and why each is needed (the model fails without either fence):
//!
//! - [`write_begin`]: the odd version, then a Release fence, so that a reader that sees any data
//!   store of the change also sees the odd version when it validates (otherwise it could pair
//!   new data with the old, even version and accept a torn read).
//! - [`write_end`]: the even version with a Release store, after the data.
//! - [`read_begin`]: an Acquire load, so that the data read after it is at least as new as the
//!   version.
//! - [`read_validate`]: an Acquire fence, then the version again: the data loads may not move
//!   below the second version load.

use crate::index::sync::{fence, Ordering};

/// A 64-bit word holding a version: a DRAM atomic or a PM word.
pub trait VersionWord {
    /// Loads the version.
    fn load(&self, ordering: Ordering) -> u64;
    /// Stores the version.
    fn store(&self, value: u64, ordering: Ordering);
}

impl VersionWord for crate::index::sync::AtomicU64 {
    #[inline]
    fn load(&self, ordering: Ordering) -> u64 {
        crate::index::sync::AtomicU64::load(self, ordering)
    }

    #[inline]
    fn store(&self, value: u64, ordering: Ordering) {
        crate::index::sync::AtomicU64::store(self, value, ordering)
    }
}

/// A word of the pool, as a version word.
pub struct PoolWord<'a> {
    /// The pool.
    pub pool: &'a crate::pmem::Pool,
    /// The word's offset (8-byte aligned).
    pub offset: u64,
}

impl VersionWord for PoolWord<'_> {
    #[inline]
    fn load(&self, ordering: Ordering) -> u64 {
        self.pool.load_u64(self.offset, ordering)
    }

    #[inline]
    fn store(&self, value: u64, ordering: Ordering) {
        self.pool.store_u64(self.offset, value, ordering)
    }
}

/// Starts a read: the version (Acquire). The caller retries while it says a writer holds the
/// word (its own encoding of "odd").
#[inline]
pub fn read_begin(word: &impl VersionWord) -> u64 {
    word.load(Ordering::Acquire)
}

/// Ends a read begun at `version`: whether no writer changed the data meanwhile.
#[inline]
pub fn read_validate(word: &impl VersionWord, version: u64) -> bool {
    fence(Ordering::Acquire);
    word.load(Ordering::Relaxed) == version
}

/// Starts a change (the caller excludes other writers): stores the odd `version` and orders it
/// before every data store that follows.
#[inline]
pub fn write_begin(word: &impl VersionWord, odd: u64) {
    word.store(odd, Ordering::Relaxed);
    fence(Ordering::Release);
}

/// The fence of [`write_begin`] alone, for a writer that made the version odd itself (with a
/// compare-and-swap that also excludes other writers).
#[inline]
pub fn write_begun() {
    fence(Ordering::Release);
}

/// Ends a change: the even `version`, after every data store of the change.
#[inline]
pub fn write_end(word: &impl VersionWord, even: u64) {
    word.store(even, Ordering::Release);
}
