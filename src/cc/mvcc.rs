//! Multi-versioning in DRAM (Falcon §5.2.3, §5.4): the newest committed version of a tuple stays
//! in place on PM; when a multi-version protocol overwrites or deletes it, the old image first
//! goes to a DRAM **version chain** with its validity interval `[begin, end)` (commit timestamps
//! of the writer that made it and of the one that replaced it). Old versions are never persisted
//! and need no recovery: after a crash no transaction can want them.
//!
//! Snapshots and commits of the MV protocols take timestamps from one [`SnapshotClock`], a
//! high-water mark raised by every commit; a snapshot `S` sees a version iff
//! `begin ≤ S < end` (on the timestamp part of the tids).
//!
//! **Reclamation** (Falcon §5.4: "per-thread version queues ordered by end timestamp"): each
//! worker queues `(end, tuple)` for the versions it retired and, after each commit, prunes the
//! chains whose versions ended at or below the oldest active snapshot ([`oldest_snapshot`]).
//! Departure: the chain of a tuple is keyed by the tuple's PM address in a sharded hash map
//! (`dashmap`), not hung off a DRAM pointer in the tuple, because Falcon's tuples live on PM
//! and pmtx keeps no DRAM tuple object to hang a pointer on.

use super::tid_timestamp;
use dashmap::DashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The `end` of a retired version whose replacing writer has no commit tid yet.
pub const PENDING: u64 = u64::MAX;

/// An old version of a tuple.
#[derive(Clone, Debug)]
pub struct Version {
    /// Commit tid of the transaction that wrote it.
    pub begin: u64,
    /// Commit tid of the transaction that replaced (or deleted) it.
    pub end: u64,
    /// Whether the tuple was live (false: it was a deleted slot image, never visible as a row).
    pub live: bool,
    /// The key the tuple held.
    pub key: u64,
    /// The row image.
    pub row: Box<[u8]>,
}

impl Version {
    /// Whether snapshot `snapshot` (a timestamp) sees this version.
    #[inline]
    pub fn visible_at(&self, snapshot: u64) -> bool {
        tid_timestamp(self.begin) <= snapshot && snapshot < tid_timestamp(self.end)
    }
}

/// The DRAM version chains, per tuple (newest last).
#[derive(Debug, Default)]
pub struct VersionStore {
    chains: DashMap<u64, Vec<Version>>,
    versions: AtomicU64,
}

impl VersionStore {
    /// An empty store.
    pub fn new() -> VersionStore {
        VersionStore::default()
    }

    /// Retires a tuple's current version (before it is overwritten in place).
    pub fn push(&self, tuple: u64, version: Version) {
        self.chains.entry(tuple).or_default().push(version);
        self.versions.fetch_add(1, Ordering::Relaxed);
    }

    /// Copies the version of `tuple` that snapshot `snapshot` sees into `out` and returns
    /// `(key, live)`; `None` if no old version is visible.
    pub fn read_at(&self, tuple: u64, snapshot: u64, out: &mut [u8]) -> Option<(u64, bool)> {
        let chain = self.chains.get(&tuple)?;
        let v = chain.iter().rev().find(|v| v.visible_at(snapshot))?;
        let n = out.len().min(v.row.len());
        out[..n].copy_from_slice(&v.row[..n]);
        Some((v.key, v.live))
    }

    /// The commit tid that replaced the version written by `begin`, if that version was retired.
    pub fn replaced_by(&self, tuple: u64, begin: u64) -> Option<u64> {
        let chain = self.chains.get(&tuple)?;
        chain.iter().rev().find(|v| v.begin == begin).map(|v| v.end)
    }

    /// `(live, end)` of the newest version retired for `tuple`, if any.
    pub fn newest(&self, tuple: u64) -> Option<(bool, u64)> {
        let chain = self.chains.get(&tuple)?;
        chain.last().map(|v| (v.live, v.end))
    }

