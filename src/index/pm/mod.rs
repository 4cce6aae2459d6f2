//! Persistent indexes: indexes whose nodes live in the pool, so that recovery finds them instead
//! of rebuilding them by scanning the heap (issue 17; Falcon §4 and §6.5, where recovery takes
//! milliseconds on a 256 GB database because nothing is rebuilt from the data).
//!
//! - `hash`: a hash index in the spirit of Dash (Lu et al., VLDB'20): segments of buckets with
//!   fingerprints and stash buckets, instant recovery.
//! - `ordered`: an ordered index with range scans in the spirit of NBTree (Zhang et al., VLDB'22):
//!   persistent leaves, inner nodes in DRAM rebuilt from the leaves at recovery.
//! - [`seqlock`]: the version-word protocol of both indexes' lock-free readers, shared with
//!   the loom model that checks its orderings.
//! - `secondary`: a non-unique `(secondary key, primary key)` set over the ordered index, so that
//!   secondary indexes need no heap scan at recovery either.
//!
//! Both take their pages from the pool's page manager, tagged so that recovery can find every
//! page an index owns, and are crash-consistent on their own under ADR and eADR: every single-key
//! operation is atomic with respect to a power failure, so an engine replaying its redo after a
//! crash can repeat an operation that may or may not have reached PM.

mod hash;
mod ordered;
mod secondary;
pub mod seqlock;

pub use hash::{
    PmHashError, PmHashIndex, PmHashOptions, PmHashRecoveryStats, MAX_BUCKETS_PER_SEGMENT,
    MAX_DEPTH, MAX_STASH_BUCKETS,
};
pub use ordered::{OrderedRecoveryStats, PmOrderedError, PmOrderedIndex};
pub use secondary::PmSecondaryIndex;
