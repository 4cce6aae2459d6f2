//! Timestamp ordering (basic TO, Falcon §5.2.1; Bernstein & Goodman) over a tuple word holding the
//! read timestamp and a lock bit; the write timestamp is the tuple's `write_ts` (the commit tid of
//! its last writer), which the engine keeps anyway. MVTO uses the same word: what differs is that
//! a read of a tuple newer than the transaction goes to the DRAM version chain instead of aborting.
//!
//! Word: bit 63 lock (a write is in flight, held from the write to the end of the transaction),
//! bits 0..63 the largest timestamp that read the current version.

use super::{MetaWord, LOCK_BIT};

/// Why a write was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteRefusal {
    /// Another transaction's write is in flight.
    Locked,
    /// A younger transaction already read the current version (TO rule: abort).
    ReadLater,
}

/// The read timestamp of word value `w`.
#[inline]
pub fn read_ts(w: u64) -> u64 {
    w & !LOCK_BIT
}

/// Records a read at `ts`: raises the read timestamp to `ts` unless a write is in flight
/// (returns false then).
#[inline]
pub fn stamp_read(word: &impl MetaWord, ts: u64) -> bool {
    loop {
        let w = word.load();
        if w & LOCK_BIT != 0 {
            return false;
        }
        if read_ts(w) >= ts || word.cas(w, ts) {
            return true;
        }
    }
}

/// Locks the word for a write at `ts`: refused while locked, or if a younger transaction read
/// the current version.
#[inline]
pub fn try_write_lock(word: &impl MetaWord, ts: u64) -> Result<(), WriteRefusal> {
    loop {
        let w = word.load();
        if w & LOCK_BIT != 0 {
            return Err(WriteRefusal::Locked);
        }
        if read_ts(w) > ts {
            return Err(WriteRefusal::ReadLater);
        }
        if word.cas(w, w | LOCK_BIT) {
            return Ok(());
        }
    }
}

/// Unlocks, keeping the read timestamp (commit and abort alike: the new version's `write_ts`
/// is the writer's timestamp, and reads check against it).
#[inline]
pub fn unlock(word: &impl MetaWord) {
    let w = word.load();
    word.store(read_ts(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn reads_raise_rts_and_block_older_writers() {
        let w = AtomicU64::new(5);
        assert!(stamp_read(&w, 9));
        assert!(stamp_read(&w, 7), "an older read leaves rts alone");
        assert_eq!(read_ts(w.load(std::sync::atomic::Ordering::Relaxed)), 9);
        assert_eq!(try_write_lock(&w, 8), Err(WriteRefusal::ReadLater));
        assert_eq!(try_write_lock(&w, 10), Ok(()));
        assert!(!stamp_read(&w, 11), "locked");
        assert_eq!(try_write_lock(&w, 12), Err(WriteRefusal::Locked));
        unlock(&w);
        assert!(stamp_read(&w, 11));
    }
}