    /// Sets the end of the entry of `tuple` that `begin` wrote and that is still pending
    /// (`end == PENDING`) to `end`.
    pub fn settle(&self, tuple: u64, begin: u64, end: u64) {
        if let Some(mut chain) = self.chains.get_mut(&tuple) {
            if let Some(v) = chain
                .iter_mut()
                .rev()
                .find(|v| v.begin == begin && v.end == PENDING)
            {
                v.end = end;
            }
        }
    }

    /// Drops the entry of `tuple` with `begin` and `end` (its retiring writer aborted).
    pub fn discard(&self, tuple: u64, begin: u64, end: u64) {
        let mut dropped = false;
        if let Some(mut chain) = self.chains.get_mut(&tuple) {
            if let Some(i) = chain.iter().rposition(|v| v.begin == begin && v.end == end) {
                chain.remove(i);
                dropped = true;
            }
        }
        if dropped {
            self.versions.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Drops the versions of `tuple` that ended at or below timestamp `oldest` (no snapshot can
    /// see them); returns how many.
    pub fn prune(&self, tuple: u64, oldest: u64) -> usize {
        let mut dropped = 0;
        self.chains.remove_if_mut(&tuple, |_, chain| {
            let before = chain.len();
            chain.retain(|v| tid_timestamp(v.end) > oldest);
            dropped = before - chain.len();
            chain.is_empty()
        });
        if dropped == 0 {
            if let Some(mut chain) = self.chains.get_mut(&tuple) {
                let before = chain.len();
                chain.retain(|v| tid_timestamp(v.end) > oldest);
                dropped = before - chain.len();
            }
        }
        self.versions.fetch_sub(dropped as u64, Ordering::Relaxed);
        dropped
    }

    /// Forgets every version of `tuple` (its slot is being reused for a new row).
    pub fn clear(&self, tuple: u64) {
        if let Some((_, chain)) = self.chains.remove(&tuple) {
            self.versions
                .fetch_sub(chain.len() as u64, Ordering::Relaxed);
        }
    }

    /// Old versions held.
    pub fn len(&self) -> u64 {
        self.versions.load(Ordering::Relaxed)
    }

    /// Whether no old version is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a snapshot reader does about a tuple it found write-locked ([`past_writer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PastWriter {
    /// The writer has not retired the version the reader copied: its commit timestamp will be
    /// above the snapshot, so the copy is the version the snapshot sees.
    UseCopy,
    /// The writer's commit timestamp is above the snapshot: the snapshot's version is in the
    /// chain.
    UseChain,
    /// The snapshot must see the writer's version, which is not in place yet, or the tuple
    /// changed under the reader: back off and read again.
    Retry,
}

/// The decision of a snapshot reader at `snapshot` (a timestamp) that copied the version with
/// write timestamp `wts` of a tuple and found the tuple write-locked around the copy.
/// `replaced_by` looks the version up in the tuple's chain ([`VersionStore::replaced_by`]);
/// `wts_now` re-reads the tuple's write timestamp, after the lookup.
///
/// The chain entry of the version (its writer retires it before taking a commit timestamp)
/// tells the reader whether it must wait for the writer (pending, or replaced at or below the
/// snapshot) or read the chain (replaced above it). *No* entry means the writer has not retired
/// the version yet, whose commit timestamp is therefore above the snapshot, **or** that the
/// writer has finished since and the entry was already pruned: an entry replaced at or below
/// the snapshot is invisible to it, so once the writer's thread is idle a pruner may drop it.
/// Taking "no entry" for "not retired" in the second case returned the overwritten version to a
/// snapshot that must see the new one, and SI's first-committer check (a write timestamp above
/// the snapshot) then let the transaction overwrite it: a lost update (issue 19). The writer
/// installs its write timestamp before its thread goes idle, so a write timestamp still equal
/// to `wts` after the lookup proves the entry was not pruned. `tests/cc_model.rs` checks this
/// with loom.
pub fn past_writer(
    replaced_by: impl FnOnce() -> Option<u64>,
    wts: u64,
    snapshot: u64,
    wts_now: impl FnOnce() -> u64,
) -> PastWriter {
    match replaced_by() {
        Some(end) if end == PENDING || tid_timestamp(end) <= snapshot => PastWriter::Retry,
        Some(_) => PastWriter::UseChain,
        None if wts_now() != wts => PastWriter::Retry,
        None => PastWriter::UseCopy,
    }
}

/// The timestamp source of the multi-version protocols: a high-water mark of commit timestamps.
#[derive(Debug, Default)]
pub struct SnapshotClock {
    high: AtomicU64,
}

impl SnapshotClock {
    /// Raises the mark to at least `floor` (recovery: the largest timestamp found).
    pub fn raise_to(&self, floor: u64) {
        self.high.fetch_max(floor, Ordering::SeqCst);
    }

    /// The mark: every commit timestamp handed out so far is at most this.
    #[inline]
    pub fn current(&self) -> u64 {
        self.high.load(Ordering::SeqCst)
    }

    /// A new commit timestamp: above every one handed out before and at least `floor`.
    #[inline]
    pub fn stamp(&self, floor: u64) -> u64 {
        let mut cur = self.high.load(Ordering::SeqCst);
        loop {
            let next = (cur + 1).max(floor);
            match self
                .high
                .compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return next,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Takes a snapshot for a transaction whose active slot is `active`: publishes it there
    /// before using it, and retries until the mark did not move in between, so a concurrent
    /// [`oldest_snapshot`] either sees the slot or saw a mark no larger than the snapshot (and
    /// prunes nothing it needs).
    pub fn snapshot(&self, active: &AtomicU64) -> u64 {
        loop {
            let s = self.current();
            active.store(s, Ordering::SeqCst);
            if self.current() == s {
                return s;
            }
        }
    }
}

/// The oldest snapshot any running or future transaction may use: the mark, read first, and
/// every active slot after it (`u64::MAX` marks an idle slot).
pub fn oldest_snapshot<'a>(
    clock: &SnapshotClock,
    active: impl IntoIterator<Item = &'a AtomicU64>,
) -> u64 {
    let mark = clock.current();
    active
        .into_iter()
        .map(|a| a.load(Ordering::SeqCst))
        .fold(mark, u64::min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::TID_THREAD_BITS;

    fn tid(ts: u64) -> u64 {
        ts << TID_THREAD_BITS
    }

    #[test]
    fn chains_answer_snapshots_and_prune() {
        let s = VersionStore::new();
        let v = |b, e, byte| Version {
            begin: tid(b),
            end: tid(e),
            live: true,
            key: 7,
            row: vec![byte; 4].into_boxed_slice(),
        };
        s.push(64, v(1, 5, 1));
        s.push(64, v(5, 9, 2));
        let mut out = [0u8; 4];
        assert_eq!(s.read_at(64, 0, &mut out), None, "before the first version");
        assert_eq!(s.read_at(64, 4, &mut out), Some((7, true)));
        assert_eq!(out, [1; 4]);
        assert_eq!(s.read_at(64, 5, &mut out), Some((7, true)));
        assert_eq!(out, [2; 4]);
        assert_eq!(s.read_at(64, 9, &mut out), None, "the PM version is newer");
        assert_eq!(s.replaced_by(64, tid(5)), Some(tid(9)));
        assert_eq!(s.len(), 2);
        assert_eq!(s.prune(64, 5), 1);
        assert_eq!(s.len(), 1);
        assert_eq!(s.prune(64, 100), 1);
        assert!(s.is_empty());
    }

    #[test]
    fn stamps_are_unique_and_snapshots_published() {
        let c = SnapshotClock::default();
        c.raise_to(100);
        assert_eq!(c.stamp(0), 101);
        assert_eq!(c.stamp(500), 500);
        assert_eq!(c.stamp(0), 501);
        let slot = AtomicU64::new(u64::MAX);
        assert_eq!(c.snapshot(&slot), 501);
        assert_eq!(slot.load(Ordering::Relaxed), 501);
        let idle = AtomicU64::new(u64::MAX);
        assert_eq!(oldest_snapshot(&c, [&slot, &idle]), 501);
        c.stamp(0);
        assert_eq!(oldest_snapshot(&c, [&slot, &idle]), 501);
        assert_eq!(oldest_snapshot(&c, [&idle]), 502);
    }
}
