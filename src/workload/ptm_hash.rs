//! ArchTM §6.1's hash-table micro-benchmark on the persistent-object API: a chained hash table
//! (10 240 buckets, in segments of 64 bucket heads so that an insert copies 512 bytes rather
//! than the whole bucket array), 8-byte keys and 16-byte values, one node object per pair;
//! a mix of lookups and updates of existing keys' values.

use crate::bench::{DriverError, TxnDriver, TxnOutcome};
use crate::ptm::{PObject, PPtr, PTx, PtmError, PtmRunner};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bucket heads per segment object.
pub const SEG_BUCKETS: usize = 64;
/// Segments (10 240 buckets).
pub const SEGS: usize = 160;
/// Buckets.
pub const BUCKETS: u64 = (SEGS * SEG_BUCKETS) as u64;
/// A segment of bucket heads.
pub type Segment = [PPtr<HashNode>; SEG_BUCKETS];

/// Bytes an update asks to change (the value).
pub const VALUE_BYTES: u64 = 16;

crate::pobject! {
    /// A pair and the next node of its chain.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct HashNode {
        /// The key.
        pub key: u64,
        /// The value.
        pub value: [u8; 16],
        /// The next node of the chain.
        pub next: PPtr<HashNode>,
    }
}

crate::pobject! {
    /// The root: the segment table and the number of pairs.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct HashRoot {
        /// The table of bucket segments.
        pub segs: PPtr<[PPtr<Segment>; SEGS]>,
        /// Pairs in the table.
        pub pairs: u64,
    }
}

fn bucket(key: u64) -> u64 {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % BUCKETS
}

/// The segment handle and the byte offset of `key`'s bucket head in it.
fn head_of(tx: &mut PTx<'_, HashRoot>, key: u64) -> Result<(PPtr<Segment>, usize), PtmError> {
    let r = tx.read(tx.root())?;
    let b = bucket(key) as usize;
    let seg = tx.read_at(r.segs, b / SEG_BUCKETS * 8)?;
    Ok((seg, b % SEG_BUCKETS * 8))
}

/// The node holding `key`, if any.
pub fn find(tx: &mut PTx<'_, HashRoot>, key: u64) -> Result<Option<PPtr<HashNode>>, PtmError> {
    let (seg, at) = head_of(tx, key)?;
    let mut p: PPtr<HashNode> = tx.read_at(seg, at)?;
    while !p.is_null() {
        // The whole node (32 bytes, one cache line on PM) in one read: its key and its next
        // together, one handle lookup per node.
        let node = tx.read(p)?;
        if node.key == key {
            return Ok(Some(p));
        }
        p = node.next;
    }
    Ok(None)
}

/// Inserts `key` (absent) with `value`.
pub fn insert(tx: &mut PTx<'_, HashRoot>, key: u64, value: [u8; 16]) -> Result<(), PtmError> {
    let (seg, at) = head_of(tx, key)?;
    let head: PPtr<HashNode> = tx.read_at(seg, at)?;
    let node = tx.alloc(&HashNode {
        key,
        value,
        next: head,
    })?;
    tx.write_at(seg, at, &node)?;
    let root = tx.root();
    tx.update(root, |r| r.pairs += 1)
}

/// Builds the table with keys `0..pairs` (transactions of 1 000 inserts).
pub fn load(ptm: &dyn PtmRunner<HashRoot>, pairs: u64) -> Result<(), PtmError> {
    ptm.run(|tx| {
        let mut segs = [PPtr::null(); SEGS];
        for s in segs.iter_mut() {
            *s = tx.alloc(&[PPtr::<HashNode>::null(); SEG_BUCKETS])?;
        }
        let t = tx.alloc(&segs)?;
        let root = tx.root();
        tx.update(root, |r| r.segs = t)
    })?;
    let mut k = 0;
    while k < pairs {
        let end = (k + 1000).min(pairs);
        ptm.run(|tx| (k..end).try_for_each(|key| insert(tx, key, value_of(key, 0))))?;
        k = end;
    }
    Ok(())
}

/// The value of `key` written in update `round` (its first 8 bytes are the key).
pub fn value_of(key: u64, round: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&key.to_le_bytes());
    v[8..].copy_from_slice(&round.to_le_bytes());
    v
}

/// One thread of a lookup/update mix over a loaded structure of `pairs` keys 0..pairs:
/// `update_pct` % updates of a random existing key's value, the rest lookups (kind 0 is
/// "update", 1 "lookup"); `op` runs one on the structure (the hash table's, or the tree's in
/// [`ptm_tree`](super::ptm_tree)).
pub struct MixDriver<'a, R: PObject> {
    ptm: &'a dyn PtmRunner<R>,
    pairs: u64,
    update_pct: u64,
    rng: u64,
    /// Bytes the application asked to change, summed over threads.
    app_bytes: &'a AtomicU64,
    op: MixOp<R>,
}

/// One operation of a mix: `(transaction, key, update?, value round)`.
pub type MixOp<R> = fn(&mut PTx<'_, R>, u64, bool, u64) -> Result<(), PtmError>;

/// The hash table's driver.
pub type HashDriver<'a> = MixDriver<'a, HashRoot>;

impl<'a, R: PObject> MixDriver<'a, R> {
    /// A driver running `op` over a loaded structure of `pairs` keys.
    pub fn with_op(
        ptm: &'a dyn PtmRunner<R>,
        pairs: u64,
        update_pct: u64,
        seed: u64,
        app_bytes: &'a AtomicU64,
        op: MixOp<R>,
    ) -> Self {
        MixDriver {
            ptm,
            pairs,
            update_pct,
            rng: seed | 1,
            app_bytes,
            op,
        }
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }
}

impl<'a> MixDriver<'a, HashRoot> {
    /// A driver over a loaded table of `pairs` keys.
    pub fn new(
        ptm: &'a dyn PtmRunner<HashRoot>,
        pairs: u64,
        update_pct: u64,
        seed: u64,
        app_bytes: &'a AtomicU64,
    ) -> Self {
        Self::with_op(ptm, pairs, update_pct, seed, app_bytes, hash_op)
    }
}

fn hash_op(tx: &mut PTx<'_, HashRoot>, key: u64, update: bool, round: u64) -> Result<(), PtmError> {
    let node = find(tx, key)?.ok_or_else(|| PtmError::Pool(format!("key {key} is missing")))?;
    if update {
        tx.write_at(node, 8, &value_of(key, round))
    } else {
        tx.read_at::<HashNode, [u8; 16]>(node, 8).map(|_| ())
    }
}

impl<R: PObject> TxnDriver for MixDriver<'_, R> {
    fn run_txn(&mut self) -> Result<TxnOutcome, DriverError> {
        let key = self.next() % self.pairs;
        let update = self.next() % 100 < self.update_pct;
        let round = self.next();
        let op = self.op;
        let ((), aborts) = self.ptm.run_counted(|tx| op(tx, key, update, round))?;
        if update {
            self.app_bytes.fetch_add(VALUE_BYTES, Ordering::Relaxed);
        }
        Ok(TxnOutcome {
            kind: usize::from(!update),
            committed: true,
            aborts,
        })
    }
}
