//! H-Store-style partition locking (Kallman et al., VLDB'08; the "HSTORE" scheme of Yu et al.,
//! VLDB'14 that Zen §4.4 evaluates): one exclusive lock per partition and no per-tuple
//! concurrency control at all. A transaction takes the lock of each partition it touches.
//!
//! Departure: H-Store declares a transaction's partitions up front and queues on them in
//! timestamp order; pmtx's API does not declare them, so locks are taken as keys are first
//! touched, and a conflict is resolved wait-die style on the transactions' timestamps (an older
//! transaction waits for a younger holder, a younger one aborts at once), which keeps the lazy
//! acquisition free of deadlock and of the symmetric livelock a plain time-out falls into.

use std::sync::atomic::{AtomicU64, Ordering};

/// The partition locks: each holds its owner's thread + 1, or 0.
#[derive(Debug)]
pub struct PartitionLocks {
    locks: Box<[AtomicU64]>,
}

impl PartitionLocks {
    /// `n` partitions (at least one).
    pub fn new(n: usize) -> PartitionLocks {
        PartitionLocks {
            locks: (0..n.max(1)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// How many partitions.
    pub fn len(&self) -> usize {
        self.locks.len()
    }

    /// Always false: there is at least one partition.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Takes the lock of `key`'s partition for `thread` (whose transaction timestamp is `ts`),
    /// recording it in `held`. On a conflict an older transaction waits for a younger holder and
    /// a younger one gives up (wait-die on the begin timestamps in `txn_ts`), for at most
    /// `wait_spins` polls. Returns whether the partition is held.
    pub fn lock_for(
        &self,
        key: u64,
        thread: usize,
        ts: u64,
        txn_ts: &[crossbeam_utils::CachePadded<AtomicU64>],
        wait_spins: u32,
        held: &mut Vec<usize>,
    ) -> bool {
        let p = self.partition_of(key);
        if held.contains(&p) {
            return true;
        }
        for round in 0..wait_spins {
            if self.try_lock(p, thread) {
                held.push(p);
                return true;
            }
            if let Some(holder) = self.owner(p).filter(|&h| h != thread) {
                if ts >= txn_ts[holder].load(Ordering::Acquire) {
                    return false;
                }
            }
            super::backoff(round);
        }
        false
    }

    /// The partition of `key`.
    #[inline]
    pub fn partition_of(&self, key: u64) -> usize {
        (key % self.locks.len() as u64) as usize
    }

    /// Tries to take partition `p` for `thread`; true if taken (or already held by it).
    #[inline]
    pub fn try_lock(&self, p: usize, thread: usize) -> bool {
        let me = thread as u64 + 1;
        match self.locks[p].compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => true,
            Err(owner) => owner == me,
        }
    }

    /// The thread holding partition `p`, if any.
    #[inline]
    pub fn owner(&self, p: usize) -> Option<usize> {
        match self.locks[p].load(Ordering::Acquire) {
            0 => None,
            o => Some(o as usize - 1),
        }
    }

    /// Releases partition `p`.
    #[inline]
    pub fn unlock(&self, p: usize) {
        self.locks[p].store(0, Ordering::Release)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_per_partition() {
        let l = PartitionLocks::new(4);
        assert_eq!(l.partition_of(9), 1);
        assert!(l.try_lock(1, 0));
        assert!(l.try_lock(1, 0), "re-entrant for the owner");
        assert!(!l.try_lock(1, 1));
        assert_eq!(l.owner(1), Some(0));
        assert_eq!(l.owner(3), None);
        assert!(l.try_lock(2, 1));
        l.unlock(1);
        assert!(l.try_lock(1, 1));
    }
}
